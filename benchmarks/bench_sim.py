"""Simulator throughput: events/s, packet-hops/s, wall time and peak memory.

    python benchmarks/bench_sim.py [a b c d e f] [--big] [--repeat N] [--ack-every N|flow]
        [--buffer-model shared|static]

(a) fat-tree-k8 (128 NICs) and (b) fat-tree-k16 (1,024 NICs), 100 Gb/s, MTU 4000:
a random permutation of 2 MB flows, PFC on, per-flow 5-tuple ECMP; (c) the same
at 8,192 NICs (fat-tree-k32); (d) a ring AllReduce of 8 MiB over all 3,072 GPUs
of ai-zone (one stream per ring edge, every one of its 6,142 steps released by
the step before upstream, NCCL's protocol and latencies chosen by `auto`); (e) the
same of 64 MiB; (f) a ring AllReduce of 64 MiB over all 24,576 GPUs of
cluster-24k (long: only when named or with --big).
Goals (issue 12): (b) at most 250 ns per packet-hop; the cost per packet-hop
from (a) to (c) within a factor of 1.5; (e) under 3 minutes; (f) within 24 GiB.
Prints the median of `--repeat` runs (after one warm-up run that compiles or
loads the numba kernels); the long cases (d, e, f) run once, after a tiny run
that loads the kernels, and report their progress every 30 s. CPU seconds
beside wall seconds tell a slower kernel from a busier machine; the load
average is printed beside each case. Peak memory is the process's resident
high-water mark (it includes every earlier case). Then the memory the state
takes per in-flight packet, per event and per flow, from the array layouts.
`--ack-every` sets the receivers' ACK coalescing (the scenario key of that name;
default: the simulator's), to measure what ACKs cost in events per packet-hop;
`--buffer-model` puts every switch on that buffer model (default: the topology's),
to compare with figures measured before the shared-buffer model (static).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aifabric.fabric.model import Role  # noqa: E402
from aifabric.fabric.units import format_size  # noqa: E402
from aifabric.sim import Simulation  # noqa: E402
from aifabric.sim import layout as L  # noqa: E402
from aifabric.sim.heap import HEAPS  # noqa: E402
from aifabric.topologies import load_fabric  # noqa: E402
from aifabric.traffic.flows import FlowTable  # noqa: E402

BUFFER_MODEL: list[str] = []  # the switches' buffer model every case takes (--buffer-model)


def with_model(fabric):
    """The fabric with every switch on the --buffer-model, if one was given."""
    if not BUFFER_MODEL:
        return fabric
    queues = {r: replace(fabric.queue(r), model=BUFFER_MODEL[0]) for r in Role if r != Role.NIC}
    return replace(fabric, queues={**fabric.queues, **queues})


def permutation(fabric, size: int, seed: int) -> FlowTable:
    rng = np.random.default_rng(seed)
    nics = fabric.nic_ids
    return permutation_table(nics, derangement(rng, len(nics)), size)


def derangement(rng, n: int) -> np.ndarray:
    """A random permutation of range(n) that moves every index (no NIC sends to itself)."""
    while True:
        perm = rng.permutation(n)
        if not (perm == np.arange(n)).any():
            return perm


def permutation_table(nics, perm, size: int) -> FlowTable:
    """Flows of `size` bytes from each of `nics` to nics[perm], one queue pair each."""
    n = len(nics)
    idx = np.arange(n)
    cols = {
        "src": nics,
        "dst": nics[perm],
        "bytes": np.full(n, size),
        "sqpn": idx + 1,
        "dqpn": perm + 1,
        "sport": 0xC000 | ((idx + 1) ^ (perm + 1)) & 0x3FFF,
    }
    return FlowTable.build(cols, ([0] * (n + 1), []), {})


def ring_allreduce(fabric, size: int, seed: int) -> FlowTable:
    from aifabric import traffic

    workload = traffic.workload_from_dict(
        {"collective": "allreduce", "algorithm": "ring", "size": size},
        "bench-ring",
    )
    return traffic.generate(fabric, workload, seed)


CASES = {
    "a": ("fat-tree-k8", permutation, 2_000_000),
    "b": ("fat-tree-k16", permutation, 2_000_000),
    "c": ("fat-tree-k32", permutation, 2_000_000),
    "d": ("ai-zone", ring_allreduce, 8 * 2**20),
    "e": ("ai-zone", ring_allreduce, 64 * 2**20),
    "f": ("cluster-24k", ring_allreduce, 64 * 2**20),
}
LONG = {"d", "e", "f"}  # run once, with progress
BIG = {"f"}  # only when named or with --big
PROGRESS_S = 30.0


def peak_mib() -> float:
    """The process's resident-memory high-water mark (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def reporter(label: str):
    """A progress hook printing simulated time, flows, events and memory every PROGRESS_S."""
    last = [time.perf_counter()]
    cpu0 = time.process_time()

    def hook(p) -> None:
        now = time.perf_counter()
        if now - last[0] < PROGRESS_S:
            return
        last[0] = now
        print(
            f"  ({label}) {p.wall_s:7.0f} s  simulated {p.now_ns / 1e3:,.0f} us  "
            f"flows {p.flows_done:,} of {p.flows:,}  events {p.events:,}  "
            f"{p.events / max(p.wall_s, 1e-9) / 1e6:.2f} M events/s  "
            f"CPU {time.process_time() - cpu0:,.0f} s  "
            f"peak RSS {peak_mib():,.0f} MiB  {load()}",
            flush=True,
        )

    return hook


CC_PARAMS: dict = {}  # --ack-every


def once(fabric, table, progress=None) -> dict:
    t0 = time.perf_counter()
    c0 = time.process_time()
    sim = Simulation(
        fabric, table, ecmp="5tuple", seed=1, cc="none", sample_interval_ns=100_000,
        cc_params=CC_PARAMS,
    )  # fmt: skip
    t1 = time.perf_counter()
    c1 = time.process_time()
    peak = {"packets": 0, "events": 0}

    def sample(p) -> None:  # after each slice of the kernel's events: what is in flight
        peak["packets"] = max(peak["packets"], len(sim.pk) - 1 - int(sim.g[L.G_NFREE]))
        peak["events"] = max(peak["events"], int(sim.g[L.G_HEAP]))
        if progress is not None:
            progress(p)

    done = sim.run(progress=sample)
    t2 = time.perf_counter()
    c2 = time.process_time()
    c = sim.counters()
    return {
        "setup_s": t1 - t0,
        "setup_cpu_s": c1 - c0,
        "run_s": t2 - t1,
        "run_cpu_s": c2 - c1,
        "wall_s": t2 - t0,
        "cpu_s": c2 - c0,
        "mean_route": len(sim.path_port) / max(len(table), 1),
        "row_bytes": {k: row_bytes(getattr(sim, k)) for k in ROWS},
        "events": c["events"],
        "hops": c["packet_hops"],
        "done": done and c["flows_done"] == len(table),
        "simulated_ns": c["simulated_ns"],
        "peak": peak,
        "fixed_bytes": sim.pt.nbytes + sim.pmax.nbytes + sim.fl.nbytes + sim.fr.nbytes,
    }


def working_set(r: dict) -> tuple[float, str]:
    """The state a run's hops touch at its busiest, in MiB: every port's and flow's rows,
    and the rows of the packets and events in flight at the most (sampled at the end of
    each slice of the kernel's events). Beside the cache sizes and the memory latencies
    of benchmarks/bench_memory.py, it tells why a larger fabric's hop costs more."""
    rows = r["row_bytes"]
    packets = r["peak"]["packets"] * (rows["pk"] + rows["pc"])
    events = r["peak"]["events"] * rows["ev"]
    mib = (r["fixed_bytes"] + packets + events) / 2**20
    return mib, (
        f"working set: {mib:,.1f} MiB at the busiest: ports and flows "
        f"{r['fixed_bytes'] / 2**20:,.1f}, {r['peak']['packets']:,} packets in flight "
        f"{packets / 2**20:,.1f}, {r['peak']['events']:,} pending events {events / 2**20:,.1f} "
        f"(sampled every slice of the kernel's events)"
    )


ROWS = ("pk", "pc", "ev", "fl", "fr", "act", "path_ptr", "dep_ptr")  # state arrays, by row


def row_bytes(a) -> int:
    return a.itemsize * (a.shape[-1] if a.ndim > 1 else 1)


def memory_layout(fabric, table, mean_route: float, rows: dict) -> str:
    """Bytes per in-flight packet, per pending event and per flow, from the state's
    array layouts (plus the flow table's own columns and the flow's route), and per
    sample interval of the port series (kept for the whole run)."""
    packet = rows["pk"] + rows["pc"]  # pk: what a hop reads; pc: only captures and cts
    event = rows["ev"]
    lists = rows["act"] + rows["path_ptr"] + rows["dep_ptr"]
    state = rows["fl"] + rows["fr"] + lists
    n = max(len(table), 1)
    columns = sum(
        v.nbytes for v in vars(table).values() if isinstance(v, np.ndarray) and len(v) == len(table)
    )
    deps = (table.dep.nbytes + len(table.dep) * 8) / n  # the table's and the engine's copy
    route = mean_route * 8
    return (
        f"memory: {packet} bytes per in-flight packet (pk {rows['pk']} + pc {rows['pc']}), "
        f"{event} per pending event ({HEAPS * event} of room: the near heap, the far heap "
        f"and the wheel's chunks each have room for all, and a plane of the wheel's links); "
        f"per flow {state} of state (fl {rows['fl']}, "
        f"fr {rows['fr']}, act + path_ptr + dep_ptr {lists}) + {route:.0f} of route "
        f"({mean_route:.1f} ports) + {deps:.0f} of dependencies + {columns / n:.0f} of "
        f"flow-table columns = {state + route + deps + columns / n:.0f} bytes; "
        f"{L.SM_N * 8} per port per sample interval ({format_size(L.SM_N * 8 * fabric.n_ports)} "
        f"for {fabric.n_ports:,} ports)"
    )


def warm() -> None:
    """Load (or compile) the kernels with a tiny run, so that a single run measures the run."""
    fabric = load_fabric("fat-tree-k8")
    once(fabric, permutation(fabric, 4096, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"of {' '.join(CASES)} (default: a b)")
    ap.add_argument("--big", action="store_true", help="also run (f), 24,576 GPUs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ack-every", type=lambda v: v if v == "flow" else int(v))
    ap.add_argument("--buffer-model", choices=["shared", "static"])
    args = ap.parse_args()
    if args.buffer_model:
        BUFFER_MODEL.append(args.buffer_model)
    if args.ack_every is not None:
        CC_PARAMS["ack_every"] = args.ack_every
    cases = list(args.cases or ["a", "b"])
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"no case {', '.join(unknown)}; the cases are {' '.join(CASES)}")
    if args.big:
        cases += [c for c in sorted(BIG) if c not in cases]
    per_hop, mib = {}, {}
    if LONG & set(cases):
        warm()
    for case in cases:
        name, make, size = CASES[case]
        t0 = time.perf_counter()
        fabric = with_model(load_fabric(name))
        table = make(fabric, size, 1)
        built_s = time.perf_counter() - t0
        if case in LONG:
            runs = [once(fabric, table, progress=reporter(case))]
        else:
            once(fabric, table)  # compile or load the kernels, touch the memory
            runs = [once(fabric, table) for _ in range(args.repeat)]
        keys = ("wall_s", "cpu_s", "run_s", "run_cpu_s", "setup_s", "setup_cpu_s")
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        r = runs[0]
        per_hop[case] = med["run_s"] / max(r["hops"], 1) * 1e9
        print(
            f"({case}) {name:<13} {fabric.count(0):>6,} NICs {len(table):>7,} flows  "
            f"wall {med['wall_s']:7.2f} s, CPU {med['cpu_s']:.2f} s "
            f"(setup {med['setup_s']:.2f} wall, {med['setup_cpu_s']:.2f} CPU; "
            f"run {med['run_s']:.2f} wall, {med['run_cpu_s']:.2f} CPU)  "
            f"{r['events'] / med['run_s'] / 1e6:6.2f} M events/s  "
            f"{r['events'] / max(r['hops'], 1):.2f} events/hop  "
            f"{r['hops'] / med['run_s'] / 1e6:6.2f} M packet-hops/s  "
            f"{per_hop[case]:6.1f} ns/hop ({med['run_cpu_s'] / max(r['hops'], 1) * 1e9:.1f} CPU)  "
            f"peak RSS {peak_mib():,.0f} MiB  "
            f"simulated {r['simulated_ns'] / 1e3:,.0f} us  "
            f"{'all flows done' if r['done'] else 'NOT ALL FLOWS DONE'}  "
            f"(fabric and flows built in {built_s:.1f} s; {load()}; median of {len(runs)})",
            flush=True,
        )
        print(f"    {memory_layout(fabric, table, r['mean_route'], r['row_bytes'])}", flush=True)
        mib[case], line = working_set(r)
        print(f"    {line}", flush=True)
    if "a" in per_hop and "c" in per_hop:
        print(
            f"cost per packet-hop (c)/(a): {per_hop['c'] / per_hop['a']:.2f} (goal: <= 1.5), "
            f"working sets {mib['c']:,.0f} and {mib['a']:,.1f} MiB "
            f"(memory latency at such sizes: benchmarks/bench_memory.py; what the cost "
            f"grows with: benchmarks/bench_scaling.py)"
        )


if __name__ == "__main__":
    main()
