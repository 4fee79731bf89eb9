"""Collectives in time: the simulator against NCCL's cost model, and against causality.

NCCL's model (NVIDIA/nccl src/graph/tuning.cc) is the formula tests/test_nccl.py writes
out from the source, independently of the product's tables (`reference_us`), for a
communicator whose every rank is its own node (aifabric's flat collectives: every step
crosses the network).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aifabric import topologies, traffic
from aifabric.sim import Simulation
from aifabric.traffic import nccl
from tests.test_nccl import hierarchical_us, reference_us

KiB, MiB = 2**10, 2**20


def nccl_model_us(kind, algorithm, protocol, n, size, line_bps):
    return reference_us(kind, algorithm, protocol, n, n, size, line_bps)


def simulate(fabric, kind, algorithm, protocol, n, size, **job):
    """The op's time in us on an idle fabric (it starts at 0), and its flow table."""
    spec = dict(collective=kind, algorithm=algorithm, protocol=protocol, size=size, gpus=n, **job)
    flows = traffic.generate(fabric, traffic.workload_from_dict(spec, "timing"), seed=1)
    sim = Simulation(fabric, flows, cc="none")
    assert sim.run()
    sim.close()
    end = sim.flow_records()["end_ns"]
    assert (end >= 0).all()
    return int(end.max()) / 1e3, flows


@pytest.fixture(scope="module")
def medium():
    return topologies.load_fabric("lab-medium")


def line_bps(fabric) -> int:
    return int(fabric.port_rate_bps[fabric.nic_port[0]])


CASES = [
    (kind, algorithm, protocol)
    for kind, algorithm in (
        ("allreduce", "ring"),
        ("allreduce", "tree"),
        ("allgather", "ring"),
        ("reducescatter", "ring"),
    )
    for protocol in ("simple", "ll", "ll128")
]


# How far the simulator may be from the model: 10%, as the issue asks, for every ring and
# every tree but two. Trees (NCCL's double binary tree, the op's flows from a NIC sharing
# its protocol's rate, each connection NCCL's buffer), measured on 2026-12-05: 19 of the
# 21 cases at 16 and 128 ranks within 10% (0.918x-1.093x). The two outside it:
# - Simple at 128 ranks and 64 KiB, 1.145x: the model is below the causal floor (the
#   first piece's 7 levels up and down, `test_a_trees_first_piece_takes_what_the_model_
#   leaves_out`), so no causal simulator can come within 10% of it there;
# - LL128 at 16 ranks and 1 MiB, 0.844x: the two trees overlap latency and transfer,
#   which the model adds.
TOLERANCE = (0.10, 0.10)  # (faster, slower)
OUTSIDE = {
    ("tree", "simple", 128, 64 * KiB): (0.10, 0.17),
    ("tree", "ll128", 16, MiB): (0.18, 0.10),
}


def check_time(got, want, case=()):
    """`case`: (algorithm, protocol, ranks, size), for the two cases OUTSIDE the 10%."""
    faster, slower = OUTSIDE.get(case, TOLERANCE)
    assert want * (1 - faster) <= got <= want * (1 + slower), (got, want)


@pytest.mark.parametrize("kind, algorithm, protocol", CASES)
@pytest.mark.parametrize("size", [64 * KiB, MiB, 16 * MiB])
def test_uncongested_ops_take_nccls_model_time(medium, kind, algorithm, protocol, size):
    """16 ranks, one per NIC, on an idle fabric: NCCL's cost model's time."""
    n = 16
    got, flows = simulate(medium, kind, algorithm, protocol, n, size)
    assert flows.op_protocol.tolist() == [protocol] and flows.op_algorithm.tolist() == [algorithm]
    want = nccl_model_us(kind, algorithm, protocol, n, size, line_bps(medium))
    check_time(got, want, (algorithm, protocol, n, size))


@pytest.mark.slow
@pytest.mark.parametrize("kind, algorithm, protocol", CASES)
@pytest.mark.parametrize("n, size", [(16, 256 * MiB), (128, 64 * KiB), (128, MiB), (128, 16 * MiB)])
def test_uncongested_ops_take_nccls_model_time_large(medium, kind, algorithm, protocol, n, size):
    got, _ = simulate(medium, kind, algorithm, protocol, n, size)
    want = nccl_model_us(kind, algorithm, protocol, n, size, line_bps(medium))
    check_time(got, want, (algorithm, protocol, n, size))


@pytest.mark.parametrize("size", [16 * MiB, pytest.param(256 * MiB, marks=pytest.mark.slow)])
def test_a_trees_senders_wait_for_room_in_their_receivers_buffer(medium, size):
    """A leaf's input is always there: were it not held to its connection's buffer (NCCL's, LL:
    256 KiB of data), it would take its NIC's rate from the other tree, where the same NIC is
    inner and its children wait for it, and that tree would end late (1.20x the model at
    16 MiB, 1.19x at 256 MiB)."""
    got, _ = simulate(medium, "allreduce", "tree", "ll", 16, size)
    want = nccl_model_us("allreduce", "tree", "ll", 16, size, line_bps(medium))
    assert want * 0.9 <= got <= want * 1.1, (got, want)


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter"])
@pytest.mark.parametrize("protocol", ["simple", "ll", "ll128"])
@pytest.mark.parametrize("size", [64 * KiB, MiB, 16 * MiB])
def test_hierarchical_rings_take_their_rails_time(medium, kind, protocol, size):
    """16 GPUs in 2 servers of one rack: a ring per rail over the servers, 1/8 of the data each,
    and the NVLink steps' latency inside them (tests/test_nccl.py `hierarchical_us`). Over more
    racks the rails' flows meet on the uplinks ECMP gives them: congestion, not the model."""
    got, _ = simulate(medium, kind, "ring", protocol, 16, size, hierarchical=True)
    want = hierarchical_us(kind, "ring", protocol, 2, 8, size, line_bps(medium))
    assert want * 0.9 <= got <= want * 1.1, (got, want)


@pytest.mark.parametrize("protocol", ["ll", "ll128"])
def test_a_tree_over_ranks_not_a_power_of_two_takes_the_models_latency(medium, protocol):
    """24 ranks: NCCL's trees are 5 levels deep and its model charges log2i(24) = 4 network
    latencies each way; the levels share them (1.17x and 1.25x the model when every level
    paid a whole latency)."""
    got, _ = simulate(medium, "allreduce", "tree", protocol, 24, 64 * KiB)
    want = nccl_model_us("allreduce", "tree", protocol, 24, 64 * KiB, line_bps(medium))
    assert want * 0.9 <= got <= want * 1.1, (got, want)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reducescatter"])
@pytest.mark.parametrize("protocol", ["simple", "ll", "ll128"])
def test_rings_over_an_ai_zone_take_nccls_model_time(kind, protocol):
    """3,072 ranks, one per NIC of ai-zone, 64 KiB: 6,142 (or 3,071) dependent steps, each
    at NCCL's latency (measured 1.006x-1.017x the model; 20-60 CPU s each here)."""
    zone = topologies.load_fabric("ai-zone")
    got, _ = simulate(zone, kind, "ring", protocol, 3072, 64 * KiB)
    check_time(got, nccl_model_us(kind, "ring", protocol, 3072, 64 * KiB, line_bps(zone)))


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["ll", "ll128"])
def test_trees_over_an_ai_zone_take_nccls_model_time(protocol):
    """3,072 ranks, 1 MiB: trees 12 levels deep against the model's log2i(3072) = 11
    (1.07x and 1.06x the model when every level paid a whole latency, 1.01x now)."""
    zone = topologies.load_fabric("ai-zone")
    got, _ = simulate(zone, "allreduce", "tree", protocol, 3072, MiB)
    want = nccl_model_us("allreduce", "tree", protocol, 3072, MiB, line_bps(zone))
    assert want * 0.95 <= got <= want * 1.05, (got, want)


def test_auto_runs_what_nccls_model_picks(medium):
    """`auto` runs the argmin of the model (written out in tests/test_nccl.py) and takes
    its time."""
    line = line_bps(medium)
    for size in (64 * KiB, 16 * MiB):
        want = min(
            ((a, p) for a in ("tree", "ring") for p in ("ll", "ll128", "simple")),
            key=lambda ap: nccl_model_us("allreduce", ap[0], ap[1], 16, size, line),
        )
        got, flows = simulate(medium, "allreduce", "auto", "auto", 16, size)
        assert (flows.op_algorithm[0], flows.op_protocol[0]) == want
        check_time(got, nccl_model_us("allreduce", *want, 16, size, line))


def causal_floor_us(kind, algorithm, protocol, n, size, flows, fabric) -> float:
    """The chain of dependent steps: each at least its step latency and its chunk's
    serialization: its first packet at the line rate, the rest at the protocol's (a paced
    sender waits its gap after a packet, not before; the hops' propagation adds to that)."""
    terms = nccl.terms(nccl.DEFAULT, kind, algorithm, protocol, n, size, 1)
    lat_ns, base_ns = terms.step_latency_ns, terms.base_latency_ns
    steps = int(flows.group_steps.max())
    chunk = int(flows.group_bytes.max()) / steps
    first = min(chunk, int(fabric.link_mtu_bytes.max()))
    line = line_bps(fabric)
    serial_us = (first / line + (chunk - first) / (line * terms.rate_factor)) * 8e6
    if algorithm == "ring":
        chain = int(flows.group_loop.max())  # each step of a loop waits for the one before
    else:
        height = int(math.floor(math.log2(n)))
        chain = 2 * height  # a piece goes up and comes back down
    return base_ns / 1e3 + chain * (lat_ns / 1e3 + serial_us)


def test_a_trees_first_piece_takes_what_the_model_leaves_out(medium):
    """NCCL's model charges a tree level its latency alone. A piece also crosses the level:
    its serialization (the first packet at the line rate, the rest at the protocol's) and
    the path's propagation and store-and-forward. On 128 ranks and 64 KiB of Simple (32 KiB
    pieces, 14 levels up and down) that floor alone is over 1.1x the model, so no causal
    simulator is within 10% of it there. The simulator ends within 5% of the floor (3.7%:
    each NIC also sends its pieces of the other tree, from the same protocol's rate)."""
    kind, algorithm, protocol, n, size = "allreduce", "tree", "simple", 128, 64 * KiB
    got, flows = simulate(medium, kind, algorithm, protocol, n, size)
    terms = nccl.terms(nccl.DEFAULT, kind, algorithm, protocol, n, size, 1)
    sim = Simulation(medium, flows, cc="none")  # for the routes it gives the streams
    line = line_bps(medium)
    mtu = int(medium.link_mtu_bytes.max())
    piece = int(flows.group_bytes.max()) // int(flows.group_steps.max())
    serial_ns = (mtu / line + (piece - mtu) / (line * terms.rate_factor)) * 8e9
    hop_ns = {}
    for x in range(flows.n_groups):  # each stream's piece: its latency, serialization, path
        f = int(np.flatnonzero(flows.group == x)[0])
        ports = sim.path_port[sim.path_ptr[f] : sim.path_ptr[f + 1]]
        forward = (len(ports) - 1) * mtu * 8e9 / line  # each switch holds a whole packet
        hop_ns[x] = terms.step_latency_ns + serial_ns + medium.port_delay_ns[ports].sum() + forward
    sim.close()
    done = {}
    for _ in range(flows.n_groups):  # the longest chain of streams, input to output
        for x in range(flows.n_groups):
            ins = flows.group_in[flows.group_in_ptr[x] : flows.group_in_ptr[x + 1]]
            done[x] = max([0.0] + [done.get(int(i), 0.0) for i in ins]) + hop_ns[x]
    floor_us = (terms.base_latency_ns + max(done.values())) / 1e3
    want = nccl_model_us(kind, algorithm, protocol, n, size, line)
    assert floor_us > 1.1 * want
    assert floor_us <= got <= 1.05 * floor_us, (got, floor_us, want)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    case=st.sampled_from(CASES),
    n=st.integers(2, 24),
    size=st.integers(1, 8 * MiB),
)
def test_no_collective_beats_its_causal_floor(medium, case, n, size):
    """Whatever the size and rank count, an op takes at least its dependent steps' time."""
    kind, algorithm, protocol = case
    got, flows = simulate(medium, kind, algorithm, protocol, n, size)
    assert got >= causal_floor_us(kind, algorithm, protocol, n, size, flows, medium) * 0.999


def test_an_ops_flows_from_one_nic_share_its_protocols_rate(medium):
    """A protocol's cap binds an op's flows from one NIC together, as its NIC's queue pairs
    share the proxy's rate: with one flow of 1 MB and one of 3 MB at half the line rate the
    small one ends after 2 MB of the pacer's time and the large one then has the whole cap
    (4/3 of its time alone), not a quarter each to the end (twice its time alone)."""
    from aifabric.traffic.flows import FlowTable

    nics = [int(x) for x in medium.nic_ids[:3]]

    def run(sizes):
        k = len(sizes)
        table = FlowTable.build(
            {"src": [nics[0]] * k, "dst": nics[1 : 1 + k], "bytes": sizes,
             "sqpn": [1, 2][:k], "dqpn": [1, 2][:k], "sport": [49152, 49153][:k]},
            [[] for _ in range(k)],
            {"op_id": [0], "op_job": [0], "op_kind": ["allgather"], "op_algorithm": ["ring"],
             "op_bytes": [sum(sizes)], "op_ranks": [2], "op_busbw_factor": [1.0],
             "op_rate_factor": [0.5]},
        )  # fmt: skip
        sim = Simulation(medium, table, cc="none")
        assert sim.run()
        sim.close()
        return sim.flow_records()["end_ns"]

    (alone,) = run([3_000_000])
    small, large = run([1_000_000, 3_000_000])
    assert large / alone == pytest.approx(4 / 3, rel=0.03)
    assert small / alone == pytest.approx(2 / 3, rel=0.03)


def test_a_paced_nic_port_looks_again_when_a_flow_may_send_not_when_its_frame_is_out(medium):
    """LL128 sends below the NIC's line rate (its op's pacer), so a NIC port is free before
    any of its flows may send again. Once it has put a frame out, its one pending look is
    at the first moment one of its flows may send (that flow's gap, its op's pacer), not
    at the frame's end, where it would find nothing and have to look again: one wake-up
    per packet, not two. Checked at moments through the op against the flows' own times;
    a port with a control frame queued or a PFC frame due looks when the frame is out."""
    from aifabric.sim import layout as L

    spec = dict(collective="allreduce", algorithm="ring", protocol="ll128", size=4 * MiB, gpus=8)
    flows = traffic.generate(medium, traffic.workload_from_dict(spec, "paced"), seed=1)
    sim = Simulation(medium, flows, cc="none")
    at_send, at_free = 0, 0
    for until_ns in range(3_000, 60_000, 1_100):
        if sim.run(until_ns=until_ns):
            break
        now, fl, pt, nd = int(sim.g[L.G_NOW_PS]), sim.fl, sim.pt, sim.nd
        for v in medium.nic_ids:
            p = int(medium.nic_port[v])
            free_at = int(pt[p, L.PT_FREE_AT_PS])
            if free_at <= now or pt[p, L.PT_HEAD0] >= 0 or pt[p, L.PT_PFC_PENDING] >= 0:
                continue
            off, cnt = int(nd[v, L.ND_OFF]), int(nd[v, L.ND_CNT])
            times = []
            for f in sim.act[off : off + cnt]:
                t = int(fl[f, L.FL_NEXT_SEND_PS])
                pacer = int(fl[f, L.FL_PACER]) - 1
                if pacer >= 0:
                    t = max(t, int(fl[pacer, L.FL_PACE_PS]))
                times.append(t)
            if not times or min(times) <= free_at:
                continue  # a flow may send as the frame ends
            assert pt[p, L.PT_TXEV_PS] in (free_at, min(times))
            at_send += pt[p, L.PT_TXEV_PS] == min(times)
            at_free += pt[p, L.PT_TXEV_PS] == free_at
    # a step's release while the frame is out asks for a look at its end (`kick`): rare
    assert at_send > 20 and at_free <= at_send // 10, (at_send, at_free)
