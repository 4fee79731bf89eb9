"""Collective algorithms as NCCL runs them across servers, as rank-level transfers.

`KINDS` holds one `Collective` per kind (allreduce, allgather, reducescatter,
alltoall, broadcast, sendrecv): its algorithms, the transfers each builds, their
count, bytes per rank and steps in closed form, and the nccl-tests busbw factor.
It is the one place a kind is described: the workload keys, `traffic show`,
the flow table's `op_busbw_factor` and the command line's choices read it.

Each algorithm function returns `Transfers`, in ranks 0..n-1 of one communicator;
QP expansion and the mapping of ranks to NICs happen later
(`aifabric.traffic.generate`). Its rows are of one of two sorts:

- streams (rings, trees, chains): one row per connection (sender, receiver,
  channel), as NCCL keeps one per peer and channel. It carries every step of
  the operation on that connection, in order, in `stream_steps` steps of equal
  size (within a byte; a ring whose chunk is capped at `step_bytes` runs in
  loops of steps). Step k of a stream is released when every
  one of its input streams has delivered step k - offset at its sender (offset
  1 on a ring: r forwards at step k what r - 1 sent it at step k - 1, except at
  the first step of a loop, which is r's own chunk; 0 on a tree or a chain:
  piece k moves on once it has arrived), plus the step's latency. The engines
  execute streams: a simulator's NIC holds each stream's
  released and arrived steps, so a ring AllReduce over 24,576 ranks is 24,576
  rows per channel, not 1.2 billion, and no step starts before its input is
  there. `expand_steps` (`aifabric.traffic.steps`) writes the same causality out
  as one transfer per step for an engine that replays transfers.
- transfers (halving-doubling, the pairwise AllToAll): one row per pair and
  step; a row waits for the rows in `dep` (CSR, always earlier rows, so the
  graph is acyclic by construction): the data it forwards must have arrived.

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
    # streams (see the module docstring): steps per row, 0 for a plain transfer, and the
    # rows whose arrivals release its steps (CSR), with the release offset
    stream_steps: np.ndarray | None = None  # int32
    stream_offset: np.ndarray | None = None  # int8
    stream_loop: np.ndarray | None = None  # int32: steps per loop, 0 none
    in_ptr: np.ndarray | None = None  # int64[n + 1]
    inp: np.ndarray | None = None  # int64

    def __post_init__(self):
        n = len(self.src)
        if self.stream_steps is None:
            object.__setattr__(self, "stream_steps", np.zeros(n, dtype=_I32))
            object.__setattr__(self, "stream_offset", np.zeros(n, dtype=np.int8))
            object.__setattr__(self, "stream_loop", np.zeros(n, dtype=_I32))
            object.__setattr__(self, "in_ptr", np.zeros(n + 1, dtype=_I64))
            object.__setattr__(self, "inp", np.zeros(0, dtype=_I64))

    def __len__(self) -> int:
        return len(self.src)

    @property
    def streams(self) -> bool:
        """Are the rows streams (a connection carrying its steps) rather than transfers?"""
        return bool(len(self.src)) and bool(self.stream_steps[0] > 0)


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
    in_ptr = [np.zeros(1, _I64)]
    base = 0
    for b in blocks:
        in_ptr.append(b.in_ptr[1:] + base)
        base += len(b.inp)
    return Transfers(
        src=np.concatenate([b.src for b in blocks]),
        dst=np.concatenate([b.dst for b in blocks]),
        channel=np.concatenate([b.channel for b in blocks]),
        step=np.concatenate([b.step for b in blocks]),
        bytes=np.concatenate([b.bytes for b in blocks]),
        dep_ptr=np.concatenate(dep_ptr),
        dep=np.concatenate([b.dep + o for b, o in zip(blocks, offsets[:-1], strict=True)]),
        steps=max(b.steps for b in blocks) if steps is None else steps,
        stream_steps=np.concatenate([b.stream_steps for b in blocks]),
        stream_offset=np.concatenate([b.stream_offset for b in blocks]),
        stream_loop=np.concatenate([b.stream_loop for b in blocks]),
        in_ptr=np.concatenate(in_ptr),
        inp=np.concatenate([b.inp + o for b, o in zip(blocks, offsets[:-1], strict=True)]),
    )


def streams(
    src, dst, channel, nbytes, stream_steps, offset, in_t, in_d, steps: int, step=None, loop=0
) -> Transfers:
    """Stream rows: row t's steps are released by its inputs (pairs `in_t` waits for `in_d`)."""
    m = len(src)
    in_ptr, inp = csr_from_pairs(m, in_t, in_d)
    return Transfers(
        src=np.asarray(src, dtype=_I32),
        dst=np.asarray(dst, dtype=_I32),
        channel=np.asarray(channel, dtype=_I32),
        step=np.zeros(m, _I32) if step is None else np.asarray(step, dtype=_I32),
        bytes=np.asarray(nbytes, dtype=_I64),
        dep_ptr=np.zeros(m + 1, _I64),
        dep=np.zeros(0, _I64),
        steps=steps,
        stream_steps=np.maximum(np.asarray(stream_steps, dtype=_I32), 1),
        stream_offset=np.broadcast_to(np.asarray(offset, dtype=np.int8), (m,)).copy(),
        stream_loop=np.broadcast_to(np.asarray(loop, dtype=_I32), (m,)).copy(),
        in_ptr=in_ptr,
        inp=inp,
    )


def pieces(nbytes, step_bytes: int):
    """Steps a stream of `nbytes` moves in, at most `step_bytes` each (at least one)."""
    return np.maximum(1, -(-np.asarray(nbytes, dtype=_I64) // max(int(step_bytes), 1)))


def ring(n: int, size: int, channels: int, step_bytes: int, phases: int, shift: int) -> Transfers:
    """A ring of `phases` x (n-1) steps per loop: one stream per edge r -> r+1 and channel.

    At step s rank r sends chunk (r - s - shift) mod n to r+1: phases 2, shift 0 is
    AllReduce (ReduceScatter then AllGather); phases 1 is AllGather (shift 0) or
    ReduceScatter (shift 1). A channel's data runs in loops of n chunks of at most
    `step_bytes`, so an edge makes loops x phases x (n-1) steps. Step k of edge r is
    released once step k-1 of edge r-1 has arrived at r (offset 1); the first step of a
    loop sends the rank's own chunk and needs no input of its loop, so it is released
    with the step before it (the connection sends in order: loops run one after the
    other, each paying its steps' latencies). `aifabric.traffic.nccl.terms` runs rings in
    one loop, as NCCL's cost model charges them.
    """
    if n < 2:
        return empty(0)
    per = phases * (n - 1)
    ch_sizes = parts(size, channels)
    sent = []
    for s in ch_sizes:
        chunk = parts(int(s), n)
        r = np.arange(n, dtype=_I64)
        skipped = np.zeros(n, dtype=_I64)
        for p in range(phases):
            skipped += chunk[(r - shift + p + 1) % n]
        sent.append(phases * int(s) - skipped)
    loops = pieces(ch_sizes, n * step_bytes)
    m = channels * n
    idx = np.arange(m, dtype=_I64)
    c = idx // n
    rank = idx % n
    return streams(
        src=rank,
        dst=(rank + 1) % n,
        channel=c,
        nbytes=np.concatenate(sent),
        stream_steps=loops[c] * per,
        offset=1,
        loop=per,
        in_t=idx,
        in_d=c * n + (rank - 1) % n,
        steps=per,
    )


def chains(lanes: np.ndarray, size: int, channels: int, step_bytes: int) -> Transfers:
    """Pipelined chains: along each lane (a row of ranks) data flows rank to rank.

    Broadcast is one lane starting at the root; pipeline send/recv is one lane per
    position of a stage. Each edge is a stream of pieces of at most `step_bytes`; piece
    k of edge e is released once piece k of edge e-1 has arrived (offset 0).
    """
    lanes = np.asarray(lanes, dtype=_I64)
    n_lanes, length = lanes.shape
    edges = length - 1
    if edges < 1:
        return empty(0)
    ch_sizes = parts(size, channels)
    m = channels * n_lanes * edges
    idx = np.arange(m, dtype=_I64)
    c = idx // (n_lanes * edges)
    lane = (idx // edges) % n_lanes
    e = idx % edges
    k = pieces(ch_sizes, step_bytes)
    later = idx[e > 0]
    return streams(
        src=lanes[lane, e],
        dst=lanes[lane, e + 1],
        channel=c,
        nbytes=ch_sizes[c],
        stream_steps=k[c],
        offset=0,
        in_t=later,
        in_d=later - 1,
        steps=edges + int(k.max()) - 1,
        step=e,
    )


def nccl_btree(n: int) -> np.ndarray:
    """NCCL's binary tree over ranks 0..n-1 (src/graph/trees.cc): each rank's parent, -1 at
    the root (rank 0). A rank's parent clears its lowest set bit and sets the next one up
    (or only clears it, where that would leave the ranks), so odd ranks are the leaves and
    the root has one child, the largest power of two below n."""
    r = np.arange(n, dtype=_I64)
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    up = np.where(up >= n, r ^ bit, up)
    up[0] = -1
    return up


def tree_depth(parent: np.ndarray) -> np.ndarray:
    """Each node's distance from the root of the tree `parent` describes."""
    depth = np.zeros(len(parent), dtype=_I64)
    at = parent.copy()
    while (at >= 0).any():
        live = at >= 0
        depth[live] += 1
        at[live] = parent[at[live]]
    return depth


def double_tree(n: int) -> list[np.ndarray]:
    """NCCL's two trees (ncclGetDtree): the binary tree, and the same tree mirrored (rank r
    in the place of n - 1 - r) when n is even, shifted by one rank when n is odd, so that
    a leaf of one tree is inner in the other. Each as every rank's parent, -1 at the root."""
    first = nccl_btree(n)
    p = np.arange(n, dtype=_I64)
    place = n - 1 - p if n % 2 == 0 else (p + 1) % n  # the rank in place p
    second = np.full(n, -1, dtype=_I64)
    has = first >= 0
    second[place[has]] = place[first[has]]
    return [first, second]


def tree_height(n: int) -> int:
    """Levels from a leaf of NCCL's two trees over n ranks to their root, the deeper tree's:
    log2(n) for a power of two, one more otherwise (NCCL's model charges log2i(n))."""
    return max(int(tree_depth(parent).max()) for parent in double_tree(n)) if n > 1 else 0


def tree(n: int, size: int, channels: int, step_bytes: int) -> Transfers:
    """Double binary tree AllReduce on NCCL's two trees (`double_tree`): each reduces half the
    data up and broadcasts it down. Each edge is a stream per direction, in pieces of at
    most `step_bytes`: piece k goes up once it has arrived from every child, and down from
    the root once it has arrived from the root's children, then down an inner edge once it
    has arrived from above (offset 0)."""
    if n < 2:
        return empty(0)
    trees = double_tree(n)
    depths = [tree_depth(parent) for parent in trees]
    height = int(max(d.max() for d in depths))
    per = n - 1
    blocks = []
    for c, s_c in enumerate(parts(size, channels)):
        for t, half in enumerate(parts(int(s_c), 2)):
            parent, depth = trees[t], depths[t]
            root = int(np.flatnonzero(parent < 0)[0])
            nonroot = np.flatnonzero(parent >= 0)
            pos = np.full(n, -1, dtype=_I64)  # row of rank x's edge within one direction
            pos[nonroot] = np.arange(per)
            root_children = np.flatnonzero(parent == root)
            inner = nonroot[parent[nonroot] != root]
            # rows 0..per-1: up (x -> parent x), rows per..2per-1: down (parent x -> x)
            pt, pd = [], []
            pt.append(pos[parent[inner]])  # up(parent(x)) waits for up(x)
            pd.append(pos[inner])
            rc_t = np.repeat(root_children, len(root_children))
            rc_d = np.tile(root_children, len(root_children))
            pt.append(per + pos[rc_t])
            pd.append(pos[rc_d])
            pt.append(per + pos[inner])
            pd.append(per + pos[parent[inner]])
            k = int(pieces(int(half), step_bytes))
            blocks.append(
                streams(
                    src=np.concatenate([nonroot, parent[nonroot]]),
                    dst=np.concatenate([parent[nonroot], nonroot]),
                    channel=np.full(2 * per, c),
                    nbytes=np.full(2 * per, int(half)),
                    stream_steps=np.full(2 * per, k),
                    offset=0,
                    in_t=np.concatenate(pt),
                    in_d=np.concatenate(pd),
                    steps=2 * height + k - 1,
                    step=np.concatenate([height - depth[nonroot], height + depth[nonroot] - 1]),
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


@dataclass(frozen=True)
class Shape:
    """How a communicator runs an op, besides its ranks and size (the job's keys)."""

    channels: int = 1
    step_bytes: int = 2 * 2**20  # NCCL's chunk: the most one step of a stream moves
    chunk: int = 512 * 2**10  # the message a channel posts (QP split, clear-to-send)
    root: int = 0  # Broadcast
    stages: int = 2  # send/recv

    def pieces(self, nbytes: int) -> int:
        return int(pieces(nbytes, self.step_bytes))

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
        return ring(n, size, shape.channels, shape.step_bytes, self.phases, self.shift)

    def channel_count(self, algorithm, n, size, shape):
        return n

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
            return tree(n, size, shape.channels, shape.step_bytes)
        if algorithm == "halving-doubling":
            return halving_doubling(n, size, shape.channels)
        return super().transfers(algorithm, n, size, shape)

    def channel_count(self, algorithm, n, size, shape):
        if algorithm == "tree":
            return 4 * (n - 1)
        if algorithm == "halving-doubling":
            p = 1 << (n.bit_length() - 1)
            return p * (p.bit_length() - 1) * 2 + 2 * (n - p)
        return super().channel_count(algorithm, n, size, shape)

    def channel_bytes(self, algorithm, n, size, shape, sent, recv):
        if algorithm == "tree":
            for parent, half in zip(double_tree(n), parts(size, 2), strict=True):
                children = np.bincount(parent[parent >= 0], minlength=n)
                mine = int(half) * ((parent >= 0).astype(_I64) + children)
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
            height = tree_height(n)
            g = max(shape.pieces(int(h)) for s in shape.per_channel(size) for h in parts(s, 2))
            return 2 * height + g - 1
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
        return chains(self.lanes(n, shape), size, shape.channels, shape.step_bytes)

    def channel_count(self, algorithm, n, size, shape):
        lanes = self.lanes(n, shape)
        return lanes.shape[0] * (lanes.shape[1] - 1)

    def channel_bytes(self, algorithm, n, size, shape, sent, recv):
        lanes = self.lanes(n, shape)
        np.add.at(sent, lanes[:, :-1].ravel(), size)
        np.add.at(recv, lanes[:, 1:].ravel(), size)

    def steps(self, algorithm, n, size, shape):
        hops = self.lanes(n, shape).shape[1] - 1
        return hops + max(shape.pieces(s) for s in shape.per_channel(size)) - 1


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
    step_bytes: int = 2 * 2**20,
    chunk: int = 512 * 2**10,
    root: int = 0,
    stages: int = 2,
) -> Transfers:
    """One communicator of n ranks running collective `name` with `algorithm`."""
    shape = Shape(channels, step_bytes, chunk, root, stages)
    return kind(name).transfers(algorithm, n, size, shape)


def transfer_count(
    name: str,
    algorithm: str,
    n: int,
    size: int,
    channels: int = 1,
    step_bytes: int = 2 * 2**20,
    chunk: int = 512 * 2**10,
    stages: int = 2,
) -> int:
    """How many rows (streams or transfers) `collective` makes, in closed form."""
    shape = Shape(channels, step_bytes, chunk, 0, stages)
    return kind(name).transfer_count(algorithm, n, size, shape)
