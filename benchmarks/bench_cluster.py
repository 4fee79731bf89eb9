"""cluster-24k's 64 MiB AllReduce over all 24,576 GPUs, as whole `aifabric run` commands:
NCCL's choice (`auto`) and a ring forced.

    python benchmarks/bench_cluster.py [auto ring] [--topology NAME] [--size SIZE]
        [--partitions N|auto] [--sample-interval T]

Issue 27's goals for it on this 2-core machine: each at most 10 minutes of wall time,
within 2 GB of peak memory and 200 MB of telemetry. Each algorithm runs once as
`python -m aifabric run SCENARIO -o DIR` in a child process (every key but those above
its default: DCQCN's `cx-400g`, PFC, 5-tuple ECMP), after a tiny run that loads or
compiles the kernels; it prints the command's wall and CPU seconds, its peak resident
memory (VmHWM, read while it runs), the simulated time and the events (run.json), the
algorithm and protocol the op ran and NCCL's predicted time for it, the partitions and
windows, and the size of the run directory's port series (ports.npz and ports.parquet).
Long: the ring took 30 minutes and `auto` 52 on two partitions (benchmarks/NOTES.md);
`--topology ai-zone --size 8MiB` checks the same in a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_htsim import timed  # noqa: E402


def scenario(topology: str, algorithm: str, size: str, partitions: str, interval: str) -> str:
    parts = partitions if partitions != "auto" else '"auto"'
    return f"""[scenario]
topology = "{topology}"
sample_interval = "{interval}"

[simulator]
partitions = {parts}

[[workload.jobs]]
name = "allreduce"
collective = "allreduce"
algorithm = "{algorithm}"
size = "{size}"
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("algorithms", nargs="*", default=["auto", "ring"])
    ap.add_argument("--topology", default="cluster-24k")
    ap.add_argument("--size", default="64MiB")
    ap.add_argument("--partitions", default="auto")
    ap.add_argument("--sample-interval", default="1ms")
    args = ap.parse_args()
    print(f"cores: {len(os.sched_getaffinity(0))}; load {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)
        warm = work / "warm.toml"
        warm.write_text(scenario("lab-small", "ring", "64KiB", "1", "10us"))
        timed([sys.executable, "-m", "aifabric", "run", str(warm), "-o", str(work / "w")], work)
        for algorithm in args.algorithms:
            spec = work / f"{algorithm}.toml"
            spec.write_text(
                scenario(args.topology, algorithm, args.size, args.partitions, args.sample_interval)
            )
            out = work / algorithm
            command = [sys.executable, "-m", "aifabric", "run", str(spec), "-o", str(out)]
            t, _ = timed(command, work)
            summary = json.loads((out / "run.json").read_text())["results"]["summary"]
            (op,) = summary["collectives"]
            part = summary["partitions"]
            windows = (
                f"{part['partitions']} partitions, {part['windows']:,} windows"
                if part["partitions"] > 1
                else f"1 partition ({part.get('why', 'asked')})"
            )
            series = {
                name: (out / name).stat().st_size / 1e6 for name in ("ports.npz", "ports.parquet")
            }
            print(
                f"{args.topology} {args.size} AllReduce over {op['ranks']:,} GPUs, {algorithm}: "
                f"ran {op['algorithm']} {op['protocol']}; wall {t.wall_s:,.1f} s "
                f"({t.wall_s / 60:.1f} min), CPU {t.cpu_s:,.1f} s, peak {t.peak_mib:,.0f} MiB; "
                f"simulated {summary['simulated_ns'] / 1e6:.3f} ms (NCCL's model "
                f"{op['predicted_ns'] / 1e6:.3f} ms), {summary['events']:,} events; {windows}; "
                f"ports.npz {series['ports.npz']:.1f} MB, ports.parquet "
                f"{series['ports.parquet']:.1f} MB; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
