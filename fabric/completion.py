"""What every engine reports the same way, computed once from the flows' start and end times.

- `completion_ns`: from the first flow's start to the last finished flow's end;
- `algbw_bps`: nccl-tests' algbw of an operation's bytes and time;
- `collective_records`: per collective operation its start (the first of its
  flows to start), its end (the last of its flows to end, -1 unless all did),
  algbw = bytes / time and busbw = algbw x the operation's busbw factor
  (nccl-tests; recorded too, so the analyzer needs no table of its own), and
  the NCCL protocol and cost-model time the flow table gives it, and the
  compute it waited for (`ready_ns`, when that compute was done;
  `iteration_start_ns`, its job's start; `compute_ns`, its job's compute-only
  iteration time, 0 for a job with no compute), as collectives.npz holds them;
- `iterations`: per job with compute, its iteration time (the later of its
  compute's end and its last op's end, from its start), the compute-only lower
  bound, and the exposed communication, their difference (never negative);
- `collective_rows`: the same as the run's summary lists them.
"""

from __future__ import annotations

import numpy as np

# the kinds of op whose `bytes` are all its flows' together (aifabric.traffic.spec.PATTERNS and a
# traffic matrix); a collective's are each rank's message, as in nccl-tests. Here, not in
# rundir: the analysis kernels import it, and the numba cache is keyed on what they import.
SIZE_IN_ALL = ("permutation", "incast", "uniform", "matrix")


def completion_ns(start_ns, end_ns) -> int | None:
    """From the first flow's start to the last finished flow's end (flows that never started
    or finished, -1, aside). For a complete run that is the whole run; for a partial one,
    the span of what was completed. None when no flow finished."""
    start, end = np.asarray(start_ns), np.asarray(end_ns)
    started, done = start[start >= 0], end[end >= 0]
    if not len(done) or not len(started):
        return None
    return int(done.max() - started.min())


def algbw_bps(nbytes, time_ns):
    """nccl-tests' algbw: an operation's bytes over its time, in bit/s (numbers or arrays;
    `time_ns` > 0). busbw is algbw times the operation's busbw factor. The one formula
    for the records the engines write and the figures the analyzer computes."""
    return nbytes * 8e9 / time_ns


def collective_records(flows, start_ns, end_ns) -> dict[str, np.ndarray]:
    """collectives.npz's columns for a flow table (`aifabric.traffic.flows.FlowTable`) whose flows
    started and ended at `start_ns` and `end_ns` (-1: never)."""
    t = flows
    start_ns, end_ns = np.asarray(start_ns), np.asarray(end_ns)
    m = len(t.op_id)
    start = np.full(m, -1, dtype=np.int64)
    end = np.full(m, -1, dtype=np.int64)
    origin = np.zeros(m, dtype=np.int64)  # the job's start: its flows' earliest less the wait
    for j, op in enumerate(t.op_id):
        sel = t.op == op
        if not sel.any():
            continue
        origin[j] = max(int(t.start_ns[sel].min()) - int(t.op_ready_ns[j]), 0)
        s = start_ns[sel]
        e = end_ns[sel]
        if (s >= 0).any():
            start[j] = s[s >= 0].min()
        if (e >= 0).all():
            end[j] = e.max()
    dur = np.where((end >= 0) & (end > start), end - start, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, algbw_bps(t.op_bytes, np.maximum(dur, 1)), 0.0)
    busbw = algbw * t.op_busbw_factor
    return {
        "op": t.op_id, "job": t.op_job, "kind": t.op_kind, "algorithm": t.op_algorithm,
        "bytes": t.op_bytes, "ranks": t.op_ranks, "start_ns": start, "end_ns": end,
        "algbw_bps": algbw, "busbw_bps": busbw, "busbw_factor": t.op_busbw_factor,
        "protocol": t.op_protocol, "predicted_ns": t.op_predicted_ns,
        "ready_ns": origin + t.op_ready_ns, "iteration_start_ns": origin,
        "compute_ns": t.op_compute_ns,
    }  # fmt: skip


def iterations(coll: dict) -> list[dict]:
    """Per job whose ops carry compute (collectives.npz's `compute_ns` above 0): `job`,
    `start_ns`, `compute_ns` (the compute-only iteration: the lower bound), `iteration_ns`
    (from the start to the later of the compute's end and the last op's end; None unless
    every op of the job ended) and `exposed_ns` = iteration - compute, the communication
    the compute did not hide."""
    if "compute_ns" not in coll:
        return []
    out = []
    jobs, compute = np.asarray(coll["job"]), np.asarray(coll["compute_ns"])
    for job in np.unique(jobs[compute > 0]):
        sel = jobs == job
        start = int(np.asarray(coll["iteration_start_ns"])[sel].min())
        work = int(compute[sel].max())
        ends = np.asarray(coll["end_ns"])[sel]
        iteration = max(work, int(ends.max()) - start) if (ends >= 0).all() else None
        out.append({
            "job": int(job), "start_ns": start, "compute_ns": work, "iteration_ns": iteration,
            "exposed_ns": None if iteration is None else iteration - work,
        })  # fmt: skip
    return out


def collective_rows(coll: dict) -> list[dict]:
    """One row per collective for the run's summary (time_ns None where it did not end)."""
    return [
        {
            "op": int(coll["op"][j]),
            "kind": str(coll["kind"][j]),
            "algorithm": str(coll["algorithm"][j]),
            "bytes": int(coll["bytes"][j]),
            "ranks": int(coll["ranks"][j]),
            "time_ns": int(coll["end_ns"][j] - coll["start_ns"][j])
            if coll["end_ns"][j] >= 0
            else None,
            "algbw_bps": float(coll["algbw_bps"][j]),
            "busbw_bps": float(coll["busbw_bps"][j]),
            **(
                {"protocol": str(coll["protocol"][j]), "predicted_ns": int(coll["predicted_ns"][j])}
                if "protocol" in coll
                else {}
            ),
        }
        for j in range(len(coll["op"]))
    ]
