"""DCQCN parameter presets (fabric/cc.py): parsing, overrides, and what today's NICs' set
does to an incast that the 40 Gb/s paper's set leaves crawling."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from aifabric.fabric.cc import DEFAULT_PRESET, PRESETS, cc_parameters
from aifabric.fabric.errors import AifabricError
from aifabric.scenarios import load_scenario
from aifabric.sim.engine import simulation_for


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_parses_to_its_documented_figures(preset):
    p = cc_parameters({"preset": preset})
    assert p["preset"] == preset
    if preset == "paper-40g":
        assert (p["additive_increase"], p["rate_timer"], p["cnp_interval"]) == (
            40_000_000,
            55_000,
            50_000,
        )
        assert p["clamp_target"] is True
    else:
        rate = int(preset[3:-1])  # cx-400g -> 400
        assert p["additive_increase"] == 5_000_000 * rate // 100
        assert p["hyper_increase"] == 50_000_000 * rate // 100
        assert (p["rate_timer"], p["alpha_timer"], p["cnp_interval"]) == (300_000, 1_000, 4_000)
        assert (p["byte_counter"], p["fast_recovery_steps"], p["min_rate"]) == (32767, 1, 10**6)
        assert p["g"] == 5 / 1024 and p["clamp_target"] is False


def test_the_default_is_the_paper_set():
    assert DEFAULT_PRESET == "paper-40g"
    assert cc_parameters({}) == cc_parameters({"preset": "paper-40g"})


def test_an_override_wins_over_the_preset():
    p = cc_parameters({"preset": "cx-400g", "rate_timer": "55us", "clamp_target": True})
    assert p["rate_timer"] == 55_000 and p["clamp_target"] is True
    assert p["additive_increase"] == 20_000_000  # the rest stays the preset's


def test_an_unknown_preset_is_one_sentence():
    with pytest.raises(AifabricError, match=r"^unknown DCQCN preset 'cx-800g'; choose one of "):
        cc_parameters({"preset": "cx-800g"})


def receiver_link_gbps(preset, model):
    """The 15-to-1 incast of `incast-pfc` under DCQCN with the switches' buffer `model`:
    finish time and the mean rate of the switch port toward the receiver until the last
    flow ends."""
    base = load_scenario("incast-pfc")
    queues = {r: replace(q, model=model) for r, q in base.fabric.queues.items()}
    base = replace(base, fabric=replace(base.fabric, queues=queues))
    sim = simulation_for(replace(base, cc="dcqcn", cc_params={"preset": preset}))
    assert sim.run()
    sim.close()
    end_ns = int(sim.flow_records()["end_ns"].max())
    series = sim.port_samples()
    dst = int(np.unique(base.flows.dst)[0])
    port = int(base.fabric.nic_port[dst]) ^ 1
    sent = series["tx_bytes"][: end_ns // series["interval_ns"], port]
    return end_ns, sent.sum() * 8 / (len(sent) * series["interval_ns"])


@pytest.mark.parametrize(
    ("model", "fast_below_ns", "slow_above_ns", "fast_above_gbps", "slow_below_gbps"),
    [
        # per-port buffers: the queue grows to 15.7 MB and hides the rate cuts from the link
        ("static", 2_000_000, 5_000_000, 250, 120),
        # a 4 MiB pool holds 4 MB: ECN arrives sooner (the paper set: 3.7 ms, not 7.0) and
        # the link idles sooner when the 400G set cuts (2.04 ms, not 1.51)
        ("shared", 2_500_000, 3_000_000, 200, 150),
    ],
)
def test_an_incast_under_the_400g_preset_recovers_far_faster_than_under_the_paper_set(
    model, fast_below_ns, slow_above_ns, fast_above_gbps, slow_below_gbps
):
    slow_ns, slow_gbps = receiver_link_gbps("paper-40g", model)
    fast_ns, fast_gbps = receiver_link_gbps("cx-400g", model)
    # 60 MB through one 400 Gb/s link takes 1.2 ms at line rate
    assert fast_ns < fast_below_ns < slow_above_ns < slow_ns
    assert fast_gbps > fast_above_gbps and slow_gbps < slow_below_gbps


def test_a_scenario_names_its_preset_and_a_wrong_one_is_refused(tmp_path):
    text = """
[scenario]
topology = "lab-small"
[workload]
pattern = "incast"
senders = 3
size = "64KB"
gpus = 4
[congestion_control]
kind = "dcqcn"
preset = "{preset}"
rate_timer = "100us"
"""
    good = tmp_path / "good.toml"
    good.write_text(text.format(preset="cx-200g"))
    sc = load_scenario(good)
    p = cc_parameters(sc.cc_params)
    assert (p["preset"], p["additive_increase"], p["rate_timer"]) == ("cx-200g", 10**7, 100_000)
    bad = tmp_path / "bad.toml"
    bad.write_text(text.format(preset="fast"))
    with pytest.raises(AifabricError, match=r"^scenario bad: unknown DCQCN preset 'fast'; "):
        load_scenario(bad)
