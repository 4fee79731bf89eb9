"""The shared-buffer switch (sim/buffer.py): the admission rule against a reference
model (tests/buffer_reference.py), and in the simulator: dynamic thresholds that follow the
free pool, an incast bounded by the pool, PFC at the threshold, drops of the lossy class."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aifabric.engines import scenario_features
from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import ALPHA_SCALE, EcnProfile, PfcProfile, QueueProfile, Role
from aifabric.fabric.model import required_headroom_bytes as required_headroom
from aifabric.scenarios import load_scenario
from aifabric.sim import Simulation, buffer
from aifabric.sim import layout as L
from aifabric.sim.engine import features
from aifabric.sim.pfc import ADMIT, ADMIT_XOFF, DROP
from aifabric.topologies import build
from aifabric.topologies.spec import parse
from tests import buffer_reference as ref
from tests.conftest import fabric as preset
from tests.simhelp import flows, run

MTU = 4096
WIRE = MTU + L.DATA_OVERHEAD_BYTES
SWITCHES = (Role.RTSW, Role.CTSW, Role.ATSW)


def switches(fab, **changes):
    """The fabric with every switch queue profile changed (`pfc` a dict of PfcProfile
    fields)."""
    queues = dict(fab.queues)
    pfc = changes.pop("pfc", {})
    for role in SWITCHES:
        q = fab.queue(role)
        queues[role] = dataclasses.replace(q, pfc=dataclasses.replace(q.pfc, **pfc), **changes)
    return dataclasses.replace(fab, queues=queues)


def switch_of(fab, nic) -> int:
    return int(fab.port_node[fab.nic_port[nic] ^ 1])


def port_to(fab, nic) -> int:
    """The switch's port towards `nic` (its egress queue to it)."""
    return int(fab.nic_port[nic]) ^ 1


# the admission rule against the reference model ------------------------------------------

VERDICT = {ADMIT: "admit", ADMIT_XOFF: "xoff", DROP: "drop"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    buffer_bytes=st.integers(20_000, 400_000),
    alpha_q16=st.sampled_from([ALPHA_SCALE // 8, ALPHA_SCALE // 2, ALPHA_SCALE, 2 * ALPHA_SCALE]),
    reserved=st.sampled_from([0, 1500, 9000]),
    headroom=st.sampled_from([5000, 20_000]),
    xon_offset=st.sampled_from([0, 3000]),
    ops=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(64, 4200)),
        min_size=1,
        max_size=120,
    ),
)
def test_the_admission_rule_is_the_reference_models(
    buffer_bytes, alpha_q16, reserved, headroom, xon_offset, ops
):
    """Frames arrive and leave at random on a switch of 4 ports (lossy egress queues of both
    classes, lossless ingress counts): every verdict, pause and resume, the pool in use, each
    port's count and headroom are the reference model's."""
    n = 4
    if 2 * n * reserved > buffer_bytes:
        reserved = 0
    pt = np.zeros((n, L.PT_N), dtype=np.int64)
    nd = np.zeros((1, L.ND_N), dtype=np.int64)
    pt[:, L.PT_PFC_ON] = 1
    pt[:, L.PT_RESERVED_BYTES] = reserved
    pt[:, L.PT_HEADROOM_BYTES] = headroom
    pt[:, L.PT_XON_OFFSET_BYTES] = xon_offset
    nd[0, L.ND_SB_SIZE] = buffer_bytes - 2 * n * reserved
    nd[0, L.ND_SB_ALPHA] = alpha_q16
    model = ref.Switch(buffer_bytes, n, alpha_q16, reserved, headroom, xon_offset)
    queued = {}  # (kind, port, class) -> FIFO of wire sizes
    for op, port, wire in ops:
        if op == 0:  # a lossy frame for class `cls` of the port (control or lossy data)
            cls = wire % 2
            got = bool(buffer.admit_egress(pt, nd, port, cls, wire))
            assert got == model.lossy_arrives(port, cls, wire)
            if got:
                pt[port, L.PT_Q0_BYTES + cls] += wire
                queued.setdefault(("egress", port, cls), []).append(wire)
        elif op == 1:  # a lossless frame over the port's link
            got = VERDICT[buffer.admit_lossless(pt, nd, port, wire)]
            assert got == model.lossless_arrives(port, wire)
            if got != "drop":
                queued.setdefault(("ingress", port, 0), []).append(wire)
        else:  # the oldest frame of some counter leaves
            busy = sorted(k for k, v in queued.items() if v)
            if not busy:
                continue
            kind, p, cls = busy[(port + wire) % len(busy)]
            w = queued[(kind, p, cls)].pop(0)
            if kind == "egress":
                pt[p, L.PT_Q0_BYTES + cls] -= w
                buffer.release_egress(pt, nd, p, cls, w)
                model.lossy_leaves(p, cls, w)
            else:
                assert bool(buffer.release_lossless(pt, nd, p, w)) == model.lossless_leaves(p, w)
        assert nd[0, L.ND_SB_USED] == model.used()
        assert 0 <= nd[0, L.ND_SB_USED] <= nd[0, L.ND_SB_SIZE]
        for p in range(n):
            assert pt[p, L.PT_ING_BYTES] == model.ingress.get(p, 0)
            assert pt[p, L.PT_HDRM_BYTES] == model.held.get(p, 0)
            assert pt[p, L.PT_HDRM_BYTES] <= headroom
            assert pt[p, L.PT_XOFF] == (p in model.paused)


# the simulator ---------------------------------------------------------------------------


def pool_in_use(sim) -> np.ndarray:
    """Each switch's shared bytes in use as its counters say: the parts above the reserve of
    every lossy egress queue (control; data without PFC) and lossless ingress count."""
    pt, f = sim.pt, sim.fabric
    r = pt[:, L.PT_RESERVED_BYTES]
    lossy = pt[:, L.PT_Q0_BYTES] + np.where(pt[:, L.PT_PFC_ON] == 1, 0, pt[:, L.PT_Q1_BYTES])
    parts = np.maximum(lossy - r, 0) + np.maximum(pt[:, L.PT_ING_BYTES] - r, 0)
    parts = np.where(pt[:, L.PT_SHARED] == 1, parts, 0)
    return np.bincount(f.port_node, weights=parts, minlength=f.n_nodes).astype(np.int64)


def lossy_incasts(fab, receivers, senders_each):
    """One incast into each receiver from `senders_each` NICs of the receivers' rack."""
    nics = [int(n) for n in fab.nic_ids[:16]]  # one rack of lab-medium
    others = [n for n in nics if n not in receivers]
    src, dst = [], []
    for j, r in enumerate(receivers):
        mine = others[j * senders_each : (j + 1) * senders_each]
        src += mine
        dst += [r] * len(mine)
    return flows(src, dst, 512 * 1024)


def test_a_lossy_queue_is_limited_to_alpha_times_the_free_pool_and_drops_above_it():
    """PFC off, one pool of B bytes, alpha = 1, no reserve: a lone congested queue admits a
    frame while it stays within the free pool, so it peaks within a frame of B/2 and drops
    the rest; a second congested queue on the same switch takes from the same pool and the
    limit of each falls to within two frames of B/3."""
    pool = 1 << 20
    fab = switches(
        preset("lab-medium"),
        buffer_bytes=pool,
        alpha=1.0,
        ecn=EcnProfile(0, 0, 0.0, enabled=False),
        pfc=dict(enabled=False),
    )
    r1, r2 = int(fab.nic_ids[0]), int(fab.nic_ids[1])
    alone = run(fab, lossy_incasts(fab, [r1], 4), cc_params={"loss_recovery": "selective"})
    both = run(fab, lossy_incasts(fab, [r1, r2], 4), cc_params={"loss_recovery": "selective"})
    q_alone = alone.port_samples()["qdepth_max_bytes"][:, port_to(fab, r1)].max()
    series = both.port_samples()["qdepth_max_bytes"]
    q_both = [series[:, port_to(fab, r)].max() for r in (r1, r2)]
    assert alone.counters()["drops"] > 0 and both.counters()["drops"] > 0
    assert (pool - WIRE) / 2 <= q_alone <= (pool + WIRE) / 2
    for q in q_both:
        assert (pool - 3 * WIRE) / 3 <= q <= (pool + 3 * WIRE) / 3
    for sim in (alone, both):  # the pool's account is its counters'
        assert (sim.nd[:, L.ND_SB_USED] == pool_in_use(sim)).all()


def incast_31_to_1(fab):
    """Into the first NIC of lab-medium: its 15 rack mates and 16 NICs of other racks (over
    the rack switch's 16 uplinks): 31 ingress ports of one switch feed one egress."""
    nics = [int(n) for n in fab.nic_ids]
    senders = nics[1:16] + nics[16:32]
    return flows(senders, [nics[0]] * len(senders), 1_000_000)


def test_a_31_to_1_incast_with_pfc_stays_within_the_pool_and_is_lossless():
    fab = preset("lab-medium")
    q = fab.queue(Role.RTSW)
    assert q.model == "shared"  # the default
    sim = run(fab, incast_31_to_1(fab))
    c = sim.counters()
    assert c["drops"] == 0 and c["pfc_frames"] > 0 and c["flows_done"] == 31
    deepest = sim.port_samples()["qdepth_max_bytes"][:, port_to(fab, fab.nic_ids[0])].max()
    bound = q.buffer_bytes + 31 * q.pfc.headroom_bytes  # the pool and every headroom
    assert deepest <= bound
    # the per-port model lets the same queue grow far beyond: 31 ingresses' XOFF each
    static = run(switches(fab, model="static"), incast_31_to_1(fab))
    static_deepest = static.port_samples()["qdepth_max_bytes"][:, port_to(fab, fab.nic_ids[0])]
    assert static_deepest.max() > bound
    # every byte given back: nothing is left in the fabric, and pool, ingress counts and
    # headroom are all empty
    assert not sim.pt[:, L.PT_Q0_BYTES].any() and not sim.pt[:, L.PT_Q1_BYTES].any()
    assert not sim.nd[:, L.ND_SB_USED].any()
    assert not sim.pt[:, L.PT_ING_BYTES].any() and not sim.pt[:, L.PT_HDRM_BYTES].any()


def test_pfc_fires_at_the_dynamic_threshold_and_the_configured_headroom_keeps_it_lossless():
    """Two NICs of a rack send to a third: the two ingress ports fill the pool B alike, so
    the first to pause does so at the threshold (its shared bytes reach alpha x the free
    pool, nothing in its headroom yet), within two frames of B/3 for alpha = 1; what
    arrives after it goes to the headroom the links need, and nothing is dropped."""
    pool = 1 << 20
    base = preset("lab-medium")
    rate, delay = int(base.link_rate_bps[0]), int(base.link_delay_ns.max())
    fab = switches(
        base,
        buffer_bytes=pool,
        alpha=1.0,
        pfc=dict(headroom_bytes=required_headroom(rate, delay, MTU)),
    )
    nics = [int(n) for n in fab.nic_ids]
    sim = Simulation(fab, flows(nics[1:3], [nics[0], nics[0]], 2 << 20))
    s = switch_of(fab, nics[0])
    ingress = [port_to(fab, n) for n in nics[1:3]]
    first, held_most = [], [0]

    def look(_):
        held_most[0] = max(held_most[0], *(int(sim.pt[k, L.PT_HDRM_BYTES]) for k in ingress))
        for k in ingress:
            if sim.pt[k, L.PT_XOFF] and not first:
                part = int(sim.pt[k, L.PT_ING_BYTES])
                free = int(sim.nd[s, L.ND_SB_SIZE] - sim.nd[s, L.ND_SB_USED])
                first.append((part, free, int(sim.pt[k, L.PT_HDRM_BYTES])))

    assert sim.run(progress=look, slice_events=1)
    part, free, held = first[0]
    assert held == 0  # paused by the threshold, not by a frame that went to the headroom
    assert part >= free  # its shared bytes reached alpha x the free pool
    assert part <= free + WIRE  # ... with the frame that crossed it
    assert abs(part - pool / 3) <= 2 * WIRE
    # what was still on the wire after the pause went to the headroom, not to the pool
    assert 0 < held_most[0] <= fab.queue(Role.RTSW).pfc.headroom_bytes
    c = sim.counters()
    assert c["drops"] == 0 and c["pfc_frames"] > 0


def test_too_little_headroom_drops_lossless_frames_and_counts_them():
    """The same 31-to-1 incast with one frame of headroom per port: what the uplinks (500 ns
    of cable) still carry after a pause overflows it; those frames are dropped and counted,
    and go-back-N resends them."""
    fab = switches(preset("lab-medium"), pfc=dict(headroom_bytes=MTU + 100))
    sim = run(fab, incast_31_to_1(fab))
    c = sim.counters()
    assert c["drops"] > 0 and c["flows_done"] == 31
    assert sim.port_samples()["drops"].sum() == c["drops"]
    # the pool's account is its counters' (frames may still be queued at the end)
    assert (sim.nd[:, L.ND_SB_USED] == pool_in_use(sim)).all()


# keys, profiles and validation -------------------------------------------------------------

TOPOLOGY = """
[fabric]
kind = "two-tier"
[servers]
gpus_per_server = 2
servers_per_rack = 2
[zone]
racks = 2
ctsw_planes = 1
"""


def queues(text: str):
    return parse(TOPOLOGY + text, "t").queues


def test_the_model_and_profiles_are_chosen_per_tier_and_overridable():
    q = queues('[queue.rtsw]\nprofile = "tomahawk3"\n[queue.ctsw]\nprofile = "jericho2"\n')
    assert (q[Role.RTSW].model, q[Role.RTSW].buffer_bytes) == ("shared", 64 * 2**20)
    assert (q[Role.CTSW].model, q[Role.CTSW].buffer_bytes) == ("static", 8 * 2**30 // 12)
    assert q[Role.NIC].buffer_bytes == 4 * 2**20  # a profile sets switches only
    q = queues('[queue]\nbuffer = "2MiB"\n[queue.rtsw]\nprofile = "tomahawk3"\nalpha = 0.5\n')
    assert (q[Role.RTSW].buffer_bytes, q[Role.RTSW].alpha) == (2 * 2**20, 0.5)
    q = queues('[queue]\nmodel = "static"\nreserved = "9KiB"\npfc_xon_offset = "4KiB"\n')
    assert q[Role.CTSW].model == "static" and q[Role.CTSW].reserved_bytes == 9 * 1024
    assert q[Role.CTSW].pfc.xon_offset_bytes == 4096
    assert queues("")[Role.RTSW].model == "shared"


@pytest.mark.parametrize(
    "text, says",
    [
        ('model = "fancy"', "queue model = 'fancy' is not one of shared, static"),
        ('profile = "tomahawk9"', "queue.rtsw.profile = 'tomahawk9' is not one of"),
        ("alpha = 0", "alpha must be above 0"),
        ("alpha = 100", "must be at most 64"),
        ('reserved = "8MiB"', "reserved (8388608 B) must be between 0 and the buffer"),
        ('model = "shared"\necn_kmax = "8MiB"', "ECN kmax (8388608 B) exceeds the buffer"),
    ],
)
def test_bad_buffer_keys_are_refused_in_one_sentence(text, says):
    with pytest.raises(SpecError) as e:
        queues("[queue]\n" + text + "\n")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_reserved_minimums_the_pool_cannot_hold_are_refused():
    spec = parse(TOPOLOGY + '[queue]\nbuffer = "64KiB"\nreserved = "16KiB"\necn = false\n', "t")
    with pytest.raises(SpecError, match="cannot hold the reserved minimums"):
        build(spec)


@pytest.mark.parametrize("model", ["shared", "static"])
def test_a_60000_byte_buffer_with_a_60000_byte_xoff_is_accepted(model):
    q = QueueProfile(
        60_000,
        EcnProfile(0, 0, 0.0, enabled=False),
        PfcProfile(60_000, 50_000, 20_000),
        model=model,
    )
    assert q.buffer_bytes == q.pfc.xoff_bytes == 60_000


def test_the_shared_model_does_not_check_xoff_against_the_buffer_and_the_static_one_does():
    ecn = EcnProfile(0, 0, 0.0, enabled=False)
    QueueProfile(60_000, ecn, PfcProfile(90_000, 50_000, 20_000), model="shared")
    with pytest.raises(SpecError, match="PFC xoff"):
        QueueProfile(60_000, ecn, PfcProfile(90_000, 50_000, 20_000), model="static")


def test_run_json_says_which_buffer_model_ran():
    sc = load_scenario("incast-pfc")
    said = features(sc)["queues.buffer"]
    assert said.state == "implemented"
    assert "rtsw: shared, one 4MiB pool per switch, dynamic thresholds alpha = 1" in said.how
    static = dataclasses.replace(sc, fabric=switches(sc.fabric, model="static"))
    said = features(static)["queues.buffer"]
    assert said.state == "approximated" and "rtsw: static, 4MiB per port" in said.how
    assert scenario_features(static)["queues.buffer"] == "switch buffers: rtsw static, ctsw static"


def test_a_pool_whose_threshold_could_overflow_is_refused():
    ecn = EcnProfile(0, 0, 0.0, enabled=False)
    with pytest.raises(SpecError, match="a shared queue buffer holds at most"):
        QueueProfile(2**41, ecn, PfcProfile(1000, 500, 20_000))
    assert QueueProfile(2**41, ecn, PfcProfile(1000, 500, 20_000), model="static").buffer_bytes
    for alpha in (float("nan"), float("inf"), 0.0, 1e-6):
        with pytest.raises(SpecError, match="alpha must be above 0"):
            QueueProfile(2**20, ecn, PfcProfile(1000, 500, 20_000), alpha=alpha)
