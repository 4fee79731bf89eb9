"""DCQCN parameter presets (fabric/cc.py): parsing, overrides, and what today's NICs' set
does to an incast that the 40 Gb/s paper's set leaves crawling."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from aifabric.fabric.cc import PRESETS, cc_parameters, preset_for_rate
from aifabric.fabric.errors import AifabricError
from aifabric.scenarios import load_scenario
from aifabric.sim.engine import simulation_for


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_parses_to_its_documented_figures(preset):
    p = cc_parameters({"preset": preset}, rate_bps=400 * 10**9)
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


@pytest.mark.parametrize(
    ("gbps", "preset"),
    [(25, "cx-100g"), (40, "cx-100g"), (100, "cx-100g"), (199, "cx-100g"), (200, "cx-200g"),
     (400, "cx-400g"), (800, "cx-400g")],
)  # fmt: skip
def test_the_default_is_the_connectx_set_of_the_nics_rate(gbps, preset):
    rate = gbps * 10**9
    assert preset_for_rate(rate) == preset
    assert cc_parameters({}, rate_bps=rate) == cc_parameters({"preset": preset}, rate_bps=rate)


@pytest.mark.parametrize(
    ("topology", "preset"), [("lab-medium", "cx-400g"), ("lab-small", "cx-100g")]
)
def test_a_scenario_records_the_preset_its_links_chose_and_paper_40g_only_when_named(
    tmp_path, topology, preset
):
    """lab-medium's NICs run at 400G, lab-small's at 100G; run.json's scenario, the
    simulator's parameters and the run summary name the preset that ran."""
    from click.testing import CliRunner

    from aifabric.cli import main

    def scenario(extra=""):
        path = tmp_path / f"{topology}{len(extra)}.toml"
        path.write_text(INCAST.format(topology=topology, extra=extra))
        return path

    sc = load_scenario(scenario())
    assert sc.to_dict()["congestion_control"] == {"kind": "dcqcn", "preset": preset}
    assert simulation_for(sc).params == cc_parameters({"preset": preset}, rate_bps=0)
    named = load_scenario(scenario('preset = "paper-40g"'))
    assert named.to_dict()["congestion_control"]["preset"] == "paper-40g"
    assert simulation_for(named).params["cnp_interval"] == 50_000
    pfc = load_scenario(scenario(), overrides=[("congestion_control.kind", "none")])
    assert pfc.to_dict()["congestion_control"] == {"kind": "none"}  # no DCQCN, no preset
    path = scenario()
    r = CliRunner().invoke(main, ["run", str(path), "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    head = next(line for line in r.output.splitlines() if line.startswith(f"{path.stem}: "))
    assert f", dcqcn ({preset} preset), " in head
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())
    assert recorded["scenario"]["congestion_control"]["preset"] == preset


INCAST = """
[scenario]
topology = "{topology}"
[workload]
pattern = "incast"
senders = 3
size = "64KB"
gpus = 4
[congestion_control]
kind = "dcqcn"
{extra}
"""


def test_an_override_wins_over_the_preset():
    p = cc_parameters(
        {"preset": "cx-400g", "rate_timer": "55us", "clamp_target": True}, rate_bps=10**11
    )
    assert p["rate_timer"] == 55_000 and p["clamp_target"] is True
    assert p["additive_increase"] == 20_000_000  # the rest stays the preset's


def test_an_unknown_preset_is_one_sentence():
    with pytest.raises(AifabricError, match=r"^unknown DCQCN preset 'cx-800g'; choose one of "):
        cc_parameters({"preset": "cx-800g"}, rate_bps=400 * 10**9)


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
    def text(preset):
        extra = f'preset = "{preset}"\nrate_timer = "100us"'
        return INCAST.format(topology="lab-small", extra=extra)

    good = tmp_path / "good.toml"
    good.write_text(text("cx-200g"))
    sc = load_scenario(good)
    p = sc.cc_parameters()
    assert (p["preset"], p["additive_increase"], p["rate_timer"]) == ("cx-200g", 10**7, 100_000)
    bad = tmp_path / "bad.toml"
    bad.write_text(text("fast"))
    with pytest.raises(AifabricError, match=r"^scenario bad: unknown DCQCN preset 'fast'; "):
        load_scenario(bad)
