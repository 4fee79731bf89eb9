"""A full disk at every write of a run, and a second interrupt while a file is half written:
the status is honest (never running or killed), no temporary is left (issue 26).
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


SMALL = """
[scenario]
topology = "lab-small"
seed = 2
sample_interval = "5us"
captures = ["z0-r0-h0-nic0"]

[workload]
collective = "allreduce"
algorithm = "ring"
size = "256KiB"
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def _writes_fail(monkeypatch, first: int, last: int | None):
    """Every atomic write of a run (run.json, topology.json, the arrays, captures) from the
    `first`-th to the `last`-th (None: to the end) fails as a full disk does, half written."""
    import errno

    import aifabric.fabric.rundir
    import aifabric.sim.engine
    from aifabric.fabric import files

    calls = []

    def replace_atomic(path, write):
        calls.append(path)
        if first <= len(calls) and (last is None or len(calls) <= last):

            def full(tmp):
                write(tmp)
                raise OSError(errno.ENOSPC, "No space left on device")

            return files.replace_atomic(path, full)
        return files.replace_atomic(path, write)

    for module in (aifabric.fabric.rundir, aifabric.sim.engine):
        monkeypatch.setattr(module, "replace_atomic", replace_atomic)
    return calls


def honest(out: Path, result) -> str:
    """The run's status after a failure, asserted honest: never running or killed, a
    failed run says "disk full", the CLI one sentence; no temporaries, every file loads."""
    from aifabric.fabric.rundir import LOCK, RESERVE, Run

    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    if not out.exists():  # refused while setting up: nothing left behind
        assert result.exit_code == 1 and "disk full" in result.output, result.output
        return "none"
    left = [p.name for p in out.rglob("*") if p.name.startswith(".")]
    assert left in ([], [RESERVE]) and not any(p.endswith(".tmp") for p in left), left
    run = Run(out)
    assert run.status in ("complete", "failed"), (run.status, run.meta["message"])
    if run.status == "failed":
        assert "disk full" in run.meta["message"], run.meta["message"]
        assert result.exit_code == 1 and "disk full" in result.output.splitlines()[-1]
        assert result.output.splitlines()[-1].startswith("Error: ")
    else:
        assert result.exit_code == 0, result.output
        assert not (out / LOCK).exists()
    run.flows(), run.ports(), run.collectives()  # whatever is there loads
    return run.status


@pytest.mark.parametrize("stays_full", [False, True], ids=["one-write", "stays-full"])
def test_a_full_disk_at_any_write_leaves_an_honest_status(small, tmp_path, monkeypatch, stays_full):
    seen = {}
    for k in range(1, 30):
        out = tmp_path / f"run-{k}"
        with monkeypatch.context() as m:
            calls = _writes_fail(m, k, None if stays_full else k)
            result = CliRunner().invoke(main, ["run", str(small), "-o", str(out)])
        seen[k] = honest(out, result)
        if k > len(calls):  # no write failed: every write was tried
            break
    assert k > 5 and seen[k] == "complete", seen
    assert seen[1] == "none"  # run.json could not be made: no run directory at all
    assert "failed" in seen.values()


def test_a_second_interrupt_while_a_file_is_written_leaves_no_temporary(small, tmp_path):
    """Two signals while ports.npz is half written, where raising is unsafe (the process
    ends at once, `Stop._exit_now`): the temporary is removed and run.json does not list it."""
    out = tmp_path / "run"
    script = f"""
import os, signal, sys
import aifabric.engines as engines
import aifabric.fabric.rundir as rundir
from aifabric.cli import main
savez = rundir.savez_deflated  # how ports.npz is written
def interrupted(fh, **arrays):
    if "interval_ns" in arrays:
        fh.write(b"x" * 100_000)
        engines.raising_is_unsafe = lambda frame=None: True
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
    return savez(fh, **arrays)
rundir.savez_deflated = interrupted
main(["run", {str(small)!r}, "-o", {str(out)!r}])
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")], list(out.iterdir())
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "partial" and ".tmp" not in meta["message"], meta["message"]
    assert "ports.npz" not in meta["message"]


# -- a real full disk (a small tmpfs), at fill levels from nothing left to room for the run ----


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_real_full_disk_at_every_fill_level_leaves_an_honest_status(small, tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    seen = {}
    try:
        for left in (0, 4096, 16384, 65536, 98304, 131072, 196608, 262144, 393216, 1 << 20):
            filler = mnt / "filler"
            with open(filler, "wb") as fh:
                free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
                fh.write(b"\0" * max(free - left, 0))
            out = mnt / "run"
            result = CliRunner().invoke(main, ["run", str(small), "-o", str(out)])
            seen[left] = honest(out, result)
            shutil.rmtree(out, ignore_errors=True)
            filler.unlink()
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False)  # a file still open there
    assert seen[0] == "none" and seen[1 << 20] == "complete", seen
    assert "failed" in seen.values(), seen
