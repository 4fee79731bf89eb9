"""A sweep's Parquet: results.parquet and its long form, DuckDB over the runs' tables, and a
re-run with another grid that keeps the earlier points.

One small sweep (lab-small, a ring AllReduce beside an incast, two ECMP policies, two
seeds, one worker) serves the module; a shared 2-core machine runs it once.
"""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.fabric.export import fabric_from_topology
from aifabric.fabric.model import Role
from aifabric.fabric.portseries import wide
from aifabric.fabric.rundir import Run
from tests.test_sweep_overrides import TINY, TWO_JOBS

TWO_JOBS_2US = TWO_JOBS.replace("[scenario]", '[scenario]\nsample_interval = "2us"')


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def sweep(source, out, *args):
    r = invoke("sweep", "run", source, *args, "--workers", 1, "-o", out, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{") :])


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "two.toml").write_text(TWO_JOBS_2US)
    out = tmp / "sweep"
    outcome = sweep(tmp / "two.toml", out, "--vary", "ecmp.policy=5tuple,eecmp", "--seeds", "1-2")
    assert (outcome["points"], outcome["failed"]) == (4, 0)
    return out


def test_every_runs_parquet_equals_its_npz_arrays(swept):
    table = pd.read_csv(swept / "results.csv")
    assert len(table) == 4
    for run_dir in table["run_dir"]:
        path = swept / run_dir
        for name in ("flows", "ports", "collectives"):
            npz = dict(np.load(path / f"{name}.npz"))
            (path / f"{name}.npz").rename(path / f"{name}.npz.aside")
            try:
                back = getattr(Run(path), name)()  # read from the Parquet alone
            finally:
                (path / f"{name}.npz.aside").rename(path / f"{name}.npz")
            if name == "ports":  # the entries (stored narrow, read as int64), and the
                back = back.arrays()  # dense series they give
                npz = {k: wide(v) for k, v in npz.items()}
            assert set(back) == set(npz), (run_dir, name)
            for key, values in npz.items():
                assert back[key].dtype == values.dtype, (run_dir, name, key)
                assert np.array_equal(back[key], values), (run_dir, name, key)


def test_results_parquet_is_results_csv_typed_and_the_long_form_holds_every_value(swept):
    csv = pd.read_csv(swept / "results.csv")
    wide = pq.read_table(swept / "results.parquet")
    assert wide.column_names == list(csv.columns)
    frame = wide.to_pandas()
    assert frame["point"].dtype == np.int64 and frame["seed"].dtype == np.int64
    assert frame["busbw_gbps@ring"].dtype == np.float64
    pd.testing.assert_frame_equal(
        frame.drop(columns=["error"]), csv.drop(columns=["error"]), check_dtype=False
    )
    long = pq.read_table(swept / "results_long.parquet").to_pandas()
    assert {"run", "config", "ecmp.policy", "seed", "job", "metric", "value", "unit"} <= set(long)
    metrics = [c for c in csv.columns if "@" in c or c in ("fct_p99_ns", "pfc_frames")]
    for row in csv.itertuples(index=False):
        mine = long[long["run"] == row.run_dir.removeprefix("runs/")]
        assert set(mine["config"]) == {f"ecmp.policy={row[1]}"}
        for col in metrics:
            value = csv.loc[csv["run_dir"] == row.run_dir, col].item()
            metric, _, job = col.partition("@")
            sel = mine[(mine["metric"] == metric) & (mine["job"].fillna("") == job)]
            if pd.isna(value):
                assert sel.empty, col
            else:
                assert sel["value"].item() == pytest.approx(value), col
    units = dict(zip(long["metric"], long["unit"], strict=True))
    assert units["busbw_gbps"] == "Gbit/s" and units["time_ns"] == "ns"
    assert units["ecmp_jain"] == "ratio" and units["pfc_frames"] == "frames"
    tiers = long[long["metric"] == "ecmp_jain"]
    assert tiers["job"].isna().all() and set(tiers["tier"]) >= {"rtsw>ctsw"}


def test_every_metric_a_run_gives_has_a_unit(swept):
    from aifabric.experiments.columns import UNITS
    from aifabric.experiments.results_table import split_column

    csv = pd.read_csv(swept / "results.csv")
    from aifabric.experiments.results_table import BOOKKEEPING

    metrics = {split_column(c)[0] for c in csv.columns if c not in BOOKKEEPING}
    metrics.discard("ecmp")  # the varied key ecmp.policy
    assert metrics <= set(UNITS), metrics - set(UNITS)


def test_one_duckdb_statement_answers_per_configuration_across_the_runs(swept):
    """Per ECMP policy and job: the mean flow completion time over every run of the policy,
    and the deepest queue on a rack switch's uplink to a spine, read from runs/*/flows.parquet
    and runs/*/ports.parquet joined with results.parquet's varied key; checked against numpy
    over the run directories' npz arrays."""
    runs = str(swept / "runs")
    sql = f"""
        WITH runs AS (
            SELECT regexp_extract(run_dir, '[^/]+$') AS run, "ecmp.policy" AS policy
            FROM '{swept}/results.parquet' WHERE status = 'complete'
        ),
        fct AS (
            SELECT regexp_extract(filename, '([^/]+)/flows.parquet$', 1) AS run, job_name,
                   avg(fct_ns) AS mean_fct_ns
            FROM read_parquet('{runs}/*/flows.parquet', filename = true)
            GROUP BY ALL
        ),
        uplinks AS (
            SELECT regexp_extract(filename, '([^/]+)/ports.parquet$', 1) AS run,
                   max(qdepth_max_bytes) AS uplink_qmax_bytes
            FROM read_parquet('{runs}/*/ports.parquet', filename = true)
            WHERE node_role = 'rtsw' AND peer_role = 'ctsw'
            GROUP BY ALL
        )
        SELECT policy, job_name, avg(mean_fct_ns) AS mean_fct_ns,
               max(uplink_qmax_bytes) AS uplink_qmax_bytes, count(*) AS runs
        FROM runs JOIN fct USING (run) JOIN uplinks USING (run)
        GROUP BY policy, job_name ORDER BY policy, job_name
    """
    answer = duckdb.sql(sql).fetchall()

    table = pd.read_csv(swept / "results.csv")
    expected = []
    for policy in sorted(table["ecmp.policy"].unique()):
        dirs = table.loc[table["ecmp.policy"] == policy, "run_dir"]
        per_job: dict[int, list[float]] = {}
        qmax = 0
        for d in dirs:
            run = Run(swept / d)
            flows, ports = (
                dict(np.load(run.path / "flows.npz")),
                run.ports(),
            )
            done = flows["end_ns"] >= 0
            fct = flows["end_ns"] - flows["start_ns"]
            for j in np.unique(flows["job"]):
                per_job.setdefault(int(j), []).append(fct[done & (flows["job"] == j)].mean())
            f = fabric_from_topology(run.topology())
            p = ports["port"]
            up = (f.node_role[f.port_node[p]] == Role.RTSW) & (
                f.node_role[f.port_peer[p]] == Role.CTSW
            )
            qmax = max(qmax, int(ports["qdepth_max_bytes"][:, up].max()))
        names = {0: "ring", 1: "incast"}
        for j in sorted(per_job, key=names.get):
            expected.append((policy, names[j], float(np.mean(per_job[j])), qmax, len(dirs)))
    assert len(answer) == len(expected) == 4
    for got, want in zip(answer, expected, strict=True):
        assert got[:2] == want[:2]
        assert got[2] == pytest.approx(want[2], rel=1e-12)
        assert got[3:] == want[3:]
    assert any(row[3] > 0 for row in answer), "no queue on an uplink: the question tests nothing"


def test_a_rerun_with_another_grid_keeps_the_earlier_points(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "sweep"
    sweep(tmp_path / "tiny.toml", out, "--vary", "ecmp.policy=5tuple,eecmp")
    first = pd.read_csv(out / "results.csv")
    outcome = sweep(
        tmp_path / "tiny.toml", out, "--vary", "ecmp.policy=eecmp,pinned", "--seeds", "1"
    )
    assert (outcome["points"], outcome["reused"], outcome["ran"], outcome["earlier"]) == (
        2,
        1,
        1,
        1,
    )
    table = pd.read_csv(out / "results.csv")
    # the sweep as run first, in its order, then the earlier grid's point it does not have
    assert list(table["ecmp.policy"]) == ["eecmp", "pinned", "5tuple"]
    assert list(table["point"]) == [0, 1, 2]
    assert list(table["status"]) == ["complete"] * 3
    old = first[first["ecmp.policy"] == "5tuple"].iloc[0]
    kept = table[table["ecmp.policy"] == "5tuple"].iloc[0]
    assert (
        kept["run_dir"] == old["run_dir"]
        and kept["busbw_gbps@allreduce"] == old["busbw_gbps@allreduce"]
    )
    assert Run(out / kept["run_dir"]).status == "complete"
    parquet = pq.read_table(out / "results.parquet").to_pandas()
    assert list(parquet["ecmp.policy"]) == ["eecmp", "pinned", "5tuple"]
    long = pq.read_table(out / "results_long.parquet").to_pandas()
    assert set(long["config"]) == {f"ecmp.policy={p}" for p in ("eecmp", "pinned", "5tuple")}
    # and again with the first grid: nothing runs, nothing is lost
    again = sweep(tmp_path / "tiny.toml", out, "--vary", "ecmp.policy=5tuple,eecmp")
    assert (again["ran"], again["earlier"]) == (0, 1)
    assert list(pd.read_csv(out / "results.csv")["ecmp.policy"]) == ["5tuple", "eecmp", "pinned"]


def test_a_different_sweep_into_a_folder_with_points_is_refused(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "sweep"
    sweep(tmp_path / "tiny.toml", out, "--vary", "ecmp.policy=5tuple")
    before = {f: (out / f).read_bytes() for f in ("sweep.json", "results.csv", "results.parquet")}
    r = invoke("sweep", "run", tmp_path / "tiny.toml", "--vary", "workload.qps=1,2",
               "--workers", 1, "-o", out)  # fmt: skip
    assert r.exit_code == 1, r.output
    assert r.output.strip() == (
        f"Error: {out} holds 1 point of a sweep with other varied keys (ecmp.policy there, "
        "workload.qps here): give another output directory, or remove its results.csv, "
        "results.parquet, results_long.parquet to start the table afresh"
    )
    assert {f: (out / f).read_bytes() for f in before} == before
