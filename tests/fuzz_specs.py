"""Scenario, workload and topology specs drawn by hypothesis: valid ones bent out of shape.

`spec(data, base)` starts from a valid spec (a dict of TOML tables) and, a few
times, replaces a value anywhere in it with another (a value of the wrong type,
an edge number, a unit-less or absurd quantity), removes a key or adds an
unknown one; `toml(doc)` writes it. `bounded` values keep a run small (no
size or count that would simulate for minutes), `VALUES` are anything TOML
holds. The answer to every spec is exit 0, or exit 1 or 2 with one sentence;
never a traceback (tests/test_reliability.py).
"""

from __future__ import annotations

import copy
import json
import math

from hypothesis import strategies as st

from tests.fuzz_rundir import pick

SCENARIO = {
    "scenario": {"topology": "lab-small", "seed": 1, "sample_interval": "5us"},
    "workload": {"collective": "allreduce", "algorithm": "ring", "size": "64KiB", "gpus": 8},
    "ecmp": {"policy": "5tuple"},
    "congestion_control": {"kind": "dcqcn", "alpha_timer": "55us"},
    "faults": [{"link": "z0-r0-rtsw--z0-ctsw0", "at": "1us"}],
}
TOPOLOGY = {
    "fabric": {"kind": "leaf-spine", "description": "fuzzed"},
    "servers": {"gpus_per_server": 2, "servers_per_rack": 2},
    "zone": {"racks": 4, "ctsw_planes": 2, "rtsw_up_down": 1},
    "links": {"rate": "100G", "delay": "100ns", "fabric_delay": "500ns", "mtu": 4096},
}
WORKLOAD = {
    "jobs": [
        {"name": "ring", "collective": "allreduce", "size": "1MiB", "gpus": 8},
        {"name": "incast", "pattern": "incast", "senders": 3, "size": "1MB"},
    ]
}

ATOMS = (
    st.sampled_from([0, 1, -1, 2, 7, 2**31, 2**63 - 1, -(2**63)])
    | st.integers(-3, 40)
    | st.sampled_from([0.0, -0.0, 0.5, 1.5, -1.5, 1e30, math.nan, math.inf, -math.inf])
    | st.booleans()
    | st.sampled_from(["", "x", "0", "-1", "1e30", "nan", "1.5", "800", "0us", "1e-40s", "#1"])
    | st.text(max_size=6)
)
VALUES = st.recursive(
    ATOMS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["kind", "name", "size", "x", "a b"]), inner, max_size=2)
    ),
    max_leaves=5,
)
# a run's values: no size, count or time that would simulate for long
BOUNDED = st.recursive(
    st.sampled_from([0, 1, -1, 2, 3, 0.5, 1.5, math.nan, math.inf, True, False])
    | st.sampled_from(["", "x", "0", "-1", "1e30", "nan", "1.5", "800", "0us", "2KiB", "#1"]),
    lambda inner: st.lists(inner, max_size=2)
    | st.dictionaries(st.sampled_from(["kind", "x"]), inner, max_size=2),
    max_leaves=3,
)  # fmt: skip


def spec(data, base: dict, values=VALUES) -> dict:
    """`base` with one to three values replaced, keys removed or unknown keys added."""
    doc = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(1, 3))):
        picked = pick(data, doc)
        if picked is None:
            continue
        node, key = picked
        how = data.draw(st.sampled_from(["replace", "replace", "replace", "drop", "add"]))
        if how == "drop":
            del node[key]
        elif how == "add" and isinstance(node, dict):
            node[data.draw(st.sampled_from(["extra", "kind", "rate", "jobs"]))] = data.draw(values)
        else:
            node[key] = data.draw(values)
    return doc


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(str(k))} = {_value(x)}" for k, x in v.items()) + "}"


def toml(doc) -> str:
    """The spec as TOML: top-level tables as [sections], a list of tables as [[arrays]],
    anything else inline."""
    if not isinstance(doc, dict):
        doc = {"scenario": doc}
    lines = []
    for section, body in doc.items():
        name = json.dumps(str(section))
        if isinstance(body, dict):
            lines.append(f"[{name}]")
            lines += [f"{json.dumps(str(k))} = {_value(v)}" for k, v in body.items()]
        elif isinstance(body, list) and body and all(isinstance(b, dict) for b in body):
            for item in body:
                lines.append(f"[[{name}]]")
                lines += [f"{json.dumps(str(k))} = {_value(v)}" for k, v in item.items()]
        else:
            lines.insert(0, f"{name} = {_value(body)}")
    return "\n".join(lines) + "\n"


def outcome(result) -> str | None:
    """What is wrong with the CLI's answer to a spec, or None."""
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"raised {type(result.exception).__name__}: {result.exception}"
    if "Traceback" in out:
        return f"printed a traceback: {out[-400:]}"
    if result.exit_code in (0, 130):
        return None
    if result.exit_code not in (1, 2):
        return f"exit {result.exit_code}: {out[-400:]}"
    errors = [line for line in out.splitlines() if line.startswith("Error: ")]
    if len(errors) != 1:
        return f"not one sentence: {out[-400:]}"
    return None
