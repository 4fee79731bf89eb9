"""Adaptive routing in the simulator: every switch forwards each data packet on the next hop
with the shortest queue at that moment. Where 5-tuple hashing puts flows together, it
finishes about as soon as spraying (with out-of-order placement) and far ahead of hashing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.routing import Routing
from aifabric.scenarios import load_scenario
from aifabric.sim import Simulation
from aifabric.sim.engine import features, simulation_for
from tests.conftest import fabric as preset
from tests.simhelp import flows, run

MTU = 4096


def finish_ns(sim) -> int:
    return int(sim.flow_records()["end_ns"].max())


def test_on_the_permutation_adaptive_keeps_up_with_spraying_and_beats_hashing():
    base = load_scenario("ecmp-permutation")
    took = {}
    for label, policy, recovery in (
        ("5tuple", "5tuple", None),
        ("spray", "spray", "selective"),
        ("adaptive", "adaptive", None),
    ):
        cc = {**base.cc_params, **({"loss_recovery": recovery} if recovery else {})}
        sim = simulation_for(replace(base, ecmp=policy, cc_params=cc))
        assert sim.run()
        sim.close()
        took[label] = finish_ns(sim)
        if policy == "adaptive":
            assert sim.counters()["loss_recovery"] == "selective"
    assert took["adaptive"] <= 1.1 * took["spray"]
    assert took["adaptive"] < 0.5 * took["5tuple"]


def test_on_a_ring_step_across_racks_adaptive_avoids_the_uplinks_hashing_shares():
    fab = preset("lab-medium")
    nics = [int(x) for x in fab.nic_ids]
    # one step of a ring AllReduce over 8 racks with 8 channels: NIC c of rack r sends to
    # NIC c of rack r + 1; each rack's 8 flows leave over its 16 uplinks
    src = [nics[16 * r + c] for r in range(8) for c in range(8)]
    dst = [nics[16 * ((r + 1) % 8) + c] for r in range(8) for c in range(8)]
    sport = 0xC000 + np.arange(len(src))
    counts = Routing(fab, "5tuple", 3).paths(src, dst, sport).port_counts(fab.n_ports)
    assert counts.max() >= 2  # hashing puts two flows on one link
    table = flows(src, dst, 200 * MTU, sport=sport)
    took = {
        policy: finish_ns(run(fab, table, ecmp=policy, seed=3, cc="none", cc_params=params))
        for policy, params in (
            ("5tuple", {}),
            ("spray", {"loss_recovery": "selective"}),
            ("adaptive", {}),
        )
    }
    assert took["adaptive"] <= 1.1 * took["spray"]
    assert took["adaptive"] < 0.7 * took["5tuple"]


def test_adaptive_with_go_back_n_asked_for_is_one_sentence():
    fab = preset("lab-small")
    nics = [int(x) for x in fab.nic_ids]
    with pytest.raises(AifabricError, match=r"^adaptive routing reorders packets, [^.]*$"):
        Simulation(
            fab, flows(nics[:1], nics[1:2], MTU), ecmp="adaptive",
            cc_params={"loss_recovery": "go-back-n"},
        )  # fmt: skip


def test_the_simulator_says_adaptive_recovers_selectively():
    sc = replace(load_scenario("ecmp-permutation"), ecmp="adaptive")
    out = features(sc)
    assert out["loss_recovery"].state == "approximated"
    assert "out of order" in out["loss_recovery"].how


def test_a_scenario_asking_adaptive_with_go_back_n_is_refused_before_it_runs():
    base = load_scenario("ecmp-permutation")
    sc = replace(base, ecmp="adaptive", cc_params={**base.cc_params, "loss_recovery": "go-back-n"})
    out = features(sc)
    assert out["loss_recovery"].state == "refused"
