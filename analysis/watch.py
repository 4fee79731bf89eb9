"""What `aifabric watch` shows of one run: its status and its figures so far.

A run in progress (or killed) is shown from the live file its engine streams
(`aifabric.fabric.live`); a finished one from its run directory's files, so
that a run written without a live file shows the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from aifabric.analysis.metrics import job_names
from aifabric.fabric.live import from_run, read_live
from aifabric.fabric.rundir import Run

FINISHED = ("complete", "partial", "failed")


@dataclass
class RunState:
    path: Path
    scenario: str
    engine: str
    status: str  # run.json's, or "killed" (`aifabric.fabric.rundir.effective_status`)
    message: str
    record: dict | None  # a live record (`aifabric.fabric.live`), None: nothing yet
    source: str  # "live.json" or "run directory"
    age_s: float | None  # since a live record was written
    job_names: dict[int, str]

    @property
    def running(self) -> bool:
        return self.status == "running"


def run_state(path: str | Path) -> RunState:
    """The state of the run directory `path` now (one sentence when it is not one)."""
    run = Run(path)
    status = run.status
    record, source = None, "live.json"
    if status in FINISHED:
        record = from_run(run)
        source = "run directory"
    if record is None:
        record, source = read_live(run.path), "live.json"
    age = None
    if record is not None and source == "live.json":
        age = max(0.0, time.time() - float(record.get("written_at", time.time())))
    jobs = [r["job"] for r in record["jobs"]] if record else []
    return RunState(
        path=run.path,
        scenario=str(run.meta.get("scenario", {}).get("name", "")),
        engine=run.engine,
        status=status,
        message=run.meta.get("message", "") if status != "running" else "",
        record=record,
        source=source,
        age_s=age,
        job_names=job_names(run, jobs),
    )
