"""Collectives in closed form: bytes each rank sends and receives, flows, steps and
ideal times, without building a single transfer.

An op has two ideal times. `ideal_ns` is the line-rate bound: its busiest NIC's
bytes at the NIC's rate, as if steps overlapped and nothing waited. `predicted_ns`
is NCCL's cost-model time on an idle fabric for the op's algorithm and protocol
(`aifabric.traffic.nccl.predict_ns`: per-step latencies, the protocol's share of
the line rate), what NCCL itself expects the op to take.

`traffic show` falls back to these figures for a collective too large for a
flow table (an AllToAll over 24,576 GPUs is 604 million flows); the tests
check them against the generated tables, rank by rank.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from aifabric.fabric.model import Fabric
from aifabric.traffic import collectives as coll
from aifabric.traffic import nccl
from aifabric.traffic.spec import Job


def collective_stats(
    fabric: Fabric, job: Job, nics: np.ndarray, name: str, table: nccl.Table = nccl.DEFAULT
) -> list[dict]:
    """The per-op figures of `traffic.summary.op_stats` for a collective job, in closed form."""
    from aifabric.traffic.generate import collective_flow_count, collective_instances, job_shape

    kind = job["collective"]
    collective = coll.kind(kind)
    instances = collective_instances(fabric, job, nics, name)
    choice = nccl.job_choice(table, fabric, job, nics, len(instances[0][0]))
    algorithm = choice.algorithm
    sent = np.zeros(fabric.n_nodes, dtype=np.float64)
    recv = np.zeros(fabric.n_nodes, dtype=np.float64)
    steps = 0
    for ranks, size, root in instances:
        n = len(ranks)
        shape = job_shape(job, n, algorithm, choice.protocol, table, size)
        s, r = collective.rank_bytes(algorithm, n, size, replace(shape, root=root))
        sent[ranks] += s
        recv[ranks] += r
        steps = max(steps, collective.op_steps(algorithm, n, size, shape))
    rate = fabric.port_rate_bps[fabric.nic_port[nics]].astype(np.float64)
    busy = np.maximum(sent[nics], recv[nics])
    n = len(nics)
    senders = np.count_nonzero(sent)
    op = {
        "job": 0,
        "kind": kind,
        "algorithm": algorithm + ("/hier" if job["hierarchical"] else ""),
        "protocol": choice.protocol,
        "size_bytes": job["size"],
        "ranks": n,
        "groups": 1,
        "flows": collective_flow_count(job, instances, algorithm, choice.protocol, table)
        // job["iterations"],
        "steps": steps,
        "bytes": int(sent.sum()),
        "max_rank_bytes": int(sent.max()),
        "mean_rank_bytes": int(round(sent.sum() / senders)) if senders else 0,
        "ideal_ns": int(np.ceil((busy * 8 / rate).max() * 1e9)),
        "predicted_ns": choice.predicted_ns,
        "busbw_factor": float(collective.busbw_factor(n)),
        "channels": job["channels"],
        "qps": job["qps"],
        "qp_mode": job["qp_mode"],
        "chunk_bytes": job["chunk"],
        "window": job["window"],
    }
    return [{"op": i, **op} for i in range(job["iterations"])]
