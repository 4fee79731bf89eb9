"""The Mininet engine's pure parts: plan, packet kernel, PFC frames, availability (no root)."""

from __future__ import annotations

import ipaddress
import os
import re

import numpy as np
import pytest

from aifabric.emu import available
from aifabric.emu import plan as P
from aifabric.emu.bpfmap import prog_id_from_tc
from aifabric.emu.packets import (
    HEADER_BYTES,
    ICRC_BYTES,
    cnp,
    fill_writes,
    nak,
    parse_nak,
    parse_write,
    write_only,
)
from aifabric.fabric.addressing import nic_ipv4
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.frames import pfc_frame
from aifabric.fabric.model import Role
from aifabric.fabric.routing import Routing
from aifabric.fabric.scenario import Scenario
from aifabric.topologies import load_fabric
from aifabric.traffic.flows import FlowTable


def scenario(topology="lab-small", **kw):
    fabric = load_fabric(topology)
    flows = FlowTable.build({"src": np.array([0]), "dst": np.array([1])}, [[]], {})
    return Scenario(name="t", fabric=fabric, flows=flows, topology=topology, workload={}, **kw)


@pytest.fixture(scope="module")
def small():
    sc = scenario()
    return sc, P.plan(sc, ecn="ebpf")


def test_names_are_short_unique_and_map_back(small):
    sc, pl = small
    f = sc.fabric
    assert len(set(pl.node_short)) == f.n_nodes
    assert len(set(pl.port_iface)) == f.n_ports
    assert max(len(x) for x in pl.port_iface) <= 15
    table = pl.table()
    for v in range(f.n_nodes):
        assert table[pl.node_short[v]] == f.node_name[v]
        assert pl.node_short[v].startswith(P.PREFIX)
    for p in range(f.n_ports):
        assert pl.port_iface[p].startswith(pl.node_short[f.port_node[p]] + "p")


def test_addresses_follow_the_fabric(small):
    sc, pl = small
    f = sc.fabric
    ips = nic_ipv4(f)
    for cfg in pl.nodes:
        if f.node_role[cfg.node] == Role.NIC:
            want = f"addr add {ipaddress.IPv4Address(int(ips[cfg.node]))}/32"
            assert any(line.startswith(want) for line in cfg.ip)
    for link in range(f.n_links):
        a = ipaddress.IPv4Address(P.p2p_ip(2 * link))
        b = ipaddress.IPv4Address(P.p2p_ip(2 * link + 1))
        assert ipaddress.ip_network(f"{a}/31", strict=False) == ipaddress.ip_network(
            f"{b}/31", strict=False
        )
    assert len(set(pl.port_mac)) == f.n_ports


def test_routes_are_the_ecmp_next_hop_sets(small):
    sc, pl = small
    f = sc.fabric
    routing = Routing(f, "5tuple", 0)
    dev_port = {name: i for i, name in enumerate(pl.port_iface)}
    for cfg in pl.nodes:
        if f.node_role[cfg.node] == Role.NIC:
            continue
        routes = {}
        for line in cfg.ip:
            if line.startswith("route add "):
                dst = line.split()[2]
                routes[dst] = {dev_port[d] for d in re.findall(r"dev (\S+)", line)}
        for nic in f.nic_ids:
            key = f"{ipaddress.IPv4Address(int(nic_ipv4(f)[nic]))}/32"
            assert routes[key] == {int(p) for p in routing.next_hops(cfg.node, int(nic))}


def test_sysctls_mirror_the_policy_and_seeds():
    for policy, want in (("5tuple", "1"), ("eecmp", "1"), ("pinned", "0")):
        for same in (False, True):
            sc = scenario(ecmp=policy, same_seed=same, seed=7)
            pl = P.plan(sc, ecn="none")
            seeds = set()
            for cfg in pl.nodes:
                d = dict(cfg.sysctl)
                if sc.fabric.node_role[cfg.node] == Role.NIC:
                    assert "net.ipv4.ip_forward" not in d
                    continue
                assert d["net.ipv4.ip_forward"] == "1"
                assert d["net.ipv4.fib_multipath_hash_policy"] == want
                assert int(d["net.ipv4.fib_multipath_hash_seed"]) != 0
                seeds.add(d["net.ipv4.fib_multipath_hash_seed"])
            assert (len(seeds) == 1) == same


def test_scale_brings_rates_under_the_target():
    for name in ("lab-small", "lab-medium"):
        f = load_fabric(name)
        s = P.choose_scale(f)
        assert f.link_rate_bps.max() / s <= P.DEFAULT_TARGET_BPS
        assert f.link_rate_bps.max() / (s - 1) > P.DEFAULT_TARGET_BPS


def test_scale_keeps_every_sender_within_the_replays_budget():
    f = load_fabric("lab-medium")
    nics = f.nic_ids
    few = P.choose_scale(f, senders=nics[:2])
    assert few == P.choose_scale(f)  # two senders: the link target decides
    many = P.choose_scale(f, senders=nics)
    offered = f.port_rate_bps[f.nic_port[nics]].sum()
    assert offered / many <= P.REPLAY_BUDGET_BPS < offered / (many - 1)
    # a plan without an explicit scale uses the flow table's senders
    sc = Scenario(
        name="t", fabric=f, topology="lab-medium", workload={},
        flows=FlowTable.build({"src": nics, "dst": np.roll(nics, 1)}, [[]] * len(nics), {}),
    )  # fmt: skip
    assert P.plan(sc, ecn="none").scale == many


def test_port_queue_snapshot():
    assert P.port_tc("afs0p1", 20_000_000, 4194304, ecn="none") == [
        "qdisc replace dev afs0p1 root handle 1: htb default 30",
        "class add dev afs0p1 parent 1: classid 1:1 htb rate 20000000bit ceil 20000000bit "
        "burst 18200 cburst 18200 quantum 9100",
        "class add dev afs0p1 parent 1:1 classid 1:10 htb rate 2000000bit ceil 20000000bit "
        "prio 0 quantum 9100",
        "class add dev afs0p1 parent 1:1 classid 1:30 htb rate 18000000bit ceil 20000000bit "
        "prio 1 quantum 9100",
        "qdisc add dev afs0p1 parent 1:10 handle 10: pfifo limit 1000",
        "qdisc add dev afs0p1 parent 1:30 handle 30: tbf rate 80000000bit burst 72800 "
        "limit 4194304",
        "qdisc add dev afs0p1 parent 30:1 handle 31: bfifo limit 4194304",
        "filter add dev afs0p1 parent 1: protocol ip prio 1 u32 match ip dsfield 0xc0 0xfc "
        "flowid 1:10",
    ]
    red = P.port_tc(
        "afs0p1", 20_000_000, 4194304, ecn="red", kmin_bytes=102400, kmax_bytes=409600, pmax=0.2
    )
    assert red[6] == (
        "qdisc add dev afs0p1 parent 30:1 handle 31: red limit 4194304 min 102400 max 409600 "
        "avpkt 4200 burst 48 probability 0.2 bandwidth 20000000bit ecn"
    )
    assert P.tbf_line("x", paused=True, rate_bps=10, buffer_bytes=5) == (
        "qdisc change dev x parent 1:30 handle 30: tbf rate 8bit burst 9100 limit 5"
    )
    assert P.ecn_tc("afs0p1", "m.o") == [
        "qdisc add dev afs0p1 clsact",
        "filter add dev afs0p1 egress prio 1 bpf da obj m.o sec tc",
    ]


def test_netem_delay_sits_in_front_of_each_queue():
    lines = P.port_tc("afs0p1", 20_000_000, 4194304, ecn="none", delay_ns=10_000_000)
    assert lines[4] == "qdisc add dev afs0p1 parent 1:10 handle 10: netem delay 10000us limit 10000"
    assert lines[6] == "qdisc add dev afs0p1 parent 30:1 handle 33: netem delay 10000us limit 10000"
    # the queue the monitor reads keeps its handle, now below the delay line
    assert lines[7] == "qdisc add dev afs0p1 parent 33:1 handle 31: bfifo limit 4194304"
    red = P.port_tc("x", 20_000_000, 4194304, ecn="red", kmin_bytes=1, kmax_bytes=2, delay_ns=1)
    assert red[7].startswith("qdisc add dev x parent 33:1 handle 31: red ")
    assert "netem delay 1us" in red[6]  # never rounded down to no delay


def test_link_delays_scale_with_the_rates(small):
    sc, _ = small
    f = sc.fabric
    pl = P.plan(sc, ecn="none", delay="netem", scale=1000)
    assert pl.delay == "netem"
    for cfg in pl.nodes:
        for p in f.ports_of(cfg.node):
            want = int(f.port_delay_ns[p])  # ns times a scale of 1000 is that many µs
            dev = pl.port_iface[int(p)]
            assert f"qdisc add dev {dev} parent 30:1 handle 33: netem delay {want}us" in " ".join(
                cfg.tc
            )
    plain = P.plan(sc, ecn="none", scale=1000)
    assert plain.delay == "none"
    assert not any("netem" in line for cfg in plain.nodes for line in cfg.tc)
    with pytest.raises(AifabricError, match="link delay mechanism"):
        P.plan(sc, ecn="none", delay="wire")


def test_ebpf_markers_only_on_switch_ports(small):
    sc, pl = small
    f = sc.fabric
    marked = {port for cfg in pl.nodes for _, port in cfg.ecn_ifaces}
    switch_ports = {p for p in range(f.n_ports) if f.node_role[f.port_node[p]] != Role.NIC}
    assert marked == switch_ports
    none = P.plan(sc, ecn="none")
    assert not any(cfg.ecn_ifaces for cfg in none.nodes)
    assert not any("bpf" in line for cfg in none.nodes for line in cfg.tc)


def _reference_writes(flow, dqpn, psn0, offset0, remaining, mtu, rows):
    out = []
    offset = offset0
    for i in range(rows):
        if remaining <= 0:
            break
        pay = min(mtu, remaining)
        out.append(write_only(dqpn, (psn0 + i) & 0xFFFFFF, offset, flow, pay))
        remaining -= pay
        offset += pay
    return out


@pytest.mark.parametrize(
    "flow,dqpn,psn0,offset,remaining,mtu",
    [(0, 1, 0, 0, 10000, 4096), (77, 0xABCDEF, 0xFFFFFE, 8192, 5000, 1024), (3, 5, 9, 0, 12, 4096)],
)
def test_fill_writes_matches_reference(flow, dqpn, psn0, offset, remaining, mtu):
    rows = 8
    buf = np.zeros((rows, mtu + 64), dtype=np.uint8)
    lens = np.zeros(rows, dtype=np.int64)
    n = fill_writes(buf, lens, flow, dqpn, psn0, offset, remaining, mtu)
    ref = _reference_writes(flow, dqpn, psn0, offset, remaining, mtu, rows)
    assert n == len(ref)
    for i, want in enumerate(ref):
        assert bytes(buf[i, : lens[i]]) == want
        op, q, psn, f, pay = parse_write(want)
        assert (op, q, psn, f) == (0x0A, dqpn, (psn0 + i) & 0xFFFFFF, flow)
        assert pay == len(want) - HEADER_BYTES - ICRC_BYTES


def test_packets_parse_with_scapy():
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.contrib.roce import AETH, BTH
    from scapy.layers.l2 import Ether

    buf = np.zeros((1, 200), dtype=np.uint8)
    lens = np.zeros(1, dtype=np.int64)
    fill_writes(buf, lens, 5, 0x123456, 42, 0, 100, 4096)
    bth = BTH(bytes(buf[0, : lens[0]]))
    assert (bth.opcode, bth.dqpn, bth.psn, bth.pkey) == (0x0A, 0x123456, 42, 0xFFFF)
    c = BTH(cnp(0x654321))
    assert (c.opcode, c.dqpn, c.becn) == (0x81, 0x654321, 1)
    n = BTH(nak(0x111111, 77, 1234))  # RC ACKNOWLEDGE, NAK "PSN sequence error", flow in MSN
    assert (n.opcode, n.dqpn, n.psn) == (0x11, 0x111111, 77)
    assert (n[AETH].syndrome, n[AETH].msn) == (0x60, 1234)
    assert parse_nak(nak(0x111111, 77, 1234)) == (0x111111, 77, 1234)
    assert parse_nak(cnp(1)) is None
    frame = Ether(pfc_frame("02:af:00:00:00:01", 3, 0xFFFF))
    pfc = frame[MACControlClassBasedFlowControl]
    assert frame.type == 0x8808 and frame.dst == "01:80:c2:00:00:01"
    assert pfc.c3_enabled == 1 and pfc.c3_pause_time == 0xFFFF
    assert pfc.c2_enabled == 0 and pfc.c2_pause_time == 0


def test_prog_id_from_tc_json():
    out = (
        '[{"protocol":"all","pref":1,"kind":"bpf","chain":0},{"protocol":"all","pref":1,'
        '"kind":"bpf","chain":0,"options":{"handle":"0x1","prog":{"id":124,"name":"ecn_mark"}}}]'
    )
    assert prog_id_from_tc(out) == 124
    assert prog_id_from_tc("[]") is None


def test_available_says_why_not_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = available()
    assert reason and "root" in reason and reason.count(".") <= 1


def test_bad_scale_is_one_sentence():
    with pytest.raises(AifabricError, match="scale"):
        P.plan(scenario(), ecn="none", scale=0)


@pytest.mark.parametrize("name", ["lab-small", "lab-medium", "fat-tree-k8"])
def test_pfc_pauses_cannot_wait_in_a_circle(name):
    """Egress e waits for the egresses its peer's ingress feeds: that graph has no cycle."""
    import networkx as nx

    from aifabric.emu.monitor import pfc_feeds

    f = load_fabric(name)
    routing = Routing(f, "5tuple", 0)
    feeds = pfc_feeds(f, routing)
    g = nx.DiGraph()
    for q, egresses in feeds.items():
        for e in egresses:
            assert f.port_node[e] == f.port_node[q] and e != q
            g.add_edge(q ^ 1, e)  # the egress into q waits while e is past XOFF
    assert nx.is_directed_acyclic_graph(g)
    # a leaf's uplink is fed by its NICs only; a spine's downlink by the other leaves
    leaf = int(f.nic_switch[f.nic_ids[0]])
    for q in f.ports_of(leaf):
        peer = int(f.port_peer[q])
        if f.node_role[peer] != Role.NIC:
            assert not any(f.node_role[f.port_peer[e]] != Role.NIC for e in feeds[int(q)])
    # after a failure the link's own ports feed nothing new and nothing feeds into it
    dead = int(f.ports_of(leaf)[-1])
    cut = pfc_feeds(f, routing.without(links=[dead // 2]))
    assert all(dead not in es and (dead ^ 1) not in es for es in cut.values())


def test_pfc_feeds_by_path_keep_one_jobs_full_queue_off_anothers_ingress():
    """With the flows' paths, a spine's ingress from the ring's leaf feeds only the ring's
    egress, not the incast's downlink beside it (by routes alone it feeds every downlink, and
    the emulator paused the ring's uplinks for the incast, 0.3 ms the simulator never did);
    path feeds are the routes' feeds narrowed, so PFC still cannot wait in a circle."""
    import networkx as nx

    from aifabric.emu.monitor import pfc_feeds
    from tests.test_crosscheck import _scenario

    sc = _scenario()
    f, ft = sc.fabric, sc.flows
    routing = Routing(f, "linux", sc.hash_seed)
    paths = routing.paths(ft.src, ft.dst, ft.sport)
    by_path, by_route = pfc_feeds(f, routing, paths), pfc_feeds(f, routing)
    assert by_path.keys() == by_route.keys()
    assert all(set(by_path[q]) <= set(by_route[q]) for q in by_path)
    for i in range(len(ft)):  # every hop a flow takes is fed
        ps = paths.of(i)
        assert all(int(b) in by_path[int(a) ^ 1] for a, b in zip(ps[:-1], ps[1:], strict=True))
    ring = ft.job == 0  # the scenario's first job
    incast_leaf = int(f.nic_switch[int(ft.dst[~ring][0])])
    into_incast_leaf = {int(q) ^ 1 for q in f.ports_of(incast_leaf)}  # spine ports towards it
    ring_ingress = {int(a) ^ 1 for i in np.flatnonzero(ring) for a in paths.of(i)[1:-1]}
    spine_ring_ingress = [q for q in ring_ingress if f.node_role[f.port_node[q]] != Role.RTSW]
    assert spine_ring_ingress
    for q in spine_ring_ingress:
        assert not into_incast_leaf & set(by_path[q])
        assert into_incast_leaf & set(by_route[q])  # what the routes alone would pause it for
    g = nx.DiGraph((q ^ 1, e) for q, es in by_path.items() for e in es)
    assert nx.is_directed_acyclic_graph(g)


def test_the_monitor_counts_reds_marks_from_tcs_json():
    """RED's `marked` (iproute2's JSON for the red qdisc's xstats) is the port's ECN count;
    before, only eBPF markers were counted and a RED kernel's runs said 0 marks while their
    receivers saw hundreds of CE packets (the VM lab's first runs)."""
    from aifabric.emu.monitor import read_qdiscs

    items = [
        {"kind": "htb", "handle": "1:", "dev": "afs3p1", "root": True, "bytes": 90000,
         "packets": 22, "drops": 3, "backlog": 0, "qlen": 0},
        {"kind": "tbf", "handle": "30:", "parent": "1:30", "dev": "afs3p1", "drops": 0},
        {"kind": "netem", "handle": "33:", "parent": "30:1", "dev": "afs3p1", "drops": 0},
        {"kind": "red", "handle": "31:", "parent": "33:1", "dev": "afs3p1", "bytes": 80000,
         "drops": 1, "backlog": 8400, "qlen": 2, "marked": 17, "early": 1, "pdrop": 0,
         "other": 0},
        {"kind": "htb", "handle": "1:", "dev": "afs3p2", "root": True, "bytes": 500, "drops": 0},
        {"kind": "bfifo", "handle": "31:", "parent": "30:1", "dev": "afs3p2", "backlog": 4200},
        {"kind": "red", "handle": "31:", "parent": "30:1", "dev": "afs9p1", "marked": 99},
    ]  # fmt: skip
    cols = {"afs3p1": 0, "afs3p2": 1}
    tx, backlog, drops, ecn = (np.zeros(2, dtype=np.int64) for _ in range(4))
    read_qdiscs(items, cols, tx, backlog, drops, ecn)
    assert tx.tolist() == [90000, 500]
    assert drops.tolist() == [3, 0]  # the root's, which include RED's own
    assert backlog.tolist() == [8400, 4200]
    assert ecn.tolist() == [17, 0]  # a FIFO marks nothing; a port not recorded is not read


def _flows(fabric, src, dst, nbytes, deps=None, start_ns=None):
    cols = {"src": np.array(src), "dst": np.array(dst), "bytes": np.array(nbytes)}
    if start_ns is not None:
        cols["start_ns"] = np.array(start_ns)
    return Scenario(
        name="t", fabric=fabric, topology=fabric.name, workload={},
        flows=FlowTable.build(cols, deps or [[] for _ in src], {}),
    )  # fmt: skip


def test_the_estimate_is_the_busiest_nic_or_the_longest_chain():
    f = load_fabric("lab-small")
    nics = [int(x) for x in f.nic_ids]
    line = int(f.port_rate_bps[f.nic_port[nics[0]]])
    mb = 4_000_000
    one_ns = mb * 8e9 / line
    # a 3-to-1 incast: the receiver's NIC takes three flows' time
    sc = _flows(f, nics[1:4], [nics[0]] * 3, [mb] * 3)
    e = P.estimate(sc, 100, 1e9)
    assert e.fabric_ns == pytest.approx(3 * one_ns, rel=1e-6)
    assert e.packets == 3 * -(-mb // 4096)
    assert e.wall_s == pytest.approx(3 * one_ns * 100 / 1e9)
    # a chain of three dependent flows on distinct NICs, the first starting late
    sc = _flows(f, nics[0:3], nics[1:4], [mb] * 3, [[], [0], [1]], [1_000_000, 0, 0])
    e = P.estimate(sc, 100, 1e9)
    assert e.fabric_ns == pytest.approx(1_000_000 + 3 * one_ns, rel=1e-6)
    # a slow replay sets the pace: its packets at its rate
    e = P.estimate(sc, 1, 1000.0)
    assert e.wall_s == e.replay_wall_s == pytest.approx(3 * -(-mb // 4096) / 1000)
    assert e.timeout_s() > 2 * e.wall_s


def test_the_estimate_counts_ecmp_collisions_where_the_switches_hash():
    """ecmp-permutation: one flow per NIC, but the Linux hash puts several flows on one
    uplink, which takes their time together; Open vSwitch's hash collides elsewhere."""
    from aifabric.fabric.faults import routing_at_start
    from aifabric.scenarios import load_scenario

    sc = load_scenario("ecmp-permutation")
    f, ft = sc.fabric, sc.flows
    nic_ns = float((ft.bytes * 8e9 / f.port_rate_bps[f.nic_port[ft.src]]).max())
    for policy in ("linux", "ovs"):
        routing = routing_at_start(f, sc.faults, policy, sc.hash_seed, same_seed=sc.same_seed)
        carried = routing.paths(ft.src, ft.dst, ft.sport).port_counts(f.n_ports, ft.bytes)
        busiest_ns = float((carried * 8e9 / f.port_rate_bps).max())
        e = P.estimate(sc, 1000, 1e9, policy=policy)
        assert busiest_ns >= 2 * nic_ns  # the test shows something: a collision
        assert e.fabric_ns == pytest.approx(busiest_ns, rel=1e-6)
        assert e.fabric_wall_s == pytest.approx(busiest_ns * 1000 / 1e9, rel=1e-6)


def test_absorb_delivers_in_order_naks_a_gap_once_and_paces_cnps():
    from aifabric.emu.packets import CNP_DUE, FINISHED, NAKED, OTHER, absorb

    mtu, n = 4096, 2
    pkts = [(0, 0, 0), (0, 1, 3), (0, 3, 3), (0, 3, 0), (1, 0, 0)]  # (flow, psn, tos)
    buf = np.zeros((8, mtu + 64), dtype=np.uint8)
    lens = np.zeros(8, dtype=np.uint32)
    control = np.zeros((8, 32), dtype=np.uint8)
    controllen = np.zeros(8, dtype=np.uint64)
    for i, (f, psn, tos) in enumerate(pkts):
        data = write_only(7, psn, psn * mtu, f, mtu)
        buf[i, : len(data)] = np.frombuffer(data, dtype=np.uint8)
        lens[i] = len(data)
        control[i, 0], control[i, 8], control[i, 12], control[i, 16] = 17, 0, 1, tos
        controllen[i] = 24
    other = cnp(5)
    buf[5, : len(other)] = np.frombuffer(other, dtype=np.uint8)
    lens[5] = len(other)
    nbytes = np.array([4 * mtu, mtu], dtype=np.int64)
    expect = np.zeros(n, dtype=np.int64)
    received = np.zeros(n, dtype=np.int64)
    progress = np.zeros(n)
    ce = np.zeros(n, dtype=np.int64)
    nak_for = np.full(n, -1, dtype=np.int64)
    last_cnp = np.full(n, -1e18)
    out = np.zeros((24, 3), dtype=np.int64)
    args = (nbytes, expect, received, progress, ce, nak_for, last_cnp)
    m = absorb(buf, lens, control, controllen, 6, *args, 1.0, 10.0, out)
    rows = [tuple(r) for r in out[:m].tolist()]
    # flow 0: PSN 0 delivered, 1 (CE) delivered with a CNP, 2 lost: PSN 3 (CE) is past a
    # gap, one NAK for 2 and no second CNP within t_cnp; PSN 3 again: no second NAK.
    # Flow 1 completes; the CNP in row 5 is not data.
    assert received.tolist() == [2 * mtu, mtu] and expect.tolist() == [2, 1]
    assert ce.tolist() == [2, 0] and progress.tolist() == [1.0, 1.0]
    assert rows == [(CNP_DUE, 0, 0), (NAKED, 0, 2), (FINISHED, 1, 0), (OTHER, 5, 0)]


def test_senders_overrunning_a_lossy_receiver_make_the_estimate_long():
    from aifabric.scenarios import load_scenario

    lossy, pfc = load_scenario("incast-lossy"), load_scenario("incast-pfc")
    e = P.estimate(lossy, 20_000, 20_000)
    assert e.overrun == 15  # PFC off, no congestion control: go-back-N after every drop
    assert e.wall_s == P.LOSSY_INCAST_FACTOR * max(e.fabric_wall_s, e.replay_wall_s)
    e = P.estimate(pfc, 20_000, 20_000)
    assert e.overrun == 0 and e.wall_s == max(e.fabric_wall_s, e.replay_wall_s)


@pytest.mark.parametrize("hierarchical", [False, True])
@pytest.mark.parametrize(
    "collective, algorithm",
    [("allreduce", "ring"), ("allreduce", "tree"), ("allreduce", "halving-doubling"),
     ("alltoall", "pairwise"), ("broadcast", "ring"), ("sendrecv", "auto")],
)  # fmt: skip
def test_the_replay_waits_the_latencies_the_simulator_waits(collective, algorithm, hierarchical):
    """Every step the emulator replays waits as long before its first byte as the simulator
    waits before that flow: after its op starts (or the op before it ends) the base latency,
    and a stream's step its step latency as well; after data of its own op, the step
    latency. A hierarchical halving-doubling or pairwise op's transfers are not streams
    (they waited a step latency too many when the replay told them by their algorithm's
    name)."""
    from aifabric import traffic
    from aifabric.emu.replay import _latencies_s
    from aifabric.sim import Simulation
    from aifabric.sim import layout as L
    from aifabric.traffic.steps import expand_steps_with_origin, steps_first_latency_ns

    fabric = load_fabric("lab-medium")
    spec = dict(collective=collective, algorithm=algorithm, size=2**20, gpus=16,
                hierarchical=hierarchical)  # fmt: skip
    table = traffic.generate(fabric, traffic.workload_from_dict(spec, "x"), seed=1)
    steps, origin = expand_steps_with_origin(table)
    step_s, first_s = _latencies_s(steps, 10**9, steps_first_latency_ns(table, origin))
    sim = Simulation(fabric, table, cc="none")
    ps = 1000  # the simulator's times are in ps
    stream = table.group >= 0
    for i in range(len(steps)):
        j = int(origin[i]) if origin[i] >= 0 else -1 - int(origin[i])  # a marker: its stream
        first = sim.fl[j, L.FL_BASE_PS]
        step = sim.gr[int(table.group[j]), L.GR_LAT_PS] if stream[j] else sim.fl[j, L.FL_LAT_PS]
        assert first_s[i] == first / ps and step_s[i] == step / ps, (i, table.op_algorithm)
    sim.close()
    assert any(f > 0 for f in first_s)
