"""A run directory's records as pandas DataFrames: flows, per-port samples, collectives.

The one place that turns the run directory's columns into tables (what
`aifabric.Run.flows`, `.ports` and `.collectives` return). Units are in the
column names (`_ns`, `_bytes`, `_bps` in bit/s; `utilization` is 0..1 of the
port's line rate); nodes, ports and jobs are named as everywhere else (node
names, `Fabric.port_name`, the workload's job names), as categoricals. A time
that does not exist (a flow that did not start or finish) is <NA>, in pandas'
nullable Int64, never -1. `_columns` reads a file's columns: it is what changes
when the run directory keeps them in another format.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aifabric.fabric.completion import algbw_bps
from aifabric.fabric.model import Role


def _columns(run, name: str) -> dict[str, np.ndarray] | None:
    """The columns of the run directory's `name` table (flows, ports, collectives), or None
    when the run has none."""
    return {"flows": run.flows, "ports": run.ports, "collectives": run.collectives}[name]()


def _nullable(pd, values, ok):
    """Whole numbers in pandas' nullable Int64, <NA> where `ok` is False."""
    out = pd.array(np.asarray(values, dtype=np.int64), dtype="Int64")
    out[~np.asarray(ok, dtype=bool)] = pd.NA
    return out


def _times(pd, t):
    """Nanoseconds, <NA> where negative (not reached)."""
    t = np.asarray(t, dtype=np.int64)
    return _nullable(pd, t, t >= 0)


def _names(pd, labels, ids) -> Any:
    """`labels[ids]` as a categorical whose categories are all the labels, in id order."""
    return pd.Categorical.from_codes(np.asarray(ids, dtype=np.int64), categories=list(labels))


def _job_names(run, jobs) -> dict[int, str]:
    from aifabric.analysis.metrics import job_names

    return job_names(run, jobs)


def _job_column(pd, run, job: np.ndarray):
    names = _job_names(run, job)
    ids = sorted(names)
    codes = np.searchsorted(np.asarray(ids, dtype=np.int64), job.astype(np.int64))
    return pd.Categorical.from_codes(codes, categories=[names[j] for j in ids])


def flows(run, fabric):
    """One row per flow (one QP's transfer): flow_id, job (its name), op, step, channel,
    src and dst (NIC names), sqpn, dqpn, sport (RoCEv2's UDP source port), bytes,
    start_ns, end_ns, duration_ns, rate_bps (bytes over duration), hops (links it used),
    finished; route_epoch where the engine records it."""
    import pandas as pd

    f = _columns(run, "flows")
    if f is None:
        f = {k: np.zeros(0, np.int64) for k in ("flow_id", "job", "op", "step", "channel")}
        f.update({k: np.zeros(0, np.int64) for k in ("src", "dst", "sqpn", "dqpn", "sport")})
        f.update(bytes=np.zeros(0, np.int64), start_ns=np.zeros(0, np.int64))
        f.update(end_ns=np.zeros(0, np.int64), path_ptr=np.zeros(1, np.int64))
    start, end = f["start_ns"].astype(np.int64), f["end_ns"].astype(np.int64)
    done = (start >= 0) & (end >= 0)
    duration = end - start
    nbytes = f["bytes"].astype(np.int64)
    rate = np.full(len(nbytes), np.nan)
    timed = done & (duration > 0)
    rate[timed] = nbytes[timed] * 8e9 / duration[timed]
    frame = pd.DataFrame(
        {
            "flow_id": f["flow_id"].astype(np.int64),
            "job": _job_column(pd, run, f["job"]),
            "op": f["op"].astype(np.int64),
            "step": f["step"].astype(np.int64),
            "channel": f["channel"].astype(np.int64),
            "src": _names(pd, fabric.node_name, f["src"]),
            "dst": _names(pd, fabric.node_name, f["dst"]),
            "sqpn": f["sqpn"].astype(np.int64),
            "dqpn": f["dqpn"].astype(np.int64),
            "sport": f["sport"].astype(np.int64),
            "bytes": nbytes,
            "start_ns": _times(pd, start),
            "end_ns": _times(pd, end),
            "duration_ns": _nullable(pd, duration, done),
            "rate_bps": rate,
            "hops": np.diff(f["path_ptr"].astype(np.int64)),
            "finished": end >= 0,
        }
    )
    if "route_epoch" in f:
        frame["route_epoch"] = f["route_epoch"].astype(np.int64)
    return frame


def ports(run, fabric, *, every_cell: bool = False):
    """One row per (sample, recorded port) in which the port sent, queued, marked, paused,
    signalled or dropped something (the run directory's entries, in (sample, port) order;
    `every_cell` adds a row of zeros for every other cell: samples x ports rows): t_ns (the
    sample's start), port (its name), node, peer, tier (`rtsw>ctsw`, `nic>rtsw`, ...),
    rate_bps (line rate), then each series: tx_bytes, utilization, qdepth_max_bytes,
    qdepth_mean_bytes, ecn_marked, paused_ns, pfc_sent, drops (and cnp_sent where the
    engine samples it). Figures are the fabric's (an emulated run's rates and times scaled
    back).

    Sums and maxima per port or per sample are the same either way (a port or a sample
    without a row carried nothing); a mean over the samples divides a sum by the run's
    number of samples, `attrs["samples"]` (with `attrs["interval_ns"]`), not by a port's
    rows. The default leaves out the cells in which nothing happened because in a fabric
    of thousands of ports most are, and a row for each makes gigabytes; the table is then
    as large as the run directory's entries, and built from them alone."""
    import pandas as pd

    from aifabric.fabric.portseries import PortSamples
    from aifabric.fabric.rundir import OPTIONAL_PORT_SERIES, PORT_SERIES

    p = _columns(run, "ports")
    if p is None:
        none = np.zeros(0, np.int64)
        p = PortSamples(interval_ns=1, t_ns=none, port=none, sample_index=none,
                        port_index=none, **dict.fromkeys(PORT_SERIES, none))  # fmt: skip
    port = p.port.astype(np.int64)
    n = len(port)
    if every_cell:
        sample = np.repeat(np.arange(p.samples, dtype=np.int64), n)
        column = np.tile(np.arange(n, dtype=np.int64), p.samples)
    else:
        sample, column = p.sample_index, p.port_index

    def series(key):  # the column of series `key`, a row per entry or per cell
        values = p.entries[key]
        if not every_cell:
            return values
        out = np.zeros(p.samples * n, dtype=values.dtype)
        out[p.sample_index * n + p.port_index] = values
        return out

    each = port[column]
    node, peer = fabric.port_node[each], fabric.port_peer[each]
    roles = [r.label for r in Role]
    role = fabric.node_role.astype(np.int64)
    tier_labels = [f"{a}>{b}" for a in roles for b in roles]
    rate = fabric.port_rate_bps[each].astype(np.float64)
    frame = pd.DataFrame(
        {
            "t_ns": p.t_ns.astype(np.int64)[sample],
            "port": _names(pd, fabric.port_names, each),
            "node": _names(pd, fabric.node_name, node),
            "peer": _names(pd, fabric.node_name, peer),
            "tier": _names(pd, tier_labels, role[node] * len(roles) + role[peer]),
            "rate_bps": rate,
        }
    )
    for key in PORT_SERIES:
        frame[key] = series(key)
        if key == "tx_bytes":
            tx = frame[key].to_numpy().astype(np.int64)
            frame["utilization"] = tx * 8e9 / p.interval_ns / rate
    for key in OPTIONAL_PORT_SERIES:
        if key in p:
            frame[key] = series(key)
    frame.attrs.update(samples=p.samples, interval_ns=p.interval_ns)
    return frame


def collectives(run):
    """One row per collective op (or pattern): op, job (its name), kind, algorithm, bytes
    (a collective's: each rank's message; a pattern's or a matrix's: all its flows'),
    ranks, start_ns, end_ns, time_ns, algbw_bps and busbw_bps (nccl-tests, from start and
    end, as `analyze` computes them), busbw_factor, protocol and predicted_ns (the NCCL
    protocol and NCCL's cost-model time; "" and <NA> for patterns and older runs)."""
    import pandas as pd

    c = _columns(run, "collectives")
    if c is None:
        c = {k: np.zeros(0, np.int64) for k in ("op", "job", "bytes", "ranks")}
        c.update(start_ns=np.zeros(0, np.int64), end_ns=np.zeros(0, np.int64))
        c.update(kind=np.zeros(0, str), algorithm=np.zeros(0, str))
        c.update(algbw_bps=np.zeros(0), busbw_bps=np.zeros(0))
    start, end = c["start_ns"].astype(np.int64), c["end_ns"].astype(np.int64)
    done = (start >= 0) & (end > start)
    time_ns = end - start
    nbytes = c["bytes"].astype(np.int64)
    if "busbw_factor" in c:
        factor = c["busbw_factor"].astype(np.float64)
    else:  # a run written before the factor was recorded: busbw / algbw as written
        algbw, busbw = c["algbw_bps"].astype(np.float64), c["busbw_bps"].astype(np.float64)
        factor = np.divide(busbw, algbw, out=np.full(len(algbw), np.nan), where=algbw > 0)
    algbw = np.full(len(nbytes), np.nan)
    algbw[done] = algbw_bps(nbytes[done], time_ns[done])
    protocol = c["protocol"].astype(str) if "protocol" in c else np.full(len(nbytes), "")
    predicted = c["predicted_ns"] if "predicted_ns" in c else np.zeros(len(nbytes), np.int64)
    return pd.DataFrame(
        {
            "op": c["op"].astype(np.int64),
            "job": _job_column(pd, run, c["job"]),
            "kind": c["kind"].astype(str),
            "algorithm": c["algorithm"].astype(str),
            "bytes": nbytes,
            "ranks": c["ranks"].astype(np.int64),
            "start_ns": _times(pd, start),
            "end_ns": _times(pd, end),
            "time_ns": _nullable(pd, time_ns, done),
            "algbw_bps": algbw,
            "busbw_bps": algbw * factor,
            "busbw_factor": factor,
            "protocol": protocol,
            "predicted_ns": _nullable(pd, predicted, predicted > 0),
        }
    )
