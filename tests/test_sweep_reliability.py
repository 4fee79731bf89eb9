"""Sweeps: one writer per folder, specs that say what they run, a retried point that
replaces its own half-written directory, and a soak that kills workers and the client
(issue 26).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import Phase

from aifabric.cli import main

ROOT = Path(__file__).resolve().parent.parent
# no shrinking: a failure is reported as drawn (shrinking a CLI call takes minutes)
PHASES = [Phase.explicit, Phase.generate]


TINY = """
[scenario]
topology = "lab-small"
seed = 1
[workload]
collective = "allreduce"
algorithm = "ring"
size = "256KiB"
gpus = 8
"""


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_a_second_sweep_of_one_folder_is_refused_or_waits(tiny, tmp_path):
    import threading

    from aifabric.experiments.runner import sweep_lock

    out = tmp_path / "sweep"
    out.mkdir()
    with sweep_lock(out):
        result = CliRunner().invoke(main, ["sweep", str(tiny), "--seeds", "1-2", "-o", str(out)])
        assert result.exit_code == 1, result.output
        assert f"pid {os.getpid()}" in result.output and "--wait" in result.output
        assert not (out / "results.csv").exists()  # refused before it wrote anything
    held = sweep_lock(out)
    held.__enter__()
    released = threading.Timer(0.5, held.__exit__, (None, None, None))
    released.start()
    said = []
    with sweep_lock(out, wait=True, echo=said.append):
        assert said and "waiting" in said[0]
    released.join()


def test_a_baseline_or_a_size_that_names_no_grid_point_is_refused(tiny, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'[sweep]\nscenario = "{tiny}"\nseeds = [1]\n[grid]\n"ecmp.policy" = ["5tuple", "eecmp"]\n'
        '[report]\nmetric = "busbw_gbps"\nbaseline = { "ecmp.policy" = "spray" }\n'
    )
    result = CliRunner().invoke(main, ["sweep", "run", str(spec), "-o", str(tmp_path / "s")])
    assert result.exit_code == 1 and "names no configuration" in result.output, result.output
    many = ",".join(str(i) for i in range(1, 1101))
    for args, says in (
        (["--seeds", "1-100000000"], "100,000,000 seeds"),
        (["--vary", f"workload.gpus={many}", "--vary", f"scenario.sample_interval={many}"],
         "1,210,000 points"),
    ):  # fmt: skip
        result = CliRunner().invoke(main, ["sweep", str(tiny), *args, "-o", str(tmp_path / "s")])
        assert result.exit_code == 1 and says in result.output and "GB" in result.output, (
            result.output
        )
    assert not (tmp_path / "s").exists()


_KILLED_MID_POINT = """
import os, sys
import aifabric.sim.engine as engine
from aifabric.experiments.runner import run_point
run = engine.SimSession.run
def killed(self, stop, progress):
    os._exit(9)  # the worker dies in the middle of the point
engine.SimSession.run = killed
run_point(sys.argv[1], (), 1, sys.argv[2], "sim", ("busbw",), sys.argv[3])
"""


def test_a_retried_point_replaces_its_own_half_written_directory(tiny, tmp_path):
    from aifabric.experiments.runner import run_point
    from aifabric.fabric.rundir import Run, recorded_owner

    path = tmp_path / "runs" / "p0"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_MID_POINT, str(tiny), str(path), "task-1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 9, proc.stderr
    assert Run(path).status == "killed" and recorded_owner(path) == "task-1"
    other = run_point(str(tiny), (), 1, str(path), "sim", ("busbw",), "task-2")
    assert other["status"] == "failed" and "already exists" in other["error"]  # not its own
    row = run_point(str(tiny), (), 1, str(path), "sim", ("busbw",), "task-1")
    assert row["status"] == "complete", row
    assert Run(path).status == "complete" and Run(path).meta["owner"] == "task-1"


# -- a sweep soak: workers killed under their points, the client killed, then resumed ----------


def _running_pids(out: Path) -> list[int]:
    pids = []
    for meta in out.glob("runs/*/run.json"):
        try:
            m = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if m.get("status") == "running":
            pids.append(m["pid"])
    return pids


def _agrees(out: Path) -> list[str]:
    """results.csv against the run directories: each row's status is its run's."""
    import pandas as pd

    from aifabric.fabric.rundir import Run

    table = pd.read_csv(out / "results.csv")
    return [r.status for r in table.itertuples() if Run(out / r.run_dir).status != r.status]


@pytest.mark.slow
def test_a_sweep_that_loses_workers_and_its_client_ends_with_every_point_complete(tiny, tmp_path):
    import signal
    import time

    import pandas as pd

    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "aifabric", "sweep", str(tiny), "--set", "workload.size=16MiB",
            "--vary", "ecmp.policy=5tuple,eecmp,pinned", "--seeds", "1-2", "--workers", "2",
            "-o", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    killed, deadline = set(), time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline and len(killed) < 2:
        for pid in _running_pids(out):
            if pid not in killed:
                time.sleep(0.3)  # well inside the point
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
                break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=300)
    assert killed, "no point was seen running"
    assert proc.returncode == 0, err
    table = pd.read_csv(out / "results.csv")
    assert list(table["status"]) == ["complete"] * 6 and not _agrees(out)
    # the client killed outright, mid-sweep, then resumed
    shutil.rmtree(out / "runs" / table["run_dir"][5].split("/")[-1])
    shutil.rmtree(out / "runs" / table["run_dir"][4].split("/")[-1])
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    while proc.poll() is None and not _running_pids(out):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    table = pd.read_csv(out / "results.csv")
    assert list(table["status"]) == ["complete"] * 6 and not _agrees(out)
    assert not list(out.rglob("*.tmp"))
