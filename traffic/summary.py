"""What each operation of a flow table asks of the fabric: bytes, flows, steps, ideal times."""

from __future__ import annotations

import numpy as np

from aifabric.fabric.model import Fabric
from aifabric.traffic.flows import FlowTable


def op_stats(fabric: Fabric, table: FlowTable) -> list[dict]:
    """One dict per op. `ideal_ns` is the busiest NIC's bytes (sent or received) at its
    line rate: the time the op takes if the fabric never congests and steps overlap.
    `predicted_ns` is NCCL's cost-model time for the op's algorithm and `protocol` on an
    idle fabric (`aifabric.traffic.nccl`; 0 for patterns and traffic matrices). `ready_ns`
    is the compute the op waits for from its job's start, `compute_ns` its job's
    compute-only iteration (`aifabric.traffic.training`; 0 without compute)."""
    rate = np.zeros(fabric.n_nodes, dtype=np.float64)
    nics = fabric.nic_ids
    rate[nics] = fabric.port_rate_bps[fabric.nic_port[nics]]
    bounds = np.searchsorted(table.op, np.arange(len(table.op_id) + 1))
    out = []
    for i in range(len(table.op_id)):
        lo, hi = bounds[i], bounds[i + 1]
        b = table.bytes[lo:hi].astype(np.float64)
        sent = np.bincount(table.src[lo:hi], weights=b, minlength=fabric.n_nodes)
        recv = np.bincount(table.dst[lo:hi], weights=b, minlength=fabric.n_nodes)
        busy = np.maximum(sent, recv)
        with np.errstate(divide="ignore", invalid="ignore"):
            seconds = np.where(rate > 0, busy * 8 / np.where(rate > 0, rate, 1), 0.0)
        senders = np.count_nonzero(sent)
        out.append(
            {
                "op": int(table.op_id[i]),
                "job": int(table.op_job[i]),
                "kind": str(table.op_kind[i]),
                "algorithm": str(table.op_algorithm[i]),
                "protocol": str(table.op_protocol[i]),
                "size_bytes": int(table.op_bytes[i]),
                "ranks": int(table.op_ranks[i]),
                "groups": int(table.op_groups[i]),
                "flows": int(hi - lo),
                "steps": int(table.op_steps[i]),
                "bytes": int(table.bytes[lo:hi].sum()),
                "max_rank_bytes": int(sent.max()) if hi > lo else 0,
                "mean_rank_bytes": int(round(sent.sum() / senders)) if senders else 0,
                "ideal_ns": int(np.ceil(seconds.max() * 1e9)) if hi > lo else 0,
                "predicted_ns": int(table.op_predicted_ns[i]),
                "ready_ns": int(table.op_ready_ns[i]),
                "compute_ns": int(table.op_compute_ns[i]),
                "busbw_factor": float(table.op_busbw_factor[i]),
                "channels": int(table.op_channels[i]),
                "qps": int(table.op_qps[i]),
                "qp_mode": str(table.op_qp_mode[i]),
                "chunk_bytes": int(table.op_chunk_bytes[i]),
                "window": int(table.op_window[i]),
            }
        )
    return out


def summarize_flows(fabric: Fabric, table: FlowTable) -> dict:
    ops = op_stats(fabric, table)
    return {
        "fabric": fabric.name,
        "closed_form": False,
        "flows": len(table),
        "dependencies": int(len(table.dep)),
        "bytes": int(table.bytes.sum()),
        "ops": ops,
    }


def describe(fabric: Fabric, workload, seed: int = 0) -> dict:
    """`summarize_flows` of the workload's flow table; for a single collective too large for a
    flow table, the same figures in closed form (`closed_form` true, no dependencies)."""
    from aifabric.traffic.generate import TooManyFlows, generate

    try:
        return summarize_flows(fabric, generate(fabric, workload, seed=seed))
    except TooManyFlows:
        if len(workload.jobs) != 1 or workload.jobs[0].kind != "collective":
            raise
    import numpy as np

    from aifabric.traffic.ideal import collective_stats
    from aifabric.traffic.placement import place

    job = workload.jobs[0]
    nics = place(fabric, job["gpus"], job["placement"], np.random.default_rng(seed))
    ops = collective_stats(fabric, job, nics, workload.name, workload.nccl_table)
    return {
        "fabric": fabric.name,
        "closed_form": True,
        "flows": sum(op["flows"] for op in ops),
        "dependencies": None,
        "bytes": sum(op["bytes"] for op in ops),
        "ops": ops,
    }


def show(fabric: Fabric, workload, seed: int = 0) -> dict:
    """`describe`, with the workload's name and job count, and its ops grouped: one group
    per run of identical ops (job, kind, algorithm, protocol, size, ranks, communicators)."""
    s = describe(fabric, workload, seed)
    groups: dict[tuple, list] = {}
    for op in s["ops"]:
        key = (
            op["job"], op["kind"], op["algorithm"], op["protocol"], op["size_bytes"], op["ranks"],
            op["groups"],
        )  # fmt: skip
        groups.setdefault(key, []).append(op)
    return {
        "workload": workload.name,
        "seed": seed,
        "jobs": len(workload.jobs),
        **s,
        "ideal_ns": sum(op["ideal_ns"] for op in s["ops"]),
        "predicted_ns": sum(op["predicted_ns"] for op in s["ops"]),
        "op_groups": [{"count": len(ops), **ops[0]} for ops in groups.values()],
    }
