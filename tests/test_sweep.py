"""Sweeps on Dask: a local cluster, a real scheduler with two workers, and Ctrl-C then resume.

Kept small for a shared 2-core machine: lab-small, a few points, single-threaded workers.
The workers inherit this process's environment (PYTHONPATH, NUMBA_CACHE_DIR).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.experiments.runner import NO_DASHBOARD, scenario_hash
from aifabric.fabric.rundir import Run

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_sweep_on_a_local_cluster_of_two_workers(tiny, tmp_path):
    from aifabric.analysis.metrics import run_metrics

    out = tmp_path / "sweep"
    r = invoke("sweep", tiny, "--vary", "ecmp.policy=5tuple,eecmp", "--vary", "workload.gpus=8,64",
               "--seeds", "1", "--workers", 2, "-o", out, "--json")  # fmt: skip
    # points failed: the sweep says so and exits 1, after the outcome
    assert r.exit_code == 1, r.output
    *shown, said = r.output.rstrip().splitlines()
    assert said.startswith("Error: 2 of 4 points failed") and "error column" in said, said
    shown = "\n".join(shown)
    outcome = json.loads(shown[shown.index("{") :])
    assert (outcome["points"], outcome["ran"], outcome["failed"]) == (4, 4, 2)
    table = pd.read_csv(out / "results.csv")
    assert list(table["ecmp.policy"]) == ["5tuple", "5tuple", "eecmp", "eecmp"]
    assert list(table["workload.gpus"]) == [8, 64, 8, 64]
    failed = table[table["status"] == "failed"]
    assert list(failed["workload.gpus"]) == [64, 64]
    assert all("does not fit on fabric lab-small" in e for e in failed["error"])
    done = table[table["status"] == "complete"]
    assert len(done) == 2
    for _, row in done.iterrows():
        run = Run(out / row["run_dir"])
        assert run.status == "complete"
        assert run.meta["scenario"]["ecmp"]["policy"] == row["ecmp.policy"]
        assert row["scenario_hash"] == scenario_hash(run.meta["scenario"])
        m = run_metrics(run).to_dict()
        (op,) = m["collectives"]["ops"]
        assert row["busbw_gbps@allreduce"] == pytest.approx(op["busbw_bps"] / 1e9)
        assert row["fct_p99_ns"] == pytest.approx(m["fct_ns"]["p99"])
        assert row["pfc_frames"] == m["congestion"]["pfc_frames"]
        time_ns, ideal = row["time_ns@allreduce"], row["ideal_ns@allreduce"]
        assert time_ns == op["time_ns"] and 0 < ideal < time_ns
        assert row["efficiency@allreduce"] == pytest.approx(ideal / time_ns)
    assert any(c.startswith("ecmp_max_mean.") for c in table.columns)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dask_cluster(tmp_path):
    """A real `dask scheduler` and two `dask worker` processes on 127.0.0.1."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "dask"]
    with open(tmp_path / "dask.log", "w") as logs:
        procs = [
            subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                              "--no-dashboard"], env=_env(), stdout=logs, stderr=logs)
        ]  # fmt: skip
        for i in range(2):
            procs.append(
                subprocess.Popen([*dask, "worker", address, "--nthreads", "1", "--nworkers", "1",
                                  "--no-dashboard", "--memory-limit", "0", "--name", f"w{i}"],
                                 env=_env(), stdout=logs, stderr=logs, cwd=tmp_path)
            )  # fmt: skip
        try:
            from dask.distributed import Client

            with Client(address, timeout="30s") as client:
                client.wait_for_workers(2, timeout=60)
            yield address
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_a_sweep_sent_to_an_existing_scheduler(tiny, tmp_path, dask_cluster, monkeypatch):
    import dask.distributed

    def no_local_cluster(*args, **kwargs):
        raise AssertionError("a sweep given --scheduler must not start a local cluster")

    def no_warm_up(*args, **kwargs):
        raise AssertionError("the client does not compile for a cluster's workers")

    monkeypatch.setattr(dask.distributed, "LocalCluster", no_local_cluster)
    monkeypatch.setattr("aifabric.warmup.ensure_warm", no_warm_up)
    out = tmp_path / "sweep"
    r = invoke("sweep", tiny, "--vary", "ecmp.policy=5tuple,eecmp", "--seeds", "1-2",
               "--scheduler", dask_cluster, "-o", out)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "4 of 4 points done (0 from before, 0 failed)" in r.output
    assert NO_DASHBOARD in r.output  # the scheduler runs with --no-dashboard
    table = pd.read_csv(out / "results.csv")
    assert list(table["status"]) == ["complete"] * 4
    assert list(table["seed"]) == [1, 2, 1, 2]
    from dask.distributed import Client

    with Client(dask_cluster) as client:
        pids = set(client.run(os.getpid).values())
    assert len(pids) == 2 and os.getpid() not in pids
    for row in table.itertuples():
        assert Run(out / row.run_dir).status == "complete"


def test_a_local_sweep_compiles_the_kernels_once_before_its_workers_start(
    tiny, tmp_path, monkeypatch
):
    import aifabric.experiments.runner

    events = []
    connect = aifabric.experiments.runner.connect

    def recording_connect(*args, **kwargs):
        events.append("workers")
        return connect(*args, **kwargs)

    monkeypatch.setattr("aifabric.warmup.ensure_warm", lambda *a, **k: events.append("warm-up"))
    monkeypatch.setattr(aifabric.experiments.runner, "connect", recording_connect)
    r = invoke("sweep", tiny, "--workers", 1, "-o", tmp_path / "sweep")
    assert r.exit_code == 0, r.output
    assert events == ["warm-up", "workers"]


WORKER_LOGS = """
import logging
from aifabric.experiments.runner import connect

def shout():
    logging.getLogger("distributed.worker").error("Failed to communicate with scheduler")
    return 1

client, cluster = connect(workers=1)
try:
    print(client.submit(shout, pure=False).result())
finally:
    client.close()
    cluster.close()
"""


def test_what_local_workers_log_stays_off_the_terminal():
    """The shutdown after Ctrl-C can find a worker's heartbeat talking to a scheduler that is
    already closed; the worker logs that at ERROR with a traceback. Failures reach the table
    through the futures, so the local workers' own log lines are not shown."""
    r = subprocess.run([sys.executable, "-c", WORKER_LOGS], env=_env(), capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"
    assert "Failed to communicate" not in r.stderr, r.stderr


def test_an_interrupted_sweep_resumes_without_rerunning_finished_points(tiny, tmp_path):
    """Ctrl-C once the first point is in the table. Each point simulates about a second (at
    32 MiB, a tenth: beside two test suites the other eleven once ended before the Ctrl-C
    was acted on), so the interrupt lands mid-sweep even on a loaded machine."""
    out = tmp_path / "sweep"
    args = [sys.executable, "-m", "aifabric", "sweep", str(tiny), "--set", "workload.size=256MiB",
            "--set", "workload.gpus=16", "--vary", "ecmp.policy=5tuple,eecmp,pinned,spray",
            "--seeds", "1-3", "--workers", "2", "-o", str(out)]  # fmt: skip
    proc = subprocess.Popen(args, env=_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    table = out / "results.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if table.is_file() and len(table.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "run the same command again to resume" in err
    # the workers, in the same process group, got the Ctrl-C too: the client stops them quietly
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    first = pd.read_csv(table)
    finished = first[first["status"] == "complete"]
    assert 1 <= len(finished) < 12, "the interrupt came too late to test anything"
    # the table agrees with the run directories: every row's run is complete
    started = {}
    for row in finished.itertuples():
        run = Run(out / row.run_dir)
        assert run.status == "complete"
        started[row.run_dir] = run.meta["started_at"], (out / row.run_dir / "run.json").stat()
    again = subprocess.run(args[:-2] + ["-o", str(out), "--json"], env=_env(),
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr
    outcome = json.loads(again.stdout)
    assert outcome["reused"] == len(finished) and outcome["ran"] == 12 - len(finished)
    final = pd.read_csv(table)
    assert list(final["status"]) == ["complete"] * 12
    for run_dir, (stamp, stat) in started.items():
        now = (out / run_dir / "run.json").stat()
        assert Run(out / run_dir).meta["started_at"] == stamp
        assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)


def test_compare_gives_a_sweep_one_column_per_configuration(tiny, tmp_path):
    from aifabric.experiments.stats import describe, half_width

    out = tmp_path / "sweep"
    r = invoke("sweep", tiny, "--vary", "ecmp.policy=5tuple,pinned",
               "--vary", "workload.gpus=8,16", "--set", "workload.size=4MiB",
               "--seeds", "1-3", "--workers", 1, "-o", out)  # fmt: skip
    assert r.exit_code == 0, r.output
    table = pd.read_csv(out / "results.csv")
    assert list(table["status"]) == ["complete"] * 12

    def compare(*args):
        r = invoke("compare", *args, "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.output[r.output.index("[") :])

    groups = compare(out, "--by", "ecmp.policy")
    assert [g["name"] for g in groups] == ["policy=5tuple (6 runs)", "policy=pinned (6 runs)"]
    for group, policy in zip(groups, ("5tuple", "pinned"), strict=True):
        mine = table[table["ecmp.policy"] == policy]
        runs = compare(*(out / d for d in mine["run_dir"]))  # the same runs one by one
        (job,) = group["jobs"]
        busbw = [x["jobs"][0]["busbw_bps"] for x in runs]
        assert job["busbw_bps"] == pytest.approx(describe(busbw)["mean"])
        assert job["spread"]["busbw_bps"] == pytest.approx(half_width(busbw))
        assert job["busbw_bps"] == pytest.approx(mine["busbw_gbps@allreduce"].mean() * 1e9)
        p99 = [x["fct_p99_ns"] for x in runs]
        assert group["fct_p99_ns"] == pytest.approx(describe(p99)["mean"])
        assert group["spread"]["fct_p99_ns"] == pytest.approx(half_width(p99))
        assert group["pfc_frames"] == pytest.approx(sum(x["pfc_frames"] for x in runs) / 6)
        assert group["runs"] == 6
    every = compare(out)  # by default: every varied key
    assert [g["name"] for g in every] == [
        "policy=5tuple, gpus=8 (3 runs)", "policy=5tuple, gpus=16 (3 runs)",
        "policy=pinned, gpus=8 (3 runs)", "policy=pinned, gpus=16 (3 runs)",
    ]  # fmt: skip
    text = invoke("compare", out, "--by", "workload.gpus")
    assert text.exit_code == 0, text.output
    head, _, rest = text.output.partition("\n")
    assert "gpus=8 (6 runs)" in head and "gpus=16 (6 runs)" in head
    busbw = next(line for line in rest.splitlines() if "): busbw" in line)
    assert busbw.count("±") == 2
    wrong = invoke("compare", out, "--by", "workload.qps")
    assert wrong.exit_code == 1
    assert wrong.output.strip() == (
        f"Error: --by workload.qps: sweep {out} does not vary it "
        "(it varies ecmp.policy, workload.gpus)"
    )


def test_a_point_whose_scenario_changed_is_run_again(tiny, tmp_path):
    out = tmp_path / "sweep"

    def sweep():
        r = invoke("sweep", tiny, "--vary", "ecmp.policy=5tuple,eecmp", "--workers", 1,
                   "-o", out, "--json")  # fmt: skip
        assert r.exit_code == 0, r.output
        return json.loads(r.output[r.output.index("{") :])

    assert (sweep()["ran"], sweep()["reused"]) == (2, 2)
    first = pd.read_csv(out / "results.csv")
    tiny.write_text(tiny.read_text().replace('size = "1MiB"', 'size = "2MiB"'))
    outcome = sweep()
    assert (outcome["ran"], outcome["reused"]) == (2, 0)
    again = pd.read_csv(out / "results.csv")
    assert (again["scenario_hash"] != first["scenario_hash"]).all()
    for row in again.itertuples():
        assert Run(out / row.run_dir).meta["scenario"]["workload"]["size"] == "2MiB"
