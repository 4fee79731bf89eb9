"""A sweep's collective ops as nccl-tests rows (`aifabric sweep show DIR --format nccl-tests`).

A block per configuration of the varied keys other than the message size (`*.size`) and
per job, a row per op size: as all_reduce_perf sweeps sizes, the sweep's runs at each
size give one row, its time the mean over the configuration's complete runs (its seeds).
The rows themselves are `aifabric.analysis.nccltests`'.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from aifabric.fabric.errors import AifabricError


def _run_ops(path: Path) -> list:
    """(position in its job, `Op`) of each collective op of the run directory at `path`."""
    import pandas as pd

    from aifabric.analysis.frames import collectives
    from aifabric.analysis.metrics import job_names
    from aifabric.analysis.nccltests import Op
    from aifabric.fabric.rundir import Run
    from aifabric.fabric.scenario import job_bodies

    run = Run(path)
    listed = job_bodies(run.meta["scenario"].get("workload", {}))
    # by the name the analyzer gives each job (its frames name jobs so)
    bodies = {name: listed[j] for j, name in job_names(run, range(len(listed))).items()}
    seen: dict[str, int] = {}
    out = []
    for c in collectives(run).itertuples(index=False):
        job = str(c.job)
        seen[job] = seen.get(job, -1) + 1
        out.append(
            (seen[job], Op(
                job=job, kind=c.kind, algorithm=c.algorithm, bytes=int(c.bytes),
                ranks=int(c.ranks), time_ns=None if pd.isna(c.time_ns) else float(c.time_ns),
                busbw_factor=float(c.busbw_factor),
                root=int(bodies.get(job, {}).get("root", 0)),
            ))
        )  # fmt: skip
    return out


def _mean_ops(runs: list[Path]) -> list:
    """One `Op` per (job, kind, bytes, ranks, position in the job) over the runs, its time
    the mean of the runs where it finished, ordered by job, size and position."""
    groups: dict[tuple, list] = {}
    for path in runs:
        for pos, op in _run_ops(path):
            groups.setdefault((op.job, op.kind, op.bytes, op.ranks, pos), []).append(op)
    jobs = list(dict.fromkeys(k[0] for k in groups))
    out = []
    for key in sorted(groups, key=lambda k: (jobs.index(k[0]), k[2], k[4])):
        ops = groups[key]
        done = [o.time_ns for o in ops if o.time_ns]
        label = f"size {key[2]} B, {len(done)} of {len(ops)} runs"
        out.append(replace(ops[0], time_ns=sum(done) / len(done) if done else None, label=label))
    return out


def nccl_tests_text(directory: str) -> str:
    """The sweep at `directory` as nccl-tests blocks."""
    from aifabric.analysis.nccltests import blocks, render_blocks
    from aifabric.experiments.stats import configurations, select_rows
    from aifabric.experiments.sweepdir import open_sweep

    res = open_sweep(directory)
    keys = [k for k in res.keys if k.rsplit(".", 1)[-1] != "size"]
    frame = res.frame[res.frame["status"] == "complete"]
    if not len(frame):
        raise AifabricError(f"sweep {directory} has no complete run")
    out = []
    for config in configurations(frame, keys):
        rows = select_rows(frame, keys, config)
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys, config, strict=True))
        seeds = rows["seed"].nunique() if "seed" in rows else len(rows)
        head = f"configuration {label or 'all runs'}: time the mean over {seeds} seed(s)"
        for b in blocks(_mean_ops([res.path / d for d in rows["run_dir"]])):
            out.append(replace(b, comments=(head, *b.comments)))
    lead = [f"aifabric sweep show {directory} ({res.spec.get('name')}): simulated, fabric time"]
    return render_blocks(out, lead)
