"""The figures one run contributes to a sweep's results table.

Column names carry their unit (`_ns`, `_gbps`, `_bytes`); per-job figures
end in `@JOB` (`busbw_gbps@allreduce`), per collective of a job with several
kinds in `@JOB/KIND-ALGORITHM`; ECMP figures per switch tier end in `.TIER`
(`ecmp_max_mean.rtsw>ctsw`); a drain plan's waves are numbered in the metric's name
(`wave0_busbw_gbps@JOB`, `wave0_capacity_kept.rtsw>ctsw`); a scheduled workload's
figures are `atsw_bytes`, `atsw_share`, `wait_ns` and per job `wait_ns@JOB`, `zones@JOB`.
Everything is read from the run directory through the analysis library (per job: its
time, ideal time and efficiency, busbw of a collective or goodput of a pattern; a training
job with compute also its iteration, compute and exposed time).
"""

from __future__ import annotations

from typing import Any

from aifabric.fabric.scenario import job_names

# the unit of each metric point_metrics writes, as results_long.parquet's `unit` says it
UNITS = {
    "completion_ns": "ns", "flows_unfinished": "flows", "fct_p50_ns": "ns", "fct_p99_ns": "ns",
    "ecn_marked": "packets", "cnp_sent": "packets", "pfc_frames": "frames", "paused_ns": "ns",
    "drops": "packets", "max_queue_bytes": "bytes", "ecmp_max_mean": "ratio",
    "ecmp_jain": "ratio", "ecmp_collisions": "flows", "ecmp_collisions_expected": "flows",
    "time_ns": "ns", "ideal_ns": "ns", "efficiency": "ratio", "senders_paused_ns": "ns",
    "busbw_gbps": "Gbit/s", "algbw_gbps": "Gbit/s", "goodput_gbps": "Gbit/s",
    "atsw_share": "ratio", "zones": "zones",
}  # fmt: skip
SUFFIX_UNITS = {
    "_ns": "ns", "_bytes": "bytes", "_gbps": "Gbit/s", "_bps": "bit/s", "_s": "s",
    "_capacity_kept": "ratio",
}  # fmt: skip


def unit_of(metric: str) -> str:
    """A metric's unit: from UNITS, else from its name's suffix, else ""."""
    if metric in UNITS:
        return UNITS[metric]
    return next((u for suffix, u in SUFFIX_UNITS.items() if metric.endswith(suffix)), "")


def point_metrics(path, scenario, groups) -> dict[str, Any]:
    """The results-table columns of the run directory `path` of `scenario`."""
    import numpy as np

    from aifabric.analysis.metrics import run_metrics
    from aifabric.fabric.rundir import Run

    run = Run(path)
    m = run_metrics(run, top=1)
    summary = run.meta.get("results", {}).get("summary", {})
    cong = m.congestion
    row: dict[str, Any] = {}
    if "completion" in groups:
        row["completion_ns"] = summary.get("completion_ns")
        row["flows_unfinished"] = m.flows.count - m.flows.finished
    if "fct" in groups:
        row["fct_p50_ns"] = m.fct_ns.p50
        row["fct_p99_ns"] = m.fct_ns.p99
    if "ecn" in groups:
        row["ecn_marked"] = cong.ecn_marked if cong else None
        row["cnp_sent"] = summary.get("cnp_sent")
    if "pfc" in groups:
        row["pfc_frames"] = cong.pfc_frames if cong else None
        row["paused_ns"] = cong.paused_ns if cong else None
    if "drops" in groups:
        row["drops"] = cong.drops if cong else None
    if "queue" in groups:
        row["max_queue_bytes"] = cong.qdepth_max_bytes if cong else None
    if "ecmp" in groups:
        for t in m.ecmp.tiers:
            row[f"ecmp_max_mean.{t.tier}"] = t.bytes.max_mean
            row[f"ecmp_jain.{t.tier}"] = t.bytes.jain
            row[f"ecmp_collisions.{t.tier}"] = t.collisions
            row[f"ecmp_collisions_expected.{t.tier}"] = t.collisions_expected

    names = job_names(scenario.workload)
    if "maintenance" in groups:
        row.update(_wave_columns(m.waves or (), names))
    if "scheduling" in groups and m.schedule is not None:
        row.update(_schedule_columns(m.schedule))
    jobs = {job.job: job for job in m.jobs}  # the analyzer's per-job figures
    for j, name in enumerate(names):
        job = jobs.get(j)
        if job is None:
            continue
        if "completion" in groups:
            row[f"time_ns@{name}"] = job.time_ns
            row[f"ideal_ns@{name}"] = job.ideal_ns or None
            row[f"efficiency@{name}"] = job.efficiency
            if job.compute_ns is not None:  # a training job with compute
                row[f"iteration_ns@{name}"] = job.iteration_ns
                row[f"compute_ns@{name}"] = job.compute_ns
                row[f"exposed_ns@{name}"] = job.exposed_ns
        if "pfc" in groups:
            row[f"senders_paused_ns@{name}"] = job.senders_paused_ns
        if "busbw" in groups:
            ops = [o for o in m.collectives.ops if o.job == j]
            done = [o for o in ops if o.busbw_bps is not None and o.algorithm != "-"]
            if done:
                row[f"busbw_gbps@{name}"] = job.busbw_bps.mean / 1e9
                row[f"algbw_gbps@{name}"] = job.algbw_bps.mean / 1e9
            if job.goodput_bps is not None:  # a pattern's throughput
                row[f"goodput_gbps@{name}"] = job.goodput_bps / 1e9
            labels = sorted({f"{o.kind}-{o.algorithm}" for o in done})
            for label in labels if len(labels) > 1 else ():
                mine = [o for o in done if f"{o.kind}-{o.algorithm}" == label]
                busbw = float(np.mean([o.busbw_bps for o in mine]))
                row[f"busbw_gbps@{name}/{label}"] = busbw / 1e9
    return row


def _wave_columns(waves, names: list[str]) -> dict[str, Any]:
    """Per wave the run reached: each job's busbw of the ops inside its window and receive
    rate per receiver, and per tier the share of its capacity kept."""
    row: dict[str, Any] = {}
    for w in waves:
        if not w.reached:
            continue
        for c in w.capacity_kept:
            row[f"wave{w.wave}_capacity_kept.{c.tier}"] = c.fraction
        for j in w.jobs:
            name = names[j.job] if j.job < len(names) else j.name
            if j.busbw_bps is not None:
                row[f"wave{w.wave}_busbw_gbps@{name}"] = j.busbw_bps / 1e9
            if j.rx_bps is not None:
                row[f"wave{w.wave}_rx_gbps@{name}"] = j.rx_bps / 1e9
    return row


def _schedule_columns(schedule) -> dict[str, Any]:
    """A scheduled workload's payload bytes over the ATSW layer (in all and as a share of
    every flow's bytes), its jobs' mean wait, and per job its wait and the zones it spans."""
    row: dict[str, Any] = {
        "atsw_bytes": schedule.atsw_bytes,
        "atsw_share": schedule.atsw_bytes / schedule.bytes if schedule.bytes else None,
    }
    waits = [j.wait_ns for j in schedule.jobs if j.wait_ns is not None]
    row["wait_ns"] = sum(waits) / len(waits) if waits else None
    for j in schedule.jobs:
        row[f"wait_ns@{j.name}"] = j.wait_ns
        row[f"zones@{j.name}"] = j.zones
    return row
