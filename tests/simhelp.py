"""Helpers for the simulator tests: small flow tables and closed-form timings."""

from __future__ import annotations

import numpy as np

from aifabric.sim import Simulation
from aifabric.sim.layout import ACK_WIRE_BYTES, DATA_OVERHEAD_BYTES, PS_PER_NS
from aifabric.traffic.flows import FlowTable


def flows(src, dst, nbytes, *, sport=None, deps=None, start_ns=None, ops=None, op=None):
    n = len(src)
    cols = {
        "src": np.asarray(src),
        "dst": np.asarray(dst),
        "bytes": np.broadcast_to(np.asarray(nbytes, dtype=np.int64), (n,)).copy(),
        "sqpn": np.arange(n) + 100,
        "dqpn": np.arange(n) + 1000,
        "sport": (0xC000 + np.arange(n)) if sport is None else np.asarray(sport),
    }
    if start_ns is not None:
        cols["start_ns"] = np.asarray(start_ns)
    if op is not None:
        cols["op"] = np.asarray(op)
    return FlowTable.build(cols, deps if deps is not None else [[] for _ in range(n)], ops or {})


def wire_ps(payload: int, rate_bps: int) -> float:
    """Serialization of one data packet of `payload` bytes, in ps (not rounded)."""
    return (payload + DATA_OVERHEAD_BYTES) * 8e12 / rate_bps


def transfer_ps(nbytes: int, mtu: int, rate_bps: int) -> float:
    """All packets of a transfer back to back on one link."""
    full, rest = divmod(nbytes, mtu)
    return full * wire_ps(mtu, rate_bps) + (wire_ps(rest, rate_bps) if rest else 0.0)


def path_latency_ps(fabric, ports, mtu_payload: int) -> float:
    """Propagation over every link plus store-and-forward of one full packet per switch."""
    delay = sum(int(fabric.port_delay_ns[p]) for p in ports) * PS_PER_NS
    sf = sum(wire_ps(mtu_payload, int(fabric.port_rate_bps[p])) for p in ports[1:])
    return delay + sf


def ack_return_ps(fabric, ports, ack_bytes: int = ACK_WIRE_BYTES) -> int:
    """An ACK from the end of the route `ports` back to its start over idle links: on each
    hop, its serialization (rounded up to the ps, as the simulator does) and the delay."""
    total = 0
    for p in ports:
        back = int(p) ^ 1
        rate = int(fabric.port_rate_bps[back])
        total += -(-ack_bytes * 8 * 10**12 // rate) + int(fabric.port_delay_ns[back]) * PS_PER_NS
    return total


def run(fabric, table, **kw) -> Simulation:
    sim = Simulation(fabric, table, **kw)
    assert sim.run()
    sim.close()
    return sim
