"""RoCEv2 UDP source ports as NICs derive them ([nic] sport), QPNs as NICs allocate them, and
the uniform-hashing reference of the ECMP figures over the ports the QPs really have."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric import topologies, traffic
from aifabric.analysis.ecmp import ecmp_metrics, expected_collisions
from aifabric.cli import main
from aifabric.fabric.addressing import (
    allocate_qpns,
    linux_udp_sport,
    roce_udp_sport,
    udp_sports,
)
from aifabric.fabric.routing import Routing
from aifabric.fabric.spread import QpFlows, ecmp_spread, expand_qps, random_spread
from aifabric.scenarios import load_scenario, scenario_from_dict


def kernel_port(lqpn: int, rqpn: int) -> int:
    """include/rdma/ib_verbs.h, written again from its comments: the product of the two
    24-bit QPNs, folded to a 20-bit flow label (x ^ x>>20 ^ x>>40 of a 48-bit product), whose
    top 6 bits fold into its low 14, over 0xC000."""
    product = lqpn * rqpn
    label = (product ^ (product >> 20) ^ (product >> 40)) % (1 << 20)
    return 0xC000 + ((label % (1 << 14)) ^ (label // (1 << 14)))


@pytest.fixture(scope="module")
def medium():
    return topologies.load_fabric("lab-medium")


def flows(fabric, sport="linux", qps=8, gpus=128, seed=0):
    w = traffic.workload_from_dict(
        {"collective": "alltoall", "size": "8MiB", "gpus": gpus, "qps": qps}, "all-pairs"
    )
    return traffic.generate(fabric, w, seed, sport=sport)


def per_connection(t, column):
    """Per connection (src, dst): the distinct values of `column` and its QP count."""
    sqpns, values = {}, {}
    for s, d, q, v in zip(t.src, t.dst, t.sqpn, getattr(t, column), strict=True):
        sqpns.setdefault((int(s), int(d)), set()).add(int(q))
        values.setdefault((int(s), int(d)), set()).add(int(v))
    return {k: (len(values[k]), len(sqpns[k])) for k in sqpns}


def test_the_linux_rule_is_the_rdma_cores():
    pairs = [(1, 1), (0x12345, 0x678), (0xFFFFFF, 0xFFFFFF), (0x100, 0x101), (17, 18)]
    assert [kernel_port(a, b) for a, b in pairs] == [0xC001, 0xE61D, 0xFF21, 0xC104, 0xC132]
    for a, b in pairs:
        assert int(linux_udp_sport(a, b)) == kernel_port(a, b)
        assert int(linux_udp_sport(b, a)) == kernel_port(a, b)  # both ends agree
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 1 << 24, size=(2, 500))
    got = udp_sports(a, b, "linux")
    assert got.tolist() == [kernel_port(int(x), int(y)) for x, y in zip(a, b, strict=True)]


def test_linux_gives_every_qp_of_a_connection_its_own_port(medium):
    t = flows(medium, "linux")
    conns = per_connection(t, "sport")
    assert len(conns) == 128 * 127 and {q for _, q in conns.values()} == {8}
    distinct = np.mean([ports == 8 for ports, _ in conns.values()])
    assert distinct >= 0.99, distinct
    xor = per_connection(flows(medium, "xor"), "sport")
    assert np.mean([ports for ports, _ in xor.values()]) < 6  # the old rule collapses ports


def test_qpns_count_up_per_nic_in_creation_order(medium):
    t = flows(medium, "linux", qps=4, gpus=16)
    # a connection's QPs are created one after the other: consecutive at both ends
    for column in ("sqpn", "dqpn"):
        by_conn = {}
        for s, d, q in zip(t.src, t.dst, getattr(t, column), strict=True):
            by_conn.setdefault((int(s), int(d)), set()).add(int(q))
        assert all(max(q) - min(q) == 3 and len(q) == 4 for q in by_conn.values())
    rng = np.random.default_rng(0)
    sq, dq = allocate_qpns([5, 6, 5, 7], [6, 5, 7, 5], 8, np.random.default_rng(0))
    base = rng.integers(0x100, 1 << 24, size=8)
    # NIC 5 creates QPs 0 (src), 1 (dst), 2 (src), 3 (dst) of its own, in that order
    assert [sq[0], dq[1], sq[2], dq[3]] == [(base[5] - 0x100 + k) % ((1 << 24) - 0x100) + 0x100
                                            for k in range(4)]  # fmt: skip
    assert [dq[0], sq[1]] == [base[6], base[6] + 1] and [dq[2], sq[3]] == [base[7], base[7] + 1]


def test_xor_is_the_old_rule_on_the_same_qpns(medium):
    linux, xor = flows(medium, "linux", gpus=32), flows(medium, "xor", gpus=32)
    assert np.array_equal(linux.sqpn, xor.sqpn) and np.array_equal(linux.dqpn, xor.dqpn)
    want = ((xor.sqpn.astype(np.int64) ^ xor.dqpn) & 0xFFFF) | 0xC000
    assert np.array_equal(xor.sport, want)
    assert np.array_equal(xor.sport, roce_udp_sport(xor.sqpn, xor.dqpn))
    assert not np.array_equal(linux.sport, xor.sport)


def scenario(sport, qpn_seed=1):
    raw = {
        "scenario": {"topology": "lab-medium", "seed": 2, "qpn_seed": qpn_seed},
        "workload": {"collective": "alltoall", "size": "1MiB", "gpus": 16, "qps": 4},
        "nic": {"sport": sport},
    }
    return scenario_from_dict(raw, "ports")


def test_random_ports_are_drawn_from_the_qpn_seed():
    a, b, c = scenario("random"), scenario("random"), scenario("random", qpn_seed=2)
    assert np.array_equal(a.flows.sport, b.flows.sport)
    assert not np.array_equal(a.flows.sport, c.flows.sport)
    assert a.flows.sport.min() >= 0xC000 and a.flows.sport.max() <= 0xFFFF
    linux = scenario("linux")
    assert np.array_equal(a.flows.sqpn, linux.flows.sqpn)  # the ports come after the QPNs
    assert not np.array_equal(a.flows.sport, linux.flows.sport)
    for ports, _ in per_connection(a.flows, "sport").values():
        assert ports >= 3  # one port per QP, not per flow: 4 QPs, each its own draw
    assert len({(int(s), int(q), int(p)) for s, q, p in zip(
        a.flows.src, a.flows.sqpn, a.flows.sport, strict=True)}) == len(
        {(int(s), int(q)) for s, q in zip(a.flows.src, a.flows.sqpn, strict=True)})  # fmt: skip


def test_the_scenario_records_its_rule_and_defaults_to_linux():
    assert scenario("xor").to_dict()["nic"] == {"sport": "xor"}
    demo = load_scenario("demo")
    assert demo.sport == "linux" and demo.to_dict()["nic"] == {"sport": "linux"}
    f = demo.flows
    assert np.array_equal(f.sport, linux_udp_sport(f.sqpn, f.dqpn))
    xor = load_scenario("demo", overrides={"nic.sport": "xor"})
    assert np.array_equal(xor.flows.sport, roce_udp_sport(xor.flows.sqpn, xor.flows.dqpn))


def test_an_unknown_rule_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(
        '[scenario]\ntopology = "lab-small"\n[workload]\ncollective = "allreduce"\n'
        'size = "1MiB"\n[nic]\nsport = "crc"\n'
    )
    r = CliRunner().invoke(main, ["run", "s.toml", "-o", "out"])
    assert r.exit_code == 1, r.output
    last = r.output.strip().splitlines()
    assert len(last) == 1 and "Traceback" not in r.output, r.output
    assert last[0] == "Error: scenario s: nic.sport = 'crc' is not one of linux, xor, random"
    assert not (tmp_path / "out").exists()


def shared_port_flows(fabric, pairs: int, rng):
    """`pairs` connections from rack 0 to other racks, two QPs each; even consecutive QPNs
    at both ends, so the xor rule gives both QPs of a connection one port."""
    nics = fabric.nic_ids
    src = np.repeat(rng.choice(nics[:4], pairs), 2)
    dst = np.repeat(rng.choice(nics[4:], pairs), 2)
    sqpn = np.repeat(rng.integers(0x80, 1 << 23, pairs) * 2, 2) + np.tile([0, 1], pairs)
    dqpn = np.repeat(rng.integers(0x80, 1 << 23, pairs) * 2, 2) + np.tile([0, 1], pairs)
    sport = roce_udp_sport(sqpn, dqpn)
    assert np.array_equal(sport[0::2], sport[1::2])
    return src, dst, sqpn, dqpn, sport


@pytest.mark.parametrize(("policy", "units"), [("5tuple", 1), ("eecmp", 2)])
def test_the_uniform_reference_hashes_qps_sharing_a_port_as_one(policy, units):
    """Two QPs with one 5-tuple are one ball for a 5-tuple hash (never split), two for
    eecmp (the dQPN tells them apart): the expected collisions are those of the units."""
    fabric = topologies.load_fabric("lab-small")
    pairs = 12
    src, dst, sqpn, dqpn, sport = shared_port_flows(fabric, pairs, np.random.default_rng(4))
    routing = Routing(fabric, policy, 1)
    paths = routing.paths(src, dst, sport, dqpn)
    flows_ = {"src": src, "dst": dst, "sport": sport, "dqpn": dqpn,
              "bytes": np.full(2 * pairs, 4096), "path_ptr": paths.ptr}  # fmt: skip
    m = ecmp_metrics(fabric, flows_, routing, paths.ports.astype(np.int64)).to_dict()
    row = next(r for r in m["switches"] if (r["switch"], r["tier"]) == ("z0-r0-rtsw", "rtsw>ctsw"))
    assert row["qps"] == 2 * pairs and row["hash_units"] == units * pairs
    assert row["collisions_expected"] == pytest.approx(expected_collisions(units * pairs, 4))
    occupied = sum(1 for c in row["qps_per_link"] if c)
    assert row["collisions"] == units * pairs - occupied
    if units == 1:
        assert all(c % 2 == 0 for c in row["qps_per_link"])  # the pairs go together
    # the reference of QPs per link: under 5-tuple hashing a pair lands together, so the
    # max/mean of QP counts is that of `pairs` balls of weight 2, not of 2 x pairs balls
    rng = np.random.default_rng(5)
    draws = rng.integers(0, 4, size=(20_000, units * pairs))
    loads = np.stack([np.bincount(d, minlength=4) for d in draws]) * (2 // units)
    want = np.mean(loads.max(axis=1) / loads.mean(axis=1))
    assert row["qps_expected"]["max_mean"] == pytest.approx(want, rel=0.03)


def test_the_spread_reference_draws_once_per_hashed_key(medium):
    rng = np.random.default_rng(6)
    src, dst, sqpn, dqpn, sport = shared_port_flows(medium, 64, rng)
    qp = QpFlows(
        src=src.astype(np.int32), dst=dst.astype(np.int32), sqpn=sqpn, dqpn=dqpn, sport=sport,
        weight=np.full(128, 0.5), flow=np.repeat(np.arange(64), 2),
    )  # fmt: skip
    routing = Routing(medium, "5tuple", 1)
    units = np.repeat(np.arange(64), 2)
    ideal = routing.paths(qp.src, qp.dst, qp.sport, qp.dqpn, rng=rng, units=units)
    for f in range(0, 128, 2):
        assert np.array_equal(ideal.of(f), ideal.of(f + 1))
    assert ecmp_spread(routing, qp, trials=2)["hash_units"] == 64
    assert ecmp_spread(Routing(medium, "eecmp", 1), qp, trials=2)["hash_units"] == 128


def test_ecmp_takes_the_source_port_rule(medium):
    xor = random_spread(medium, 200, "5tuple", qps=8, sport="xor", trials=2)
    linux = random_spread(medium, 200, "5tuple", qps=8, sport="linux", trials=2)
    assert xor["sport"] == "xor" and linux["sport"] == "linux"
    assert xor["ports_per_flow"] < 6 < 7.9 < linux["ports_per_flow"]
    assert xor["hash_units"] < 200 * 6 < 200 * 7.9 < linux["hash_units"]
    qp = expand_qps(np.array([0]), np.array([20]), 8, np.random.default_rng(1), "xor")
    assert np.array_equal(qp.sport, roce_udp_sport(qp.sqpn, qp.dqpn))
    assert np.diff(qp.sqpn).tolist() == np.diff(qp.dqpn).tolist() == [1] * 7
    r = CliRunner().invoke(main, ["ecmp", "lab-medium", "--flows", "50", "--qps", "8",
                                  "--sport", "random", "--trials", "1", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert '"sport": "random"' in r.output
    r = CliRunner().invoke(main, ["ecmp", "lab-medium", "--sport", "crc"])
    assert r.exit_code == 2 and "linux" in r.output, r.output
