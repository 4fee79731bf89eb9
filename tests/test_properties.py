"""Properties of everything that reads user input: a value or one clear error, nothing else.

Hypothesis draws quantities, topology specs (TOML text built from the
schema, with plausible and wild values) and workload tables; the units
parser must return an integer within its limit or raise `UnitError`, the
loaders a checked value or `SpecError`. The capture reader is fuzzed in a
child process (tests/fuzz_capture.py) so a crash or a hang of its compiled
kernels fails the test. CI runs a few hundred examples each, in seconds;
`AIFABRIC_PROPERTY_EXAMPLES=20000 AIFABRIC_FUZZ_ITERATIONS=100000` runs them
at length.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aifabric.fabric.errors import SpecError, UnitError
from aifabric.fabric.units import LIMIT, parse_rate, parse_size, parse_time
from aifabric.topologies import builders, load_fabric
from aifabric.topologies.spec import COMMON, KINDS, SCHEMA, parse
from aifabric.traffic.spec import COLLECTIVE, PATTERN, TRAINING, workload_from_dict

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("AIFABRIC_PROPERTY_EXAMPLES", 300))
FUZZ_ITERATIONS = int(os.environ.get("AIFABRIC_FUZZ_ITERATIONS", 400))
LAB_MEDIUM = functools.cache(lambda: load_fabric("lab-medium"))
PROFILE = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

QUANTITY_TEXT = st.from_regex(
    r"\s?-?[0-9]{0,25}(\.[0-9]{0,12})?([eE][+-]?[0-9]{1,12})?\s?"
    r"(ns|us|µs|ms|s|K|M|G|T|Gbps|b/s|B|KB|KiB|MiB|GiB|bit/s|x)?\s?",
    fullmatch=True,
)
QUANTITY = st.one_of(
    QUANTITY_TEXT,
    st.text(max_size=30),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
UNIT_LIKE = st.sampled_from(
    ["100G", "400G", "1.6T", "1e999999999G", "2us", "1e12s", "4MiB", "1e30", "inf", "nan", "all"]
)
VALUE = st.one_of(
    st.integers(min_value=-2, max_value=40),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.text(max_size=12),
    UNIT_LIKE,
    st.lists(st.one_of(st.integers(0, 3), UNIT_LIKE), max_size=3),
)


@PROFILE
@given(QUANTITY)
def test_the_units_parser_gives_an_int_within_its_limit_or_a_unit_error(value):
    for parse_quantity in (parse_rate, parse_time, parse_size):
        try:
            out = parse_quantity(value)
        except UnitError as e:
            assert str(e) and "\n" not in str(e) and len(str(e)) < 200
        else:
            assert type(out) is int and 0 <= out <= LIMIT


@PROFILE
@given(st.integers(min_value=0, max_value=LIMIT))
def test_a_whole_number_of_the_base_unit_is_itself(n):
    assert parse_time(f"{n}ns") == parse_size(f"{n}B") == parse_size(n) == n
    assert parse_rate(f"{max(n, 1)}bps") == max(n, 1)  # a rate is positive


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


@st.composite
def topology_text(draw) -> str:
    """A topology spec: a kind, some of its tables' keys (and now and then a stray key)."""
    kind = draw(st.sampled_from(sorted(KINDS)))
    lines = ["[fabric]", f'kind = "{kind}"']
    for table in (*COMMON[1:], *KINDS[kind]):
        keys = draw(st.lists(st.sampled_from(sorted(SCHEMA[table])), unique=True, max_size=4))
        if draw(st.integers(0, 20)) == 0:
            keys.append("stray")
        required = [k for k, rule in SCHEMA[table].items() if rule.default is None]
        keys += [k for k in required if k not in keys]
        if keys:
            lines.append(f"[{table}]")
            lines += [f"{k} = {toml_value(draw(VALUE))}" for k in keys]
    return "\n".join(lines) + "\n"


@PROFILE
@given(topology_text())
def test_a_topology_spec_builds_or_is_one_spec_error(text):
    # Small limits keep every fabric drawn here quick to build (they are checked before).
    with (
        mock.patch.object(builders, "MAX_NODES", 3000),
        mock.patch.object(builders, "MAX_LINKS", 6000),
    ):
        try:
            fabric = builders.build(parse(text, "drawn"))
        except SpecError as e:
            assert str(e).startswith("topology drawn") and "\n" not in str(e), str(e)
            assert len(str(e)) < 400, str(e)
        else:
            assert 0 < fabric.n_nodes <= 3000 and fabric.n_links <= 6000


@PROFILE
@given(st.text(max_size=200))
def test_any_text_is_a_topology_or_one_spec_error(text):
    try:
        parse(text, "text")
    except SpecError as e:
        assert "\n" not in str(e) or "TOML" in str(e)


@st.composite
def workload_table(draw) -> dict:
    keys = draw(st.sampled_from([COLLECTIVE, PATTERN, TRAINING]))
    names = draw(st.lists(st.sampled_from(sorted(keys)), unique=True, max_size=6))
    table = {k: draw(VALUE) for k in names}
    if draw(st.booleans()):
        kind = next(iter(keys))
        table[kind] = draw(st.one_of(st.sampled_from(["allreduce", "uniform", "llm"]), VALUE))
    return table


@PROFILE
@given(workload_table())
def test_a_workload_table_loads_or_is_one_spec_error(table):
    try:
        workload_from_dict(table, "drawn")
    except SpecError as e:
        assert str(e).startswith("workload drawn") and "\n" not in str(e), str(e)
        assert len(str(e)) < 400, str(e)


def test_the_capture_reader_survives_mutated_and_random_bytes():
    """A child process, so that a crash or a hang in a numba kernel fails here."""
    r = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_capture", "--iterations", str(FUZZ_ITERATIONS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120 + FUZZ_ITERATIONS // 10,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    assert f"{FUZZ_ITERATIONS} inputs, 0 failures" in r.stdout


@st.composite
def training_job(draw) -> dict:
    pp = draw(st.sampled_from([1, 2, 4]))
    return {
        "model": "m",
        "gpus": 64,
        "tp": draw(st.sampled_from([1, 2, 4, 8])),
        "pp": pp,
        "ep": draw(st.sampled_from([1, 2])),
        "params": draw(st.integers(1, 10**9)),
        "layers": draw(st.integers(pp, 16)),
        "bucket": draw(st.sampled_from(["1MiB", "4MiB", "25MiB", "1GiB"])),
        "fsdp": draw(st.booleans()),
        "micro_batches": draw(st.integers(0, 6)),
        "activation": draw(st.sampled_from([0, "1MiB"])),
        "moe_layers": draw(st.integers(1, 6)),
    }


@settings(max_examples=max(20, EXAMPLES // 10), deadline=None)
@given(training_job())
def test_the_training_bound_holds_the_operations_an_iteration_issues(table):
    """aifabric.traffic.spec refuses a training job from its keys alone: the bound it
    uses must never be below what aifabric.traffic.training really issues."""
    import numpy as np

    from aifabric.traffic.placement import place
    from aifabric.traffic.spec import training_op_bound
    from aifabric.traffic.training import training_ops

    job = workload_from_dict(table, "drawn").jobs[0]
    fabric = LAB_MEDIUM()
    nics = place(fabric, 64, "packed", np.random.default_rng(0))
    try:
        ops = training_ops(fabric, job, nics, "drawn")
    except SpecError:
        return  # a shape that does not divide the 64 GPUs
    assert len(ops) <= training_op_bound(job.values)
