"""The simulator at its edges: deep incasts, failures under load, large windows and
stalls end in a result or one sentence, never a crash or a hang."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.engines import run_scenario
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Role
from aifabric.fabric.rundir import Run
from aifabric.fabric.scenario import Fault
from aifabric.scenarios import load_scenario
from aifabric.sim import Simulation
from aifabric.sim import layout as L
from aifabric.sim.driver import Stalled
from aifabric.sim.heap import clear, schedule
from tests.conftest import fabric as preset
from tests.simhelp import flows


def queued_packets(sim, p):
    n = 0
    for cls in range(2):
        i = int(sim.pt[p, L.PT_HEAD0 + 2 * cls])
        while i >= 0:
            n += 1
            i = int(sim.pk[i, L.PK_NEXT])
    return n


def test_a_receiver_link_failing_under_a_100_to_1_incast_cuts_every_flow_off_cleanly():
    # issue 11: lab-medium, 16 MiB per sender, no congestion control, the receiver's link
    # down at 200 us, when more packets wait on it than the event list has free rows
    # (rack switches with a 512 MiB pool, eight times a Tomahawk 3's: a queue deeper than
    # the event list's first 65,536 rows, one chunk of the timing wheel's pool per bucket)
    base = preset("lab-medium")
    rtsw = replace(base.queue(Role.RTSW), buffer_bytes=512 * 2**20)
    fab = replace(base, queues={**base.queues, Role.RTSW: rtsw})
    nics = fab.nic_ids
    recv = int(nics[0])
    link = int(fab.nic_port[recv]) // 2
    table = flows(nics[1:101], [recv] * 100, 16 * 2**20)
    sim = Simulation(fab, table, cc="none", faults=[Fault("link", link, 200_000, "down")])
    assert not sim.run(until_ns=199_999)
    p = int(fab.nic_port[recv]) ^ 1
    waiting = queued_packets(sim, p)
    assert waiting > sim.ev.shape[1] - sim.g[L.G_HEAP]
    drops = int(sim.g[L.G_DROPS])
    assert sim.run()
    c = sim.counters()
    assert c["flows_done"] == 0 and c["flows_without_path"] == 100
    assert c["drops"] - drops >= waiting
    assert queued_packets(sim, p) == queued_packets(sim, p ^ 1) == 0
    assert sim.g[L.G_PURGING] == 0 and sim.g[L.G_OVERFLOW] == 0
    assert (sim.flow_records()["delivered_bytes"] < 16 * 2**20).all()


def test_a_400_chunk_clear_to_send_window_completes_within_the_packet_pool():
    # issue 11: a 15-to-1 incast whose receiver may grant 400 chunks of 4 KiB at once
    fab = preset("lab-medium")
    nics = fab.nic_ids
    size = 4_000_000
    sim = Simulation(
        fab, flows(nics[1:16], [nics[0]] * 15, size), cc="cts",
        cc_params={"cts_window": 400, "cts_chunk": "4KiB"},
    )  # fmt: skip
    assert sim.prm[L.P_PACKET_RESERVE] >= 400
    assert sim.run()
    c = sim.counters()
    assert c["flows_done"] == 15 and c["drops"] == 0
    assert (sim.flow_records()["delivered_bytes"] == size).all()
    assert sim.g[L.G_OVERFLOW] == 0
    in_use = sim.pk[:-1][sim.pk[:-1, L.PK_KIND] >= 0]
    assert len(in_use) == len(sim.pk) - 1 - sim.g[L.G_NFREE]
    # a flow ends when its last ACK is back: nothing is left on its way (finishing at the
    # receiver, its ACK would be)
    assert len(in_use) == 0


def test_flows_waiting_on_a_flow_without_path_end_the_run_instead_of_sampling_forever():
    fab = preset("lab-small")
    nics = fab.nic_ids
    link = int(fab.nic_port[nics[0]]) // 2
    table = flows([nics[0], nics[2]], [nics[1], nics[3]], 10_000, deps=[[], [0]])
    sim = Simulation(fab, table, cc="none", faults=[Fault("link", link, 0, "down")])
    assert sim.run()
    c = sim.counters()
    assert c["flows_without_path"] == 1 and c["flows_done"] == 0


def test_a_flow_whose_packets_keep_vanishing_stalls_the_run_with_one_sentence():
    fab = preset("lab-small")
    nics = fab.nic_ids
    sim = Simulation(fab, flows([nics[0]], [nics[15]], 50_000_000), cc="none")
    sim.run(until_ns=20_000)
    hop = int(sim.path_port[sim.path_ptr[0] + 1])  # a link the router does not know is dead
    sim.pt[hop, L.PT_ALIVE] = sim.pt[hop ^ 1, L.PT_ALIVE] = 0
    with pytest.raises(Stalled) as info:
        sim.run()
    text = str(info.value)
    stall_ns = int(sim.prm[L.P_STALL_PS]) // L.PS_PER_NS
    assert sim.now_ns - int(sim.g[L.G_PROGRESS_T_PS]) // L.PS_PER_NS > stall_ns
    assert "stalled" in text and "1 flows were unfinished" in text
    assert f"flow 0 ({fab.node_name[nics[0]]} to {fab.node_name[nics[15]]}" in text
    assert sim.counters()["drops"] > 0
    assert "\n" not in text


def test_flows_underway_with_nothing_but_sampling_left_is_a_stall_naming_where_packets_are():
    fab = preset("lab-small")
    nics = fab.nic_ids
    sim = Simulation(fab, flows([nics[0]], [nics[15]], 5_000_000), cc="none")
    sim.run(until_ns=20_000)
    in_use = np.flatnonzero(sim.pk[:-1, L.PK_KIND] >= 0)
    assert len(in_use) > 0
    clear(sim.ev, sim.g)  # every packet event lost: only sampling goes on
    schedule(sim.ev, sim.g, int(sim.g[L.G_NOW_PS]) + 1, L.EV_SAMPLE, 0, 0)
    with pytest.raises(Stalled, match=r"flow 0 .*packets: \d+ at "):
        sim.run()
    assert sim.now_ns <= 20_001


INCAST_FAILING = """
[scenario]
topology = "lab-medium"
seed = 1
sample_interval = "10us"

[workload]
pattern = "incast"
senders = 100
size = "16MiB"

[congestion_control]
kind = "none"
"""


def test_aifabric_run_of_the_failing_incast_ends_with_a_status_and_a_sentence(tmp_path):
    # issue 11: this run aborted with `free(): invalid next size`, run.json left at running
    path = tmp_path / "incast.toml"
    path.write_text(INCAST_FAILING)
    scenario = load_scenario(path)
    fab = scenario.fabric
    recv = int(scenario.flows.dst[0])
    leaf = int(fab.port_peer[fab.nic_port[recv]])
    path.write_text(
        INCAST_FAILING
        + f'\n[[faults]]\nlink = "{fab.node_name[recv]}--{fab.node_name[leaf]}"\nat = "200us"\n'
    )
    result = CliRunner().invoke(main, ["run", str(path), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    r = Run(tmp_path / "run")
    assert r.status == "partial"  # ran to its end, but not every flow could complete
    assert r.meta["results"]["counters"]["flows_without_path"] == 100
    assert "100 flows did not complete" in r.meta["message"]


def test_incast_lossy_shows_the_goodput_collapse_of_go_back_n_and_records_it(tmp_path):
    runs = {}
    for recovery in ("go-back-n", "selective"):
        scenario = load_scenario("incast-lossy")
        scenario = replace(scenario, cc_params={**scenario.cc_params, "loss_recovery": recovery})
        summary = run_scenario("sim", scenario, tmp_path / recovery)
        runs[recovery] = (summary, Run(tmp_path / recovery))
    gbn, sel = runs["go-back-n"], runs["selective"]
    assert gbn[1].meta["results"]["counters"]["loss_recovery"] == "go-back-n"
    assert sel[1].meta["results"]["counters"]["loss_recovery"] == "selective"
    assert "NAKs the first gap" in gbn[1].meta["features"]["loss_recovery"]["how"]
    assert "only lost packets" in sel[1].meta["features"]["loss_recovery"]["how"]
    assert gbn[0]["flows_done"] == sel[0]["flows_done"] == 15
    # every drop costs go-back-N a window of resends: it takes many times as long
    assert gbn[0]["completion_ns"] > 5 * sel[0]["completion_ns"]
    resent = {k: r[1].meta["results"]["counters"]["retransmitted_bytes"] for k, r in runs.items()}
    assert resent["go-back-n"] > 10 * resent["selective"]


def test_an_unknown_loss_recovery_is_one_sentence():
    fab = preset("lab-small")
    nics = fab.nic_ids
    with pytest.raises(AifabricError, match="loss_recovery = 'gbn': choose one of go-back-n"):
        Simulation(fab, flows([nics[0]], [nics[1]], 10), cc_params={"loss_recovery": "gbn"})
