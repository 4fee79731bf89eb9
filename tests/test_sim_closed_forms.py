"""The simulator against closed forms: line rate, incast shares, PFC, RED, DCQCN, rings, ECMP."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from aifabric.fabric.completion import collective_records
from aifabric.fabric.model import EcnProfile, QueueProfile, Role
from aifabric.fabric.routing import Routing
from aifabric.sim import Simulation
from aifabric.sim import layout as L
from tests.conftest import fabric as preset
from tests.simhelp import ack_return_ps, flows, path_latency_ps, run, transfer_ps

MTU = 4096


def with_queue(fab, buffer_bytes=None, ecn=None, pfc=None, model=None):
    """The fabric with every switch queue profile changed."""
    queues = {}
    for role in (Role.RTSW, Role.CTSW, Role.ATSW):
        q = fab.queue(role)
        queues[role] = QueueProfile(
            buffer_bytes or q.buffer_bytes,
            dataclasses.replace(q.ecn, **(ecn or {})),
            dataclasses.replace(q.pfc, **(pfc or {})),
            q.lossless_priority,
            q.control_priority,
            model or q.model,
        )
    return dataclasses.replace(fab, queues=queues)


def test_one_flow_reaches_line_rate_and_fct_is_size_over_rate_plus_latency():
    fab = preset("lab-small")
    nics = fab.nic_ids
    size = 400 * MTU
    sim = run(fab, flows([nics[0]], [nics[-1]], size))
    rec = sim.flow_records()
    ports = sim.path_port[sim.path_ptr[0] : sim.path_ptr[1]]
    rate = int(fab.port_rate_bps[ports[0]])
    # the flow ends when the ACK of its last packet is back at the sender
    expected_ps = (
        transfer_ps(size, MTU, rate) + path_latency_ps(fab, ports, MTU) + ack_return_ps(fab, ports)
    )
    fct_ps = (rec["end_ns"][0] - rec["start_ns"][0]) * L.PS_PER_NS
    assert fct_ps == pytest.approx(expected_ps, rel=0.01)
    # line rate: the NIC port sent back to back (wire bytes over the transfer time)
    series = sim.port_samples()
    sent = series["tx_bytes"][:, ports[0]].sum()
    assert sent == size + 400 * L.DATA_OVERHEAD_BYTES
    assert sent * 8e12 / transfer_ps(size, MTU, rate) == pytest.approx(rate, rel=1e-6)


def test_incast_with_pfc_is_lossless_and_fair():
    fab = preset("lab-medium")
    nics = fab.nic_ids
    senders = [int(n) for n in nics[1:9]]  # the receiver's rack: one ingress port each
    size = 4096 * MTU
    sim = Simulation(fab, flows(senders, [int(nics[0])] * len(senders), size))
    sim.run(until_ns=500_000)  # past the first pauses, then many XOFF / XON cycles
    before = sim.fl[:, L.FL_DELIV_BYTES].copy()
    sim.run(until_ns=2_500_000)
    got = sim.fl[:, L.FL_DELIV_BYTES] - before
    assert sim.run()
    c = sim.counters()
    assert c["drops"] == 0
    assert c["pfc_frames"] > 0
    assert c["flows_done"] == len(senders)
    rate = int(fab.link_rate_bps[0])
    goodput = rate * MTU / (MTU + L.DATA_OVERHEAD_BYTES)
    share = got * 8 / 2e-3 / goodput  # each sender's part of the bottleneck
    assert share == pytest.approx(np.full(len(senders), 1 / len(senders)), rel=0.02)


@pytest.mark.parametrize("recovery", ["go-back-n", "selective"])
def test_incast_without_pfc_and_a_small_buffer_drops_and_still_completes(recovery):
    fab = with_queue(
        preset("lab-small"),
        buffer_bytes=64 * 1024,
        ecn={"kmin_bytes": 16 * 1024, "kmax_bytes": 48 * 1024},
        pfc={"enabled": False, "xoff_bytes": 32 * 1024, "xon_bytes": 16 * 1024,
             "headroom_bytes": 16 * 1024},
    )  # fmt: skip
    nics = fab.nic_ids
    senders = [int(n) for n in nics[4:12]]
    table = flows(senders, [int(nics[0])] * len(senders), 64 * MTU)
    sim = run(fab, table, cc_params={"loss_recovery": recovery})
    c = sim.counters()
    assert c["drops"] > 0
    assert c["pfc_frames"] == 0
    assert c["flows_done"] == len(senders) and c["loss_recovery"] == recovery
    # what the senders' links carried: every byte once, plus what was sent again
    series = sim.port_samples()
    wire = series["tx_bytes"][:, fab.nic_port[senders]].sum()
    assert wire == (len(senders) * 64 * MTU + c["retransmitted_bytes"]) // MTU * (
        MTU + L.DATA_OVERHEAD_BYTES
    )
    if recovery == "selective":  # exactly what was lost
        assert c["retransmitted_bytes"] == c["drops"] * MTU
    else:  # from each loss on, all that followed: more than what was lost
        assert c["retransmitted_bytes"] > c["drops"] * MTU
    assert series["qdepth_max_bytes"].max() <= 64 * 1024


def test_a_queue_held_above_kmin_is_marked_with_the_red_probability():
    kmin, kmax, pmax = 200 * 1024, 1200 * 1024, 0.2
    fab = with_queue(
        preset("lab-small"),
        buffer_bytes=8 * 2**20,
        ecn={"kmin_bytes": kmin, "kmax_bytes": kmax, "pmax": pmax},
        pfc={"xoff_bytes": 300 * 1024, "xon_bytes": 290 * 1024, "headroom_bytes": 64 * 1024},
    )
    nics = fab.nic_ids
    senders = [int(n) for n in nics[1:4]]  # the receiver's rack: one ingress port each
    sim = run(fab, flows(senders, [int(nics[0])] * 3, 3000 * MTU), sample_interval_ns=2_000, seed=7)
    s = sim.port_samples()
    bottleneck = int(fab.nic_port[nics[0]]) ^ 1
    depth = s["qdepth_mean_bytes"][:, bottleneck].astype(float)
    marks = s["ecn_marked"][:, bottleneck]
    packets = s["tx_bytes"][:, bottleneck] / (MTU + L.DATA_OVERHEAD_BYTES)
    held = depth > kmin + 100 * 1024  # the queue is held around 3 x xoff
    assert held.sum() > 50
    profile = EcnProfile(kmin, kmax, pmax)
    p = np.array([profile.probability(d + (MTU + L.DATA_OVERHEAD_BYTES) / 2) for d in depth[held]])
    expected = float((packets[held] * p).sum())
    sigma = math.sqrt(float((packets[held] * p * (1 - p)).sum()))
    assert abs(marks[held].sum() - expected) < 4 * sigma + 0.02 * expected
    assert marks[~held & (depth < kmin / 2)].sum() <= 0.01 * marks.sum()


def test_two_dcqcn_flows_converge_near_fair_share():
    fab = preset("lab-small")
    nics = fab.nic_ids
    table = flows([nics[4], nics[8]], [nics[0], nics[0]], 40_000_000, start_ns=[0, 200_000])
    params = {"rate_timer": "10us", "additive_increase": "1G", "hyper_increase": "2G"}
    sim = Simulation(fab, table, cc="dcqcn", cc_params=params)
    sim.run(until_ns=1_500_000)
    before = sim.fl[:, L.FL_DELIV_BYTES].copy()
    sim.run(until_ns=2_500_000)
    got = sim.fl[:, L.FL_DELIV_BYTES] - before
    assert sim.counters()["cnp_sent"] > 10
    rate = int(fab.link_rate_bps[0])
    assert got.sum() * 8 / 1e-3 == pytest.approx(
        rate * MTU / (MTU + L.DATA_OVERHEAD_BYTES), rel=0.05
    )
    assert got[0] / got[1] == pytest.approx(1.0, abs=0.1)


def ring_allreduce(nics, size, mtu):
    """Ring AllReduce, one flow per rank and step; step k of rank r waits for step k - 1
    of rank r - 1 (the chunk it forwards) and of rank r (its own previous send)."""
    n = len(nics)
    chunk = size // n
    steps = 2 * (n - 1)
    src, dst, deps = [], [], []
    for k in range(steps):
        for r in range(n):
            src.append(nics[r])
            dst.append(nics[(r + 1) % n])
            deps.append([] if k == 0 else [(k - 1) * n + (r - 1) % n, (k - 1) * n + r])
    ops = {
        "op_id": [0], "op_job": [0], "op_kind": ["allreduce"], "op_algorithm": ["ring"],
        "op_bytes": [size], "op_ranks": [n], "op_busbw_factor": [2 * (n - 1) / n],
    }  # fmt: skip
    return flows(src, dst, chunk, deps=deps, ops=ops, op=[0] * len(src)), chunk, steps


def test_ring_allreduce_matches_the_alpha_beta_model():
    fab = preset("lab-small")
    nics = [int(x) for x in fab.nic_ids]
    size = len(nics) * 64 * MTU
    table, chunk, steps = ring_allreduce(nics, size, MTU)
    sim = run(fab, table)
    rec = sim.flow_records()
    coll = collective_records(sim.flows, rec["start_ns"], rec["end_ns"])
    rate = int(fab.link_rate_bps[0])
    # alpha: the longest ring hop (rack to rack over a spine); beta: wire bytes at line rate
    longest = max(
        (sim.path_port[sim.path_ptr[i] : sim.path_ptr[i + 1]] for i in range(len(nics))), key=len
    )
    # alpha: to the last byte's arrival (the next step, of the same op, starts then); the
    # op ends when the last step's ACK is back at its sender (finish = sender)
    alpha = path_latency_ps(fab, longest, MTU)
    model_ps = steps * (alpha + transfer_ps(chunk, MTU, rate)) + ack_return_ps(fab, longest)
    took_ps = (coll["end_ns"][0] - coll["start_ns"][0]) * L.PS_PER_NS
    assert took_ps == pytest.approx(model_ps, rel=0.02)
    assert coll["busbw_bps"][0] == pytest.approx(
        size * 8e9 / (took_ps / 1e3) * 2 * (len(nics) - 1) / len(nics)
    )


def test_completion_slows_exactly_where_5tuple_hashing_puts_two_flows_on_one_link():
    fab = preset("lab-medium")
    nics = [int(x) for x in fab.nic_ids]
    # six flows out of rack 0, each into another rack: they can meet only on rack 0's
    # 16 uplinks, where the hash of their 5-tuple puts them
    src = nics[0:6]
    dst = [nics[16 * r] for r in range(1, 7)]
    routing = Routing(fab, "5tuple", 3)
    rng = np.random.default_rng(0)
    for _ in range(50):
        sport = 0xC000 + rng.integers(0, 0x3FFF, len(src))
        paths = routing.paths(src, dst, sport)
        counts = paths.port_counts(fab.n_ports)
        shared = np.array([(counts[paths.of(i)] > 1).any() for i in range(len(src))])
        if 0 < shared.sum() < len(src) and counts.max() == 2:
            break
    else:
        pytest.fail("no placement with both shared and private paths")
    size = 200 * MTU
    sim = run(fab, flows(src, dst, size, sport=sport), ecmp="5tuple", seed=3)
    rec = sim.flow_records()
    fct = rec["end_ns"] - rec["start_ns"]
    alone = fct[~shared].max()
    assert fct[~shared] == pytest.approx(np.full((~shared).sum(), alone), rel=0.01)
    assert (fct[shared] > 1.8 * alone).all()
    assert (fct[shared] < 2.2 * alone).all()


def test_the_same_seed_gives_identical_outputs_and_another_seed_differs():
    fab = preset("lab-small")
    nics = fab.nic_ids
    table = flows(nics[4:12], [nics[0]] * 8, 100 * MTU)

    def once(seed):
        sim = run(fab, table, cc="dcqcn", seed=seed, sample_interval_ns=5_000)
        return sim.flow_records(), sim.port_samples()

    a, b, c = once(5), once(5), once(6)
    for key in a[0]:
        assert np.array_equal(a[0][key], b[0][key]), key
    for key in a[1]:
        assert np.array_equal(a[1][key], b[1][key]), key
    assert not np.array_equal(a[1]["ecn_marked"], c[1]["ecn_marked"])
