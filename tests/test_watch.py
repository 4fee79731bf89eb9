"""`aifabric watch` and the live file a run streams into its run directory.

One run of the demo (about 1.5 s of simulation) serves the run tests: its live
records are collected through the progress hook, with the one-second pace
lifted so that every slice of events writes one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.fabric import live as live_mod
from aifabric.fabric.rundir import Run, RunWriter, hold_lock, release_lock
from aifabric.sim import layout as L

ROOT = Path(__file__).resolve().parent.parent


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def figure(output: str, label: str) -> int:
    """The whole number shown after `label` in a frame (`ECN marks   12,345`)."""
    m = re.search(rf"{re.escape(label)}\s+([\d,]+)", output)
    assert m, f"no {label!r} in:\n{output}"
    return int(m.group(1).replace(",", ""))


def cells(row: str) -> list[str]:
    """The cells of one row of a table as rich draws it."""
    return [x.strip() for x in row.strip().strip("│").split("│")]


def run_streaming(out, sc):
    """Run `sc` into `out` with a live record after every slice of events; the records and
    the progress each was made at (the simulator calls the progress hook right after the
    live file's turn, between two slices)."""
    from aifabric.engines import run_scenario

    seen = []

    def progress(p, final=False):
        rec = json.loads((out / live_mod.LIVE).read_text())
        if not seen or rec != seen[-1][0]:
            seen.append((rec, p))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(live_mod, "EVERY_S", 0.0)
        summary = run_scenario("sim", sc, out, progress=progress)
    assert summary["status"] == "complete", summary
    return out, seen


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo run, and every live record it wrote."""
    from aifabric.scenarios import load_scenario

    return run_streaming(tmp_path_factory.mktemp("watch") / "demo", load_scenario("demo"))


def test_a_run_streams_records_that_follow_its_state_and_end_at_its_results(demo):
    out, seen = demo
    mid = [(r, p) for r, p in seen if not r["final"]]
    assert len(mid) >= 5, f"only {len(mid)} records while the demo ran"
    for r, p in mid:  # each from the state the simulator then reported
        assert (r["simulated_ns"], r["events"], r["flows_done"]) == (p.now_ns, p.events,
                                                                     p.flows_done)  # fmt: skip
    ns = [r["simulated_ns"] for r, _ in mid]
    assert ns == sorted(ns) and ns[0] < ns[-1]
    for name in live_mod.TOTALS:
        values = [r["totals"][name] for r, _ in mid]
        assert values == sorted(values), name
    last = json.loads((out / live_mod.LIVE).read_text())
    assert last["final"] and last["schema"] == live_mod.LIVE_SCHEMA

    run = Run(out)
    ports = run.ports()
    summary = run.meta["results"]["summary"]
    for name in ("tx_bytes", "ecn_marked", "pfc_sent", "paused_ns", "drops", "cnp_sent"):
        assert last["totals"][name] == int(ports[name].sum()), name
    assert last["totals"]["ecn_marked"] == summary["ecn_marked"] > 0
    assert last["totals"]["pfc_sent"] == summary["pfc_frames"] > 0
    assert last["totals"]["paused_ns"] == summary["paused_ns_total"] > 0
    assert last["flows_done"] == summary["flows_done"] == summary["flows"]
    flows = run.flows()
    for job in last["jobs"]:
        mine = flows["job"] == job["job"]
        assert job["delivered_bytes"] == job["bytes"] == int(flows["bytes"][mine].sum())
        assert job["flows_done"] == job["flows"] == int(mine.sum())

    # mid-run, the bytes sent so far lie between what the samples closed before that
    # time hold and what the samples begun by then hold
    t, interval = ports["t_ns"], int(ports["interval_ns"])
    per_sample = ports["tx_bytes"].sum(axis=1)
    marks = ports["ecn_marked"].sum(axis=1)
    for r, _ in mid:
        now = r["simulated_ns"]
        closed, begun = t + interval <= now, t <= now
        assert per_sample[closed].sum() <= r["totals"]["tx_bytes"] <= per_sample[begun].sum()
        assert marks[closed].sum() <= r["totals"]["ecn_marked"] <= marks[begun].sum()


@pytest.fixture(scope="module")
def demo_on_partitions(tmp_path_factory):
    """The demo on two partitions (its flows are too few for "auto" to choose them), and its
    live records."""
    from aifabric.scenarios import load_scenario

    sc = load_scenario("demo", overrides=[("simulator.partitions", 2)])
    return run_streaming(tmp_path_factory.mktemp("watch") / "demo-2", sc)


def test_a_partitioned_run_streams_its_partitions_figures(demo_on_partitions):
    """While partitions run, the simulation's own arrays hold the state they started from:
    the records come from the partitions (each port's from its owner), not from those."""
    out, seen = demo_on_partitions
    run = Run(out)
    summary = run.meta["results"]["summary"]
    assert summary["partitions"]["partitions"] == 2
    mid = [(r, p) for r, p in seen if not r["final"]]
    assert len(mid) >= 3, f"only {len(mid)} records while the demo ran"
    for r, p in mid:
        assert (r["simulated_ns"], r["events"], r["flows_done"]) == (p.now_ns, p.events,
                                                                     p.flows_done)  # fmt: skip
        assert "covers" not in r  # one process holds every partition
    late = mid[len(mid) // 2 :]
    assert all(r["events"] > 0 and r["totals"]["tx_bytes"] > 0 and r["ports"] for r, _ in late)
    assert all(sum(j["delivered_bytes"] for j in r["jobs"]) > 0 for r, _ in late)
    for name in live_mod.TOTALS:
        values = [r["totals"][name] for r, _ in mid]
        assert values == sorted(values), name
    for k in range(len(mid[0][0]["jobs"])):
        got = [r["jobs"][k]["delivered_bytes"] for r, _ in mid]
        assert got == sorted(got)

    # the totals are the sample intervals each partition closed: at least those closed a
    # window before the clock shown (the partitions' clocks differ by a window at most),
    # at most those begun a window after it
    ports = run.ports()
    t, interval = ports["t_ns"], int(ports["interval_ns"])
    window = summary["partitions"]["lookahead_ns"]
    per_sample = ports["tx_bytes"].sum(axis=1)
    for r, _ in mid:
        now = r["simulated_ns"]
        closed, begun = t + interval <= now - window, t <= now + window
        assert per_sample[closed].sum() <= r["totals"]["tx_bytes"] <= per_sample[begun].sum()

    last = json.loads((out / live_mod.LIVE).read_text())
    assert last["final"] and last["flows_done"] == summary["flows"]
    for name in ("tx_bytes", "ecn_marked", "pfc_sent", "paused_ns", "drops", "cnp_sent"):
        assert last["totals"][name] == int(ports[name].sum()), name


def test_a_rank_that_holds_some_partitions_says_what_its_figures_cover():
    """Under MPI rank 0 holds only its partitions: its record counts their ports and flows
    alone and says so; the clock, events and flows done are the run's (the progress)."""
    from aifabric.scenarios import load_scenario
    from aifabric.sim.driver import Progress
    from aifabric.sim.engine import LiveCounters, simulation_for
    from aifabric.sim.partition import PartitionedRun

    sc = load_scenario("demo")
    sim = simulation_for(sc)
    run = PartitionedRun(sim, 2, local=lambda n: [0])  # partition 0 alone, as rank 0 of 2
    sim.running = run
    c = run.parts[0]
    port_part = run.part[sim.fabric.port_node]
    mine, theirs = np.flatnonzero(port_part == 0)[0], np.flatnonzero(port_part == 1)[0]
    for p in (mine, theirs):  # a queue and a closed interval's bytes on either side
        c.pt[p, L.PT_Q0_BYTES] = 1000 + p
        c.smp[L.SERIES.index("tx_bytes"), 0, p] = 5000 + p
    c.g[L.G_SAMPLES] = 1
    progress = Progress(now_ns=7, flows_done=3, flows=len(sim.flows), events=11, wall_s=0.1)
    got = LiveCounters(sim)(progress)
    assert (got["now_ns"], got["events"], got["flows_done"]) == (7, 11, 3)
    assert got["queue_bytes"][mine] == 1000 + mine and got["queue_bytes"][theirs] == 0
    tx = got["totals"]["tx_bytes"]
    assert tx[mine] == 5000 + mine and tx[theirs] == 0
    assert got["covers"] == "1 of 2 partitions (this MPI rank's)"


def test_the_final_record_is_what_the_run_directory_gives(demo):
    out, _ = demo
    last = json.loads((out / live_mod.LIVE).read_text())
    again = live_mod.from_run(Run(out))
    for key in ("totals", "flows", "flows_done", "simulated_ns", "events"):
        assert last[key] == again[key], key
    keep = ("job", "flows", "flows_done", "bytes", "delivered_bytes")
    assert [{k: j[k] for k in keep} for j in last["jobs"]] == [
        {k: j[k] for k in keep} for j in again["jobs"]
    ]


def test_streaming_leaves_the_results_bit_identical(demo):
    """A record after every slice reads the state between slices and changes nothing: the
    run directory holds what the simulation gives without the engine around it."""
    from aifabric.scenarios import load_scenario
    from aifabric.sim.engine import simulation_for

    out, _ = demo
    sim = simulation_for(load_scenario("demo"))
    assert sim.run()
    sim.close()
    run = Run(out)
    for got, want in ((run.flows(), sim.flow_records()), (run.ports().arrays(), sim.port_series())):
        assert set(want) <= set(got)
        for k in want:
            assert np.array_equal(got[k], want[k]), k


def test_watch_once_on_a_finished_run_shows_what_analyze_finds(demo):
    out, _ = demo
    r = invoke("analyze", out, "--json")
    assert r.exit_code == 0, r.output
    m = json.loads(r.output[r.output.index("{") :])
    w = invoke("watch", out, "--once")
    assert w.exit_code == 0, w.output
    shown = w.output
    assert "complete" in shown and "from the run directory" in shown
    c = m["congestion"]
    assert figure(shown, "ECN marks") == c["ecn_marked"] > 0
    assert figure(shown, "PFC frames") == c["pfc_frames"] > 0
    assert figure(shown, "PFC paused") == c["paused_ns"] > 0
    assert figure(shown, "drops") == c["drops"]
    assert figure(shown, "bytes sent") == sum(p["tx_bytes"] for p in c["per_port"])
    assert re.search(rf"flows {m['flows']['finished']:,}/{m['flows']['count']:,}", shown), shown
    flows = Run(out).flows()
    for job in m["jobs"]:
        n = int((flows["job"] == job["job"]).sum())
        assert re.search(rf"{job['name']}\s+│\s+{n:,}/{n:,}\s", shown), shown
    # the hottest port: the one that held the longest queue, and that queue
    from aifabric.fabric.units import format_size

    first = cells(shown.split("hottest ports")[1].splitlines()[4])
    summary = Run(out).meta["results"]["summary"]
    assert first[:2] == [summary["max_queue_port"], format_size(c["qdepth_max_bytes"])], shown


def test_a_killed_run_is_shown_as_killed_from_its_last_live_record(demo, tmp_path):
    out, seen = demo
    killed = tmp_path / "killed"
    killed.mkdir()
    for name in ("run.json", "topology.json"):
        shutil.copy(out / name, killed / name)
    rec = next(r for r, _ in seen if not r["final"] and r["flows_done"])
    (killed / live_mod.LIVE).write_text(json.dumps(rec))
    meta = json.loads((out / "run.json").read_text())
    gone = subprocess.Popen(["true"])
    gone.wait()
    meta.update(status="running", pid=gone.pid, results={})
    (killed / "run.json").write_text(json.dumps(meta))
    r = invoke("watch", killed)  # following a run that is not running: one frame
    assert r.exit_code == 0, r.output
    assert "killed" in r.output and "from live.json" in r.output, r.output
    assert figure(r.output, "ECN marks") == rec["totals"]["ecn_marked"]
    assert re.search(rf"flows {rec['flows_done']:,}/{rec['flows']:,}", r.output), r.output


def test_watch_follows_a_run_until_it_ends(tmp_path):
    out = tmp_path / "run"
    # the demo with twice the AllReduce: a few seconds to follow
    run = subprocess.Popen([sys.executable, "-m", "aifabric", "run", "demo", "-o", str(out),
                            "--set", "workload.jobs.allreduce.size=64MiB"],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out / live_mod.LIVE).is_file():
            assert run.poll() is None, run.stderr.read()
            assert time.monotonic() < deadline, "no live.json within 2 minutes"
            time.sleep(0.02)
        rec = live_mod.read_live(out)
        assert rec is not None and not rec["final"] and rec["engine"] == "sim"
        watcher = subprocess.Popen(
            [sys.executable, "-m", "aifabric", "watch", str(out), "--every", "0.2"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)
        following = run.poll() is None and watcher.poll() is None
        out_text, err = watcher.communicate(timeout=120)
        status_at_exit = Run(out).status
        assert run.wait(timeout=120) == 0
    finally:
        run.kill()
    assert watcher.returncode == 0, err
    assert "Traceback" not in err, err
    assert following, "the run ended before the watch could follow it"
    assert status_at_exit == "complete"  # it followed the run to its end, not further
    assert "complete" in out_text, out_text  # its last frame: the run's end
    assert live_mod.read_live(out)["final"]


def test_watch_once_on_a_run_in_progress(tmp_path):
    """A run directory this process is writing (its lock held), with a live record."""
    from aifabric.topologies import load_fabric

    fabric = load_fabric("lab-small")
    writer = RunWriter(tmp_path / "run", "sim", {"name": "by-hand", "workload": {"jobs": [
        {"name": "ring"}, {"name": "incast"}]}})  # fmt: skip
    try:
        stream = live_mod.LiveStream(writer.path, "sim", fabric, [0, 0, 1], [100, 200, 4000])
        n = fabric.n_ports
        tx = np.zeros(n, dtype=np.int64)
        tx[5] = 12_500
        zero = np.zeros(n, dtype=np.int64)
        ecn = zero.copy()
        ecn[5] = 7
        stream.write(now_ns=1000, events=5000, flows_done=1, delivered=[100, 50, 1000],
                     done=[True, False, False],
                     totals={"tx_bytes": tx, "ecn_marked": ecn, "paused_ns": zero,
                             "pfc_sent": zero, "drops": zero},
                     queue_bytes=zero)  # fmt: skip
        r = invoke("watch", writer.path, "--once")
        stream.write(now_ns=2000, events=9000, flows_done=1, delivered=[100, 50, 1000],
                     done=[True, False, False],
                     totals={"tx_bytes": tx, "ecn_marked": ecn, "paused_ns": zero,
                             "pfc_sent": zero, "drops": zero},
                     queue_bytes=zero, covers="1 of 2 partitions (this MPI rank's)")  # fmt: skip
        partial = invoke("watch", writer.path, "--once")
    finally:
        writer.finish("complete")
    assert r.exit_code == 0, r.output
    assert "running" in r.output and "from live.json" in r.output, r.output
    assert figure(r.output, "ECN marks") == 7 and figure(r.output, "bytes sent") == 12_500
    assert "flows 1/3" in r.output
    # 12,500 bytes in 1 us on a port of lab-small: its share of the line rate
    rate = float(fabric.port_rate_bps[5])
    assert f"{12_500 * 8e9 / 1000 / rate:.0%}" in r.output
    assert fabric.port_name(5) in r.output
    assert re.search(r"ring\s+│\s+1/2 ", r.output) and re.search(r"incast\s+│\s+0/1 ", r.output)
    # a record of part of the fabric (an MPI rank's partitions) says so; a whole one does not
    assert "partitions" not in r.output
    assert "ports and jobs of 1 of 2 partitions (this MPI rank's) only" in partial.output


def test_ctrl_c_stops_the_watching_quietly(tmp_path):
    import signal

    from aifabric.topologies import load_fabric

    writer = RunWriter(tmp_path / "run", "sim", {"name": "by-hand"})  # running: this process
    try:
        fabric = load_fabric("lab-small")
        zero = np.zeros(fabric.n_ports, dtype=np.int64)
        live_mod.LiveStream(writer.path, "sim", fabric, [0], [10]).write(
            now_ns=10, events=1, flows_done=0, delivered=[0], done=[False], queue_bytes=zero,
            totals={name: zero for name in live_mod.TOTALS},
        )  # fmt: skip
        watcher = subprocess.Popen(
            [sys.executable, "-m", "aifabric", "watch", str(writer.path), "--every", "0.2"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(4)  # the command loads and follows: the run is still running
        assert watcher.poll() is None, watcher.communicate()
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=30)
    finally:
        writer.finish("complete")
    assert watcher.returncode in (0, 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


# --- sweeps ------------------------------------------------------------------------------------


def _sweep_dir(tmp_path, rows_for):
    """A sweep directory of 2 configurations x 3 seeds whose results.csv holds `rows_for`
    (point index -> row), written by the runner's own functions."""
    from aifabric.experiments.results_table import write_tables
    from aifabric.experiments.spec import sweep_from_flags
    from aifabric.fabric.rundir import write_json
    from tests.test_sweep_overrides import TINY

    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY)
    sweep = sweep_from_flags(str(scenario), vary=["ecmp.policy=5tuple,eecmp"], seeds="1-3")
    out = tmp_path / "sweep"
    (out / "runs").mkdir(parents=True)
    write_json(out / "sweep.json", sweep.to_dict())
    points = sweep.points()
    write_tables(out, sweep, points, rows_for, [])
    return out, points


def test_watch_counts_a_sweeps_points(tmp_path):
    rows = {
        0: {"status": "complete", "busbw_gbps@job0": 100.0},
        1: {"status": "complete", "busbw_gbps@job0": 120.0},
        2: {"status": "failed", "error": "it broke"},
        3: {"status": "complete", "busbw_gbps@job0": 50.0},
    }
    out, points = _sweep_dir(tmp_path, rows)
    # point 4 runs (this process holds its lock); point 5 was killed
    writer = RunWriter(out / "runs" / points[4].name, "sim", {"name": "tiny"})
    dead = out / "runs" / points[5].name
    dead.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    meta = json.loads((writer.path / "run.json").read_text())
    (dead / "run.json").write_text(json.dumps({**meta, "pid": gone.pid}))
    lock = hold_lock(out / "sweep.lock", "busy")
    try:
        r = invoke("watch", out, "--once")
    finally:
        release_lock(out / "sweep.lock", lock)
        writer.finish("complete")
    assert r.exit_code == 0, r.output
    assert "6 points: 3 done, 1 failed, 1 running, 0 waiting, 1 killed" in r.output, r.output
    assert "running" in r.output.splitlines()[0]
    assert points[4].name in r.output.split("running points")[1]
    # per configuration: 5tuple has 2 complete (mean 110) and 1 failed; eecmp 1 complete (50)
    line5 = next(x for x in r.output.splitlines() if "5tuple" in x)
    assert cells(line5)[-5:] == ["3", "2", "1", "0", "110"], line5
    line_e = next(x for x in r.output.splitlines() if "eecmp" in x and "seed" not in x)
    assert cells(line_e)[-5:] == ["3", "1", "0", "1", "50"], line_e

    # the sweep's process gone (no lock): said so, with what is left to run
    r = invoke("watch", out)
    assert r.exit_code == 0, r.output
    assert "not running (1 points not run" in r.output and "resumes" in r.output, r.output
    # the point that finished after the sweep stopped counts as done: a rerun keeps it
    assert "6 points: 4 done, 1 failed, 0 running, 0 waiting, 1 killed" in r.output, r.output


NO_BOKEH = """
import sys


class NoBokeh:  # this interpreter cannot import bokeh, as where it is not installed
    def find_spec(self, name, path=None, target=None):
        if name == "bokeh" or name.startswith("bokeh."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoBokeh())
from aifabric.experiments import runner

client, cluster = runner.connect(workers=1)
print(runner.dashboard(client))
client.close()
cluster.close()
"""


def test_a_sweeps_local_cluster_serves_the_dashboard_it_prints(tmp_path):
    import urllib.request

    from aifabric.experiments import runner

    client, cluster = runner.connect(workers=1)
    try:
        line = runner.dashboard(client)
        assert re.fullmatch(r"Dask dashboard: http://\S+:\d+/status", line), line
        with urllib.request.urlopen(line.split(": ", 1)[1], timeout=30) as page:
            assert page.status == 200 and b"Dask" in page.read()
    finally:
        client.close()
        cluster.close()
    without = subprocess.run([sys.executable, "-c", NO_BOKEH], cwd=ROOT, capture_output=True,
                             text=True, timeout=180)  # fmt: skip
    assert without.returncode == 0, without.stderr
    assert without.stdout.strip() == runner.NO_BOKEH, without.stdout + without.stderr


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda p: p / "nowhere", "does not exist"),
        (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "is not a directory"),
        (lambda p: p, "neither a run directory nor a sweep directory"),
    ],
)
def test_bad_input_is_one_sentence(tmp_path, make, says):
    r = invoke("watch", make(tmp_path), "--once")
    assert r.exit_code == 1, r.output
    assert says in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output


# --- the emulator ------------------------------------------------------------------------------


def _emulator_unavailable() -> str | None:
    import os

    if os.geteuid() != 0:
        return "the Mininet engine needs root"
    from aifabric.emu import available

    return available()


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(_emulator_unavailable() is not None, reason=str(_emulator_unavailable()))
def test_the_emulators_monitor_streams_records_that_end_at_its_run_directory(tmp_path, monkeypatch):
    import threading

    from aifabric.engines import run_scenario
    from aifabric.scenarios import scenario_from_dict

    written = []  # (thread, record) of every record, as it was written
    write = live_mod.LiveStream.write

    def noted(self, **kw):
        rec = write(self, **kw)
        written.append((threading.current_thread().name, rec))
        return rec

    monkeypatch.setattr(live_mod.LiveStream, "write", noted)
    monkeypatch.setattr(live_mod, "EVERY_S", 0.25)
    sc = scenario_from_dict(
        {"scenario": {"topology": "lab-small"}, "congestion_control": {"kind": "none"},
         "workload": {"pattern": "incast", "gpus": 16, "size": "2MiB"}}, "emu-live",
    )  # fmt: skip
    out = tmp_path / "run"
    summary = run_scenario("mininet", sc, out, options={"timeout_s": 300})
    assert summary["status"] == "complete", summary
    mid = [r for who, r in written if not r["final"]]
    assert len(mid) >= 3 and {who for who, r in written if not r["final"]} == {"aifabric-monitor"}
    for name in live_mod.TOTALS:
        values = [r["totals"][name] for r in mid]
        assert values == sorted(values), name
    assert [r["simulated_ns"] for r in mid] == sorted(r["simulated_ns"] for r in mid)
    last = live_mod.read_live(out)
    assert last["final"] and last["engine"] == "mininet" and last["events"] is None
    ports = Run(out).ports()
    for name in live_mod.TOTALS:
        assert last["totals"][name] == int(ports[name].sum()), name
    assert last["totals"]["pfc_sent"] == summary["pfc_frames"] > 0
    assert last["flows_done"] == summary["flows_done"] == len(sc.flows)
    (job,) = last["jobs"]
    assert job["delivered_bytes"] == summary["bytes_received"] == int(sc.flows.bytes.sum())
