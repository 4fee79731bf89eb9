"""The Python API (`aifabric.run`, `load`, `sweep`): DataFrames that agree with the run
directory, typed metrics that equal `analyze --json`, overrides that take effect, and
errors in one sentence."""

from __future__ import annotations

import dataclasses
import html
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import aifabric
from aifabric.analysis.results import Job, RunMetrics
from aifabric.cli import main
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.rundir import Run as RunDir

ROOT = Path(__file__).resolve().parent.parent
ONE_FLOW = ROOT / "benchmarks" / "one-flow.toml"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return aifabric.run("demo", tmp_path_factory.mktemp("api") / "demo")


def test_a_run_is_opened_with_its_record(demo):
    assert isinstance(demo, aifabric.Run)
    assert demo.status == "complete" and demo.engine == "sim"
    assert demo.scenario["name"] == "demo"
    assert demo.scenario["workload"]["jobs"][0]["name"] == "allreduce"
    again = aifabric.load(demo.path)
    assert again.path == demo.path and again.summary == demo.summary


def test_flows_have_units_in_their_columns_and_names_for_ids(demo):
    f = demo.flows
    assert list(f.columns[:17]) == [
        "flow_id", "job", "op", "step", "channel", "src", "dst", "sqpn", "dqpn", "sport",
        "bytes", "start_ns", "end_ns", "duration_ns", "rate_bps", "hops", "finished",
    ]  # fmt: skip
    assert str(f["start_ns"].dtype) == "Int64" and str(f["duration_ns"].dtype) == "Int64"
    assert f["bytes"].dtype == np.int64 and f["rate_bps"].dtype == np.float64
    assert isinstance(f["job"].dtype, pd.CategoricalDtype)
    assert set(f["job"].cat.categories) == {"allreduce", "incast"}
    raw = RunDir(demo.path).flows()
    names = demo.fabric.node_name
    assert list(f["src"].astype(str)) == [names[i] for i in raw["src"]]
    assert f["src"].str.endswith(tuple(f"nic{i}" for i in range(8))).all()
    assert (f["duration_ns"] == f["end_ns"] - f["start_ns"]).all()
    rate = f["bytes"] * 8e9 / f["duration_ns"].astype(float)
    assert np.allclose(f["rate_bps"], rate)
    assert (f["hops"] == np.diff(raw["path_ptr"])).all()


def test_flows_per_job_are_the_run_directorys(demo):
    raw = RunDir(demo.path).flows()
    per_job = demo.flows.groupby("job", observed=True).agg(
        flows=("flow_id", "size"), bytes=("bytes", "sum")
    )
    ids = {name: i for i, name in enumerate(["allreduce", "incast"])}
    for name, row in per_job.iterrows():
        mine = raw["job"] == ids[name]
        assert row["flows"] == mine.sum()
        assert row["bytes"] == raw["bytes"][mine].sum()
    assert per_job["bytes"].sum() == demo.metrics().flows.bytes


def test_an_unfinished_flow_has_no_end_not_minus_one(tmp_path):
    run = aifabric.load(_with_unfinished_flow(tmp_path))
    f = run.flows
    assert f["end_ns"].isna().sum() == 1 and not f["finished"].iloc[0]
    assert pd.isna(f["duration_ns"].iloc[0]) and np.isnan(f["rate_bps"].iloc[0])
    assert f["finished"].iloc[1:].all()


def _with_unfinished_flow(tmp_path) -> Path:
    """The one-flow scenario's run with a second flow, its first marked unfinished."""
    import shutil

    src = aifabric.run(ONE_FLOW, tmp_path / "one")
    path = tmp_path / "edited"
    shutil.copytree(src.path, path)
    with np.load(path / "flows.npz") as z:
        cols = {k: z[k] for k in z.files}
    two = {k: np.concatenate([v, v]) for k, v in cols.items() if k not in ("path_ptr", "path_link")}
    n = int(cols["path_ptr"][-1])
    two["path_ptr"] = np.concatenate([cols["path_ptr"], cols["path_ptr"][1:] + n])
    two["path_link"] = np.concatenate([cols["path_link"], cols["path_link"]])
    two["end_ns"][0] = -1
    np.savez(path / "flows.npz", **two)
    return path


def test_ports_are_one_row_per_sample_and_port_named_as_the_fabric_names_them(demo):
    p = demo.port_cells
    raw = RunDir(demo.path).ports()
    samples, ports = raw["tx_bytes"].shape
    assert len(p) == samples * ports
    for key in ("t_ns", "port", "node", "peer", "tier", "rate_bps", "tx_bytes", "utilization",
                "qdepth_max_bytes", "ecn_marked", "paused_ns", "pfc_sent", "drops"):  # fmt: skip
        assert key in p.columns, key
    by_port = p.groupby("port", observed=True)["tx_bytes"].sum()
    for j, port in enumerate(raw["port"]):
        assert by_port[demo.fabric.port_name(int(port))] == raw["tx_bytes"][:, j].sum()
    row = p.iloc[ports + 3]  # the second sample of the fourth port recorded
    assert row["t_ns"] == raw["t_ns"][1] and row["tx_bytes"] == raw["tx_bytes"][1, 3]
    assert row["utilization"] == pytest.approx(
        row["tx_bytes"] * 8e9 / int(raw["interval_ns"]) / row["rate_bps"]
    )
    assert set(p["tier"].unique()) >= {"nic>rtsw", "rtsw>nic", "rtsw>ctsw", "ctsw>rtsw"}


def test_ports_are_the_cells_in_which_a_port_did_something(demo):
    """The default table leaves out the rows of zeros: the run directory's entries."""
    cells, p = demo.port_cells, demo.ports
    series = ["tx_bytes", "qdepth_max_bytes", "qdepth_mean_bytes", "ecn_marked", "paused_ns",
              "pfc_sent", "drops", "cnp_sent"]  # fmt: skip
    busy = cells[(cells[series] != 0).any(axis=1)].reset_index(drop=True)
    assert len(p) == RunDir(demo.path).ports().n_entries == len(busy) < len(cells)
    pd.testing.assert_frame_equal(p, busy)
    per_port = p.groupby("port", observed=False)["tx_bytes"].sum()  # every port a row
    assert per_port.to_dict() == cells.groupby("port", observed=False)["tx_bytes"].sum().to_dict()


def test_collectives_agree_with_the_metrics(demo):
    c = demo.collectives
    ops = demo.metrics().collectives.ops
    assert len(c) == len(ops)
    for (_, row), op in zip(c.iterrows(), ops, strict=True):
        assert row["job"] == op.job_name and row["kind"] == op.kind
        assert row["time_ns"] == op.time_ns
        assert row["busbw_bps"] == pytest.approx(op.busbw_bps)
        assert row["algbw_bps"] == pytest.approx(op.algbw_bps)


def test_metrics_are_typed_and_equal_what_analyze_json_prints(demo):
    m = demo.metrics()
    assert isinstance(m, RunMetrics)
    r = CliRunner().invoke(main, ["analyze", str(demo.path), "--json"])
    assert r.exit_code == 0, r.output
    assert m.to_dict() == json.loads(r.stdout)
    job = m.job("allreduce")
    assert isinstance(job, Job) and job.kinds == ("allreduce",)
    assert job.busbw_bps.mean == pytest.approx(
        np.mean([o.busbw_bps for o in m.collectives.ops if o.job_name == "allreduce"])
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.status = "partial"  # type: ignore[misc]
    with pytest.raises(KeyError, match="no job 'x'"):
        m.job("x")
    assert demo.metrics() is m  # computed once
    series = demo.metrics(series=True)
    assert series.series is not None and m.series is None


def test_overrides_as_keywords_and_as_a_mapping_take_effect(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = aifabric.run(
        ONE_FLOW, congestion_control__kind="none", set={"ecmp.policy": "eecmp"}, seed=7
    )
    assert run.scenario["congestion_control"]["kind"] == "none"
    assert run.scenario["ecmp"]["policy"] == "eecmp"
    assert run.scenario["seed"] == 7
    # no output named: runs/NAME-STAMP in the working directory, as `aifabric run` does
    assert run.path.parent == Path("runs") and run.path.name.startswith("one-flow-")


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: aifabric.run("no-such-preset"), "no-such-preset"),
        (lambda: aifabric.run(ONE_FLOW, workload__nope=1), "workload.nope"),
        (lambda: aifabric.run(ONE_FLOW, qps=4), "qps"),
        (lambda: aifabric.run(ONE_FLOW, ecmp__policy="x", set={"ecmp.policy": "y"}), "twice"),
        (lambda: aifabric.run(ONE_FLOW, engine="nope"), "nope"),
        (lambda: aifabric.run(42), "not 42"),
        (lambda: aifabric.load("/nonexistent/run"), "not a run directory"),
        (lambda: aifabric.load(7), "a run directory is a path, not 7"),
        (lambda: aifabric.run(ONE_FLOW, output=3.5), "output is a path, not 3.5"),
        (lambda: aifabric.sweep(ONE_FLOW, "/nonexistent", full=True), "full"),
    ],
)
def test_errors_are_one_sentence(call, words):
    with pytest.raises(AifabricError) as e:
        call()
    text = str(e.value)
    assert words in text and "\n" not in text, text


def test_a_loaded_scenario_runs_but_takes_no_overrides(tmp_path):
    from aifabric.scenarios import load_scenario

    sc = load_scenario(str(ONE_FLOW))
    assert aifabric.run(sc, tmp_path / "run").status == "complete"
    with pytest.raises(AifabricError, match="not to a loaded scenario"):
        aifabric.run(sc, tmp_path / "again", ecmp__policy="eecmp")


def test_a_sweep_has_its_table_and_its_runs(tmp_path):
    sweep = aifabric.sweep(
        ONE_FLOW, tmp_path / "sweep", vary={"ecmp.policy": ["5tuple", "eecmp"]}, workers=1
    )
    assert sweep.outcome["done"] == 2 and sweep.outcome["failed"] == 0
    assert sweep.keys == ["ecmp.policy"]
    assert list(sweep.results["ecmp.policy"]) == ["5tuple", "eecmp"]
    assert list(sweep.results["status"]) == ["complete", "complete"]
    runs = sweep.runs
    assert [r.scenario["ecmp"]["policy"] for r in runs] == ["5tuple", "eecmp"]
    name = sweep.results["run_dir"].iloc[1]
    assert sweep.run(name).path == runs[1].path
    assert aifabric.open_sweep(sweep.path).results.equals(sweep.results)


def test_the_api_loads_pandas_only_when_a_table_is_asked_for():
    code = (
        "import sys, aifabric\n"
        "f = aifabric.run, aifabric.load, aifabric.Run\n"
        "import aifabric.cli, aifabric.cli_run\n"
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_a_run_without_tables_has_empty_frames_with_the_same_columns(demo, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(demo.path, bare)
    for name in ("flows", "ports", "collectives"):  # neither the arrays nor their tables
        (bare / f"{name}.npz").unlink()
        (bare / f"{name}.parquet").unlink()
    run = aifabric.load(bare)
    for table in ("flows", "ports", "collectives"):
        empty, full = getattr(run, table), getattr(demo, table)
        assert len(empty) == 0 and len(full) > 0, table
        assert [c for c in full.columns if c not in ("route_epoch", "cnp_sent")] == list(
            empty.columns
        ), table
    m = run.metrics()
    assert m.flows.count == 0 and m.congestion is None and m.jobs == ()


def test_the_report_holds_the_summary_of_the_typed_metrics(demo, tmp_path):
    from aifabric.analysis.metrics import summary

    out = demo.report(tmp_path / "report.html")
    text = out.read_text()
    head = '<script type="application/json" id="aifabric-summary">'
    start = text.index(head) + len(head)
    shown = json.loads(html.unescape(text[start : text.index("</script>", start)]))
    assert shown == summary(demo.metrics()).to_dict()
    assert [j["name"] for j in shown["jobs"]] == ["allreduce", "incast"]


def test_to_dict_leaves_out_what_was_not_measured(demo):
    d = demo.metrics().to_dict()
    assert "series" not in d and "low_intervals" not in d["throughput"]
    assert all("fct_ns" in j and "senders_paused_ns" in j for j in d["jobs"])
    with_series = demo.metrics(series=True).to_dict()
    assert len(with_series["series"]["t_ns"]) == len(RunDir(demo.path).ports()["t_ns"])
