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

Collectives cross partitions as messages: what a NIC learns of another's part of one (a
buffer's credit, a step of no bytes, a transfer it waits on) is an event the outbox
carries like a frame, a path's propagation or a step or base latency later; windows are
no longer than the shortest of those either (`message_delays`). Adaptive routing is
partitioned too: a switch picks a packet's next hop from its own queues, and the hops
after it, rewritten there, are picked again at each switch. A captured port's frames are
its own partition's (a control packet carries the PSN its receiver took, not its
sender's), so captures merge as they are. A drop's timeout is a message to the NIC that
acts on it, and a go-back-N receiver hears of its flow's loss in another partition a
lookahead later (EV_LOST); a go-back-N timeout and a NAK read only their sender's state
(what the sender heard ACKed), also for a flow that ends at its receiver: its sender goes
on until it hears the last ACK, wherever the flow ended. Drains and restores during the
run are applied by every partition at once, between windows (`_fault_share`,
`_fault_apply`), and so are links and switches taken down: each partition purges its own
ports at the fault's time, into the outbox of the window that begins there (a window
begins at a fault's time), and a frame in flight on a link that went down is lost at the
port it arrives at, its partition's. A sprayed packet's route is chosen whole at its
sender from the packet's own header, so spraying is partitioned like any other routing.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from types import SimpleNamespace

import numpy as np

from aifabric.fabric.faults import routing_after
from aifabric.fabric.model import Fabric, Role
from aifabric.sim import heap, kernel
from aifabric.sim import layout as L
from aifabric.sim import windows as W
from aifabric.sim.driver import zeros_aligned

PS = L.PS_PER_NS
NEVER = kernel.NEVER  # a quota no partition reaches, a key above every key
SLICE = 1 << 22  # events per kernel call, between looks at the stop flag
PROGRESS_S = 0.5  # wall seconds between progress reports of windows that meet by message


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
        elif not why:
            why = lopsided(sim, asked)
    return asked, why


def lopsided(sim, parts: int) -> str | None:
    """Why `parts` partitions would leave cores idle: the flows' senders sit in fewer of
    them (a job on a few racks of a large fabric); a partition with no work spins while
    the others run. None: each holds at least half its share."""
    senders = np.bincount(assign(sim.fabric, parts)[sim.flows.src], minlength=parts)
    if senders.min() * 2 * parts >= len(sim.flows):
        return None
    return (
        f"the flows' senders sit mostly in one part of the fabric (auto: each of {parts} "
        f"partitions would need {len(sim.flows) // (2 * parts):,} or more; the fewest has "
        f"{int(senders.min()):,})"
    )


def out_rows(sim, far: np.ndarray, lookahead: int) -> int:
    """Outbox rows a partition can need in one window: every link into another partition
    sends at most a frame per smallest frame's serialization (a PFC frame, an ACK)."""
    cut = np.flatnonzero(far > 0)
    smallest = min(L.PFC_WIRE_BYTES, int(sim.prm[L.P_OVERHEAD_BYTES]))
    ser = (smallest * 8 * 10**12 + sim.pt[cut, L.PT_RATE_BPS] - 1) // sim.pt[cut, L.PT_RATE_BPS]
    return int((lookahead // ser + 2).sum()) + 2 * int(sim.prm[L.P_OUT_RESERVE])


def why_not(sim, until_ns) -> str | None:
    """Why `sim` runs on one partition whatever it asks for (None: it may run on several)."""
    if until_ns is not None:
        return "a run to a given time"
    if len(sim.flows) == 0:
        return "no flows"
    return None


def message_delays(sim, part: np.ndarray) -> dict[str, int]:
    """The shortest delay of each kind of message between two partitions (a kind no message
    of crosses is left out). A flow hears of a flow it waits on a step or base latency
    after that one arrived or completed; a stream's ends tell each other releases a path's
    propagation later; a drop's timeout comes to the NIC that acts on it."""
    t, fl = sim.flows, sim.fl
    out = {"the retransmission timeout": int(sim.prm[L.P_RTO_PS])}
    waits = np.diff(sim.dep_ptr)
    if waits.any():
        f = np.repeat(np.arange(len(t), dtype=np.int64), waits)  # f: a flow h waits on
        h = sim.dep
        same = fl[f, L.FL_OP] == fl[h, L.FL_OP]
        empty = (t.bytes[f] == 0) | (np.diff(sim.path_ptr)[f] == 0)
        at_sender = np.where(same, empty, empty | bool(sim.prm[L.P_FINISH_AT_SENDER]))
        where = np.where(at_sender, t.src[f], t.dst[f])
        delay = np.where(same, fl[h, L.FL_LAT_PS], fl[h, L.FL_BASE_PS])
        cross = part[where] != part[t.src[h]]
        if cross.any():
            out["a transfer's wait for one at another partition"] = int(delay[cross].min())
    if len(sim.gr):
        f0 = sim.gr[:, L.GR_FLOW0]
        cross = part[t.src[f0]] != part[t.dst[f0]]
        if cross.any():
            out["a collective's stream between partitions"] = int(sim.gr[cross, L.GR_PROP_PS].min())
    return out


class PartitionedRun:
    """`Simulation.run` on `parts` partitions (`sim` keeps its state until `merge`)."""

    too_few_cores = 0  # the cores, when fewer than the partitions: they met from Python

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
        # a window is no longer than any message between partitions takes either: what a
        # partition hears in one window is for a later one
        self.shortened_by = None
        for what, delay in message_delays(sim, self.part).items():
            if delay <= 0:
                raise Fallback(f"{what} takes no time (a message must take a window's time)")
            if delay < self.lookahead:
                self.lookahead, self.shortened_by = delay, what
        self.ends = self._ends(sim)
        self.quota = np.bincount(self.ends, minlength=self.n)
        far = far_parts(f, self.part)
        # every partition's outbox of even windows and of odd ones: the others read one
        # while a partition writes the other
        reserve = int(sim.prm[L.P_OUT_RESERVE])
        rows = max(min(out_rows(sim, far, self.lookahead), MAX_OUT_ROWS), reserve + 4)
        # the partitions this process holds (aifabric.sim.mpi: a rank's share), in order
        self.local = list(range(self.n)) if local is None else list(local(self.n))
        self.box = np.zeros((2, len(self.local), rows, L.O_N), dtype=np.int64)
        self.parts = [None] * self.n
        for i, k in enumerate(self.local):
            self.parts[k] = self._partition(k, far, i)
        self.end: tuple[int, int] | None = None  # the (time, key) of the run's last event
        self.spills = 0  # outboxes that filled in a window (their rows kept aside)
        self.boxes = [[[] for _ in range(self.n)] for _ in range(2)]  # those rows, by parity
        self.windows = 0
        self.merged = False

    def _ends(self, c) -> np.ndarray:
        """The partition each flow of `c` (the simulation or a partition) ends in: its
        sender's where the sender sees its end (no bytes, no path, finish at the sender),
        else its receiver's."""
        t = c.flows
        at_sender = (t.bytes == 0) | (np.diff(c.path_ptr) == 0) | bool(c.prm[L.P_FINISH_AT_SENDER])
        return np.where(at_sender, self.part[t.src], self.part[t.dst])

    def _partition(self, k: int, far: np.ndarray, i: int):
        """A copy of the simulation's state holding partition k's first events only (its
        outboxes: `self.box[:, i]`)."""
        sim = self.sim
        c = copy.copy(sim)
        names = ("g", "prm", "pt", "fl", "fr", "nd", "act", "pk", "pc", "cap", "gr", "gx")
        for name in names:
            setattr(c, name, getattr(sim, name).copy())
        # the event list and the sample buffer (fat-tree-k16: 10 and 16 MB) from zero pages
        # the kernel maps only where the run writes them; copied or zeroed here, every page
        # was written before the first event (two partitions of k16: 0.03-0.67 s, now 0.02)
        samples = int(sim.g[L.G_SAMPLES])
        c.smp = np.zeros(sim.smp.shape, dtype=sim.smp.dtype)
        c.smp[:, :samples] = sim.smp[:, :samples]
        c._load, c._rnd = sim._load.copy(), sim._rnd.copy()
        c.nd[:, L.ND_PART] = self.part
        c.prm[L.P_PART] = k
        c.ev = zeros_aligned(sim.ev.shape, sim.ev.dtype)
        c.outs = [self.box[0, i], self.box[1, i]]
        c.out = c.outs[0]
        c.sample_chunks, c.capture_chunks, c.sample_rows, c.wall_s = [], [], 0, 0.0
        # faults during the run: each partition applies them to its copy (`_fault_apply`)
        c.pending_faults, c.applied_faults = list(sim.pending_faults), list(sim.applied_faults)
        c.route_epoch = sim.route_epoch.copy()
        c.pt[:, L.PT_FAR_PART] = far
        c.prm[L.P_PARTITIONED] = 1
        c.prm[L.P_LOOKAHEAD_PS] = self.lookahead
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

    def _fault_t(self, k: int) -> int:
        """The time of partition k's next fault (NEVER: none left)."""
        pending = self.parts[k].pending_faults
        return pending[0].at_ns * PS if pending else NEVER

    # faults during the run: every partition stops before the fault's time (windows end
    # there), each finds the flows it sends that the fault re-routes (only a flow's sender
    # knows whether it has started), they share them, and each re-routes them all: a
    # flow's route is read at both ends (its receiver's ACKs go back along it) ----------
    def _fault_share(self, k: int) -> tuple:
        """Partition k's part of its next fault: the routing after it and the flows it sends
        that the fault re-routes."""
        c, t = self.parts[k], self.sim.flows
        fault = c.pending_faults[0]
        routing = routing_after(fault, c.routing)
        return routing, c.moved_by(fault, routing, senders=self.part[t.src] == k)

    def _fault_apply(self, k: int, routing, shares) -> None:
        """Partition k applies its next fault, re-routing the flows every partition found
        (`shares`). A flow underway may then arrive out of order: every partition marks it
        (`Simulation._apply`), so its receiver checks, as after a loss."""
        c = self.parts[k]
        which = np.sort(np.concatenate(shares))
        c._apply(c.pending_faults.pop(0), which=which, routing=routing)
        if (self._ends(c) != self.ends).any():
            # a flow left with no path ends at its sender, one given a path at its receiver
            raise Fallback("a fault during the run moved where a flow ends (a path lost or found)")

    def _faults_spinning(self, k: int) -> None:
        """Partition k's thread at a window that begins at or after its next fault's time
        (W_FAULT): the faults up to there, with the other threads."""
        c = self.parts[k]
        c.out = c.outs[int(c.ctl[W.C_W]) & 1]  # what a purge sends goes out with this window
        while self._fault_t(k) <= c.ctl[W.C_T0]:
            routing, which = self._fault_share(k)
            self.shares[k] = which
            self.fault_barrier.wait()
            shares = list(self.shares)
            self.fault_barrier.wait()  # every thread has read the shares: they may change
            self._fault_apply(k, routing, shares)
        c.ctl[W.C_FAULT_T] = self._fault_t(k)

    def _drain_out(self, k: int, w: int) -> None:
        """The outbox is nearly full: its rows go to the window's overflow list."""
        c = self.parts[k]
        n = int(c.g[L.G_OUT])
        if n:
            self.boxes[w & 1][k].append(c.out[:n].copy())
            self.spills += 1
            c.g[L.G_OUT] = 0

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
        have = cores()
        self.too_few_cores = have if n > have else 0
        if not self.too_few_cores:
            self._run_spinning(progress)
            return
        ranks = ThreadRanks(n)
        self._each_thread(lambda k: self._by_message(ranks, k, progress))

    def _by_message(self, ranks: ThreadRanks, k: int, progress) -> None:
        """Partition k's thread when the threads meet by message (`Windows`)."""
        windows = Windows(self, ranks.rank(k), [k])
        try:
            windows.run(progress if k == 0 else None)
        except (Fallback, Stopped, PartitionFailed):
            if k == 0:  # the same on every thread: partition 0's raises it
                raise
        except threading.BrokenBarrierError:
            if k == 0 and self.failed:
                raise self.failed[0] from None
        except BaseException as e:  # noqa: BLE001 (handed to the caller: `run` raises it)
            if not windows.finished:  # what stopped it, else the others would wait forever
                ranks.abort()
            if k == 0:
                raise
            self.failed.append(e)

    def _run_spinning(self, progress) -> None:
        n = self.n
        self.sync = np.zeros((2, n, W.Y_N), dtype=np.int64)
        self.flags = np.zeros(n + 1, dtype=np.int64)  # flags[n]: a thread gave up
        self.spilled = [[(-1, [])] * n for _ in range(2)]  # by parity: (window, rows)
        first = min(min(self._earliest(k) for k in range(n)), self._fault_t(0))
        for k, c in enumerate(self.parts):
            c.ctl = np.zeros(W.C_N, dtype=np.int64)
            c.ctl[W.C_T0] = first
            c.ctl[W.C_REACHED] = int(self.quota[k] == 0)
            c.ctl[W.C_LAST_T] = c.ctl[W.C_LAST_KEY] = -1
            c.ctl[W.C_STALL_PS] = c.prm[L.P_STALL_PS]
            c.ctl[W.C_FAULT_T] = self._fault_t(k)
            c.ctl[W.C_YIELD_EVERY] = W.YIELD_EVENTS
        self.progress_fn = progress
        self.shares: list = [None] * n
        self.fault_barrier = threading.Barrier(n)
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
            loop = W.loop_address(c._state())
            while True:
                base = c._state()
                code = W.windows(
                    base._replace(out=c.outs[0]), base._replace(out=c.outs[1]), k, self.n,
                    self.lookahead, self.box, self.sync, self.flags, c.ctl, SLICE, loop,
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
                elif code == W.W_FAULT:
                    self._faults_spinning(k)
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
            self.fault_barrier.abort()  # a thread waiting there for this one gives up too

    def progress(self, now_ps: int, done: int | None = None, events: int | None = None):
        """The run's progress at `now_ps`: flows done and events, summed over the
        partitions held here unless given (the windows' statuses)."""
        from aifabric.sim.driver import Progress

        if done is None:
            done = sum(int(c.g[L.G_DONE]) for c in self.parts)
            events = sum(int(c.g[L.G_EVENTS]) for c in self.parts)
        return Progress(
            now_ns=now_ps // PS,
            flows_done=done,
            flows=len(self.sim.flows),
            events=events,
            wall_s=self.sim.wall_s + time.perf_counter() - self._t0,
        )

    # results ---------------------------------------------------------------------------
    def merge(self, stopped: bool = False) -> None:
        """Give `sim` what its one-partition run would hold at the end: each port's and
        node's rows from the partition that owns it, each flow's from its sender's and
        (what its receiver keeps) its receiver's, the counters summed, the port series
        of each port from its owner. A run `stopped` before its end: each partition as
        far as it went (within a window of the others), closed at the earliest."""
        if self.merged:  # by the windows already (a stop or failure: `Windows.finish`)
            return
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
        if sim.pending_faults:
            self._combine_routes()
        # what a flow's receiver kept, also for a flow whose path a fault took away; and
        # where it ends at its receiver, its end (its state is its sender's)
        carries = sim.flows.bytes > 0
        ends = np.diff(sim.path_ptr) > 0 if not sim.prm[L.P_FINISH_AT_SENDER] else None
        for k, c in enumerate(parts):
            sent = src == k
            sim.fl[sent] = c.fl[sent]
            sim.fr[sent] = c.fr[sent]
        for k, c in enumerate(parts):
            got = (dst == k) & carries
            for col in RECEIVER_COLUMNS:
                sim.fl[got, col] = c.fl[got, col]
            if ends is not None:
                got &= ends
                sim.fl[got, L.FL_T_END_PS] = c.fl[got, L.FL_T_END_PS]
        g = parts[0].g.copy()
        for col in SUMMED:
            g[col] = sum(int(c.g[col]) for c in parts)
        samples = t_end // int(sim.prm[L.P_SAMPLE_PS])  # each partition ran every one
        g[L.G_EVENTS] -= (self.n - 1) * samples
        g[L.G_NOW_PS] = t_end
        g[L.G_PROGRESS_T_PS] = max(int(c.g[L.G_PROGRESS_T_PS]) for c in parts)
        sim.g[:] = g
        heap.clear(sim.ev, sim.g)
        # the port series, a column at a time, each partition's column freed once taken (a
        # long run's series are most of its memory: one copy and a column at a time)
        chunks = [(k, chunk) for k, c in enumerate(parts) for chunk in c.sample_chunks]
        for c in parts:
            c.sample_chunks = []
        merged: dict = {}
        if chunks:
            keep = [port_part[chunk["port_index"]] == k for k, chunk in chunks]
            for name in list(chunks[0][1]):
                columns = (chunk.pop(name) for _, chunk in chunks)
                merged[name] = np.concatenate(
                    [np.asarray(v)[m] for v, m in zip(columns, keep, strict=True)]
                )
            del chunks, keep
            order = np.lexsort((merged["port_index"], merged["sample_index"]))
            for name in merged:
                merged[name] = merged[name][order]
        sim.sample_chunks = [merged] if merged else []
        sim.sample_rows = parts[0].sample_rows
        # a port's frames are all its partition's, in its order: in time order, as on one
        caps = [chunk for c in parts for chunk in c.capture_chunks]
        if caps:
            caps = np.concatenate(caps)
            caps = caps[np.argsort(caps[:, L.CP_TIME], kind="stable")]
        sim.capture_chunks = [caps] if len(caps) else []
        sim.closed = True  # `close` has nothing left to do

    def _combine_routes(self) -> None:
        """After faults during the run: every partition re-routed the same flows the same
        way (`_fault_apply`), so partition 0's routes, routing and faults are the run's."""
        sim, first = self.sim, self.parts[0]
        sim.path_ptr, sim.path_port, sim.route_epoch = (
            first.path_ptr, first.path_port, first.route_epoch
        )  # fmt: skip
        sim.routing = first.routing
        sim.applied_faults, sim.pending_faults = first.applied_faults, first.pending_faults


class Stopped(Exception):
    """Another rank's stop ended this rank's windows (rank 0 raises what stopped it)."""


class PartitionFailed(RuntimeError):
    """A rank's part of a window failed; every rank's windows ended (rank 0 says which)."""


class ThreadRanks:
    """What `Windows` needs of an MPI communicator (`alltoall`), for the threads of this
    process: thread k is rank k. What a thread sends in a call is in the slot of that
    call's parity, which no thread writes again before every thread has read it."""

    def __init__(self, size: int):
        self.size = size
        self.slots = [[None] * size for _ in range(2)]
        self.calls = [0] * size
        self.barrier = threading.Barrier(size)

    def rank(self, k: int) -> _ThreadRank:
        return _ThreadRank(self, k)

    def abort(self) -> None:
        self.barrier.abort()


class _ThreadRank:
    shared = True  # the ranks share this process's memory: its partitions

    def __init__(self, ranks: ThreadRanks, rank: int):
        self.ranks, self.rank, self.size = ranks, rank, ranks.size

    def alltoall(self, items: list) -> list:
        r = self.ranks
        slot = r.slots[r.calls[self.rank] & 1]
        r.calls[self.rank] += 1
        slot[self.rank] = items
        r.barrier.wait()
        return [slot[j][self.rank] for j in range(self.size)]


class Windows:
    """One rank's part of a partitioned run's windows where the partitions meet by message,
    through `ranks.alltoall`: the ranks of an MPI job (aifabric.sim.mpi) or this process's
    threads (`ThreadRanks`: with more partitions than cores, where spinning would steal
    the cores the others wait for). The rank holds the partitions `local` of `run`.

    Every window: each partition takes what arrived for it, runs to the window's end (or
    to the event that ends its quota's last flow), and the ranks tell each other, in one
    alltoall, where each partition is and the frames bound for each other's partitions.
    Once every partition has ended its quota, the run ends with the latest quota's last
    event; once some have, those run on to the window's end (a second exchange). What
    goes wrong on a rank (a fallback, an error, rank 0's stop) is known to every rank at
    the same exchange and ends every rank's windows alike."""

    def __init__(self, run: PartitionedRun, ranks, local: list[int]):
        self.run_, self.ranks, self.local = run, ranks, local
        f = run.sim.fabric
        far, near = far_parts(f, run.part), run.part[f.port_node]
        # the ranks each partition here sends frames to (partition p is on rank p mod N)
        self.reach = {
            k: sorted({int(p - 1) % ranks.size for p in np.unique(far[(near == k) & (far > 0)])})
            for k in local
        }
        self.reached = {k: bool(run.quota[k] == 0) for k in local}
        self.last = dict.fromkeys(local, (-1, -1))
        self.incoming: dict[int, list] = {k: [] for k in local}
        self.sent = dict.fromkeys(local, (0, 0))  # (rows kept aside, outbox rows) sent
        self.stop_error: BaseException | None = None
        self.finished = False

    def run(self, progress=None) -> None:
        """Every window until the end (`run_.end`); `progress` is called on rank 0, every
        half second; what it raises stops every rank."""
        r = self.run_
        stall = int(r.sim.prm[L.P_STALL_PS])
        first = min((r._earliest(k) for k in self.local), default=NEVER)
        faults = [f.at_ns * PS for f in r.sim.pending_faults]  # every partition's
        t0 = min([*self.ranks.alltoall([first] * self.ranks.size), *faults[:1]])
        w, shown = 0, time.perf_counter()
        while True:
            for k in self.local:  # window w's outbox, which a fault's purge may fill first
                c = r.parts[k]
                c.out = c.outs[w & 1]
                c.g[L.G_OUT] = 0
            while faults and faults[0] <= t0:
                self._fault(max(w - 1, 0))
                faults.pop(0)
            window_end = min(t0 + r.lookahead, faults[0] if faults else NEVER) - 1
            st = self._exchange(w, self._first_half, w, window_end)
            if all(s[0] for s in st.values()):  # the end: the latest quota's last event
                end = max(s[1] for s in st.values())
                self._exchange(w, self._to_end, end, w)
                r.end, r.windows = end, w + 1
                return
            if any(s[0] for s in st.values()):
                st = self._exchange(w, self._past_quota, w, window_end)
            t0 = min([*(s[2] for s in st.values()), *faults[:1]])
            if window_end - max(s[3] for s in st.values()) > stall:
                raise Fallback("the run stalled")
            w += 1
            if progress is not None and time.perf_counter() - shown > PROGRESS_S:
                shown = time.perf_counter()
                try:
                    progress(self._progress(window_end, st))
                except BaseException as e:  # noqa: BLE001 (stops every rank: `_exchange`)
                    self.stop_error = e

    def _fault(self, w: int) -> None:
        """Every partition has run every event before the next fault's time: they share
        the flows it re-routes (`PartitionedRun._fault_share`), then each applies it."""
        r, routings = self.run_, {}

        def share() -> dict:
            out = {}
            for k in self.local:
                routings[k], out[k] = r._fault_share(k)
            return out

        shares = list(self._exchange(w, share).values())
        for k in self.local:
            r._fault_apply(k, routings[k], shares)

    # one window's halves ----------------------------------------------------------------
    def _first_half(self, w: int, window_end: int) -> dict:
        r, out = self.run_, {}
        incoming, self.incoming = self.incoming, {k: [] for k in self.local}
        for k in self.local:
            c = r.parts[k]
            for rows in incoming[k]:
                r._take(k, rows, len(rows))
            r.boxes[w & 1][k] = []
            self.sent[k] = (0, 0)
            if not self.reached[k] and r._advance(k, window_end, NEVER, w) == L.R_DONE:
                self.reached[k] = True
                self.last[k] = (int(c.g[L.G_NOW_PS]), int(c.g[L.G_LAST_KEY]))
                c.prm[L.P_QUOTA] = NEVER
            out[k] = self._said(k, w)
        return out

    def _past_quota(self, w: int, window_end: int) -> dict:
        out = {}
        for k in self.local:
            if self.reached[k]:
                self.run_._advance(k, window_end, NEVER, w)
            out[k] = self._said(k, w)
        return out

    def _to_end(self, end: tuple[int, int], w: int) -> dict:
        for k in self.local:
            if self.last[k] != end:
                self.run_._advance(k, end[0], end[1], w)
        return {}

    def _said(self, k: int, w: int) -> tuple:
        """What partition k tells the others after its part of window w: whether it has
        ended its quota's flows, the (time, key) of the event that did, the earliest event
        it has or sent, when it last delivered data; and for progress, its flows done,
        events and time."""
        r = self.run_
        c = r.parts[k]
        n = int(c.g[L.G_OUT])
        first = r._earliest(k)
        if n:
            first = min(first, int(c.out[:n, L.O_TIME_PS].min()))
        for rows in r.boxes[w & 1][k]:
            first = min(first, int(rows[:, L.O_TIME_PS].min()))
        return (
            self.reached[k],
            self.last[k],
            first,
            int(c.g[L.G_PROGRESS_T_PS]),
            int(c.g[L.G_DONE]),
            int(c.g[L.G_EVENTS]),
        )

    # the exchanges ----------------------------------------------------------------------
    def _exchange(self, w: int, work, *args) -> dict:
        """Do this rank's `work(*args)`, then tell every rank what came of it (every
        partition's status) and send each the frames its partitions get from this rank's
        in window w; take those sent to this rank's (`self.incoming`, for the next
        window)."""
        said: dict = {}
        trouble = None
        if self.stop_error is not None:
            trouble = ("stop", "")
        else:
            try:
                said = work(*args)
            except Fallback as e:
                trouble = ("fallback", str(e))
            except Exception as e:  # noqa: BLE001 (every rank must learn of it)
                trouble = ("error", f"{type(e).__name__}: {e}")
        size = self.ranks.size
        rows = self._rows(w) if trouble is None else [[] for _ in range(size)]
        heard = self.ranks.alltoall([(trouble, said, x) for x in rows])
        status: dict = {}
        for q, (bad, part, _) in enumerate(heard):
            status.update(part)
            if bad is None:
                continue
            kind, text = bad
            if kind == "fallback":
                raise Fallback(text)
            self.finish(stopped=True)
            if kind == "stop":
                if self.stop_error is not None:
                    raise self.stop_error
                raise Stopped()
            who = "partition" if self.ranks.shared else "MPI rank"
            raise PartitionFailed(f"{who} {q} failed: {text}")
        sent = sorted((x for _, _, got in heard for x in got), key=lambda x: x[0])
        for _, got in sent:  # by sending partition; each takes its own (kernel.inject)
            for k in self.local:
                self.incoming[k].append(got)
        return status

    def _rows(self, w: int) -> list[list]:
        """For each rank, the (partition, rows) of this rank's partitions bound for its
        partitions that are not sent yet: the rows kept aside, then the outbox's."""
        r, size = self.run_, self.ranks.size
        to: list[list] = [[] for _ in range(size)]
        for k in self.local:
            c = r.parts[k]
            n, aside = int(c.g[L.G_OUT]), r.boxes[w & 1][k]
            spilled, done = self.sent[k]
            mine = [*aside[spilled:], c.out[done:n]]
            self.sent[k] = (len(aside), n)
            rows = np.concatenate(mine) if len(mine) > 1 else mine[0]
            if not len(rows):
                continue
            if len(self.reach[k]) == 1:  # its links lead to one rank's partitions
                to[self.reach[k][0]].append((k, rows))
                continue
            dest = rows[:, L.O_PART] % size
            for q in self.reach[k]:
                to[q].append((k, rows[dest == q]))
        return to

    def _progress(self, now_ps: int, st: dict):
        done, events = (sum(s[i] for s in st.values()) for i in (4, 5))
        return self.run_.progress(now_ps, done, events)

    # results ----------------------------------------------------------------------------
    def finish(self, stopped: bool = False) -> None:
        """Every rank closes its partitions at the run's end (a stopped run: the earliest
        partition's time) and hands rank 0 what they own (a copy, across processes);
        rank 0 merges them (`PartitionedRun.combine`)."""
        if self.finished:
            return
        self.finished = True
        r, ranks = self.run_, self.ranks
        if stopped:
            now = min((int(r.parts[k].g[L.G_NOW_PS]) for k in self.local), default=NEVER)
            r.end = (min(ranks.alltoall([now] * ranks.size)), NEVER)
        r.close_local()
        mine: dict = {}
        if not ranks.shared and ranks.rank:
            mine = {
                k: SimpleNamespace(
                    g=c.g,
                    pt=c.pt,
                    nd=c.nd,
                    fl=c.fl,
                    fr=c.fr,
                    sample_chunks=c.sample_chunks,
                    sample_rows=c.sample_rows,
                    capture_chunks=c.capture_chunks,
                )  # fmt: skip
                for k in self.local
                if (c := r.parts[k])
            }
        spills = 0 if ranks.shared else r.spills
        heard = ranks.alltoall([(mine, spills) if q == 0 else None for q in range(ranks.size)])
        r.wall_s = time.perf_counter() - r._t0
        if ranks.rank:
            return
        for part, spilled in heard[1:]:
            for k, c in part.items():
                r.parts[k] = c
            r.spills += spilled
        r.combine()
        r.merged = True


# columns of a flow's row that its receiver keeps (the rest: its sender)
RECEIVER_COLUMNS = (
    L.FL_DELIV_BYTES,
    L.FL_MAY_REORDER,
    L.FL_LAST_CNP_PS,
    L.FL_NAKED,
    L.FL_UNACKED,
    L.FL_RX_PSN,
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
