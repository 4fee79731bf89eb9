"""The simulator's measurement conventions against closed forms: ACKs per packet or coalesced
(bytes on the reverse links), a flow's end at the sender or the receiver, the header overhead;
and how they are asked for, refused and recorded."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.fabric.cc import DEFAULT_ACK_EVERY, HEADER_OVERHEAD_BYTES, cc_parameters
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.rundir import Run
from aifabric.fabric.scenario import Fault
from aifabric.sim import Simulation
from aifabric.sim import layout as L
from tests.conftest import fabric as preset
from tests.simhelp import ack_return_ps, flows, run
from tests.test_sim_kernels import reference_store_and_forward

MTU = 4096
SIZE = 37 * MTU + 1000  # 38 packets, the last one short
PACKETS = math.ceil(SIZE / MTU)


def one_flow(**params):
    """One flow across lab-small (NIC, leaf, spine, leaf, NIC), idle otherwise."""
    fab = preset("lab-small")
    nics = fab.nic_ids
    sim = run(fab, flows([nics[1]], [nics[14]], SIZE), cc="none", cc_params=params)
    route = [int(p) for p in sim.path_port[sim.path_ptr[0] : sim.path_ptr[1]]]
    return fab, sim, route


def sent_bytes(sim, ports):
    """Bytes each port put on the wire over the run (its tx_bytes series summed)."""
    series = sim.port_samples()
    column = {int(p): j for j, p in enumerate(series["port"])}
    return [int(series["tx_bytes"][:, column[p]].sum()) for p in ports]


@pytest.mark.parametrize("every", [1, 2, 5, 38, 64, "flow"])
def test_acks_cross_every_reverse_link_in_the_number_coalescing_gives(every):
    fab, sim, route = one_flow(ack_every=every)
    acks = 1 if every == "flow" else math.ceil(PACKETS / every)
    back = [p ^ 1 for p in route]
    # the reverse links carry the ACKs and nothing else; the forward ones the data only
    assert sent_bytes(sim, back) == [acks * L.ACK_WIRE_BYTES] * len(back)
    assert sent_bytes(sim, route) == [SIZE + PACKETS * L.DATA_OVERHEAD_BYTES] * len(route)


def test_the_default_acknowledges_every_fourth_packet_and_the_last():
    assert DEFAULT_ACK_EVERY == 4
    _, sim, route = one_flow()
    assert sent_bytes(sim, [route[0] ^ 1]) == [math.ceil(PACKETS / 4) * L.ACK_WIRE_BYTES]


@pytest.mark.parametrize("every", [1, 4, "flow"])
def test_finishing_at_the_sender_adds_exactly_the_last_acks_way_back(every):
    fab, at_sender, route = one_flow(ack_every=every)
    _, at_receiver, _ = one_flow(ack_every=every, finish="receiver")
    received = int(at_receiver.fl[0, L.FL_T_END_PS])
    # the last byte arrives as a store-and-forward model of the data says, either way
    wires = [MTU + L.DATA_OVERHEAD_BYTES] * (PACKETS - 1) + [1000 + L.DATA_OVERHEAD_BYTES]
    rates = [int(fab.port_rate_bps[p]) for p in route]
    delays = [int(fab.port_delay_ns[p]) * L.PS_PER_NS for p in route]
    assert received == reference_store_and_forward(wires, rates, delays)
    assert int(at_sender.fl[0, L.FL_T_RECEIVED_PS]) == received
    assert int(at_sender.fl[0, L.FL_T_END_PS]) == received + ack_return_ps(fab, route)
    rec = at_sender.flow_records()
    assert rec["end_ns"][0] == (received + ack_return_ps(fab, route)) // L.PS_PER_NS


def test_a_flow_waiting_on_its_own_op_starts_when_the_data_arrived_on_an_earlier_op_when_it_ends():
    """Within an op, a dependant starts when its input has arrived at the receiver (its data
    is there); on an op before, when that op's flow completes by the finish convention (the
    ACK of its last byte back at its sender, for finish = sender)."""
    fab = preset("lab-small")
    nics = fab.nic_ids
    for op in ([0, 0], [0, 1]):
        table = flows([nics[1], nics[2]], [nics[14], nics[13]], SIZE, deps=[[], [0]], op=op)
        for finish in ("sender", "receiver"):
            sim = run(fab, table, cc="none", cc_params={"finish": finish})
            arrived = int(sim.fl[0, L.FL_T_RECEIVED_PS])
            first_end = int(sim.fl[0, L.FL_T_END_PS])
            started = int(sim.fl[1, L.FL_T_START_PS])
            assert started == (arrived if op[1] == op[0] else first_end)
            if finish == "sender":
                route = sim.path_port[sim.path_ptr[0] : sim.path_ptr[1]]
                assert first_end == arrived + ack_return_ps(fab, route)


def test_acks_take_their_turn_on_the_port_that_sends_data_the_other_way():
    # two flows in opposite directions between two NICs of one leaf: the second's data leaves
    # its NIC's port between the first's ACKs, each of which holds it up by its serialization
    fab = preset("lab-small")
    a, b = (int(n) for n in fab.nic_ids[1:3])
    table = flows([a, b], [b, a], SIZE)
    took = {}
    for every in ("flow", 1):
        sim = run(fab, table, cc="none", cc_params={"ack_every": every, "finish": "receiver"})
        took[every] = int(sim.fl[1, L.FL_T_RECEIVED_PS])
    rate = int(fab.port_rate_bps[int(fab.nic_port[b])])
    ack_ps = -(-L.ACK_WIRE_BYTES * 8 * 10**12 // rate)  # an ACK's serialization on b's port
    late = took[1] - took["flow"]
    assert late > 0 and late % ack_ps == 0 and late // ack_ps <= PACKETS


def test_a_lost_last_ack_is_sent_again_one_timeout_after_its_loss_on_the_new_route():
    # the flow's one ACK is on its way back over the spine when that link fails: it is lost
    # where it arrives; one RTO later the receiver sends it again, over the route the flow
    # was given when the link failed
    fab, before, route = one_flow(ack_every="flow")
    received = int(before.fl[0, L.FL_T_RECEIVED_PS])
    hop = {p: ack_return_ps(fab, [p]) for p in route}  # each reverse hop: serialization + delay
    onto_spine_link = received + hop[route[3]] + hop[route[2]]  # it starts back over route[1]
    lost_at = onto_spine_link + hop[route[1]]  # where it arrives (the link is down by then)
    fail_ns = -(-onto_spine_link // L.PS_PER_NS) + 1
    assert fail_ns * L.PS_PER_NS < lost_at
    rto_ns = 7_000
    sim = Simulation(
        fab, flows([fab.nic_ids[1]], [fab.nic_ids[14]], SIZE), cc="none",
        cc_params={"ack_every": "flow", "rto": f"{rto_ns}ns"},
        faults=[Fault("link", route[1] // 2, fail_ns)],
    )  # fmt: skip
    assert sim.run()
    assert int(sim.fl[0, L.FL_T_RECEIVED_PS]) == received
    new_route = [int(p) for p in sim.path_port[sim.path_ptr[0] : sim.path_ptr[1]]]
    assert route[1] not in new_route
    assert sim.counters()["drops"] == 1
    end = lost_at + rto_ns * L.PS_PER_NS + ack_return_ps(fab, new_route)
    assert int(sim.fl[0, L.FL_T_END_PS]) == end


@pytest.mark.parametrize("overhead", [0, 64, 82, 200])
def test_header_overhead_sets_wire_bytes_and_completion_as_the_closed_form_says(overhead):
    fab, sim, route = one_flow(header_overhead=overhead)
    ack = overhead + L.ACK_EXTRA_BYTES
    acks = math.ceil(PACKETS / DEFAULT_ACK_EVERY)
    assert sent_bytes(sim, [route[0], route[0] ^ 1]) == [SIZE + PACKETS * overhead, acks * ack]
    wires = [MTU + overhead] * (PACKETS - 1) + [1000 + overhead]
    rates = [int(fab.port_rate_bps[p]) for p in route]
    delays = [int(fab.port_delay_ns[p]) * L.PS_PER_NS for p in route]
    received = reference_store_and_forward(wires, rates, delays)
    assert int(sim.fl[0, L.FL_T_RECEIVED_PS]) == received
    assert int(sim.fl[0, L.FL_T_END_PS]) == received + ack_return_ps(fab, route, ack)


def test_the_default_overhead_is_a_roce_v2_packets_on_ethernet():
    # Ethernet 14, IPv4 20, UDP 8, BTH 12, ICRC 4, FCS 4, preamble and inter-frame gap 20
    assert HEADER_OVERHEAD_BYTES == L.DATA_OVERHEAD_BYTES == 82
    assert cc_parameters({}, rate_bps=400 * 10**9)["header_overhead"] == 82
    assert cc_parameters({"header_overhead": "64B"}, rate_bps=400 * 10**9)["header_overhead"] == 64


@pytest.mark.parametrize(
    "params, words",
    [
        ({"ack_every": 0}, ["ack_every = 0", 'a positive number of packets or "flow"']),
        ({"ack_every": "each"}, ["ack_every = 'each'", "positive number"]),
        ({"ack_every": True}, ["ack_every = True", "positive number"]),
        ({"ack_every": 2.5}, ["ack_every = 2.5", "positive number"]),
        ({"finish": "middle"}, ["finish = 'middle'", "choose one of sender, receiver"]),
        ({"header_overhead": -1}, ["header_overhead = -1", "must not be negative"]),
        ({"header_overhead": "82 bytes"}, ["header_overhead = '82 bytes'", "is not a size"]),
        ({"header_overhead": "1MiB"}, ["header_overhead must be at most 65,535 bytes"]),
        ({"ack_evry": 4}, ["unknown congestion-control parameter 'ack_evry'"]),
    ],
)
def test_a_bad_convention_is_refused_in_one_sentence(params, words):
    with pytest.raises(AifabricError) as e:
        cc_parameters(params, rate_bps=400 * 10**9)
    text = str(e.value)
    assert "\n" not in text
    for w in words:
        assert w in text


SCENARIO = """
[scenario]
topology = "lab-small"
seed = 1

[workload]
pattern = "incast"
senders = 3
size = "64KiB"
gpus = 4

[congestion_control]
kind = "none"
"""


@pytest.mark.parametrize(
    "table, acks, finish, overhead",
    [
        ("", DEFAULT_ACK_EVERY, "sender", 82),
        ('ack_every = "flow"\nfinish = "receiver"\nheader_overhead = 64\n', "flow", "receiver", 64),
    ],
)
def test_run_json_records_the_conventions(tmp_path, table, acks, finish, overhead):
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO + table)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(path), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    meta = Run(out).meta
    want = {
        "loss_recovery": "go-back-n",
        "ack_every": acks,
        "finish": finish,
        "header_overhead_bytes": overhead,
    }
    assert meta["results"]["summary"]["transport"] == want
    assert summary["transport"] == want
    features = meta["features"]
    assert f"{overhead} bytes of overhead" in features["links.rate"]["how"]
    said = f"every {acks} in-order" if acks != "flow" else "one ACK per flow"
    assert said in features["acks"]["how"]
    assert f"reaches the {finish}" in features["finish"]["how"]
