"""A slow, obvious reference model of the simulator's go-back-N, for one flow.

The scenario: one flow of `size_bytes` from a sender NIC through one switch to a receiver
NIC, `cc = none`, PFC and ECN off. The sender's link (rate_in_bps, delay_in_ps) feeds the
switch; the switch's egress to the receiver (rate_out_bps, delay_out_ps) is slower and
drops at its buffer. Nothing else shares the ports, so the model needs no interleaving.

The rules, as `fabric/sim/kernel.py` states them (this module does not call it):

- The sender sends its next packet (min(mtu, unsent) bytes, the lowest offset not yet
  sent) back to back at line rate: a packet of w wire bytes (payload + DATA_OVERHEAD_BYTES)
  takes ceil(w * 8e12 / rate) ps; there is no window, everything may be in flight.
- A packet arrives at the switch one serialization plus the link delay after it starts.
  Drop-tail: it is dropped if the bytes waiting at the egress (not the one being sent)
  plus its own wire bytes exceed the buffer; else it waits in FIFO order and is sent when
  the port is free. It reaches the receiver one serialization plus the delay after.
- The receiver takes data only in order (its byte offset is the delivered count). Data
  past a gap is discarded and the first such packet sends one NAK, not again until an
  in-order packet arrives; an old duplicate (below the delivered count) does nothing; no
  NAK once the flow is done. A NAK (ACK_WIRE_BYTES) travels back over both links.
- A NAK for offset o reaching the sender: unless the flow is done, if o is below what has
  been sent, it is sent again from o (the resent bytes are sent - o) and the time noted;
  an idle sender starts at once (or when its port frees).
- A drop at time t for offset o: at t + rto, if the sender has not gone back since t and
  the receiver has not got o, the sender goes back to what the receiver has.
- The flow completes when the last byte is delivered.

Events at the same picosecond run in the order the kernel schedules them (its sequence
numbers): the model keys each event on the time the kernel would schedule it (a packet's
arrival when its link starts sending it, a NAK's arrival when the switch sends it on, a
timeout at the drop, the sender's next packet when it starts the one before). Where that
too is equal the model refuses the scenario (`Tie`) rather than guess.
`selective=True` models the other recovery: one rto after a drop the sender sends that
many bytes more (at the end of what it sends) and the receiver counts data in any order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from fabric.sim.layout import ACK_WIRE_BYTES, DATA_OVERHEAD_BYTES


class Tie(Exception):
    """Two events at the same picosecond whose order would change the outcome."""


def ser_ps(wire_bytes: int, rate_bps: int) -> int:
    return -(-wire_bytes * 8 * 10**12 // rate_bps)


@dataclass
class Outcome:
    resent_bytes: int
    end_ps: int | None  # None: not done by `until_ps`
    drops: int
    naks: int
    delivered_bytes: int


def one_flow(
    size_bytes: int,
    mtu_bytes: int,
    rate_in_bps: int,
    delay_in_ps: int,
    rate_out_bps: int,
    delay_out_ps: int,
    buffer_bytes: int,
    rto_ps: int,
    *,
    selective: bool = False,
    until_ps: int | None = None,
) -> Outcome:
    # (time, when the kernel would schedule it, push order, kind, payload): at one
    # picosecond the kernel runs events in the order they were scheduled
    events: list[tuple] = []
    order = 0

    def at(t, scheduled, kind, payload=0):
        nonlocal order
        heapq.heappush(events, (t, scheduled, order, kind, payload))
        order += 1

    unsent = size_bytes
    busy_until = 0  # when the sender's port frees
    emitting = False  # an emission is scheduled
    last_emit = 0
    rewind_ps = -1
    egress: list[tuple[int, int, int]] = []  # accepted: (start, when scheduled, wire bytes)
    egress_free = 0
    delivered = 0
    naked = False
    done_ps = None
    resent = drops = naks = 0

    def emit(t):
        nonlocal unsent, busy_until, emitting, last_emit, egress_free, drops
        emitting = False
        last_emit = t
        size = min(mtu_bytes, unsent)
        unsent -= size
        offset = size_bytes - unsent - size
        wire = size + DATA_OVERHEAD_BYTES
        busy_until = t + ser_ps(wire, rate_in_bps)
        if unsent > 0:
            emitting = True
            at(busy_until, t, "emit")
        arrive = busy_until + delay_in_ps
        waiting = 0
        for start, scheduled, w in egress:
            if start == arrive and scheduled == t:
                raise Tie(f"a packet reaches the switch as the egress frees, at {arrive} ps")
            if start > arrive or (start == arrive and scheduled > t):
                waiting += w
        if waiting + wire > buffer_bytes:
            drops += 1
            at(arrive + rto_ps, arrive, "rto", offset)
            return
        start = max(arrive, egress_free)
        # sent at once if the port is idle, else by a tx event scheduled as the packet
        # before it started
        scheduled = -1 if start == arrive else start - ser_ps(egress[-1][2], rate_out_bps)
        egress.append((start, scheduled, wire))
        egress_free = start + ser_ps(wire, rate_out_bps)
        at(egress_free + delay_out_ps, start, "deliver", (offset, size))

    def wake(t):
        if emitting:
            return
        if busy_until > t:
            at(busy_until, last_emit, "emit")
        else:
            emit(t)

    def go_back(offset, t):
        nonlocal unsent, resent, rewind_ps
        if done_ps is not None:
            return
        sent = size_bytes - unsent
        if offset < sent:
            rewind_ps = t
            resent += sent - offset
            unsent = size_bytes - offset
            wake(t)

    emit(0)
    while events:
        t, scheduled, _, kind, payload = heapq.heappop(events)
        if until_ps is not None and t > until_ps:
            break
        if events and events[0][:2] == (t, scheduled):
            raise Tie(f"two events at {t} ps scheduled at the same time")
        if kind == "emit":
            emit(t)
        elif kind == "rto":
            lost_at = t - rto_ps
            if selective:
                lost = min(mtu_bytes, size_bytes - payload)
                unsent += lost
                resent += lost
                wake(t)
            elif rewind_ps < lost_at and delivered <= payload:
                go_back(delivered, t)
        elif kind == "nak":
            go_back(payload, t)
        elif kind == "deliver":
            offset, size = payload
            if selective:
                delivered += size
            elif offset == delivered:
                delivered += size
                naked = False
            elif offset > delivered and not naked and done_ps is None:
                naked = True
                naks += 1
                back = ser_ps(ACK_WIRE_BYTES, rate_out_bps) + delay_out_ps
                at(
                    t + back + ser_ps(ACK_WIRE_BYTES, rate_in_bps) + delay_in_ps,
                    t + back,
                    "nak",
                    delivered,
                )
            if delivered >= size_bytes and done_ps is None:
                done_ps = t
    return Outcome(resent, done_ps, drops, naks, delivered)
