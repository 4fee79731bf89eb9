"""One simulation on several cores: the fabric cut into partitions, run side by side in
windows, with results identical to one partition's.

Each partition is a copy of the simulation's state that holds the events of its own nodes
only: its ports' frames and looks, its NICs' flows (a flow's sender) and the packets on
their way into its nodes. A frame put on a link into another partition goes into the
partition's outbox (`kernel.export`) instead of its event list; between windows the
driver hands the outboxes over (`kernel.inject`). Every such frame takes at least the
link's delay to arrive, so when windows are no longer than the shortest delay of a link
between partitions (the lookahead), what a partition receives in one window is always
for a later one (conservative synchronization). Events of one time run in an order that
does not depend on the order they were scheduled in (aifabric.sim.heap.tie_key), so each
partition runs its events in the order one partition would, and the results are the
same for any number of partitions.

A run ends after the event that finishes its last flow (or leaves it without a path), as
with one partition: each partition knows how many flows end there (its quota) and stops
after the event that completes its last one; once every partition has, the latest of
those events is the end, and the partitions that stopped earlier run up to it (in time,
then key order).

The windows' partitions run in threads: the loop (`kernel.run`) holds no GIL. Under
`mpirun` they run on the job's ranks instead (aifabric.sim.mpi: `PartitionedRun` with
`local`, the partitions one rank holds, and `close_local` and `combine`, the two
halves of `merge`).

What needs more than a link between partitions is not partitioned (`why_not`): flows
that wait on other flows (collectives: a step released at another NIC the moment data
arrives), faults during the run, captures, adaptive routing and spraying; and a run in
which a packet is dropped is run again on one partition (the sender's timeout reads the
receiver's count, across the cut).
"""

from __future__ import annotations

import copy
import os
import threading
import time

import numpy as np

from aifabric.fabric.model import Fabric, Role
from aifabric.sim import heap, kernel
from aifabric.sim import layout as L
from aifabric.sim import windows as W

PS = L.PS_PER_NS
NEVER = kernel.NEVER  # a quota no partition reaches, a key above every key
SLICE = 1 << 22  # events per kernel call, between looks at the stop flag


class Fallback(Exception):
    """The partitioned run cannot go on with identical results (why, in one sentence)."""


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def assign(fabric: Fabric, parts: int) -> np.ndarray:
    """The partition of each node: racks (a leaf switch and its NICs) in blocks of
    consecutive leaves with about as many NICs each, then every other switch, tier by
    tier up, where most of its neighbours already are (ties: the partition with the
    fewest switches so far)."""
    f = fabric
    part = np.full(f.n_nodes, -1, dtype=np.int64)
    role = f.node_role
    peer_node = f.port_peer.astype(np.int64)  # the node at the far end of each port's link
    nic = np.flatnonzero(role == Role.NIC)
    leaf_of = f.nic_switch.astype(np.int64)
    leaves = np.unique(leaf_of[nic])
    parts = max(1, min(parts, len(leaves)))
    weight = np.bincount(leaf_of[nic], minlength=f.n_nodes)[leaves] + 1
    middle = np.cumsum(weight) - weight / 2  # each rack's place in the NICs' order
    part[leaves] = np.minimum((middle * parts / weight.sum()).astype(np.int64), parts - 1)
    part[nic] = part[leaf_of[nic]]
    switches = np.zeros(parts, dtype=np.int64)
    np.add.at(switches, part[leaves], 1)
    order = np.argsort(f.port_node, kind="stable")  # each node's ports, together
    ptr = np.searchsorted(f.port_node[order], np.arange(f.n_nodes + 1))

    def neighbours(v: int) -> np.ndarray:
        return peer_node[order[ptr[v] : ptr[v + 1]]]

    frontier = list(leaves)
    while True:
        nxt = sorted({int(v) for u in frontier for v in neighbours(u) if part[v] < 0})
        if not nxt:
            break
        for v in nxt:
            near = neighbours(v)
            votes = np.bincount(part[near[part[near] >= 0]], minlength=parts)
            best = np.flatnonzero(votes == votes.max())
            k = int(best[np.argmin(switches[best])])
            part[v] = k
            switches[k] += 1
        frontier = nxt
    part[part < 0] = 0  # nodes with no link to a rack
    return part


def far_parts(fabric: Fabric, part: np.ndarray) -> np.ndarray:
    """PT_FAR_PART of each port: 1 + the partition at the far end of its link where that
    is another, else 0."""
    near = part[fabric.port_node]
    far = part[fabric.port_peer]
    return np.where(far != near, far + 1, 0).astype(np.int64)


def lookahead_ps(fabric: Fabric, part: np.ndarray) -> int:
    """The shortest delay of a link between two partitions (0: none crosses)."""
    cut = far_parts(fabric, part) > 0
    if not cut.any():
        return 0
    return int(fabric.port_delay_ns[cut].min()) * PS


AUTO_FLOWS = 1000  # "auto" partitions runs of this many flows or more
MAX_OUT_ROWS = 1 << 16  # outbox rows per partition and parity; more are kept aside


def wanted(sim, until_ns) -> tuple[int, str | None]:
    """The partitions `sim` runs on, and why only one if it asked for more (or "auto")."""
    asked = sim.partitions
    why = why_not(sim, until_ns)
    if asked == "auto":
        asked = cores()
        if asked < 2:
            why = why or "one core"
        elif len(sim.flows) < AUTO_FLOWS:
            why = why or f"a small run ({len(sim.flows):,} flows; auto: {AUTO_FLOWS:,} or more)"
    return asked, why


def out_rows(sim, far: np.ndarray, lookahead: int) -> int:
    """Outbox rows a partition can need in one window: every link into another partition
    sends at most a frame per smallest frame's serialization (a PFC frame, an ACK)."""
    cut = np.flatnonzero(far > 0)
    smallest = min(L.PFC_WIRE_BYTES, int(sim.prm[L.P_OVERHEAD_BYTES]))
    ser = (smallest * 8 * 10**12 + sim.pt[cut, L.PT_RATE_BPS] - 1) // sim.pt[cut, L.PT_RATE_BPS]
    return int((lookahead // ser + 2).sum()) + 2 * L.OUT_RESERVE


def why_not(sim, until_ns) -> str | None:
    """Why `sim` runs on one partition whatever it asks for (None: it may run on several)."""
    if until_ns is not None:
        return "a run to a given time"
    if len(sim.dep) or len(sim.gr):
        return "flows that wait on other flows (collectives' steps)"
    if sim.pending_faults:
        return "faults during the run"
    if len(sim.capture_ports):
        return "packet captures"
    if sim.routing.policy in ("spray", "adaptive"):
        return f"{sim.routing.policy} routing"
    if len(sim.flows) == 0:
        return "no flows"
    return None


class PartitionedRun:
    """`Simulation.run` on `parts` partitions (`sim` keeps its state until `merge`)."""

    def __init__(self, sim, parts: int, local=None):
        self.sim = sim
        f = sim.fabric
        self.part = assign(f, parts)
        self.n = int(self.part.max()) + 1
        self.lookahead = lookahead_ps(f, self.part)
        if self.n < 2 or self.lookahead <= 0:
            raise Fallback(
                "the fabric has fewer than two racks"
                if self.n < 2
                else "a link between partitions has no delay"
            )
        if sim.prm[L.P_RTO_PS] < self.lookahead:
            raise Fallback("the retransmission timeout is shorter than a link's delay")
        t = sim.flows
        at_sender = (
            (t.bytes == 0) | (np.diff(sim.path_ptr) == 0) | bool(sim.prm[L.P_FINISH_AT_SENDER])
        )
        ends = np.where(at_sender, self.part[t.src], self.part[t.dst])
        self.quota = np.bincount(ends, minlength=self.n)
        far = far_parts(f, self.part)
        # every partition's outbox of even windows and of odd ones: the others read one
        # while a partition writes the other
        rows = min(out_rows(sim, far, self.lookahead), MAX_OUT_ROWS)
        # the partitions this process holds (aifabric.sim.mpi: a rank's share), in order
        self.local = list(range(self.n)) if local is None else list(local(self.n))
        self.box = np.zeros((2, len(self.local), rows, L.O_N), dtype=np.int64)
        self.parts = [None] * self.n
        for i, k in enumerate(self.local):
            self.parts[k] = self._partition(k, far, i)
        self.end: tuple[int, int] | None = None  # the (time, key) of the run's last event
        self.spills = 0  # outboxes that filled in a window (their rows kept aside)

    def _partition(self, k: int, far: np.ndarray, i: int):
        """A copy of the simulation's state holding partition k's first events only (its
        outboxes: `self.box[:, i]`)."""
        sim = self.sim
        c = copy.copy(sim)
        for name in ("g", "prm", "pt", "fl", "fr", "nd", "act", "pk", "pc", "smp", "cap"):
            setattr(c, name, getattr(sim, name).copy())
        c._load, c._rnd, c.gr = sim._load.copy(), sim._rnd.copy(), sim.gr.copy()
        c.ev = np.zeros_like(sim.ev)
        c.outs = [self.box[0, i], self.box[1, i]]
        c.out = c.outs[0]
        c.sample_chunks, c.capture_chunks, c.sample_rows, c.wall_s = [], [], 0, 0.0
        c.pt[:, L.PT_FAR_PART] = far
        c.prm[L.P_PARTITIONED] = 1
        c.prm[L.P_QUOTA] = self.quota[k] if self.quota[k] else NEVER
        heap.clear(c.ev, c.g)
        fl = c.fl
        mine = (fl[:, L.FL_DEPS] == 0) & (self.part[sim.flows.src] == k)
        for i in np.flatnonzero(mine):
            heap.schedule(c.ev, c.g, int(fl[i, L.FL_EARLIEST_PS]), L.EV_FLOW_START, int(i), 0)
        heap.schedule(c.ev, c.g, int(c.prm[L.P_SAMPLE_PS]), L.EV_SAMPLE, 0, 0)
        return c

    # one partition, one stretch ------------------------------------------------------
    def _advance(self, k: int, t_stop: int, key_stop: int, w: int) -> int:
        """Run partition k up to (t_stop, key_stop) or its quota's end: the loop's code."""
        c = self.parts[k]
        c.g[L.G_KEY_STOP] = key_stop
        try:
            while True:
                code = kernel.run(c._state(), t_stop, SLICE)
                if code in (L.R_STOP, L.R_DONE):
                    return code
                if code == L.R_DRAIN_OUT:
                    self._drain_out(k, w)
                else:
                    c.make_room(code)  # R_LIMIT: on with the next slice
        finally:
            c.g[L.G_KEY_STOP] = NEVER

    def _drain_out(self, k: int, w: int) -> None:
        """The outbox is nearly full: its rows go to the window's overflow list."""
        c = self.parts[k]
        n = int(c.g[L.G_OUT])
        if n:
            self.boxes[w & 1][k].append(c.out[:n].copy())
            self.spills += 1
            c.g[L.G_OUT] = 0

    def _inject(self, k: int, w: int, sent: list) -> None:
        """Give partition k the rows the other partitions sent in window w: each one's
        outbox of that window's parity (its first `sent[j]` rows) and what overflowed it."""
        for j in range(self.n):
            if j == k:
                continue
            other = self.parts[j]
            for rows, n in [
                *((r, len(r)) for r in self.boxes[w & 1][j]),
                (other.outs[w & 1], sent[j]),
            ]:
                self._take(k, rows, n)

    def _take(self, k: int, rows: np.ndarray, n: int) -> None:
        """Partition k takes the rows for it of the first n of `rows`, with room made."""
        if not n:
            return
        c = self.parts[k]
        while c.g[L.G_NFREE] < n + c.prm[L.P_PACKET_RESERVE]:
            c._grow_packets()
        while c.ev.shape[1] - c.prm[L.P_EVENT_RESERVE] < c.g[L.G_HEAP] + n:
            c._grow_events()
        kernel.inject(c._state(), rows, n, k)

    def _earliest(self, k: int) -> int:
        c = self.parts[k]
        return int(heap.earliest_ps(c.ev, c.g))

    # the run ---------------------------------------------------------------------------
    def run(self, progress=None) -> None:
        """Run every partition to the end, each in a thread of its own, window by window
        (`merge` then gives `sim` the results): in numba (`aifabric.sim.windows`) when
        every partition has a core, else window by window from Python."""
        n = self.n
        self._t0 = time.perf_counter()
        if n <= cores():
            self._run_spinning(progress)
            return
        self.boxes = [[[] for _ in range(n)] for _ in range(2)]  # by window parity
        self.status = [[None] * n for _ in range(2)]  # by window parity: see `_windows`
        self.first_ps = min(self._earliest(k) for k in range(n))
        self.windows = 0
        self.progress_fn = progress
        self.barrier = threading.Barrier(n)
        self._each_thread(self._thread)

    def _run_spinning(self, progress) -> None:
        n = self.n
        self.sync = np.zeros((2, n, W.Y_N), dtype=np.int64)
        self.flags = np.zeros(n + 1, dtype=np.int64)  # flags[n]: a thread gave up
        self.spilled = [[(-1, [])] * n for _ in range(2)]  # by parity: (window, rows)
        first = min(self._earliest(k) for k in range(n))
        for k, c in enumerate(self.parts):
            c.ctl = np.zeros(W.C_N, dtype=np.int64)
            c.ctl[W.C_T0] = first
            c.ctl[W.C_REACHED] = int(self.quota[k] == 0)
            c.ctl[W.C_LAST_T] = c.ctl[W.C_LAST_KEY] = -1
            c.ctl[W.C_STALL_PS] = c.prm[L.P_STALL_PS]
        self.progress_fn = progress
        try:
            self._each_thread(self._spin)
        finally:
            self.windows = int(self.parts[0].ctl[W.C_W]) + 1

    def _each_thread(self, target) -> None:
        """`target(k)` for every partition k, each in a thread (partition 0 in this one);
        then what the first that failed raised (each records it in `self.failed`)."""
        self.failed: list[BaseException] = []
        threads = [
            threading.Thread(target=target, args=(k,), name=f"aifabric-part{k}")
            for k in range(1, self.n)
        ]
        for t in threads:
            t.start()
        try:
            target(0)
        finally:
            for t in threads:
                t.join()
        self.wall_s = time.perf_counter() - self._t0
        if self.failed:
            raise self.failed[0]

    def _spin(self, k: int) -> None:
        """Partition k's thread: `windows.windows` until the end, doing what it asks."""
        c = self.parts[k]
        try:
            while True:
                base = c._state()
                code = W.windows(
                    base._replace(out=c.outs[0]), base._replace(out=c.outs[1]), k, self.n,
                    self.lookahead, self.box, self.sync, self.flags, c.ctl, SLICE,
                )  # fmt: skip
                if code == W.W_END:
                    self.end = (int(c.ctl[W.C_END_T]), int(c.ctl[W.C_END_KEY]))
                    return
                if code == W.W_ABORT:
                    return
                if code == W.W_GROW_PACKETS:
                    while c.g[L.G_NFREE] < c.ctl[W.C_NEED] + c.prm[L.P_PACKET_RESERVE]:
                        c._grow_packets()
                elif code == W.W_GROW_EVENTS:
                    c._grow_events()
                    while (
                        c.ev.shape[1] - c.prm[L.P_EVENT_RESERVE] < c.g[L.G_HEAP] + c.ctl[W.C_NEED]
                    ):
                        c._grow_events()
                elif code == W.W_DRAIN_SAMPLES:
                    c._drain_samples()
                elif code == W.W_DRAIN_CAPTURE:
                    c._drain_captures()
                elif code == W.W_SPILL:  # kept aside for the others, who take it first
                    w = int(c.ctl[W.C_W])
                    mine = self.spilled[w & 1][k]
                    if mine[0] != w:
                        mine = self.spilled[w & 1][k] = (w, [])
                    mine[1].append(c.outs[w & 1][: int(c.g[L.G_OUT])].copy())
                    self.spills += 1
                    c.g[L.G_OUT] = 0
                    c.ctl[W.C_SPILLED] += 1
                elif code == W.W_TAKE_SPILLED:
                    w = int(c.ctl[W.C_W]) - 1
                    for j in range(self.n):
                        when, chunks = self.spilled[w & 1][j]
                        if j != k and when == w:
                            for rows in chunks:
                                self._take(k, rows, len(rows))
                    c.ctl[W.C_SPILL_TAKEN] = 1
                elif code == W.W_YIELD:
                    if self.progress_fn is not None:
                        self.progress_fn(self.progress(int(c.ctl[W.C_T0])))
                elif code == W.W_DROP:
                    raise Fallback("a packet was dropped")
                elif code == W.W_STALL:
                    raise Fallback("the run stalled")
                else:
                    raise RuntimeError(
                        "a partition's outbox or reserves ran out of room; the run cannot "
                        "go on (a bug in aifabric.sim.partition's bounds)"
                    )
                c.ctl[W.C_NEED] = 0
        except BaseException as e:  # noqa: BLE001 (handed to the caller: `run` raises it)
            self.failed.append(e)
            self.flags[self.n] = 1

    def _thread(self, k: int) -> None:
        try:
            self._windows(k)
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:  # noqa: BLE001 (handed to the caller: `run` raises it)
            self.failed.append(e)
            self.barrier.abort()

    def _windows(self, k: int) -> None:
        """Partition k's part of every window: take what the others sent it in the last
        one, run to the window's end (or to the event that ends its quota's last flow) and
        say where it is; once all have, the partitions past their quota run on to the
        window's end, or to the run's. What a thread publishes for window w is in the
        slot w % 2, which no thread writes again before every thread has read it."""
        c = self.parts[k]
        stall = int(c.prm[L.P_STALL_PS])
        reached, last = bool(self.quota[k] == 0), (-1, -1)
        status = self.status
        w = 0
        t0 = self.first_ps
        shown = time.perf_counter()
        while True:
            slot = w & 1
            if w:
                self._inject(k, w - 1, [x[4] for x in status[slot ^ 1]])
            self.boxes[slot][k] = []
            c.out = c.outs[slot]
            c.g[L.G_OUT] = 0
            window_end = t0 + self.lookahead - 1
            if not reached and self._advance(k, window_end, NEVER, w) == L.R_DONE:
                reached, last = True, (int(c.g[L.G_NOW_PS]), int(c.g[L.G_LAST_KEY]))
                c.prm[L.P_QUOTA] = NEVER
            if c.g[L.G_DROPS]:
                raise Fallback("a packet was dropped")
            status[slot][k] = self._status(k, reached, last, w)
            self.barrier.wait()
            now = status[slot]
            if all(x[0] for x in now):  # the run ends with the latest quota's last event
                end = max(x[1] for x in now)
                if last != end:
                    self._advance(k, end[0], end[1], w)
                self.end = end
                if k == 0:
                    self.windows = w + 1
                return
            if any(x[0] for x in now):  # past its quota: to the window's end
                if reached:
                    self._advance(k, window_end, NEVER, w)
                    status[slot][k] = self._status(k, reached, last, w)
                self.barrier.wait()
            t0 = min(x[2] for x in status[slot])
            if window_end - max(x[3] for x in status[slot]) > stall:
                raise Fallback("the run stalled")
            w += 1
            if k == 0 and self.progress_fn is not None and time.perf_counter() - shown > 0.5:
                shown = time.perf_counter()
                self.progress_fn(self.progress(window_end))

    def _status(self, k: int, reached: bool, last, w: int) -> tuple:
        """What partition k tells the others after its part of window w: whether it has
        ended its quota's flows, the (time, key) of the event that did, the earliest event
        it has or sent, when it last delivered data, and the rows in its outbox."""
        c = self.parts[k]
        n = int(c.g[L.G_OUT])
        first = self._earliest(k)
        if n:
            first = min(first, int(c.out[:n, L.O_TIME_PS].min()))
        for rows in self.boxes[w & 1][k]:
            first = min(first, int(rows[:, L.O_TIME_PS].min()))
        return reached, last, first, int(c.g[L.G_PROGRESS_T_PS]), n

    def progress(self, now_ps: int):
        from aifabric.sim.driver import Progress

        return Progress(
            now_ns=now_ps // PS,
            flows_done=sum(int(c.g[L.G_DONE]) for c in self.parts),
            flows=len(self.sim.flows),
            events=sum(int(c.g[L.G_EVENTS]) for c in self.parts),
            wall_s=self.sim.wall_s + time.perf_counter() - self._t0,
        )

    # results ---------------------------------------------------------------------------
    def merge(self, stopped: bool = False) -> None:
        """Give `sim` what its one-partition run would hold at the end: each port's and
        node's rows from the partition that owns it, each flow's from its sender's and
        (what its receiver keeps) its receiver's, the counters summed, the port series
        of each port from its owner. A run `stopped` before its end: each partition as
        far as it went (within a window of the others), closed at the earliest."""
        if stopped:
            self.end = (min(int(c.g[L.G_NOW_PS]) for c in self.parts), NEVER)
        self.close_local()
        self.combine()

    def close_local(self) -> None:
        """Close the partitions held here at the run's end, `self.end`."""
        for k in self.local:
            c = self.parts[k]
            c.g[L.G_NOW_PS] = self.end[0]
            c.close()

    def combine(self) -> None:
        """`merge`'s second half: every partition closed, `sim` gets the results."""
        sim, parts = self.sim, self.parts
        f = sim.fabric
        t_end = self.end[0]
        port_part = self.part[f.port_node]
        for k, c in enumerate(parts):
            mine = port_part == k
            sim.pt[mine] = c.pt[mine]
            nodes = self.part == k
            sim.nd[nodes] = c.nd[nodes]
        src, dst = self.part[sim.flows.src], self.part[sim.flows.dst]
        receiver = list(RECEIVER_COLUMNS)
        if not sim.prm[L.P_FINISH_AT_SENDER]:
            receiver += [L.FL_STATE, L.FL_T_END_PS]
        received = (sim.flows.bytes > 0) & (np.diff(sim.path_ptr) > 0)
        for k, c in enumerate(parts):
            sent = src == k
            sim.fl[sent] = c.fl[sent]
            sim.fr[sent] = c.fr[sent]
        for k, c in enumerate(parts):
            got = (dst == k) & received
            for col in receiver:
                sim.fl[got, col] = c.fl[got, col]
        g = parts[0].g.copy()
        for col in SUMMED:
            g[col] = sum(int(c.g[col]) for c in parts)
        samples = t_end // int(sim.prm[L.P_SAMPLE_PS])  # each partition ran every one
        g[L.G_EVENTS] -= (self.n - 1) * samples
        g[L.G_NOW_PS] = t_end
        g[L.G_PROGRESS_T_PS] = max(int(c.g[L.G_PROGRESS_T_PS]) for c in parts)
        sim.g[:] = g
        heap.clear(sim.ev, sim.g)
        entries = []
        for k, c in enumerate(parts):
            for chunk in c.sample_chunks:
                keep = port_part[chunk["port_index"]] == k
                entries.append({name: np.asarray(v)[keep] for name, v in chunk.items()})
        if entries:
            merged = {name: np.concatenate([e[name] for e in entries]) for name in entries[0]}
            order = np.lexsort((merged["port_index"], merged["sample_index"]))
            sim.sample_chunks = [{name: v[order] for name, v in merged.items()}]
        else:
            sim.sample_chunks = []
        sim.sample_rows = parts[0].sample_rows
        sim.closed = True  # `close` has nothing left to do


# columns of a flow's row that its receiver keeps (the rest: its sender)
RECEIVER_COLUMNS = (
    L.FL_DELIV_BYTES,
    L.FL_LAST_CNP_PS,
    L.FL_NAKED,
    L.FL_UNACKED,
    L.FL_T_RECEIVED_PS,
    L.FL_GRANTED_BYTES,
    L.FL_STEPS_DONE,
)
# counters the partitions add up
SUMMED = (
    L.G_DONE,
    L.G_STUCK,
    L.G_EVENTS,
    L.G_HOPS,
    L.G_CNP,
    L.G_DROPS,
    L.G_PFC,
    L.G_ECN,
    L.G_RETX_BYTES,
)
