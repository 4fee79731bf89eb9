"""Simulator throughput: events/s, packet-hops/s, wall time and peak memory.

    python benchmarks/bench_sim.py [a b c d] [--repeat N]

(a) fat-tree-k8 (128 NICs) and (b) fat-tree-k16 (1,024 NICs), 100 Gb/s, MTU 4000:
a random permutation of 2 MB flows, PFC on, per-flow 5-tuple ECMP; (c) the same
at 8,192 NICs (fat-tree-k32); (d) a ring AllReduce of 8 MiB over all 3,072 GPUs
of ai-zone (the traffic package's 16 pipelined segments per connection).
Goals: (b) under 3 s of wall time; the cost per packet-hop from (a) to (c)
within a factor of 2. Prints the median of `--repeat` runs (after one
warm-up run that compiles or loads the numba kernels); the run's CPU time
beside its wall time tells a slower kernel from a busier machine.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabric.sim import Simulation  # noqa: E402
from topologies import load_fabric  # noqa: E402
from traffic.flows import FlowTable  # noqa: E402


def permutation(fabric, size: int, seed: int) -> FlowTable:
    rng = np.random.default_rng(seed)
    nics = fabric.nic_ids
    n = len(nics)
    while True:
        perm = rng.permutation(n)
        if not (perm == np.arange(n)).any():
            break
    cols = {
        "src": nics,
        "dst": nics[perm],
        "bytes": np.full(n, size),
        "sqpn": np.arange(n) + 1,
        "dqpn": perm + 1,
        "sport": 0xC000 | ((np.arange(n) + 1) ^ (perm + 1)) & 0x3FFF,
    }
    return FlowTable.build(cols, ([0] * (n + 1), []), {})


def ring_allreduce(fabric, size: int, seed: int) -> FlowTable:
    import traffic

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
}


def once(fabric, table) -> dict:
    t0 = time.perf_counter()
    sim = Simulation(fabric, table, ecmp="5tuple", seed=1, cc="none", sample_interval_ns=100_000)
    t1 = time.perf_counter()
    c1 = time.process_time()
    done = sim.run()
    t2 = time.perf_counter()
    cpu = time.process_time() - c1
    c = sim.counters()
    return {
        "setup_s": t1 - t0,
        "run_s": t2 - t1,
        "run_cpu_s": cpu,
        "wall_s": t2 - t0,
        "events": c["events"],
        "hops": c["packet_hops"],
        "done": done and c["flows_done"] == len(table),
        "simulated_ns": c["simulated_ns"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("cases", nargs="*", default=["a", "b"], choices=sorted(CASES))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    per_hop = {}
    for case in args.cases:
        name, make, size = CASES[case]
        fabric = load_fabric(name)
        table = make(fabric, size, 1)
        once(fabric, table)  # compile or load the kernels, touch the memory
        runs = [once(fabric, table) for _ in range(args.repeat)]
        med = {
            k: statistics.median(r[k] for r in runs)
            for k in ("wall_s", "run_s", "setup_s", "run_cpu_s")
        }
        r = runs[0]
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        per_hop[case] = med["run_s"] / r["hops"] * 1e9
        print(
            f"({case}) {name:<13} {fabric.count(0):>6,} NICs {len(table):>7,} flows  "
            f"wall {med['wall_s']:7.2f} s (setup {med['setup_s']:.2f}, run {med['run_s']:.2f}, "
            f"run CPU {med['run_cpu_s']:.2f})  "
            f"{r['events'] / med['run_s'] / 1e6:6.2f} M events/s  "
            f"{r['hops'] / med['run_s'] / 1e6:6.2f} M packet-hops/s  "
            f"{per_hop[case]:6.1f} ns/hop  peak RSS {peak_mib:,.0f} MiB  "
            f"simulated {r['simulated_ns'] / 1e3:,.0f} us  "
            f"{'all flows done' if r['done'] else 'NOT ALL FLOWS DONE'}",
            flush=True,
        )
    if "a" in per_hop and "c" in per_hop:
        print(f"cost per packet-hop (c)/(a): {per_hop['c'] / per_hop['a']:.2f} (goal: <= 2)")


if __name__ == "__main__":
    main()
