"""Sweeps: one writer per folder, specs that say what they run, a Ctrl-C before the points
run, a retried point that replaces its own half-written directory, a point whose worker
dies on every try, a worker started again that ignores Ctrl-C, and a soak that kills
workers and the client, then resumes (issue 26). Workers are killed by pid, and only
processes the test's own sweep started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import Phase

from aifabric.cli import main
from aifabric.fabric.files import is_temporary
from tests.test_sweep_tables import disagreements

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


@pytest.mark.parametrize("where", ["earlier_points", "_is_done", "dashboard"])
def test_a_ctrl_c_before_the_points_run_is_an_interrupted_sweep(tiny, tmp_path, monkeypatch, where):
    """A Ctrl-C before the sweep began (reading the folder), while it reads which points are
    done, or once its cluster started: exit 130 in one sentence, the tables (where the sweep
    began) what the run directories say, and the same command again runs every point; not
    click's "Aborted!" and exit 1."""
    import aifabric.experiments.results_table
    import aifabric.experiments.runner

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    module = aifabric.experiments.results_table if where == "earlier_points" else None
    monkeypatch.setattr(module or aifabric.experiments.runner, where, ctrl_c)
    out = tmp_path / "sweep"
    args = ["sweep", str(tiny), "--seeds", "1-2", "--workers", "1", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and "interrupted" in result.output, result.output
    assert "Aborted" not in result.output, result.output
    if where != "earlier_points":
        assert not disagreements(out)
    monkeypatch.undo()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "2 of 2 points done (0 from before" in result.output, result.output


def test_a_ctrl_c_python_drops_still_stops_the_sweep(tiny, tmp_path, monkeypatch):
    """A Ctrl-C that lands in a garbage-collector callback (distributed has one) is dropped
    by Python with an "Exception ignored" traceback. The sweep keeps it instead and stops as
    for any Ctrl-C: exit 130, no traceback, and the same command again completes it."""
    import gc

    import aifabric.experiments.runner as runner

    real = runner.dashboard

    def ctrl_c_in_gc(phase, info):
        gc.callbacks.remove(ctrl_c_in_gc)
        raise KeyboardInterrupt

    def dashboard(client):  # once the points are submitted, a collection meets the Ctrl-C
        gc.callbacks.append(ctrl_c_in_gc)
        gc.collect()
        return real(client)

    monkeypatch.setattr(runner, "dashboard", dashboard)
    out = tmp_path / "sweep"
    args = ["sweep", str(tiny), "--seeds", "1-2", "--workers", "1", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and "interrupted" in result.output, result.output
    assert "Traceback" not in result.output and "ignored" not in result.output, result.output
    assert not disagreements(out)
    monkeypatch.undo()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "2 of 2 points done" in result.output, result.output


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


def test_a_resumed_sweep_removes_what_its_killed_predecessor_was_writing(tiny, tmp_path):
    """A sweep killed outright (SIGKILL) while it wrote results_long.parquet leaves that
    table's temporary beside it, as the soak below once found; the sweep run again removes
    it once it holds the folder, and leaves alone what is not a temporary of its own."""
    out = tmp_path / "sweep"
    argv = ["sweep", str(tiny), "--seeds", "1", "-o", str(out)]
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    left = out / ".results_long.parquet.k1ll3d.tmp"
    left.write_bytes(b"PAR1 half a table")
    other = out / ".notes.txt.x.tmp"  # a file the sweep does not write
    other.write_text("someone else's")
    again = CliRunner().invoke(main, argv)
    assert again.exit_code == 0, again.output
    assert not left.exists() and other.exists()
    assert [p.name for p in out.iterdir() if is_temporary(p.name)] == [other.name]
    assert not disagreements(out)


# -- a sweep soak: workers killed under their points, the client killed or stopped, then resumed

SOAK = ("--set", "workload.size=32MiB", "--vary", "ecmp.policy=5tuple,eecmp", "--seeds", "1-2")
POLL_S = 0.02


def _sweep(tiny: Path, out: Path, log: Path, *args: str, env=None) -> subprocess.Popen:
    """`aifabric sweep` in a process group of its own (its client, scheduler and workers),
    its output in `log`."""
    command = [sys.executable, "-m", "aifabric", "sweep", str(tiny), *args, "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    with open(log, "w") as fh:
        return subprocess.Popen(
            command, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def _ours(parent: int) -> set[int]:
    """The pids of the processes `parent` started (a sweep's workers): a pid a run.json names
    is killed only when it is one of them, never another process that took a dead one's pid."""
    import psutil

    try:
        return {c.pid for c in psutil.Process(parent).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _running(parent: int, out: Path) -> dict[str, int]:
    """The points of `out` running now, each with its worker's pid (a process of `parent`)."""
    ours, found = _ours(parent), {}
    for meta in out.glob("runs/*/run.json"):
        try:
            m = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if m.get("status") == "running" and m.get("pid") in ours:
            found[meta.parent.name] = m["pid"]
    return found


def _kill_worker(parent: int, pid: int, signum: int = signal.SIGKILL) -> bool:
    """Send the worker `pid` (a process of `parent`) `signum`, SIGKILL by default."""
    if pid not in _ours(parent):
        return False
    os.kill(pid, signum)
    return True


def _next_attempt(parent: int, out: Path, name: str, after: set[int], until) -> int | None:
    """The pid of the worker (a process of `parent`) that runs the point `name` next, one
    not in `after`; None when `until()` says to stop looking first."""
    while not until():
        pid = _running(parent, out).get(name)
        if pid is not None and pid not in after:
            return pid
        time.sleep(POLL_S)
    return None


def _ended(proc: subprocess.Popen, within_s: float):
    """`until` for `_next_attempt`: the sweep `proc` ended, or `within_s` went by."""
    deadline = time.monotonic() + within_s
    return lambda: proc.poll() is not None or time.monotonic() > deadline


def _ignores_sigint(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as fh:
        ignored = next(int(line.split()[1], 16) for line in fh if line.startswith("SigIgn:"))
    return bool(ignored >> (signal.SIGINT - 1) & 1)


def _end(proc: subprocess.Popen) -> None:
    """Kill what is left of the sweep `proc` (its process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def test_a_worker_started_again_after_its_process_died_ignores_ctrl_c(tiny, tmp_path):
    """A Ctrl-C at a terminal reaches every process of the sweep; the local workers ignore
    it and the client stops them. The worker a nanny starts in place of a dead one too: it
    keeps running its point through a SIGINT. (Spawned while the client handled SIGINT, it
    closed on one, and a sweep left with no worker waited for ever.)"""
    from aifabric.fabric.rundir import Run

    out, log = tmp_path / "sweep", tmp_path / "sweep.log"
    proc = _sweep(tiny, out, log, "--set", "workload.size=32MiB", "--seeds", "1-2",
                  "--workers", "1")  # fmt: skip
    try:
        until = _ended(proc, 120)
        first = _next_attempt(proc.pid, out, "seed=1", set(), until)
        assert first is not None and _kill_worker(proc.pid, first), log.read_text()
        again = _next_attempt(proc.pid, out, "seed=1", {first}, until)
        assert again is not None, log.read_text()
        ignores = _ignores_sigint(again)
        _kill_worker(proc.pid, again, signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        _end(proc)
    said = log.read_text()
    assert ignores, "the worker started in place of the dead one does not ignore SIGINT"
    assert proc.returncode == 0 and "Traceback" not in said, said
    run = Run(out / "runs" / "seed=1")
    assert (run.status, run.meta["pid"]) == ("complete", again), "the SIGINT ended its worker"


def test_a_point_whose_worker_is_killed_on_every_try_fails_alone_and_says_so(tiny, tmp_path):
    """Dask gives up on a task whose worker died under it on every try (KilledWorker): that
    point is a failed run with its reason in its own directory, the others complete, and
    the sweep exits 1 in one sentence. The worker is killed by its pid, each time a new
    attempt of the point starts."""
    import pandas as pd

    from aifabric.fabric.rundir import Run

    out, log = tmp_path / "sweep", tmp_path / "sweep.log"
    doomed = "workload.size=256MiB,seed=1"  # long: each try is seen running
    # two tries (Dask's default is four): the same path, in half the time
    proc = _sweep(tiny, out, log, "--vary", "workload.size=256KiB,1MiB,256MiB", "--workers", "2",
                  env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"})  # fmt: skip
    killed: set[int] = set()
    try:
        until = _ended(proc, 120)
        while (pid := _next_attempt(proc.pid, out, doomed, killed, until)) is not None:
            if _kill_worker(proc.pid, pid):
                killed.add(pid)
        proc.wait(timeout=60)
    finally:
        _end(proc)
    said = log.read_text()
    assert len(killed) == 2, (killed, said)
    assert proc.returncode == 1 and "1 of 3 points failed" in said, said
    assert "Traceback" not in said, said
    run = Run(out / "runs" / doomed)
    assert run.status == "failed", run.meta
    assert "died" in run.meta["message"] and "2 tries" in run.meta["message"], run.meta
    table = pd.read_csv(out / "results.csv").set_index("run_dir")
    assert table.loc[f"runs/{doomed}", "error"] == run.meta["message"]
    assert sorted(table["status"]) == ["complete", "complete", "failed"]
    assert not disagreements(out)
    assert not [p for p in out.rglob("*") if is_temporary(p.name)]


ENDINGS = ("finish", "ctrl-c", "kill")


def _soak_round(rng, ending: str, tiny: Path, out: Path, log: Path) -> int:
    """One round: some complete points deleted (so that the round has points to run), the
    sweep started, one or two of its workers killed each at a random moment of a point,
    then the sweep left to finish (`ending`), stopped by Ctrl-C or killed outright (its
    client, scheduler and workers) at a random moment. Returns how many workers it killed."""
    import shutil

    done = sorted(p.parent for p in out.glob("runs/*/run.json"))
    for run_dir in rng.sample(done, k=rng.randint(min(len(done), 2), len(done))):
        shutil.rmtree(run_dir)
    kills = rng.randint(1, 2)
    proc = _sweep(tiny, out, log, *SOAK, "--workers", "2")
    try:
        killed, until = 0, _ended(proc, 120)
        while killed < kills and not until():
            running = _running(proc.pid, out)
            if running:
                time.sleep(rng.uniform(0, 0.3))  # somewhere inside the point
                killed += _kill_worker(proc.pid, running[rng.choice(sorted(running))])
            time.sleep(POLL_S)
        if ending != "finish" and proc.poll() is None:
            time.sleep(rng.uniform(0, 3))
            with contextlib.suppress(ProcessLookupError):  # it may have just ended
                os.killpg(proc.pid, signal.SIGINT if ending == "ctrl-c" else signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        _end(proc)  # whatever the round left running
    said = log.read_text()
    if ending != "kill" or proc.returncode != -signal.SIGKILL:
        assert "Traceback" not in said, said
        assert proc.returncode in ((0, 130) if ending == "ctrl-c" else (0,)), said
        assert not disagreements(out), (disagreements(out), said)
    return killed


def _soak(tiny: Path, tmp_path: Path, seed: int, endings=None, rounds: int = 0) -> None:
    """Rounds of `_soak_round` drawn from `seed` (`endings`, or `rounds` of them drawn too),
    then the same sweep again, left alone: every point complete, and its tables what
    `rebuild_tables` makes of the run directories."""
    import random

    import pandas as pd

    rng, out, log = random.Random(seed), tmp_path / "sweep", tmp_path / "sweep.log"
    endings = endings or [rng.choice(ENDINGS) for _ in range(rounds)]
    killed = [_soak_round(rng, ending, tiny, out, log) for ending in endings]
    assert all(killed), f"a round saw no point running (seed {seed}: {endings}, {killed})"
    again = _sweep(tiny, out, log, *SOAK, "--workers", "2")
    try:
        again.wait(timeout=300)
    finally:
        _end(again)
    assert again.returncode == 0, (seed, endings, log.read_text())
    table = pd.read_csv(out / "results.csv")
    assert list(table["status"]) == ["complete"] * 4, (seed, endings, table)
    assert not disagreements(out), (seed, endings)
    assert not [p for p in out.rglob("*") if is_temporary(p.name)], (seed, endings)


def test_a_sweep_whose_workers_and_client_are_killed_ends_complete_when_resumed(tiny, tmp_path):
    _soak(tiny, tmp_path, seed=1, endings=["kill"])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_a_soak_of_killed_workers_and_clients_ends_complete_when_resumed(tiny, tmp_path, seed):
    _soak(tiny, tmp_path, seed=seed, rounds=5)
