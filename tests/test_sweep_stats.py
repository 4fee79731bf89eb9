"""Sweep specs, and results across seeds checked against figures worked out by hand."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.experiments.spec import parse_seeds, split_values, sweep_from_dict, sweep_from_flags
from aifabric.experiments.stats import describe, t_quantile
from aifabric.fabric.errors import SpecError

# Student's t, two-sided 95%: the printed tables' values
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 29: 2.045}


@pytest.mark.parametrize("dof, t", sorted(T_TABLE.items()))
def test_t_quantile_matches_the_tables(dof, t):
    assert t_quantile(dof) == pytest.approx(t, abs=6e-4)
    assert t_quantile(dof, 0.99) > t_quantile(dof) > t_quantile(dof, 0.9)


def test_equal_values_have_no_spread():
    # numpy's mean of three 3445.9876543 is one rounding off, and its std 5.6e-13
    stats = describe([3445.9876543] * 3)
    assert stats["mean"] == stats["min"] == stats["max"] == 3445.9876543
    assert stats["std"] == 0.0 and stats["ci_low"] == stats["ci_high"] == 3445.9876543
    assert describe([7.5])["std"] is None
    spread = describe([1.0, 2.0, 3.0])
    # on a log scale: 2 / f to 2 * f, f = exp(t s / (mean sqrt(n))) = exp(4.303 / (2 sqrt(3)))
    f = math.exp(4.3027 / (2 * 3**0.5))
    assert spread["std"] == 1.0 and spread["interval"] == "log"
    assert (spread["ci_low"], spread["ci_high"]) == pytest.approx((2 / f, 2 * f), rel=1e-4)


def test_an_interval_of_a_quantity_that_cannot_be_negative_stays_above_zero():
    # times of 0.1, 5 and 10 ms: Student's t on the values would give 5.03 +- 12.3 ms,
    # down to -7.3 ms; the log-scale interval is 5.03 / f to 5.03 * f, f = exp(12.3 / 5.03)
    times = [0.1, 5.0, 10.0]
    stats = describe(times)
    half = 4.3027 * stats["std"] / math.sqrt(3)
    assert stats["mean"] - half < -7
    f = math.exp(half / stats["mean"])
    assert (stats["ci_low"], stats["ci_high"]) == pytest.approx(
        (stats["mean"] / f, stats["mean"] * f), rel=1e-4
    )
    assert 0 < stats["ci_low"] < stats["mean"] < stats["ci_high"]
    counts = describe([0, 0, 9])  # a count that was zero twice still has a positive interval
    assert counts["interval"] == "log" and counts["ci_low"] > 0
    signed = describe([-1.0, 2.0, 5.0])  # a quantity that can be negative: t on the values
    assert signed["interval"] == "t"
    assert signed["ci_low"] == pytest.approx(2 - 4.3027 * 3 / math.sqrt(3), rel=1e-4)


def test_seeds_and_values():
    assert parse_seeds("1-3") == (1, 2, 3)
    assert parse_seeds("1,3,7-8") == (1, 3, 7, 8)
    assert parse_seeds([4, 2, 4]) == (4, 2)
    assert parse_seeds(5) == (5,)
    with pytest.raises(SpecError, match="runs backwards"):
        parse_seeds("5-1")
    assert split_values("5tuple,eecmp") == ["5tuple", "eecmp"]
    assert split_values("1,4,8") == [1, 4, 8]
    assert split_values('[1, 2],[3],"a,b"') == [[1, 2], [3], "a,b"]


def test_grid_zip_and_named_values_expand_into_points():
    raw = {
        "sweep": {"scenario": "demo", "seeds": "1-2"},
        "set": {"queue": {"ecn_kmin": "50KiB"}},
        "grid": {"ecmp": {"policy": ["5tuple", "eecmp"]},
                 "faults": {"none": [], "down": [{"link": "a--b"}]}},
        "zip": {"workload.placement": ["packed", "fragmented"], "workload.gpus": [8, 12]},
    }  # fmt: skip
    sweep = sweep_from_dict(raw, "t")
    assert sweep.keys == ["ecmp.policy", "faults", "workload.placement", "workload.gpus"]
    points = sweep.points()
    assert len(points) == 2 * 2 * 2 * 2  # policies x faults x zip positions x seeds
    first = points[0]
    assert first.labels == {"ecmp.policy": "5tuple", "faults": "none",
                            "workload.placement": "packed", "workload.gpus": 8}  # fmt: skip
    assert dict(first.overrides) == {"queue.ecn_kmin": "50KiB", "ecmp.policy": "5tuple",
                                     "faults": [], "workload.placement": "packed",
                                     "workload.gpus": 8}  # fmt: skip
    assert first.name == (
        "ecmp.policy=5tuple,faults=none,workload.placement=packed,workload.gpus=8,seed=1"
    )
    assert {p.name for p in points} == {p.name for p in sweep.points()}
    assert len({p.name for p in points}) == len(points)
    zipped = {(p.labels["workload.placement"], p.labels["workload.gpus"]) for p in points}
    assert zipped == {("packed", 8), ("fragmented", 12)}


@pytest.mark.parametrize(
    "raw, says",
    [
        ({"sweep": {"scenario": "demo"}, "grid": {"ecmp.polcy": [1]}}, "unknown key ecmp.polcy"),
        ({"sweep": {"scenario": "demo"}, "zip": {"workload.qps": [1, 2], "workload.gpus": [8]}},
         "as many values"),
        ({"sweep": {"scenario": "demo"}, "set": {"workload.qps": 1},
          "grid": {"workload.qps": [1, 2]}}, "workload.qps is given twice"),
        ({"sweep": {"scenario": "demo"}, "vary": {}}, "unknown section [vary]"),
        ({"sweep": {}}, "sweep.scenario is missing"),
        ({"sweep": {"scenario": "demo", "metrics": ["speed"]}}, "choose from busbw"),
        ({"sweep": {"scenario": "dmeo"}}, "unknown scenario preset 'dmeo'"),
        ({"sweep": {"scenario": "demo"}, "grid": {"scenario.seed": [1, 2]}},
         "give seeds as sweep.seeds"),
        ({"sweep": {"scenario": "demo"}, "grid": {"workload.qps": [1, 2]},
          "report": {"contrasts": [{"baseline": {"ecmp.policy": "5tuple"}}]}},
         "report.contrasts.0.baseline names ecmp.policy, which the sweep does not vary"),
        ({"sweep": {"scenario": "no/such.toml"}}, "does not exist"),
    ],
)  # fmt: skip
def test_bad_specs_are_one_sentence(raw, says):
    with pytest.raises(SpecError) as e:
        sweep_from_dict(raw, "t")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_flags_make_the_same_sweep_as_a_spec():
    flags = sweep_from_flags(
        "demo", vary=["ecmp.policy=5tuple,eecmp", "workload.qps=1,4,8"], seeds="1-5"
    )
    spec = sweep_from_dict(
        {"sweep": {"scenario": "demo", "seeds": "1-5"},
         "grid": {"ecmp.policy": ["5tuple", "eecmp"], "workload.qps": [1, 4, 8]}},
        "demo",
    )  # fmt: skip
    assert flags.points() == spec.points()
    assert len(flags.points()) == 30


# A results table small enough to work out by hand. busbw of (5tuple, eecmp) x seeds 1-3,
# and a second job whose time is only known for some runs.
HEADER = "point,ecmp.policy,seed,status,error,busbw_gbps@ring,time_ns@ring,time_ns@incast"
CSV = f"""{HEADER},time_ns@absent,run_dir
0,5tuple,1,complete,,100,1000,50,5,runs/a
1,5tuple,2,complete,,110,900,,,runs/b
2,5tuple,3,complete,,120,800,70,,runs/c
3,eecmp,1,complete,,150,700,60,,runs/d
4,eecmp,2,failed,Boom,,,,,runs/e
5,eecmp,3,complete,,180,600,60,,runs/f
"""


@pytest.fixture
def results(tmp_path):
    (tmp_path / "results.csv").write_text(CSV)
    spec = {
        "name": "hand", "scenario": "demo", "seeds": [1, 2, 3], "keys": ["ecmp.policy"],
        "report": {"metric": "busbw_gbps@ring", "baseline": {"ecmp.policy": "5tuple"},
                   "higher_is_better": True, "finding": "eecmp spreads better",
                   "published": "40% (made up for the test)", "published_band": [0, 0.4],
                   "contrasts": [{"baseline": {"ecmp.policy": "eecmp"}, "label": "reverse",
                                  "published_band": [-0.5, -0.2]}]},
    }  # fmt: skip
    (tmp_path / "sweep.json").write_text(json.dumps(spec))
    return tmp_path


def test_show_aggregates_as_worked_out_by_hand(results):
    r = CliRunner().invoke(main, ["sweep", "show", str(results), "--json",
                                  "--metric", "busbw_gbps", "--metric", "time_ns"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    rows = {(a["ecmp.policy"], a["column"]): a for a in out["aggregate"]}
    a = rows[("5tuple", "busbw_gbps@ring")]
    # 100, 110, 120: mean 110, s = 10, h = 4.303 * 10 / sqrt(3), on a log scale 110 * e^(h/110)
    assert (a["n"], a["mean"], a["std"], a["min"], a["max"]) == (3, 110, 10, 100, 120)
    f = math.exp(4.3027 * 10 / math.sqrt(3) / 110)
    assert (a["ci_low"], a["ci_high"]) == pytest.approx((110 / f, 110 * f), rel=1e-4)
    assert a["job"] == "ring" and a["metric"] == "busbw_gbps" and a["seeds"] == [1, 2, 3]
    b = rows[("eecmp", "busbw_gbps@ring")]
    # the failed seed 2 is left out: 150, 180 -> mean 165, s = 21.21, t(1) = 12.706
    assert (b["n"], b["mean"], b["min"], b["max"]) == (2, 165, 150, 180)
    assert b["std"] == pytest.approx(math.sqrt(450))
    # t on the values would reach 165 - 190.6 < 0; on a log scale it is 165 / e^(190.6/165)
    f = math.exp(12.7062 * math.sqrt(450) / math.sqrt(2) / 165)
    assert b["ci_low"] == pytest.approx(165 / f, rel=1e-4) and b["ci_low"] > 0
    c = rows[("5tuple", "time_ns@incast")]  # 50 and 70; seed 2 has no value
    assert (c["n"], c["mean"], c["job"]) == (2, 60, "incast")
    assert ("eecmp", "time_ns@absent") not in rows  # no value in any run of the configuration
    one = rows[("eecmp", "time_ns@incast")]  # 60 and 60: no spread, an interval of width 0
    assert (one["std"], one["ci_low"], one["ci_high"]) == (0, 60, 60)
    # effects, paired by seed: seed 1 (150-100)/100 = 0.5, seed 3 (180-120)/120 = 0.5
    contrast, reverse = out["contrasts"]
    assert contrast["baseline"] == {"ecmp.policy": "5tuple"}
    assert reverse["label"] == "reverse" and reverse["effects"][0]["change"] == pytest.approx(
        -1 / 3
    )
    (e,) = contrast["effects"]
    assert e["configuration"] == {"ecmp.policy": "eecmp"} and e["pairs"] == 2
    assert e["change"] == pytest.approx(0.5) and e["change_low"] == pytest.approx(0.5)
    assert e["baseline_mean"] == 110 and e["mean"] == 165


def test_show_prints_per_job_rows(results):
    r = CliRunner().invoke(main, ["sweep", "show", str(results), "--metric", "time_ns@ring",
                                  "--metric", "time_ns@incast"])  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    table = lines[lines.index("time_ns") + 1 :]
    rows = [line.split() for line in table[2:6]]
    assert [(row[0], row[1]) for row in rows] == [
        ("5tuple", "ring"), ("5tuple", "incast"), ("eecmp", "ring"), ("eecmp", "incast")
    ]  # fmt: skip
    assert rows[0][3] == "900ns"  # the 5tuple ring's mean of 1000, 900 and 800 ns, with its unit
    assert "+50.0%" in r.output  # the effect table


def test_report_leads_with_the_verdict_then_the_hypothesis_effect_and_published_band(
    results, tmp_path
):
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["sweep", "report", str(results), "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "eecmp spreads better" in page and "40% (made up for the test)" in page
    assert "+50.0%" in page
    assert "Boom" in page  # the failed run is listed with its error
    # the verdict is the headline: before the hypothesis, which is called one
    first = page.index('<p class="verdict"><b>verdict</b>: same direction, larger than published')
    assert first < page.index("<b>hypothesis</b>: eecmp spreads better") < page.index("<h2>")
    assert "<b>finding</b>" not in page
    assert "Student&#x27;s t on a log scale" in page  # the page says how intervals are taken
    from aifabric.experiments.report import finding_lines
    from aifabric.experiments.sweepdir import open_sweep

    lines = finding_lines(open_sweep(results))
    # eecmp against 5tuple, seed by seed: 150/100 and 180/120, both +50%, above "up to 40%"
    assert lines[0] == (
        "verdict:    same direction, larger than published (+50.0%, 95% interval +50.0% to "
        "+50.0%, published +0.0% to +40.0%; policy=eecmp)"
    )
    # 5tuple against eecmp: (100-150)/150 and (120-180)/180, both -1/3, in [-50%, -20%]
    assert lines[1] == (
        "verdict:    reverse: reproduced (-33.3%, 95% interval -33.3% to -33.3%, published "
        "-50.0% to -20.0%; policy=5tuple)"
    )
    assert lines[2] == "hypothesis: eecmp spreads better"
    assert lines[4] == (
        "measured:   reverse: busbw_gbps@ring -33.3% (worse), 95% interval -33.3% to -33.3% "
        "with policy=5tuple against policy=eecmp (2 of 3 seeds paired)"
    )
    assert lines[5] == (
        "published:  40% (made up for the test); as a band, busbw_gbps@ring +0.0% to +40.0%"
    )
    assert page.count("Plotly.newPlot") == 2  # busbw and job time: every seed, the means


def _verdicts(results, band=None, reverse=None):
    from aifabric.experiments.report import finding_lines
    from aifabric.experiments.sweepdir import open_sweep

    spec = json.loads((results / "sweep.json").read_text())
    for contrast, value in ((spec["report"], band), (spec["report"]["contrasts"][0], reverse)):
        if value is not None:
            contrast["published_band"] = value
    (results / "sweep.json").write_text(json.dumps(spec))
    lines = finding_lines(open_sweep(results))
    return [line.split(" (")[0] for line in lines if line.startswith("verdict")]


@pytest.mark.parametrize(
    ("band", "reverse", "says"),
    [
        # eecmp +50% on both seeds; the reverse contrast -33.3%
        ([0.3, 0.6], [-0.5, -0.2], ["reproduced", "reverse: reproduced"]),
        ([0.5, None], [None, -1 / 3], ["reproduced", "reverse: reproduced"]),  # touching
        ([0, 0.4], [-0.2, -0.1], ["same direction, larger than published",
                                  "reverse: same direction, larger than published"]),
        ([0.6, None], [-0.9, -0.5], ["same direction, smaller than published",
                                     "reverse: same direction, smaller than published"]),
        ([None, 0], [0, None], ["not reproduced", "reverse: not reproduced"]),
    ],
)  # fmt: skip
def test_each_verdict_follows_the_interval_against_the_band(results, band, reverse, says):
    assert [v.removeprefix("verdict:    ") for v in _verdicts(results, band, reverse)] == says


def test_an_interval_across_zero_is_inconclusive_whatever_the_band(results):
    # eecmp's third seed as slow as 5tuple's: +50% and -16.7%, an interval across zero,
    # which overlaps a band of "up to 40%" but cannot tell an effect from none
    table = results / "results.csv"
    table.write_text(
        table.read_text().replace("5,eecmp,3,complete,,180", "5,eecmp,3,complete,,100")
    )
    for band in ([0, 0.4], [None, 0], [0.3, None]):
        assert _verdicts(results, band)[0] == "verdict:    inconclusive"


def test_without_a_published_band_the_verdict_says_what_was_measured(results):
    from aifabric.experiments.report import finding_lines
    from aifabric.experiments.sweepdir import open_sweep

    spec = json.loads((results / "sweep.json").read_text())
    del spec["report"]["published_band"], spec["report"]["contrasts"][0]["published_band"]
    (results / "sweep.json").write_text(json.dumps(spec))
    verdicts = [line for line in finding_lines(open_sweep(results)) if line.startswith("verdict")]
    assert verdicts == [
        "verdict:    no published figure; better in every interval",  # +50% on both seeds
        "verdict:    reverse: no published figure; worse in every interval",
    ]


def test_the_page_says_which_dcqcn_preset_the_runs_ran(results):
    from aifabric.experiments.report import finding_lines
    from aifabric.experiments.sweepdir import open_sweep

    for run, cc in (("a", {"kind": "dcqcn", "preset": "cx-400g"}), ("b", {"kind": "none"}),
                    ("c", {"kind": "dcqcn", "preset": "cx-400g"}),
                    ("d", {"kind": "dcqcn", "preset": "paper-40g"})):  # fmt: skip
        (results / "runs" / run).mkdir(parents=True)
        (results / "runs" / run / "run.json").write_text(
            json.dumps({"scenario": {"congestion_control": cc}})
        )
    lines = finding_lines(open_sweep(results))
    assert (
        "DCQCN:      preset cx-400g in 2, paper-40g in 1 of 6 runs (the others without DCQCN)"
        in lines
    )


@pytest.mark.parametrize(
    ("band", "says"),
    [([0.4], "must be [low, high]"), ([0.4, 0.1], "low below high"),
     ([-0.1, 0.3], "both at or above 0"), (["0", 0.4], "must be [low, high]"),
     ([True, 2], "must be [low, high]")],
)  # fmt: skip
def test_a_published_band_that_is_not_one_is_one_sentence(band, says):
    raw = {"sweep": {"scenario": "demo"}, "grid": {"ecmp.policy": ["5tuple", "eecmp"]},
           "report": {"baseline": {"ecmp.policy": "5tuple"}, "published_band": band}}  # fmt: skip
    with pytest.raises(SpecError) as e:
        sweep_from_dict(raw, "t")
    assert says in str(e.value) and "\n" not in str(e.value)
    raw["report"] = {"published_effect": 0.4}  # replaced by published_band
    with pytest.raises(SpecError, match="unknown key report.published_effect; .*published_band"):
        sweep_from_dict(raw, "t")


def test_an_open_end_of_a_band_is_kept_as_null_in_sweep_json():
    import tomllib

    raw = tomllib.loads(
        '[sweep]\nscenario = "demo"\n[grid]\n"ecmp.policy" = ["5tuple", "eecmp"]\n'
        '[report]\nbaseline = { "ecmp.policy" = "5tuple" }\npublished_band = [0.3, inf]\n'
    )
    sweep = sweep_from_dict(raw, "t")
    assert sweep.report["published_band"] == [0.3, None]
    assert json.loads(json.dumps(sweep.to_dict(), allow_nan=False))["report"]["published_band"] == [
        0.3, None
    ]  # fmt: skip


def test_the_plots_show_the_aggregates_and_every_seed(results):
    from aifabric.experiments.report import _metric_figure, config_colours
    from aifabric.experiments.sweepdir import open_sweep

    res = open_sweep(results)
    rows = res.aggregate(["time_ns@ring", "time_ns@incast"])
    fig = _metric_figure(res, "time_ns", rows, config_colours(res))
    # a panel per job, in each a configuration's seeds and then its mean with its interval
    assert [a.text for a in fig.layout.annotations] == ["ring", "incast"]
    ring = [t for t in fig.data if t.xaxis == "x"]
    seeds_5tuple, mean_5tuple, seeds_eecmp, mean_eecmp = ring
    assert list(mean_5tuple.x) == ["5tuple"] and list(mean_eecmp.x) == ["eecmp"]
    means = [0.9, 0.65]  # microseconds: (1000+900+800)/3, 650
    assert [mean_5tuple.y[0], mean_eecmp.y[0]] == pytest.approx(means)
    # log-scale intervals: mean / f to mean * f, f = e^(h / mean), h = 4.303 * 100 / sqrt(3)
    # for 900 ns and 12.706 * 70.71 / sqrt(2) for 650 ns: bars from the mean to each end
    f = [math.exp(4.3027 * 100 / math.sqrt(3) / 900),
         math.exp(12.7062 * math.sqrt(5000) / math.sqrt(2) / 650)]  # fmt: skip
    for trace, m, x in zip((mean_5tuple, mean_eecmp), means, f, strict=True):
        assert trace.error_y.symmetric is False
        assert trace.error_y.array[0] == pytest.approx(m * x - m, rel=1e-4)
        assert trace.error_y.arrayminus[0] == pytest.approx(m - m / x, rel=1e-4)
        assert m - trace.error_y.arrayminus[0] > 0
    assert list(seeds_5tuple.y) + list(seeds_eecmp.y) == pytest.approx([1.0, 0.9, 0.8, 0.7, 0.6])
    assert list(seeds_5tuple.text) + list(seeds_eecmp.text) == [
        "seed 1", "seed 2", "seed 3", "seed 1", "seed 3"
    ]  # fmt: skip


def test_busbw_against_size_on_a_log_axis(tmp_path):
    rows = ["point,workload.size,seed,status,busbw_gbps@ar"]
    for i, (size, seed, bw) in enumerate(
        [("1MiB", 1, 10), ("1MiB", 2, 12), ("64MiB", 1, 300), ("64MiB", 2, 320)]
    ):
        rows.append(f"{i},{size},{seed},complete,{bw}")
    (tmp_path / "results.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "sweep.json").write_text(json.dumps({"name": "s", "keys": ["workload.size"]}))
    from aifabric.experiments.report import build_report

    page = build_report(tmp_path)
    assert "busbw against message size" in page
    assert '"type":"log"' in page
    assert "[1048576,67108864]" in page.replace(" ", "")


def test_every_shipped_experiment_loads_every_configuration():
    from aifabric.experiments.catalog import experiment_names, experiment_spec
    from aifabric.experiments.spec import load_sweep
    from aifabric.scenarios import load_scenario

    names = experiment_names()
    assert names == ["busbw-vs-size", "congestion-control", "ecmp-entropy", "maintenance-waves",
                     "oversubscription", "path-pinning", "topology-aware-scheduling",
                     "training-iteration"]  # fmt: skip
    for name in names:
        for full in (False, True):
            sweep = load_sweep(experiment_spec(name), full=full)
            assert len(sweep.seeds) >= 3, name
            report = sweep.report
            assert report["metric"] and report["finding"] and report["published"], name
            for key in report.get("baseline", {}):
                assert key in sweep.keys, (name, key)
        seen = set()
        for point in sweep.points():
            config = tuple(sorted(point.labels.items()))
            if config in seen:
                continue
            seen.add(config)
            sc = load_scenario(sweep.scenario, seed=1, overrides=list(point.overrides))
            for key, value in point.overrides:
                if key == "ecmp.policy":
                    assert sc.ecmp == value
                if key == "congestion_control.kind":
                    assert sc.cc == value
                if key == "maintenance":  # every spine drained and restored once, or no plan
                    spines = int((sc.fabric.node_role == 2).sum())
                    assert len(sc.faults) == (2 * spines if value else 0)
                if key == "workload.scheduler":  # every job placed by it, none refused
                    assert sc.extra["schedule"]["scheduler"] == value
                    assert len(sc.extra["schedule"]["jobs"]) == len(sc.workload["jobs"])
        assert len(seen) == len(sweep.configurations()), name


def test_experiment_list_and_unknown_names():
    r = CliRunner().invoke(main, ["experiment", "list", "--json"])
    assert r.exit_code == 0, r.output
    rows = {e["name"]: e for e in json.loads(r.output)}
    assert rows["ecmp-entropy"]["runs"] == 2 * 4 * 2 * 3
    assert rows["path-pinning"]["runs"] == 2 * 2 * 3 * 3
    bad = CliRunner().invoke(main, ["experiment", "run", "ecmp-entropi", "-o", "x"])
    assert bad.exit_code == 1
    assert bad.output.startswith("Error: unknown experiment 'ecmp-entropi'; the experiments are")


def test_sweep_misuse_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "never"
    both = CliRunner().invoke(main, ["sweep", "demo", "--vary", "ecmp.policy=5tuple,eecmp",
                                     "--workers", "2", "--scheduler", "tcp://127.0.0.1:9",
                                     "-o", str(out)])  # fmt: skip
    assert both.exit_code == 2 and "--workers sizes a local cluster" in both.output
    typo = CliRunner().invoke(
        main, ["sweep", "demo", "--vary", "ecmp.polcy=5tuple", "-o", str(out)]
    )
    assert typo.exit_code == 1
    assert typo.output == "Error: unknown key ecmp.polcy: [ecmp] takes policy, same_seed\n"
    assert not out.exists()


def test_the_progress_line_counts_points_failures_and_time_left():
    import time

    from aifabric.experiments.runner import Progress

    # 2 points from before, 2 run in 10 s (one failed): 4 left at 5 s each
    line = Progress(total=8, reused=2, done=2, failed=1, started=time.monotonic() - 10).line()
    assert line.startswith("  4/8 points done  1 failed")
    assert line.endswith("0m10s elapsed  about 0m20s left")
    fresh = Progress(total=8, reused=2, started=time.monotonic()).line()
    assert "2/8 points done  0 failed" in fresh and "left" not in fresh  # nothing run: no guess
    done = Progress(total=2, reused=0, done=2, started=time.monotonic() - 5).line()
    assert "2/2 points done" in done and "left" not in done
