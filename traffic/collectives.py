"""Collective algorithms as NCCL runs them across servers, as rank-level transfers.

`KINDS` holds one `Collective` per kind (allreduce, allgather, reducescatter,
alltoall, broadcast, sendrecv): its algorithms, the transfers each builds, their
count, bytes per rank and steps in closed form, and the nccl-tests busbw factor.
It is the one place a kind is described: the workload keys, `traffic show`,
the flow table's `op_busbw_factor` and the command line's choices read it.

Each algorithm function returns `Transfers`: one row per (sender, receiver, channel,
step group), in ranks 0..n-1 of one communicator, with the bytes it carries
and the transfers it waits for (CSR, always earlier rows, so the graph is
acyclic by construction). QP expansion and the mapping of ranks to NICs
happen later (`aifabric.traffic.generate`).

Granularity: a ring step moves 1/n of a channel's data on every edge of the
ring at once, so a ring AllReduce over n ranks has 2(n-1) steps of n
transfers: 1.2 billion transfers at 24,576 GPUs. Rings therefore group their
2(n-1) steps into at most `segments` pipelined transfers per edge (step group
k of edge r waits for group k-1 of edge r-1, whose data it forwards, and for
its own group k-1); with `segments = 0`, or when the ring has fewer steps,
every step is a transfer. Trees and chains (Broadcast) pipeline their data in
at most `segments` pieces of at least one chunk. Halving-doubling and the
pairwise AllToAll are not pipelined: one transfer per pair and step.
Bytes are exact integers: data is cut into n chunks of floor/ceil sizes, so
totals are exact and per-rank figures equal the closed forms whenever n
divides the size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_I32 = np.int32
_I64 = np.int64


@dataclass(frozen=True)
class Transfers:
    src: np.ndarray  # int32 rank
    dst: np.ndarray  # int32 rank
    channel: np.ndarray  # int32
    step: np.ndarray  # int32: the first algorithm step the transfer carries
    bytes: np.ndarray  # int64
    dep_ptr: np.ndarray  # int64[n + 1]
    dep: np.ndarray  # int64, earlier rows
    steps: int  # algorithm steps of the operation

    def __len__(self) -> int:
        return len(self.src)


def parts(total: int, n: int) -> np.ndarray:
    """`total` bytes cut into n pieces of floor/ceil sizes (exact sum)."""
    i = np.arange(n + 1, dtype=_I64)
    edges = (np.int64(total) * i) // n if total < 2**62 // max(n, 1) else _big_edges(total, n)
    return np.diff(edges)


def _big_edges(total: int, n: int) -> np.ndarray:
    return np.array([total * i // n for i in range(n + 1)], dtype=_I64)


def csr_from_pairs(n: int, t: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (flow t waits for flow d) -> (dep_ptr, dep), rows in t order, pairs deduplicated.

    `d` may be negative (flows of earlier operations, relative to this one)."""
    t = np.asarray(t, dtype=_I64)
    d = np.asarray(d, dtype=_I64)
    if len(t):
        low = min(int(d.min()), 0)
        span = max(int(d.max()), 0) - low + 1
        key = np.sort(t * span + (d - low))  # one int64 key: row, then prerequisite
        if len(key) > 1:
            key = key[np.concatenate(([True], key[1:] != key[:-1]))]
        t = key // span
        d = key % span + low
    ptr = np.zeros(n + 1, dtype=_I64)
    np.cumsum(np.bincount(t, minlength=n), out=ptr[1:])
    return ptr, d


def empty(steps: int = 0) -> Transfers:
    z32 = np.zeros(0, dtype=_I32)
    return Transfers(
        z32, z32, z32, z32, np.zeros(0, _I64), np.zeros(1, _I64), np.zeros(0, _I64), steps
    )


def concat(blocks: list[Transfers], steps: int | None = None) -> Transfers:
    """Independent transfer sets side by side (dependencies shifted)."""
    blocks = [b for b in blocks if len(b)]
    if not blocks:
        return empty(steps or 0)
    offsets = np.cumsum([0] + [len(b) for b in blocks])
    dep_ptr = [np.zeros(1, _I64)]
    base = 0
    for b in blocks:
        dep_ptr.append(b.dep_ptr[1:] + base)
        base += len(b.dep)
    return Transfers(
        src=np.concatenate([b.src for b in blocks]),
        dst=np.concatenate([b.dst for b in blocks]),
        channel=np.concatenate([b.channel for b in blocks]),
        step=np.concatenate([b.step for b in blocks]),
        bytes=np.concatenate([b.bytes for b in blocks]),
        dep_ptr=np.concatenate(dep_ptr),
        dep=np.concatenate([b.dep + o for b, o in zip(blocks, offsets[:-1], strict=True)]),
        steps=max(b.steps for b in blocks) if steps is None else steps,
    )


def _groups(total_steps: int, segments: int) -> np.ndarray:
    """Boundaries of step groups: every step when segments is 0 or large enough."""
    g = total_steps if segments == 0 else min(segments, total_steps)
    return (np.arange(g + 1, dtype=_I64) * total_steps) // g


def ring(n: int, size: int, channels: int, segments: int, phases: int, shift: int) -> Transfers:
    """A ring of `phases` x (n-1) steps; at step s rank r sends chunk (r - s - shift) mod n to r+1.

    phases 2, shift 0: AllReduce (ReduceScatter then AllGather); phases 1: AllGather
    (shift 0) or ReduceScatter (shift 1).
    """
    total = phases * (n - 1)
    if n < 2:
        return empty(0)
    bounds = _groups(total, segments)
    g = len(bounds) - 1
    ch_sizes = parts(size, channels)
    # F_c(x) = bytes of chunks 0..x-1 of channel c, chunk indices taken mod n.
    chunk = np.stack([parts(int(s), n) for s in ch_sizes])  # (C, n)
    prefix = np.zeros((channels, n + 1), dtype=_I64)
    np.cumsum(chunk, axis=1, out=prefix[:, 1:])
    r = np.arange(n, dtype=_I64)
    a = bounds[:-1][:, None, None]
    b = bounds[1:][:, None, None]
    lo = r[None, None, :] - b + 1 - shift + 3 * n
    hi = r[None, None, :] - a - shift + 1 + 3 * n
    c = np.arange(channels)[None, :, None]

    def cum(x):
        return (x // n) * ch_sizes[c] + prefix[c, x % n]

    nbytes = (cum(hi) - cum(lo)).reshape(-1)
    m = g * channels * n
    idx = np.arange(m, dtype=_I64)
    k = idx // (channels * n)
    rank = idx % n
    src = rank.astype(_I32)
    dst = ((rank + 1) % n).astype(_I32)
    channel = ((idx // n) % channels).astype(_I32)
    step = bounds[k].astype(_I32)
    # group k > 0 of edge r waits for group k-1 of edge r-1 and of edge r
    has = k > 0
    deg = np.where(has, 2, 0)
    dep_ptr = np.zeros(m + 1, dtype=_I64)
    np.cumsum(deg, out=dep_ptr[1:])
    later = idx[has]
    prev = later - channels * n
    prev_rank = prev - (later % n) + (later % n - 1) % n
    dep = np.empty(2 * len(later), dtype=_I64)
    dep[0::2] = prev_rank
    dep[1::2] = prev
    return Transfers(src, dst, channel, step, nbytes, dep_ptr, dep, total)


def chains(lanes: np.ndarray, size: int, channels: int, segments: int, chunk: int) -> Transfers:
    """Pipelined chains: along each lane (a row of ranks) data flows rank to rank.

    Broadcast is one lane starting at the root; pipeline send/recv is one lane per
    position of a stage. The data is cut into at most `segments` pieces of at least
    one chunk; piece k on edge e waits for piece k on edge e-1 and piece k-1 on e.
    """
    lanes = np.asarray(lanes, dtype=_I64)
    n_lanes, length = lanes.shape
    edges = length - 1
    if edges < 1:
        return empty(0)
    blocks = []
    for c, s in enumerate(parts(size, channels)):
        pieces = max(1, -(-int(s) // chunk)) if edges > 1 else 1  # one hop: nothing to pipeline
        g = pieces if segments == 0 else min(segments, pieces)
        seg = parts(int(s), g)
        m = g * n_lanes * edges
        idx = np.arange(m, dtype=_I64)
        k = idx // (n_lanes * edges)
        lane = (idx // edges) % n_lanes
        e = idx % edges
        pairs_t, pairs_d = [], []
        has_e = e > 0
        pairs_t.append(idx[has_e])
        pairs_d.append(idx[has_e] - 1)
        has_k = k > 0
        pairs_t.append(idx[has_k])
        pairs_d.append(idx[has_k] - n_lanes * edges)
        ptr, dep = csr_from_pairs(m, np.concatenate(pairs_t), np.concatenate(pairs_d))
        blocks.append(
            Transfers(
                src=lanes[lane, e].astype(_I32),
                dst=lanes[lane, e + 1].astype(_I32),
                channel=np.full(m, c, dtype=_I32),
                step=(e + k).astype(_I32),
                bytes=seg[k],
                dep_ptr=ptr,
                dep=dep,
                steps=edges + g - 1,
            )
        )
    return concat(blocks)


def inorder_tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A balanced in-order binary tree over positions 0..n-1: (parent, depth), root's parent -1."""
    parent = np.full(n, -1, dtype=_I64)
    depth = np.zeros(n, dtype=_I64)
    stack = [(0, n, -1, 0)]
    while stack:
        lo, hi, up, d = stack.pop()
        if lo >= hi:
            continue
        mid = (lo + hi) // 2
        parent[mid] = up
        depth[mid] = d
        stack.append((lo, mid, mid, d + 1))
        stack.append((mid + 1, hi, mid, d + 1))
    return parent, depth


def tree(n: int, size: int, channels: int, segments: int, chunk: int) -> Transfers:
    """Double binary tree AllReduce: two trees, each reduces half the data up and broadcasts it
    down. The second tree is the first shifted by one rank, so a leaf of one is inner in the
    other. Pieces are pipelined like `chains`."""
    if n < 2:
        return empty(0)
    parent, depth = inorder_tree(n)
    height = int(depth.max())
    root = int(np.flatnonzero(parent < 0)[0])
    nonroot = np.flatnonzero(parent >= 0)
    up_order = nonroot[np.argsort(-depth[nonroot], kind="stable")]
    down_order = nonroot[np.argsort(depth[nonroot], kind="stable")]
    up_pos = np.empty(n, dtype=_I64)
    up_pos[up_order] = np.arange(n - 1)
    down_pos = np.empty(n, dtype=_I64)
    down_pos[down_order] = np.arange(n - 1)
    root_children = np.flatnonzero(parent == root)
    inner_children = nonroot[parent[nonroot] != root]
    blocks = []
    for c, s_c in enumerate(parts(size, channels)):
        for t, half in enumerate(parts(int(s_c), 2)):
            pieces = max(1, -(-int(half) // chunk))
            g = pieces if segments == 0 else min(segments, pieces)
            seg = parts(int(half), g)
            per = n - 1
            m = 2 * g * per

            def up(k, p, per=per):
                return k * per + up_pos[p]

            def down(k, p, g=g, per=per):
                return g * per + k * per + down_pos[p]

            ks = np.arange(g, dtype=_I64)
            pt, pd = [], []
            # up: p waits for its children's piece k, and its own piece k-1
            ch = inner_children
            pt.append(up(ks[:, None], parent[ch][None, :]).ravel())
            pd.append(up(ks[:, None], ch[None, :]).ravel())
            if g > 1:
                pt.append(up(ks[1:, None], nonroot[None, :]).ravel())
                pd.append(up(ks[:-1, None], nonroot[None, :]).ravel())
            # down into a root child: waits for the root to have every up piece k
            rc_t = np.repeat(root_children, len(root_children))
            rc_d = np.tile(root_children, len(root_children))
            pt.append(down(ks[:, None], rc_t[None, :]).ravel())
            pd.append(up(ks[:, None], rc_d[None, :]).ravel())
            pt.append(down(ks[:, None], inner_children[None, :]).ravel())
            pd.append(down(ks[:, None], parent[inner_children][None, :]).ravel())
            if g > 1:
                pt.append(down(ks[1:, None], nonroot[None, :]).ravel())
                pd.append(down(ks[:-1, None], nonroot[None, :]).ravel())
            ptr, dep = csr_from_pairs(m, np.concatenate(pt), np.concatenate(pd))
            pos_up = np.tile(up_order, g)
            pos_down = np.tile(down_order, g)
            k_all = np.repeat(ks, per)
            rank = lambda p, t=t: ((p + t) % n).astype(_I32)  # noqa: E731
            blocks.append(
                Transfers(
                    src=np.concatenate([rank(pos_up), rank(parent[pos_down])]),
                    dst=np.concatenate([rank(parent[pos_up]), rank(pos_down)]),
                    channel=np.full(m, c, dtype=_I32),
                    step=np.concatenate(
                        [height - depth[pos_up] + k_all, height + depth[pos_down] - 1 + k_all]
                    ).astype(_I32),
                    bytes=np.concatenate([seg[k_all], seg[k_all]]),
                    dep_ptr=ptr,
                    dep=dep,
                    steps=2 * height + g - 1,
                )
            )
    return concat(blocks)


class _Sequencer:
    """Builds transfers step by step; a rank's transfer waits for its previous send and receive."""

    def __init__(self, n: int):
        self.last_sent = np.full(n, -1, dtype=_I64)
        self.last_recv = np.full(n, -1, dtype=_I64)
        self.cols: list[tuple] = []
        self.pt: list[np.ndarray] = []
        self.pd: list[np.ndarray] = []
        self.count = 0

    def step(self, src, dst, nbytes, channel: int, step: int):
        src = np.asarray(src, dtype=_I64)
        dst = np.asarray(dst, dtype=_I64)
        idx = self.count + np.arange(len(src), dtype=_I64)
        for prev in (self.last_sent[src], self.last_recv[src]):
            ok = prev >= 0
            self.pt.append(idx[ok])
            self.pd.append(prev[ok])
        self.last_sent[src] = idx
        self.last_recv[dst] = idx
        self.cols.append((src, dst, np.broadcast_to(np.asarray(nbytes, _I64), src.shape), step))
        self.count += len(src)

    def done(self, channel: int, steps: int) -> Transfers:
        if not self.count:
            return empty(steps)
        ptr, dep = csr_from_pairs(
            self.count,
            np.concatenate(self.pt) if self.pt else np.zeros(0, _I64),
            np.concatenate(self.pd) if self.pd else np.zeros(0, _I64),
        )
        return Transfers(
            src=np.concatenate([c[0] for c in self.cols]).astype(_I32),
            dst=np.concatenate([c[1] for c in self.cols]).astype(_I32),
            channel=np.full(self.count, channel, dtype=_I32),
            step=np.concatenate([np.full(len(c[0]), c[3], dtype=_I32) for c in self.cols]),
            bytes=np.concatenate([c[2] for c in self.cols]).astype(_I64),
            dep_ptr=ptr,
            dep=dep,
            steps=steps,
        )


def halving_doubling(n: int, size: int, channels: int) -> Transfers:
    """Rabenseifner AllReduce: ReduceScatter by recursive halving, AllGather by doubling.

    With n not a power of two, the first 2e ranks (e = n - p, p the largest power of
    two <= n) pair up: the even one hands its whole buffer to the odd one before, and
    gets the result back after, so p ranks run the core."""
    if n < 2:
        return empty(0)
    p = 1 << (n.bit_length() - 1)
    e = n - p
    levels = p.bit_length() - 1
    q = np.arange(p, dtype=_I64)
    actual = np.where(q < e, 2 * q + 1, q + e)
    extra = np.arange(e, dtype=_I64)
    steps = 2 * levels + (2 if e else 0)
    blocks = []
    for c, s in enumerate(parts(size, channels)):
        s = int(s)
        seq = _Sequencer(n)
        step = 0
        if e:
            seq.step(2 * extra, 2 * extra + 1, s, c, step)
            step += 1
        lo = np.zeros(p, dtype=_I64)
        hi = np.full(p, s, dtype=_I64)
        ranges = []
        for j in range(levels):
            d = p >> (j + 1)
            bit = (q & d) != 0
            mid = (lo + hi) // 2
            ranges.append((lo.copy(), hi.copy()))
            seq.step(actual, actual[q ^ d], np.where(bit, mid - lo, hi - mid), c, step)
            lo, hi = np.where(bit, mid, lo), np.where(bit, hi, mid)
            step += 1
        for j in reversed(range(levels)):
            d = p >> (j + 1)
            seq.step(actual, actual[q ^ d], hi - lo, c, step)
            lo, hi = ranges[j]
            step += 1
        if e:
            seq.step(2 * extra + 1, 2 * extra, s, c, step)
        blocks.append(seq.done(c, steps))
    return concat(blocks, steps)


def pairwise(n: int, size: int, channels: int) -> Transfers:
    """AllToAll by pairwise exchange: at step s (1..n-1) rank r sends its block for r+s.

    `size` is each rank's send buffer; block j (for rank j) is the j-th of n parts."""
    if n < 2:
        return empty(0)
    blocks = []
    steps = n - 1
    for c, s in enumerate(parts(size, channels)):
        blk = parts(int(s), n)
        m = steps * n
        idx = np.arange(m, dtype=_I64)
        st = idx // n + 1
        r = idx % n
        dst = (r + st) % n
        has = st > 1
        later = idx[has]
        prev_send = later - n
        # at step s-1 rank r received from r - (s-1)
        prev_recv = (st[has] - 2) * n + (r[has] - st[has] + 1) % n
        ptr, dep = csr_from_pairs(
            m, np.concatenate([later, later]), np.concatenate([prev_send, prev_recv])
        )
        blocks.append(
            Transfers(
                src=r.astype(_I32),
                dst=dst.astype(_I32),
                channel=np.full(m, c, dtype=_I32),
                step=(st - 1).astype(_I32),
                bytes=blk[dst],
                dep_ptr=ptr,
                dep=dep,
                steps=steps,
            )
        )
    return concat(blocks, steps)


def pipeline_pieces(nbytes: int, hops: int, chunk: int, segments: int) -> int:
    """Pipelined flows a chain of `hops` carries `nbytes` in: chunks, capped by `segments`."""
    p = max(1, -(-nbytes // chunk)) if hops > 1 else 1
    return p if segments == 0 else min(segments, p)


@dataclass(frozen=True)
class Shape:
    """How a communicator runs an op, besides its ranks and size (the job's keys)."""

    channels: int = 1
    segments: int = 16  # pipelined transfers per connection, 0 = one per step
    chunk: int = 512 * 2**10
    root: int = 0  # Broadcast
    stages: int = 2  # send/recv

    def pieces(self, nbytes: int, hops: int) -> int:
        return pipeline_pieces(nbytes, hops, self.chunk, self.segments)

    def groups(self, steps: int) -> int:
        """Transfers per ring edge: its steps grouped into at most `segments`."""
        return steps if self.segments == 0 else min(self.segments, steps)

    def per_channel(self, size: int) -> list[int]:
        return [int(x) for x in parts(size, self.channels)]


class Collective:
    """One collective kind: its algorithms (the first is the default), the transfers
    each makes, their count, the bytes each rank sends and receives, its steps, and
    the nccl-tests busbw factor. A new kind is one subclass registered in `KINDS`.

    Counts and bytes are closed forms checked against the built transfers by the tests
    (`traffic show` uses them for ops too large to build)."""

    name: str = ""
    algorithms: tuple[str, ...] = ()
    # hierarchical: True when each rail carries 1/g of the data (g GPUs per server), False
    # when every rail moves all of it (AllToAll aggregated per server, send/recv)
    rails_split: bool = True

    def busbw_factor(self, n: int) -> float:
        """busbw = algbw x factor (nccl-tests' PERFORMANCE.md)."""
        raise NotImplementedError

    def refuse(self, n: int, shape: Shape, unit: str = "ranks") -> str | None:
        """Why n ranks (counted in `unit`) cannot run this kind with `shape` (None: they can)."""
        return None

    def transfers(self, algorithm: str, n: int, size: int, shape: Shape) -> Transfers:
        raise NotImplementedError

    def channel_count(self, algorithm: str, n: int, size: int, shape: Shape) -> int:
        """Transfers one channel carrying `size` bytes makes (n >= 2)."""
        raise NotImplementedError

    def channel_bytes(self, algorithm: str, n: int, size: int, shape: Shape, sent, recv):
        """Add one channel's bytes per rank to `sent` and `recv` (n >= 2)."""
        raise NotImplementedError

    def steps(self, algorithm: str, n: int, size: int, shape: Shape) -> int:
        """Algorithm steps of the op, as `transfers` numbers them (n >= 2)."""
        raise NotImplementedError

    def transfer_count(self, algorithm: str, n: int, size: int, shape: Shape) -> int:
        if n < 2:
            return 0
        return sum(self.channel_count(algorithm, n, s, shape) for s in shape.per_channel(size))

    def rank_bytes(
        self, algorithm: str, n: int, size: int, shape: Shape
    ) -> tuple[np.ndarray, np.ndarray]:
        """(sent, received) bytes per rank of one communicator."""
        sent = np.zeros(n, dtype=_I64)
        recv = np.zeros(n, dtype=_I64)
        if n >= 2:
            for s in shape.per_channel(size):
                self.channel_bytes(algorithm, n, s, shape, sent, recv)
        return sent, recv

    def op_steps(self, algorithm: str, n: int, size: int, shape: Shape) -> int:
        return self.steps(algorithm, n, size, shape) if n >= 2 else 0


class _RingKind(Collective):
    """Ring collectives: `phases` x (n-1) steps, chunk (r - s - shift) mod n at step s."""

    phases = 1
    shift = 0

    def transfers(self, algorithm, n, size, shape):
        return ring(n, size, shape.channels, shape.segments, self.phases, self.shift)

    def channel_count(self, algorithm, n, size, shape):
        return n * shape.groups(self.phases * (n - 1))

    def channel_bytes(self, algorithm, n, size, shape, sent, recv):
        chunk = parts(size, n)
        r = np.arange(n, dtype=_I64)
        # phase p skips the chunk index r - shift - (p + 1)(n - 1) = r - shift + p + 1
        skipped = np.zeros(n, dtype=_I64)
        for p in range(self.phases):
            skipped += chunk[(r - self.shift + p + 1) % n]
        mine = self.phases * size - skipped
        sent += mine
        recv += np.roll(mine, 1)  # r receives what r - 1 sends

    def steps(self, algorithm, n, size, shape):
        return self.phases * (n - 1)


class AllReduce(_RingKind):
    name = "allreduce"
    algorithms = ("ring", "tree", "halving-doubling")
    phases = 2  # ReduceScatter, then AllGather

    def busbw_factor(self, n):
        return 2 * (n - 1) / n

    def transfers(self, algorithm, n, size, shape):
        if algorithm == "tree":
            return tree(n, size, shape.channels, shape.segments, shape.chunk)
        if algorithm == "halving-doubling":
            return halving_doubling(n, size, shape.channels)
        return super().transfers(algorithm, n, size, shape)

    def channel_count(self, algorithm, n, size, shape):
        if algorithm == "tree":
            return sum(2 * (n - 1) * shape.pieces(int(h), 2) for h in parts(size, 2))
        if algorithm == "halving-doubling":
            p = 1 << (n.bit_length() - 1)
            return p * (p.bit_length() - 1) * 2 + 2 * (n - p)
        return super().channel_count(algorithm, n, size, shape)

    def channel_bytes(self, algorithm, n, size, shape, sent, recv):
        if algorithm == "tree":
            parent, _ = inorder_tree(n)
            children = np.bincount(parent[parent >= 0], minlength=n)
            for shift, half in enumerate(parts(size, 2)):
                per_pos = int(half) * ((parent >= 0).astype(_I64) + children)
                mine = np.roll(per_pos, shift)  # rank (p + shift) holds position p
                sent += mine
                recv += mine  # each tree edge carries the half once up and once down
        elif algorithm == "halving-doubling":
            tr = halving_doubling(n, size, 1)
            sent += np.bincount(tr.src, weights=tr.bytes, minlength=n).astype(_I64)
            recv += np.bincount(tr.dst, weights=tr.bytes, minlength=n).astype(_I64)
        else:
            super().channel_bytes(algorithm, n, size, shape, sent, recv)

    def steps(self, algorithm, n, size, shape):
        if algorithm == "tree":
            _, depth = inorder_tree(n)
            g = max(shape.pieces(int(h), 2) for s in shape.per_channel(size) for h in parts(s, 2))
            return 2 * int(depth.max()) + g - 1
        if algorithm == "halving-doubling":
            p = 1 << (n.bit_length() - 1)
            return 2 * (p.bit_length() - 1) + (2 if n > p else 0)
        return super().steps(algorithm, n, size, shape)


class AllGather(_RingKind):
    name = "allgather"
    algorithms = ("ring",)

    def busbw_factor(self, n):
        return (n - 1) / n


class ReduceScatter(_RingKind):
    name = "reducescatter"
    algorithms = ("ring",)
    shift = 1

    def busbw_factor(self, n):
        return (n - 1) / n


class AllToAll(Collective):
    """`size` is each rank's send buffer; rank j's block is the j-th of n parts."""

    name = "alltoall"
    algorithms = ("pairwise",)
    rails_split = False

    def busbw_factor(self, n):
        return (n - 1) / n

    def transfers(self, algorithm, n, size, shape):
        return pairwise(n, size, shape.channels)

    def channel_count(self, algorithm, n, size, shape):
        return n * (n - 1)

    def channel_bytes(self, algorithm, n, size, shape, sent, recv):
        chunk = parts(size, n)
        sent += size - chunk
        recv += (n - 1) * chunk

    def steps(self, algorithm, n, size, shape):
        return n - 1


class _ChainKind(Collective):
    """Pipelined chains of ranks (`lanes`, one row each): Broadcast and send/recv."""

    def lanes(self, n: int, shape: Shape) -> np.ndarray:
        raise NotImplementedError

    def transfers(self, algorithm, n, size, shape):
        return chains(self.lanes(n, shape), size, shape.channels, shape.segments, shape.chunk)

    def channel_count(self, algorithm, n, size, shape):
        lanes = self.lanes(n, shape)
        hops = lanes.shape[1] - 1
        return lanes.shape[0] * hops * shape.pieces(size, hops)

    def channel_bytes(self, algorithm, n, size, shape, sent, recv):
        lanes = self.lanes(n, shape)
        np.add.at(sent, lanes[:, :-1].ravel(), size)
        np.add.at(recv, lanes[:, 1:].ravel(), size)

    def steps(self, algorithm, n, size, shape):
        hops = self.lanes(n, shape).shape[1] - 1
        return hops + max(shape.pieces(s, hops) for s in shape.per_channel(size)) - 1


class Broadcast(_ChainKind):
    """One chain from the root through every rank."""

    name = "broadcast"
    algorithms = ("ring",)

    def busbw_factor(self, n):
        return 1.0

    def refuse(self, n, shape, unit="ranks"):
        if shape.root >= n:
            return f"broadcast root = {shape.root} is not a rank of {n} {unit}"
        return None

    def lanes(self, n, shape):
        return ((shape.root + np.arange(n, dtype=_I64)) % n)[None, :]


class SendRecv(_ChainKind):
    """Pipeline-parallel send/recv: `stages` equal stages, one chain per position."""

    name = "sendrecv"
    algorithms = ("p2p",)
    rails_split = False

    def busbw_factor(self, n):
        return 1.0

    def refuse(self, n, shape, unit="ranks"):
        if n % shape.stages:
            return f"sendrecv over {n} {unit} cannot form stages = {shape.stages} equal stages"
        return None

    def lanes(self, n, shape):
        per = n // shape.stages
        return np.arange(per, dtype=_I64)[:, None] + per * np.arange(shape.stages)[None, :]


KINDS: dict[str, Collective] = {
    c.name: c
    for c in (AllReduce(), AllGather(), ReduceScatter(), AllToAll(), Broadcast(), SendRecv())
}


def kind(name: str) -> Collective:
    if name not in KINDS:
        raise ValueError(f"unknown collective {name}; known: {', '.join(KINDS)}")
    return KINDS[name]


def busbw_factor(op_kind: str, n: int) -> float:
    """The nccl-tests busbw factor of an op; 1 (busbw = algbw) for traffic patterns."""
    return KINDS[op_kind].busbw_factor(n) if op_kind in KINDS else 1.0


def collective(
    name: str,
    algorithm: str,
    n: int,
    size: int,
    channels: int = 1,
    segments: int = 16,
    chunk: int = 512 * 2**10,
    root: int = 0,
    stages: int = 2,
) -> Transfers:
    """One communicator of n ranks running collective `name` with `algorithm`."""
    shape = Shape(channels, segments, chunk, root, stages)
    return kind(name).transfers(algorithm, n, size, shape)


def transfer_count(
    name: str,
    algorithm: str,
    n: int,
    size: int,
    channels: int = 1,
    segments: int = 16,
    chunk: int = 512 * 2**10,
    stages: int = 2,
) -> int:
    """How many transfers `collective` makes, in closed form (checked before building)."""
    shape = Shape(channels, segments, chunk, 0, stages)
    return kind(name).transfer_count(algorithm, n, size, shape)
