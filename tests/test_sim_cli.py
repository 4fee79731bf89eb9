"""`aifabric run`, scenarios, faults, clear-to-send and interrupted runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.engines import Stop, run_scenario
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.rundir import COLLECTIVE_FIELDS, FLOW_FIELDS, PORT_SERIES, Run
from aifabric.fabric.scenario import Fault
from aifabric.fabric.units import format_rate
from aifabric.scenarios import load_scenario, scenario_presets
from aifabric.sim import layout as L
from tests.conftest import fabric as preset
from tests.simhelp import flows, run

SMALL = """
[scenario]
topology = "lab-small"
seed = 2
sample_interval = "5us"

[workload]
collective = "allreduce"
algorithm = "ring"
size = "2MiB"

[ecmp]
policy = "eecmp"

[queue]
ecn_kmin = "50KiB"

[congestion_control]
kind = "dcqcn"
rate_timer = "20us"

[[faults]]
link = "z0-r0-rtsw--z0-ctsw0"
at = "30us"
"""


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


def test_run_writes_the_run_directory(small, tmp_path):
    out = tmp_path / "run"
    result = invoke("run", small, "-o", out, "--capture", "z0-r0-h0-nic0", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    r = Run(out)
    assert r.status == "complete" and r.engine == "sim"
    assert r.meta["scenario"]["congestion_control"]["kind"] == "dcqcn"
    assert r.meta["scenario"]["queues"]["rtsw"]["ecn"]["kmin_bytes"] == 50 * 1024
    fl = r.flows()
    assert set(FLOW_FIELDS) <= set(fl)
    assert (fl["end_ns"] > fl["start_ns"]).all()
    (fault,) = summary["faults"]
    assert fault == {"kind": "link", "target": "z0-r0-rtsw--z0-ctsw0", "action": "down",
                     "at_ns": 30_000, "applied_ns": 30_000, "settled_ns": 30_000}  # fmt: skip
    used = fl["path_link"]
    assert len(used) == fl["path_ptr"][-1]
    ports = r.ports()
    assert set(PORT_SERIES) <= set(ports)
    assert ports["tx_bytes"].shape == (len(ports["t_ns"]), len(ports["port"]))
    # every data byte crossed the first link of its flow: the port series add up
    sent = ports["tx_bytes"].sum()
    assert sent >= fl["bytes"].sum()
    coll = r.collectives()
    assert set(COLLECTIVE_FIELDS) <= set(coll)
    assert coll["busbw_bps"][0] == pytest.approx(
        coll["algbw_bps"][0] * 2 * (coll["ranks"][0] - 1) / coll["ranks"][0]
    )
    assert summary["flows_done"] == len(fl["flow_id"])
    assert [p.name for p in r.captures()] == ["z0-r0-h0-nic0--z0-r0-rtsw.pcap"]


def test_the_summary_gives_a_patterns_bytes_in_all_and_a_collectives_per_rank(tmp_path):
    # a permutation's op bytes are all its flows' (1,024 x 2 MB printed '2000000KiB x 1024 ranks')
    perm = invoke("run", "ecmp-permutation", "--set", "scenario.topology=lab-small",
                  "--set", "workload.size=2MB", "-o", tmp_path / "p")  # fmt: skip
    assert perm.exit_code == 0, perm.output
    (op,) = Run(tmp_path / "p").meta["results"]["summary"]["collectives"]
    assert op["kind"] == "permutation" and op["bytes"] == 2_000_000 * op["ranks"]
    line = next(x for x in perm.output.splitlines() if x.startswith("permutation"))
    assert f" {op['bytes'] // 10**6}MB in all, {op['ranks']} ranks " in line, line
    # a pattern's rate is its goodput, as `analyze` gives it: a collective's busbw means nothing
    assert "busbw" not in line and line.endswith(f"goodput {format_rate(int(op['algbw_bps']))}bps")
    ring = invoke("run", "demo", "-o", tmp_path / "d")
    assert ring.exit_code == 0, ring.output
    line = next(x for x in ring.output.splitlines() if x.startswith("allreduce ring"))
    assert " 32MiB x 112 ranks " in line and " busbw " in line, line


def test_run_prints_a_summary_and_the_same_seed_reproduces(small, tmp_path):
    a = invoke("run", small, "-o", tmp_path / "a", "--seed", "9")
    b = invoke("run", small, "-o", tmp_path / "b", "--seed", "9")
    assert a.exit_code == 0, a.output
    assert b.exit_code == 0, b.output
    assert "completion time" in a.output and "run directory" in a.output
    fa, fb = Run(tmp_path / "a").flows(), Run(tmp_path / "b").flows()
    for key in fa:
        assert np.array_equal(fa[key], fb[key])


def test_run_reports_the_simulator_speed(small, tmp_path):
    result = invoke("run", small, "-o", tmp_path / "r")
    assert result.exit_code == 0, result.output
    results = Run(tmp_path / "r").meta["results"]
    s, counters = results["summary"], results["counters"]
    assert s["events"] == counters["events"] > 0
    assert s["packet_hops"] == counters["packet_hops"] > 0
    assert 0 < s["simulator_wall_s"] <= Run(tmp_path / "r").meta["wall_time_s"]
    # the rates are the counters over the simulator's wall time, to its rounding (1 ms)
    wall = s["simulator_wall_s"]
    for rate, count in (("events_per_s", "events"), ("packet_hops_per_s", "packet_hops")):
        assert s[count] / (wall + 0.0005) <= s[rate] <= s[count] / max(wall - 0.0005, 1e-9)
    line = next(x for x in result.output.splitlines() if x.startswith("simulator speed"))
    scale = {"M": 1e6, "k": 1e3, "": 1}
    for rate, unit in (("events_per_s", "events/s"), ("packet_hops_per_s", "packet-hops/s")):
        number, prefix = re.search(rf"([\d.]+) ?([Mk]?) {unit}", line).groups()
        assert float(number) * scale[prefix] == pytest.approx(s[rate], rel=0.01)
    assert f"{s['events']:,} events in" in line


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "no-such-scenario"], "unknown scenario"),
        (["run", "demo", "--capture", "nowhere:1"], "has no port 'nowhere:1'"),
        (["run", "demo", "--capture", "z0-r0-rtsw--nowhere"], "no node named 'nowhere'"),
    ],
)
def test_run_errors_are_one_sentence(args, message, tmp_path):
    result = invoke(*args, "-o", tmp_path / "x")
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_bad_scenario_keys_fail_with_the_key_named(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(SMALL.replace('rate_timer = "20us"', 'rate_timr = "20us"'))
    result = invoke("run", path, "-o", tmp_path / "x")
    assert result.exit_code == 1
    assert "rate_timr" in result.output


def test_mininet_engine_missing_is_one_sentence(small, tmp_path, monkeypatch):
    from aifabric import engines

    (tmp_path / "emu_without_its_dependency.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(engines.ENGINES, "mininet", "emu_without_its_dependency")
    result = invoke("run", small, "--engine", "mininet", "-o", tmp_path / "x")
    assert result.exit_code == 1, result.output
    assert "mininet engine is not available" in result.output
    assert "needs the Python module a_dependency_not_installed" in result.output


def test_every_preset_loads():
    names = scenario_presets()
    assert "demo" in names
    for name in names:
        sc = load_scenario(name)
        assert len(sc.flows) > 0


def test_interrupted_run_is_partial_with_everything_so_far(small, tmp_path):
    sc = load_scenario(small)
    stop = Stop()
    calls = []

    def interrupt(progress, final=False):
        calls.append(progress)
        stop.set()

    summary = run_scenario("sim", sc, tmp_path / "p", progress=interrupt, stop=stop)
    r = Run(tmp_path / "p")
    assert summary["status"] == "partial" and r.status == "partial"
    fl = r.flows()
    assert (fl["end_ns"] == -1).any()
    assert r.ports()["t_ns"].size > 0


def test_link_down_reroutes_flows_and_they_complete():
    fab = preset("lab-small")
    nics = fab.nic_ids
    table = flows(nics[0:4], nics[8:12], 300 * 4096)
    base = run(fab, table)
    used = base.path_port[base.path_ptr[0] : base.path_ptr[1]] // 2
    link = int(used[1])  # the first flow's uplink
    sim = run(fab, table, faults=[Fault("link", link, at_ns=20_000)])
    c = sim.counters()
    assert c["flows_done"] == 4
    rec = sim.flow_records()
    for f in range(4):
        links = rec["path_link"][rec["path_ptr"][f] : rec["path_ptr"][f + 1]]
        assert link not in links
    assert (sim.pt[[2 * link, 2 * link + 1], L.PT_ALIVE] == 0).all()


@pytest.mark.parametrize("policy", ["linux", "ovs"])
def test_a_link_down_moves_the_flows_the_emulators_switches_move(policy):
    """Under `linux` (hash-threshold) a failure also moves flows that never crossed the
    failed link; the simulator re-routes exactly the flows whose route the switches change."""
    from aifabric.fabric.faults import routing_after, routing_at_start

    fab = preset("lab-medium")
    nics = fab.nic_ids
    src = np.repeat(nics[:16], 4)
    dst = np.repeat(nics[64:80], 4)
    table = flows(src, dst, 200 * 4096, sport=0xC000 + 7 * np.arange(len(src)))
    link = fab.port_id("z0-r0-rtsw--z0-ctsw0") // 2
    fault = Fault("link", link, at_ns=5_000)
    before = routing_at_start(fab, [], policy, 5)
    after = routing_after(fault, before)
    old = before.paths(table.src, table.dst, table.sport)
    new = after.paths(table.src, table.dst, table.sport)
    sim = run(fab, table, ecmp=policy, seed=5, faults=[fault])
    rec = sim.flow_records()
    assert (rec["start_ns"] < 5_000).all() and (rec["end_ns"] > 5_000).all()
    for f in range(len(src)):
        got = rec["path_link"][rec["path_ptr"][f] : rec["path_ptr"][f + 1]].tolist()
        assert got == new.links(f).tolist(), f
    moved = [f for f in range(len(src)) if old.links(f).tolist() != new.links(f).tolist()]
    crossed = [f for f in range(len(src)) if link in old.links(f).tolist()]
    assert crossed and set(crossed) <= set(moved)
    if policy == "linux":
        assert len(moved) > len(crossed)


def test_drained_switch_carries_no_new_flows():
    fab = preset("lab-small")
    nics = fab.nic_ids
    spine = fab.node_id("z0-ctsw0")
    first = flows(nics[0:4], nics[8:12], 100 * 4096, start_ns=[0, 0, 50_000, 50_000])
    sim = run(fab, first, faults=[Fault("node", spine, at_ns=10_000, action="drain")])
    rec = sim.flow_records()
    spine_links = set(np.flatnonzero((fab.link_a == spine) | (fab.link_b == spine)).tolist())
    for f in (2, 3):
        links = rec["path_link"][rec["path_ptr"][f] : rec["path_ptr"][f + 1]]
        assert not spine_links & set(links.tolist())
    assert sim.counters()["drops"] == 0


def test_clear_to_send_bounds_what_is_in_flight_to_a_receiver():
    fab = preset("lab-medium")
    nics = fab.nic_ids
    senders = [int(n) for n in nics[1:9]]
    chunk, window = 64 * 1024, 2
    table = flows(senders, [int(nics[0])] * 8, 2 * 2**20)
    params = {"cts_chunk": chunk, "cts_window": window}
    sim = run(fab, table, cc="cts", cc_params=params, sample_interval_ns=2_000)
    none = run(fab, table, cc="none", sample_interval_ns=2_000)
    bottleneck = int(fab.nic_port[nics[0]]) ^ 1
    q_cts = sim.port_samples()["qdepth_max_bytes"][:, bottleneck].max()
    q_none = none.port_samples()["qdepth_max_bytes"][:, bottleneck].max()
    overhead = (4096 + L.DATA_OVERHEAD_BYTES) / 4096
    assert q_cts <= len(senders) * window * chunk * overhead
    assert q_none > q_cts
    assert sim.counters()["pfc_frames"] == 0 and sim.counters()["flows_done"] == 8


def test_simulation_rejects_bad_input():
    fab = preset("lab-small")
    nics = fab.nic_ids
    with pytest.raises(AifabricError, match="itself"):
        run(fab, flows([nics[0]], [nics[0]], 10))
    with pytest.raises(AifabricError, match="congestion control"):
        run(fab, flows([nics[0]], [nics[1]], 10), cc="bbr")
    with pytest.raises(AifabricError, match="NIC"):
        run(fab, flows([fab.node_id("z0-ctsw0")], [nics[1]], 10))


def test_a_route_longer_than_a_packet_carries_is_one_sentence(monkeypatch):
    fab = preset("lab-small")
    nics = fab.nic_ids
    table = flows([nics[0]], [nics[-1]], 10)
    assert run(fab, table).counters()["flows_done"] == 1
    monkeypatch.setattr(L, "MAX_HOPS", 3)
    with pytest.raises(AifabricError, match="crosses 4 links; the simulator carries .* at most 3"):
        run(fab, table)


def test_clear_to_send_takes_chunk_and_window_from_the_workload_where_set():
    fab = preset("lab-small")
    nics = fab.nic_ids
    ops = {"op_id": [0, 1], "op_job": [0, 0], "op_kind": ["sendrecv"] * 2,
           "op_algorithm": ["p2p"] * 2, "op_bytes": [1, 1], "op_ranks": [2, 2],
           "op_busbw_factor": [1.0, 1.0], "op_chunk_bytes": [32 * 1024, 0],
           "op_window": [3, 0]}  # fmt: skip
    table = flows(nics[0:2], nics[2:4], 200_000, ops=ops, op=[0, 1])
    sim = run(fab, table, cc="cts", cc_params={"cts_chunk": "128KiB", "cts_window": 2})
    assert sim.fl[:, L.FL_CHUNK_BYTES].tolist() == [32 * 1024, 128 * 1024]
    assert sim.fl[:, L.FL_WINDOW].tolist() == [3, 2]
    assert sim.counters()["flows_done"] == 2


def test_a_fault_after_the_run_ended_is_said(small, tmp_path):
    path = tmp_path / "late.toml"
    path.write_text(small.read_text().replace('at = "30us"', 'at = "10s"'))
    result = invoke("run", path, "-o", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert "fault not reached z0-r0-rtsw--z0-ctsw0 down at 10s: the run ended before it" in (
        result.output
    )
    assert Run(tmp_path / "r").meta["results"]["faults_not_reached"][0]["at_ns"] == 10**10


def test_a_matrix_ops_bytes_are_in_all_in_the_summary_and_the_ops_table(tmp_path):
    # a matrix op's bytes are all its flows' (the summary printed '128KiB x 3 ranks'), and
    # `analyze` said neither which its bytes column held
    (tmp_path / "m.csv").write_text("src,dst,bytes\n0,9,64KiB\n3,9,64KiB\n")
    (tmp_path / "s.toml").write_text(
        '[scenario]\ntopology = "lab-small"\nseed = 1\n\n[[workload.jobs]]\nmatrix = "./m.csv"\n\n'
        '[[workload.jobs]]\ncollective = "allreduce"\ngpus = 8\nsize = "1MiB"\niterations = 2\n'
    )
    r = invoke("run", tmp_path / "s.toml", "-o", tmp_path / "r")
    assert r.exit_code == 0, r.output
    ops = {op["kind"]: op for op in Run(tmp_path / "r").meta["results"]["summary"]["collectives"]}
    assert ops["matrix"]["bytes"] == 2 * 64 * 2**10 and ops["matrix"]["ranks"] == 3
    line = next(x for x in r.output.splitlines() if x.startswith("matrix"))
    assert " 128KiB in all, 3 ranks " in line, line
    line = next(x for x in r.output.splitlines() if x.startswith("allreduce"))
    assert " 1MiB x 8 ranks " in line, line
    a = invoke("analyze", tmp_path / "r")
    assert a.exit_code == 0, a.output
    ops = a.output.split("collectives, per op")[1].split("\n\n")[0].splitlines()
    assert "a pattern's or matrix's all its flows'" in ops[0], ops[0]
    kinds = {x.split()[3]: x for x in ops[3:]}  # op, job (two words), kind
    assert "131,072 in all" in kinds["matrix"] and "1,048,576 per rank" in kinds["allreduce"], ops


def test_the_kinds_sized_in_all_are_the_patterns_and_a_matrix():
    from aifabric.fabric.rundir import SIZE_IN_ALL
    from aifabric.traffic.spec import PATTERNS

    assert sorted(SIZE_IN_ALL) == sorted([*PATTERNS, "matrix"])
