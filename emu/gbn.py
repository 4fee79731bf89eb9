"""Go-back-N as the replay runs it: the receiver's and the sender's decisions, per flow.

The same rules as the simulator's (sim/kernel.py `deliver`, `go_back`,
`data_timeout`; checked against tests/gbn_reference.py), in PSNs of whole
packets instead of byte offsets:

- the receiver takes a data packet only if it carries the PSN it expects; past a
  gap it drops what comes and NAKs the PSN it expects, once per gap (until a
  packet is taken again); an old duplicate does nothing;
- a NAK sends the sender back to the PSN it names if that lies behind where it
  is (a NAK never moves it forward: what it would skip goes out again and the
  receiver drops it as a duplicate);
- a timeout (no packet taken for the RTO while data is outstanding: sent and not
  yet taken) sends the sender back to the PSN the receiver expects, by the NAK's
  rule. The simulator times it from the loss itself, which only it sees; the
  replay, as a NIC, from the last progress. The simulator's sender goes back to what
  its ACKs said the receiver had; the replay sends no ACKs and reads what the
  receiver expects, which is where the ACKs lead once they are back.

PSNs here are unwrapped (they count from 0); the wire carries their low 24 bits.
"""

from __future__ import annotations

PSN_MASK = 0xFFFFFF
PSN_HALF = 0x800000  # a PSN up to this far ahead (mod 2^24) is ahead, further is behind


def receive(expect: int, nak_for: int, psn24: int) -> tuple[bool, int]:
    """The receiver expecting PSN `expect`, which last NAKed `nak_for` (-1: none), got a data
    packet of PSN `psn24` (24 bits): (taken, the PSN to NAK or -1)."""
    ahead = (psn24 - expect) & PSN_MASK
    if ahead == 0:
        return True, -1
    if ahead < PSN_HALF and nak_for != expect:
        return False, expect
    return False, -1


def unwrap(psn24: int, high: int) -> int:
    """The unwrapped PSN whose low 24 bits are `psn24`, at most `high` (one past the highest
    sent): a NAK names a PSN the sender has sent or the next one."""
    return high - ((high - psn24) & PSN_MASK)


def go_back_to(psn: int, high: int, psn24: int) -> int | None:
    """The sender at PSN `psn` (next to send), `high` one past the highest it sent, got a NAK
    of `psn24` (or timed out with the receiver expecting it): the PSN to send next, or None
    to go on where it is."""
    full = unwrap(psn24, high)
    return full if full < psn else None


def timed_out(now: float, progress: float, rto: float, high: int, expect: int) -> bool:
    """Is the flow's retransmission timeout due: data outstanding (sent up to `high`, taken
    up to `expect`) and no progress (a packet taken, or a go-back) since `rto` ago?"""
    return high > expect and now - progress >= rto
