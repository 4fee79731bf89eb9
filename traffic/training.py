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

Compute: each layer's forward and backward time per micro-batch on one GPU, given
(`forward`, `backward`: 2 x forward unless set) or derived from the model's FLOPs:
6 x params x tokens per iteration, split 1:2 between forward and backward, shared
evenly by the GPUs (a GPU runs 1/tp of its stage's layers for 1/dp of the tokens,
one micro-batch at a time) at `gpu_tflops` x `efficiency`. The stages run GPipe's
schedule (every forward, then every backward): a stage's forward of micro-batch m
follows the previous stage's forward of m and its own of m - 1; a backward follows
the next stage's backward of m and its own previous pass. Each operation is
*ready* when the compute it waits for is done, and may not start before
(`Op.ready_ns`, from the job's start; the engines start its flows at the later of
that and the end of the op before it on the NIC, then its NCCL base latency):

- a gradient bucket (filled from the last layer backwards, as DDP fills them)
  once the last micro-batch's backward has passed the bucket's layers, so the
  bucket's AllReduce overlaps the rest of the backward pass;
- with `fsdp`, the forward AllGather of a bucket when the forward of the bucket
  before it begins (prefetch one ahead; the first at the start), the backward
  re-gather likewise in the backward pass, the ReduceScatter with the gradients;
- a pipeline send when its micro-batch's forward (backward) of the stage is done;
- an MoE layer's two AllToAlls at that layer's place in its stage's pass (MoE
  layers spread evenly over the stage's compute).

The compute schedule waits for compute only: a late gather or pipeline send
delays the operations behind it on the NIC, not the compute (an approximation:
the forward does not stall on FSDP's gathers). The job's compute-only iteration
time, the critical path of that schedule (`Op.compute_ns`), is its lower bound;
its iteration time is the later of that and its last operation's end, and the
difference its exposed communication (`aifabric.fabric.completion`). A job with
no compute keys has none: every op is ready at the job's start, as before.

Operations are ordered per NIC in this order (see `aifabric.traffic.generate`),
or with compute in the order compute makes them ready.
Their algorithms are fixed (ring, pairwise AllToAll, point-to-point sends); their
protocol is the job's `protocol`, or with "auto" NCCL's choice (`aifabric.traffic.nccl`:
its cost model for the collectives, its point-to-point rule for AllToAll and sends,
which never run LL128), each with NCCL's predicted time.
Expert gradients are reduced with the rest over the whole data-parallel group
(a simplification: a real MoE reduces expert weights over dp/ep replicas).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric
from aifabric.traffic import collectives as coll
from aifabric.traffic import nccl
from aifabric.traffic.spec import MAX_START_NS, Job

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

    plan = _schedule(job, layers, stage_layers, tp, dp, micro, stage_bytes, name)

    def issue(op, ready):
        ops.append(replace(op, ready_ns=int(ready), compute_ns=plan.compute_ns))

    def dp_ops(kinds, ready):
        if dp < 2:
            return
        for s in range(pp):
            for k, size in enumerate(buckets(s)):
                for kind in kinds:
                    op = collective(kind, "ring", size, dp_groups[s], ("dp", s))
                    issue(op, ready(s, k, kind))

    def moe(stage, m, forward):
        if ep < 2:
            return
        n = moe_per_stage[stage]
        for j in range(2 * n):
            size = job["moe_alltoall"]
            op = collective("alltoall", "pairwise", size, ep_groups[stage], ("ep", stage))
            issue(op, plan.moe_ready(stage, m, j // 2, n, forward))

    def send(a, b, ready):
        lanes = np.stack([ranks[a].reshape(-1), ranks[b].reshape(-1)], axis=1)
        issue(collective("sendrecv", "p2p", job["activation"], lanes, ("pp", a, b)), ready)

    if job["fsdp"]:
        dp_ops(["allgather"], lambda s, k, _: plan.prefetch(s, k, forward=True))
    for m in range(micro):
        for s in range(pp):
            moe(s, m, True)
            if s < pp - 1 and job["activation"]:
                send(s, s + 1, plan.fwd_end[m, s])
    for m in range(micro):
        for s in reversed(range(pp)):
            moe(s, m, False)
            if s > 0 and job["activation"]:
                send(s, s - 1, plan.bwd_end[m, s])

    def gradients(s, k, kind):
        if kind == "allgather":
            return plan.prefetch(s, k, forward=False)
        return plan.gradient_ready(s, k)

    dp_ops(["allgather", "reducescatter"] if job["fsdp"] else ["allreduce"], gradients)
    # issued in the order compute makes them ready (stable: unchanged without compute)
    ops.sort(key=lambda op: op.ready_ns)
    return ops


@dataclass(frozen=True)
class _Plan:
    """A training iteration's compute schedule on each stage (GPipe), in ns from the job's
    start: every micro-batch's forward and backward pass per stage, and per stage the
    layer times and the layer that holds each bucket's bytes (forward order)."""

    fwd_start: np.ndarray  # [micro, stage]
    fwd_end: np.ndarray
    bwd_start: np.ndarray
    bwd_end: np.ndarray
    forward_ns: list  # per stage: each layer's forward time, stage order
    backward_ns: list
    bucket_first: list  # per stage: per bucket, the index (in the stage) of its first layer
    bucket_last: list  # ... and of its last
    compute_ns: int

    def prefetch(self, s: int, k: int, forward: bool) -> int:
        """When FSDP gathers bucket k: as the pass reaches bucket k - 1 (the first at the
        pass's start); the forward pass runs the buckets first to last, the backward last
        to first."""
        if forward:  # the pass's k-th bucket is the (K-1-k)-th counted from the last layer
            if k == 0:
                return 0
            before = self.bucket_first[s][len(self.bucket_first[s]) - k]
            return int(self.fwd_start[0, s]) + int(self.forward_ns[s][:before].sum())
        start = int(self.bwd_start[-1, s])
        if k == 0:
            return start
        b = self.backward_ns[s]
        return start + int(b[self.bucket_last[s][k - 1] + 1 :].sum())

    def gradient_ready(self, s: int, k: int) -> int:
        """Bucket k of stage s (counted from the last layer): once the last micro-batch's
        backward has passed the bucket's first layer (in forward order)."""
        b = self.backward_ns[s]
        return int(self.bwd_start[-1, s]) + int(b[self.bucket_first[s][k] :].sum())

    def moe_ready(self, s: int, m: int, j: int, n: int, forward: bool) -> int:
        """MoE layer j of the n on stage s: at its place in the pass (evenly spread)."""
        if forward:
            start, end = self.fwd_start[m, s], self.fwd_end[m, s]
        else:
            start, end = self.bwd_start[m, s], self.bwd_end[m, s]
        return int(start + (end - start) * (j + 1) // (n + 1))


def layer_times(job: Job, layers: np.ndarray, tp: int, dp: int, micro: int) -> tuple:
    """Each layer's forward and backward time (ns) for one micro-batch on one GPU: given, or
    2 x its params x its tokens FLOPs forward and twice that backward, at the GPU's
    `gpu_tflops` x `efficiency`; zeros without compute keys."""
    if job["forward"]:
        fwd = np.full(len(layers), job["forward"], dtype=_I64)
        return fwd, np.full(len(layers), job["backward"] or 2 * job["forward"], dtype=_I64)
    if not job["gpu_tflops"]:
        return np.zeros(len(layers), dtype=_I64), np.zeros(len(layers), dtype=_I64)
    params = layers / job["dtype_bytes"]
    flops = 2.0 * params * job["tokens"] / (tp * dp * micro)
    fwd = np.rint(flops / (job["gpu_tflops"] * 1e12 * job["efficiency"]) * 1e9)
    # bounded before the cast: the whole iteration is checked against MAX_START_NS after
    fwd = np.minimum(fwd, MAX_START_NS + 1).astype(_I64)
    return fwd, 2 * fwd


def _schedule(job, layers, stage_layers, tp, dp, micro, stage_bytes, name) -> _Plan:
    fwd_l, bwd_l = layer_times(job, layers, tp, dp, micro)
    pp = len(stage_layers)
    # the schedule is at most every pass of every stage one after another (Python ints)
    bound = (int(fwd_l.sum()) + int(bwd_l.sum())) * (micro + pp - 1)
    if bound > MAX_START_NS:
        raise SpecError(
            f"workload {name}: the iteration's compute comes to up to {bound / 1e9:,.0f} s, "
            f"more than {MAX_START_NS // 10**9:,} s of simulated time; give less compute "
            "(forward, or gpu_tflops, efficiency and tokens)"
        )
    f = np.array([fwd_l[idx].sum() for idx in stage_layers], dtype=_I64)
    b = np.array([bwd_l[idx].sum() for idx in stage_layers], dtype=_I64)
    fs, fe = np.zeros((micro, pp), _I64), np.zeros((micro, pp), _I64)
    bs, be = np.zeros((micro, pp), _I64), np.zeros((micro, pp), _I64)
    for m in range(micro):
        for s in range(pp):
            fs[m, s] = max(fe[m, s - 1] if s else 0, fe[m - 1, s] if m else 0)
            fe[m, s] = fs[m, s] + f[s]
    for m in range(micro):
        for s in reversed(range(pp)):
            own = be[m - 1, s] if m else fe[-1, s]
            bs[m, s] = max(be[m, s + 1] if s < pp - 1 else 0, own)
            be[m, s] = bs[m, s] + b[s]
    first, last = [], []
    for s, idx in enumerate(stage_layers):
        cum = np.cumsum(layers[idx]) // tp  # bytes per GPU through each layer of the stage
        full, rest = divmod(stage_bytes[s], job["bucket"])
        # buckets fill from the last layer backwards: bucket k holds the stage's bytes
        # [total - end_k, total - start_k) in forward order
        starts = np.arange(full + bool(rest), dtype=_I64) * job["bucket"]
        ends = np.minimum(starts + job["bucket"], stage_bytes[s])
        lo = stage_bytes[s] - ends  # first byte (forward order)
        hi = stage_bytes[s] - starts - 1  # last byte
        first.append(np.searchsorted(cum, lo, side="right"))
        last.append(np.searchsorted(cum, hi, side="right"))
    return _Plan(
        fs, fe, bs, be,
        [fwd_l[idx] for idx in stage_layers], [bwd_l[idx] for idx in stage_layers],
        first, last, int(be.max()) if be.size else 0,
    )  # fmt: skip


def _layer_bytes(job: Job) -> np.ndarray:
    if job["layer_sizes"]:
        return np.asarray(job["layer_sizes"], dtype=_I64)
    total = job["params"] * job["dtype_bytes"]
    return coll.parts(total, job["layers"])
