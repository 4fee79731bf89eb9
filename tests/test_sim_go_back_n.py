"""The simulator's go-back-N against an independent reference model (tests/gbn_reference.py)
and a closed form: one flow through one switch whose egress to the receiver is slower than
the sender's link and drops at a small buffer, PFC and ECN off, cc = none."""

from __future__ import annotations

import dataclasses

import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.l2 import Ether

from aifabric.fabric import frames as fr
from aifabric.fabric.cc import DEFAULT_ACK_EVERY
from aifabric.sim import Simulation
from aifabric.sim import layout as L
from aifabric.sim.driver import Stalled
from aifabric.sim.pcap import FrameBuilder
from tests import gbn_reference as ref
from tests.conftest import fabric as preset
from tests.simhelp import ack_return_ps, flows, run
from tests.test_sim_closed_forms import with_queue

MTU = 4096
PS = L.PS_PER_NS
WIRE = MTU + L.DATA_OVERHEAD_BYTES  # a full packet on the wire
# the simulator's default conventions: an ACK every DEFAULT_ACK_EVERY packets, and a flow
# ends when the ACK of its last byte reaches the sender
ACKS = {"ack_every": DEFAULT_ACK_EVERY, "finish_at_sender": True}


def lossy_pair(out_rate_bps, buffer_bytes):
    """lab-small's first two NICs (one switch apart), PFC and ECN off, the receiver's link at
    out_rate_bps and the switch buffer buffer_bytes per port (the static model: the
    reference's drop-tail queue)."""
    fab = with_queue(
        preset("lab-small"), buffer_bytes, ecn={"enabled": False}, pfc={"enabled": False},
        model="static",
    )  # fmt: skip
    src, dst = (int(n) for n in fab.nic_ids[:2])
    rates = fab.link_rate_bps.copy()
    rates[int(fab.nic_port[dst]) // 2] = out_rate_bps
    return dataclasses.replace(fab, link_rate_bps=rates), src, dst


def simulate(size, out_rate_bps, buffer_bytes, rto_ns, recovery="go-back-n"):
    fab, src, dst = lossy_pair(out_rate_bps, buffer_bytes)
    sim = run(
        fab, flows([src], [dst], size), cc="none",
        cc_params={"rto": f"{rto_ns}ns", "loss_recovery": recovery},
    )  # fmt: skip
    c = sim.counters()
    return fab, src, dst, sim, c


def reference(fab, src, dst, size, buffer_bytes, rto_ns, selective=False, until_ps=None):
    """The model's outcome for `simulate`'s flow."""
    p_in, p_out = int(fab.nic_port[src]), int(fab.nic_port[dst]) ^ 1
    sender = ref.Sender(size, int(fab.port_rate_bps[p_in]), int(fab.port_delay_ns[p_in]) * PS, 0)
    (outcome,) = ref.incast(
        [sender], MTU, int(fab.port_rate_bps[p_out]), int(fab.port_delay_ns[p_out]) * PS,
        buffer_bytes, rto_ns * PS, selective=selective, until_ps=until_ps, **ACKS,
    )  # fmt: skip
    return outcome


# (bytes, receiver link rate, buffer in full packets, rto): deep and shallow buffers, a
# short timeout that fires while NAKed data is still on its way, a long one that only
# recovers tails, a last packet shorter than the MTU
SCENARIOS = [
    (64 * MTU, 37 * 10**9, 3, 100_000),
    (200 * MTU, 37 * 10**9, 5, 20_000),
    (150 * MTU + 1000, 43 * 10**9, 8, 5_000),
    (40 * MTU + 7, 61 * 10**9, 1, 300_000),
]


@pytest.mark.parametrize("size, rate, packets, rto_ns", SCENARIOS)
@pytest.mark.parametrize("recovery", ["go-back-n", "selective"])
def test_the_simulator_resends_and_completes_as_the_reference_model_does(
    size, rate, packets, rto_ns, recovery
):
    buffer = packets * WIRE
    fab, src, dst, sim, c = simulate(size, rate, buffer, rto_ns, recovery)
    want = reference(fab, src, dst, size, buffer, rto_ns, selective=recovery == "selective")
    assert want.drops > 0
    assert c["drops"] == want.drops
    assert c["retransmitted_bytes"] == want.resent_bytes
    assert int(sim.fl[0, L.FL_T_END_PS]) == want.end_ps
    assert c["flows_done"] == 1


@pytest.mark.parametrize("ack_every, at_sender", [("flow", False), ("flow", True), (3, False)])
@pytest.mark.parametrize("recovery", ["go-back-n", "selective"])
def test_each_convention_resends_and_completes_as_the_reference_model_does(
    ack_every, at_sender, recovery
):
    size, rate, packets, rto_ns = SCENARIOS[1]
    buffer = packets * WIRE
    fab, src, dst = lossy_pair(rate, buffer)
    finish = "sender" if at_sender else "receiver"
    sim = run(
        fab, flows([src], [dst], size), cc="none",
        cc_params={"rto": f"{rto_ns}ns", "loss_recovery": recovery, "ack_every": ack_every,
                   "finish": finish},
    )  # fmt: skip
    p_in, p_out = int(fab.nic_port[src]), int(fab.nic_port[dst]) ^ 1
    sender = ref.Sender(size, int(fab.port_rate_bps[p_in]), int(fab.port_delay_ns[p_in]) * PS, 0)
    (want,) = ref.incast(
        [sender], MTU, int(fab.port_rate_bps[p_out]), int(fab.port_delay_ns[p_out]) * PS,
        buffer, rto_ns * PS, selective=recovery == "selective",
        ack_every=None if ack_every == "flow" else ack_every, finish_at_sender=at_sender,
    )  # fmt: skip
    c = sim.counters()
    assert c["drops"] == want.drops > 0
    assert c["retransmitted_bytes"] == want.resent_bytes
    assert int(sim.fl[0, L.FL_T_END_PS]) == want.end_ps


@pytest.mark.parametrize("size, rate, packets, rto_ns", SCENARIOS)
def test_go_back_n_resends_at_least_what_selective_recovery_does(size, rate, packets, rto_ns):
    buffer = packets * WIRE
    resent = {
        r: simulate(size, rate, buffer, rto_ns, r)[4]["retransmitted_bytes"]
        for r in ("go-back-n", "selective")
    }
    assert resent["go-back-n"] >= resent["selective"] > 0


def first_drop(t_in, t_out, packets):
    """Packets leave the sender every t_in and the switch every t_out > t_in: when packet n
    arrives, n - 1 - floor(n t_in / t_out) wait before it; the first n with `packets`
    waiting is dropped."""
    n = 1
    while n - 1 - n * t_in // t_out < packets:
        n += 1
    return n


def closed_form_setup(rate, packets):
    fab, src, dst = lossy_pair(rate, packets * WIRE)
    p_in, p_out = int(fab.nic_port[src]), int(fab.nic_port[dst]) ^ 1
    r_in, r_out = int(fab.port_rate_bps[p_in]), int(fab.port_rate_bps[p_out])
    d_in, d_out = int(fab.port_delay_ns[p_in]) * PS, int(fab.port_delay_ns[p_out]) * PS
    return ref.ser_ps(WIRE, r_in), ref.ser_ps(WIRE, r_out), d_in, d_out, r_in


def test_a_lost_last_packet_is_sent_again_from_the_last_ack_one_timeout_after_its_drop():
    rate, packets, rto_ns = 47 * 10**9, 5, 100_000
    t_in, t_out, d_in, d_out, r_in = closed_form_setup(rate, packets)
    k = first_drop(t_in, t_out, packets)
    fab, src, dst, sim, c = simulate((k + 1) * MTU, rate, packets * WIRE, rto_ns)
    dropped_at = (k + 1) * t_in + d_in
    again = dropped_at + rto_ns * PS  # the queue has long drained
    # the receiver took k packets and ACKed every DEFAULT_ACK_EVERY-th: the sender's timeout
    # goes back to the last ACK, and sends the packets after it (duplicates) and the lost one
    resent = k + 1 - k // DEFAULT_ACK_EVERY * DEFAULT_ACK_EVERY
    assert resent > 1
    assert c["drops"] == 1
    assert c["retransmitted_bytes"] == resent * MTU
    # back to back into an empty queue that drains slower than they come
    received = again + t_in + d_in + resent * t_out + d_out
    assert int(sim.fl[0, L.FL_T_RECEIVED_PS]) == received
    route = [int(fab.nic_port[src]), int(fab.nic_port[dst]) ^ 1]
    assert int(sim.fl[0, L.FL_T_END_PS]) == received + ack_return_ps(fab, route)


def test_one_loss_at_psn_k_of_n_in_flight_resends_n_minus_k_packets_after_one_nak():
    rate, packets = 47 * 10**9, 5
    t_in, t_out, d_in, d_out, r_in = closed_form_setup(rate, packets)
    k = first_drop(t_in, t_out, packets)
    # packet k + 1 finds one packet fewer waiting (one started since k arrived): it is taken
    assert (k + 1) * t_in // t_out > k * t_in // t_out
    n = k + 2
    fab, src, dst, sim, c = simulate(n * MTU, rate, packets * WIRE, 100_000)
    # k + 1 is the k-th packet through the queue, which never emptied: it reaches the
    # receiver, which NAKs k; by then the sender has sent all n packets
    delivered = t_in + d_in + (k + 1) * t_out + d_out
    ack = L.ACK_WIRE_BYTES
    nak = delivered + ref.ser_ps(ack, rate) + d_out + ref.ser_ps(ack, r_in) + d_in
    assert nak > n * t_in
    assert c["drops"] == 1
    assert c["retransmitted_bytes"] == (n - k) * MTU
    # k and k + 1 again, back to back, into an empty queue
    received = nak + t_in + d_in + 2 * t_out + d_out
    assert int(sim.fl[0, L.FL_T_RECEIVED_PS]) == received
    route = [int(fab.nic_port[src]), int(fab.nic_port[dst]) ^ 1]
    assert int(sim.fl[0, L.FL_T_END_PS]) == received + ack_return_ps(fab, route)


def frames(sim, fab, port):
    """The BTH opcode and PSN, and the AETH syndrome (None: no AETH), of every frame the
    simulator captured on `port`, read back by scapy."""
    b = FrameBuilder(fab, sim.flows, sim.routing.ip, MTU)
    recs = sim.captures()
    out = []
    for r in recs[recs[:, L.CP_PORT] == port]:
        pkt = Ether(b.frame(r))
        out.append((pkt[BTH].opcode, pkt[BTH].psn, pkt[AETH].syndrome if AETH in pkt else None))
    return out


def test_a_capture_shows_the_nak_and_the_psns_sent_again_as_a_roce_nic_would():
    """One loss at PSN k of k + 2: the receiver ACKs the PSN of every DEFAULT_ACK_EVERY-th
    packet it takes, NAKs (PSN sequence error) asking for k when k + 1 comes in its place,
    and the sender sends k and k + 1 again under their own PSNs and opcodes (MIDDLE, LAST),
    which the last ACK acknowledges."""
    rate, packets = 47 * 10**9, 5
    t_in, t_out, d_in, d_out, r_in = closed_form_setup(rate, packets)
    k = first_drop(t_in, t_out, packets)
    n = k + 2
    fab, src, dst = lossy_pair(rate, packets * WIRE)
    out, back = int(fab.nic_port[src]), int(fab.nic_port[dst])
    sim = run(
        fab, flows([src], [dst], n * MTU), cc="none", capture_ports=[out, back],
        cc_params={"rto": "100000ns", "loss_recovery": "go-back-n"},
    )  # fmt: skip
    assert sim.counters()["drops"] == 1
    first, middle, last, ack, nak = 0x00, 0x01, 0x02, 0x11, fr.AETH_NAK_PSN_SEQUENCE
    sent = [(first, 0, None)] + [(middle, p, None) for p in range(1, n - 1)]
    sent += [(last, n - 1, None), (middle, k, None), (last, k + 1, None)]
    assert frames(sim, fab, out) == sent
    taken = [*range(k), k, k + 1]  # in order: k + 1's first copy was dropped as out of order
    acks, since = [], 0
    for i, psn in enumerate(taken):
        if i == k:  # k + 1 came before k's second copy
            acks.append((ack, k, nak))
        since += 1
        if since == DEFAULT_ACK_EVERY or psn == n - 1:
            acks.append((ack, psn, fr.AETH_ACK))
            since = 0
    assert frames(sim, fab, back) == acks


def test_go_back_n_locks_in_phase_and_never_recovers_in_the_model_as_in_the_simulator():
    # a 25G egress takes exactly one packet of every four the 100G sender sends, so drops
    # fall in a fixed phase; with a 10 us timeout the receiver never gets past packet 3:
    # one NAK, then only timeouts, each go-back losing the packet at the gap again
    size, rate, buffer, rto_ns = 58 * MTU, 25 * 10**9, 2 * WIRE, 10_000
    fab, src, dst = lossy_pair(rate, buffer)
    sim = Simulation(
        fab, flows([src], [dst], size), cc="none",
        cc_params={"rto": f"{rto_ns}ns", "loss_recovery": "go-back-n"},
    )  # fmt: skip
    until_ns = 2_000_000
    assert not sim.run(until_ns=until_ns)
    want = reference(fab, src, dst, size, buffer, rto_ns, until_ps=until_ns * PS)
    assert want.end_ps is None and want.naks == 1 and want.delivered_bytes == 3 * MTU
    assert int(sim.fl[0, L.FL_DELIV_BYTES]) == want.delivered_bytes
    assert sim.counters()["retransmitted_bytes"] == want.resent_bytes > 100 * size
    with pytest.raises(Stalled, match="12,288 of 237,568 bytes delivered"):
        sim.run()
    # selective recovery of the same losses completes, as the model says it does
    done = simulate(size, rate, buffer, rto_ns, "selective")[3]
    want = reference(fab, src, dst, size, buffer, rto_ns, selective=True)
    assert int(done.fl[0, L.FL_T_END_PS]) == want.end_ps


def lossy_incast(rates, packets):
    """lab-small, PFC and ECN off, a buffer of `packets` full packets: its NIC 0 receives
    from NICs 1.. (one switch apart), whose links run at `rates`."""
    fab = with_queue(
        preset("lab-small"), packets * WIRE, ecn={"enabled": False}, pfc={"enabled": False},
        model="static",
    )  # fmt: skip
    nics = [int(n) for n in fab.nic_ids[: len(rates) + 1]]
    link_rates = fab.link_rate_bps.copy()
    for nic, rate in zip(nics[1:], rates, strict=True):
        link_rates[int(fab.nic_port[nic]) // 2] = rate
    return dataclasses.replace(fab, link_rate_bps=link_rates), nics[0], nics[1:]


# (sender link rates, bytes, start times in ns, buffer in packets, rto in ns): distinct
# rates and start times keep two senders' packets from meeting the switch at one picosecond
INCASTS = [
    ([100 * 10**9, 73 * 10**9], [80 * MTU, 60 * MTU], [0, 1234], 4, 30_000),
    ([100 * 10**9, 73 * 10**9, 59 * 10**9], [80 * MTU, 60 * MTU, 50 * MTU + 5], [0, 1234, 777],
     6, 10_000),
]  # fmt: skip


def reference_incast(fab, dst, srcs, sizes, starts_ns, packets, rto_ns, **acks):
    """The model's outcome of each flow of `lossy_incast`'s fabric."""
    p_out = int(fab.nic_port[dst]) ^ 1
    senders = [
        ref.Sender(
            size,
            int(fab.port_rate_bps[int(fab.nic_port[s])]),
            int(fab.port_delay_ns[int(fab.nic_port[s])]) * PS,
            start * PS,
        )  # fmt: skip
        for s, size, start in zip(srcs, sizes, starts_ns, strict=True)
    ]
    return ref.incast(
        senders, MTU, int(fab.port_rate_bps[p_out]), int(fab.port_delay_ns[p_out]) * PS,
        packets * WIRE, rto_ns * PS, **acks,
    )  # fmt: skip


@pytest.mark.parametrize("rates, sizes, starts_ns, packets, rto_ns", INCASTS)
def test_an_incast_resends_and_completes_each_flow_as_the_reference_model_does(
    rates, sizes, starts_ns, packets, rto_ns
):
    fab, dst, srcs = lossy_incast(rates, packets)
    table = flows(srcs, [dst] * len(srcs), sizes, start_ns=starts_ns)
    sim = run(fab, table, cc="none", cc_params={"rto": f"{rto_ns}ns"})
    want = reference_incast(fab, dst, srcs, sizes, starts_ns, packets, rto_ns, **ACKS)
    c = sim.counters()
    # the simulator counts drops and resent bytes per run, the model per flow
    assert c["drops"] == sum(o.drops for o in want) > 0
    assert c["retransmitted_bytes"] == sum(o.resent_bytes for o in want)
    assert sum(o.naks for o in want) > 0  # not only timeouts
    assert [int(t) for t in sim.fl[:, L.FL_T_END_PS]] == [o.end_ps for o in want]
    selective = run(
        fab, table, cc="none", cc_params={"rto": f"{rto_ns}ns", "loss_recovery": "selective"}
    )
    assert c["retransmitted_bytes"] >= selective.counters()["retransmitted_bytes"] > 0


def test_a_sender_goes_back_until_it_hears_the_last_ack_though_its_flow_ended_at_the_receiver():
    """Two senders, one ACK per flow, a 2 us timeout, flows that finish at their receiver:
    the short flow's receiver has every byte, and its sender, before the one ACK is back,
    times out and sends again what the receiver already has, as a NIC does (it cannot know).
    The long flow, behind those packets at the switch, ends when the reference model says,
    later than if the first sender had stopped at its flow's end."""
    rates, sizes, starts_ns, packets, rto_ns = (
        [91 * 10**9, 100 * 10**9],
        [19 * MTU, 87 * MTU],
        [0, 159],
        6,
        2_000,
    )
    fab, dst, srcs = lossy_incast(rates, packets)
    table = flows(srcs, [dst] * 2, sizes, start_ns=starts_ns)
    params = {"rto": f"{rto_ns}ns", "ack_every": "flow", "finish": "receiver"}
    sim = run(fab, table, cc="none", cc_params=params)
    want = reference_incast(
        fab, dst, srcs, sizes, starts_ns, packets, rto_ns, ack_every=None, finish_at_sender=False
    )
    ends = [int(t) for t in sim.fl[:, L.FL_T_END_PS]]
    assert ends == [o.end_ps for o in want]
    assert ends[0] < ends[1]
    assert int(sim.fl[0, L.FL_REWIND_PS]) > ends[0]  # went back after its flow ended
