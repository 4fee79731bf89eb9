"""One simulation on several partitions against one partition: wall and CPU seconds, and
whether the results are the same.

    python benchmarks/bench_partitions.py [a b c d e f] [--partitions N ...] [--repeat N]
        [--htsim-conventions] [--lossy KIB [--loss-recovery R]] [--finish receiver]

The cases are bench_sim.py's: permutations of 2 MB flows on (a) fat-tree-k8 (128 NICs),
(b) fat-tree-k16 (1,024 NICs), (c) fat-tree-k32 (8,192 NICs; long), and ring AllReduces
over every GPU of (d) ai-zone (3,072 GPUs, 8 MiB), (e) ai-zone (64 MiB; long) and
(f) cluster-24k (24,576 GPUs, 64 MiB; very long). Each case runs on
one partition and on each `--partitions` count (default: 2), alternating, `--repeat`
times (default 3), in one warm process (the kernels loaded once before); it prints the
median wall and CPU seconds of each, the ratio of one partition's wall time to each
count's, the windows the partitions ran in, and whether the flow records, the port series
and every counter equal one partition's. `--htsim-conventions` runs them as
bench_htsim.py sets aifabric to htsim's conventions (an ACK per packet, static per-port
buffers, 64 bytes of header overhead, no congestion control). `--lossy KIB` runs every
switch with PFC off and a static buffer of KIB per port (ECN from a quarter to half of
it) under DCQCN, so packets drop; `--loss-recovery` picks go-back-N (the default) or
selective repeat. `--finish receiver` ends flows at their receivers (the scenario key
`finish`). `--ceiling` also runs, in each round, the one-partition run alone and N copies of it
at once, each copy in a process of its own: N x alone / the slowest copy is what this
machine's cores give N pieces of work that never wait for each other (well under N where the
hypervisor's cores share hardware or are busy elsewhere), the ceiling of N partitions'
speed-up (a little low: N copies hold N times one run's memory, N partitions one run's).
Issue 27's goal: (b) on 2 partitions at least 1.7 times faster in wall time than on one.
Under `mpirun -n N` the partitions run on the MPI job's ranks (aifabric.sim.mpi): rank 0
runs the benchmark and prints, the others serve.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sim import CASES  # noqa: E402

from aifabric.fabric.model import Role  # noqa: E402
from aifabric.sim import Simulation  # noqa: E402
from aifabric.topologies import load_fabric  # noqa: E402


def htsim_fabric(fabric):
    """Every switch on static per-port buffers with htsim's PFC thresholds (bench_htsim)."""
    from bench_htsim import MTU, PFC_HIGH_PACKETS, PFC_LOW_PACKETS

    queues = {}
    for r in Role:
        if r == Role.NIC:
            continue
        q = fabric.queue(r)
        pfc = replace(q.pfc, xoff_bytes=PFC_HIGH_PACKETS * MTU, xon_bytes=PFC_LOW_PACKETS * MTU)
        queues[r] = replace(q, model="static", pfc=pfc)
    return replace(fabric, queues={**fabric.queues, **queues})


def lossy_fabric(fabric, buffer_bytes: int):
    """Every switch with PFC off and a static buffer of `buffer_bytes` per port."""
    queues = {}
    for r in Role:
        if r == Role.NIC:
            continue
        q = fabric.queue(r)
        ecn = replace(q.ecn, kmin_bytes=buffer_bytes // 4, kmax_bytes=buffer_bytes // 2)
        pfc = replace(q.pfc, enabled=False)
        queues[r] = replace(q, model="static", buffer_bytes=buffer_bytes, ecn=ecn, pfc=pfc)
    return replace(fabric, queues={**fabric.queues, **queues})


def same(one: Simulation, other: Simulation) -> bool:
    a, b = one.flow_records(), other.flow_records()
    if any(not np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a):
        return False
    pa, pb = one.port_series(), other.port_series()
    if any(
        not np.array_equal(np.asarray(pa[k], np.int64), np.asarray(pb[k], np.int64)) for k in pa
    ):
        return False
    return one.counters() == other.counters()


_COPY: dict = {}  # what a forked copy runs: set in the parent before the pool forks


def _copy_init(barrier) -> None:
    _COPY["barrier"] = barrier


def _copy_run(together: bool) -> float:
    """One copy of the one-partition run in this worker: its wall seconds; `together`: it
    starts when every copy is ready."""
    sim = Simulation(_COPY["fabric"], _COPY["flows"], partitions=1, **_COPY["kw"])
    if together:
        _COPY["barrier"].wait()
    w = time.perf_counter()
    assert sim.run()
    w = time.perf_counter() - w
    sim.close()
    return w


class Copies:
    """N copies of the one-partition run, each in a forked worker of one pool (warm: the
    kernels are loaded before the fork). `round()`: one copy alone, then N at once; their
    wall seconds go to `alone` and (the slowest of the N) to `slowest`."""

    def __init__(self, fabric, flows, kw: dict, n: int):
        import multiprocessing

        _COPY.update(fabric=fabric, flows=flows, kw=kw)
        ctx = multiprocessing.get_context("fork")
        self.n = n
        self.pool = ctx.Pool(n, initializer=_copy_init, initargs=(ctx.Barrier(n),))
        # a first run in every worker, its memory touched (at the barrier: none takes two)
        self.pool.map(_copy_run, [True] * n, chunksize=1)
        self.alone: list[float] = []
        self.slowest: list[float] = []

    def round(self) -> None:
        self.alone.append(self.pool.apply(_copy_run, (False,)))
        self.slowest.append(max(self.pool.map(_copy_run, [True] * self.n, chunksize=1)))

    def ceiling(self) -> tuple[float, float, float]:
        """The medians of `alone` and `slowest`, and N x the one / the other: the most N
        partitions could gain on these cores."""
        a, s = statistics.median(self.alone), statistics.median(self.slowest)
        return a, s, self.n * a / s

    def close(self) -> None:
        self.pool.terminate()


def main() -> None:
    from aifabric.sim import mpi

    if mpi.follower():  # under mpirun: rank 0 runs the benchmark, the others its partitions
        mpi.serve()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases", nargs="*", default=["b"], help="of a-f (default: b)")
    ap.add_argument("--partitions", type=int, nargs="+", default=[2])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--htsim-conventions", action="store_true")
    ap.add_argument("--lossy", type=int, metavar="KIB", help="PFC off, KIB per switch port")
    ap.add_argument("--loss-recovery", choices=["go-back-n", "selective"], default="go-back-n")
    ap.add_argument("--finish", choices=["sender", "receiver"])
    ap.add_argument(
        "--ceiling", action="store_true", help="also N independent copies at once (see above)"
    )
    args = ap.parse_args()
    kw: dict = {}
    if args.htsim_conventions:
        from bench_htsim import HEADER_OVERHEAD

        kw["cc_params"] = {"ack_every": 1, "header_overhead": HEADER_OVERHEAD}
    if args.lossy:
        kw["cc"] = "dcqcn"
        kw["cc_params"] = {**kw.get("cc_params", {}), "loss_recovery": args.loss_recovery}
    if args.finish:
        kw["cc_params"] = {**kw.get("cc_params", {}), "finish": args.finish}
    print(f"cores: {len(os.sched_getaffinity(0))}; load {os.getloadavg()[0]:.2f}")
    for case in args.cases:
        topology, make, size = CASES[case]
        fabric = load_fabric(topology)
        if args.htsim_conventions:
            fabric = htsim_fabric(fabric)
        if args.lossy:
            fabric = lossy_fabric(fabric, args.lossy * 1024)
        flows = make(fabric, size, 1)
        counts = [1, *args.partitions]
        ran: dict[int, list[tuple[float, float]]] = {p: [] for p in counts}
        last: dict[int, Simulation] = {}
        Simulation(fabric, flows, partitions=1, **kw).run()  # the kernels, loaded
        for p in args.partitions:  # the partitions' own kernels, compiled or loaded
            Simulation(fabric, flows, partitions=p, **kw).run()
        copies = (
            {p: Copies(fabric, flows, kw, p) for p in args.partitions if p > 1}
            if args.ceiling
            else {}
        )
        for _ in range(args.repeat):  # each round: every count, then the copies
            for p in counts:
                sim = Simulation(fabric, flows, partitions=p, **kw)
                w, c = time.perf_counter(), time.process_time()
                assert sim.run()
                ran[p].append((time.perf_counter() - w, time.process_time() - c))
                sim.close()
                last[p] = sim
            for each in copies.values():
                each.round()
        for each in copies.values():
            each.close()
        wall1 = statistics.median(w for w, _ in ran[1])
        lossy = (
            f", lossy ({args.lossy} KiB a port, {args.loss_recovery}): "
            f"{last[1].counters()['drops']:,} drops"
            if args.lossy
            else ""
        ) + (f", flows end at their {args.finish}s" if args.finish else "")
        print(
            f"({case}) {topology}, {len(flows):,} flows of {size:,} B{lossy}, "
            f"median of {args.repeat}"
        )
        for p in counts:
            wall = statistics.median(w for w, _ in ran[p])
            cpu = statistics.median(c for _, c in ran[p])
            info = last[p].partitioned
            ranks = f" on {info['mpi_ranks']} MPI ranks" if "mpi_ranks" in info else ""
            shown = (
                f"{info['partitions']} partitions{ranks}, {info['windows']:,} windows of "
                f"{info['lookahead_ns']:,.0f} ns"
                if info["partitions"] > 1
                else f"1 partition{'' if p == 1 else ' (' + info['why'] + ')'}"
            )
            identical = "" if p == 1 else f"  results identical: {same(last[1], last[p])}"
            print(
                f"  partitions={p}: wall {wall:6.3f} s  CPU {cpu:6.3f} s  "
                f"speed-up {wall1 / wall:4.2f}x  ({shown}){identical}"
            )
            if p in copies:
                a, s, c = copies[p].ceiling()
                print(
                    f"    {p} copies of one partition at once, each its own process: alone "
                    f"{a:6.3f} s, the slowest of {p} {s:6.3f} s: ceiling {c:4.2f}x; "
                    f"partitions={p} reached {wall1 / wall / c:.0%} of it"
                )


if __name__ == "__main__":
    main()
