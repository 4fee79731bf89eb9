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


def earlier_rows(out: Path, sweep, points) -> list[dict]:
    """The rows of the folder's table that are not points of `sweep` as run now (an earlier
    run with another grid or other seeds) and still have their run directory (or failed
    before it was made), in their table order. An earlier run of a different sweep (another
    base scenario, fixed settings, varied keys or engine) is refused in one sentence rather
    than mixed into this one's table."""
    from aifabric.fabric.rundir import jsonable

    previous = _previous_table(out)
    mine = {f"runs/{p.name}" for p in points}
    keep = [
        row
        for row in previous
        if row.get("run_dir") not in mine
        and (
            row.get("status") == "failed" or (out / str(row.get("run_dir")) / "run.json").is_file()
        )
    ]
    if not keep:
        return []
    try:
        spec = json.loads((out / "sweep.json").read_text())
    except (OSError, ValueError):
        spec = {}
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
