"""A sweep's results tables are rebuilt from its run directories after every point, so they
always say what the directories say (issue 26): a run.json edited, replaced or deleted
while the sweep runs, a partial run, a point that failed before its engine ran, a damaged
run.json, the points of an earlier grid.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from aifabric.experiments.results_table import FILES, rebuild_tables
from aifabric.experiments.runner import RunRows, run_point, run_sweep, scenario_hash
from aifabric.experiments.spec import sweep_from_flags
from aifabric.fabric.rundir import Run, read_meta

ROOT = Path(__file__).resolve().parent.parent


def _table(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "results.csv")


def disagreements(out: Path) -> list[str]:
    """What in results.csv differs from the run directories: a row whose status, error or
    wall_s is not its run's, a finished run without a row, and the table not what
    `rebuild_tables` makes of the directories now."""
    table = _table(out)
    said = []
    for row in table.itertuples():
        run = Run(out / row.run_dir)
        if run.status != row.status:
            said.append(f"{row.run_dir}: {row.status} in the table, {run.status} in run.json")
        wall = run.meta.get("wall_time_s")
        if (wall is None) != pd.isna(row.wall_s) or (wall is not None and wall != row.wall_s):
            said.append(f"{row.run_dir}: wall_s {row.wall_s}, run.json {wall}")
    listed = set(table["run_dir"])
    for meta in out.glob("runs/*/run.json"):
        name = f"runs/{meta.parent.name}"
        if Run(meta.parent).status != "running" and name not in listed:
            said.append(f"{name}: a finished run without a row")
    again = out.parent / f"{out.name}-rebuilt"
    shutil.rmtree(again, ignore_errors=True)
    rebuild_tables(out, into=again)
    for name in FILES:
        if _contents(out / name) != _contents(again / name):
            said.append(f"{name} is not what rebuild_tables makes of the run directories")
    return said


def _contents(path: Path):
    """A table's text, or a Parquet table's rows (its bytes hold when it was written)."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    return path.read_text()


def _edit(run_dir: Path, **changes) -> None:
    meta = json.loads((run_dir / "run.json").read_text())
    meta.update(changes)
    (run_dir / "run.json").write_text(json.dumps(meta))


def _partial_run(tiny: Path, run_dir: Path, seed: int) -> None:
    """A real partial run at `run_dir`: the scenario interrupted at its first progress."""
    from aifabric.engines import Stop, run_scenario
    from aifabric.scenarios import load_scenario

    sc = load_scenario(str(tiny), seed=seed, overrides=[])
    stop = Stop()
    shutil.rmtree(run_dir)
    summary = run_scenario("sim", sc, run_dir, progress=lambda *a, **k: stop.set(), stop=stop)
    assert summary["status"] == "partial"


def test_the_table_follows_the_run_directories_from_point_to_point(tiny, tmp_path):
    """Between points a finished run's run.json is edited, another replaced by a partial run,
    a third deleted: the table after the next point says so, and wall_s is run.json's."""
    out = tmp_path / "sweep"
    sweep = sweep_from_flags(str(tiny), seeds="1-4")
    handled: list[Path] = []

    def finished() -> Path:
        for meta in sorted(out.glob("runs/*/run.json")):
            if meta.parent not in handled and read_meta(meta.parent)["status"] == "complete":
                handled.append(meta.parent)
                return meta.parent
        raise AssertionError("a point was counted done without its run directory")

    def echo(item, keep=False):
        done = getattr(item, "done", 0)
        if done == len(handled) + 1 and done <= 3:
            run_dir = finished()
            if done == 1:
                _edit(run_dir, wall_time_s=4321.5)
            elif done == 2:
                _partial_run(tiny, run_dir, seed=int(run_dir.name.split("=")[-1]))
            else:
                shutil.rmtree(run_dir)

    outcome = run_sweep(sweep, out, workers=1, echo=echo)
    assert (outcome["ran"], outcome["done"], outcome["failed"]) == (4, 3, 0), outcome
    edited, partial, deleted = (f"runs/{d.name}" for d in handled)
    table = _table(out).set_index("run_dir")
    assert deleted not in table.index and len(table) == 3
    assert table.loc[edited, "status"] == "complete" and table.loc[edited, "wall_s"] == 4321.5
    assert table.loc[partial, "status"] == "partial"
    assert "interrupted" in table.loc[partial, "error"]
    assert table.loc[partial, "wall_s"] == Run(out / partial).meta["wall_time_s"]
    assert table.loc[partial, "time_ns@allreduce"] > 0  # what the partial run measured
    (last,) = set(table.index) - {edited, partial}
    assert table.loc[last, "wall_s"] == Run(out / last).meta["wall_time_s"]
    assert not disagreements(out)
    # the parquet tables are rebuilt with it
    parquet = pd.read_parquet(out / "results.parquet").set_index("run_dir")
    assert parquet.loc[partial, "status"] == "partial" and parquet.loc[edited, "wall_s"] == 4321.5
    # run again: the partial and the deleted point run again, the edited one is kept
    again = run_sweep(sweep, out, workers=1)
    assert (again["reused"], again["ran"], again["failed"]) == (2, 2, 0), again
    table = _table(out).set_index("run_dir")
    assert list(table["status"]) == ["complete"] * 4 and table.loc[edited, "wall_s"] == 4321.5
    assert not disagreements(out)


def test_rows_are_read_from_the_run_directories_and_kept_until_run_json_changes(
    tiny, tmp_path, monkeypatch
):
    import aifabric.experiments.columns

    out = tmp_path / "sweep"
    sweep = sweep_from_flags(str(tiny), vary=["workload.gpus=8,64"], seeds="1")
    ok, unfit = sweep.points()
    (out / "runs").mkdir(parents=True)
    (out / "sweep.json").write_text(json.dumps(sweep.to_dict()))
    for p in (ok, unfit):
        row = run_point(str(tiny), p.overrides, p.seed, str(out / "runs" / p.name), "sim",
                        sweep.metrics, f"task-{p.index}")  # fmt: skip
    # the point that does not fit failed before its engine ran: its directory says so
    assert row["status"] == "failed" and "does not fit" in row["error"]
    failed = Run(out / "runs" / unfit.name)
    assert failed.status == "failed" and failed.meta["message"] == row["error"]
    assert failed.meta["owner"] == "task-1"
    measured = []
    point_metrics = aifabric.experiments.columns.point_metrics
    monkeypatch.setattr(aifabric.experiments.columns, "point_metrics",
                        lambda *a: measured.append(a[0]) or point_metrics(*a))  # fmt: skip
    runs = RunRows(out, sweep.metrics)
    tables = rebuild_tables(out, runs=runs)
    assert set(tables["rows"]) == {0, 1} and len(measured) == 1
    first = tables["rows"][0]
    run = Run(out / "runs" / ok.name)
    assert first["wall_s"] == run.meta["wall_time_s"]
    assert first["scenario_hash"] == scenario_hash(run.meta["scenario"])
    assert tables["rows"][1]["error"] == row["error"]
    rebuild_tables(out, runs=runs)
    assert len(measured) == 1  # nothing changed: nothing read again
    _edit(out / "runs" / ok.name, wall_time_s=99.0)
    assert rebuild_tables(out, runs=runs)["rows"][0]["wall_s"] == 99.0 and len(measured) == 2
    table = _table(out)
    assert list(table["status"]) == ["complete", "failed"] and table["wall_s"][0] == 99.0
    assert not disagreements(out)
    # a damaged run.json is a row that says so, in one sentence; a deleted one no row
    (out / "runs" / ok.name / "run.json").write_text("{not json")
    row = rebuild_tables(out, runs=runs)["rows"][0]
    assert row["status"] == "failed" and "run.json" in row["error"], row
    (out / "runs" / ok.name / "run.json").unlink()
    assert list(rebuild_tables(out, runs=runs)["rows"]) == [1]
    assert list(_table(out)["run_dir"]) == [f"runs/{unfit.name}"]


def test_a_bad_sweep_directory_is_one_sentence(tmp_path):
    from aifabric.fabric.errors import AifabricError

    with pytest.raises(AifabricError, match="no sweep.json"):
        rebuild_tables(tmp_path)
    (tmp_path / "sweep.json").write_text("[1, 2]")
    with pytest.raises(AifabricError, match="is not a sweep record"):
        rebuild_tables(tmp_path)


def test_the_points_of_an_earlier_grid_are_read_from_their_directories(tiny, tmp_path):
    out = tmp_path / "sweep"
    first = sweep_from_flags(str(tiny), vary=["ecmp.policy=5tuple,eecmp"], seeds="1")
    second = sweep_from_flags(str(tiny), vary=["ecmp.policy=eecmp"], seeds="1")
    assert run_sweep(first, out, workers=1)["ran"] == 2
    outcome = run_sweep(second, out)  # nothing to run: eecmp is done
    assert (outcome["ran"], outcome["earlier"]) == (0, 1)
    recorded = json.loads((out / "sweep.json").read_text())["earlier"]
    assert recorded == [{"name": first.points()[0].name, "labels": {"ecmp.policy": "5tuple"},
                         "seed": 1}]  # fmt: skip
    kept = out / "runs" / first.points()[0].name
    _edit(kept, status="partial", message="edited by hand", wall_time_s=7.25)
    run_sweep(second, out)
    table = _table(out)
    assert list(table["ecmp.policy"]) == ["eecmp", "5tuple"]
    assert list(table["status"]) == ["complete", "partial"] and table["wall_s"][1] == 7.25
    assert table["error"][1] == "edited by hand"
    assert not disagreements(out)
    shutil.rmtree(kept)  # an earlier point whose directory is gone has no row
    assert run_sweep(second, out)["earlier"] == 0
    assert list(_table(out)["ecmp.policy"]) == ["eecmp"]
