"""Every exit path of `aifabric run` is honest: a signal at any point, a kill, a bad output path.

In-process, a signal is sent from inside the step it should interrupt (the
handler runs right after `os.kill` returns), so each point is hit exactly;
in a subprocess, signals land at wall-clock times, including while Python
starts and while numba compiles. Either way: no traceback, run.json not
left "running", every file in the run directory loadable.
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

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric import warmup
from aifabric.cli import main
from aifabric.fabric.rundir import LOCK, Run, RunWriter, effective_status

ROOT = Path(__file__).resolve().parent.parent

SMALL = """
[scenario]
topology = "lab-small"
seed = 2
sample_interval = "5us"
captures = ["z0-r0-h0-nic0"]

[workload]
collective = "allreduce"
algorithm = "ring"
size = "2MiB"

[congestion_control]
kind = "dcqcn"
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def loadable(run_dir: Path) -> list[str]:
    """Every file of the run directory read back as its kind; returns their names."""
    names = []
    for p in sorted(run_dir.rglob("*")):
        if p.is_dir():
            continue
        assert not p.name.endswith(".tmp"), f"a temporary file was left: {p}"
        if p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                for k in z.files:
                    z[k]
        elif p.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.read_table(p)
        elif p.suffix == ".pcap":
            from aifabric.analysis.capture import read_capture

            assert read_capture(p).problem in (None, ""), p
        else:
            assert p.name == LOCK, f"unexpected file {p}"
        names.append(p.name)
    return names


def signal_inside(monkeypatch, owner, name, sig=signal.SIGTERM, times=1, calls=1):
    """Patch `owner.name` to send `sig` to this process (`times` times) on its `calls`-th call,
    then do what it did."""
    original = getattr(owner, name)
    seen = []

    def wrapper(*args, **kw):
        seen.append(1)
        if len(seen) == calls:
            for _ in range(times):
                os.kill(os.getpid(), sig)
        return original(*args, **kw)

    monkeypatch.setattr(owner, name, wrapper)


def _points():
    import aifabric.cli_run
    import aifabric.scenarios
    import aifabric.sim.engine
    from aifabric.fabric.rundir import RunWriter

    return {
        "topology": (RunWriter, "topology", 1, "partial", "setting up"),
        "build": (aifabric.sim.engine, "simulation_for", 1, "partial", "building"),
        "run": (aifabric.cli_run._ProgressPrinter, "__call__", 1, "partial", "cover what ran"),
        "flows": (RunWriter, "flows", 1, "partial", "writing the results"),
        "ports": (RunWriter, "ports", 1, "partial", "writing the results"),
        "collectives": (RunWriter, "collectives", 1, "partial", "writing the results"),
        "captures": (aifabric.sim.engine, "write_pcap", 1, "partial", "writing the results"),
        "summary": (RunWriter, "note", 1, "partial", "writing the results"),
        "finish": (RunWriter, "finish", 1, "complete", ""),
        "load": (aifabric.scenarios, "load_scenario", 1, None, None),
    }


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("point", list(_points()))
def test_a_signal_at_any_point_leaves_an_honest_run(small, tmp_path, monkeypatch, point, sig):
    owner, name, calls, status, says = _points()[point]
    signal_inside(monkeypatch, owner, name, sig, calls=calls)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(small), "-o", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    if status is None:  # before the run directory: nothing written
        assert result.exit_code == 130 and "nothing was written" in result.output
        assert not out.exists()
        return
    run = Run(out)
    assert run.status == status, run.meta["message"]
    assert says in run.meta["message"]
    assert result.exit_code == (0 if status == "complete" else 130), result.output
    names = loadable(out)
    assert LOCK not in names
    if point in ("run", "captures", "summary"):
        assert "flows.npz" in names and "ports.npz" in names
    if point == "build":  # built, never run: every flow recorded as unstarted
        assert "nothing ran" in run.meta["message"]
        assert (run.flows()["start_ns"] == -1).all()


def test_a_second_signal_stops_at_once_with_what_was_written(small, tmp_path, monkeypatch):
    import aifabric.cli_run

    signal_inside(monkeypatch, aifabric.cli_run._ProgressPrinter, "__call__", times=2)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(small), "-o", str(out)])
    assert result.exit_code == 130 and "Traceback" not in result.output
    run = Run(out)
    assert run.status == "partial" and "interrupted while running" in run.meta["message"]
    assert sorted(loadable(out)) == ["run.json", "topology.json"]


def _aifabric(*args, env=None, **kw) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "aifabric", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        **kw,
    )


def _wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@pytest.mark.parametrize("after_s", [0.1, 0.2, 0.3, 0.6, 1.0])
def test_a_signal_while_the_command_starts_is_quiet(small, tmp_path, after_s):
    out = tmp_path / "run"
    proc = _aifabric("run", small, "-o", out)
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    if "init_import_site" in err or ("KeyboardInterrupt" in err and "in main" not in err):
        pytest.skip("the signal came while Python started, before aifabric's first line ran")
    assert "Traceback" not in err, err
    if out.exists() and (out / "run.json").exists():
        status = Run(out).status
        assert status in ("partial", "complete"), err
        loadable(out)
        # a signal after a complete run was written may end the process as the signal does
        assert proc.returncode in ((0, 130, -signal.SIGINT) if status == "complete" else (130,))
    else:
        assert proc.returncode in (1, 130), err


_HOLDS_THE_COMPILER = """
import os, signal, sys
from pathlib import Path
from numba.core.compiler_lock import global_compiler_lock
from aifabric.engines import Stop

stop = Stop()
said = Path(sys.argv[1])
stop.last_words = lambda: (said.write_text("partial"), "the status is written")[1]
with stop.handling():
    stop.enter("run")
    with global_compiler_lock:  # as numba holds it while compiling or loading a kernel
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**6):
            pass
print("the second signal did not stop the process")
"""


def test_a_second_signal_inside_numba_says_the_last_words_and_exits_without_raising(tmp_path):
    """An exception raised inside numba's compiler can crash the process later (a fresh-clone
    CI run ended by SIGSEGV after a second SIGTERM during the kernel's compile), so a signal
    that would raise there instead writes the run's status and ends the process, exit 130."""
    said = tmp_path / "said"
    proc = subprocess.run(
        [sys.executable, "-c", _HOLDS_THE_COMPILER, str(said)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert said.read_text() == "partial"
    assert "SIGTERM: stopped while compiling; the status is written" in proc.stderr
    assert "Traceback" not in proc.stderr and "did not stop" not in proc.stdout


def test_ctrl_c_inside_an_import_before_the_command_is_ready_ends_quietly(tmp_path):
    """A KeyboardInterrupt raised while a module imports can be swallowed by importlib or
    become a RuntimeError (a class body's `__set_name__`); the command's first handler ends
    the process instead (nothing is written before a command installs its own handling)."""
    (tmp_path / "interrupted_while_imported.py").write_text(
        "import os, signal\n"
        "class Field:\n"
        "    def __set_name__(self, owner, name):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        sum(range(10**6))\n"
        "class Model:\n"
        "    queues = Field()\n"
    )
    driver = (
        "import signal, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import aifabric, aifabric.fabric.interrupts\n"
        "signal.signal(signal.SIGINT, aifabric._interrupted)\n"
        "import interrupted_while_imported\n"
        "print('the import went on')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", driver],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "aifabric: interrupted"
    assert "went on" not in proc.stdout


@pytest.mark.slow  # a cold compile of the kernels: about three CPU minutes
def test_sigterm_while_numba_compiles_ends_partial_without_a_traceback(small, tmp_path):
    """A cold compile of the simulator's kernel (an empty cache, the run phase): one SIGTERM
    lets the compile finish and stops after the first slice of events, with results; a
    second stops it at once. The routes are compiled (and cached) in the build, before it."""
    for signals in (2, 1):
        out = tmp_path / f"run{signals}"
        cache = tmp_path / f"numba{signals}"
        cache.mkdir()
        (cache / warmup.MARKER).write_text("{}")  # no warm-up: the kernel compiles in the run
        proc = _aifabric("run", small, "-o", out, env={"NUMBA_CACHE_DIR": str(cache)})
        deadline = time.monotonic() + 300
        while not list(cache.glob("fabric_*/routing._walk_many-*.nbi")):
            assert time.monotonic() < deadline and proc.poll() is None, "no routes compiled"
            time.sleep(0.05)
        time.sleep(2.0)  # the kernel's compile takes tens of seconds from here
        assert proc.poll() is None, "the run ended before its kernel compiled"
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        _, err = proc.communicate(timeout=900)
        assert "Traceback" not in err and "RuntimeError" not in err, err
        assert proc.returncode == 130, err
        run = Run(out)
        assert run.status == "partial", run.meta["message"]
        names = loadable(out)
        if signals == 2:
            assert run.meta["message"].startswith("interrupted while running; written:")
            assert "flows.npz" not in names
        else:
            assert run.meta["message"] == "interrupted while running; the results cover what ran"
            assert "flows.npz" in names and "ports.npz" in names


def _processes_with(variable: str) -> list[int]:
    """The processes whose environment holds `variable` (NAME=value), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if variable.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


@pytest.mark.slow  # a cold compile of the kernels: about three CPU minutes
def test_signals_during_the_warm_up_of_an_empty_cache_end_quietly(small, tmp_path):
    """`aifabric run` on an empty kernel cache compiles everything first: one signal stops
    after the current compile step, a second at once; nothing is written, no traceback,
    no scratch folder and no compiling helper process left behind."""
    for signals in (2, 1):
        out = tmp_path / f"run{signals}"
        cache = tmp_path / f"numba{signals}"
        scratch = tmp_path / f"tmp{signals}"
        scratch.mkdir()
        env = {"NUMBA_CACHE_DIR": str(cache), "TMPDIR": str(scratch)}
        proc = _aifabric("run", small, "-o", out, env=env)
        deadline = time.monotonic() + 300
        while not list(cache.glob("fabric_*/routing._walk_many-*.nbi")):
            assert time.monotonic() < deadline and proc.poll() is None, "no routes compiled"
            time.sleep(0.05)
        time.sleep(1.0)
        assert proc.poll() is None, "the warm-up ended before the signal"
        sent = time.monotonic()
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        _, err = proc.communicate(timeout=900)
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert proc.returncode == 130, err
        assert not (out / "run.json").exists()
        assert not (cache / warmup.MARKER).exists()  # the next run compiles what is left
        assert list(scratch.iterdir()) == []
        deadline = time.monotonic() + 10  # a helper SIGKILLed is gone at once
        while _processes_with(f"NUMBA_CACHE_DIR={cache}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with(f"NUMBA_CACHE_DIR={cache}") == []
        if signals == 2:
            assert "stopped while compiling; nothing was written" in err
            assert time.monotonic() - sent < 10, "a second signal did not stop at once"
        else:
            assert "nothing was written" in err


def test_a_killed_run_reads_as_killed(small, tmp_path):
    out = tmp_path / "run"
    proc = _aifabric("run", small, "-o", out)
    _wait_for(out / "topology.json")
    assert effective_status(out) == "running"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert effective_status(out) == "killed"
    run = Run(out)
    assert run.status == "killed" and f"pid {proc.pid}" in run.meta["message"]
    result = CliRunner().invoke(main, ["analyze", str(out)])
    assert result.exit_code == 0, result.output
    assert "killed" in result.output


def test_a_run_in_progress_reads_as_running(tmp_path):
    writer = RunWriter(tmp_path / "r", "sim", {})
    assert Run(tmp_path / "r").status == "running"
    writer.finish("complete")
    assert Run(tmp_path / "r").status == "complete"
    assert not (tmp_path / "r" / LOCK).exists()


@pytest.mark.parametrize(
    "where, says, code",
    [
        ("file/sub", "is not a directory", 1),
        ("file", "is a file", 2),  # click's own check of -o
        ("full", "already exists and is not empty", 1),
        ("/proc/aifabric-run", "cannot write run directory", 1),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, where, says, code):
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    target = where if where.startswith("/") else str(tmp_path / where)
    result = CliRunner().invoke(main, ["run", "no-such-scenario", "-o", target])
    assert result.exit_code == code, result.output
    assert says in result.output and "unknown scenario" not in result.output
    assert "Traceback" not in result.output


def test_a_signal_while_python_exits_after_the_command_is_quiet():
    """A signal after the command finished (while Python runs its exit handlers) is no
    KeyboardInterrupt traceback: seen under load, when a run ended just before Ctrl-C."""
    code = (
        "import atexit, os, signal, sys\n"
        "import aifabric\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"
        "sys.argv = ['aifabric', '--version']\n"
        "aifabric.main()\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr
    assert "aifabric" in r.stdout
