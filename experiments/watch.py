"""What `aifabric watch` shows of a sweep: its points done, failed, running and waiting,
and the headline metric of each configuration so far.

Read from the sweep directory alone (`aifabric.experiments.runner`): sweep.json
says which points there are, results.csv which finished and how, each point's
run directory (its run.json and live file) which are running, and sweep.lock
whether the sweep's process is still at work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aifabric.experiments.runner import SWEEP_LOCK
from aifabric.experiments.spec import Sweep
from aifabric.experiments.sweepdir import open_sweep
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.live import read_live
from aifabric.fabric.rundir import effective_status, lock_held

WAITING = "waiting"


@dataclass
class PointState:
    name: str
    labels: dict[str, Any]
    seed: int
    status: str  # complete, partial, failed (in the table); running, killed; waiting
    live: dict | None = None  # a running point's live record


@dataclass
class Configuration:
    labels: dict[str, Any]
    points: int = 0
    done: int = 0  # complete or partial
    failed: int = 0
    running: int = 0
    mean: float | None = None  # of the headline metric over its complete points


@dataclass
class SweepState:
    path: Path
    name: str
    running: bool  # the sweep's process holds sweep.lock
    metric: str | None  # the headline column of results.csv
    points: list[PointState] = field(default_factory=list)
    configurations: list[Configuration] = field(default_factory=list)

    def count(self, *statuses: str) -> int:
        return sum(p.status in statuses for p in self.points)


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / "sweep.json").is_file()


def sweep_state(path: str | Path) -> SweepState:
    """The state of the sweep directory `path` now (one sentence when it cannot be read)."""
    res = open_sweep(path)
    try:
        sweep = Sweep.from_dict(res.spec)
    except (KeyError, TypeError, ValueError) as e:
        raise AifabricError(f"{res.path / 'sweep.json'} is not a sweep record ({e})") from None
    frame = res.frame
    columns = res.columns() if len(frame) else []
    metric = columns[0] if columns else None
    rows = {}
    if len(frame) and "point" in frame:
        rows = {int(r["point"]): r for r in frame.to_dict("records")}
    state = SweepState(res.path, sweep.name, lock_held(res.path / SWEEP_LOCK), metric)
    configs: dict[tuple, Configuration] = {}
    values: dict[tuple, list[float]] = {}
    for p in sweep.points():
        row = rows.get(p.index)
        live = None
        if row is not None:
            status = str(row.get("status") or "complete")
        else:
            run_dir = res.path / "runs" / p.name
            status = WAITING
            if (run_dir / "run.json").is_file():
                try:
                    status = effective_status(run_dir)
                except (OSError, ValueError):
                    status = WAITING  # being written this moment
                live = read_live(run_dir)
            if status in ("complete", "partial", "failed") and state.running:
                status = "running"  # finished, not yet in the table: the sweep measures it
        state.points.append(PointState(p.name, p.labels, p.seed, status, live))
        key = tuple(p.labels.items())
        c = configs.setdefault(key, Configuration(dict(p.labels)))
        c.points += 1
        c.done += status in ("complete", "partial")
        c.failed += status == "failed"
        c.running += status == "running"
        if status == "complete" and row is not None and metric is not None:
            v = row.get(metric)
            if v is not None and v == v:  # not NaN
                values.setdefault(key, []).append(float(v))
    for key, c in configs.items():
        if values.get(key):
            c.mean = sum(values[key]) / len(values[key])
    state.configurations = list(configs.values())
    return state
