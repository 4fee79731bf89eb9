"""Maintenance in waves: a `[maintenance]` drain plan expanded into drain and up faults, the
guarantee (one maintenance domain out at a time) refused in one sentence, and what each wave
cost, per job and per tier, as `analyze` shows it."""

from __future__ import annotations

import html
import json

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.fabric.errors import SpecError
from aifabric.scenarios import load_scenario
from tests.conftest import fabric as preset
from tests.conftest import run_scenario

MEDIUM = """[scenario]
topology = "lab-medium"
[workload]
collective = "allreduce"
size = "1MiB"
"""

PLAN = """[maintenance]
tier = "ctsw"
wave_size = 2
domains = 4
start = "100us"
hold = "200us"
gap = "50us"
"""


def _load(tmp_path, text, **overrides):
    (tmp_path / "s.toml").write_text(text)
    return load_scenario(tmp_path / "s.toml", overrides=overrides or None)


def test_a_plan_is_a_drain_and_an_up_per_switch_wave_by_wave(tmp_path):
    fab = preset("lab-medium")
    sc = _load(tmp_path, MEDIUM + PLAN)
    got = [(fab.node_name[f.target], f.action, f.at_ns) for f in sc.faults]
    want = []
    for k in range(4):  # 8 spines, 2 a wave: 100-300, 350-550, 600-800, 850-1050 us
        drain, up = 100_000 + k * 250_000, 300_000 + k * 250_000
        pair = [f"z0-ctsw{2 * k}", f"z0-ctsw{2 * k + 1}"]
        want += [(s, "drain", drain) for s in pair] + [(s, "up", up) for s in pair]
    assert got == want
    waves = sc.to_dict()["maintenance"]["waves"]
    assert [(w["switches"], w["domain"], w["drain_ns"], w["restore_ns"]) for w in waves] == [
        ([f"z0-ctsw{2 * k}", f"z0-ctsw{2 * k + 1}"], k, 100_000 + k * 250_000,
         300_000 + k * 250_000)
        for k in range(4)
    ]  # fmt: skip


def test_the_order_and_an_explicit_list_decide_which_switches_go_first(tmp_path):
    fab = preset("lab-medium")
    sc = _load(tmp_path, MEDIUM + PLAN, **{"maintenance.order": "reverse"})
    first = [fab.node_name[f.target] for f in sc.faults if f.at_ns == 100_000]
    assert first == ["z0-ctsw7", "z0-ctsw6"]
    plan = {"switches": ["z0-ctsw5", "z0-ctsw1"], "hold": "1ms"}
    sc = _load(tmp_path, MEDIUM, maintenance=plan)
    assert [(fab.node_name[f.target], f.action, f.at_ns) for f in sc.faults] == [
        ("z0-ctsw5", "drain", 0), ("z0-ctsw5", "up", 1_000_000),
        ("z0-ctsw1", "drain", 1_000_000), ("z0-ctsw1", "up", 2_000_000),
    ]  # fmt: skip
    assert _load(tmp_path, MEDIUM, maintenance={}).faults == ()  # an empty plan plans nothing


def test_zones_select_a_tier_and_each_zone_is_a_domain(tmp_path):
    from pathlib import Path

    zones = Path(__file__).parents[1] / "experiments/specs/scenarios/two-zones.toml"
    text = MEDIUM.replace('"lab-medium"', f'"{zones}"').replace("size", "gpus = 16\nsize")
    plan = {"tier": "ctsw", "zones": 1, "wave_size": 8, "domains": "zone", "hold": "1ms"}
    sc = _load(tmp_path, text, maintenance=plan)
    fab = sc.fabric
    assert [(fab.node_name[f.target], f.action) for f in sc.faults if f.at_ns == 0] == [
        (f"z1-ctsw{i}", "drain") for i in range(8)
    ]
    assert sc.to_dict()["maintenance"]["waves"][0]["domain"] == 1
    plan = {**plan, "zones": [0, 1], "wave_size": 12}
    with pytest.raises(SpecError, match="takes out switches of 2 maintenance domains at once"):
        _load(tmp_path, text, maintenance=plan)


@pytest.mark.parametrize(
    "plan, words",
    [
        ({"wave_size": 3}, "wave 0 (z0-ctsw0, z0-ctsw1, z0-ctsw2) takes out switches of 2 "
         "maintenance domains at once; the guarantee allows one domain out at a time"),
        ({"wave_size": 2, "domains": None}, "wave 0 (z0-ctsw0, z0-ctsw1) takes out switches of 2"),
        ({"domains": [["z0-ctsw0"]]}, "maintenance.domains leaves z0-ctsw1, z0-ctsw2"),
        ({"tier": "nic"}, "maintenance.tier = 'nic' must be one of rtsw, ctsw, atsw"),
        ({"hold": "0us"}, "maintenance.hold must be positive"),
        ({"order": "random"}, "maintenance.order = 'random' must be one of index, reverse"),
        ({"switches": ["z0-ctsw0"]}, "give either tier (with zones) or switches, not both"),
        ({"tier": "rtsw", "domains": None, "wave_size": 1},
         "wave 0 (z0-r0-rtsw) would cut job allreduce off"),
    ],
)  # fmt: skip
def test_a_plan_beyond_the_guarantee_or_that_cuts_a_job_off_is_one_sentence(tmp_path, plan, words):
    body = {"tier": "ctsw", "wave_size": 2, "domains": 4, "hold": "200us"}
    body = {k: v for k, v in {**body, **plan}.items() if v is not None}
    with pytest.raises(SpecError, match="^scenario s: ") as e:
        _load(tmp_path, MEDIUM, maintenance=body)
    assert words in str(e.value)


def test_aifabric_run_refuses_a_wave_beyond_the_guarantee_before_writing(tmp_path):
    (tmp_path / "s.toml").write_text(MEDIUM + PLAN.replace("wave_size = 2", "wave_size = 4"))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "s.toml"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    assert "takes out switches of 2 maintenance domains at once" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


SMALL = """[scenario]
topology = "lab-small"
sample_interval = "10us"
[workload]
collective = "allreduce"
algorithm = "ring"
size = "256KiB"
iterations = 40
[maintenance]
tier = "ctsw"
start = "200us"
hold = "600us"
gap = "200us"
"""


@pytest.fixture(scope="module")
def waves_run(tmp_path_factory):
    """A ring AllReduce repeated on lab-small while its two spines are drained in turn."""
    return run_scenario(tmp_path_factory.mktemp("waves"), SMALL)


def test_analyze_gives_each_wave_its_jobs_figures_and_the_capacity_kept(waves_run):
    from aifabric.fabric.rundir import Run

    r = CliRunner().invoke(main, ["analyze", str(waves_run), "--json"])
    assert r.exit_code == 0, r.output
    waves = json.loads(r.output)["waves"]
    assert [(w["switches"], w["drain_ns"], w["restore_ns"]) for w in waves] == [
        (["z0-ctsw0"], 200_000, 800_000),
        (["z0-ctsw1"], 1_000_000, 1_600_000),
    ]
    fab = preset("lab-small")
    run = Run(waves_run)
    ports, col = run.ports(), run.collectives()
    t, interval = ports["t_ns"].astype(np.int64), int(ports["interval_ns"])
    tx = ports["tx_bytes"]
    downlinks = [list(ports["port"]).index(int(fab.nic_port[v]) ^ 1) for v in fab.nic_ids]
    a, b = fab.node_role[fab.link_a], fab.node_role[fab.link_b]
    uplinks = (np.minimum(a, b) == 1) & (np.maximum(a, b) == 2)  # rtsw-ctsw
    for w in waves:
        drain, restore = w["drain_ns"], w["restore_ns"]
        inside = (t >= drain) & (t + interval <= restore)
        assert w["reached"] and w["samples"] == inside.sum() == 60
        # every NIC receives: the mean over the 16 receivers of bytes over the window's time
        rx = tx[inside][:, downlinks].sum() * 8e9 / (inside.sum() * interval) / 16
        (job,) = w["jobs"]
        assert job["rx_bps"] == pytest.approx(rx, rel=1e-12) and rx > 0
        ops = (col["start_ns"] >= drain) & (col["end_ns"] >= 0) & (col["end_ns"] <= restore)
        assert job["ops"] == ops.sum() > 0
        assert job["busbw_bps"] == pytest.approx(col["busbw_bps"][ops].mean(), rel=1e-12)
        # the tier's links less those of the drained spine
        spine = fab.node_id(w["switches"][0])
        drained = uplinks & ((fab.link_a == spine) | (fab.link_b == spine))
        (kept,) = w["capacity_kept"]
        rate = int(fab.link_rate_bps[uplinks][0])
        assert kept == {
            "tier": "rtsw>ctsw", "links_kept": int(uplinks.sum() - drained.sum()),
            "links": int(uplinks.sum()), "capacity_kept_bps": rate * 8,
            "capacity_bps": rate * 16, "fraction": 0.5,
        }  # fmt: skip

    r = CliRunner().invoke(main, ["analyze", str(waves_run)])
    assert r.exit_code == 0, r.output
    text = r.output[r.output.index("maintenance waves") :]
    rows = [line.split() for line in text.splitlines()[3:5]]
    assert rows[0][:4] == ["0", "z0-ctsw0", "0", "200us-800us"]
    assert rows[0][4:7] == ["rtsw>ctsw", "8/16", "(50.0%)"]
    assert rows[1][:4] == ["1", "z0-ctsw1", "1", "1ms-1.6ms"]


def test_a_sweep_point_beyond_the_guarantee_fails_alone(tmp_path):
    import pandas as pd

    from aifabric.experiments.sweepdir import open_sweep

    (tmp_path / "s.toml").write_text(SMALL.replace("iterations = 40", "iterations = 2"))
    out = tmp_path / "sweep"
    args = ["sweep", tmp_path / "s.toml", "--vary", "maintenance.wave_size=1,2", "--workers", 1]
    r = CliRunner().invoke(main, [str(a) for a in [*args, "-o", out]])
    assert r.exit_code == 1 and "1 of 2 points failed" in r.output, r.output
    table = pd.read_csv(out / "results.csv")
    one, two = table.iloc[0], table.iloc[1]
    assert one["status"] == "complete", one["error"]
    # the first wave's columns (half the uplinks kept); the two ops end before the second
    assert one["wave0_capacity_kept.rtsw>ctsw"] == 0.5 and one["wave0_rx_gbps@allreduce"] > 0
    assert not [c for c in table.columns if c.startswith("wave1_")]
    # sweep show and the report lead with each wave's busbw and capacity kept
    headline = open_sweep(out).columns()
    assert {"wave0_busbw_gbps@allreduce", "wave0_capacity_kept.rtsw>ctsw"} <= set(headline)
    assert "wave0_rx_gbps@allreduce" not in headline
    assert two["status"] == "failed"
    words = "wave 0 (z0-ctsw0, z0-ctsw1) takes out switches of 2 maintenance domains"
    assert words in two["error"]


def test_the_report_shades_each_wave_on_every_chart_over_time(waves_run, tmp_path):
    from tests.test_analysis_report import CHROMIUM, render_in_chromium
    from tests.test_faults import TIME_CHARTS

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian package chromium)")
    from aifabric.fabric.rundir import Run

    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["report", str(waves_run), "-o", str(out)])
    assert r.exit_code == 0, r.output
    check = render_in_chromium(out, tmp_path / "profile")
    assert check["errors"] == [] and check["plots"] == check["rendered"]
    note = "wave 1 (z0-ctsw1) from 1ms to 1.6ms: capacity kept rtsw>ctsw 8/16 (50%); job 0 "
    assert note in html.unescape(out.read_text())
    run = Run(waves_run)
    t0 = {"Collectives": int(run.collectives()["start_ns"].min())}
    series_t0 = int(run.ports()["t_ns"][0])
    shaded = set()
    for fig in check["figures"]:
        title = fig["title"].split(":")[0].split(" (")[0]
        waves = [s for s in fig["shapes"] if (s.get("name") or "").startswith("wave ")]
        if waves:
            shaded.add(title)
            at = t0.get(title, series_t0)
            per = 3 if title.startswith("ECN") else 1  # one window per subplot
            assert sorted((s["name"], s["x0"], s["x1"]) for s in waves) == sorted(
                [("wave 0: z0-ctsw0", (200_000 - at) / 1e3, (800_000 - at) / 1e3)] * per
                + [("wave 1: z0-ctsw1", (1_000_000 - at) / 1e3, (1_600_000 - at) / 1e3)] * per
            ), title
    assert sorted(next(c for c in TIME_CHARTS if c in t) for t in shaded) == sorted(TIME_CHARTS)
