"""One simulation on the ranks of an MPI job: `mpirun -n N aifabric run SCENARIO`, on one
machine or many.

Rank 0 is the run: it loads the scenario, builds the simulation, prints and writes the run
directory exactly as without MPI. The other ranks only serve (`serve`). When rank 0's
simulation runs on partitions (aifabric.sim.partition), it sends the others its state at
the start; every rank builds the partitions it holds (partition k on rank k mod N) and
runs them window by window as a thread would, except that between windows the ranks
exchange, in one alltoall, what they say of their partitions and the frames bound for
each other's. At the end each rank closes its partitions and sends rank 0 what
they own, which rank 0 merges as one process merges its threads' partitions: the results
are the same as on one partition. A run that cannot be partitioned, or that falls back to
one partition midway, runs on rank 0 alone; once rank 0 is done it tells the others, and
they end.

mpi4py is imported only under an MPI launcher with more than one rank
(aifabric.fabric.launcher).
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.launcher import SIZE_VARIABLES, launched_ranks
from aifabric.sim import layout as L
from aifabric.sim.partition import NEVER, Fallback, PartitionedRun, far_parts

PS = L.PS_PER_NS
TAG_WORK = 7  # rank 0 to the others: a simulation to run on partitions, or None: the end


@dataclass
class World:
    comm: object  # mpi4py's COMM_WORLD
    rank: int
    size: int
    released: bool = False


_world: World | None = None
_looked = False


def world() -> World | None:
    """The MPI job this process is a rank of, when it has more than one rank (None
    otherwise, mpi4py not imported)."""
    global _world, _looked
    if _looked:
        return _world
    _looked = True
    if launched_ranks() < 2:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise AifabricError(
            f"started as one of {launched_ranks()} MPI ranks, but mpi4py is not installed "
            "(Debian: apt-get install python3-mpi4py; or pip install mpi4py)"
        ) from None
    comm = MPI.COMM_WORLD
    _world = World(comm, comm.Get_rank(), comm.Get_size())
    for name in SIZE_VARIABLES:  # a process this one starts is not a rank of the job
        os.environ.pop(name, None)
    if _world.size < 2:
        _world = None
    elif _world.rank == 0:
        atexit.register(release)  # however rank 0 ends, the others end too
    return _world


def follower() -> bool:
    """True on an MPI rank other than 0: it serves rank 0 (`serve`) and writes nothing."""
    w = world()
    return w is not None and w.rank != 0


def release() -> None:
    """Rank 0: tell the other ranks that no more work comes (once)."""
    w = _world
    if w is None or w.rank != 0 or w.released:
        return
    w.released = True
    for r in range(1, w.size):
        w.comm.send(None, dest=r, tag=TAG_WORK)
    from mpi4py import MPI

    if not MPI.Is_finalized():  # the program may end without Python's teardown
        MPI.Finalize()


def partitions(asked: int | str, ranks: int) -> int:
    """The partitions of a run on `ranks` MPI ranks: one a rank for "auto", else as asked."""
    return ranks if asked == "auto" else int(asked)


def start(sim, parts: int) -> MpiRun:
    """Rank 0: send the other ranks the simulation to run on `parts` partitions, and hold
    its own share (PartitionedRun's Fallback: on every rank alike)."""
    w = world()
    state = pickle.dumps((sim, parts), protocol=pickle.HIGHEST_PROTOCOL)
    for r in range(1, w.size):
        w.comm.send(state, dest=r, tag=TAG_WORK)
    return MpiRun(sim, parts, w)


def serve() -> None:
    """A rank other than 0: run its share of each partitioned run rank 0 sends, until
    rank 0 says it is done. A signal (the launcher's Ctrl-C) is rank 0's to act on: this
    rank goes on until rank 0 stops the run."""
    w = world()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        while not w.comm.Iprobe(source=0, tag=TAG_WORK):
            time.sleep(0.005)  # waiting without spinning: rank 0 may be compiling
        work = w.comm.recv(source=0, tag=TAG_WORK)
        if work is None:
            return
        sim, parts = pickle.loads(work)
        try:
            run = MpiRun(sim, parts, w)
        except Fallback:
            continue  # rank 0 found the same and runs it alone
        try:
            run.run()
        except Fallback:
            continue
        except (RuntimeError, Stopped):  # rank 0 says so, after the stopped merge
            continue
        if not run.merged:
            run.merge()


class Stopped(Exception):
    """Rank 0 was asked to stop (its progress hook raised)."""


class MpiRun(PartitionedRun):
    """`PartitionedRun` across the ranks of an MPI job: this rank holds partitions
    rank, rank + N, ...; the windows' exchanges go through MPI."""

    def __init__(self, sim, parts: int, w: World):
        self.world = w
        self.merged = False
        super().__init__(sim, parts, local=lambda n: range(w.rank, n, w.size))
        self.boxes = [[[] for _ in range(self.n)] for _ in range(2)]
        # the ranks each partition held here sends frames to (through its cut links)
        f = sim.fabric
        far = far_parts(f, self.part)
        near = self.part[f.port_node]
        self.reach = {
            k: sorted({int(p - 1) % w.size for p in np.unique(far[(near == k) & (far > 0)])})
            for k in self.local
        }

    def run(self, progress=None) -> None:
        """Every window: take what arrived, run to the window's end, say where each
        partition is; then as `PartitionedRun._windows`, with the statuses of every rank's
        partitions. Raises Fallback on every rank alike; a failure or stop on any rank
        ends every rank's windows, merges what ran, and raises on rank 0."""
        self._t0 = time.perf_counter()
        comm = self.world.comm
        self.reached = {k: bool(self.quota[k] == 0) for k in self.local}
        self.last = {k: (-1, -1) for k in self.local}
        self.incoming: dict[int, list] = {k: [] for k in self.local}
        self.sent = dict.fromkeys(self.local, 0)  # outbox rows already sent, by partition
        stall = int(self.sim.prm[L.P_STALL_PS])
        t0 = comm.allreduce(min((self._earliest(k) for k in self.local), default=NEVER), op=_min())
        self.windows, w, shown = 0, 0, time.perf_counter()
        self.stop_error: BaseException | None = None
        while True:
            window_end = t0 + self.lookahead - 1
            st = self._exchange(w, self._first_half, w, window_end)
            if all(s[0] for s in st.values()):  # the end: the latest quota's last event
                end = max(s[1] for s in st.values())
                self._exchange(w, self._to_end, end, w)
                self.end, self.windows = end, w + 1
                return
            if any(s[0] for s in st.values()):
                st = self._exchange(w, self._past_quota, w, window_end)
            t0 = min(s[2] for s in st.values())
            if window_end - max(s[3] for s in st.values()) > stall:
                raise Fallback("the run stalled")
            w += 1
            if progress is not None and time.perf_counter() - shown > 0.5:
                shown = time.perf_counter()
                try:
                    progress(self._progress(window_end, st))
                except BaseException as e:  # noqa: BLE001 (stops every rank: `_exchange`)
                    self.stop_error = e

    # one window's halves ----------------------------------------------------------------
    def _first_half(self, w: int, window_end: int) -> dict:
        out = {}
        incoming, self.incoming = self.incoming, {k: [] for k in self.local}
        for k in self.local:
            c = self.parts[k]
            for rows in incoming[k]:
                self._take(k, rows, len(rows))
            self.boxes[w & 1][k] = []
            self.sent[k] = 0
            c.out = c.outs[w & 1]
            c.g[L.G_OUT] = 0
            if not self.reached[k] and self._advance(k, window_end, NEVER, w) == L.R_DONE:
                self.reached[k] = True
                self.last[k] = (int(c.g[L.G_NOW_PS]), int(c.g[L.G_LAST_KEY]))
                c.prm[L.P_QUOTA] = NEVER
            if c.g[L.G_DROPS]:
                raise Fallback("a packet was dropped")
            out[k] = self._said(k, w)
        return out

    def _past_quota(self, w: int, window_end: int) -> dict:
        out = {}
        for k in self.local:
            if self.reached[k]:
                self._advance(k, window_end, NEVER, w)
            out[k] = self._said(k, w)
        return out

    def _to_end(self, end: tuple[int, int], w: int) -> dict:
        for k in self.local:
            if self.last[k] != end:
                self._advance(k, end[0], end[1], w)
        return {}

    def _said(self, k: int, w: int) -> tuple:
        c = self.parts[k]
        return (
            *self._status(k, self.reached[k], self.last[k], w),
            int(c.g[L.G_DONE]),
            int(c.g[L.G_EVENTS]),
            int(c.g[L.G_NOW_PS]),
        )

    # the exchanges ----------------------------------------------------------------------
    def _exchange(self, w: int, work, *args) -> dict:
        """Do this rank's `work(*args)`, then tell every rank what came of it (every
        partition's status) and send each the frames its partitions get from this rank's
        in window w; take those sent to this rank's (`self.incoming`, for the next
        window). What went wrong on any rank (a fallback, an error, rank 0's stop) is
        known to all at once and ends every rank's windows alike."""
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
        rows = self._rows(w) if trouble is None else [[] for _ in range(self.world.size)]
        heard = self.world.comm.alltoall([(trouble, said, r) for r in rows])
        status: dict = {}
        for r, (bad, part, _) in enumerate(heard):
            status.update(part)
            if bad is None:
                continue
            kind, text = bad
            if kind == "fallback":
                raise Fallback(text)
            self.merge(stopped=True)
            if kind == "stop":
                if self.stop_error is not None:
                    raise self.stop_error
                raise Stopped()
            raise RuntimeError(f"MPI rank {r} failed: {text}")
        sent = sorted((x for _, _, rows in heard for x in rows), key=lambda x: x[0])
        for _, got in sent:  # by sending partition; each takes its own (kernel.inject)
            for k in self.local:
                self.incoming[k].append(got)
        return status

    def _rows(self, w: int) -> list[list]:
        """For each rank, the (partition, rows) of this rank's partitions bound for its
        partitions that are not sent yet: the rows kept aside, then the outbox's."""
        size = self.world.size
        to: list[list] = [[] for _ in range(size)]
        for k in self.local:
            c = self.parts[k]
            n = int(c.g[L.G_OUT])
            mine = [*self.boxes[w & 1][k], c.out[self.sent[k] : n]]
            self.boxes[w & 1][k], self.sent[k] = [], n
            r = np.concatenate(mine) if len(mine) > 1 else mine[0]
            if not len(r):
                continue
            ranks = self.reach[k]
            if len(ranks) == 1:  # its links lead to one other rank's partitions
                to[ranks[0]].append((k, r))
                continue
            dest = r[:, L.O_PART] % size
            for q in ranks:
                to[q].append((k, r[dest == q]))
        return to

    def _progress(self, now_ps: int, st: dict):
        from aifabric.sim.driver import Progress

        return Progress(
            now_ns=now_ps // PS,
            flows_done=sum(s[5] for s in st.values()),
            flows=len(self.sim.flows),
            events=sum(s[6] for s in st.values()),
            wall_s=self.sim.wall_s + time.perf_counter() - self._t0,
        )

    # results ----------------------------------------------------------------------------
    def merge(self, stopped: bool = False) -> None:
        """Every rank closes its partitions at the run's end (a stopped run: the earliest
        partition's time) and sends rank 0 what they own; rank 0 merges them."""
        if self.merged:
            return
        self.merged = True
        comm = self.world.comm
        if stopped:
            now = min(int(self.parts[k].g[L.G_NOW_PS]) for k in self.local)
            self.end = (comm.allreduce(now, op=_min()), NEVER)
        self.close_local()
        mine = {
            k: SimpleNamespace(
                g=c.g,
                pt=c.pt,
                nd=c.nd,
                fl=c.fl,
                fr=c.fr,
                sample_chunks=c.sample_chunks,
                sample_rows=c.sample_rows,
            )  # fmt: skip
            for k in self.local
            if (c := self.parts[k])
        }
        heard = comm.gather((mine if self.world.rank else {}, self.spills), root=0)
        self.wall_s = time.perf_counter() - self._t0
        if self.world.rank:
            return
        for part, spills in heard[1:]:
            for k, c in part.items():
                self.parts[k] = c
            self.spills += spills
        self.combine()


def _min():
    from mpi4py import MPI

    return MPI.MIN
