"""NCCL's protocols, latencies and algorithm choice: one overridable table and NCCL's cost model.

Read from NVIDIA/nccl v2.30.7-1 (makefiles/version.mk: 2.30.7; commit 5067397c, the
master merge of 2026-06-11): src/graph/tuning.cc (the tuner's constants,
ncclTopoTuneModel, ncclTopoGetAlgoTime), src/enqueue.cc (topoGetAlgoInfo, the
chunk size, the point-to-point protocol rule), src/init.cc (the default buffer
sizes), src/include/device.h (NCCL_STEPS, the LL and LL128 line formats) and
src/include/collectives.h (chunk steps per collective). The numbers are NCCL's;
the code is written here from them.

`Table` holds, per algorithm (ring, tree) and protocol (ll, ll128, simple):

- `base_latency_us`: NCCL's baseLatencies, paid once per operation;
- `net_latency_us`: NCCL's hwLatencies for NCCL_HW_NET, per step over the network;
- `nvlink_latency_us`: hwLatencies for NCCL_HW_NVLINK, per step inside a server;
- `bandwidth_factor`: the fraction of the NIC's line rate NCCL's model gives the
  algorithm and protocol (its "model refinements", network case, see `DEFAULT`);

and per protocol `wire` (data bytes per wire byte), `buffer_bytes` (the default
buffer per connection) and `steps` (NCCL_STEPS, the buffer's slots). A scenario's
`[nccl]` table and a job's `nccl = {...}` inline table override any subset of it
(`Table.from_dict`); `aifabric calibrate` writes the same keys.

`predict_ns` is NCCL's cost model: latency + bytes / bandwidth, as
ncclTopoTuneModel builds the latencies and bandwidths and ncclTopoGetAlgoTime
combines them. The bandwidth is the NIC's line rate (NCCL's busBw for a
network graph is nChannels x bwInter, which its search makes the NIC's
bandwidth, so channels do not multiply it) times `bandwidth_factor`, turned into
an algorithm bandwidth as NCCL does: nRanks / nsteps for rings (which is
1 / the nccl-tests busbw factor: 2(n-1)/n for AllReduce, (n-1)/n for AllGather and
ReduceScatter, 1 for Broadcast) and 1/2 for the tree (NCCL's own ratio, not
2(n-1)/n). `choose` is NCCL's tuner: the argmin of that time over the
algorithms the collective can run and the three protocols.

What was left out, or which branch was taken, and why:

- The GPU- and CPU-specific caps of the bandwidths (llMaxBw, perChMaxRingLL128Bw,
  perChMaxTreeBw, perChMaxTreeLL128Bw) are not modelled: they describe the GPU,
  not the fabric. Their factors are: ring LL 0.5 (this release; older ones had
  1/3 and 1/4), ring LL128 0.92, tree 0.92 (every tree AllReduce), tree LL a
  further 1/3.8, tree LL128 a further 120/128 (the multi-node branch; 7/9 is the
  single-node one), and no 0.85 for the plain TREE pattern (multi-node search
  builds balanced trees).
- With one rank per node (nodes == ranks, aifabric's flat rings) NCCL charges a
  ring's network steps the tree's network latency; so does `predict_ns`.
- The network post overhead (NCCL_NET_OVERHEAD) is 1 us (x86 Intel and others;
  AMD is 2), 3x for Simple; the net plugin's own latency (latencyInter) is 0, as
  the IB plugin reports it.
- Broadcast charges one step's latency, the branch NCCL takes when its channels
  are the same (its search tries that first).
- The ring Simple AllReduce plateau (latency x 1.4 on sm80 and later when each rank
  and channel carries 64 bytes or more) and the tree correction factors by size
  (`TREE_CORRECTION`) are NCCL's, applied as it does.
- LL128 is taken as enabled (NCCL enables it by default on Hopper and later over
  the paths aifabric models). In 2.30.7 there is no size above which LL or LL128
  are disabled and no tree threshold: the cost model alone decides.

aifabric's algorithms that NCCL does not tune map onto the ring's row of the table:

- `halving-doubling` (AllReduce): the ring's latencies per step over its
  2 log2(p) steps (+2 when n is not a power of two), the ring's bandwidth factor.
  Not NCCL's; `auto` never picks it.
- `pairwise` (AllToAll) and `p2p` (send/recv) are NCCL's point-to-point path,
  which its tuner does not model: base + a network step per exchange (n - 1 steps
  for AllToAll, one per hop of a send/recv chain), the bytes at the ring's
  bandwidth factor. Their protocol is NCCL's point-to-point rule, LL when a peer's
  bytes fit in channels x 16 KiB (NCCL_P2P_LL_THRESHOLD), else Simple; LL128 is
  never used there.
- A kind or algorithm added to `collectives.KINDS` later is predicted like
  `pairwise` (n - 1 network steps, its busbw factor) and `auto` takes the least
  time over its algorithms and the three protocols.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aifabric.fabric.errors import SpecError, cut, shown
from aifabric.traffic.collectives import KINDS, busbw_factor, tree_height

ALGORITHMS = ("ring", "tree")  # the rows of the table (NCCL's)
PROTOCOLS = ("ll", "ll128", "simple")
ROW = {"tree": "tree"}  # the table's row of each algorithm: every other one takes the ring's
TUNED = ("allreduce", "allgather", "reducescatter", "broadcast")  # NCCL's tuner models these
P2P_KINDS = ("alltoall", "sendrecv")  # NCCL's point-to-point path
P2P_LL_THRESHOLD = 16384  # bytes per channel (NCCL_P2P_LL_THRESHOLD)
P2P_NET_CHUNK = 1 << 17  # Simple chunk of a point-to-point op over the network
NET_OVERHEAD_US = 1.0  # per network step, x3 for Simple (getNetOverhead)
RING_PLATEAU = 1.4  # ring Simple AllReduce latency factor, sm80 and later
MAX_LATENCY_US = 1e6  # a latency above 1 s is a mistake, not a measurement
MAX_BUFFER_BYTES = 1 << 30
MAX_STEPS = 64
# tuning.cc's treeCorrectionFactor: tree AllReduce bandwidth by log2(bytes / 64), 0..22
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5,
           0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6,
              0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0, 1.0),
    "simple": (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5,
               0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9, 0.9),
}  # fmt: skip
# collectives.h: chunk steps of a ring Simple op, as a fraction of NCCL_STEPS (others: 1)
CHUNK_STEPS = {"allreduce": 0.5, "allgather": 0.5, "reducescatter": 0.5}

PER_ALGORITHM = ("base_latency_us", "net_latency_us", "nvlink_latency_us", "bandwidth_factor")
PER_PROTOCOL = ("wire", "buffer_bytes")
KEYS = (*PER_ALGORITHM, *PER_PROTOCOL, "steps")


def _grid(ring, tree) -> dict[str, dict[str, float]]:
    return {"ring": dict(zip(PROTOCOLS, ring, strict=True)),
            "tree": dict(zip(PROTOCOLS, tree, strict=True))}  # fmt: skip


@dataclass(frozen=True)
class Table:
    """NCCL's constants, per algorithm x protocol and per protocol (see the module docstring).

    The nested dicts are read-only by convention: `from_dict` and `merged` make new tables."""

    base_latency_us: dict[str, dict[str, float]]
    net_latency_us: dict[str, dict[str, float]]
    nvlink_latency_us: dict[str, dict[str, float]]
    bandwidth_factor: dict[str, dict[str, float]]
    wire: dict[str, float]
    buffer_bytes: dict[str, int]
    steps: int

    def to_dict(self) -> dict:
        """The TOML form: the [nccl] keys, every entry."""
        out = {k: {a: dict(getattr(self, k)[a]) for a in ALGORITHMS} for k in PER_ALGORITHM}
        out.update({k: dict(getattr(self, k)) for k in PER_PROTOCOL})
        out["steps"] = self.steps
        return out

    @classmethod
    def from_dict(cls, d, where: str = "nccl", base: Table | None = None) -> Table:
        """`base` (DEFAULT) with the entries of `d` (any subset of the [nccl] keys) laid over
        it; a bad entry is one SpecError naming it (`where` starts the key's name)."""
        if not isinstance(d, dict):
            raise SpecError(f"{where} = {shown(d)} must be a table of {', '.join(KEYS)}")
        out = (base or DEFAULT).to_dict()
        for key, value in d.items():
            if key not in KEYS:
                raise SpecError(
                    f"{where}.{cut(str(key))} is not a key; {where} takes {', '.join(KEYS)}"
                )
            at = f"{where}.{key}"
            if key == "steps":
                out[key] = _whole(at, value, 2, MAX_STEPS)
            elif key in PER_PROTOCOL:
                for p, x in _entries(at, value, PROTOCOLS).items():
                    out[key][p] = _entry(key, f"{at}.{p}", x)
            else:
                for a, row in _entries(at, value, ALGORITHMS).items():
                    for p, x in _entries(f"{at}.{a}", row, PROTOCOLS).items():
                        out[key][a][p] = _entry(key, f"{at}.{a}.{p}", x)
        for p in PROTOCOLS:
            if out["buffer_bytes"][p] < 128 * out["steps"]:
                raise SpecError(
                    f"{where}.buffer_bytes.{p} = {out['buffer_bytes'][p]} must hold at least one "
                    f"128-byte line per step ({128 * out['steps']} bytes for steps = "
                    f"{out['steps']})"
                )
        return cls(**out)

    def merged(self, d, where: str = "nccl") -> Table:
        """This table with the entries of `d` laid over it (a job's `nccl` over a scenario's)."""
        return Table.from_dict(d or {}, where, base=self) if d else self


def _entries(at: str, value, names: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{at} = {shown(value)} must be a table of {', '.join(names)}")
    for name in value:
        if name not in names:
            raise SpecError(f"{at}.{cut(str(name))} is not a key; {at} takes {', '.join(names)}")
    return value


def _number(at: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{at} = {shown(value)} must be a number")
    if not math.isfinite(value):
        raise SpecError(f"{at} = {shown(value)} must be a finite number")
    return float(value)


def _whole(at: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(f"{at} = {shown(value)} must be a whole number from {low} to {high:,}")
    return value


def _entry(key: str, at: str, value):
    if key == "buffer_bytes":
        return _whole(at, value, 1, MAX_BUFFER_BYTES)
    x = _number(at, value)
    if key.endswith("_latency_us"):
        if not 0 <= x <= MAX_LATENCY_US:
            raise SpecError(f"{at} = {shown(value)} must be a latency from 0 to 1 s (in us)")
    elif not 0 < x <= 1:
        what = "data bytes per wire byte" if key == "wire" else "fraction of the line rate"
        raise SpecError(f"{at} = {shown(value)} must be a {what} above 0 and at most 1")
    return x


_LL_LINE = 16  # union ncclLLFifoLine: 8 data bytes, 8 flag bytes
_LL128_LINE = 128  # NCCL_LL128_LINESIZE: 120 data bytes, one 8-byte flag
DEFAULT = Table(
    base_latency_us=_grid(ring=(6.6, 14.0, 8.4), tree=(6.8, 14.0, 8.4)),
    net_latency_us=_grid(ring=(2.7, 4.0, 14.0), tree=(5.0, 8.5, 14.0)),
    nvlink_latency_us=_grid(ring=(0.6, 1.9, 3.4), tree=(0.6, 1.25, 4.0)),
    bandwidth_factor=_grid(ring=(0.5, 0.92, 1.0), tree=(0.92 / 3.8, 0.92 * 120 / 128, 0.92)),
    wire={"ll": 8 / _LL_LINE, "ll128": 120 / _LL128_LINE, "simple": 1.0},
    buffer_bytes={
        "ll": 8 * 512 * 8 * _LL_LINE,  # lines per thread x threads x NCCL_STEPS x line
        "ll128": 120 * 640 * 8 * 8,  # elements per thread x threads x NCCL_STEPS x 8 bytes
        "simple": 1 << 22,
    },
    steps=8,
)


def chunk_bytes(table: Table, kind: str, algorithm: str, protocol: str) -> int:
    """NCCL's per-step chunk of an op: the buffer's step (buffer / steps) x the chunk steps
    (ring Simple AllReduce, AllGather, ReduceScatter: steps / 2; otherwise 1), of which the
    data (x wire: LL half, LL128 120/128). Point-to-point Simple uses its 128 KiB chunk.
    Before NCCL's reductions of the chunk for small ops."""
    if kind in P2P_KINDS and protocol == "simple":
        return P2P_NET_CHUNK
    step = table.buffer_bytes[protocol] // table.steps
    steps = 1
    if protocol == "simple" and algorithm == "ring" and kind in CHUNK_STEPS:
        steps = max(1, int(table.steps * CHUNK_STEPS[kind]))
    return int(step * steps * table.wire[protocol])


def log2i(x: int) -> int:
    """floor(log2(x)) for x >= 1, -1 for 0 (NCCL's log2i)."""
    return int(x).bit_length() - 1


def predict_ns(
    table: Table,
    kind: str,
    algorithm: str,
    protocol: str,
    ranks: int,
    nodes: int,
    size: int,
    bw_bps: float,
    channels: int = 1,
) -> float:
    """NCCL's cost-model time of one op, in ns: `ranks` in `nodes` servers (nodes = ranks when
    every rank is its own NIC), `size` bytes (nccl-tests convention), NIC line rate `bw_bps`."""
    if ranks < 2:
        return 0.0
    nodes = min(max(nodes, 1), ranks)
    row, p = ROW.get(algorithm, "ring"), protocol
    bus = bw_bps / 8e9 * table.bandwidth_factor[row][p]  # GB/s, NCCL's unit
    base = table.base_latency_us[row][p]
    intra = table.nvlink_latency_us[row][p]
    inter = table.net_latency_us["tree" if ranks == nodes else row][p]
    if algorithm == "tree":
        lat = base + 2 * ((ranks // nodes - 1) * intra + log2i(nodes) * inter)
        bw = bus * 0.5
        i = log2i(size >> 6)
        if 0 <= i < 23:
            bw *= TREE_CORRECTION[p][i]
    elif kind == "broadcast":
        lat = base + (table.net_latency_us[row][p] if nodes > 1 else intra)
        bw = bus
    elif algorithm == "ring":
        twice = kind == "allreduce"
        nsteps = (2 if twice else 1) * (ranks - 1)
        n_inter = 0 if nodes == 1 else (2 if twice else 1) * (nodes - 1)
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if p == "simple" else 1))
        lat = base + (nsteps - n_inter) * intra + n_inter * inter
        if twice and p == "simple" and nodes > 1 and size // (channels * ranks) >= 64:
            lat *= RING_PLATEAU
        bw = bus / busbw_factor(kind, ranks)
    else:
        if algorithm == "halving-doubling":
            p2 = 1 << (ranks.bit_length() - 1)
            nsteps = 2 * log2i(p2) + (2 if ranks > p2 else 0)
        else:  # pairwise: n - 1 exchanges; p2p: one per hop of the chain; a new algorithm
            nsteps = ranks - 1
        lat = base + nsteps * inter
        bw = bus / busbw_factor(kind, ranks)
    return (lat + size / (1000 * bw)) * 1000


def rail_bytes(kind: str, size: int, per_server: int) -> int:
    """The bytes of the largest rail's op of a hierarchical op of `size` bytes over servers of
    `per_server` GPUs (`generate.collective_instances`: 1/g of the data each, or all of it)."""
    return -(-size // per_server) if KINDS[kind].rails_split else size


def nvlink_steps(kind: str, per_server: int) -> int:
    """The steps a hierarchical op takes inside each server, on NVLink, beside its rails' op:
    an AllReduce reduce-scatters before and all-gathers after (2(g-1), NCCL's ring over g
    GPUs in one server), AllGather and ReduceScatter one of those passes (g-1), Broadcast
    and AllToAll (PXN's hop to the GPU on the destination's rail) one step, send/recv none."""
    g = per_server
    if g < 2 or kind == "sendrecv":
        return 0
    if kind in ("broadcast", "alltoall"):
        return 1
    return (2 if kind == "allreduce" else 1) * (g - 1)


def hierarchical_ns(
    table: Table,
    kind: str,
    algorithm: str,
    protocol: str,
    servers: int,
    per_server: int,
    size: int,
    bw_bps: float,
    channels: int = 1,
) -> float:
    """A hierarchical op's time, in ns, as it runs: NCCL's model of a rail's op (one rank per
    server, every step over the network, `rail_bytes`; the rails run at once, each on its own
    NICs) plus its `nvlink_steps`' latency inside the servers. Not NCCL's flat ring over every
    GPU, which NCCL has instead (2(n-1) steps, the servers' NICs together): that is another
    algorithm. NVLink's bandwidth, far above a NIC's and not in the fabric, is left out."""
    part = rail_bytes(kind, size, per_server)
    t = predict_ns(table, kind, algorithm, protocol, servers, servers, part, bw_bps, channels)
    lat_us = table.nvlink_latency_us[ROW.get(algorithm, "ring")][protocol]
    return t + nvlink_steps(kind, per_server) * lat_us * 1000


def p2p_protocol(kind: str, ranks: int, size: int, channels: int = 1) -> str:
    """NCCL's point-to-point protocol: LL when a peer's bytes fit in channels x 16 KiB."""
    peer = -(-size // ranks) if kind == "alltoall" else size
    return "ll" if peer <= channels * P2P_LL_THRESHOLD else "simple"


def choose(
    table: Table,
    kind: str,
    ranks: int,
    nodes: int,
    size: int,
    bw_bps: float,
    channels: int = 1,
    algorithms: tuple[str, ...] | None = None,
    protocols: tuple[str, ...] | None = None,
    per_server: int = 1,
) -> tuple[str, str, float]:
    """(algorithm, protocol, predicted ns) as NCCL's tuner picks them: the least
    `predict_ns` (with `per_server` GPUs of a hierarchical op in each of `ranks` servers,
    `hierarchical_ns`) over the algorithms the kind can run that NCCL tunes (tree only for
    AllReduce) and the three protocols, ties to NCCL's order (tree before ring; LL, LL128,
    Simple); for a kind NCCL does not tune, over its algorithms. `algorithms` /
    `protocols` restrict the search (NCCL_ALGO, NCCL_PROTO).
    Point-to-point kinds take their one algorithm and NCCL's point-to-point protocol rule."""

    def predict(a: str, p: str) -> float:
        if per_server > 1:
            return hierarchical_ns(table, kind, a, p, ranks, per_server, size, bw_bps, channels)
        return predict_ns(table, kind, a, p, ranks, nodes, size, bw_bps, channels)

    options = KINDS[kind].algorithms
    if kind in P2P_KINDS:
        algorithm = (algorithms or options)[0]
        part = rail_bytes(kind, size, per_server)
        protocol = protocols[0] if protocols else p2p_protocol(kind, ranks, part, channels)
        return algorithm, protocol, predict(algorithm, protocol)
    # NCCL_ALGO_TREE = 0, RING = 1; a kind NCCL does not tune: any of its algorithms
    tuned = [a for a in ("tree", "ring") if a in options] if kind in TUNED else list(options)
    best = None
    for a in sorted(algorithms or tuned, key=lambda a: tuned.index(a) if a in tuned else 99):
        for p in protocols or PROTOCOLS:
            t = predict(a, p)
            if best is None or t < best[2]:
                best = (a, p, t)
    return best


@dataclass(frozen=True)
class Choice:
    """How an op runs: its algorithm and protocol, and NCCL's predicted time (ns)."""

    algorithm: str
    protocol: str
    predicted_ns: int


def nic_rate_bps(fabric, nics) -> float:
    """The line rate of the communicator's NIC links (the slowest, if they differ)."""
    nics = np.asarray(nics, dtype=np.int64).ravel()
    return float(fabric.port_rate_bps[fabric.nic_port[nics]].min())


def resolve(
    table: Table,
    fabric,
    kind: str,
    algorithm: str,
    protocol: str,
    ranks: int,
    nodes: int,
    size: int,
    channels: int = 1,
    nics=None,
    per_server: int = 1,
) -> Choice:
    """A job's (kind, algorithm, protocol), either of them "auto", as the concrete choice for
    one op of `ranks` ranks in `nodes` servers over the NICs `nics` of `fabric` (a
    hierarchical op: `ranks` servers of `per_server` GPUs, `choose`)."""
    bw = nic_rate_bps(fabric, nics)
    a, p, t = choose(
        table, kind, ranks, nodes, size, bw, channels,
        algorithms=None if algorithm == "auto" else (algorithm,),
        protocols=None if protocol == "auto" else (protocol,), per_server=per_server,
    )  # fmt: skip
    return Choice(a, p, int(round(t)))


def job_choice(table: Table, fabric, job, nics, servers: int) -> Choice:
    """A collective job's `resolve`d choice: flat, every rank its own NIC (each step crosses
    the network, nodes = ranks); with `hierarchical`, the rails' op over its `servers` and
    the steps inside them (`hierarchical_ns`); a send/recv chain, its `stages`."""
    kind = job["collective"]
    ranks = nodes = len(nics)
    per_server = 1
    if kind == "sendrecv":
        ranks = nodes = job["stages"]
    elif job["hierarchical"]:
        ranks = nodes = servers
        per_server = len(nics) // servers
    return resolve(
        table.merged(job["nccl"]), fabric, kind, job["algorithm"], job["protocol"], ranks, nodes,
        job["size"], job["channels"], nics, per_server,
    )  # fmt: skip


def refuse(kind: str, algorithm: str, protocol: str) -> str | None:
    """Why a job cannot run `kind` with this algorithm and protocol (None: it can)."""
    options = KINDS[kind].algorithms
    if algorithm != "auto" and algorithm not in options:
        takes = ", ".join(("auto", *options))
        return f"algorithm = {shown(algorithm)} does not run {kind}; it takes {takes}"
    if protocol == "ll128" and kind in P2P_KINDS:
        return (
            f'protocol = "ll128" does not run {kind}: NCCL sends point to point with ll or simple'
        )
    return None


LINE_PIECE_BYTES = 4096  # a tree's LL / LL128 piece: NCCL forwards each line as it lands


@dataclass(frozen=True)
class Terms:
    """How the simulator runs one op so that, on an idle fabric, it takes `predict_ns`: the
    most one step of a stream moves (NCCL's chunk), the latency from the arrival of a step's
    input to the release of the step, the latency before the op's first step, and each QP's
    rate cap over its NIC's line rate (the protocol's bandwidth factor: LL's and LL128's
    flags are in it, the wire carries the data bytes), and each connection's buffer in data
    bytes, which a tree's sender may not run ahead of its receiver by (0: unbounded)."""

    step_bytes: int
    step_latency_ns: int
    base_latency_ns: int
    rate_factor: float
    buffer_bytes: int = 0


def tree_step_bytes(size: int, channels: int, depth: int, step: int) -> int:
    """NCCL's tree chunk (enqueue.cc): halved while the op has too few chunks per channel to
    fill the tree's pipeline (8, 4 and 1 per level, down to 128, 64 and 32 KiB)."""
    for per_level, floor in ((8, 128 * 2**10), (4, 64 * 2**10), (1, 32 * 2**10)):
        while size // (channels * step) < depth * per_level and step > floor:
            step //= 2
    return step


def terms(
    table: Table,
    kind: str,
    algorithm: str,
    protocol: str,
    ranks: int,
    size: int,
    channels: int = 1,
    nvlink_steps: int = 0,
) -> Terms:
    """`Terms` of an op over `ranks` ranks, each its own NIC (every step crosses the network),
    read off `predict_ns`'s terms: its per-step network latency (with the ring Simple
    AllReduce plateau), its base latency, its bandwidth factor (with the tree's size
    correction; the simulator shares it among the op's flows from one NIC). A chain of
    dependent steps then costs what the model charges: 2(n-1) ring steps, 2 log2i(n) tree
    latencies, n - 1 pairwise exchanges, one step per hop of a chain (a Broadcast's one step
    of latency is its base). A ring runs in one loop of steps of size / (n x channels):
    NCCL runs loops of at most its chunk on each channel, one after the other, and its
    several channels hide one loop's latency behind the others' transfers, which is what
    its model's single latency term assumes. A hierarchical op's rail (`hierarchical_ns`)
    adds its `nvlink_steps`' latency to the base: they move nothing over the fabric.
    No protocol (""): no latency, no cap."""
    if protocol not in PROTOCOLS or ranks < 2:
        return Terms(2 * 2**20, 0, 0, 1.0)
    row, p = ROW.get(algorithm, "ring"), protocol
    base = table.base_latency_us[row][p]
    step_us = table.net_latency_us["tree"][p] if ranks > 1 else 0.0  # nodes == ranks
    factor = table.bandwidth_factor[row][p]
    if algorithm == "tree":
        i = log2i(size >> 6)
        if 0 <= i < 23:
            factor *= TREE_CORRECTION[p][i]
        # the model's 2 log2i(n) network latencies over the tree's 2 x height levels (one
        # more each way when n is not a power of two)
        step_us *= log2i(ranks) / tree_height(ranks)
    elif (
        algorithm == "ring"
        and kind == "allreduce"
        and p == "simple"
        and size // (channels * ranks) >= 64
    ):
        base *= RING_PLATEAU
        step_us *= RING_PLATEAU
    if kind == "broadcast" and algorithm == "ring":
        base += step_us  # NCCL charges a Broadcast one step, not one per hop
        step_us = 0.0
    base += nvlink_steps * table.nvlink_latency_us[row][p]
    step = chunk_bytes(table, kind, algorithm, p)
    if algorithm == "tree" and p == "simple":
        step = tree_step_bytes(size, channels, log2i(ranks) + 1, step)
    elif algorithm == "tree":
        step = min(step, LINE_PIECE_BYTES)  # LL and LL128 forward line by line
    if algorithm == "ring" and kind in ("allreduce", "allgather", "reducescatter"):
        # one loop: NCCL's channels hide a loop's latency behind each other's transfers,
        # and its model charges a ring's step latencies once per op
        step = max(step, -(-size // (ranks * max(channels, 1))))
    return Terms(
        step_bytes=max(int(step), 1),
        step_latency_ns=int(round(step_us * 1000)),
        base_latency_ns=int(round(base * 1000)),
        rate_factor=min(1.0, factor),
        # a tree's connections hold NCCL's buffer: a sender whose input is always there (a
        # leaf) would otherwise take its NIC's rate from the tree its receiver waits in
        buffer_bytes=int(table.buffer_bytes[p] * table.wire[p]) if algorithm == "tree" else 0,
    )
