"""The live file: the figures a running run streams into its run directory.

An engine rewrites `live.json` (schema `aifabric.live/1`, atomically) at most
once every `EVERY_S` seconds while it runs, from its own state (the simulator
between two slices of events, the emulator from its monitor's polls), and a
last time, `final: true`, once it has written its results. `aifabric watch`
reads it; a run directory without one (a run that has not started running, or
an older one) is still complete without it. Fields:

    schema, engine, final   final: written after the engine wrote its results
    written_at              Unix time of the record (s)
    wall_s                  wall seconds since the engine began to run
    simulated_ns            the fabric's clock (the emulator's: wall time / scale)
    events, events_per_s    the simulator's events so far, and per wall second over
                            the last interval; null for the emulator
    flows, flows_done
    interval_ns             the stretch of fabric time the rates below cover: since
                            the previous record (the first: since time 0)
    totals                  over every port recorded, so far: tx_bytes, ecn_marked,
                            paused_ns, pfc_sent, drops (and cnp_sent where counted),
                            as ports.npz's series add up
    jobs[]                  job, flows, flows_done, bytes (to deliver), delivered_bytes,
                            rate_bps (delivered over interval_ns), mean_bps (delivered
                            over simulated_ns)
    ports[]                 the `TOP_PORTS` hottest ports: the longest queues, then
                            the most ECN marks over interval_ns, then the busiest;
                            port (its name), queue_bytes (queued at the record; from
                            a run directory: the most it held), utilization (of its
                            line rate over interval_ns), tx_bytes, ecn_marked,
                            paused_ns, drops (so far)
    covers                  only where the record sees part of the fabric (a rank of
                            an MPI run: the partitions it holds): which part; the
                            clock, events and flows done are still the whole run's

`from_run` makes the same record from a finished run directory's files.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.rundir import write_json

LIVE = "live.json"
LIVE_SCHEMA = "aifabric.live/1"
EVERY_S = 1.0  # at most one record per this many wall seconds while a run runs
TOP_PORTS = 8
TOTALS = ("tx_bytes", "ecn_marked", "paused_ns", "pfc_sent", "drops")
OPTIONAL_TOTALS = ("cnp_sent",)


class LiveStream:
    """Writes a run's live.json: `due()` says whether a record is wanted now, `write(...)`
    makes it from the engine's counters and remembers them for the next one's rates.

    A record that cannot be written stops the stream (`error` says why): a live view is a
    convenience, and the run goes on."""

    def __init__(self, run_dir, engine: str, fabric, job, nbytes, *, ports=None):
        self.path = Path(run_dir) / LIVE
        self.engine = engine
        self.fabric = fabric
        job = np.asarray(job, dtype=np.int64)
        self.jobs, self._job_of = np.unique(job, return_inverse=True)
        self._job_flows = np.bincount(self._job_of, minlength=len(self.jobs))
        self._job_bytes = np.bincount(
            self._job_of, weights=np.asarray(nbytes, dtype=np.float64), minlength=len(self.jobs)
        )
        self.ports = (
            np.arange(fabric.n_ports, dtype=np.int64)
            if ports is None
            else np.asarray(ports, dtype=np.int64)
        )
        self._rate_bps = fabric.port_rate_bps[self.ports].astype(np.float64)
        self.started = time.monotonic()
        self._at = -np.inf  # when the last record was written (monotonic)
        self._last: tuple | None = None  # (wall, now_ns, events, tx per port, delivered per job)
        self.error: str | None = None
        self.records = 0

    def due(self) -> bool:
        return self.error is None and time.monotonic() - self._at >= EVERY_S

    def write(self, *, final: bool = False, **counters) -> dict | None:
        """Write one record from `counters` (`record`'s keywords); the record, or None when
        it could not be written."""
        if self.error is not None:
            return None
        wall = time.monotonic()
        rec = self.record(wall, final=final, **counters)
        try:
            write_json(self.path, rec)
        except AifabricError as e:
            self.error = str(e)
            return None
        self._at = wall
        self.records += 1
        return rec

    def record(
        self,
        wall: float,
        *,
        now_ns: int,
        events: int | None,
        flows_done: int,
        delivered,
        done,
        totals: dict,
        queue_bytes,
        final: bool = False,
        covers: str | None = None,
    ) -> dict:
        """`delivered` and `done` per flow (bytes the receiver has, finished or not),
        `totals` per port of `ports` (cumulative series), `queue_bytes` per port now;
        `covers`: what part of the fabric they are, where not all of it."""
        delivered_job = np.bincount(
            self._job_of,
            weights=np.asarray(delivered, dtype=np.float64),
            minlength=len(self.jobs),
        )
        done_job = np.bincount(
            self._job_of, weights=np.asarray(done, dtype=np.float64), minlength=len(self.jobs)
        )
        tx = np.asarray(totals["tx_bytes"], dtype=np.int64)
        ecn = np.asarray(totals["ecn_marked"], dtype=np.int64)
        if self._last is None:
            last_wall, last_ns, last_events = self.started, 0, 0
            last_tx, last_ecn = np.zeros_like(tx), np.zeros_like(ecn)
            last_job = np.zeros_like(delivered_job)
        else:
            last_wall, last_ns, last_events, last_tx, last_ecn, last_job = self._last
        self._last = (wall, int(now_ns), events or 0, tx.copy(), ecn.copy(), delivered_job)
        rec = figures(
            self.fabric,
            self.ports,
            self._rate_bps,
            engine=self.engine,
            final=final,
            wall_s=wall - self.started,
            now_ns=int(now_ns),
            interval_ns=int(now_ns) - last_ns,
            events=events,
            events_per_s=(
                None
                if events is None or wall <= last_wall
                else (events - last_events) / (wall - last_wall)
            ),
            flows_done=int(flows_done),
            jobs=(self.jobs, self._job_flows, done_job, self._job_bytes, delivered_job),
            job_delta=delivered_job - last_job,
            totals=totals,
            tx_delta=tx - last_tx,
            ecn_delta=ecn - last_ecn,
            queue_bytes=np.asarray(queue_bytes, dtype=np.int64),
        )
        if covers is not None:
            rec["covers"] = covers
        return rec


def figures(
    fabric,
    ports,
    rate_bps,
    *,
    engine: str,
    final: bool,
    wall_s: float | None,
    now_ns: int,
    interval_ns: int,
    events: int | None,
    events_per_s: float | None,
    flows_done: int,
    jobs: tuple,
    job_delta,
    totals: dict,
    tx_delta,
    ecn_delta,
    queue_bytes,
) -> dict:
    """One record of the live file (the module's docstring lists the fields)."""
    job_ids, job_flows, job_done, job_bytes, delivered = jobs
    span_s = interval_ns / 1e9
    job_rows = [
        {
            "job": int(j),
            "flows": int(job_flows[k]),
            "flows_done": int(job_done[k]),
            "bytes": int(job_bytes[k]),
            "delivered_bytes": int(delivered[k]),
            "rate_bps": round(float(job_delta[k] * 8 / span_s)) if span_s > 0 else None,
            "mean_bps": round(float(delivered[k] * 8e9 / now_ns)) if now_ns > 0 else None,
        }
        for k, j in enumerate(job_ids)
    ]
    util = (
        np.asarray(tx_delta, dtype=np.float64) * 8 / span_s / np.maximum(rate_bps, 1)
        if span_s > 0
        else np.zeros(len(ports))
    )
    tx = np.asarray(totals["tx_bytes"], dtype=np.int64)
    # hottest first: the longest queue, then the most ECN marks and the highest
    # utilization over the interval, then the port id
    order = np.lexsort((ports, -util, -np.asarray(ecn_delta), -queue_bytes))
    hot = [k for k in order[:TOP_PORTS] if tx[k] > 0 or queue_bytes[k] > 0]
    port_rows = [
        {
            "port": fabric.port_name(int(ports[k])),
            "queue_bytes": int(queue_bytes[k]),
            "utilization": round(float(util[k]), 4),
            "tx_bytes": int(tx[k]),
            **{
                name: int(totals[name][k])
                for name in ("ecn_marked", "paused_ns", "drops")
                if name in totals
            },
        }
        for k in hot
    ]
    return {
        "schema": LIVE_SCHEMA,
        "engine": engine,
        "final": bool(final),
        "written_at": round(time.time(), 3),
        "wall_s": None if wall_s is None else round(float(wall_s), 3),
        "simulated_ns": int(now_ns),
        "events": None if events is None else int(events),
        "events_per_s": None if events_per_s is None else round(float(events_per_s)),
        "flows": int(sum(int(x) for x in job_flows)),
        "flows_done": int(flows_done),
        "interval_ns": int(interval_ns),
        "totals": {
            name: int(np.asarray(totals[name]).sum())
            for name in TOTALS + OPTIONAL_TOTALS
            if name in totals
        },
        "jobs": job_rows,
        "ports": port_rows,
    }


def read_live(path: str | Path) -> dict | None:
    """The live record in run directory `path`, or None (none written, or not one)."""
    try:
        rec = json.loads((Path(path) / LIVE).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("schema") == LIVE_SCHEMA else None


def from_run(run) -> dict | None:
    """The record of a run from its run directory's files (`aifabric.fabric.rundir.Run`):
    what its engine's final live record holds, for runs of any engine and age; None when
    the run has not written its port series."""
    from aifabric.fabric.export import fabric_from_topology

    ports = run.ports()
    flows = run.flows()
    if ports is None or flows is None:
        return None
    fabric = fabric_from_topology(run.topology())
    summary = run.meta.get("results", {}).get("summary", {})
    port = ports["port"].astype(np.int64)
    interval = int(ports["interval_ns"])
    t_ns = ports["t_ns"]
    now_ns = summary.get("simulated_ns")
    if now_ns is None:
        now_ns = int(t_ns[-1]) + interval if len(t_ns) else 0
    totals = {name: ports.total(name) for name in TOTALS + OPTIONAL_TOTALS if name in ports}
    done = flows["end_ns"] >= 0
    delivered = flows["delivered_bytes"] if "delivered_bytes" in flows else flows["bytes"] * done
    job_ids, job_of = np.unique(flows["job"].astype(np.int64), return_inverse=True)

    def per_job(values):
        w = np.asarray(values, dtype=np.float64)
        return np.bincount(job_of, weights=w, minlength=len(job_ids))

    delivered_job = per_job(delivered)
    events = summary.get("events")
    return figures(
        fabric,
        port,
        fabric.port_rate_bps[port].astype(np.float64),
        engine=run.engine,
        final=True,
        wall_s=run.meta.get("wall_time_s"),
        now_ns=int(now_ns),
        interval_ns=int(now_ns),
        events=events,
        events_per_s=summary.get("events_per_s"),
        flows_done=int(done.sum()),
        jobs=(
            job_ids,
            np.bincount(job_of, minlength=len(job_ids)),
            per_job(done),
            per_job(flows["bytes"]),
            delivered_job,
        ),
        job_delta=delivered_job,
        totals=totals,
        tx_delta=totals["tx_bytes"],
        ecn_delta=totals["ecn_marked"],
        queue_bytes=ports.peak("qdepth_max_bytes"),
    )
