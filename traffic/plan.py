"""Collectives in closed form: bytes each rank sends and receives, flows and steps,
without building a single transfer.

`traffic show` falls back to these figures for a collective too large for a
flow table (an AllToAll over 24,576 GPUs is 604 million flows); the tests
check them against the generated tables, rank by rank.
"""

from __future__ import annotations

import numpy as np

from fabric.model import Fabric
from traffic import collectives as coll
from traffic.spec import Job

_I64 = np.int64


def rank_bytes(
    kind: str,
    algorithm: str,
    n: int,
    size: int,
    channels: int = 1,
    root: int = 0,
    stages: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """(sent, received) bytes per rank of one communicator running `kind`."""
    sent = np.zeros(n, dtype=_I64)
    recv = np.zeros(n, dtype=_I64)
    if n < 2:
        return sent, recv
    r = np.arange(n, dtype=_I64)
    for s_c in (int(x) for x in coll.parts(size, channels)):
        chunk = coll.parts(s_c, n)
        if kind == "allreduce" and algorithm == "tree":
            parent, _ = coll.inorder_tree(n)
            children = np.bincount(parent[parent >= 0], minlength=n)
            for shift, half in enumerate(coll.parts(s_c, 2)):
                per_pos = int(half) * ((parent >= 0).astype(_I64) + children)
                mine = np.roll(per_pos, shift)  # rank (p + shift) holds position p
                sent += mine
                recv += mine  # each tree edge carries the half once up and once down
        elif kind == "allreduce" and algorithm == "halving-doubling":
            tr = coll.halving_doubling(n, s_c, 1)
            sent += np.bincount(tr.src, weights=tr.bytes, minlength=n).astype(_I64)
            recv += np.bincount(tr.dst, weights=tr.bytes, minlength=n).astype(_I64)
        elif kind in ("allreduce", "allgather", "reducescatter"):
            phases = 2 if kind == "allreduce" else 1
            shift = 1 if kind == "reducescatter" else 0
            # rank r sends chunk (r - s - shift) mod n at steps s = 0 .. phases(n-1) - 1
            # phase p skips the chunk index r - shift - (p + 1)(n - 1) = r - shift + p + 1
            skipped = np.zeros(n, dtype=_I64)
            for p in range(phases):
                skipped += chunk[(r - shift + p + 1) % n]
            mine = phases * s_c - skipped
            sent += mine
            recv += np.roll(mine, 1)  # r receives what r - 1 sends
        elif kind == "alltoall":
            sent += s_c - chunk
            recv += (n - 1) * chunk
        elif kind == "broadcast":
            lane = (root + r) % n
            sent[lane[:-1]] += s_c
            recv[lane[1:]] += s_c
        else:
            per = n // stages
            sent[: n - per] += s_c
            recv[per:] += s_c
    return sent, recv


def op_steps(
    kind: str,
    algorithm: str,
    n: int,
    size: int,
    channels: int = 1,
    segments: int = 16,
    chunk: int = 512 * 2**10,
    stages: int = 2,
) -> int:
    """Algorithm steps of the operation, as `collectives` numbers them."""
    if n < 2:
        return 0

    def pieces(nbytes: int, hops: int) -> int:
        return coll.pipeline_pieces(nbytes, hops, chunk, segments)

    per_channel = [int(x) for x in coll.parts(size, channels)]
    if kind == "allreduce" and algorithm == "tree":
        _, depth = coll.inorder_tree(n)
        g = max(pieces(int(h), 2) for s in per_channel for h in coll.parts(s, 2))
        return 2 * int(depth.max()) + g - 1
    if kind == "allreduce" and algorithm == "halving-doubling":
        p = 1 << (n.bit_length() - 1)
        return 2 * (p.bit_length() - 1) + (2 if n > p else 0)
    if kind == "allreduce":
        return 2 * (n - 1)
    if kind in ("allgather", "reducescatter", "alltoall"):
        return n - 1
    hops = n - 1 if kind == "broadcast" else stages - 1
    return hops + max(pieces(s, hops) for s in per_channel) - 1


def collective_stats(fabric: Fabric, job: Job, nics: np.ndarray, name: str) -> list[dict]:
    """The per-op figures of `traffic.stats.op_stats` for a collective job, in closed form."""
    from traffic.generate import collective_flow_count, collective_instances

    kind, algorithm = job["collective"], job["algorithm"]
    instances = collective_instances(fabric, job, nics, name)
    sent = np.zeros(fabric.n_nodes, dtype=np.float64)
    recv = np.zeros(fabric.n_nodes, dtype=np.float64)
    steps = 0
    for ranks, size, root in instances:
        n = len(ranks)
        s, r = rank_bytes(kind, algorithm, n, size, job["channels"], root, job["stages"])
        sent[ranks] += s
        recv[ranks] += r
        steps = max(
            steps,
            op_steps(kind, algorithm, n, size, job["channels"], job["segments"], job["chunk"],
                     job["stages"]),
        )  # fmt: skip
    rate = fabric.port_rate_bps[fabric.nic_port[nics]].astype(np.float64)
    busy = np.maximum(sent[nics], recv[nics])
    n = len(nics)
    senders = np.count_nonzero(sent)
    op = {
        "job": 0,
        "kind": kind,
        "algorithm": algorithm + ("/hier" if job["hierarchical"] else ""),
        "size_bytes": job["size"],
        "ranks": n,
        "groups": 1,
        "flows": collective_flow_count(job, instances) // job["iterations"],
        "steps": steps,
        "bytes": int(sent.sum()),
        "max_rank_bytes": int(sent.max()),
        "mean_rank_bytes": int(round(sent.sum() / senders)) if senders else 0,
        "ideal_ns": int(np.ceil((busy * 8 / rate).max() * 1e9)),
        "busbw_factor": float(coll.BUSBW_FACTOR[kind](n)),
        "channels": job["channels"],
        "qps": job["qps"],
        "qp_mode": job["qp_mode"],
        "chunk_bytes": job["chunk"],
        "window": job["window"],
    }
    return [{"op": i, **op} for i in range(job["iterations"])]
