"""What reading a large run costs: `aifabric analyze RUN --json` (and with `--series`) and
`aifabric report RUN`, each as a new process, on a run with many ports and samples.

The run (made unless `--run` names one): a tree AllReduce of 64 MiB over all 3,072 GPUs of
ai-zone, its ports sampled every 10 us (about 400 samples of 19,968 ports, 3.7 million
entries; the simulation takes about 7 CPU minutes). Prints, for each command, the median
over `--repeat` runs of its CPU seconds (user + system), wall seconds and peak resident
memory, read from the process's own resource usage, after one unmeasured `analyze` that
fills numba's cache.

    .venv/bin/python benchmarks/bench_analyze_run.py [--run DIR] [--keep DIR]
        [--aifabric PATH] [--repeat R]

`--aifabric` times another checkout's command on the same run directory (its
`.venv/bin/aifabric`), so that code before and after a change reads one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIO = """[scenario]
description = "tree AllReduce over all 3,072 GPUs of ai-zone, ports sampled every 10 us"
topology = "ai-zone"
seed = 1
sample_interval = "10us"

[workload]
collective = "allreduce"
algorithm = "tree"
size = "64MiB"
"""


def measure(argv: list[str]) -> tuple[float, float, float]:
    """CPU s, wall s and peak RSS (MiB) of one process running `argv` (its output dropped)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed: {err.strip()}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def make_run(folder: Path, aifabric: str) -> Path:
    (folder / "scenario.toml").write_text(SCENARIO)
    run = folder / "run"
    print("simulating the run (several CPU minutes) ...", flush=True)
    cpu, wall, rss = measure([aifabric, "run", str(folder / "scenario.toml"), "-o", str(run)])
    print(f"  {cpu:.0f} CPU s, {wall:.0f} wall s, peak {rss:,.0f} MiB", flush=True)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a run directory to read (default: simulate one)")
    ap.add_argument("--keep", type=Path, help="simulate the run into this folder and keep it")
    ap.add_argument("--aifabric", default=str(Path(sys.executable).parent / "aifabric"),
                    help="the command to time (default: this environment's)")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-analyze-run-") as tmp:
        if args.run is not None:
            run = args.run
        else:
            folder = args.keep or Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            run = make_run(folder, args.aifabric)
        html = Path(tmp) / "report.html"
        commands = {
            "analyze --json": [args.aifabric, "analyze", str(run), "--json"],
            "analyze --series": [args.aifabric, "analyze", str(run), "--json", "--series"],
            "report": [args.aifabric, "report", str(run), "-o", str(html), "--force"],
        }
        measure(commands["analyze --json"])  # fills numba's cache for the analysis kernels
        print(f"{args.aifabric} on {run}, medians of {args.repeat}")
        print(f"{'command':<18} {'CPU s':>8} {'wall s':>8} {'peak MiB':>10}")
        for name, argv in commands.items():
            got = [measure(argv) for _ in range(args.repeat)]
            cpu, wall, rss = (statistics.median(x) for x in zip(*got, strict=True))
            print(f"{name:<18} {cpu:8.2f} {wall:8.2f} {rss:10,.0f}", flush=True)


if __name__ == "__main__":
    main()
