"""Both engines mean the same go-back-N: the emulator's replay (its rules, aifabric.emu.gbn, as
replay.py calls them) and the reference model the simulator is checked against
(tests/gbn_reference.py, whose rules match the simulator to the picosecond in
test_sim_go_back_n.py) resend the same packets after the same losses.

No network here: one flow over a scripted channel, in ticks. The sender sends one packet per
tick while it has one to send; a data packet arrives `DELAY` ticks later unless the script
loses that transmission (the k-th of its PSN; lost one tick after it left); a NAK arrives
back `DELAY` ticks after it is sent unless the script loses it. Each engine times its
retransmission timeout its own way (the simulator from the loss, the replay from the last
packet taken) and goes back its own way (the simulator's sender to what its ACKs said the
receiver had, the replay's, whose receivers send no ACKs, to what the receiver expects):
with a timeout far longer than a whole flow's sending, both fire with the sender idle and
every ACK back, so what they resend compares exactly; with a short one, both go back
mid-flow, as far apart as their timers start.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aifabric.emu import gbn
from tests import gbn_reference as ref

DELAY = 3
N = 20
RTO = 50 * (N + 2 * DELAY)


class ReplayRules:
    """The replay's state for one flow and its decisions (aifabric.emu.gbn)."""

    def __init__(self):
        self.expect, self.nak_for = 0, -1  # receiver
        self.psn, self.high, self.progress = 0, 0, 0  # sender
        self.timeouts = 0

    def next_psn(self):
        return self.psn

    def sent(self, t):
        self.psn += 1
        self.high = max(self.high, self.psn)

    def lost(self, psn, t):
        pass  # the replay, as a NIC, does not see losses

    def data(self, psn, t):
        taken, nak = gbn.receive(self.expect, self.nak_for, psn & gbn.PSN_MASK)
        if taken:
            self.expect += 1
            self.progress = t
        elif nak >= 0:
            self.nak_for = nak
            return nak
        return None

    def nak(self, psn, t):
        full = gbn.go_back_to(self.psn, self.high, psn & gbn.PSN_MASK)
        if full is not None:
            self.psn = full
            self.progress = t
            return True
        return False

    def tick(self, t):
        due = gbn.timed_out(t, self.progress, RTO, self.high, self.expect)
        if due and self.nak(self.expect, t):
            self.timeouts += 1

    def received(self):
        return self.expect


class ReferenceRules:
    """The reference model's state for one flow and its decisions (in packets, not bytes).
    Its receiver ACKs every packet it takes and every duplicate, `DELAY` ticks back (never
    lost here); its sender's timeout goes back to what the ACKs and NAKs it got said
    (`acked`)."""

    def __init__(self):
        self.delivered, self.naked = 0, False  # receiver
        self.position, self.rewind, self.acked = 0, -1, 0  # sender
        self.acks = []  # (due, packets the receiver had)
        self.timers = []  # (due, lost at, psn)
        self.timeouts = 0

    def next_psn(self):
        return self.position

    def sent(self, t):
        self.position += 1

    def lost(self, psn, t):
        self.timers.append((t + RTO, t, psn))

    def data(self, psn, t):
        takes, nak = ref.receiver_takes(psn, self.delivered, self.naked)
        if takes:
            self.delivered += 1
            self.naked = False
            self.acks.append((t + DELAY, self.delivered))
        elif psn < self.delivered:  # a duplicate is acknowledged at once
            self.acks.append((t + DELAY, self.delivered))
        elif nak and self.delivered < N:
            self.naked = True
            return self.delivered
        return None

    def nak(self, psn, t):
        self.acked = max(self.acked, psn)
        if ref.sender_goes_back(psn, self.position, self.acked >= N):
            self.position = psn
            self.rewind = t
            return True
        return False

    def tick(self, t):
        for ack in [x for x in self.acks if x[0] <= t]:
            self.acks.remove(ack)
            self.acked = max(self.acked, ack[1])
        for timer in [x for x in self.timers if x[0] == t]:
            self.timers.remove(timer)
            _, lost_at, psn = timer
            if ref.timeout_goes_back(self.rewind, lost_at, self.acked, psn):
                self.timeouts += self.nak(self.acked, t)

    def received(self):
        return self.delivered


def drive(rules, lost=(), naks_lost=(), limit=100_000):
    """Run one flow of N packets by `rules` over the scripted channel: (the PSNs the sender
    sent, in order; NAKs sent; timeouts that sent it back; the tick the last packet arrived)."""
    sent, attempts = [], Counter()
    arrive, nak_back = defaultdict(list), defaultdict(list)
    naks = 0
    for t in range(limit):
        for psn in arrive.pop(t, []):
            nak = rules.data(psn, t)
            if rules.received() == N:
                return sent, naks, rules.timeouts, t
            if nak is not None:
                if naks not in naks_lost:
                    nak_back[t + DELAY].append(nak)
                naks += 1
        for psn in nak_back.pop(t, []):
            rules.nak(psn, t)
        rules.tick(t)
        psn = rules.next_psn()
        if psn < N:
            k = attempts[psn]
            attempts[psn] += 1
            sent.append(psn)
            rules.sent(t)
            if (psn, k) in lost:
                rules.lost(psn, t + 1)
            else:
                arrive[t + DELAY].append(psn)
    raise AssertionError("the flow did not complete")


def both(lost=(), naks_lost=()):
    replay = drive(ReplayRules(), set(lost), set(naks_lost))
    reference = drive(ReferenceRules(), set(lost), set(naks_lost))
    assert replay[:3] == reference[:3]  # what was sent, NAKs, timeouts
    return replay


def test_one_loss_is_nak_ed_at_the_next_arrival_and_resent_from_there():
    k = 6
    sent, naks, timeouts, end = both(lost=[(k, 0)])
    # packet k + 1 arrives at k + 1 + DELAY; its NAK is back DELAY later, before that
    # tick's packet: by then the sender has sent k + 1 + 2 DELAY packets
    at = k + 1 + 2 * DELAY
    assert sent == list(range(at)) + list(range(k, N))
    assert (naks, timeouts) == (1, 0)
    assert end == at + (N - k) - 1 + DELAY


def test_a_lost_tail_is_resent_after_the_timeout_and_nothing_else():
    sent, naks, timeouts, _ = both(lost=[(N - 1, 0)])
    assert sent == list(range(N)) + [N - 1]
    assert (naks, timeouts) == (0, 1)


def test_a_lost_nak_leaves_the_gap_to_the_timeout_which_resends_from_it():
    k = 4
    sent, naks, timeouts, _ = both(lost=[(k, 0)], naks_lost=[0])
    assert sent == list(range(N)) + list(range(k, N))
    assert (naks, timeouts) == (1, 1)


def test_a_burst_is_one_nak_and_one_go_back():
    k = 5
    sent, naks, timeouts, _ = both(lost=[(k + i, 0) for i in range(4)])
    at = k + 4 + 2 * DELAY  # the first packet past the burst arrives and is NAKed
    assert sent == list(range(at)) + list(range(k, N))
    assert (naks, timeouts) == (1, 0)


def test_a_resent_packet_lost_again_waits_for_the_timeout():
    k = 5
    sent, naks, timeouts, _ = both(lost=[(k, 0), (k, 1)])
    at = k + 1 + 2 * DELAY
    # the NAK's go-back loses k again; the receiver, still at k, NAKs no more
    assert sent == list(range(at)) + list(range(k, N)) + list(range(k, N))
    assert (naks, timeouts) == (1, 1)


def test_a_short_timeout_goes_back_mid_flow_in_both_each_timed_its_own_way(monkeypatch):
    # a lost packet and its lost NAK, and a timeout shorter than the flow: both engines go
    # back to the gap while the sender is still sending; the simulator times the RTO from
    # the loss (one tick after k left), the replay from the last packet taken (k - 1,
    # arrived at k - 1 + DELAY): the replay goes back DELAY - 2 ticks later
    k, rto = 4, 5
    monkeypatch.setattr(sys.modules[__name__], "RTO", rto)
    replay = drive(ReplayRules(), {(k, 0)}, {0})
    reference = drive(ReferenceRules(), {(k, 0)}, {0})
    for (sent, naks, timeouts, _), back_at in (
        (reference, k + 1 + rto),
        (replay, k - 1 + DELAY + rto),
    ):
        assert back_at < N  # mid-flow
        assert sent == list(range(back_at)) + list(range(k, N))
        assert (naks, timeouts) == (1, 1)


@pytest.mark.parametrize("seed", range(40))
def test_random_losses_are_resent_alike(seed):
    rng = np.random.default_rng(seed)
    psns, attempts = rng.integers(0, N, 6), rng.integers(0, 3, 6)
    lost = {(int(p), int(a)) for p, a in zip(psns, attempts, strict=True)}
    lost.add((int(rng.integers(0, N)), 0))
    naks_lost = set(rng.integers(0, 4, int(rng.integers(0, 3))).tolist())
    sent, naks, timeouts, _ = both(lost, naks_lost)
    assert len(sent) > N and naks + timeouts > 0


@settings(max_examples=60, deadline=None)
@given(
    start=st.sampled_from([0, gbn.PSN_MASK - 5]),
    offsets=st.lists(st.integers(min_value=-4, max_value=6), min_size=1, max_size=60),
)
def test_the_replays_numba_receiver_decides_as_gbn_receive(start, offsets):
    """The replay's receiver runs in numba (`aifabric.emu.packets.absorb`, a batch at a time);
    on any sequence of PSNs (behind, expected, past a gap; across the 24-bit wrap) it takes
    and NAKs exactly what `gbn.receive`, the rule the reference is checked against, does."""
    from aifabric.emu.packets import NAKED, absorb, write_only

    mtu, k = 64, len(offsets)
    buf = np.zeros((k, mtu + 64), dtype=np.uint8)
    lens = np.zeros(k, dtype=np.uint32)
    control = np.zeros((k, 32), dtype=np.uint8)
    controllen = np.zeros(k, dtype=np.uint64)
    expect, nak_for, taken, naks = start, -1, [], []
    for i, off in enumerate(offsets):
        psn = (expect + off) & gbn.PSN_MASK
        data = write_only(7, psn, 0, 0, mtu)
        buf[i, : len(data)] = np.frombuffer(data, dtype=np.uint8)
        lens[i] = len(data)
        ok, nak = gbn.receive(expect & gbn.PSN_MASK, nak_for, psn)
        if ok:
            expect, taken = expect + 1, [*taken, i]
        elif nak >= 0:
            nak_for, naks = nak, [*naks, nak]
    state = {
        "nbytes": np.array([10**9], dtype=np.int64),
        "expect": np.array([start], dtype=np.int64),
        "received": np.zeros(1, dtype=np.int64),
        "progress": np.zeros(1),
        "ce": np.zeros(1, dtype=np.int64),
        "nak_for": np.full(1, -1, dtype=np.int64),
        "last_cnp": np.full(1, -1e18),
    }
    out = np.zeros((3 * k, 3), dtype=np.int64)
    m = absorb(buf, lens, control, controllen, k, *state.values(), 1.0, 10.0, out)
    assert state["expect"][0] == expect and state["received"][0] == len(taken) * mtu
    assert [int(r[2]) & gbn.PSN_MASK for r in out[:m] if r[0] == NAKED] == naks
