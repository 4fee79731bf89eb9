"""`aifabric compare` over groups of runs: a sweep's runs pooled per configuration.

A sweep directory given to `compare` is one column per configuration (or per
value of the keys `--by` names), not one per run: each figure of
`aifabric.analysis.metrics.summary` (a `Summary`) is the mean over the group's complete runs, with
the half-width of its 95% interval over them (`spread`) where there are two
or more.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aifabric.fabric.errors import AifabricError

if TYPE_CHECKING:
    from aifabric.analysis.results import Summary

JOB_FIGURES = ("busbw_bps", "goodput_bps", "time_ns", "ideal_ns", "efficiency", "fct_p99_ns")


def is_sweep_dir(target: str) -> bool:
    path = Path(target)
    return (path / "sweep.json").is_file() and (path / "results.csv").is_file()


def sweep_groups(target: str, by: list[str] | None = None) -> list[tuple[str, list[Path]]]:
    """(label, run directories) per configuration of the sweep at `target`, in the order the
    sweep ran them; `by` pools the runs over the varied keys it leaves out."""
    from aifabric.experiments.stats import configurations, select_rows
    from aifabric.experiments.sweepdir import open_sweep

    res = open_sweep(target)
    keys = res.keys
    wanted = list(by or keys)
    for key in wanted:
        if key not in keys:
            varies = ", ".join(keys) if keys else "nothing"
            raise AifabricError(f"--by {key}: sweep {target} does not vary it (it varies {varies})")
    frame = res.frame[res.frame["status"] == "complete"]
    out = []
    for config in configurations(frame, wanted):
        label = ", ".join(
            f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(wanted, config, strict=True)
        )
        runs = select_rows(frame, wanted, config)["run_dir"]
        out.append((label or "all runs", [res.path / d for d in runs]))
    if not out:
        raise AifabricError(f"sweep {target} has no complete run to compare")
    return out


def _pool(results: list, keys) -> tuple[dict, dict]:
    """Per key: the mean of the values present, and the half-width of its 95% t interval."""
    from aifabric.experiments.stats import describe, half_width

    means, spread = {}, {}
    for key in keys:
        values = [getattr(r, key) for r in results if getattr(r, key) is not None]
        means[key] = describe(values)["mean"]
        spread[key] = half_width(values)
    return means, spread


def group_summary(name: str, summaries: list[Summary]) -> Summary:
    """One `Summary` for a group of runs' summaries: the means, `spread` (95%
    half-intervals), `runs`; jobs matched by name."""
    from aifabric.analysis.results import JobSummary, Summary

    out, spread = _pool(summaries, Summary.figures())
    tiers = {s.ecmp_tier for s in summaries}
    jobs = []
    for job_name in dict.fromkeys(j.name for s in summaries for j in s.jobs):
        mine = [j for s in summaries for j in s.jobs if j.name == job_name]
        means, job_spread = _pool(mine, JOB_FIGURES)
        jobs.append(
            JobSummary(job=mine[0].job, name=job_name, kind=mine[0].kind, **means,
                       runs=len(mine), spread=job_spread)
        )  # fmt: skip
    return Summary(
        **out,
        name=name,
        runs=len(summaries),
        jobs=tuple(jobs),
        ecmp_tier=tiers.pop() if len(tiers) == 1 else "several",
        spread=spread,
    )
