"""One simulation on the ranks of an MPI job: `mpirun -n N aifabric run SCENARIO`, on one
machine or many.

Rank 0 is the run: it loads the scenario, builds the simulation, prints and writes the run
directory exactly as without MPI. The other ranks only serve (`serve`). When rank 0's
simulation runs on partitions (aifabric.sim.partition), it sends the others its state at
the start; every rank builds the partitions it holds (partition k on rank k mod N) and
runs them window by window as threads that meet by message do (partition.Windows):
between windows the ranks exchange, in one alltoall, what they say of their partitions
and the frames bound for each other's. At the end each rank closes its partitions and
sends rank 0 what they own, which rank 0 merges as one process merges its threads'
partitions: the results are the same as on one partition. A run that cannot be
partitioned, or that falls back to one partition midway, runs on rank 0 alone; once rank
0 is done it tells the others, and they end.

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

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.launcher import SIZE_VARIABLES, launched_ranks
from aifabric.sim.partition import Fallback, PartitionedRun, PartitionFailed, Stopped, Windows

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
        except (Fallback, Stopped, PartitionFailed):  # the same on every rank
            continue  # and rank 0 says what it does about it
        run.merge()


class MpiRanks:
    """What `Windows` needs of the MPI job: its alltoall (pickled objects)."""

    shared = False  # each rank holds its own partitions

    def __init__(self, w: World):
        self.comm, self.rank, self.size = w.comm, w.rank, w.size

    def alltoall(self, items: list) -> list:
        return self.comm.alltoall(items)


class MpiRun(PartitionedRun):
    """`PartitionedRun` across the ranks of an MPI job: this rank holds partitions
    rank, rank + N, ... and runs their windows (`Windows`) with the other ranks'."""

    def __init__(self, sim, parts: int, w: World):
        self.world = w
        super().__init__(sim, parts, local=lambda n: range(w.rank, n, w.size))
        self.by_message = Windows(self, MpiRanks(w), self.local)

    def run(self, progress=None) -> None:
        """To the end (`end`) or what ends every rank alike: Fallback; a stop or a failure
        after merging what ran (rank 0 raises what stopped it, or PartitionFailed)."""
        self._t0 = time.perf_counter()
        self.by_message.run(progress)

    def merge(self, stopped: bool = False) -> None:
        """Every rank's partitions, merged on rank 0 (called on every rank)."""
        self.by_message.finish(stopped)
