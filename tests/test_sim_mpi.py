"""One simulation on the ranks of an MPI job (aifabric.sim.mpi): `mpirun -n N aifabric run`
writes what one process writes, rank 0 alone prints and writes, and a run that cannot be
partitioned, bad input or a stop end every rank without a hang.

Needs Open MPI's mpirun and mpi4py (`scripts/install --test` installs both); ranks may
outnumber the cores (--oversubscribe)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from aifabric.fabric.errors import AifabricError
from aifabric.sim import mpi


def _have_mpi4py() -> bool:
    code = "import mpi4py"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


needs_mpi = pytest.mark.skipif(
    shutil.which("mpirun") is None or not _have_mpi4py(),
    reason="needs Open MPI's mpirun and mpi4py (scripts/install --test)",
)

K8 = """[scenario]
topology = "fat-tree-k8"
[workload]
pattern = "permutation"
gpus = 128
size = "2MB"
"""


def mpirun(ranks: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`aifabric ARGS` on `ranks` MPI ranks (as root too, oversubscribed)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", sys.executable, "-m", "aifabric"]
    return subprocess.run([*cmd, *args], env=env, capture_output=True, text=True, timeout=timeout)


def plain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aifabric", *args], capture_output=True, text=True, timeout=240
    )


def same_results(a, b) -> bool:
    return all(
        (a / name).read_bytes() == (b / name).read_bytes()
        for name in ("flows.parquet", "ports.parquet")
    )


def summary(run) -> dict:
    return json.loads((run / "run.json").read_text())["results"]["summary"]


@needs_mpi
@pytest.mark.parametrize("ranks, parts", [(2, "3"), (4, "auto"), (3, "2")])
def test_mpi_ranks_write_what_one_process_writes(tmp_path, ranks, parts):
    """2 ranks holding 3 partitions (2 on rank 0), 4 ranks one each, 3 ranks of which one
    holds none (it only takes part in the exchanges): flow records and port series byte
    for byte those of one process on one partition; PFC pauses and ECN marks cross the
    cut. Rank 0 alone prints (one summary) and writes."""
    spec = tmp_path / "k8.toml"
    spec.write_text(K8)
    one = plain("run", str(spec), "-o", str(tmp_path / "one"), "--set", "simulator.partitions=1")
    assert one.returncode == 0, one.stderr
    got = mpirun(
        ranks,
        "run",
        str(spec),
        "-o",
        str(tmp_path / "mpi"),
        "--set",
        f"simulator.partitions={parts}",
    )
    assert got.returncode == 0, got.stdout + got.stderr
    n = ranks if parts == "auto" else int(parts)
    assert got.stdout.count("partitions        ") == 1
    assert f"partitions        {n} on {ranks} MPI ranks, windows of 500 ns" in got.stdout
    part = summary(tmp_path / "mpi")["partitions"]
    assert (part["partitions"], part["mpi_ranks"]) == (n, ranks)
    assert same_results(tmp_path / "one", tmp_path / "mpi")
    s = summary(tmp_path / "one")
    assert s["pfc_frames"] > 0 and s["ecn_marked"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k8.toml", "mpi", "one"]


@needs_mpi
def test_the_demo_on_mpi_ranks_writes_what_one_process_writes(tmp_path):
    """The demo's ring AllReduce (its steps, buffers and op latencies as messages between
    the ranks) beside an incast under DCQCN: the records of one process on one partition."""
    one = plain("run", "demo", "-o", str(tmp_path / "one"), "--set", "simulator.partitions=1")
    assert one.returncode == 0, one.stderr
    got = mpirun(2, "run", "demo", "-o", str(tmp_path / "mpi"), "--set", "simulator.partitions=2")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "partitions        2 on 2 MPI ranks, windows of " in got.stdout
    assert same_results(tmp_path / "one", tmp_path / "mpi")
    a, b = (summary(tmp_path / r)["collectives"] for r in ("one", "mpi"))
    assert a == b


DRAINED = """[scenario]
topology = "fat-tree-k8"
[workload]
collective = "alltoall"
algorithm = "pairwise"
size = "1MiB"
gpus = 32
[[faults]]
node = "z0-ctsw0"
at = "10us"
action = "drain"
[[faults]]
node = "z0-ctsw0"
at = "40us"
action = "up"
"""


@needs_mpi
def test_drains_during_the_run_on_mpi_ranks_write_what_one_process_writes(tmp_path):
    """A CTSW drained and restored while an AllToAll runs: the ranks share the flows each
    re-routes, between windows; the records are one process's on one partition."""
    spec = tmp_path / "drained.toml"
    spec.write_text(DRAINED)
    one = plain("run", str(spec), "-o", str(tmp_path / "one"), "--set", "simulator.partitions=1")
    assert one.returncode == 0, one.stderr
    got = mpirun(2, "run", str(spec), "-o", str(tmp_path / "mpi"), "--set",
                 "simulator.partitions=2")  # fmt: skip
    assert got.returncode == 0, got.stdout + got.stderr
    assert "partitions        2 on 2 MPI ranks, windows of " in got.stdout
    assert same_results(tmp_path / "one", tmp_path / "mpi")
    a, b = (summary(tmp_path / r) for r in ("one", "mpi"))
    assert a["faults"] == b["faults"] and len(a["faults"]) == 2


LOSSY = """[scenario]
topology = "fat-tree-k8"
[workload]
pattern = "permutation"
gpus = 128
size = "1MB"
[queue]
pfc = false
buffer = "64KiB"
ecn_kmin = "16KiB"
ecn_kmax = "32KiB"
"""


@needs_mpi
@pytest.mark.parametrize("finish", ["sender", "receiver"])
def test_a_run_that_drops_on_mpi_ranks_writes_what_one_process_writes(tmp_path, finish):
    """Lossy (PFC off, a small buffer, go-back-N): the drops' timeouts go to their senders'
    ranks and read only what those heard ACKed, and the run is partitioned, whichever end
    its flows finish at. It writes what one process writes, captures of ports in both ranks'
    partitions and across the cut included; the other ranks end."""
    spec = tmp_path / "lossy.toml"
    spec.write_text(LOSSY)
    ports = "z0-r0-h0-nic0,z7-r3-h3-nic0,z7-r3-rtsw--z7-r3-h3-nic0,z3-ctsw0--p0-atsw3"
    opt = ["--set", f"congestion_control.finish={finish}", "--capture", ports]
    one = plain("run", str(spec), "-o", str(tmp_path / "one"), *opt)
    assert one.returncode == 0, one.stderr
    assert summary(tmp_path / "one")["drops"] > 0
    got = mpirun(2, "run", str(spec), "-o", str(tmp_path / "mpi"), *opt, "--set",
                 "simulator.partitions=2")  # fmt: skip
    assert got.returncode == 0, got.stdout + got.stderr
    assert "partitions        2 on 2 MPI ranks, windows of " in got.stdout
    assert same_results(tmp_path / "one", tmp_path / "mpi")
    pcaps = sorted((tmp_path / "one" / "captures").glob("*.pcap"))
    assert len(pcaps) == 4
    for a in pcaps:
        b = tmp_path / "mpi" / "captures" / a.name
        assert a.stat().st_size > 10_000 and a.read_bytes() == b.read_bytes(), a.name


@needs_mpi
def test_bad_input_under_mpirun_is_one_sentence_and_ends_every_rank(tmp_path):
    got = mpirun(2, "run", "no-such-preset", "-o", str(tmp_path / "r"), timeout=120)
    assert got.returncode != 0
    assert got.stderr.count("unknown scenario preset 'no-such-preset'") == 1
    assert "Traceback" not in got.stderr + got.stdout
    assert not (tmp_path / "r").exists()


@needs_mpi
def test_a_stopped_mpi_run_keeps_what_ran_and_ends_every_rank(tmp_path):
    """SIGINT to rank 0 (the pid in run.json) midway: every rank's windows end, rank 0
    writes a partial run saying so, and no rank is left behind."""
    spec = tmp_path / "long.toml"
    spec.write_text(K8.replace('size = "2MB"', 'size = "64MB"'))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    run = tmp_path / "r"
    cmd = ["mpirun", "-n", "2", "--oversubscribe", sys.executable, "-m", "aifabric"]
    proc = subprocess.Popen(
        [*cmd, "run", str(spec), "-o", str(run), "--set", "simulator.partitions=2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline, pid = time.monotonic() + 120, None
        while pid is None and time.monotonic() < deadline:  # until the run has begun
            try:
                pid = json.loads((run / "run.json").read_text())["pid"]
            except (OSError, ValueError, KeyError):
                time.sleep(0.2)
        time.sleep(3.0)  # into its windows: the whole run takes over 20 s
        os.kill(pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "partial", (out, err)
    assert meta["results"]["summary"]["partitions"] == {
        "partitions": 2,
        "mpi_ranks": 2,
        "stopped": True,
    }
    assert "partitions        2 on 2 MPI ranks, stopped before the end" in out
    assert "Traceback" not in out + err
    left = subprocess.run(["pgrep", "-f", str(spec)], capture_output=True, text=True)
    assert left.stdout == ""


def test_a_launcher_without_mpi4py_is_one_sentence(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py: ImportError
    monkeypatch.setattr(mpi, "_looked", False)
    monkeypatch.setattr(mpi, "_world", None)
    with pytest.raises(AifabricError, match=r"^started as one of 2 MPI ranks, but mpi4py is not"):
        mpi.world()
