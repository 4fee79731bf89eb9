"""From a checked workload to a `FlowTable`: placement, operations, QP expansion, QPNs.

Every job is placed first (jobs never share a NIC), then its operations are
issued in order. An operation is one collective run by one or more disjoint
communicators at once (e.g. the gradient AllReduce of every data-parallel
group of a pipeline stage). Operations of one job are ordered per NIC: the
first flows of an operation from or to a NIC wait for the last flows of the
previous operation that touched that NIC (rank-local, as a CUDA stream
orders NCCL calls).

QP scaling turns each transfer into `qps` flows on the same NIC pair:

- `split`: every message (chunk) is cut across the QPs, each QP carries
  its share of every message (messages of chunk/qps bytes);
- `round-robin`: whole messages go to QP 0, 1, 2, ... in turn, numbered
  per connection across the operation's step groups.

A flow waits for every QP's flow of each transfer its transfer waits for.
QPNs are 24-bit, allocated per NIC as drivers do (`allocate_qpns`): counting
up from a seeded base, one per QP in the order they are created (a QP is
created at both ends when its connection's first flow is issued, so the QPs
of a connection get consecutive numbers at each end). A connection (job,
src, dst, channel, QP) keeps its QPs across operations. Its UDP source port
follows the `sport` rule (`udp_sports`; `random` draws after the bases).

Two seeds: `seed` draws placement and the random patterns (partners, sizes,
arrival times); `qpn_seed` draws the QPN bases from a generator of its own.
Without `qpn_seed` the bases are drawn from the placement generator once the
jobs are placed (so they follow `seed`, as before the seeds were separated).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from aifabric.fabric.addressing import DEFAULT_SPORT, SPORT_RULES, allocate_qpns, udp_sports
from aifabric.fabric.errors import SpecError, shown
from aifabric.fabric.model import Fabric
from aifabric.fabric.scenario import job_names
from aifabric.traffic import collectives as coll
from aifabric.traffic import nccl
from aifabric.traffic.flows import FlowTable
from aifabric.traffic.placement import place, server_keys
from aifabric.traffic.scheduler import Placed, schedule
from aifabric.traffic.spec import COMMON, Job, Workload

_I32 = np.int32
_I64 = np.int64
MAX_FLOWS = 50_000_000


class TooManyFlows(SpecError):
    """A workload whose flow table would not fit (`aifabric.traffic.summary.describe` can still
    describe a single collective in closed form)."""


@dataclass
class Op:
    """One operation in NIC terms, before QP expansion."""

    kind: str
    algorithm: str
    size: int  # bytes per communicator (nccl-tests convention)
    ranks: int  # ranks per communicator
    groups: int  # communicators running it at once
    steps: int
    tr: coll.Transfers  # src/dst already NIC node ids
    start_ns: np.ndarray | None = None  # per transfer (patterns); None: the job's start
    hierarchical: bool = False
    protocol: str = ""  # NCCL protocol (aifabric.traffic.nccl), "" for patterns and matrices
    predicted_ns: int = 0  # NCCL's cost-model time of the op
    step_latency_ns: int = 0  # from an arrival to the release of the step it feeds
    base_latency_ns: int = 0  # before the op's first step
    rate_factor: float = 1.0  # each QP's rate cap, as a fraction of its NIC's line rate
    ready_ns: int = 0  # the compute it waits for, from the job's start (traffic.training)
    compute_ns: int = 0  # its job's compute-only iteration time; 0: no compute modelled
    buffer_bytes: int = 0  # each connection's buffer (data bytes), 0: unbounded


def map_groups(tr: coll.Transfers, nic_groups: np.ndarray) -> coll.Transfers:
    """The same transfers run by every row of `nic_groups` (ranks -> NIC ids)."""
    nic_groups = np.asarray(nic_groups, dtype=_I64)
    g = len(nic_groups)
    m = len(tr)
    gi = np.repeat(np.arange(g, dtype=_I64), m)
    src = nic_groups[gi, np.tile(tr.src, g)]
    dst = nic_groups[gi, np.tile(tr.dst, g)]
    nd = len(tr.dep)
    dep_ptr = np.concatenate([[0], (tr.dep_ptr[1:][None, :] + nd * np.arange(g)[:, None]).ravel()])
    dep = (tr.dep[None, :] + m * np.arange(g)[:, None]).ravel()
    ni = len(tr.inp)
    in_ptr = np.concatenate([[0], (tr.in_ptr[1:][None, :] + ni * np.arange(g)[:, None]).ravel()])
    inp = (tr.inp[None, :] + m * np.arange(g)[:, None]).ravel()
    return coll.Transfers(
        src=src.astype(_I32),
        dst=dst.astype(_I32),
        channel=np.tile(tr.channel, g),
        step=np.tile(tr.step, g),
        bytes=np.tile(tr.bytes, g),
        dep_ptr=dep_ptr.astype(_I64),
        dep=dep.astype(_I64),
        steps=tr.steps,
        stream_steps=np.tile(tr.stream_steps, g),
        stream_offset=np.tile(tr.stream_offset, g),
        stream_loop=np.tile(tr.stream_loop, g),
        in_ptr=in_ptr.astype(_I64),
        inp=inp.astype(_I64),
    )


def ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """concatenate(arange(s, s + l) for s, l in zip(starts, lengths)), without a loop."""
    lengths = np.asarray(lengths, dtype=_I64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=_I64)
    ends = np.cumsum(lengths)
    offsets = np.repeat(np.asarray(starts, dtype=_I64) - (ends - lengths), lengths)
    return offsets + np.arange(total, dtype=_I64)


def share(x: np.ndarray, q: np.ndarray, qps: int) -> np.ndarray:
    """QP q's part of x bytes cut in qps floor/ceil pieces."""
    return (x * (q + 1)) // qps - (x * q) // qps


def qp_bytes(x, q, qps: int, mode: str, chunk: int):
    """Bytes QP q of `qps` carries of the first x bytes of a stream: `split` cuts every byte
    range in floor/ceil shares, `round-robin` deals whole messages of `chunk` bytes to QP
    0, 1, 2, ... in turn. The simulator's kernel computes the same (`sim.kernel.qp_bytes`)."""
    x = np.asarray(x, dtype=_I64)
    q = np.asarray(q, dtype=_I64)
    if qps == 1:
        return x + 0 * q
    if mode == "split":
        return share(x, q, qps)
    full, rem = x // chunk, x % chunk
    count = np.maximum(0, (full - q + qps - 1) // qps)
    return count * chunk + np.where(full % qps == q, rem, 0)


def expand_streams(tr: coll.Transfers, qps: int, mode: str, chunk: int):
    """Stream rows -> flows (stream, qp, bytes, msg_bytes); flow t*qps + q is QP q of row t."""
    m = len(tr)
    t = np.repeat(np.arange(m, dtype=_I64), qps)
    q = np.tile(np.arange(qps, dtype=_I64), m)
    nbytes = qp_bytes(tr.bytes[t], q, qps, mode, chunk)
    if qps == 1 or mode != "split":
        msg = np.full(len(t), chunk, dtype=_I64)
    else:
        msg = np.maximum(share(np.int64(chunk), q, qps), 1)
    return t, q, nbytes, msg


def expand_qps(
    tr: coll.Transfers, qps: int, mode: str, chunk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Transfers -> flows (transfer, qp, bytes, msg_bytes, dep_ptr, dep); flow t*qps + q."""
    m = len(tr)
    t = np.repeat(np.arange(m, dtype=_I64), qps)
    q = np.tile(np.arange(qps, dtype=_I64), m)
    b = tr.bytes[t]
    if qps == 1:
        return t, q, b.copy(), np.full(m, chunk, dtype=_I64), tr.dep_ptr, tr.dep
    full = b // chunk
    rem = b % chunk
    if mode == "split":
        nbytes = full * share(np.int64(chunk), q, qps) + share(rem, q, qps)
        msg = np.maximum(share(np.int64(chunk), q, qps), 1)
    else:
        nmsg = -(-tr.bytes // chunk)
        key = (tr.src.astype(_I64) << 28) | (tr.dst.astype(_I64) << 7) | tr.channel
        order = np.argsort(key, kind="stable")
        ks = key[order]
        csum = np.cumsum(nmsg[order])
        first = np.ones(m, dtype=bool)
        first[1:] = ks[1:] != ks[:-1]
        group_start = np.maximum.accumulate(np.where(first, np.arange(m), 0))
        before = csum - nmsg[order]
        offset = np.empty(m, dtype=_I64)
        offset[order] = before - before[group_start]
        o = offset[t]
        r = (q - o) % qps
        count = np.maximum(0, (full - r + qps - 1) // qps)
        last = (rem > 0) & ((o + full) % qps == q)
        nbytes = count * chunk + np.where(last, rem, 0)
        msg = np.full(len(t), chunk, dtype=_I64)
    deg = np.diff(tr.dep_ptr)
    lengths = np.repeat(deg * qps, qps)
    dep_ptr = np.zeros(len(t) + 1, dtype=_I64)
    np.cumsum(lengths, out=dep_ptr[1:])
    expanded = (tr.dep[:, None] * qps + np.arange(qps)[None, :]).ravel()
    dep = expanded[ragged_arange(np.repeat(tr.dep_ptr[:-1] * qps, qps), lengths)]
    return t, q, nbytes, msg, dep_ptr, dep


@dataclass
class _Table:
    """Flow columns collected op by op."""

    cols: dict[str, list] = field(default_factory=dict)
    dep_ptr: list = field(default_factory=list)
    dep: list = field(default_factory=list)
    ops: dict[str, list] = field(default_factory=dict)
    groups: dict[str, list] = field(default_factory=dict)  # streams: group_* columns
    n: int = 0
    n_dep: int = 0
    n_groups: int = 0
    n_in: int = 0

    def add(self, name, value):
        self.cols.setdefault(name, []).append(value)

    def op(self, **values):
        for k, v in values.items():
            self.ops.setdefault(k, []).append(v)


class _Builder:
    def __init__(
        self, fabric: Fabric, seed: int, qpn_seed: int | None = None, sport: str = DEFAULT_SPORT
    ):
        self.fabric = fabric
        self.sport = sport
        self.rng = np.random.default_rng(seed)
        self.qpn_rng = self.rng if qpn_seed is None else np.random.default_rng(qpn_seed)
        self.table = _Table()
        self.taken = np.zeros(fabric.n_nodes, dtype=bool)
        self.n_ops = 0
        # per NIC: the last op that touched it (an index into sinks); per op: its last
        # flows at each NIC, sorted by NIC. Kept across jobs: a job the scheduler gives
        # GPUs another held waits at each of them for the other's last flows there.
        self.last_of = np.full(fabric.n_nodes, -1, dtype=_I64)
        self.sinks: list[tuple[np.ndarray, np.ndarray]] = []

    def add_ops(self, job_index: int, job: Job, ops: list[Op]):
        last_of, sinks = self.last_of, self.sinks
        for op in ops:
            tr = op.tr
            group = None
            if tr.streams:
                t, q, nbytes, msg = expand_streams(tr, job["qps"], job["qp_mode"], job["chunk"])
                dep_ptr, dep = np.zeros(len(t) + 1, _I64), np.zeros(0, _I64)
                group = self.table.n_groups + t
            else:
                t, q, nbytes, msg, dep_ptr, dep = expand_qps(
                    tr, job["qps"], job["qp_mode"], job["chunk"]
                )
            nf = len(t)
            if self.table.n + nf > MAX_FLOWS:
                raise TooManyFlows(
                    f"the workload makes more than {MAX_FLOWS:,} flows "
                    f"({op.kind} over {op.ranks} ranks adds {nf:,}); use fewer GPUs, "
                    "fewer channels or QPs, or hierarchical = true"
                )
            base = self.table.n
            src = tr.src[t]
            dst = tr.dst[t]
            # local pairs (flow pt waits for flow pd) and each flow's first/last role per NIC
            pt = np.repeat(np.arange(nf, dtype=_I64), np.diff(dep_ptr))
            pd = dep
            head_src = np.ones(nf, dtype=bool)
            head_dst = np.ones(nf, dtype=bool)
            head_src[pt[(src[pt] == src[pd]) | (src[pt] == dst[pd])]] = False
            head_dst[pt[(dst[pt] == src[pd]) | (dst[pt] == dst[pd])]] = False
            cross_t, cross_d = [], []
            for end, first in ((src, head_src), (dst, head_dst)):
                mine_all = np.flatnonzero(first)
                prev = last_of[end[mine_all]]
                for p in np.unique(prev[prev >= 0]):
                    s_nic, s_flow = sinks[p]
                    mine = mine_all[prev == p]
                    lo = np.searchsorted(s_nic, end[mine], "left")
                    hi = np.searchsorted(s_nic, end[mine], "right")
                    cross_t.append(np.repeat(mine, hi - lo))
                    cross_d.append(s_flow[ragged_arange(lo, hi - lo)] - base)
            if sum(len(x) for x in cross_t):
                dep_ptr, dep = coll.csr_from_pairs(
                    nf, np.concatenate([pt, *cross_t]), np.concatenate([pd, *cross_d])
                )
            # this op's last flows at each NIC: flows touching it that no later flow
            # touching the same NIC waits for
            tail_src = np.ones(nf, dtype=bool)
            tail_dst = np.ones(nf, dtype=bool)
            tail_src[pd[(src[pd] == src[pt]) | (src[pd] == dst[pt])]] = False
            tail_dst[pd[(dst[pd] == src[pt]) | (dst[pd] == dst[pt])]] = False
            f_src = np.flatnonzero(tail_src)
            f_dst = np.flatnonzero(tail_dst)
            s_nic = np.concatenate([src[f_src], dst[f_dst]]).astype(_I64)
            s_flow = np.concatenate([f_src, f_dst]) + base
            order = np.argsort(s_nic, kind="stable")
            sinks.append((s_nic[order], s_flow[order]))
            touched = np.unique(np.concatenate([src, dst]))
            last_of[touched] = len(sinks) - 1

            tb = self.table
            op_id = self.n_ops
            tb.add("job", np.full(nf, job_index, dtype=_I32))
            tb.add("op", np.full(nf, op_id, dtype=_I32))
            tb.add("step", tr.step[t])
            tb.add("channel", tr.channel[t])
            tb.add("qp", q.astype(_I32))
            tb.add("src", src)
            tb.add("dst", dst)
            tb.add("bytes", nbytes)
            tb.add("msg_bytes", msg)
            tb.add("priority", np.full(nf, job["priority"], dtype=np.int8))
            start = job["start"] + op.ready_ns + (op.start_ns[t] if op.start_ns is not None else 0)
            tb.add("start_ns", np.broadcast_to(np.asarray(start, dtype=_I64), (nf,)))
            tb.add("group", np.full(nf, -1, dtype=_I64) if group is None else group)
            if group is not None:
                tb.groups.setdefault("group_steps", []).append(tr.stream_steps)
                tb.groups.setdefault("group_bytes", []).append(tr.bytes)
                tb.groups.setdefault("group_offset", []).append(tr.stream_offset)
                tb.groups.setdefault("group_loop", []).append(tr.stream_loop)
                tb.groups.setdefault("group_in_ptr", []).append(tr.in_ptr[1:] + tb.n_in)
                tb.groups.setdefault("group_in", []).append(tr.inp + tb.n_groups)
                tb.n_groups += len(tr)
                tb.n_in += len(tr.inp)
            tb.dep_ptr.append(dep_ptr[1:] + tb.n_dep)
            tb.dep.append(dep + base)
            tb.n += nf
            tb.n_dep += len(dep)
            tb.op(
                op_id=op_id,
                op_job=job_index,
                op_kind=op.kind,
                op_algorithm=op.algorithm + ("/hier" if op.hierarchical else ""),
                op_bytes=op.size,
                op_ranks=op.ranks,
                op_busbw_factor=coll.busbw_factor(op.kind, op.ranks),
                op_groups=op.groups,
                op_steps=op.steps,
                op_channels=job["channels"],
                op_qps=job["qps"],
                op_qp_mode=job["qp_mode"],
                op_chunk_bytes=job["chunk"],
                op_window=job["window"],
                op_protocol=op.protocol,
                op_step_latency_ns=op.step_latency_ns,
                op_base_latency_ns=op.base_latency_ns,
                op_predicted_ns=op.predicted_ns,
                op_rate_factor=op.rate_factor,
                op_ready_ns=op.ready_ns,
                op_compute_ns=op.compute_ns,
                op_buffer_bytes=op.buffer_bytes,
            )
            self.n_ops += 1

    def finish(self) -> FlowTable:
        tb = self.table
        cols = {k: np.concatenate(v) if v else np.zeros(0) for k, v in tb.cols.items()}
        n = tb.n
        if n == 0:
            cols = {k: np.zeros(0, dtype=_I64) for k in ("src", "dst")}
            return FlowTable.build(cols, (np.zeros(1, _I64), np.zeros(0, _I64)), tb.ops)
        cols["sqpn"], cols["dqpn"], cols["sport"] = self._qpns(cols)
        del cols["qp"]  # the QP index lives on in sqpn/dqpn
        dep_ptr = np.concatenate([np.zeros(1, _I64), *tb.dep_ptr])
        dep = np.concatenate(tb.dep) if tb.dep else np.zeros(0, _I64)
        groups = {k: np.concatenate(v) for k, v in tb.groups.items()}
        if groups:
            groups["group_in_ptr"] = np.concatenate([np.zeros(1, _I64), groups["group_in_ptr"]])
        return FlowTable.build(cols, (dep_ptr, dep), tb.ops, groups)

    def _qpns(self, cols) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per flow: its QP's sQPN, dQPN and UDP source port. A QP is created when its
        connection's first flow is issued, at both ends (`allocate_qpns`)."""
        key = (
            (cols["job"].astype(_I64) << 56)
            | (cols["src"].astype(_I64) << 35)
            | (cols["dst"].astype(_I64) << 14)
            | (cols["channel"].astype(_I64) << 8)
            | cols["qp"].astype(_I64)
        )
        conns, first, conn_of = np.unique(key, return_index=True, return_inverse=True)
        created = np.argsort(first, kind="stable")
        c_src = (conns[created] >> 35) & ((1 << 21) - 1)
        c_dst = (conns[created] >> 14) & ((1 << 21) - 1)
        sqpn, dqpn = allocate_qpns(c_src, c_dst, self.fabric.n_nodes, self.qpn_rng)
        sport = udp_sports(sqpn, dqpn, self.sport, self.qpn_rng)
        rank = np.empty(len(conns), dtype=_I64)
        rank[created] = np.arange(len(conns))
        at = rank[conn_of]
        return sqpn[at].astype(_I32), dqpn[at].astype(_I32), sport[at].astype(_I32)


def generate(
    fabric: Fabric,
    workload: Workload,
    seed: int = 0,
    *,
    qpn_seed: int | None = None,
    sport: str = DEFAULT_SPORT,
) -> FlowTable:
    """The flows of `workload` on `fabric`: place every job (drawing from `seed`), issue its
    operations, number the QPs (drawing from `qpn_seed`; by default after placement) and
    give each its UDP source port by the rule `sport` (`aifabric.fabric.addressing`)."""
    return generate_scheduled(fabric, workload, seed, qpn_seed=qpn_seed, sport=sport)[0]


def generate_scheduled(
    fabric: Fabric,
    workload: Workload,
    seed: int = 0,
    *,
    qpn_seed: int | None = None,
    sport: str = DEFAULT_SPORT,
) -> tuple[FlowTable, list[Placed]]:
    """`generate`, and the schedule of a workload with a scheduler (empty without one): its
    jobs placed as they arrive (`aifabric.traffic.scheduler`), each job's flows starting
    when the scheduler starts it."""
    if sport not in SPORT_RULES:
        raise SpecError(f"sport = {shown(sport)} is not one of {', '.join(SPORT_RULES)}")
    if len(workload.jobs) > 127:
        raise SpecError(f"workload {workload.name} has {len(workload.jobs)} jobs; at most 127")
    if fabric.n_nodes >= 1 << 21:
        raise SpecError(f"fabric {fabric.name} has too many nodes for a flow table")
    table = _flow_table_file(fabric, workload)
    if table is not None:
        return table, []
    b = _Builder(fabric, seed, qpn_seed, sport)
    if workload.scheduler:
        return _scheduled(b, workload)
    # matrix jobs hold the NICs their files name; the other jobs are placed around them
    ops: dict[int, list[Op]] = {}
    for j, job in enumerate(workload.jobs):
        if job.kind == "matrix":
            ops[j] = [_matrix_op(fabric, job, b.taken, workload.name)]
    placed = {
        j: place(fabric, _gpus_wanted(job), job["placement"], b.rng, b.taken)
        for j, job in enumerate(workload.jobs)
        if j not in ops
    }
    for j, job in enumerate(workload.jobs):
        if j not in ops:
            ops[j] = job_ops(fabric, job, placed[j], b.rng, f"{workload.name}", workload.nccl_table)
        b.add_ops(j, job, ops[j])
    return b.finish(), []


def _scheduled(b: _Builder, workload: Workload) -> tuple[FlowTable, list[Placed]]:
    """The jobs placed by the workload's scheduler as they arrive (Poisson arrivals drawn
    from the placement generator when `interarrival` is set), each held for its `duration`
    or, without one, its NCCL cost-model time (plus its compute)."""
    fabric, jobs = b.fabric, workload.jobs
    names = job_names(workload.raw)
    if workload.interarrival_ns:
        gaps = b.rng.exponential(workload.interarrival_ns, len(jobs))
        arrivals = np.cumsum(gaps).astype(_I64).tolist()
    else:
        arrivals = [job["arrival"] for job in jobs]
    sizes = [_gpus_wanted(job) or len(fabric.nic_ids) for job in jobs]
    ops: dict[int, list[Op]] = {}

    def hold(j: int, nics: np.ndarray) -> int:
        ops[j] = job_ops(fabric, jobs[j], nics, b.rng, workload.name, workload.nccl_table)
        planned = jobs[j]["duration"] or (
            sum(op.predicted_ns for op in ops[j]) + max((op.compute_ns for op in ops[j]), default=0)
        )
        if not planned:
            raise SpecError(
                f"workload {workload.name}: {names[j]} has no NCCL cost-model time; give it "
                "duration, how long it holds its GPUs"
            )
        return planned

    placed = schedule(fabric, sizes, arrivals, workload.scheduler, hold, names)
    for p in placed:
        started = Job(jobs[p.job].kind, {**jobs[p.job].values, "start": p.start_ns})
        b.add_ops(p.job, started, ops[p.job])
    return b.finish(), placed


def _flow_table_file(fabric: Fabric, workload: Workload) -> FlowTable | None:
    """The table of a workload that is one saved flow table (.npz), used as it is."""
    from aifabric.traffic.matrix import file_format, load_flow_table

    files = [j for j in workload.jobs if j.kind == "matrix" and file_format(j["matrix"]) == "npz"]
    if not files:
        return None
    if len(workload.jobs) > 1:
        raise SpecError(
            f"workload {workload.name}: the flow table {files[0]['matrix']} is a whole "
            "workload; run it alone, or give the other jobs' flows as CSV or htsim"
        )
    given = {k: v for k, v in files[0].values.items() if k in _MATRIX_KEYS}
    if given != {k: COMMON[k].default for k in given}:
        key = next(k for k in given if given[k] != COMMON[k].default)
        raise SpecError(
            f"workload {workload.name}: {key} = {given[key]!r} does not apply to a flow "
            "table file, which already holds its flows' QPs, priorities and start times"
        )
    return load_flow_table(files[0]["matrix"], fabric)


_MATRIX_KEYS = ("priority", "start", "qps", "qp_mode", "chunk", "window")


def _matrix_op(fabric: Fabric, job: Job, taken: np.ndarray, name: str) -> Op:
    """The flows of a CSV or htsim matrix job as one op; its NICs become taken."""
    from aifabric.traffic.matrix import read_matrix, transfers

    tr, start_ns = transfers(fabric, read_matrix(job["matrix"]))
    nics = np.unique(np.concatenate([tr.src, tr.dst]))
    if taken[nics].any():
        nic = fabric.node_name[nics[taken[nics]][0]]
        raise SpecError(
            f"workload {name}: {job['matrix']} names {nic}, which another matrix job uses; "
            "jobs never share a NIC"
        )
    taken[nics] = True
    size = int(tr.bytes.sum())
    return Op("matrix", "-", size, len(nics), 1, tr.steps, tr, start_ns=start_ns)


def _gpus_wanted(job: Job) -> int:
    if job.kind == "pattern" and job["pattern"] == "incast" and job["gpus"] == 0:
        return job["senders"] + 1
    return job["gpus"]


def job_ops(
    fabric: Fabric, job: Job, nics: np.ndarray, rng, name: str, table: nccl.Table = nccl.DEFAULT
) -> list[Op]:
    if job.kind == "collective":
        return _collective_ops(fabric, job, nics, name, table)
    if job.kind == "pattern":
        from aifabric.traffic.patterns import pattern_op

        return [pattern_op(fabric, job, nics, rng, name)]
    from aifabric.traffic.training import training_ops

    return training_ops(fabric, job, nics, name, table)


def server_matrix(fabric: Fabric, nics: np.ndarray, what: str) -> np.ndarray:
    """The job's NICs as (servers, GPUs per server), servers and rails in topology order."""
    topo = np.sort(nics)
    server = server_keys(fabric, topo)[0]
    counts = np.bincount(server)
    counts = counts[counts > 0]
    if len(set(counts.tolist())) != 1:
        raise SpecError(
            f"{what} needs the same number of GPUs on every server of the job; "
            f"this placement has {counts.min()} to {counts.max()}"
        )
    return topo.reshape(len(counts), int(counts[0]))


def collective_instances(
    fabric: Fabric, job: Job, nics: np.ndarray, name: str
) -> list[tuple[np.ndarray, int, int]]:
    """The communicators a collective job runs: (NIC per rank, size, root) each.

    One over every rank, or with `hierarchical` one per rail over the servers (the
    intra-server step rides NVLink): AllReduce, AllGather, ReduceScatter and Broadcast
    give each rail 1/g of the data; AllToAll and send/recv move all of it on every rail
    (AllToAll aggregated per destination server first, as PXN does).
    """
    kind, size = job["collective"], job["size"]
    collective = coll.kind(kind)
    shape = coll.Shape(channels=job["channels"], root=job["root"], stages=job["stages"])
    why = collective.refuse(len(nics), shape, "GPUs")
    if why:
        raise SpecError(f"workload {name}: {why}")
    if not job["hierarchical"]:
        return [(nics, size, job["root"])]
    grid = server_matrix(fabric, nics, f"workload {name}: hierarchical {kind}")
    servers, per = grid.shape
    why = collective.refuse(servers, replace(shape, root=job["root"] // per), "servers")
    if why:
        raise SpecError(f"workload {name}: hierarchical {why}")
    sizes = parts_list(size, per) if collective.rails_split else [size] * per
    return [(grid[:, rail], sizes[rail], job["root"] // per) for rail in range(per)]


def job_shape(
    job: Job,
    ranks: int,
    algorithm: str,
    protocol: str,
    table: nccl.Table | None = None,
    size: int | None = None,
) -> coll.Shape:
    """The keys of a collective job that shape a communicator's transfers (of `size` bytes,
    the job's by default), with NCCL's step size for `algorithm` and `protocol`
    (`aifabric.traffic.nccl.terms`)."""
    t = nccl.terms(
        (table or nccl.DEFAULT).merged(job["nccl"]), job["collective"], algorithm, protocol,
        ranks, job["size"] if size is None else size, job["channels"],
    )  # fmt: skip
    return coll.Shape(
        channels=job["channels"], step_bytes=t.step_bytes, chunk=job["chunk"], root=job["root"],
        stages=job["stages"],
    )  # fmt: skip


def collective_flow_count(
    job: Job, instances, algorithm: str, protocol: str, table: nccl.Table | None = None
) -> int:
    collective = coll.kind(job["collective"])
    per_op = sum(
        collective.transfer_count(
            algorithm,
            len(ranks),
            size,
            job_shape(job, len(ranks), algorithm, protocol, table, size),
        )
        for ranks, size, _ in instances
    )
    return job["qps"] * per_op * job["iterations"]


def _collective_ops(
    fabric: Fabric, job: Job, nics: np.ndarray, name: str, table: nccl.Table
) -> list[Op]:
    kind, size = job["collective"], job["size"]
    collective = coll.kind(kind)
    instances = collective_instances(fabric, job, nics, name)
    choice = nccl.job_choice(table, fabric, job, nics, len(instances[0][0]))
    algorithm = choice.algorithm
    count = collective_flow_count(job, instances, algorithm, choice.protocol, table)
    if count > MAX_FLOWS:
        raise TooManyFlows(
            f"workload {name}: {kind} over {len(nics):,} GPUs makes {count:,} flows, more "
            f"than the {MAX_FLOWS:,} a flow table holds; use fewer GPUs"
            + ("" if job["hierarchical"] else " or hierarchical = true")
            + ", or fewer channels or QPs"
        )
    blocks = []
    for ranks, part, root in instances:
        shape = replace(
            job_shape(job, len(ranks), algorithm, choice.protocol, table, part), root=root
        )
        tr = collective.transfers(algorithm, len(ranks), part, shape)
        blocks.append(map_groups(tr, ranks[None, :]))
    tr = coll.concat(blocks)
    ranks = max(len(r) for r, _, _ in instances)
    per_server = len(nics) // ranks if job["hierarchical"] else 1
    terms = nccl.terms(
        table.merged(job["nccl"]), kind, algorithm, choice.protocol, ranks,
        max(part for _, part, _ in instances), job["channels"],
        nccl.nvlink_steps(kind, per_server),
    )  # fmt: skip
    op = Op(
        kind, algorithm, size, len(nics), 1, tr.steps, tr, hierarchical=job["hierarchical"],
        protocol=choice.protocol, predicted_ns=choice.predicted_ns,
        step_latency_ns=terms.step_latency_ns, base_latency_ns=terms.base_latency_ns,
        rate_factor=terms.rate_factor, buffer_bytes=terms.buffer_bytes,
    )  # fmt: skip
    return [op] * job["iterations"]


def parts_list(total: int, n: int) -> list[int]:
    return [int(x) for x in coll.parts(total, n)]
