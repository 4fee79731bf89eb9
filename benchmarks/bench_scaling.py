"""What a packet-hop's cost grows with: the fabric's size, or the traffic's concurrency.

    python benchmarks/bench_scaling.py [--repeat N] [--senders N ...]

bench_sim's (a), (b) and (c) are permutations of 2 MB flows over every NIC of a
fat tree with k = 8, 16 and 32, so the fabric and the traffic grow together:
128, 1,024 and 8,192 flows. Here the largest fabric (k = 32: 8,192 NICs, 49,152
ports) carries permutations among a random subset of its NICs as well (by
default 128 and 1,024 of them, as many flows as (a) and (b) have), beside (a),
(b) and (c) themselves. Each line prints the CPU ns per packet-hop (the median of
`--repeat` runs after one warm-up), the working set at the busiest (as
bench_sim prints it), and the hops in a frame time: the packet-hops the whole
fabric makes while one port sends one full frame (hops per simulated ns times
the frame's serialization time). A port's and a flow's rows are touched again
one frame time later, and a hop touches about the same rows whatever the
fabric's size, so the rows touched in between grow with this figure; once it
outgrows the cache, each hop's rows come from memory
(benchmarks/bench_memory.py prints this machine's latency by block size).
If the hop's cost follows the traffic rather than the fabric, the same fabric
with as many flows as (a) costs about what (a) costs per hop.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_sim as B  # noqa: E402

from aifabric.sim import layout as L  # noqa: E402
from aifabric.topologies import load_fabric  # noqa: E402
from aifabric.traffic.flows import FlowTable  # noqa: E402

SIZE = 2_000_000  # bytes per flow, as in bench_sim (a)-(c)


def subset_permutation(fabric, senders: int, seed: int) -> FlowTable:
    """A permutation of SIZE-byte flows among `senders` NICs drawn at random: each sends
    to another of them and receives from one (bench_sim.permutation over a subset)."""
    rng = np.random.default_rng(seed)
    nics = np.sort(rng.choice(fabric.nic_ids, size=senders, replace=False))
    return B.permutation_table(nics, B.derangement(rng, senders), SIZE)


def frame_ps(fabric) -> float:
    """A full data frame's serialization time on a NIC's link, in ps."""
    port = int(fabric.nic_port[fabric.nic_ids[0]])
    wire = int(fabric.link_mtu_bytes[port // 2]) + L.DATA_OVERHEAD_BYTES
    return wire * 8e12 / float(fabric.port_rate_bps[port])


def measure(label: str, fabric, table, repeat: int) -> float:
    """Run `table` on `fabric`, print its line; its CPU ns per packet-hop."""
    B.once(fabric, table)  # load the kernels, touch the memory
    runs = [B.once(fabric, table) for _ in range(repeat)]
    r = runs[0]
    cpu_ns = statistics.median(x["run_cpu_s"] for x in runs) / max(r["hops"], 1) * 1e9
    mib, _ = B.working_set(r)
    per_frame = r["hops"] / max(r["simulated_ns"], 1e-9) * frame_ps(fabric) / 1e3
    print(
        f"{label:<34} {fabric.count(0):>6,} NICs {len(table):>6,} flows  "
        f"{cpu_ns:6.1f} CPU ns/hop  hops in a frame time {per_frame:7,.0f}  "
        f"working set {mib:7,.1f} MiB  {r['peak']['packets']:>9,} packets in flight  "
        f"{'all flows done' if r['done'] else 'NOT ALL FLOWS DONE'}  "
        f"({B.load()}; median of {len(runs)})",
        flush=True,
    )
    return cpu_ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--senders", type=int, nargs="+", default=[128, 1024],
        help="subsets of fat-tree-k32's NICs to run permutations among (default: 128 1024)",
    )  # fmt: skip
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    big = load_fabric("fat-tree-k32")
    bad = [n for n in args.senders if not 2 <= n <= len(big.nic_ids)]
    if bad:
        ap.error(f"--senders takes 2 to {len(big.nic_ids):,} NICs, not {bad[0]}")
    out = {}
    for case in ("a", "b"):
        name, make, size = B.CASES[case]
        fabric = load_fabric(name)
        out[case] = measure(
            f"({case}) {name}, every NIC", fabric, make(fabric, size, 1), args.repeat
        )
    for n in args.senders:
        table = subset_permutation(big, n, 1)
        out[n] = measure(f"fat-tree-k32, {n:,} NICs", big, table, args.repeat)
    name, make, size = B.CASES["c"]
    out["c"] = measure(f"(c) {name}, every NIC", big, make(big, size, 1), args.repeat)
    a = out["a"]
    print("per hop against (a):", "  ".join(
        f"{k if isinstance(k, str) else f'k32/{k:,}'} {v / a:.2f}" for k, v in out.items()
    ))  # fmt: skip
    print(f"CPU {time.process_time() - c0:.1f} s, wall {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
