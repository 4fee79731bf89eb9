"""The HTML report: self-contained, and every plot renders in headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aifabric.cli import main
from tests.test_analysis_run import make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    make_run(folder / "run")
    out = folder / "report.html"
    r = CliRunner().invoke(main, ["report", str(folder / "run"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def capture_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "capture.html"
    r = CliRunner().invoke(main, ["report", str(DATA / "golden_multi.pcapng"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


def render_in_chromium(report, profile):
    """The page rendered by headless Chromium: its `#aifabric-check` record (plots, errors,
    and every figure's data as Plotly holds it)."""
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}",
        "--virtual-time-budget=10000", "--dump-dom", report.as_uri(),
    ]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="aifabric-check">([^<]*)</pre>', dom)
    assert m and m.group(1), "the page's load hook did not run"
    return json.loads(html.unescape(m.group(1)))


def test_report_is_self_contained(report):
    text = report.read_text()
    assert not re.search(r"<script[^>]+src=", text), "a script is loaded from elsewhere"
    assert not re.search(r"<link[^>]+href=", text), "a stylesheet is loaded from elsewhere"
    assert "plotly.js v" in text  # the library itself is inlined
    assert "Plotly.newPlot" in text
    expected = int(re.search(r'data-plots="(\d+)"', text).group(1))
    # throughput of the jobs' receivers and of the busiest links, fabric, two ECMP tiers
    # (up, and down over lab-small's parallel links), queue heat map, ECN/CNP/PFC,
    # completion times, collectives
    assert expected == 9
    summary = json.loads(
        re.search(r'id="aifabric-summary">([^<]*)</script>', text).group(1).replace("&quot;", '"')
    )
    assert summary["pfc_frames"] == 5


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    check = render_in_chromium(report, tmp_path / "profile")
    assert check["errors"] == []
    assert check["plots"] == check["expected"] == 9
    assert check["rendered"] == check["plots"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package chromium)")
def test_capture_report_renders_in_headless_chromium(capture_report, tmp_path):
    check = render_in_chromium(capture_report, tmp_path / "profile")
    assert check["errors"] == []
    # throughput, ECN/CNP/PFC, load per interface (3 interfaces), flow durations
    assert check["plots"] == check["expected"] == 4
    assert check["rendered"] == check["plots"]
    # a few CNPs and PFC frames per bin: whole-number ticks, each label once
    (timeline,) = [f for f in check["figures"] if f["title"].startswith("ECN marks")]
    for axis in timeline["axes"]:
        assert len(set(axis["ticks"])) == len(axis["ticks"]), axis
        if axis["name"].startswith("yaxis"):
            assert all(t.replace(",", "").isdigit() for t in axis["ticks"]), axis


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian package chromium)")
def test_report_screenshot_runs_aifabric_with_the_checkouts_python(report, tmp_path):
    """scripts/report-screenshot starts as whatever `python3` is first on PATH (here not the
    virtual environment's) and runs aifabric with the environment's Python."""
    script = Path(__file__).parent.parent / "scripts" / "report-screenshot"
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    env = {**os.environ, "PATH": path, "AIFABRIC_VENV": sys.prefix}
    env.pop("PYTHONPATH", None)
    out = tmp_path / "shot.png"
    r = subprocess.run(
        [str(script), str(report.parent / "run"), "-o", str(out), "--height", "2000"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    r = subprocess.run(
        [str(script), str(tmp_path / "missing"), "-o", str(tmp_path / "no.png")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.strip() == f"Error: {tmp_path / 'missing'} does not exist"


def test_truncated_capture_report_warns(tmp_path):
    out = tmp_path / "t.html"
    r = CliRunner().invoke(main, ["report", str(DATA / "golden_truncated.pcap"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "read 24 of ~25 records" in r.stderr
    assert "read 24 of ~25 records" in out.read_text()


def test_a_cnp_series_is_plotted_when_the_engine_samples_one(tmp_path):
    """ports.npz may carry CNPs per port and interval (`cnp_sent`); then the timeline draws
    them beside the ECN marks, and the title keeps the engine's total."""
    import numpy as np

    from aifabric.analysis.metrics import run_metrics
    from aifabric.analysis.report import build_report
    from aifabric.fabric.rundir import Run

    make_run(tmp_path / "run")
    stored = Run(tmp_path / "run").ports()  # written dense, as runs before entries were
    ports = {k: stored[k] for k in stored}
    cnp = np.zeros_like(ports["ecn_marked"])
    cnp[2, 0], cnp[4, 3] = 2, 5
    np.savez(tmp_path / "run" / "ports.npz", cnp_sent=cnp, **ports)
    m = run_metrics(Run(tmp_path / "run"), series=True).to_dict()
    assert m["series"]["cnp_sent"] == [0, 0, 2, 0, 5, 0, 0, 0, 0, 0]
    assert m["cnp_sent"] == 7  # run.json records no total here: the series' sum
    page = build_report(Run(tmp_path / "run"))
    assert '"name":"CNPs"' in page and "ECN-marked packets and CNPs per interval" in page
    assert "7 CNPs sent" in page
