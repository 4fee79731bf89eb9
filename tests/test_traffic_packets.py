"""The packetization kernel against a slow, obvious reference."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from aifabric import topologies, traffic
from aifabric.fabric.errors import AifabricError
from aifabric.traffic.flow_packets import FIRST, LAST


def reference_packets(flows, rate_bps, mtu, overhead=0):
    """Packet by packet, with exact fractions for time; PSN per (src, sQPN) in flow order."""
    from fractions import Fraction

    psn_next: dict[tuple[int, int], int] = {}
    rows = []
    rates = np.broadcast_to(np.asarray(rate_bps), (len(flows.src),))
    for f in range(len(flows.src)):
        qp = (int(flows.src[f]), int(flows.sqpn[f]))
        psn = psn_next.get(qp, 0)
        t = Fraction(int(flows.start_ns[f]))
        left = int(flows.bytes[f])
        msg = int(flows.msg_bytes[f]) or left
        while left > 0:
            m = min(msg, left)
            left -= m
            first = True
            while m > 0:
                pay = min(mtu, m)
                m -= pay
                flags = (FIRST if first else 0) | (LAST if m == 0 else 0)
                rows.append(
                    (int(t), f, int(flows.src[f]), int(flows.dst[f]), int(flows.sport[f]),
                     int(flows.dqpn[f]), psn, pay, flags)
                )  # fmt: skip
                first = False
                t += Fraction((pay + overhead) * 8 * 10**9, int(rates[f]))
                psn = (psn + 1) & 0xFFFFFF
        psn_next[qp] = psn
    return rows


def as_rows(p):
    cols = (p.time_ns, p.flow, p.src, p.dst, p.sport, p.qpn, p.psn, p.bytes, p.flags)
    return [tuple(int(c[i]) for c in cols) for i in range(len(p))]


def random_flows(rng, n):
    src = rng.integers(0, 4, n)
    return SimpleNamespace(
        src=src.astype(np.int32),
        dst=(src + 1).astype(np.int32),
        sport=rng.integers(0xC000, 0x10000, n).astype(np.int32),
        sqpn=rng.integers(0x100, 0x104, n).astype(np.int32),  # QPs shared by several flows
        dqpn=rng.integers(0x100, 1 << 24, n).astype(np.int32),
        bytes=rng.integers(0, 30_000, n).astype(np.int64),
        msg_bytes=rng.choice([0, 1000, 4096, 5000], n).astype(np.int64),
        start_ns=rng.integers(0, 10_000, n).astype(np.int64),
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mtu, overhead", [(4096, 0), (1024, 62), (1500, 7)])
def test_kernel_equals_reference(seed, mtu, overhead):
    rng = np.random.default_rng(seed)
    flows = random_flows(rng, 30)
    rate = rng.choice([100 * 10**9, 400 * 10**9, 3 * 10**9 + 7], 30)
    got = traffic.packetize(flows, rate, mtu, overhead_bytes=overhead)
    assert as_rows(got) == reference_packets(flows, rate, mtu, overhead)


def test_packets_of_a_flow_table():
    fabric = topologies.load_fabric("lab-small")
    w = traffic.workload_from_dict(
        dict(collective="allreduce", algorithm="ring", size="1MiB", qps=2, chunk="64KiB"), "p"
    )
    table = traffic.generate(fabric, w, seed=3)
    p = traffic.packetize(table, 100 * 10**9, 4096)
    assert int(p.bytes.sum()) == int(table.bytes.sum())
    assert as_rows(p) == reference_packets(table, 100 * 10**9, 4096)
    assert np.count_nonzero(p.first) == np.count_nonzero(p.last)
    assert p.bytes.max() <= 4096


def test_bad_rates_and_mtus_are_one_sentence():
    flows = random_flows(np.random.default_rng(0), 3)
    with pytest.raises(AifabricError, match="rate"):
        traffic.packetize(flows, 0, 4096)
    with pytest.raises(AifabricError, match="MTU"):
        traffic.packetize(flows, 10**9, 0)
