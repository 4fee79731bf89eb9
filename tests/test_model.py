import numpy as np
import pytest

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import (
    EcnProfile,
    FabricBuilder,
    PfcProfile,
    QueueProfile,
    Role,
    required_headroom_bytes,
)


def test_ports_and_adjacency_agree_with_links(get_fabric):
    f = get_fabric("lab-medium")
    assert f.n_ports == 2 * f.n_links
    assert np.array_equal(f.port_node[0::2], f.link_a)
    assert np.array_equal(f.port_peer[0::2], f.link_b)
    for v in range(f.n_nodes):
        ports = f.ports_of(v)
        assert (f.port_node[ports] == v).all()
        assert list(f.port_number[ports]) == list(range(len(ports)))
    assert np.bincount(f.port_node, minlength=f.n_nodes).sum() == f.n_ports
    link = f.link(5)
    assert (link.a, link.b) == (f.port_node[10], f.port_peer[10])
    assert f.port(11).peer == link.a and f.port(11).number == link.b_port


def test_nics_know_their_switch_and_port(get_fabric):
    f = get_fabric("ai-zone")
    nic = f.node_id("z0-r7-h1-nic3")
    assert f.node_name[f.nic_switch[nic]] == "z0-r7-rtsw"
    assert f.port_node[f.nic_port[nic]] == nic
    assert f.node(nic).role == Role.NIC and f.node(nic).rack == 7 and f.node(nic).rail == 3
    # Downlinks are added first, so an RTSW's NIC ports have the low numbers.
    assert f.port_number[f.nic_port[nic] ^ 1] == 8 + 3


def test_the_networkx_view_matches_the_columns(get_fabric):
    f = get_fabric("lab-small")
    g = f.graph()
    assert g.number_of_nodes() == f.n_nodes and g.number_of_edges() == f.n_links
    assert g.nodes[f.node_id("z0-ctsw1")]["role"] == "ctsw"
    a, b = int(f.link_a[20]), int(f.link_b[20])
    assert g.edges[a, b, 20]["rate_bps"] == f.link_rate_bps[20]


def test_fabric_columns_are_read_only(get_fabric):
    f = get_fabric("lab-small")
    with pytest.raises(ValueError):
        f.link_rate_bps[0] = 1


def test_builder_rejects_duplicate_names_and_self_links():
    b = FabricBuilder("x", "test")
    b.node("a", Role.NIC)
    b.node("a", Role.RTSW)
    with pytest.raises(SpecError, match="names two nodes alike"):
        b.build()
    b = FabricBuilder("x", "test")
    n = b.node("a", Role.NIC)
    b.link(n, n, 1, 1, 1)
    with pytest.raises(ValueError, match="itself"):
        b.build()


def test_ecn_probability_is_red():
    ecn = EcnProfile(kmin_bytes=100, kmax_bytes=300, pmax=0.2)
    assert ecn.probability(50) == 0
    assert ecn.probability(100) == 0
    assert ecn.probability(200) == pytest.approx(0.1)
    assert ecn.probability(300) == pytest.approx(0.2)
    assert ecn.probability(301) == 1
    assert EcnProfile(100, 300, 0.2, enabled=False).probability(1000) == 0


def test_queue_profiles_check_their_thresholds():
    ecn = EcnProfile(100, 200, 0.1)
    pfc = PfcProfile(xoff_bytes=1000, xon_bytes=500, headroom_bytes=200)
    assert QueueProfile(2000, ecn, pfc).lossless_priority == 3
    with pytest.raises(SpecError, match="must differ"):
        QueueProfile(2000, ecn, pfc, lossless_priority=6)
    with pytest.raises(SpecError, match="xon < xoff"):
        PfcProfile(xoff_bytes=10, xon_bytes=10, headroom_bytes=0)
    with pytest.raises(SpecError, match="pmax"):
        EcnProfile(1, 2, 1.5)


def test_xoff_fits_the_buffer_and_headroom_is_reserved_apart():
    ecn = EcnProfile(10_000, 50_000, 0.1)
    pfc = PfcProfile(xoff_bytes=60_000, xon_bytes=50_000, headroom_bytes=20_000)
    assert QueueProfile(60_000, ecn, pfc).pfc.xoff_bytes == 60_000  # other simulators' setup
    with pytest.raises(SpecError, match=r"PFC xoff \(60000 B\) exceeds the buffer \(59999 B\)"):
        QueueProfile(59_999, ecn, pfc, model="static")
    # the shared model pauses at its dynamic threshold, below the pool: no XOFF to check
    assert QueueProfile(59_999, ecn, pfc, model="shared").pfc.xoff_bytes == 60_000
    off = PfcProfile(xoff_bytes=60_000, xon_bytes=50_000, headroom_bytes=20_000, enabled=False)
    assert QueueProfile(59_999, ecn, off).buffer_bytes == 59_999  # unused with PFC off


def test_ecn_thresholds_meet_the_buffer_only_with_ecn_on():
    pfc = PfcProfile(xoff_bytes=1000, xon_bytes=500, headroom_bytes=200)
    with pytest.raises(SpecError, match=r"ECN kmax \(5000 B\) exceeds the buffer \(2000 B\)"):
        QueueProfile(2000, EcnProfile(100, 5000, 0.1), pfc)
    assert not QueueProfile(2000, EcnProfile(100, 5000, 0.1, enabled=False), pfc).ecn.enabled
    with pytest.raises(SpecError, match="kmin <= kmax"):
        EcnProfile(300, 200, 0.1, enabled=False)  # still a pair of thresholds


def test_pfc_headroom_covers_a_round_trip_at_line_rate():
    # 400 Gb/s over 1 us of cable each way: 100,000 bytes in flight, plus two frames.
    assert required_headroom_bytes(400 * 10**9, 1000, 4096) == 100_000 + 2 * 4196


def test_every_port_has_one_name_that_resolves_back_to_it(get_fabric):
    fabric = get_fabric("lab-medium")
    names = fabric.port_names
    assert len(set(names)) == fabric.n_ports
    for p in range(fabric.n_ports):
        assert fabric.port_id(names[p]) == p
        node, _, peer = names[p].partition("#")[0].partition("--")
        assert fabric.node_id(node) == fabric.port_node[p]
        assert fabric.node_id(peer) == fabric.port_peer[p]
    # lab-medium doubles the RTSW uplinks: the second parallel port is numbered
    assert any(n.endswith("#2") for n in names)
    nic = fabric.node_name[int(fabric.nic_ids[0])]
    assert fabric.port_id(nic) == fabric.nic_port[fabric.nic_ids[0]]


def test_a_port_name_that_does_not_exist_is_one_sentence(get_fabric):
    fabric = get_fabric("lab-small")
    sw = fabric.node_name[int(fabric.switch_ids[0])]
    for bad, says in ((sw, "is a switch"), ("nope--x", "no node named 'nope'"), ("zz", "no port")):
        with pytest.raises(SpecError, match=says):
            fabric.port_id(bad)
