"""Egress queues: per port, a strict-priority control FIFO (class 0) and a lossless data
FIFO (class 1), linked through the packets' PK_NEXT; depth statistics kept as they change.
"""

from __future__ import annotations

from numba import njit

from aifabric.sim.layout import (
    PK_NEXT,
    PK_WIRE_BYTES,
    PT_HEAD0,
    PT_Q0_BYTES,
    PT_Q1_BYTES,
    PT_S_QINT_BYTE_PS,
    PT_S_QMAX_BYTES,
    PT_S_QT_PS,
    PT_TAIL0,
)


@njit(cache=True, inline="always")
def depth_bytes(pt, p):
    return pt[p, PT_Q0_BYTES] + pt[p, PT_Q1_BYTES]


@njit(cache=True)
def settle(pt, p, now):
    """Bring the depth integral of port p up to `now` (before the depth changes)."""
    pt[p, PT_S_QINT_BYTE_PS] += depth_bytes(pt, p) * (now - pt[p, PT_S_QT_PS])
    pt[p, PT_S_QT_PS] = now


@njit(cache=True, inline="always")
def enqueue(pt, pk, p, cls, i, now):
    """Append packet i to class `cls` of port p. Inlined: every hop queues a packet, and a
    call passes each array one field at a time."""
    settle(pt, p, now)
    head = PT_HEAD0 + 2 * cls
    tail = PT_TAIL0 + 2 * cls
    pk[i, PK_NEXT] = -1
    if pt[p, tail] < 0:
        pt[p, head] = i
    else:
        pk[pt[p, tail], PK_NEXT] = i
    pt[p, tail] = i
    pt[p, PT_Q0_BYTES + cls] += pk[i, PK_WIRE_BYTES]
    d = depth_bytes(pt, p)
    if d > pt[p, PT_S_QMAX_BYTES]:
        pt[p, PT_S_QMAX_BYTES] = d


@njit(cache=True)
def dequeue(pt, pk, p, cls, now):
    """Remove and return the head of class `cls` of port p (the caller checked it exists)."""
    settle(pt, p, now)
    head = PT_HEAD0 + 2 * cls
    i = pt[p, head]
    nxt = pk[i, PK_NEXT]
    pt[p, head] = nxt
    if nxt < 0:
        pt[p, PT_TAIL0 + 2 * cls] = -1
    pt[p, PT_Q0_BYTES + cls] -= pk[i, PK_WIRE_BYTES]
    return i


@njit(cache=True)
def fifo_check(pt, pk, p, cls):
    """Walk class `cls` of port p: its byte count, or -1 when the links are inconsistent."""
    total = 0
    i = pt[p, PT_HEAD0 + 2 * cls]
    last = -1
    while i >= 0:
        total += pk[i, PK_WIRE_BYTES]
        last = i
        i = pk[i, PK_NEXT]
    if last != pt[p, PT_TAIL0 + 2 * cls]:
        return -1
    return total
