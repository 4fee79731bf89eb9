"""Collectives in time: the simulator against NCCL's cost model, and against causality.

NCCL's model (NVIDIA/nccl src/graph/tuning.cc) is written out here from the source,
independently of the product's tables: an op takes its algorithm x protocol's base
latency, plus a per-step network latency for each dependent step (a ring AllReduce
2(n-1), AllGather and ReduceScatter n-1, a tree AllReduce 2 log2(n) when every rank is
its own node), plus its bytes over the bus bandwidth (nccl-tests' busbw factor times
the size, over the line rate times the protocol's bandwidth factor).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aifabric import topologies, traffic
from aifabric.sim import Simulation

KiB, MiB = 2**10, 2**20
# tuning.cc: baseLat[algorithm][protocol] and hwLat[NCCL_HW_NET][algorithm][protocol], in us
BASE_US = {"ring": {"ll": 6.6, "ll128": 14.0, "simple": 8.4}, "tree": {"ll": 6.8, "ll128": 14.0, "simple": 0.0}}
NET_US = {"ring": {"ll": 2.7, "ll128": 4.0, "simple": 14.0}, "tree": {"ll": 5.0, "ll128": 8.5, "simple": 14.0}}
# its bandwidth refinements for several nodes: ring LL 1/4, LL128 0.92; tree x 0.92, LL 1/3.8,
# LL128 120/128
BW_FACTOR = {
    "ring": {"ll": 1 / 4, "ll128": 0.92, "simple": 1.0},
    "tree": {"ll": 1 / 3.8, "ll128": 120 / 128, "simple": 0.92},
}
BUSBW = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
         "reducescatter": lambda n: (n - 1) / n}  # fmt: skip


def nccl_model_us(kind, algorithm, protocol, n, size, line_bps):
    if algorithm == "ring":
        steps = 2 * (n - 1) if kind == "allreduce" else n - 1
    else:
        steps = 2 * int(math.floor(math.log2(n)))
    latency = BASE_US[algorithm][protocol] + steps * NET_US[algorithm][protocol]
    bus_bytes_per_us = line_bps / 8 / 1e6 * BW_FACTOR[algorithm][protocol]
    return latency + BUSBW[kind](n) * size / bus_bytes_per_us


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


@pytest.mark.parametrize("kind, algorithm, protocol", CASES)
@pytest.mark.parametrize("size", [64 * KiB, MiB])
def test_uncongested_ops_take_nccls_model_time(medium, kind, algorithm, protocol, size):
    """16 ranks, one per NIC: the simulated time is within 10% of NCCL's cost model."""
    n = 16
    got, _ = simulate(medium, kind, algorithm, protocol, n, size)
    want = nccl_model_us(kind, algorithm, protocol, n, size, line_bps(medium))
    assert got == pytest.approx(want, rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("kind, algorithm, protocol", CASES)
@pytest.mark.parametrize("n, size", [(16, 16 * MiB), (16, 256 * MiB), (128, 64 * KiB), (128, MiB), (128, 16 * MiB)])
def test_uncongested_ops_take_nccls_model_time_large(medium, kind, algorithm, protocol, n, size):
    got, _ = simulate(medium, kind, algorithm, protocol, n, size)
    want = nccl_model_us(kind, algorithm, protocol, n, size, line_bps(medium))
    assert got == pytest.approx(want, rel=0.10)


def causal_floor_us(kind, algorithm, protocol, n, size, flows, fabric) -> float:
    """The chain of dependent steps: each at least its step latency and its chunk's
    serialization at the line rate (the hops' propagation adds to that)."""
    from aifabric.traffic.generate import nccl_terms

    terms = nccl_terms(kind, algorithm, protocol, n, size, 1)
    lat_ns, base_ns = terms.step_latency_ns, terms.base_latency_ns
    steps = int(flows.group_steps.max())
    chunk = int(flows.group_bytes.max()) / steps
    serial_us = chunk * 8 / (line_bps(fabric) * terms.rate_factor) * 1e6
    if algorithm == "ring":
        chain = int(flows.group_loop.max())  # each step of a loop waits for the one before
    else:
        height = int(math.floor(math.log2(n)))
        chain = 2 * height  # a piece goes up and comes back down
    return base_ns / 1e3 + chain * (lat_ns / 1e3 + serial_us)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
