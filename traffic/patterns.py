"""Synthetic traffic patterns used across the literature, to compare with other simulators.

- `permutation`: every rank sends `size` bytes to one other rank and receives
  from one (a seeded random derangement);
- `incast`: `senders` ranks (ranks 1..senders) each send `size` bytes to rank 0;
- `uniform`: `flows` flows between uniformly drawn distinct ranks, sizes
  fixed, exponential or Pareto with mean `size`; with `load` > 0 they arrive
  as a Poisson process offering that fraction of every NIC's rate.

Pattern flows have no dependencies; all are step 0.
"""

from __future__ import annotations

import numpy as np

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric
from aifabric.traffic import collectives as coll
from aifabric.traffic.spec import Job

_I32 = np.int32
_I64 = np.int64


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly drawn permutation without fixed points (rejection sampling)."""
    for _ in range(64):
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm
    order = rng.permutation(n)  # astronomically unlikely: fall back to one random cycle
    perm = np.empty(n, dtype=np.int64)
    perm[order] = np.roll(order, -1)
    return perm


def flow_sizes(job: Job, count: int, rng: np.random.Generator) -> np.ndarray:
    mean = job["size"]
    dist = job["distribution"]
    if dist == "fixed":
        return np.full(count, mean, dtype=_I64)
    if dist == "exponential":
        draw = rng.exponential(mean, count)
    else:
        shape = job["pareto_shape"]
        scale = mean * (shape - 1) / shape
        draw = scale * (1.0 + rng.pareto(shape, count))
    return np.maximum(1, np.rint(draw)).astype(_I64)


def pattern_op(fabric: Fabric, job: Job, nics: np.ndarray, rng, name: str):
    from aifabric.traffic.generate import Op

    n = len(nics)
    kind = job["pattern"]
    start = None
    if n < 2:
        raise SpecError(f"workload {name}: pattern {kind} needs at least 2 GPUs, the job has {n}")
    if kind == "permutation":
        src = np.arange(n, dtype=_I64)
        dst = derangement(n, rng)
        nbytes = np.full(n, job["size"], dtype=_I64)
    elif kind == "incast":
        senders = job["senders"]
        if senders > n - 1:
            raise SpecError(
                f"workload {name}: incast senders = {senders} needs {senders + 1} GPUs, "
                f"the job has {n}"
            )
        src = np.arange(1, senders + 1, dtype=_I64)
        dst = np.zeros(senders, dtype=_I64)
        nbytes = np.full(senders, job["size"], dtype=_I64)
    else:
        count = job["flows"] or n
        from aifabric.traffic.generate import MAX_FLOWS

        if count * job["channels"] * job["qps"] > MAX_FLOWS:
            raise SpecError(
                f"workload {name}: flows = {count:,} x channels x qps is more than the "
                f"{MAX_FLOWS:,} flows a flow table holds"
            )
        src = rng.integers(0, n, count)
        dst = (src + rng.integers(1, n, count)) % n
        nbytes = flow_sizes(job, count, rng)
        if job["load"] > 0:
            rate_bps = int(fabric.port_rate_bps[fabric.nic_port[nics]].min())
            mean_gap_ns = job["size"] * 8 * 1e9 / (job["load"] * rate_bps * n)
            start = np.cumsum(rng.exponential(mean_gap_ns, count)).astype(_I64)
    ch = job["channels"]
    m = len(src)
    per = np.stack([coll.parts(int(b), ch) for b in nbytes]) if ch > 1 else nbytes[:, None]
    tr = coll.Transfers(
        src=np.repeat(nics[src], ch).astype(_I32),
        dst=np.repeat(nics[dst], ch).astype(_I32),
        channel=np.tile(np.arange(ch, dtype=_I32), m),
        step=np.zeros(m * ch, dtype=_I32),
        bytes=per.reshape(-1).astype(_I64),
        dep_ptr=np.zeros(m * ch + 1, dtype=_I64),
        dep=np.zeros(0, dtype=_I64),
        steps=1,
    )
    if start is not None:
        start = np.repeat(start, ch)
    return Op(kind, "-", int(nbytes.sum()), n, 1, 1, tr, start_ns=start)
