"""This machine's memory latency by working-set size: what a load costs that misses.

    python benchmarks/bench_memory.py [MiB ...] [--loads N] [--repeat N]

Follows a chain of dependent loads, one per cache line, through a random cycle over
a block of the given size (default 1 2 4 8 16 32 64 128 256 MiB), so that every load
waits for the one before it: the time per load is the latency of the level of the
memory hierarchy that holds a block of that size (L1 and L2 per core, the L3 this
machine's share of it, then DRAM). The simulator's hop reads rows scattered over its
state (benchmarks/bench_sim.py prints each case's working set), so a case whose state
fits in the L2 pays a few ns for each row it touches and one that does not pays the
latency here for each row no prefetch hid. The block is NumPy's, so on Linux it is
on transparent huge pages where the kernel gives them (as the simulator's arrays are).
Prints the median of --repeat runs per size, and the CPU and wall seconds of all.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from numba import njit

LINE = 64  # bytes per cache line
STEP = LINE // 8  # int64 slots per line


@njit
def chase(nxt, n):
    i = 0
    for _ in range(n):
        i = nxt[i]
    return i


def block(mib: float, rng) -> np.ndarray:
    """A block of `mib` MiB whose lines form one random cycle: nxt[i] is the next line's slot."""
    lines = max(int(mib * 2**20) // LINE, 2)
    order = rng.permutation(lines) * STEP
    nxt = np.zeros(lines * STEP, dtype=np.int64)
    nxt[order] = np.roll(order, -1)
    return nxt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=float, help="MiB (default 1 2 4 ... 256)")
    ap.add_argument("--loads", type=int, default=2_000_000, help="loads timed per run")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.loads < 1 or args.repeat < 1:
        ap.error("--loads and --repeat must be at least 1")
    sizes = args.sizes or [1, 2, 4, 8, 16, 32, 64, 128, 256]
    if any(s <= 0 for s in sizes):
        ap.error("a size must be more than 0 MiB")
    rng = np.random.default_rng(1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    chase(block(1, rng), 1)  # compile
    for mib in sizes:
        nxt = block(mib, rng)
        chase(nxt, len(nxt) // STEP)  # touch every line once (page faults, warm)
        ns = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            chase(nxt, args.loads)
            ns.append((time.perf_counter() - t) / args.loads * 1e9)
        print(f"{mib:8g} MiB  {statistics.median(ns):6.1f} ns per dependent load", flush=True)
    print(f"CPU {time.process_time() - cpu0:.1f} s, wall {time.perf_counter() - wall0:.1f} s")


if __name__ == "__main__":
    main()
