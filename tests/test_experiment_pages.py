"""An experiment's page tells its story: a configuration has one colour on every chart, a
metric's axis starts at zero (a spread of 0.1% stays a thin band), and the mechanism is
charted beside the outcome, each point the results table's. Checked on the Plotly figures
the page holds, read back from its HTML."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from aifabric.cli import main

# busbw of a ring AllReduce under two policies, three seeds each, beside the uplinks' ECMP
# imbalance and PFC pause time; busbw spreads by 0.1% at most within a policy
CSV = """point,ecmp.policy,seed,status,error,busbw_gbps@ring,goodput_gbps@incast,time_ns@ring,ecmp_max_mean.rtsw>ctsw,paused_ns,run_dir
0,5tuple,1,complete,,200.0,350,1000,3.0,500,runs/a
1,5tuple,2,complete,,200.2,340,999,2.5,400,runs/b
2,5tuple,3,complete,,200.1,345,998,2.0,450,runs/c
3,eecmp,1,complete,,300.0,351,700,1.5,100,runs/d
4,eecmp,2,complete,,300.3,352,701,1.2,120,runs/e
5,eecmp,3,complete,,300.1,349,699,1.1,90,runs/f
"""  # noqa: E501


@pytest.fixture
def sweep(tmp_path):
    (tmp_path / "results.csv").write_text(CSV)
    report = {"metric": "busbw_gbps@ring", "baseline": {"ecmp.policy": "5tuple"}}
    spec = {"name": "pages", "scenario": "demo", "seeds": [1, 2, 3], "keys": ["ecmp.policy"],
            "report": report}  # fmt: skip
    (tmp_path / "sweep.json").write_text(json.dumps(spec))
    return tmp_path


def _figures(page: str) -> list[dict]:
    """Every figure of the page as Plotly draws it: its data and layout."""
    out = []
    decoder = json.JSONDecoder()
    for m in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', page):
        data, end = decoder.raw_decode(page, m.end())
        layout, _ = decoder.raw_decode(page, page.index("{", end))
        out.append({"data": data, "layout": layout})
    return out


def _page(sweep, tmp_path) -> list[dict]:
    out = tmp_path / "page.html"
    r = CliRunner().invoke(main, ["sweep", "report", str(sweep), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return _figures(out.read_text())


def _values(rows, column):
    return {
        p: [float(r[column]) for r in rows if r["ecmp.policy"] == p] for p in ("5tuple", "eecmp")
    }


def _rows():
    head, *lines = CSV.strip().splitlines()
    return [dict(zip(head.split(","), line.split(","), strict=True)) for line in lines]


def test_a_configuration_has_one_colour_on_every_chart(sweep, tmp_path):
    figures = _page(sweep, tmp_path)
    # the mechanism beside the outcome, then the headline metrics: busbw, the incast's
    # goodput (a pattern's throughput) and time
    titles = [f["layout"]["title"]["text"].split(":")[0] for f in figures]
    assert titles[1:] == ["busbw_gbps", "goodput_gbps", "time_ns"]
    colours: dict[str, set] = {}
    for fig in figures:
        for trace in fig["data"]:
            group = trace.get("legendgroup")
            if group:
                colours.setdefault(group, set()).add(trace["marker"]["color"])
    assert set(colours) == {"5tuple", "eecmp"}
    assert all(len(c) == 1 for c in colours.values()), colours
    assert colours["5tuple"] != colours["eecmp"]


def test_a_metric_axis_starts_at_zero_so_a_tiny_spread_stays_tiny(sweep, tmp_path):
    """The rule: a metric's y axis runs from 0 (or its lowest value, when below 0) to 5%
    past its highest value or interval end."""
    figures = _page(sweep, tmp_path)
    busbw = next(f for f in figures if f["layout"]["title"]["text"].startswith("busbw_gbps:"))
    low, high = busbw["layout"]["yaxis"]["range"]
    seeds = [y for t in busbw["data"] if t["name"] in ("5tuple", "eecmp") for y in t["y"]]
    means = [t for t in busbw["data"] if t["name"].endswith("mean, 95% interval")]
    tops = [t["y"][0] + t["error_y"]["array"][0] for t in means]
    assert low == 0
    assert high == pytest.approx(1.05 * max(seeds + tops))
    # within a policy busbw spreads by 0.1%: on this axis that is under 0.2% of its height
    spread = max(_values(_rows(), "busbw_gbps@ring")["5tuple"]) - 200.0
    assert spread / (high - low) < 0.002


def test_the_mechanism_is_charted_beside_the_outcome(sweep, tmp_path):
    figures = _page(sweep, tmp_path)
    fig = figures[0]
    assert fig["layout"]["title"]["text"] == (
        "busbw_gbps@ring beside its mechanism, ecmp_max_mean.rtsw>ctsw"
    )
    rows = _rows()
    ecmp, busbw = _values(rows, "ecmp_max_mean.rtsw>ctsw"), _values(rows, "busbw_gbps@ring")
    by_axis: dict[str, dict[str, list]] = {}
    for trace in fig["data"]:
        if trace["mode"] == "markers" and "seed" in (trace.get("text") or [""])[0]:
            by_axis.setdefault(trace.get("xaxis", "x"), {})[trace["legendgroup"]] = trace
    # left: the mechanism per configuration; middle: the outcome; right: one dot per run
    for policy in ("5tuple", "eecmp"):
        assert by_axis["x"][policy]["y"] == pytest.approx(ecmp[policy])
        assert by_axis["x2"][policy]["y"] == pytest.approx(busbw[policy])
        assert by_axis["x3"][policy]["x"] == pytest.approx(ecmp[policy])
        assert by_axis["x3"][policy]["y"] == pytest.approx(busbw[policy])
    for axis in ("yaxis", "yaxis2", "yaxis3", "xaxis3"):
        assert fig["layout"][axis]["range"][0] == 0, axis


def test_a_named_mechanism_is_charted_and_a_missing_one_is_one_sentence(sweep, tmp_path):
    spec = json.loads((sweep / "sweep.json").read_text())
    spec["report"]["mechanism"] = "paused_ns"
    (sweep / "sweep.json").write_text(json.dumps(spec))
    fig = _page(sweep, tmp_path)[0]
    assert fig["layout"]["title"]["text"] == "busbw_gbps@ring beside its mechanism, paused_ns"
    spec["report"]["mechanism"] = "paused"
    (sweep / "sweep.json").write_text(json.dumps(spec))
    r = CliRunner().invoke(main, ["sweep", "report", str(sweep), "-o", str(tmp_path / "x.html")])
    assert r.exit_code == 1
    assert r.output.startswith("Error: report.mechanism = 'paused': the results have no such")
    assert r.output.count("\n") == 1
