import struct
import zlib

import networkx as nx
import numpy as np
import pytest

from aifabric.fabric.addressing import nic_ipv4, roce_udp_sport
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Role
from aifabric.fabric.routing import CRC_TABLE, Routing, crc32_bytes, flow_hash
from aifabric.fabric.spread import ecmp_spread, expand_qps, random_flows, tier_of_ports


def ref_mix32(x):
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def ref_hash(sip, dip, sport, dport, dqpn, psn, mode, seed):
    data = struct.pack("!IIBHH", sip, dip, 17, sport, dport)
    if mode == 1:
        data += dqpn.to_bytes(3, "big")
    elif mode == 3:
        data += psn.to_bytes(3, "big")
    return ref_mix32(zlib.crc32(data) ^ seed)


def test_crc32_kernel_equals_zlib():
    rng = np.random.default_rng(1)
    for n in (0, 1, 13, 256):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        seed = int(rng.integers(0, 2**32))
        assert crc32_bytes(data, seed, CRC_TABLE) == zlib.crc32(data.tobytes(), seed)


@pytest.mark.parametrize("mode", [0, 1, 3])
def test_flow_hash_equals_reference(mode):
    rng = np.random.default_rng(mode)
    for _ in range(200):
        sip, dip, seed = (int(x) for x in rng.integers(0, 2**32, 3))
        sport, dqpn, psn = int(rng.integers(0, 2**16)), *(int(x) for x in rng.integers(0, 2**24, 2))
        got = flow_hash(sip, dip, sport, 4791, dqpn, psn, mode, seed, CRC_TABLE)
        assert got == ref_hash(sip, dip, sport, 4791, dqpn, psn, mode, seed)


def test_roce_udp_source_port_derives_from_qpns():
    assert roce_udp_sport(0x12345, 0x00678) == ((0x12345 ^ 0x678) & 0xFFFF) | 0xC000
    ports = roce_udp_sport(np.arange(1000), 77)
    assert ports.min() >= 0xC000 and ports.max() <= 0xFFFF


def test_nic_addresses_are_unique_and_follow_zone_rack_slot(get_fabric):
    f = get_fabric("cluster-24k")
    ips = nic_ipv4(f)[f.nic_ids]
    assert len(np.unique(ips)) == len(ips)
    n = f.node_id("z7-r191-h1-nic7")
    assert nic_ipv4(f)[n] == (10 << 24) | (7 << 16) | (191 << 8) | (8 + 7 + 1)


def test_next_hops_on_a_leaf_spine(get_fabric):
    f = get_fabric("lab-small")
    r = Routing(f)
    src_leaf = f.node_id("z0-r0-rtsw")
    dst = f.node_id("z0-r3-h1-nic1")
    up = r.next_hops(src_leaf, dst)
    assert len(up) == 4  # 2 links to each of 2 spines
    assert {f.node_name[p] for p in f.port_peer[up]} == {"z0-ctsw0", "z0-ctsw1"}
    down = r.next_hops(f.node_id("z0-ctsw1"), dst)
    assert set(f.port_peer[down]) == {f.node_id("z0-r3-rtsw")}
    assert len(down) == 2
    last = r.next_hops(f.node_id("z0-r3-rtsw"), dst)
    assert list(f.port_peer[last]) == [dst]


def _check_paths(f, r, src, dst, paths):
    g = nx.Graph()
    g.add_edges_from(zip(f.link_a.tolist(), f.link_b.tolist(), strict=True))
    for i in range(len(src)):
        ports = paths.of(i)
        assert f.port_node[ports[0]] == src[i]
        assert f.port_peer[ports[-1]] == dst[i]
        assert np.array_equal(f.port_peer[ports[:-1]], f.port_node[ports[1:]])
        assert len(ports) == nx.shortest_path_length(g, int(src[i]), int(dst[i]))


@pytest.mark.parametrize("preset", ["lab-medium", "fat-tree-k8", "rail-256"])
@pytest.mark.parametrize("policy", ["5tuple", "eecmp", "pinned", "spray", "adaptive"])
def test_paths_are_connected_shortest_and_end_at_the_destination(get_fabric, preset, policy):
    f = get_fabric(preset)
    rng = np.random.default_rng(3)
    src, dst = random_flows(f, 60, rng)
    r = Routing(f, policy, seed=9)
    paths = r.paths(src, dst, rng.integers(0xC000, 0x10000, 60), rng.integers(0, 2**24, 60))
    assert paths.reachable.all()
    _check_paths(f, r, src, dst, paths)


def uplink_counts(f, r, n=4800, seed=5):
    """Flows from one NIC to NICs in other racks: how many take each of its RTSW's uplinks."""
    rng = np.random.default_rng(seed)
    src = np.full(n, f.nic_ids[0])
    dst = rng.choice(f.nic_ids[f.nic_switch[f.nic_ids] != f.nic_switch[src[0]]], n)
    sport = rng.integers(0xC000, 0x10000, n)
    paths = r.paths(src, dst, sport, rng.integers(0, 2**24, n))
    second = paths.ports[paths.ptr[:-1] + 1]
    leaf = f.nic_switch[src[0]]
    ups = [p for p in f.ports_of(leaf) if f.node_role[f.port_peer[p]] != Role.NIC]
    return np.array([np.count_nonzero(second == p) for p in ups])


@pytest.mark.parametrize("policy", ["5tuple", "eecmp", "spray"])
def test_hashing_spreads_flows_like_a_uniform_draw(get_fabric, policy):
    counts = uplink_counts(get_fabric("lab-medium"), Routing(get_fabric("lab-medium"), policy))
    assert len(counts) == 16
    expected = counts.sum() / len(counts)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 15 degrees of freedom: P(chi2 > 37.70) = 0.001 for a uniform hash.
    assert chi2 < 37.70, counts


def test_adaptive_balances_exactly():
    from aifabric.topologies import load_fabric

    f = load_fabric("lab-medium")
    counts = uplink_counts(f, Routing(f, "adaptive"), n=160)
    assert set(counts) == {10}


def test_same_seed_polarizes_the_second_tier(get_fabric):
    f = get_fabric("fat-tree-k8")
    rng = np.random.default_rng(0)
    src, dst = random_flows(f, 4000, rng)
    sport = rng.integers(0xC000, 0x10000, len(src))
    labels = tier_of_ports(f)
    up2 = 4 * Role.CTSW + Role.ATSW

    def used_core_uplinks_per_agg(same_seed):
        paths = Routing(f, "5tuple", seed=7, same_seed=same_seed).paths(src, dst, sport)
        ports = paths.ports[labels[paths.ports] == up2]
        aggs = f.port_node[ports]
        return [len(set(ports[aggs == a])) for a in np.unique(aggs)]

    # Each aggregation switch has 4 core uplinks. With one seed everywhere the
    # flows an edge switch sent to aggregation switch j hash to core uplink j again.
    assert set(used_core_uplinks_per_agg(False)) == {4}
    assert set(used_core_uplinks_per_agg(True)) == {1}


def test_more_qps_with_eecmp_lower_the_imbalance(get_fabric):
    f = get_fabric("lab-medium")
    routing = Routing(f, "eecmp", seed=1)

    def worst(qps):
        values = []
        for seed in range(4):
            rng = np.random.default_rng(seed)
            src, dst = random_flows(f, 128, rng)
            qp = expand_qps(src, dst, qps, rng)
            tiers = ecmp_spread(routing, qp, trials=1, rng=rng)["tiers"]
            values.append(max(t["load"]["max_mean"] for t in tiers))
        return np.mean(values)

    one, four, sixteen = worst(1), worst(4), worst(16)
    assert one > four > sixteen


def test_plain_5tuple_also_gains_entropy_from_qps_through_the_udp_port(get_fabric):
    f = get_fabric("lab-medium")
    rng = np.random.default_rng(2)
    src, dst = random_flows(f, 1, rng)
    qp = expand_qps(src, dst, 32, rng)
    paths = Routing(f, "5tuple").paths(qp.src, qp.dst, qp.sport, qp.dqpn)
    assert len(set(paths.ports[paths.ptr[:-1] + 1])) > 8


def test_pinned_routes_by_destination_only(get_fabric):
    f = get_fabric("lab-medium")
    dst = f.node_id("z0-r5-h0-nic3")
    srcs = f.nic_ids[f.node_rack[f.nic_ids] < 4]
    r = Routing(f, "pinned")
    paths = r.paths(srcs, np.full(len(srcs), dst), np.arange(len(srcs)) | 0xC000)
    spines = {int(f.port_node[paths.of(i)[2]]) for i in range(len(srcs))}
    assert len(spines) == 1


def test_spray_sends_packets_of_one_flow_over_many_paths(get_fabric):
    f = get_fabric("lab-medium")
    src, dst = f.node_id("z0-r0-h0-nic0"), f.node_id("z0-r7-h1-nic2")
    r = Routing(f, "spray", seed=3)
    paths = {tuple(r.path(src, dst, sport=0xC123, psn=psn)) for psn in range(200)}
    assert len(paths) > 20
    flow = Routing(f, "5tuple", seed=3)
    assert len({tuple(flow.path(src, dst, sport=0xC123, psn=psn)) for psn in range(50)}) == 1


def test_removing_a_link_moves_only_the_flows_that_used_it(get_fabric):
    f = get_fabric("lab-medium")
    rng = np.random.default_rng(11)
    src, dst = random_flows(f, 3000, rng)
    sport = rng.integers(0xC000, 0x10000, len(src))
    r = Routing(f, "5tuple", seed=4)
    before = r.paths(src, dst, sport)
    link = int(before.links(0)[1])  # an RTSW-CTSW link flow 0 uses
    after = r.without(links=[link]).paths(src, dst, sport)
    assert after.reachable.all()
    moved = used = 0
    for i in range(len(src)):
        old, new = before.links(i), after.links(i)
        if link in old:
            used += 1
            assert link not in new
            moved += not np.array_equal(old, new)
        else:
            assert np.array_equal(old, new), i
    assert used == moved > 0


def test_removing_a_spine_keeps_everyone_reachable(get_fabric):
    f = get_fabric("fat-tree-k8")
    rng = np.random.default_rng(12)
    src, dst = random_flows(f, 500, rng)
    core = f.node_id("p0-atsw0")
    r = Routing(f, "eecmp").without(nodes=[core])
    paths = r.paths(src, dst, rng.integers(0xC000, 0x10000, 500), rng.integers(0, 2**24, 500))
    assert paths.reachable.all()
    assert core not in set(f.port_peer[paths.ports])


def test_a_nic_cut_off_is_unreachable_in_one_sentence(get_fabric):
    f = get_fabric("lab-small")
    dst = f.node_id("z0-r1-h0-nic0")
    r = Routing(f).without(links=[int(f.nic_port[dst]) // 2])
    with pytest.raises(AifabricError, match="cannot be reached"):
        r.path(f.node_id("z0-r0-h0-nic0"), dst)


def test_unknown_policy_is_one_sentence(get_fabric):
    with pytest.raises(AifabricError, match="unknown ECMP policy 'random'"):
        Routing(get_fabric("lab-small"), "random")
