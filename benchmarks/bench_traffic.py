"""Traffic benchmarks: packetization rate and the flow table of a 24,576-GPU ring AllReduce.

Run: python benchmarks/bench_traffic.py [--runs 5]. Prints medians; asserts nothing.
Goals: at least 50 million packets per second from the kernel on one core, and
the ring AllReduce flow table over all GPUs of cluster-24k in under 2 seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from aifabric import topologies, traffic
from aifabric.traffic.flow_packets import _fill, first_psn, packet_counts


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_packets(runs: int) -> None:
    fabric = topologies.load_fabric("lab-medium")
    w = traffic.workload_from_dict(
        dict(collective="allreduce", algorithm="ring", size="256MiB", qps=4), "bench"
    )
    table = traffic.generate(fabric, w)
    rate = np.full(len(table), 400 * 10**9, dtype=np.int64)
    mtu = 4096
    counts = packet_counts(table.bytes, table.msg_bytes, mtu)
    offset = np.zeros(len(table) + 1, dtype=np.int64)
    np.cumsum(counts, out=offset[1:])
    total = int(offset[-1])
    psn0 = first_psn(table.src, table.sqpn, counts)
    out = [np.empty(total, d) for d in (np.int64, np.int64)] + [
        np.empty(total, np.int32) for _ in range(6)
    ]
    out.append(np.empty(total, np.uint8))

    def kernel():
        _fill(
            table.start_ns, table.bytes, table.msg_bytes, rate, table.src, table.dst,
            table.sport, table.dqpn, psn0, offset, np.int64(mtu), np.int64(0), *out,
        )  # fmt: skip

    kernel()  # compile (or load from cache)
    k = median_time(kernel, runs)
    traffic.packetize(table, 400 * 10**9, mtu)
    p = median_time(lambda: traffic.packetize(table, 400 * 10**9, mtu), runs)
    print(f"packetization: {total:,} packets from {len(table):,} flows")
    print(f"  kernel alone        {total / k / 1e6:8.1f} M packets/s  (median of {runs})")
    print(f"  packetize() total   {total / p / 1e6:8.1f} M packets/s  (with allocation, PSNs)")


def bench_ring(runs: int) -> None:
    t0 = time.perf_counter()
    fabric = topologies.load_fabric("cluster-24k")
    load_s = time.perf_counter() - t0
    n = len(fabric.nic_ids)
    w = traffic.workload_from_dict(dict(collective="allreduce", algorithm="ring"), "bench")
    result = {}

    def build():
        result["t"] = traffic.generate(fabric, w)

    build()
    s = median_time(build, runs)
    t = result["t"]
    print(f"ring AllReduce over all {n:,} GPUs of cluster-24k (64MiB, one stream per edge, 1 QP)")
    print(f"  flow table          {s:8.3f} s  (median of {runs}): {len(t):,} flows, "
          f"{len(t.dep):,} dependencies")  # fmt: skip
    print(f"  fabric load         {load_s:8.3f} s  (once, not included)")
    w4 = traffic.workload_from_dict(dict(collective="allreduce", qps=4, channels=2), "bench")
    s4 = median_time(lambda: traffic.generate(fabric, w4), max(1, runs // 2))
    print(f"  with 2 channels x 4 QPs {s4:6.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    bench_packets(args.runs)
    bench_ring(args.runs)


if __name__ == "__main__":
    main()
