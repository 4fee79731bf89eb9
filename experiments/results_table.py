"""A sweep's results tables, rewritten together after every point.

    results.csv           one row per run: point, the varied keys, seed, status, error,
                          the metrics (`busbw_gbps@JOB`, `ecmp_jain.TIER`, ...),
                          scenario_hash, wall_s, run_dir
    results.parquet       the same rows and columns, typed (nulls where the CSV is empty)
    results_long.parquet  one row per run, job and metric, for SQL without quoted names:
                          run (its directory under runs/), point, config (the varied keys
                          as `key=label,...`), the varied keys, seed, status, job (null for
                          a fabric-wide metric), collective (`KIND-ALGORITHM` for a job's
                          per-collective figure, else null), tier (`rtsw>ctsw` for the
                          ECMP figures, else null), metric, value (float64), unit

Rows are the points of the sweep as run, in point order, then the points an earlier run of
the same sweep into the folder made with another grid or other seeds (`earlier_rows`),
numbered after them: a re-run with a different grid adds to the table, never drops from it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from aifabric.experiments.runner import RESULT_COLUMNS as BOOKKEEPING
from aifabric.fabric.errors import AifabricError

FILES = ("results.csv", "results.parquet", "results_long.parquet")
# what must agree for an earlier run's points to share the table (sweep.json's names)
SAME_SWEEP = {"scenario": "base scenario", "set": "fixed settings", "keys": "varied keys",
              "engine": "engine"}  # fmt: skip


def wide_rows(sweep, points, rows: dict[int, dict], earlier: list[dict]) -> tuple[list, list]:
    """(columns, rows) of results.csv and results.parquet."""
    keys = sweep.keys
    metric_cols: dict[str, None] = {}
    out = []
    for i in sorted(rows):
        p = points[i]
        row = {**rows[i], **p.labels, "point": p.index, "seed": p.seed, "run_dir": f"runs/{p.name}"}
        out.append(row)
    for k, row in enumerate(earlier):
        out.append({**row, "point": len(points) + k})
    for row in out:
        for col in row:
            if col not in BOOKKEEPING and col not in keys:
                metric_cols[col] = None
    cols = ["point", *keys, "seed", "status", "error", *sorted(metric_cols), "scenario_hash"]
    cols += ["wall_s", "run_dir"]
    return cols, out


def split_column(column: str) -> tuple[str, str | None, str | None, str | None]:
    """(metric, job, collective, tier) of a results column: `busbw_gbps@ring/allreduce-ring`,
    `time_ns@ring`, `ecmp_jain.rtsw>ctsw`, `drops`."""
    metric, at, job = column.partition("@")
    if at:
        job, slash, collective = job.partition("/")
        return metric, job, (collective if slash else None), None
    metric, dot, tier = column.partition(".")
    return metric, None, None, (tier if dot else None)


def long_rows(sweep, cols: list[str], wide: list[dict]) -> list[dict]:
    """results_long.parquet's rows: every metric value of every run, one row each."""
    from aifabric.experiments.columns import unit_of

    keys = sweep.keys
    metrics = [c for c in cols if c not in BOOKKEEPING and c not in keys]
    out = []
    for row in wide:
        config = ",".join(f"{k}={row.get(k)}" for k in keys)
        head = {"run": str(row["run_dir"]).removeprefix("runs/"), "point": row["point"],
                "config": config, **{k: row.get(k) for k in keys}, "seed": row["seed"],
                "status": row.get("status")}  # fmt: skip
        for col in metrics:
            value = _number(row.get(col))
            if value is None:
                continue
            metric, job, collective, tier = split_column(col)
            out.append({**head, "job": job, "collective": collective, "tier": tier,
                        "metric": metric, "value": value, "unit": unit_of(metric)})  # fmt: skip
    return out


def _number(value) -> float | None:
    if value is None or isinstance(value, str | bool):
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _arrow(rows: list[dict], cols: list[str], types: dict[str, Any] | None = None):
    """A pyarrow table of `rows` in `cols`; a column whose values are of mixed kinds (labels
    such as 4 and "auto") is text."""
    import pyarrow as pa

    types = types or {}
    arrays = []
    for col in cols:
        values = [_cell(row.get(col)) for row in rows]
        try:
            arrays.append(pa.array(values, type=types.get(col)))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            arrays.append(pa.array([None if v is None else str(v) for v in values], pa.string()))
    return pa.table(arrays, names=cols)


def _cell(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def write_tables(out: Path, sweep, points, rows: dict[int, dict], earlier: list[dict]) -> None:
    """results.csv, results.parquet and results_long.parquet in `out`, each atomically."""
    import pyarrow as pa

    from aifabric.fabric.columnar import write_parquet
    from aifabric.fabric.files import write_atomic

    cols, wide = wide_rows(sweep, points, rows, earlier)
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in wide:
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    write_atomic(out / "results.csv", text.getvalue())
    fixed = {"point": pa.int64(), "seed": pa.int64(), "status": pa.string(),
             "error": pa.string(), "scenario_hash": pa.string(), "wall_s": pa.float64(),
             "run_dir": pa.string()}  # fmt: skip
    metrics = [c for c in cols if c not in BOOKKEEPING and c not in sweep.keys]
    fixed.update({c: pa.float64() for c in metrics})
    write_parquet(out / "results.parquet", _arrow(wide, cols, fixed))
    long_cols = ["run", "point", "config", *sweep.keys, "seed", "status", "job", "collective",
                 "tier", "metric", "value", "unit"]  # fmt: skip
    types = {**{k: fixed[k] for k in ("point", "seed", "status")}, "value": pa.float64(),
             **{k: pa.string() for k in ("run", "config", "job", "collective", "tier", "metric",
                                         "unit")}}  # fmt: skip
    long = _arrow(long_rows(sweep, cols, wide), long_cols, types)
    write_parquet(out / "results_long.parquet", long)


def rebuild_tables(out: str | Path, into: str | Path | None = None, *, runs=None) -> dict:
    """Rebuild the tables of the sweep directory `out` from its run directories alone:
    sweep.json says which points there are (the sweep as run, then `earlier`: the points
    of an earlier grid), each point's run directory its row (`RunRows`; `runs`, one kept
    across calls, rereads only what changed); a point without a finished run has none.
    Written into `into` (default `out`), each file atomically. Returns `rows` (point
    index -> row of the sweep as run) and `earlier` (how many earlier points have one)."""
    from aifabric.experiments.runner import RunRows
    from aifabric.experiments.spec import Sweep

    out = Path(out)
    spec_file = out / "sweep.json"
    try:
        spec = json.loads(spec_file.read_text())
        sweep = Sweep.from_dict(spec)
    except FileNotFoundError:
        raise AifabricError(f"{out} is not a sweep directory (no sweep.json)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise AifabricError(f"{spec_file} is not a sweep record ({e})") from None
    points = sweep.points()
    runs = runs if runs is not None else RunRows(out, sweep.metrics)
    rows = {p.index: row for p in points if (row := runs.row(p.name)) is not None}
    earlier = []
    for e in _earlier_of(spec):
        row = runs.row(e["name"])
        if row is not None:
            run_dir = f"runs/{e['name']}"
            earlier.append({**row, **e["labels"], "seed": e["seed"], "run_dir": run_dir})
    into = Path(into) if into is not None else out
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AifabricError(f"cannot write the tables into {into}: {e.strerror}") from None
    write_tables(into, sweep, points, rows, earlier)
    return {"rows": rows, "earlier": len(earlier)}


def _earlier_of(spec: dict) -> list[dict]:
    """sweep.json's `earlier` points ({name, labels, seed}), those of the right shape."""
    found = spec.get("earlier") if isinstance(spec, dict) else None
    if not isinstance(found, list):
        return []
    return [
        e
        for e in found
        if isinstance(e, dict) and isinstance(e.get("name"), str) and "/" not in e["name"]
        and isinstance(e.get("labels"), dict) and isinstance(e.get("seed"), int)
    ]  # fmt: skip


def earlier_points(out: Path, sweep, points) -> list[dict]:
    """The points ({name, labels, seed}) an earlier run into the folder made that are not
    points of `sweep` as run now (another grid or other seeds) and still have their run
    directory, in the earlier table's order: the sweep.json there (its points, then its own
    `earlier`), and for a folder written before sweep.json kept them, its table's rows.
    sweep.json records them, and the table keeps their rows. An earlier run of a different
    sweep (another base scenario, fixed settings, varied keys or engine) is refused in one
    sentence rather than mixed into this one's table."""
    from aifabric.experiments.spec import Sweep
    from aifabric.fabric.rundir import jsonable

    try:
        spec = json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError):
        spec = {}
    if not isinstance(spec, dict):
        spec = {}
    found: list[dict] = []
    try:
        before = Sweep.from_dict(spec).points() if spec else []
    except (KeyError, TypeError, ValueError, AttributeError):
        before = []
    found += [{"name": p.name, "labels": dict(p.labels), "seed": p.seed} for p in before]
    found += _earlier_of(spec)
    found += _table_points(out, spec)
    mine = {p.name for p in points}
    keep, seen = [], set()
    for e in found:
        name = e["name"]
        if name in mine or name in seen or not (out / "runs" / name / "run.json").is_file():
            continue
        seen.add(name)
        keep.append(e)
    if not keep:
        return []
    now = sweep.to_dict()
    for name, what in SAME_SWEEP.items():
        before, after = spec.get(name), json.loads(json.dumps(now.get(name), default=jsonable))
        if name == "keys":
            before, after = sorted(before or []), sorted(after or [])
        if before != after:
            raise AifabricError(
                f"{out} holds {len(keep)} point{'s' if len(keep) != 1 else ''} of a sweep "
                f"with other {what} "
                f"({_show(before)} there, {_show(after)} here): give another output "
                f"directory, or remove its {', '.join(FILES)} to start the table afresh"
            )
    return keep


def _table_points(out: Path, spec: dict) -> list[dict]:
    """The points ({name, labels, seed}) the table in `out` has rows for: how a folder a
    sweep wrote before sweep.json recorded its earlier points tells them; [] where there is
    no table or it cannot be read (the table is rebuilt from the run directories)."""
    keys = spec.get("keys") if isinstance(spec.get("keys"), list) else []
    try:
        previous = _previous_table(out)
    except AifabricError:
        return []
    found = []
    for row in previous:
        run_dir, seed = str(row.get("run_dir") or ""), row.get("seed")
        name = run_dir.removeprefix("runs/")
        if not run_dir.startswith("runs/") or not name or "/" in name:
            continue
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            continue
        found.append({"name": name, "labels": {k: row.get(k) for k in keys}, "seed": seed})
    return found


def _show(value) -> str:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
    return str(value)


def _previous_table(out: Path) -> list[dict]:
    """The rows of the table already in `out` (results.parquet, else results.csv), as
    dicts with None for empty cells; [] where there is none."""
    parquet, text = out / "results.parquet", out / "results.csv"
    if parquet.is_file():
        from aifabric.fabric.columnar import read_parquet

        try:
            return read_parquet(parquet).to_pylist()
        except AifabricError:
            if not text.is_file():
                raise
    if not text.is_file():
        return []
    import pandas as pd

    try:
        frame = pd.read_csv(text)
    except pd.errors.EmptyDataError:
        return []
    except (OSError, ValueError) as e:
        raise AifabricError(f"{text} cannot be read as the sweep's earlier table: {e}") from None
    frame = frame.astype(object).where(frame.notna(), None)
    return frame.to_dict("records")
