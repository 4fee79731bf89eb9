"""Run-directory metrics on synthetic runs whose answers are known in closed form.

`make_run` writes a run directory with `RunWriter` on lab-small (16 NICs, 4
leaves with 4 uplinks each, 2 spines): flows routed by `fabric.routing`,
port series in which one chain of PFC pauses is planted, and collectives of
known size and duration.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from analysis.metrics import (
    busbw_factor,
    ecmp_metrics,
    expected_collisions,
    flow_ports,
    port_names,
    run_metrics,
)
from fabric.addressing import roce_udp_sport
from fabric.model import Role
from fabric.routing import Routing
from fabric.rundir import Run, RunWriter
from fabric.stats import imbalance
from topologies import load_fabric

INTERVAL_NS = 1000
SAMPLES = 10
CONGESTED_BYTES = 900_000

COLLECTIVES = (
    # kind, ranks, bytes, start_ns, end_ns
    ("allreduce", 16, 64 * 2**20, 0, 2_000_000),
    ("allgather", 8, 32 * 2**20, 2_000_000, 3_000_000),
    ("alltoall", 16, 16 * 2**20, 3_000_000, 3_500_000),
    ("broadcast", 4, 8 * 2**20, 3_500_000, 4_000_000),
    ("sendrecv", 2, 2**20, 4_000_000, -1),
)


def _port_between(fabric, a: str, b: str) -> int:
    na, nb = fabric.node_id(a), fabric.node_id(b)
    for p in fabric.ports_of(na):
        if fabric.port_peer[p] == nb:
            return int(p)
    raise AssertionError(f"no port {a} > {b}")


def plan(fabric):
    """The planted pause chain: (congested port, first paused, paused because of it)."""
    congested = _port_between(fabric, "z0-r1-rtsw", "z0-r1-h0-nic0")
    spine_down = _port_between(fabric, "z0-ctsw0", "z0-r1-rtsw")
    leaf_up = _port_between(fabric, "z0-r0-rtsw", "z0-ctsw0")
    return congested, spine_down, leaf_up


def make_run(
    path,
    *,
    n_flows: int = 40,
    seed: int = 0,
    policy: str = "5tuple",
    pause=True,
    engine: str = "sim",
    scale: float = 1.0,
):
    fabric = load_fabric("lab-small")
    rng = np.random.default_rng(seed)
    nics = fabric.nic_ids
    src = rng.choice(nics[:4], n_flows).astype(np.int32)  # rack 0
    dst = rng.choice(nics[4:], n_flows).astype(np.int32)  # other racks
    sqpn = rng.integers(0x100, 1 << 24, n_flows)
    dqpn = rng.integers(0x100, 1 << 24, n_flows)
    for arr in (src, dst, sqpn, dqpn):  # flows 1 and 2 reuse flow 0's QP (later steps)
        arr[1:3] = arr[0]
    sport = roce_udp_sport(sqpn, dqpn)
    paths = Routing(fabric, policy, seed).paths(src, dst, sport, dqpn)
    nbytes = rng.integers(1, 100, n_flows) * 4096
    start = rng.integers(0, 1000, n_flows) * 1000
    end = start + rng.integers(1, 500, n_flows) * 100
    end[-1] = -1  # one unfinished flow
    w = RunWriter(path, engine, {"name": "synthetic", "topology": "lab-small", "seed": seed})
    w.topology(fabric)
    w.flows(
        flow_id=np.arange(n_flows), job=np.zeros(n_flows, np.int32),
        op=np.zeros(n_flows, np.int32), step=np.zeros(n_flows, np.int32),
        channel=np.zeros(n_flows, np.int32), src=src, dst=dst, sqpn=sqpn, dqpn=dqpn,
        sport=sport, bytes=nbytes, start_ns=start, end_ns=end,
        path_ptr=paths.ptr, path_link=(paths.ports // 2).astype(np.int32),
    )  # fmt: skip
    port = np.arange(fabric.n_ports)
    shape = (SAMPLES, fabric.n_ports)
    tx = np.zeros(shape, np.int64)
    tx[:, :] = 100 * 10**9 // 8 * INTERVAL_NS // 10**9 // 4  # 25% everywhere
    qmax = np.zeros(shape, np.int64)
    paused = np.zeros(shape, np.int64)
    pfc = np.zeros(shape, np.int64)
    marked = np.zeros(shape, np.int64)
    congested, spine_down, leaf_up = plan(fabric)
    if pause:
        qmax[1:6, congested] = CONGESTED_BYTES
        qmax[3, congested] = CONGESTED_BYTES + 1000
        marked[1:6, congested] = 3
        tx[:, congested] = 100 * 10**9 // 8 * INTERVAL_NS // 10**9  # 100%
        paused[2:5, spine_down] = 400
        pfc[2:5, spine_down ^ 1] = 1
        paused[3:5, leaf_up] = 300
        pfc[3:5, leaf_up ^ 1] = 1
    w.ports(
        interval_ns=INTERVAL_NS, t_ns=np.arange(SAMPLES) * INTERVAL_NS, port=port, scale=scale,
        tx_bytes=tx, qdepth_max_bytes=qmax, qdepth_mean_bytes=qmax // 2, ecn_marked=marked,
        paused_ns=paused, pfc_sent=pfc, drops=np.zeros(shape, np.int64),
    )  # fmt: skip
    kinds = [c[0] for c in COLLECTIVES]
    w.collectives(
        op=np.arange(len(kinds)), job=np.zeros(len(kinds), np.int32), kind=np.array(kinds),
        algorithm=np.array(["ring"] * len(kinds)), bytes=np.array([c[2] for c in COLLECTIVES]),
        ranks=np.array([c[1] for c in COLLECTIVES]),
        start_ns=np.array([c[3] for c in COLLECTIVES]),
        end_ns=np.array([c[4] for c in COLLECTIVES]),
        algbw_bps=np.zeros(len(kinds)), busbw_bps=np.zeros(len(kinds)),
    )  # fmt: skip
    w.finish("complete")
    return fabric, paths, nbytes


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "run-a"
    fabric, paths, nbytes = make_run(path)
    return path, fabric, paths, nbytes


def test_busbw_factors_follow_nccl_tests():
    assert busbw_factor("AllReduce", 8) == pytest.approx(2 * 7 / 8)
    for kind in ("allgather", "reduce_scatter", "AllToAll"):
        assert busbw_factor(kind, 4) == pytest.approx(3 / 4)
    assert busbw_factor("broadcast", 16) == 1.0
    assert busbw_factor("sendrecv", 2) == 1.0


def test_expected_collisions_closed_form_and_simulation():
    assert expected_collisions(1, 4) == 0.0
    assert expected_collisions(2, 2) == pytest.approx(0.5)  # second ball hits the first: 1/2
    rng = np.random.default_rng(1)
    m, n = 12, 8
    draws = rng.integers(0, n, size=(20000, m))
    observed = np.mean([m - len(np.unique(d)) for d in draws])
    assert expected_collisions(m, n) == pytest.approx(observed, rel=0.02)


def test_ecmp_matches_a_walk_of_the_routed_ports(run_dir):
    path, fabric, paths, nbytes = run_dir
    m = ecmp_metrics(fabric, Run(path).flows())
    # the reference: the ports routing chose, counted flow by flow
    by_port = {}
    flows_port = {}
    for f in range(len(paths)):
        for p in paths.of(f):
            by_port[int(p)] = by_port.get(int(p), 0) + int(nbytes[f])
            flows_port[int(p)] = flows_port.get(int(p), 0) + 1
    rows = {r["switch"]: r for r in m["switches"]}
    leaf = fabric.node_id("z0-r0-rtsw")
    ups = [
        int(p) for p in fabric.ports_of(leaf) if fabric.node_role[fabric.port_peer[p]] == Role.CTSW
    ]
    row = rows["z0-r0-rtsw"]
    assert row["tier"] == "rtsw>ctsw"
    assert row["bytes_per_uplink"] == [by_port.get(p, 0) for p in ups]
    assert row["flows_per_uplink"] == [flows_port.get(p, 0) for p in ups]
    assert sum(row["flows_per_uplink"]) == len(paths)  # every flow leaves rack 0 upwards
    assert row["bytes"] == pytest.approx(imbalance([by_port.get(p, 0) for p in ups]))
    # collisions count distinct QPs: flows 0, 1 and 2 are one QP on one uplink
    flows = Run(path).flows()
    qps = {p: set() for p in ups}
    for f in range(len(paths)):
        key = tuple(int(flows[k][f]) for k in ("src", "dst", "sport", "dqpn"))
        for p in paths.of(f):
            if int(p) in qps:
                qps[int(p)].add(key)
    balls = sum(len(v) for v in qps.values())
    assert balls == len(paths) - 2
    assert row["qps_per_uplink"] == [len(qps[p]) for p in ups]
    assert row["collisions"] == balls - sum(1 for p in ups if qps[p])
    assert row["collisions_expected"] == pytest.approx(expected_collisions(balls, len(ups)))
    tier = {t["tier"]: t for t in m["tiers"]}["rtsw>ctsw"]
    assert tier["switches"] == 1 and tier["uplinks"] == len(ups)
    # only up tiers are ECMP choices
    assert all(t["tier"] == "rtsw>ctsw" for t in m["tiers"])


def test_flow_ports_walks_paths_like_routing(run_dir):
    path, fabric, paths, _ = run_dir
    flows = Run(path).flows()
    got = flow_ports(fabric, flows["src"], flows["path_ptr"], flows["path_link"])
    assert got.tolist() == paths.ports.tolist()


def test_pause_spread_and_hot_spots(run_dir):
    path, fabric, _, _ = run_dir
    m = run_metrics(Run(path))
    names = port_names(fabric)
    congested, spine_down, leaf_up = plan(fabric)
    spread = {r["port"]: r for r in m["pause_spread"]}
    assert set(spread) == {names[spine_down], names[leaf_up]}
    root = spread[names[spine_down]]
    assert root["cause"] == "congestion"
    assert root["because_of"] == names[congested]
    assert root["first_pause_ns"] == 2 * INTERVAL_NS
    assert root["paused_ns"] == 3 * 400
    assert root["pfc_received"] == 3
    assert root["hops_from_root"] == 0
    up = spread[names[leaf_up]]
    assert up["cause"] == "pause" and up["because_of"] == names[spine_down]
    assert up["first_pause_ns"] == 3 * INTERVAL_NS and up["hops_from_root"] == 1
    # ranked: paused longest first, then deepest queue
    assert [h["port"] for h in m["hotspots"][:3]] == [
        names[spine_down],
        names[leaf_up],
        names[congested],
    ]
    hot = m["hotspots"][2]
    assert hot["qdepth_max_bytes"] == CONGESTED_BYTES + 1000
    assert hot["utilization"] == pytest.approx(1.0)
    cong = m["congestion"]
    assert cong["ecn_marked"] == 15
    assert cong["paused_ns"] == 3 * 400 + 2 * 300
    assert cong["pfc_frames"] == 5
    per = {r["port"]: r for r in cong["per_port"]}
    q = per[names[congested]]["qdepth_bytes"]
    # 10 samples: 5 of 0 and 4 of 900000 and one of 901000
    assert q["max"] == CONGESTED_BYTES + 1000
    assert q["p50"] == pytest.approx(CONGESTED_BYTES / 2)
    assert q["mean"] == pytest.approx((5 * CONGESTED_BYTES + 1000) / 10)
    assert per[names[0]]["utilization"] == pytest.approx(0.25)
    # marked fraction: 15 marks over tx_bytes / (4096 + 58) packets
    assert per[names[congested]]["ecn_fraction_est"] == pytest.approx(
        15 / (10 * 12500 / (4096 + 58))
    )


def test_completion_times_and_collectives(run_dir):
    path, _, _, _ = run_dir
    m = run_metrics(Run(path))
    flows = Run(path).flows()
    done = flows["end_ns"] >= 0
    fct = (flows["end_ns"] - flows["start_ns"])[done]
    assert m["flows"]["finished"] == done.sum() == len(done) - 1
    assert m["fct_ns"]["max"] == fct.max()
    assert m["fct_ns"]["p50"] == pytest.approx(np.median(fct))
    ops = m["collectives"]["ops"]
    for o, (kind, ranks, nbytes, start, end) in zip(ops, COLLECTIVES, strict=True):
        if end < 0:
            assert o["busbw_bps"] is None
            continue
        algbw = nbytes * 8 / ((end - start) / 1e9)
        assert o["algbw_bps"] == pytest.approx(algbw)
        assert o["busbw_bps"] == pytest.approx(algbw * busbw_factor(kind, ranks))
    # AllReduce of 64 MiB on 16 ranks in 2 ms: algbw 268.4 Gb/s, busbw x 30/16
    assert ops[0]["busbw_bps"] == pytest.approx(64 * 2**20 * 8 / 2e-3 * 30 / 16)
    assert m["collectives"]["finished"] == 4


def test_analyze_and_compare_cli(run_dir, tmp_path):
    path, fabric, _, _ = run_dir
    other = tmp_path / "run-b"
    make_run(other, seed=3, policy="eecmp", pause=False)
    r = CliRunner().invoke(main, ["analyze", str(path)])
    assert r.exit_code == 0, r.output
    assert "hot spots" in r.output and "rtsw>ctsw" in r.output and "busbw" in r.output
    r = CliRunner().invoke(main, ["analyze", str(path), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["source"] == "run" and data["fabric"] == "lab-small"
    r = CliRunner().invoke(main, ["compare", str(path), str(other), "--json"])
    assert r.exit_code == 0, r.output
    a, b = json.loads(r.output)
    assert a["paused_ns"] == 3 * 400 + 2 * 300 and b["paused_ns"] == 0
    assert a["pfc_frames"] == 5 and b["pfc_frames"] == 0
    r = CliRunner().invoke(main, ["compare", str(path), str(other)])
    assert r.exit_code == 0, r.output
    assert "run-a" in r.output and "run-b" in r.output and "PFC frames" in r.output


def test_cli_errors_are_one_sentence(tmp_path):
    (tmp_path / "notes.txt").write_text("hello, this is not a capture\n")
    (tmp_path / "empty").mkdir()
    for args in (
        ["analyze", str(tmp_path / "notes.txt")],
        ["analyze", str(tmp_path / "missing.pcap")],
        ["analyze", str(tmp_path / "empty")],
        ["compare", str(tmp_path / "empty")],
        ["report", str(tmp_path / "empty"), "-o", str(tmp_path / "r.html")],
        ["pcap", "show", str(tmp_path / "notes.txt")],
    ):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (args, r.output)
        assert "Traceback" not in r.output
    assert not (tmp_path / "r.html").exists()


def test_captures_in_a_run_are_mapped_to_nics(tmp_path):
    import shutil
    from pathlib import Path

    path = tmp_path / "run-c"
    make_run(path, n_flows=8, pause=False)
    golden = Path(__file__).parent / "data" / "golden_roce.pcap"
    shutil.copy(golden, path / "captures" / "leaf0.pcap")
    m = run_metrics(Run(path))
    (cap,) = m["captures"]
    assert cap["packets"] == 25
    top = cap["flows"]["top"][0]
    # 10.zone.rack.slot: 10.0.0.1 is rack 0's first NIC, 10.0.1.1 rack 1's
    assert (top["src"], top["dst"]) == ("z0-r0-h0-nic0", "z0-r1-h0-nic0")
    assert cap["pfc"]["rate_bps"] == 100 * 10**9  # lab-small's links


def test_an_unfinished_run_is_analyzed_with_a_warning(tmp_path):
    fabric = load_fabric("lab-small")
    w = RunWriter(tmp_path / "run-d", "sim", {"name": "interrupted"})
    w.topology(fabric)
    w.finish("partial", "interrupted by the user")
    r = CliRunner().invoke(main, ["analyze", str(tmp_path / "run-d"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["flows"]["count"] == 0
    assert "run-d is partial (interrupted by the user)" in r.stderr
    r = CliRunner().invoke(
        main, ["report", str(tmp_path / "run-d"), "-o", str(tmp_path / "r.html")]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r.html").stat().st_size > 1_000_000  # plotly.js is inlined


def test_an_emulated_runs_figures_are_the_fabrics_and_its_scale_converts(tmp_path, run_dir):
    """The emulator records fabric time and bytes: the same series read the same, any scale."""
    make_run(tmp_path / "emu", engine="mininet", scale=1000.0)
    emu = run_metrics(Run(tmp_path / "emu"))
    sim = run_metrics(Run(run_dir[0]))
    assert emu["emulation_scale"] == 1000.0 and sim["emulation_scale"] == 1.0
    assert [h["utilization"] for h in emu["hotspots"]] == pytest.approx(
        [h["utilization"] for h in sim["hotspots"]]
    )
    assert emu["hotspots"][2]["utilization"] == pytest.approx(1.0)  # the planted full port
    for e, s in zip(emu["collectives"]["ops"], sim["collectives"]["ops"], strict=True):
        if s["busbw_bps"] is not None:
            assert e["busbw_bps"] == pytest.approx(s["busbw_bps"])
            assert e["busbw_emulated_bps"] == pytest.approx(s["busbw_bps"] / 1000)
    out = CliRunner().invoke(main, ["analyze", str(tmp_path / "emu")]).output
    assert "link rates divided by 1,000" in out and "busbw emulated" in out
    assert "divided by" not in CliRunner().invoke(main, ["analyze", str(run_dir[0])]).output
