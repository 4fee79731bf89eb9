"""Run-directory metrics on synthetic runs whose answers are known in closed form.

`make_run` writes a run directory with `RunWriter` on lab-small (16 NICs, 4
leaves with 4 uplinks each, 2 spines): flows routed by `aifabric.fabric.routing`,
port series in which one chain of PFC pauses is planted, and collectives of
known size and duration.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.analysis.ecmp import TRIALS, ecmp_metrics, expected_collisions
from aifabric.analysis.metrics import flow_ports, run_metrics
from aifabric.cli import main
from aifabric.fabric.addressing import roce_udp_sport
from aifabric.fabric.imbalance import imbalance
from aifabric.fabric.model import Role
from aifabric.fabric.portseries import PortSamples
from aifabric.fabric.routing import Routing
from aifabric.fabric.rundir import Run, RunWriter
from aifabric.topologies import load_fabric

INTERVAL_NS = 1000
SAMPLES = 10
CONGESTED_BYTES = 900_000

COLLECTIVES = (
    # kind, ranks, bytes, start_ns, end_ns, the nccl-tests busbw factor
    ("allreduce", 16, 64 * 2**20, 0, 2_000_000, 2 * 15 / 16),
    ("allgather", 8, 32 * 2**20, 2_000_000, 3_000_000, 7 / 8),
    ("alltoall", 16, 16 * 2**20, 3_000_000, 3_500_000, 15 / 16),
    ("broadcast", 4, 8 * 2**20, 3_500_000, 4_000_000, 1.0),
    ("sendrecv", 2, 2**20, 4_000_000, -1, 1.0),
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
        # as an engine writes them: busbw / algbw is the factor (0 where unfinished)
        algbw_bps=np.array([1.0 if c[4] >= 0 else 0.0 for c in COLLECTIVES]),
        busbw_bps=np.array([c[5] if c[4] >= 0 else 0.0 for c in COLLECTIVES]),
        busbw_factor=np.array([c[5] for c in COLLECTIVES]),
    )  # fmt: skip
    w.finish("complete")
    return fabric, paths, nbytes


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "run-a"
    fabric, paths, nbytes = make_run(path)
    return path, fabric, paths, nbytes


def test_expected_collisions_closed_form_and_simulation():
    assert expected_collisions(1, 4) == 0.0
    assert expected_collisions(2, 2) == pytest.approx(0.5)  # second ball hits the first: 1/2
    rng = np.random.default_rng(1)
    m, n = 12, 8
    draws = rng.integers(0, n, size=(20000, m))
    observed = np.mean([m - len(np.unique(d)) for d in draws])
    assert expected_collisions(m, n) == pytest.approx(observed, rel=0.02)


def _qp_ports(fabric, paths, flows):
    """The distinct QPs (src, dst, sport, dQPN) on each port, counted flow by flow."""
    qps: dict[int, set] = {}
    by_port: dict[int, int] = {}
    for f in range(len(paths)):
        key = tuple(int(flows[k][f]) for k in ("src", "dst", "sport", "dqpn"))
        for p in paths.of(f):
            qps.setdefault(int(p), set()).add(key)
            by_port[int(p)] = by_port.get(int(p), 0) + int(flows["bytes"][f])
    return qps, by_port


def test_ecmp_counts_the_qps_that_had_a_choice_over_the_links_they_could_take(run_dir):
    path, fabric, paths, _ = run_dir
    flows = Run(path).flows()
    routing = Routing(fabric)
    m = ecmp_metrics(fabric, flows, routing, paths.ports.astype(np.int64)).to_dict()
    qps, by_port = _qp_ports(fabric, paths, flows)
    leaf = fabric.node_id("z0-r0-rtsw")
    ups = [
        int(p) for p in fabric.ports_of(leaf) if fabric.node_role[fabric.port_peer[p]] == Role.CTSW
    ]
    rows = {(r["switch"], r["tier"]): r for r in m["switches"]}
    row = rows["z0-r0-rtsw", "rtsw>ctsw"]
    # every flow leaves rack 0 upward with a choice of its rack switch's 4 uplinks
    assert row["ports"] == [fabric.port_name(p) for p in ups]
    assert row["bytes_per_link"] == [by_port.get(p, 0) for p in ups]
    # collisions count distinct QPs: flows 0, 1 and 2 are one QP on one uplink
    balls = sum(len(qps.get(p, ())) for p in ups)
    assert balls == row["qps"] == len(paths) - 2
    assert row["qps_per_link"] == [len(qps.get(p, ())) for p in ups]
    assert row["collisions"] == balls - sum(1 for p in ups if qps.get(p))
    assert row["collisions_expected"] == pytest.approx(expected_collisions(balls, len(ups)))
    assert row["bytes"] == pytest.approx(imbalance([by_port.get(p, 0) for p in ups]))
    # lab-small has two parallel links from each spine to each leaf: going down is a choice
    # too, between the two links to the destination's leaf
    down = [r for r in m["switches"] if r["tier"] == "ctsw>rtsw"]
    assert down and all(r["switch"].startswith("z0-ctsw") for r in down)
    for r in down:
        spine = fabric.node_id(r["switch"])
        sets = {
            tuple(sorted(int(p) for p in routing.next_hops(spine, int(d))))
            for f, d in enumerate(flows["dst"])
            if any(fabric.port_node[p] == spine for p in paths.of(f))
        }
        assert sorted(r["ports"]) == sorted(fabric.port_name(p) for s in sets for p in s)
        assert all(len(s) == 2 for s in sets)
    tiers = {t["tier"]: t for t in m["tiers"]}
    assert list(tiers) == ["rtsw>ctsw", "ctsw>rtsw"]  # up first
    assert tiers["rtsw>ctsw"]["links"] == 4 and tiers["rtsw>ctsw"]["links_in_tier"] == 16


def test_ecmp_expectations_are_those_of_uniform_hashing(run_dir):
    """The expected max/mean beside each figure: the same QPs (and bytes) thrown uniformly
    on the same next hops, against an independent simulation of the same."""
    path, fabric, paths, _ = run_dir
    flows = Run(path).flows()
    m = ecmp_metrics(fabric, flows, Routing(fabric), paths.ports.astype(np.int64)).to_dict()
    row = next(r for r in m["switches"] if r["switch"] == "z0-r0-rtsw")
    qps, _ = _qp_ports(fabric, paths, flows)
    weights = {}
    for f in range(len(paths)):
        key = tuple(int(flows[k][f]) for k in ("src", "dst", "sport", "dqpn"))
        weights[key] = weights.get(key, 0) + int(flows["bytes"][f])
    w = np.array(list(weights.values()), dtype=float)
    rng = np.random.default_rng(7)
    draws = rng.integers(0, 4, size=(20_000, len(w)))
    loads = np.stack([np.bincount(d, weights=w, minlength=4) for d in draws])
    want = np.mean(loads.max(axis=1) / loads.mean(axis=1))
    # TRIALS draws: the mean of a max/mean is within a few percent of the long-run value
    assert row["bytes_expected"]["max_mean"] == pytest.approx(want, rel=4 / np.sqrt(TRIALS))
    counts = np.stack([np.bincount(d, minlength=4) for d in draws[:, : row["qps"]]])
    want = np.mean(counts.max(axis=1) / counts.mean(axis=1))
    assert row["qps_expected"]["max_mean"] == pytest.approx(want, rel=4 / np.sqrt(TRIALS))


def test_flow_ports_walks_paths_like_routing(run_dir):
    path, fabric, paths, _ = run_dir
    flows = Run(path).flows()
    got = flow_ports(fabric, flows["src"], flows["path_ptr"], flows["path_link"])
    assert got.tolist() == paths.ports.tolist()


def test_pause_spread_and_hot_spots(run_dir):
    path, fabric, _, _ = run_dir
    m = run_metrics(Run(path)).to_dict()
    names = fabric.port_names
    congested, spine_down, leaf_up = plan(fabric)
    spread = {r["port"]: r for r in m["pause_spread"]}
    assert set(spread) == {names[spine_down], names[leaf_up]}
    root = spread[names[spine_down]]
    assert root["cause"] == "congestion"
    assert root["because_of"] == root["root"] == names[congested]
    assert root["first_pause_ns"] == 2 * INTERVAL_NS
    assert root["paused_ns"] == 3 * 400
    assert root["pfc_received"] == 3
    assert root["hops_from_root"] == 0
    up = spread[names[leaf_up]]
    assert up["cause"] == "pause" and up["because_of"] == names[spine_down]
    assert up["root"] == names[congested]  # the victim of a victim: same root cause
    assert up["first_pause_ns"] == 3 * INTERVAL_NS and up["hops_from_root"] == 1
    # the congested port is the one hot spot: it caused every pause; the paused ports are
    # its victims, not hot spots
    assert [h["port"] for h in m["hotspots"]] == [names[congested]]
    hot = m["hotspots"][0]
    assert hot["pause_caused_ns"] == 3 * 400 + 2 * 300
    assert hot["qdepth_max_bytes"] == CONGESTED_BYTES + 1000
    # lab-small's links are 100G: 901,000 bytes wait 72.08 us
    assert hot["queue_delay_max_ns"] == pytest.approx((CONGESTED_BYTES + 1000) * 8 / 100)
    assert hot["cost_ns"] == pytest.approx(hot["pause_caused_ns"] + hot["queue_delay_max_ns"])
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
    m = run_metrics(Run(path)).to_dict()
    flows = Run(path).flows()
    done = flows["end_ns"] >= 0
    fct = (flows["end_ns"] - flows["start_ns"])[done]
    assert m["flows"]["finished"] == done.sum() == len(done) - 1
    assert m["fct_ns"]["max"] == fct.max()
    assert m["fct_ns"]["p50"] == pytest.approx(np.median(fct))
    ops = m["collectives"]["ops"]
    for o, (_, _, nbytes, start, end, factor) in zip(ops, COLLECTIVES, strict=True):
        assert o["busbw_factor"] == pytest.approx(factor)
        if end < 0:
            assert o["busbw_bps"] is None
            continue
        algbw = nbytes * 8 / ((end - start) / 1e9)
        assert o["algbw_bps"] == pytest.approx(algbw)
        assert o["busbw_bps"] == pytest.approx(algbw * factor)
    # AllReduce of 64 MiB on 16 ranks in 2 ms: algbw 268.4 Gb/s, busbw x 30/16
    assert ops[0]["busbw_bps"] == pytest.approx(64 * 2**20 * 8 / 2e-3 * 30 / 16)
    assert m["collectives"]["finished"] == 4
    # every flow is op 0's: its ideal is the busiest NIC's bytes at lab-small's 100G
    sent, recv = {}, {}
    for f in range(len(flows["src"])):
        sent[int(flows["src"][f])] = sent.get(int(flows["src"][f]), 0) + int(flows["bytes"][f])
        recv[int(flows["dst"][f])] = recv.get(int(flows["dst"][f]), 0) + int(flows["bytes"][f])
    busiest = max(max(sent.values()), max(recv.values()))
    assert ops[0]["ideal_ns"] == int(np.ceil(busiest * 8 / 100))
    assert ops[0]["efficiency"] == pytest.approx(ops[0]["ideal_ns"] / 2_000_000)
    assert all(o["ideal_ns"] is None for o in ops[1:])  # no flows of theirs were recorded
    (job,) = m["jobs"]
    assert job["name"] == "job 0" and job["ops"] == 5 and job["ops_finished"] == 4
    assert job["time_ns"] is None  # one op never finished
    assert job["busbw_bps"]["count"] == 4


def test_the_recorded_busbw_factor_is_the_one_used(tmp_path):
    """The analyzer computes busbw from start and end with the factor the run recorded (the
    flow table's), not a table of its own."""
    make_run(tmp_path / "run")
    col = dict(np.load(tmp_path / "run" / "collectives.npz"))
    col["busbw_factor"] = np.full(len(col["op"]), 3.0)
    np.savez(tmp_path / "run" / "collectives.npz", **col)
    ops = run_metrics(Run(tmp_path / "run")).to_dict()["collectives"]["ops"]
    assert [o["busbw_factor"] for o in ops] == [3.0] * 5
    assert ops[0]["busbw_bps"] == pytest.approx(64 * 2**20 * 8 / 2e-3 * 3.0)


def test_the_analyzer_reads_every_factor_from_the_run_directory(tmp_path):
    """An op that did not finish shows the factor the run recorded for it; a run written
    before the factors were recorded shows none there (no table outside the run), and
    busbw / algbw as recorded for the ops that finished."""
    make_run(tmp_path / "run")
    path = tmp_path / "run" / "collectives.npz"
    col = dict(np.load(path))
    recorded = col.pop("busbw_factor")
    col["busbw_bps"] = col["algbw_bps"] * 2.5
    np.savez(path, **col)
    ops = run_metrics(Run(tmp_path / "run")).to_dict()["collectives"]["ops"]
    assert [o["busbw_factor"] for o in ops if o["time_ns"] is not None] == [2.5] * 4
    unfinished = [i for i, o in enumerate(ops) if o["time_ns"] is None]
    assert unfinished and all(ops[i]["busbw_factor"] is None for i in unfinished)
    col["busbw_factor"] = recorded + 0.5
    np.savez(path, **col)
    ops = run_metrics(Run(tmp_path / "run")).to_dict()["collectives"]["ops"]
    assert [o["busbw_factor"] for o in ops] == col["busbw_factor"].tolist()
    assert all(ops[i]["busbw_bps"] is None for i in unfinished)
    done = ops[0]
    assert done["busbw_bps"] == done["algbw_bps"] * (2 * 15 / 16 + 0.5)


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
    m = run_metrics(Run(path)).to_dict()
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
    emu = run_metrics(Run(tmp_path / "emu")).to_dict()
    sim = run_metrics(Run(run_dir[0])).to_dict()
    assert emu["emulation_scale"] == 1000.0 and sim["emulation_scale"] == 1.0
    assert [h["utilization"] for h in emu["hotspots"]] == pytest.approx(
        [h["utilization"] for h in sim["hotspots"]]
    )
    assert emu["hotspots"][0]["utilization"] == pytest.approx(1.0)  # the planted full port
    for e, s in zip(emu["collectives"]["ops"], sim["collectives"]["ops"], strict=True):
        if s["busbw_bps"] is not None:
            assert e["busbw_bps"] == pytest.approx(s["busbw_bps"])
            assert e["busbw_emulated_bps"] == pytest.approx(s["busbw_bps"] / 1000)
    out = CliRunner().invoke(main, ["analyze", str(tmp_path / "emu")]).output
    assert "link rates divided by 1,000" in out and "busbw emulated" in out
    assert "divided by" not in CliRunner().invoke(main, ["analyze", str(run_dir[0])]).output


def test_pause_chains_within_one_interval_follow_their_cause_whatever_the_order(get_fabric):
    """Two ports first paused in the same sample: the one listed first (lower port id) was
    paused because of the other; the chain still reaches the congested root."""
    from aifabric.analysis.metrics import pause_spread

    fabric = get_fabric("lab-small")
    names = fabric.port_names
    # p: a node towards Y; q: Y towards Z, with q's id above p's; Z's port r is congested
    p, q = next(
        (p, q)
        for p in range(fabric.n_ports)
        for q in fabric.ports_of(int(fabric.port_peer[p])).tolist()
        if q > p
        and q != p ^ 1
        and fabric.port_peer[q] != fabric.port_node[p]
        and fabric.degree(int(fabric.port_peer[q])) > 1
    )
    z = int(fabric.port_peer[q])
    r = next(x for x in fabric.ports_of(z).tolist() if x != q ^ 1)
    port = np.arange(fabric.n_ports)
    t = np.array([0, 1000, 2000])
    paused = np.zeros((3, fabric.n_ports), dtype=np.int64)
    paused[1:, [p, q]] = 400
    qdepth = np.zeros((3, fabric.n_ports), dtype=np.int64)
    qdepth[1, r] = 10**6
    ports = PortSamples.from_arrays({
        "interval_ns": 1000, "port": port, "t_ns": t, "paused_ns": paused,
        "qdepth_max_bytes": qdepth, "pfc_sent": np.zeros((3, fabric.n_ports), dtype=np.int64),
    })  # fmt: skip
    spread = {x.port: x.to_dict() for x in pause_spread(fabric, ports)}
    assert spread[names[p]]["cause"] == "pause" and spread[names[p]]["because_of"] == names[q]
    assert spread[names[q]]["cause"] == "congestion" and spread[names[q]]["root"] == names[r]
    assert spread[names[q]]["hops_from_root"] == 0
    assert spread[names[p]]["hops_from_root"] == 1 and spread[names[p]]["root"] == names[r]


def test_ecmp_choices_after_a_fault_are_those_of_the_routing_that_chose_the_route(tmp_path):
    """On `link-failure` the simulator records which routing chose each flow's route; a flow
    it re-routed when the uplink failed no longer had that link among its choices where the
    routing at the start had offered it."""
    from aifabric.analysis.ecmp import QP_KEY, _choices
    from aifabric.analysis.metrics import _routings, group_rows
    from aifabric.engines import run_scenario
    from aifabric.fabric.export import fabric_from_topology
    from aifabric.scenarios import load_scenario

    run_scenario("sim", load_scenario("link-failure"), tmp_path / "run")
    run = Run(tmp_path / "run")
    flows = run.flows()
    fabric = fabric_from_topology(run.topology())
    failed = fabric.port_id("z0-r0-rtsw--z0-ctsw0")
    ptr, links = flows["path_ptr"], flows["path_link"]
    epoch = flows["route_epoch"]
    assert set(np.unique(epoch)) == {0, 1}
    for f in np.flatnonzero(epoch == 1):
        assert failed // 2 not in links[ptr[f] : ptr[f + 1]]
    routings, ep = _routings(run, fabric, flows)
    assert len(routings) == 2 and (ep == epoch).all()
    ports = flow_ports(fabric, flows["src"], ptr, links)
    keys = np.stack([flows[k].astype(np.int64).view(np.uint64) for k in QP_KEY], axis=1)
    qp_of, _, _, _ = group_rows(keys, np.zeros(len(epoch), dtype=np.int64))

    def candidates(routing_list, epochs):
        qp, chosen, cand_ptr, flat, _, _ = _choices(fabric, routing_list, epochs, flows, ports)
        rows = enumerate(zip(qp.tolist(), chosen.tolist(), strict=True))
        return {(q, p): flat[cand_ptr[i] : cand_ptr[i + 1]] for i, (q, p) in rows}

    now = candidates(routings, ep)
    intact = candidates(routings[:1], np.zeros_like(ep))
    ends = {int(fabric.port_node[p]): p for p in (failed, failed ^ 1)}
    moved = 0
    for f in np.flatnonzero(epoch == 1):
        for p in ports[ptr[f] : ptr[f + 1]]:
            end = ends.get(int(fabric.port_node[p]))
            key = (int(qp_of[f]), int(p))
            if end is None or key not in intact or end not in intact[key]:
                continue
            left = [c for c in intact[key] if c != end]  # the failed link's port is gone
            assert list(now[key]) == left if len(left) > 1 else key not in now
            moved += 1
    assert moved > 0
