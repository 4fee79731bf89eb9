"""Damaged run directories: every file truncated, corrupted, swapped, deleted or edited
(`tests/fuzz_rundir.py`) reads as one sentence naming the file, never a traceback (issue 26).

The default suite draws 300; the slow test 10,000 (AIFABRIC_FUZZ_MANY sets how many). Both
draw the same cases on every run, so CI's verdict is about the code, not the draw; set
AIFABRIC_FUZZ_EXPLORE=1 to draw new cases (how each find so far was made).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from aifabric.cli import main
from tests import fuzz_rundir

ROOT = Path(__file__).resolve().parent.parent
# no shrinking: a failure is reported as drawn (shrinking a CLI call takes minutes)
PHASES = [Phase.explicit, Phase.generate]


def _fuzz(pristine: Path, data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        shutil.copytree(pristine, run_dir)
        did = fuzz_rundir.mutate(data, run_dir)
        commands = [["analyze"]] * 5 + [["analyze", "--json"]] * 4 + [["report"]]
        args = data.draw(st.sampled_from(commands))
        if args == ["report"]:
            args = ["report", "-o", str(Path(tmp) / "r.html")]
        result = CliRunner().invoke(main, [*args, str(run_dir)])
        problem = fuzz_rundir.outcome(result, run_dir)
        assert problem is None, f"{did}, then {' '.join(args)}: {problem}"


FUZZ_MANY = int(os.environ.get("AIFABRIC_FUZZ_MANY", 10_000))
FUZZ = dict(
    deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], phases=PHASES,
    derandomize=os.environ.get("AIFABRIC_FUZZ_EXPLORE", "") in ("", "0"),
)  # fmt: skip


@settings(max_examples=300, **FUZZ)
@given(data=st.data())
def test_a_damaged_run_directory_is_one_sentence(pristine, data):
    _fuzz(pristine, data)


def _fuzz_library(pristine: Path, data) -> None:
    """The analyzer as `analyze` calls it (no command line): an answer or `AifabricError`
    naming the run, nothing else, and no warning."""
    import warnings

    from aifabric.analysis import targets
    from aifabric.fabric.errors import AifabricError

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        shutil.copytree(pristine, run_dir)
        did = fuzz_rundir.mutate(data, run_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                targets.analyze(str(run_dir))
            except AifabricError as e:
                assert str(run_dir) in str(e) and "\n" not in str(e), f"{did}: {e}"


@pytest.mark.slow
@settings(max_examples=FUZZ_MANY, **FUZZ)
@given(data=st.data())
def test_ten_thousand_damaged_run_directories_are_one_sentence_each(pristine, data):
    _fuzz_library(pristine, data)


def test_a_path_through_another_nic_is_one_sentence(pristine, tmp_path):
    """Found by the fuzzer: a path that starts at its src and reaches its dst but passes a
    third NIC on the way (an edited topology.json) reached the ECMP analysis, which asked
    that NIC for its next hops."""
    import numpy as np

    from aifabric.fabric.rundir import Run

    run_dir = tmp_path / "run"
    shutil.copytree(pristine, run_dir)
    fabric = Run(run_dir).fabric()
    flows = dict(np.load(run_dir / "flows.npz"))
    f = int(np.flatnonzero(np.diff(flows["path_ptr"]) >= 3)[0])
    other = next(
        int(x) for x in np.flatnonzero(fabric.nic_port >= 0)
        if x not in (flows["src"][f], flows["dst"][f])
    )  # fmt: skip
    flows["path_link"] = flows["path_link"].copy()
    flows["path_link"][flows["path_ptr"][f] + 1] = fabric.nic_port[other] // 2
    fuzz_rundir._save_npz(run_dir / "flows.npz", flows)
    result = CliRunner().invoke(main, ["analyze", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert f"flow {f}'s path passes through {fabric.node_name[other]}" in result.output
    assert "Traceback" not in result.output


def test_a_fabric_too_large_to_address_is_one_sentence(pristine, tmp_path):
    """Found by the 10,000-mutation fuzzer in CI: a node's zone edited to 2**31 - 1 passed
    the topology's checks and failed later, in addressing, without naming the file."""
    import json

    run_dir = tmp_path / "run"
    shutil.copytree(pristine, run_dir)
    topo = json.loads((run_dir / "topology.json").read_text())
    nic = next(n for n in topo["nodes"] if n["role"] == "nic")
    nic["zone"] = 2**31 - 1
    (run_dir / "topology.json").write_text(json.dumps(topo))
    result = CliRunner().invoke(main, ["analyze", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert str(run_dir / "topology.json") in result.output
    assert "too large for 10.zone.rack.slot addresses" in result.output
    assert "Traceback" not in result.output


def test_a_flow_to_its_own_nic_is_one_sentence(pristine, tmp_path):
    """Found by the 10,000-mutation fuzzer: a flow whose dst is its src passes every per-column
    check (its path starts at src, so it 'reaches' dst), and the ECMP analysis then saw
    choices onto NIC links: a ValueError from deep inside."""
    import numpy as np

    run_dir = tmp_path / "run"
    shutil.copytree(pristine, run_dir)
    flows = dict(np.load(run_dir / "flows.npz"))
    flows["dst"] = flows["dst"].copy()
    flows["dst"][1] = flows["src"][1]
    fuzz_rundir._save_npz(run_dir / "flows.npz", flows)
    result = CliRunner().invoke(main, ["analyze", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert "flow 1 runs from a NIC to itself" in result.output
    assert "Traceback" not in result.output


def test_a_switch_recorded_as_a_nic_is_one_sentence(pristine, tmp_path):
    """Found by the 10,000-mutation fuzzer: a topology.json whose spine says it is a NIC read
    as a fabric, and the ECMP analysis then asked for the tier of a 'NIC' with several links:
    `ValueError: -1 is not a valid Role` from deep inside."""
    import json

    run_dir = tmp_path / "run"
    shutil.copytree(pristine, run_dir)
    topo = json.loads((run_dir / "topology.json").read_text())
    spine = next(n for n in topo["nodes"] if n["role"] not in ("nic", "rtsw"))
    spine["role"] = "nic"
    (run_dir / "topology.json").write_text(json.dumps(topo))
    result = CliRunner().invoke(main, ["analyze", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert f"NIC {spine['name']} has" in result.output and "links, not one" in result.output
    assert "Traceback" not in result.output


def test_a_seed_that_is_not_a_number_is_one_sentence(pristine, tmp_path):
    """Found by the 10,000-mutation fuzzer: run.json's scenario seed edited into a list
    reached the ECMP analysis's routing as a TypeError."""
    import json

    run_dir = tmp_path / "run"
    shutil.copytree(pristine, run_dir)
    meta = json.loads((run_dir / "run.json").read_text())
    meta["scenario"]["seed"] = [-1.85e196]
    (run_dir / "run.json").write_text(json.dumps(meta))
    result = CliRunner().invoke(main, ["analyze", str(run_dir)])
    assert result.exit_code == 1, result.output
    assert "its scenario's seed is not a whole number" in result.output
    assert "Traceback" not in result.output
