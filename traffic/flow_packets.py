"""Flows into packets: what the Mininet replay sends and what tests compare against.

Each flow is cut into messages of `msg_bytes` (its QP's message size; the
whole flow when 0) and each message into packets of at most `mtu_bytes`
payload; a packet never spans two messages, as on an RDMA NIC. A flow's
packets leave back to back at `rate_bps` from its `start_ns`: a packet's
`time_ns` is when its first bit leaves, each packet occupying
(payload + `overhead_bytes`) x 8 / rate on the wire. PSNs are 24-bit and run
on per QP (source NIC and sQPN) across the flows of that QP in flow order.
`qpn` is the destination QPN, the one the BTH carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from aifabric.fabric._numba_cache import lean_loads
from aifabric.fabric.errors import AifabricError

lean_loads()  # cached kernels load without numba's typing and lowering tables

FIRST = 1  # flag: first packet of a message
LAST = 2  # flag: last packet of a message
PSN_MASK = 0xFFFFFF


@dataclass(frozen=True, eq=False)
class Packets:
    time_ns: np.ndarray  # int64
    flow: np.ndarray  # int64 row of the flow table
    src: np.ndarray  # int32 NIC node id
    dst: np.ndarray  # int32
    sport: np.ndarray  # int32 RoCEv2 UDP source port
    qpn: np.ndarray  # int32 destination QPN
    psn: np.ndarray  # int32
    bytes: np.ndarray  # int32 payload
    flags: np.ndarray  # uint8: FIRST | LAST of a message

    def __len__(self) -> int:
        return len(self.time_ns)

    @property
    def first(self) -> np.ndarray:
        return (self.flags & FIRST) != 0

    @property
    def last(self) -> np.ndarray:
        return (self.flags & LAST) != 0


def packet_counts(nbytes: np.ndarray, msg_bytes: np.ndarray, mtu_bytes: int) -> np.ndarray:
    """Packets per flow: whole messages of ceil(msg/mtu) packets, then the partial message."""
    msg = np.where(msg_bytes > 0, msg_bytes, np.maximum(nbytes, 1))
    full, rest = np.divmod(nbytes, msg)
    return full * (-(-msg // mtu_bytes)) + (-(-rest // mtu_bytes))


@njit(cache=True)
def _fill(
    start_ns, nbytes, msg_bytes, rate_bps, src, dst, sport, qpn, psn0, offset, mtu, overhead,
    o_time, o_flow, o_src, o_dst, o_sport, o_qpn, o_psn, o_bytes, o_flags,
):  # fmt: skip
    for f in range(len(nbytes)):
        o = offset[f]
        rate = rate_bps[f]
        wire_full = (mtu + overhead) * 8_000_000_000
        dq_full = wire_full // rate
        dr_full = wire_full % rate
        t = start_ns[f]
        r = 0
        psn = psn0[f]
        remaining = nbytes[f]
        msg = msg_bytes[f] if msg_bytes[f] > 0 else remaining
        s, d, sp, q = src[f], dst[f], sport[f], qpn[f]
        while remaining > 0:
            left = min(msg, remaining)
            remaining -= left
            flag = 1
            while left > 0:
                pay = min(mtu, left)
                left -= pay
                if left == 0:
                    flag |= 2
                o_time[o] = t
                o_flow[o] = f
                o_src[o] = s
                o_dst[o] = d
                o_sport[o] = sp
                o_qpn[o] = q
                o_psn[o] = psn
                o_bytes[o] = pay
                o_flags[o] = flag
                flag = 0
                if pay == mtu:
                    t += dq_full
                    r += dr_full
                else:
                    wire = (pay + overhead) * 8_000_000_000
                    t += wire // rate
                    r += wire % rate
                if r >= rate:
                    t += 1
                    r -= rate
                psn = (psn + 1) & 0xFFFFFF
                o += 1


def first_psn(src: np.ndarray, sqpn: np.ndarray, counts: np.ndarray, psn_base=None) -> np.ndarray:
    """Each flow's first PSN: packets of earlier flows of the same QP, in flow order."""
    n = len(src)
    key = (np.asarray(src, np.int64) << 24) | (np.asarray(sqpn, np.int64) & PSN_MASK)
    order = np.argsort(key, kind="stable")
    c = np.asarray(counts, np.int64)[order]
    before = np.cumsum(c) - c
    ks = key[order]
    first = np.ones(n, dtype=bool)
    first[1:] = ks[1:] != ks[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = before - before[start] if n else before
    base = 0 if psn_base is None else np.asarray(psn_base, np.int64)
    return (out + base) & PSN_MASK


def packetize(
    flows,
    rate_bps,
    mtu_bytes: int = 4096,
    overhead_bytes: int = 0,
    start_ns=None,
    psn_base=None,
) -> Packets:
    """Packets of every flow of `flows` (a FlowTable, or anything with its columns).

    `rate_bps` is one rate or one per flow; `start_ns` overrides the flows' start
    times (one per flow); `psn_base` is added to every QP's first PSN (per flow).
    """
    n = len(flows.src)
    nbytes = np.asarray(flows.bytes, np.int64)
    msg = np.asarray(getattr(flows, "msg_bytes", np.zeros(n, np.int64)), np.int64)
    if mtu_bytes < 1 or overhead_bytes < 0:
        raise AifabricError(f"packets need a positive MTU, got {mtu_bytes} bytes")
    rate = np.broadcast_to(np.asarray(rate_bps, np.int64), (n,)).copy()
    if n and rate.min() <= 0:
        raise AifabricError(f"packets need a positive rate, got {int(rate.min())} bit/s")
    if n and (nbytes.min() < 0 or msg.min() < 0):
        raise AifabricError("flows with negative bytes cannot be packetized")
    start = np.asarray(flows.start_ns if start_ns is None else start_ns, np.int64)
    start = np.broadcast_to(start, (n,)).copy()
    counts = packet_counts(nbytes, msg, mtu_bytes)
    offset = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offset[1:])
    total = int(offset[-1])
    psn0 = first_psn(flows.src, flows.sqpn, counts, psn_base)
    out = Packets(
        time_ns=np.empty(total, np.int64),
        flow=np.empty(total, np.int64),
        src=np.empty(total, np.int32),
        dst=np.empty(total, np.int32),
        sport=np.empty(total, np.int32),
        qpn=np.empty(total, np.int32),
        psn=np.empty(total, np.int32),
        bytes=np.empty(total, np.int32),
        flags=np.empty(total, np.uint8),
    )
    _fill(
        start, nbytes, msg, rate,
        np.asarray(flows.src, np.int32), np.asarray(flows.dst, np.int32),
        np.asarray(flows.sport, np.int32), np.asarray(flows.dqpn, np.int32),
        psn0, offset, np.int64(mtu_bytes), np.int64(overhead_bytes),
        out.time_ns, out.flow, out.src, out.dst, out.sport, out.qpn, out.psn, out.bytes, out.flags,
    )  # fmt: skip
    return out
