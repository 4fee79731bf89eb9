"""One training iteration of a model with data, tensor, pipeline and expert parallelism.

Ranks follow Megatron's order over the job's GPUs in topology order: tensor
parallel fastest (inside a server, on NVLink: no fabric traffic), then data
parallel, then pipeline stage. Layers split evenly over the stages; each
GPU holds 1/tp of its stage's parameters. The iteration issues, in order:

1. with `fsdp`: an AllGather per bucket (parameters for the forward pass);
2. forward, per micro-batch and stage: for each MoE layer of the stage an
   AllToAll dispatch and combine over the expert-parallel group, then the
   activation send to the next stage;
3. backward, per micro-batch, stages in reverse: two AllToAll per MoE
   layer, then the gradient send to the previous stage;
4. gradients per bucket: an AllReduce over the data-parallel group, or with
   `fsdp` an AllGather (backward re-gather) and a ReduceScatter.

Operations are ordered per NIC in this order (see `aifabric.traffic.generate`).
Their algorithms are fixed (ring, pairwise AllToAll, point-to-point sends); their
protocol is the job's `protocol`, or with "auto" NCCL's choice (`aifabric.traffic.nccl`:
its cost model for the collectives, its point-to-point rule for AllToAll and sends,
which never run LL128), each with NCCL's predicted time.
Expert gradients are reduced with the rest over the whole data-parallel group
(a simplification: a real MoE reduces expert weights over dp/ep replicas).
"""

from __future__ import annotations

import numpy as np

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric
from aifabric.traffic import collectives as coll
from aifabric.traffic import nccl
from aifabric.traffic.spec import Job

_I64 = np.int64


def training_ops(
    fabric: Fabric, job: Job, nics: np.ndarray, name: str, table: nccl.Table = nccl.DEFAULT
) -> list:
    from aifabric.traffic.generate import Op, map_groups, server_matrix

    grid = server_matrix(fabric, nics, f"workload {name}: a training job")
    n = grid.size
    tp, pp, ep = job["tp"], job["pp"], job["ep"]
    per_server = grid.shape[1]
    if per_server % tp:
        raise SpecError(
            f"workload {name}: tp = {tp} must divide the {per_server} GPUs per server, "
            "tensor parallelism stays inside a server"
        )
    if n % (tp * pp):
        raise SpecError(f"workload {name}: {n} GPUs do not split into tp = {tp} x pp = {pp}")
    dp = n // (tp * pp)
    if job["dp"] and job["dp"] != dp:
        raise SpecError(
            f"workload {name}: dp = {job['dp']} does not match {n} GPUs / (tp {tp} x pp {pp}) "
            f"= {dp}"
        )
    if dp % ep:
        raise SpecError(f"workload {name}: ep = {ep} must divide the data-parallel size {dp}")
    ranks = grid.reshape(pp, dp, tp)  # [stage, dp index, tp index] -> NIC
    layers = _layer_bytes(job)
    stage_layers = np.array_split(np.arange(len(layers)), pp)
    stage_bytes = [int(layers[s].sum()) // tp for s in stage_layers]
    moe_per_stage = [len(x) for x in np.array_split(np.arange(job["moe_layers"]), pp)]
    micro = job["micro_batches"] or 2 * pp
    ch, chunk = job["channels"], job["chunk"]
    ops: list[Op] = []
    made: dict[tuple, Op] = {}  # the same operation on the same groups is built once
    table = table.merged(job["nccl"])

    def collective(kind, algorithm, size, groups, key):
        if (kind, size, key) not in made:
            n = groups.shape[1]
            proto = job["protocol"]
            if kind in nccl.P2P_KINDS and proto == "ll128":
                proto = "auto"
            # every rank its own NIC: each step crosses the network (nodes = ranks)
            c = nccl.resolve(table, fabric, kind, algorithm, proto, n, n, size, ch, groups)
            t = nccl.terms(table, kind, algorithm, c.protocol, n, size, ch)
            shape = coll.Shape(ch, t.step_bytes, chunk)
            tr = coll.kind(kind).transfers(algorithm, n, size, shape)
            made[kind, size, key] = Op(
                kind,
                algorithm,
                size,
                n,
                len(groups),
                tr.steps,
                map_groups(tr, groups),
                protocol=c.protocol,
                predicted_ns=c.predicted_ns,
                step_latency_ns=t.step_latency_ns,
                base_latency_ns=t.base_latency_ns,
                rate_factor=t.rate_factor,
                buffer_bytes=t.buffer_bytes,
            )
        return made[kind, size, key]

    def buckets(stage):
        total = stage_bytes[stage]
        full, rest = divmod(total, job["bucket"])
        return [job["bucket"]] * full + ([rest] if rest else [])

    dp_groups = [ranks[s].T for s in range(pp)]  # per stage: (tp, dp)
    ep_groups = [ranks[s].T.reshape(tp * dp // ep, ep) for s in range(pp)]

    def dp_ops(kinds):
        if dp < 2:
            return
        for s in range(pp):
            for size in buckets(s):
                for kind in kinds:
                    ops.append(collective(kind, "ring", size, dp_groups[s], ("dp", s)))

    def moe(stage):
        if ep < 2:
            return
        for _ in range(2 * moe_per_stage[stage]):
            size = job["moe_alltoall"]
            ops.append(collective("alltoall", "pairwise", size, ep_groups[stage], ("ep", stage)))

    def send(a, b):
        lanes = np.stack([ranks[a].reshape(-1), ranks[b].reshape(-1)], axis=1)
        ops.append(collective("sendrecv", "p2p", job["activation"], lanes, ("pp", a, b)))

    if job["fsdp"]:
        dp_ops(["allgather"])
    for _ in range(micro):
        for s in range(pp):
            moe(s)
            if s < pp - 1 and job["activation"]:
                send(s, s + 1)
    for _ in range(micro):
        for s in reversed(range(pp)):
            moe(s)
            if s > 0 and job["activation"]:
                send(s, s - 1)
    dp_ops(["allgather", "reducescatter"] if job["fsdp"] else ["allreduce"])
    return ops


def _layer_bytes(job: Job) -> np.ndarray:
    if job["layer_sizes"]:
        return np.asarray(job["layer_sizes"], dtype=_I64)
    total = job["params"] * job["dtype_bytes"]
    return coll.parts(total, job["layers"])
