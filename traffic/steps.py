"""Streams written out as one transfer per step, for an engine that replays transfers.

The simulator executes a stream (`aifabric.traffic.collectives`): its NIC sends
step k once the stream's inputs have delivered step k - offset. An engine that
starts whole flows once the flows they wait for have arrived (the emulator's
replay) runs the same causality when every step of every stream's QP is a flow of
its own, waiting for the same QP steps of its input streams that the kernel would
wait for. `expand_steps` makes that table: flow (s, k, q) carries QP q's share of
step k of stream s and waits for QP steps (i, k - offset, *) of each input i (a ring
loop's first step: for what the step before it waits for). A step with no input
step (k < offset, or a stream with no inputs) waits only for what the stream's flow
waited for (the ops before). Flows that wait for a stream's flow wait for its last
step. Transfers that are not streams are copied unchanged.

A stream with a window (`stream_windows`: NCCL's connection buffer, a tree's) may send
step k only once each of its outputs has been released step k - window: its receiver
holds the data until it sends it on. A release is not an arrival, so the table gets a
marker for each step of a stream whose input has a window: an empty flow (origin
`-1 - f`, f the stream's flow) that waits for what releases that step (its inputs' step,
and its own outputs' markers when it has a window) and ends when it starts. Waiting for a
marker costs no latency (`is_marker`); waiting for data costs the step's.

At lab scale this fits in memory (a ring AllReduce over 128 ranks is 254 steps of
128 streams per channel and QP); `expanded_size` says how large it would be, so an
engine can refuse before building.
"""

from __future__ import annotations

import numpy as np

from aifabric.traffic.collectives import csr_from_pairs
from aifabric.traffic.flows import EXTRA_FLOW_COLUMNS, FLOW_COLUMNS, FlowTable
from aifabric.traffic.generate import qp_bytes

_I64 = np.int64


def expanded_size(table: FlowTable) -> int:
    """Flows `expand_steps` would make (markers included)."""
    if not table.n_groups:
        return len(table)
    steps = table.group_steps.astype(_I64)[table.group[table.group >= 0]]
    marked = _marked(table, stream_windows(table))
    markers = int(np.maximum(table.group_steps.astype(_I64), 1)[marked].sum())
    return int((table.group < 0).sum() + steps.sum()) + markers


def stream_windows(table: FlowTable) -> np.ndarray:
    """Per stream, the steps its receiver's connection buffer holds beyond what the receiver
    has been released to send on (the op's `op_buffer_bytes` over the stream's step; 0: no
    window), as the simulator's `in_window` reads them."""
    ng = table.n_groups
    if not ng:
        return np.zeros(0, dtype=_I64)
    member = np.flatnonzero(table.group >= 0)
    first = np.full(ng, len(table), dtype=_I64)
    np.minimum.at(first, table.group[member], member)
    first = np.minimum(first, max(len(table) - 1, 0))
    buffer = table.op_column("op_buffer_bytes", 0)[first].astype(_I64)
    steps = np.maximum(table.group_steps.astype(_I64), 1)
    step = np.maximum(-(-table.group_bytes.astype(_I64) // steps), 1)
    return np.where(buffer > 0, np.maximum(buffer // step, 1), 0)


def _marked(table: FlowTable, win: np.ndarray) -> np.ndarray:
    """Per stream: does one of its inputs have a window (its steps get markers)?"""
    ins = np.diff(table.group_in_ptr)
    of = np.repeat(np.arange(table.n_groups, dtype=_I64), ins)
    marked = np.zeros(table.n_groups, dtype=bool)
    marked[of[win[table.group_in] > 0]] = True
    return marked


def is_marker(origin: np.ndarray) -> np.ndarray:
    """Per flow of `expand_steps_with_origin`'s table: is it a marker (module docstring)?"""
    return np.asarray(origin) < 0


def expand_steps(table: FlowTable) -> FlowTable:
    """`table` with every stream QP cut into one flow per step (see the module docstring)."""
    return expand_steps_with_origin(table)[0]


def expand_steps_with_origin(table: FlowTable) -> tuple[FlowTable, np.ndarray]:
    """`expand_steps`, and for each of its flows the flow of `table` it is a step of (an
    engine that replays the steps records what ran as `table`'s flows: `fold_steps`)."""
    if not table.n_groups:
        return table, np.arange(len(table), dtype=_I64)
    n = len(table)
    g = table.group
    stream = g >= 0
    steps = np.where(stream, table.group_steps.astype(_I64)[np.maximum(g, 0)], 1)
    first_new = np.concatenate([[0], np.cumsum(steps)[:-1]])  # new id of each flow's step 0
    last_new = first_new + steps - 1
    total = int(steps.sum())
    old = np.repeat(np.arange(n, dtype=_I64), steps)  # the flow each new flow comes from
    k = np.arange(total, dtype=_I64) - first_new[old]  # its step (0 for a transfer)

    # bytes: the QP's share of step k of its stream
    mode = table.op_column("op_qp_mode", "split")
    chunk = np.maximum(table.op_column("op_chunk_bytes", 1), 1)
    nbytes = table.bytes[old].copy()
    member = np.flatnonzero(stream)
    first_of = np.full(table.n_groups, n, dtype=_I64)
    np.minimum.at(first_of, g[member], member)
    nqp = np.bincount(g[member], minlength=table.n_groups)
    qp = np.zeros(n, dtype=_I64)
    qp[member] = member - first_of[g[member]]
    sel = stream[old]
    o = old[sel]
    s = g[o]
    kk = k[sel]
    steps_s = table.group_steps.astype(_I64)[s]
    b = table.group_bytes[s]

    def end(j, pick=None):
        bb, ss = (b, steps_s) if pick is None else (b[pick], steps_s[pick])
        return (bb // ss) * j + ((bb % ss) * j) // ss

    for m in np.unique(np.stack([nqp[s], (mode[o] == "round-robin"), chunk[o]]), axis=1).T:
        q_count, rr, c = int(m[0]), bool(m[1]), int(m[2])
        pick = (nqp[s] == q_count) & ((mode[o] == "round-robin") == rr) & (chunk[o] == c)
        how = "round-robin" if rr else "split"
        qq = qp[o[pick]]
        hi = qp_bytes(end(kk[pick] + 1, pick), qq, q_count, how, c)
        lo = qp_bytes(end(kk[pick], pick), qq, q_count, how, c)
        part = np.flatnonzero(sel)[pick]
        nbytes[part] = hi - lo

    # dependencies: inputs' QP steps k - offset, and what the flow waited for (ops before)
    pt, pd = [], []
    in_ptr, inp = table.group_in_ptr, table.group_in

    def inputs(x, j, rows):
        """Rows `rows` (streams x at steps j) wait for their inputs' QP steps."""
        offset = table.group_offset.astype(_I64)[x]
        loop = table.group_loop.astype(_I64)[x]
        need = j - offset
        # a loop's first step is released with the step before it (kernel.releasable)
        first = (loop > 1) & (j > 0) & (j % np.maximum(loop, 1) == 0)
        need = np.where(first, need - 1, need)
        need = np.where(loop == 1, -1, need)
        deg = (in_ptr[1:] - in_ptr[:-1])[x]
        for slot in range(int(deg.max()) if len(deg) else 0):
            has = (deg > slot) & (need >= 0)
            i = inp[in_ptr[x[has]] + slot]
            for q2 in range(int(nqp.max())):
                ok = nqp[i] > q2
                src_old = first_of[i[ok]] + q2
                pt.append(rows[has][ok])
                pd.append(first_new[src_old] + need[has][ok])

    # windows: step j of stream x waits for its outputs' markers of step j - window
    win = stream_windows(table)
    marked = _marked(table, win)
    m_steps = np.where(marked, np.maximum(table.group_steps.astype(_I64), 1), 0)
    m_first = total + np.concatenate([[0], np.cumsum(m_steps)[:-1]]).astype(_I64)
    n_markers = int(m_steps.sum())
    outs = np.bincount(inp, minlength=table.n_groups)
    out_ptr = np.concatenate([[0], np.cumsum(outs)]).astype(_I64)
    out_of = np.repeat(np.arange(table.n_groups, dtype=_I64), np.diff(in_ptr))
    out = out_of[np.argsort(inp, kind="stable")]  # outputs of each stream, CSR by out_ptr

    def window(x, j, rows):
        w = win[x]
        held = (w > 0) & (j >= w)
        deg = outs[x]
        for slot in range(int(deg[held].max()) if held.any() else 0):
            has = np.flatnonzero(held & (deg > slot))
            o = out[out_ptr[x[has]] + slot]
            at = j[has] - w[has]
            ok = at < m_steps[o]  # an output with fewer steps releases them all by then
            pt.append(rows[has[ok]])
            pd.append(m_first[o[ok]] + at[ok])

    new_sel = np.flatnonzero(sel)
    inputs(s, kk, new_sel)
    window(s, kk, new_sel)
    mx = np.repeat(np.arange(table.n_groups, dtype=_I64), m_steps)
    mj = _ragged(m_steps)
    m_rows = total + np.arange(n_markers, dtype=_I64)
    inputs(mx, mj, m_rows)
    window(mx, mj, m_rows)
    # prerequisites of the original flows: every step waits for them; a prerequisite that
    # is a stream's flow stands for its last step
    pre_of = np.repeat(np.arange(n, dtype=_I64), np.diff(table.dep_ptr))
    pre = table.dep
    counts = steps[pre_of]
    t_new = np.repeat(first_new[pre_of], counts) + _ragged(counts)
    d_new = np.repeat(np.where(stream[pre], last_new[pre], first_new[pre]), counts)
    pt.append(t_new)
    pd.append(d_new)
    for x in np.flatnonzero(marked):  # a marker waits for what its stream's flow waited for
        f = first_of[x]
        pre = table.dep[table.dep_ptr[f] : table.dep_ptr[f + 1]]
        d = np.where(stream[pre], last_new[pre], first_new[pre])
        rows = m_first[x] + np.arange(m_steps[x], dtype=_I64)
        pt.append(np.repeat(rows, len(d)))
        pd.append(np.tile(d, len(rows)))
    size = total + n_markers
    old = np.concatenate([old, first_of[mx]])
    k = np.concatenate([k, mj])
    nbytes = np.concatenate([nbytes, np.zeros(n_markers, dtype=nbytes.dtype)])
    t_all, d_all = np.concatenate(pt), np.concatenate(pd)
    order = _topological(size, t_all, d_all)  # new row -> flow, every wait on an earlier row
    row_of = np.empty(size, dtype=_I64)
    row_of[order] = np.arange(size, dtype=_I64)
    dep_ptr, dep = csr_from_pairs(size, row_of[t_all], row_of[d_all])
    marker = order >= total
    old, k = old[order], k[order]
    nbytes = nbytes[order]
    cols = {}
    for name in (*FLOW_COLUMNS, *EXTRA_FLOW_COLUMNS):
        if name in ("flow_id", "group"):
            continue
        cols[name] = getattr(table, name)[old]
    cols["bytes"] = nbytes
    cols["step"] = np.where(stream[old], k, table.step[old]).astype(np.int32)
    ops = {name: getattr(table, name) for name in table.arrays() if name.startswith("op_")}
    return FlowTable.build(cols, (dep_ptr, dep), ops), np.where(marker, -1 - old, old)


def fold_steps(
    origin: np.ndarray, n: int, start_ns: np.ndarray, end_ns: np.ndarray, lead_ns=0
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each of the `n` flows whose steps (`origin`: the flow of each step)
    started at `start_ns` and ended at `end_ns` (-1: never): its first step's start less its
    `lead_ns` (per flow: `first_latency_ns`), and its last step's end once every step has
    ended (else -1), as the simulator records a stream."""
    origin = np.asarray(origin, dtype=_I64)
    start_ns, end_ns = np.asarray(start_ns, dtype=_I64), np.asarray(end_ns, dtype=_I64)
    steps = origin >= 0  # markers are no flow's steps
    origin, start_ns, end_ns = origin[steps], start_ns[steps], end_ns[steps]
    big = np.iinfo(_I64).max
    start = np.full(n, big, dtype=_I64)
    np.minimum.at(start, origin, np.where(start_ns >= 0, start_ns, big))
    started = start != big
    start = np.where(started, np.maximum(start - lead_ns, 0), -1)
    end = np.full(n, -1, dtype=_I64)
    np.maximum.at(end, origin, end_ns)
    unfinished = np.zeros(n, dtype=bool)
    unfinished[origin[end_ns < 0]] = True
    end[unfinished] = -1
    return start, end


def first_latency_ns(table: FlowTable) -> np.ndarray:
    """Per flow, how long after it starts its first byte may leave: a stream's first step is
    released its op's base and step latency after the stream starts (`aifabric.sim.kernel`:
    `start_stream`), which is when the simulator records its start; a transfer starts when
    its latency is over (0)."""
    lat = table.op_column("op_step_latency_ns", 0) + table.op_column("op_base_latency_ns", 0)
    return np.where(table.group >= 0, lat, 0).astype(_I64)


def steps_first_latency_ns(table: FlowTable, origin: np.ndarray) -> np.ndarray:
    """Per flow of `expand_steps(table)` (`origin`: the flow of `table` each is a step of),
    its first latency: from its op's start, or the end of the op before it, to its first
    byte. The op's base latency, and for a stream's step its step latency as well, as the
    simulator releases them (`aifabric.sim.kernel`: a stream's first step after `start_stream`
    with both, a transfer of `table` after its base alone)."""
    origin = np.asarray(origin, dtype=_I64)
    origin = np.where(origin < 0, -1 - origin, origin)  # a marker: as its stream's step
    base = table.op_column("op_base_latency_ns", 0).astype(_I64)[origin]
    step = table.op_column("op_step_latency_ns", 0).astype(_I64)[origin]
    return base + np.where(table.group[origin] >= 0, step, 0)


def fold_paths(
    origin: np.ndarray, n: int, path_ptr: np.ndarray, path_link: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each of the `n` flows' path (CSR) as its first step's (`origin`: the flow of each
    step; a stream's steps share its 5-tuple, so its route)."""
    origin = np.asarray(origin, dtype=_I64)
    first = np.full(n, len(origin), dtype=_I64)
    steps = np.flatnonzero(origin >= 0)  # markers are no flow's steps
    np.minimum.at(first, origin[steps], steps)
    lens = path_ptr[first + 1] - path_ptr[first]
    links = path_link[_ragged_from(path_ptr[first], lens)]
    return np.concatenate([[0], np.cumsum(lens)]).astype(_I64), links


def _topological(n: int, t: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Flows in an order where each comes after the flows it waits for (t waits for d): by
    level (Kahn's algorithm a level at a time), in flow order within a level."""
    indeg = np.bincount(t, minlength=n)
    order = np.argsort(d, kind="stable")
    succ_ptr = np.zeros(n + 1, dtype=_I64)
    np.cumsum(np.bincount(d, minlength=n), out=succ_ptr[1:])
    succ = t[order]
    level = np.flatnonzero(indeg == 0)
    out = []
    while len(level):
        out.append(level)
        nxt = succ[_ragged_from(succ_ptr[level], succ_ptr[level + 1] - succ_ptr[level])]
        np.subtract.at(indeg, nxt, 1)
        level = np.unique(nxt[indeg[nxt] == 0])
    done = np.concatenate(out) if out else np.zeros(0, _I64)
    if len(done) != n:
        raise ValueError("the steps' dependencies have a cycle")
    return done


def _ragged_from(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return np.repeat(starts, counts) + _ragged(counts)


def _ragged(counts: np.ndarray) -> np.ndarray:
    """concatenate(arange(c) for c in counts)."""
    total = int(counts.sum())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(_I64)[: len(counts)]
    return np.arange(total, dtype=_I64) - np.repeat(starts, counts)
