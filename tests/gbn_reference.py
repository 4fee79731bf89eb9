"""A slow, obvious reference model of the simulator's go-back-N through one switch.

The scenario: flows from sender NICs (one flow each) through one switch to one receiver
NIC, `cc = none`, PFC and ECN off. Each sender's link feeds the switch; the switch's
egress to the receiver is slower than what arrives and drops at its buffer.

The rules, as `sim/kernel.py` states them (this module does not call it):

- The sender sends its next packet (min(mtu, unsent) bytes, the lowest offset not yet
  sent) back to back at line rate: a packet of w wire bytes (payload + DATA_OVERHEAD_BYTES)
  takes ceil(w * 8e12 / rate) ps; there is no window, everything may be in flight.
- A packet arrives at the switch one serialization plus the link delay after it starts.
  Drop-tail: it is dropped if the bytes waiting at the egress (not the one being sent)
  plus its own wire bytes exceed the buffer; else it waits in FIFO order and is sent when
  the port is free. It reaches the receiver one serialization plus the delay after.
- The receiver takes data only in order (its byte offset is the delivered count). Data
  past a gap is discarded and the first such packet sends one NAK, not again until an
  in-order packet arrives; no NAK once the flow is done. An old duplicate (below the
  delivered count) is acknowledged at once (an ACK, below), as a responder answers a
  duplicate request. A NAK (ACK_WIRE_BYTES) travels back over both links.
- A NAK for offset o reaching the sender: unless the sender has heard the ACK of the last
  byte (whichever end the flow finishes at), if o is below what has been sent, it is sent
  again from o (the resent bytes are sent - o) and the time noted; an idle sender starts
  at once (or when its port frees).
- A drop at time t for offset o: at t + rto, if the sender has not gone back since t and
  has not heard the receiver got o (an ACK or a NAK saying it had more than o bytes), the
  sender goes back to the most bytes an ACK or a NAK it got said the receiver had (0 if
  none came). The receiver discarding the flow's last packet past a gap counts as such a
  drop (nothing after it would come to be NAKed).
- ACKs (`ack_every`): the receiver sends one every `ack_every` packets it takes and for
  the last one (None: one per flow, as the last byte arrives). An ACK, like a NAK, goes
  back over both links (ACK_WIRE_BYTES) and carries the bytes the receiver had as it was
  sent. The flow completes when the last byte is
  delivered (`finish_at_sender=False`) or when the ACK of it reaches the sender. Either
  way the sender stops only once it hears that ACK: a NAK or a timeout before then sends
  again what the receiver may already have. The receiver's port and the
  switch's port towards each sender send NAKs and ACKs one at a time (a scenario where
  one would wait for another is refused).

Events at the same picosecond run by kind, as the kernel's event list takes them
(`aifabric.sim.layout.TIE_ORDER`), whenever they were scheduled: first what arrives over a
link (a packet at the switch or the receiver, a NAK or an ACK at the sender), then
timeouts, and last a port starting its next frame. So a packet reaching the switch as its
egress frees finds the next packet still waiting. Arrivals over different links of one
flow change different state and commute; two senders' packets reaching the switch at
one picosecond (which the kernel orders by port) the model refuses (`Tie`) rather than
guess.

`selective=True` models the other recovery: one rto after a drop the sender sends that
many bytes more (at the end of what it sends) and the receiver counts data in any order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from aifabric.sim.layout import ACK_WIRE_BYTES, DATA_OVERHEAD_BYTES

PER_FLOW = None  # ack_every: one ACK per flow


def receiver_takes(offset: int, delivered: int, naked: bool) -> tuple[bool, bool]:
    """Go-back-N's receiver, got data at `offset` having `delivered` bytes in order and
    `naked` (a NAK sent since it last took a packet): (takes it, sends a NAK)."""
    if offset == delivered:
        return True, False
    return False, offset > delivered and not naked


def sender_goes_back(offset: int, sent: int, heard_all: bool) -> bool:
    """Go-back-N's sender, having sent up to `sent`, got a NAK for `offset` (or timed out
    with the receiver at `offset`): does it send again from `offset`? Not once it heard the
    ACK of the last byte (`heard_all`)."""
    return not heard_all and offset < sent


def timeout_goes_back(rewind_ps: int, lost_ps: int, acked: int, offset: int) -> bool:
    """One RTO after data at `offset` was lost at `lost_ps`: does the sender go back (to the
    bytes its ACKs and NAKs said the receiver had, `acked`)? Not if it went back since, or
    heard the receiver has it."""
    return rewind_ps < lost_ps and acked <= offset


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


@dataclass
class Sender:
    """One flow of an incast: its own NIC and link into the switch."""

    size_bytes: int
    rate_bps: int
    delay_ps: int
    start_ps: int


def incast(
    senders: list[Sender],
    mtu_bytes: int,
    rate_out_bps: int,
    delay_out_ps: int,
    buffer_bytes: int,
    rto_ps: int,
    *,
    selective: bool = False,
    until_ps: int | None = None,
    ack_every: int | None = PER_FLOW,
    finish_at_sender: bool = False,
) -> list[Outcome]:
    """Go-back-N (or selective recovery) for flows, each from its own NIC, into one receiver
    through one switch, by the rules above. What they share: the switch's egress to the
    receiver (one FIFO), and the receiver's port, which sends every flow's NAKs and ACKs.
    Events after `until_ps` are not run."""
    # (time, rank of the kind, what it is about, kind, payload): at one picosecond the
    # kernel runs arrivals, then timeouts, then a port's next frame
    events: list[tuple] = []
    rank = {"arrive": 0, "deliver": 0, "nak": 0, "ack": 0, "rto": 1, "emit": 2}

    def at(t, kind, payload):
        f = payload if isinstance(payload, int) else payload[0]
        # arrivals: over sender f's link (2f), the link back to it (2f + 1), the receiver's
        who = -1 if kind == "deliver" else 2 * f + (kind in ("nak", "ack"))
        heapq.heappush(events, (t, rank[kind], who, kind, payload))

    n = len(senders)
    unsent = [s.size_bytes for s in senders]
    busy_until = [0] * n
    emitting = [False] * n
    rewind_ps = [-1] * n
    delivered = [0] * n
    acked = [0] * n  # the sender's: the most bytes an ACK or a NAK said the receiver had
    naked = [False] * n
    unacked = [0] * n
    received_ps: list[int | None] = [None] * n
    done_ps: list[int | None] = [None] * n
    back_free = [0] * n  # the switch's port towards each sender
    resent = [0] * n
    drops = [0] * n
    naks = [0] * n
    egress: list[tuple[int, bool, int]] = []  # accepted: (start, started as it came, wire bytes)
    egress_free = 0
    receiver_free = 0  # the receiver's port, for NAKs and ACKs
    ack_out = ser_ps(ACK_WIRE_BYTES, rate_out_bps)

    def emit(f, t):
        emitting[f] = False
        size = min(mtu_bytes, unsent[f])
        unsent[f] -= size
        offset = senders[f].size_bytes - unsent[f] - size
        wire = size + DATA_OVERHEAD_BYTES
        busy_until[f] = t + ser_ps(wire, senders[f].rate_bps)
        if unsent[f] > 0:
            emitting[f] = True
            at(busy_until[f], "emit", f)
        at(busy_until[f] + senders[f].delay_ps, "arrive", (f, offset, size))

    def wake(f, t):
        if emitting[f]:
            return
        if busy_until[f] > t:
            emitting[f] = True
            at(busy_until[f], "emit", f)
        else:
            emit(f, t)

    def go_back(f, offset, t):
        sent = senders[f].size_bytes - unsent[f]
        if sender_goes_back(offset, sent, acked[f] >= senders[f].size_bytes):
            rewind_ps[f] = t
            resent[f] += sent - offset
            unsent[f] = senders[f].size_bytes - offset
            wake(f, t)

    def control(f, t, nak_offset):
        """The receiver's port sends a NAK (offset) or an ACK (None) of flow f back, each
        with the bytes the receiver has."""
        nonlocal receiver_free
        if receiver_free > t:
            raise Tie(f"the receiver's port is busy at {t} ps (not modelled)")
        receiver_free = t + ack_out
        at_switch = t + ack_out + delay_out_ps
        if back_free[f] > at_switch:
            raise Tie(f"the switch's port to sender {f} is busy at {at_switch} ps (not modelled)")
        s = senders[f]
        back_free[f] = at_switch + ser_ps(ACK_WIRE_BYTES, s.rate_bps)
        back = back_free[f] + s.delay_ps
        if nak_offset is not None:
            at(back, "nak", (f, nak_offset))
        else:
            at(back, "ack", (f, delivered[f]))

    for f, s in enumerate(senders):
        at(s.start_ps, "emit", f)
    while events:
        t, rank_, who, kind, payload = heapq.heappop(events)
        if until_ps is not None and t > until_ps:
            break
        if events and events[0][:3] == (t, rank_, who):
            raise Tie(f"two alike events at {t} ps: {kind} and {events[0][3]}")
        if kind == "arrive" and any(e[:2] == (t, 0) and e[3] == "arrive" for e in events):
            raise Tie(f"two senders' packets reach the switch at {t} ps (ordered by port)")
        if kind == "emit":
            emit(payload, t)
        elif kind == "arrive":
            f, offset, size = payload
            wire = size + DATA_OVERHEAD_BYTES
            # what waits: a packet the egress starts now is still queued, unless it was
            # started as it came (a port's next frame goes after every arrival)
            waiting = sum(w for start, came, w in egress if start > t or (start == t and not came))
            if waiting + wire > buffer_bytes:
                drops[f] += 1
                at(t + rto_ps, "rto", (f, offset, size))
                continue
            start = max(t, egress_free)
            egress.append((start, start == t, wire))
            egress_free = start + ser_ps(wire, rate_out_bps)
            at(egress_free + delay_out_ps, "deliver", (f, offset, size))
        elif kind == "rto":
            f, offset, size = payload
            if selective:
                unsent[f] += size
                resent[f] += size
                wake(f, t)
            elif timeout_goes_back(rewind_ps[f], t - rto_ps, acked[f], offset):
                go_back(f, acked[f], t)
        elif kind == "nak":
            f, offset = payload
            acked[f] = max(acked[f], offset)
            go_back(f, offset, t)
        elif kind == "ack":
            f, had = payload
            acked[f] = max(acked[f], had)
            if finish_at_sender and had >= senders[f].size_bytes and done_ps[f] is None:
                done_ps[f] = t
        elif kind == "deliver":
            f, offset, size = payload
            takes, nak = receiver_takes(offset, delivered[f], naked[f])
            if selective or takes:
                delivered[f] += size
                naked[f] = False
                last = delivered[f] >= senders[f].size_bytes and received_ps[f] is None
                unacked[f] += 1
                if ack_every is not None and (unacked[f] >= ack_every or last):
                    unacked[f] = 0
                    control(f, t, None)
                if last:
                    received_ps[f] = t
                    if ack_every is None:
                        control(f, t, None)
                    if not finish_at_sender:
                        done_ps[f] = t
            else:
                if offset < delivered[f]:  # a duplicate: acknowledged at once
                    unacked[f] = 0
                    control(f, t, None)
                if nak and received_ps[f] is None:
                    naked[f] = True
                    naks[f] += 1
                    control(f, t, delivered[f])
                if offset > delivered[f] and offset + size >= senders[f].size_bytes:
                    at(t + rto_ps, "rto", (f, offset, size))
    return [Outcome(resent[f], done_ps[f], drops[f], naks[f], delivered[f]) for f in range(n)]
