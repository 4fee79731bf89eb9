"""The run report's story, read back from headless Chromium and checked against the run
directory: each job's run shaded in its colour (one colour per job on every chart), its
stretches under half its receivers' line rate shaded as its own, every job with a
throughput figure (busbw for a collective, goodput for a pattern), and a fabric too big
to draw node by node shown by rack and zone."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.analysis import report as report_module
from aifabric.analysis.render import fmt
from aifabric.cli import main
from aifabric.fabric.export import fabric_from_topology
from aifabric.fabric.rundir import Run
from tests.test_analysis_jobs import _run
from tests.test_analysis_report import CHROMIUM, render_in_chromium

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian package chromium)"
)
SCENARIOS = Path(__file__).resolve().parent.parent / "experiments/specs/scenarios"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return _run(["demo"], tmp_path_factory.mktemp("demo") / "run")


@pytest.fixture(scope="module")
def two_zones(tmp_path_factory):
    """A 128-GPU AllReduce scattered over two AI Zones joined by ATSWs (262 nodes)."""
    scenario = str(SCENARIOS / "oversubscription.toml")
    path = tmp_path_factory.mktemp("zones") / "run"
    return _run([scenario, "--set", "workload.size=4MiB", "--set",
                 "workload.placement=fragmented"], path)  # fmt: skip


def _figures(run: Run, tmp_path: Path) -> tuple[dict, list]:
    """The report's figures by title (up to a colon or a parenthesis), and all of them."""
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["report", str(run.path), "-o", str(out)])
    assert r.exit_code == 0, r.output
    check = render_in_chromium(out, tmp_path / "profile")
    assert check["errors"] == []
    assert check["plots"] == check["rendered"] == check["expected"]
    figures = check["figures"]
    return {f["title"].split(":")[0].split(" (")[0]: f for f in figures}, figures


def _job_windows(run: Run) -> dict[int, tuple[int, int]]:
    """Each job's first op's start and last op's end, from collectives.npz."""
    col = run.collectives()
    return {
        int(j): (int(col["start_ns"][col["job"] == j].min()),
                 int(col["end_ns"][col["job"] == j].max()))
        for j in np.unique(col["job"])
    }  # fmt: skip


def _receiver_utilization(run: Run, job: int) -> np.ndarray:
    """Per sample, the job's receivers' downlinks' bytes over their line rate (ports.npz)."""
    fabric = fabric_from_topology(run.topology())
    flows, ports = run.flows(), run.ports()
    downs = {int(fabric.nic_port[d]) ^ 1 for d in np.unique(flows["dst"][flows["job"] == job])}
    cols = [j for j, p in enumerate(ports["port"]) if int(p) in downs]
    rate = float(sum(fabric.port_rate_bps[int(ports["port"][c])] for c in cols))
    rx = ports["tx_bytes"][:, cols].sum(axis=1)
    return rx * 8e9 / int(ports["interval_ns"]) / rate


@needs_chromium
def test_each_job_is_shaded_over_its_own_run_in_its_own_colour(demo, tmp_path):
    figs, _ = _figures(demo, tmp_path)
    names = {0: "allreduce", 1: "incast"}
    ports = demo.ports()
    t0, step = int(ports["t_ns"][0]), int(ports["interval_ns"])
    thr = figs["Throughput into each job's receivers"]
    colour = {names[j]: t["line_color"] for j, t in enumerate(thr["data"])}
    assert len(set(colour.values())) == 2  # two jobs, two colours
    for job, (start, end) in _job_windows(demo).items():
        name = names[job]
        (span,) = [s for s in thr["shapes"] if s.get("name") == f"{name}: runs"]
        assert (span["x0"], span["x1"]) == pytest.approx(((start - t0) / 1e3, (end - t0) / 1e3))
        assert span["fillcolor"] == colour[name]
        # its stretches under half the line rate: its own shapes, in its colour, from 0 to the
        # 50% mark, covering exactly its intervals that ran whole inside its run and were low
        low = [s for s in thr["shapes"] if s.get("name") == f"{name}: below 50%"]
        assert all(s["fillcolor"] == colour[name] and (s["y0"], s["y1"]) == (0, 50) for s in low)
        util = _receiver_utilization(demo, job)
        for t, u in zip(ports["t_ns"].astype(int), util, strict=True):
            x0, x1 = (t - t0) / 1e3, (t + step - t0) / 1e3
            covered = any(s["x0"] <= x0 + 1e-9 and x1 <= s["x1"] + 1e-9 for s in low)
            assert covered == (u < 0.5 and start <= t and t + step <= end), (name, t, u)
    # each job named on its run with its time beside its time on an idle fabric: NCCL's
    # cost model for the AllReduce (collectives.npz's predicted_ns), line rate for the incast
    col = demo.collectives()
    start, end = _job_windows(demo)[0]
    model = int(col["predicted_ns"][col["job"] == 0].sum())
    assert (
        f"allreduce: {fmt(end - start, 'time')} (NCCL model {fmt(model, 'time')})"
        in (thr["annotations"])
    )
    start, end = _job_windows(demo)[1]
    ideal = 8 * 4_000_000 * 8 // 400  # 8 senders x 4 MB into one 400G NIC, in ns
    assert (
        f"incast: {fmt(end - start, 'time')} (line rate {fmt(ideal, 'time')})"
        in (thr["annotations"])
    )
    # the incast went quiet for a stretch: its own band, not the AllReduce's
    assert any(s.get("name") == "incast: below 50%" for s in thr["shapes"])
    # the queue heat map's rows, built from the port samples' entries, are ports.npz's
    fabric = fabric_from_topology(demo.topology())
    column = {fabric.port_name(int(p)): j for j, p in enumerate(ports["port"])}
    heat = figs["Queue depth"]["data"][0]
    for name, row in zip(heat["y"], heat["customdata"], strict=True):
        assert row == ports["qdepth_max_bytes"][:, column[name]].tolist(), name
    # one colour per job on every chart that shows jobs
    coll = figs["Collectives"]["data"][0]
    assert coll["marker_color"] == [colour[n] for n in coll["y"]]
    for trace in figs["Flow completion times, CDF per job"]["data"]:
        assert trace["line_color"] == colour[trace["name"].split(" (")[0]]


def test_every_job_has_a_throughput_figure_busbw_or_goodput(demo, tmp_path):
    """The incast is a pattern: no busbw (nccl-tests' figure of a collective) but its goodput,
    the bytes of its flows that finished over its time, in `analyze`, the report and
    `compare`; the AllReduce keeps its busbw."""
    flows, col = demo.flows(), demo.collectives()
    start, end = _job_windows(demo)[1]
    delivered = int(flows["bytes"][(flows["job"] == 1) & (flows["end_ns"] >= 0)].sum())
    goodput = delivered * 8e9 / (end - start)
    busbw = float(col["busbw_bps"][col["job"] == 0].mean())
    m = json.loads(CliRunner().invoke(main, ["analyze", str(demo.path), "--json"]).output)
    allreduce, incast = m["jobs"]
    assert incast["goodput_bps"] == pytest.approx(goodput, rel=1e-12)
    assert incast["busbw_bps"]["count"] == 0 and allreduce["goodput_bps"] is None
    assert allreduce["busbw_bps"]["mean"] == pytest.approx(busbw)
    text = CliRunner().invoke(main, ["analyze", str(demo.path)]).output
    lines = text.splitlines()
    h = next(i for i, line in enumerate(lines) if line.startswith("job "))
    at = lines[h].index("goodput")
    rows = {line.split()[0]: line for line in lines[h + 2 : h + 4]}
    assert rows["incast"][at:].split()[0] == fmt(goodput, "rate")
    assert rows["allreduce"][at:].split()[0] == "-"
    # the report's jobs table and the summary it embeds
    out = tmp_path / "r.html"
    assert CliRunner().invoke(main, ["report", str(demo.path), "-o", str(out)]).exit_code == 0
    page = out.read_text()
    table = re.search(r'<table class="summary" id="jobs">(.*?)</table>', page).group(1)
    heads = re.findall(r"<th>([^<]*)</th>", table.split("</tr>")[0])
    cells = {row.split("</th>")[0].split("<th>")[-1]: re.findall(r'<td[^>]*>([^<]*)</td>', row)
             for row in table.split("</tr>")[1:-1]}  # fmt: skip
    g = heads.index("goodput (patterns: bytes delivered / time)") - 1  # after the job's name
    b = heads.index("busbw (nccl-tests, collectives)") - 1
    assert (cells["incast"][g], cells["incast"][b]) == (fmt(goodput, "rate"), "-")
    assert (cells["allreduce"][g], cells["allreduce"][b]) == ("-", fmt(busbw, "rate"))
    summary = json.loads(html.unescape(re.search(r'id="aifabric-summary">([^<]*)<', page)[1]))
    assert summary["jobs"][1]["goodput_bps"] == pytest.approx(goodput, rel=1e-12)
    out = CliRunner().invoke(main, ["compare", str(demo.path)]).output
    labels = [line.split(":")[0] + ":" + line.split(":")[1].split()[0] for line in
              out.splitlines() if line.startswith("job ")]  # fmt: skip
    assert "job incast (incast):goodput" in labels and "job incast (incast):busbw" not in labels
    assert "job allreduce (allreduce):busbw" in labels
    assert "job allreduce (allreduce):goodput" not in labels
    # a sweep's results table: the incast's goodput, the AllReduce's busbw
    from aifabric.experiments.columns import point_metrics
    from aifabric.scenarios import load_scenario

    row = point_metrics(demo.path, load_scenario("demo"), ("busbw",))
    assert row["goodput_gbps@incast"] == pytest.approx(goodput / 1e9, rel=1e-12)
    assert row["busbw_gbps@allreduce"] == pytest.approx(busbw / 1e9)
    assert "busbw_gbps@incast" not in row and "goodput_gbps@allreduce" not in row


def _lower_end(nodes: list[dict], a: int, b: int) -> dict:
    roles = ("nic", "rtsw", "ctsw", "atsw")
    return nodes[a] if roles.index(nodes[a]["role"]) <= roles.index(nodes[b]["role"]) else nodes[b]


@needs_chromium
def test_a_big_fabric_is_drawn_by_rack_and_zone(two_zones, tmp_path, monkeypatch):
    """Above MAX_DRAWN_NODES (lowered here to the test fabric's size), the fabric is a heat
    map of each rack's links per tier and bars of each zone's links to the ATSWs; their bytes
    are the port series', summed by the topology.json's racks and zones."""
    monkeypatch.setattr(report_module, "MAX_DRAWN_NODES", 200)
    monkeypatch.setattr(report_module, "MAX_UPLINK_SWITCHES", 4)
    figs, figures = _figures(two_zones, tmp_path)
    topo = two_zones.topology()
    nodes = topo["nodes"]
    index = {n["name"]: i for i, n in enumerate(nodes)}
    fabric = fabric_from_topology(topo)
    ports = two_zones.ports()
    tx = ports["tx_bytes"].sum(axis=0)
    span = int(ports["interval_ns"]) * len(ports["t_ns"])
    want: dict[tuple, list[int]] = {}
    for j, p in enumerate(ports["port"]):
        a_name, b_name = fabric.port_name(int(p)).split("--")
        a, b = index[a_name], index[b_name.split("#")[0]]
        low = _lower_end(nodes, a, b)
        tier = f"{nodes[a]['role']}>{nodes[b]['role']}"
        place = low["rack"] if low["role"] in ("nic", "rtsw") else -1
        cell = want.setdefault((low["zone"], tier, place), [0, 0])
        cell[0] += int(tx[j])
        cell[1] += 1
    racks = figs["Fabric by rack"]["data"][0]
    assert racks["type"] == "heatmap"
    got = {}
    for y, zrow, drow in zip(racks["y"], racks["z"], racks["customdata"], strict=True):
        zone, tier = int(y.split()[0][1:]), y.split()[1]
        for x, z, d in zip(racks["x"], zrow, drow, strict=True):
            if d is not None:
                got[(zone, tier, int(x))] = d
                assert z == pytest.approx(100 * d[0] * 8e9 / span / (d[1] * 400e9))
    zones = figs["Fabric by zone"]["data"]
    for trace in zones:
        for x, d in zip(trace["x"], trace["customdata"], strict=True):
            got[(int(x[1:]), trace["name"], -1)] = d
    assert {k: list(v) for k, v in got.items()} == want
    assert sum(v[0] for v in got.values()) == int(tx.sum())
    assert {t["name"] for t in zones} == {"ctsw>atsw", "atsw>ctsw"}
    # ECMP over many switches: one bar per switch, the analyzer's max/mean, most unbalanced
    # first, beside uniform hashing's
    from aifabric.analysis.metrics import run_metrics

    m = run_metrics(two_zones)
    for tier in m.ecmp.tiers:
        rows = [r for r in m.ecmp.switches if r.tier == tier.tier]
        if len(rows) <= 4:
            continue
        (fig,) = [f for f in figures if f["title"].startswith(f"{tier.tier}:")
                  and f["data"][0]["name"] == "observed"]  # fmt: skip
        observed, uniform = fig["data"]
        rows.sort(key=lambda r: (-r.bytes.max_mean, r.switch))
        assert observed["x"] == [r.switch for r in rows]
        assert observed["y"] == pytest.approx([r.bytes.max_mean for r in rows])
        assert uniform["y"] == pytest.approx([r.bytes_expected.max_mean for r in rows])
