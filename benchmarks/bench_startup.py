"""Fixed cost of the command line: startup, a one-flow run, and a first run on a cold cache.

    python benchmarks/bench_startup.py [--repeat N] [--cold]

Each case runs `python -m aifabric ...` of this checkout in a child process and
prints the median CPU seconds (user + system, from the child's rusage) and wall
seconds of N runs:

  version   `aifabric --version`
  run       `aifabric run` of benchmarks/one-flow.toml (one 4 KiB flow on lab-small),
            warm
            (after one untimed run that fills the numba cache if it is cold)

The children may write bytecode (__pycache__), as an installed aifabric does,
whatever PYTHONDONTWRITEBYTECODE says here: without it every module of the
project is compiled from source on each start (about 0.1 s of CPU).

`--cold` (slow: about a minute and a half of CPU) adds, once each, in a fresh empty numba
cache directory deleted afterwards:

  cold run  `aifabric run` of the one-flow scenario: the time until it says it
            is compiling, and in all (it compiles every kernel first)
  demo      `aifabric run demo` right after, as after scripts/install (and whether
            it said it was compiling: it should compile nothing)
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE_FLOW = ROOT / "benchmarks" / "one-flow.toml"


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(args: list[str], env: dict, notice: str | None = None) -> dict:
    """CPU and wall seconds of one `python -m aifabric ARGS`; with `notice`, also the
    wall seconds until a line of stderr contains it."""
    cpu, t0 = child_cpu(), time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "aifabric", *args],
        cwd=ROOT,  # `-m` puts the working directory first on the path: this checkout's
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = None
    lines = []
    for line in p.stderr:
        lines.append(line)
        if first is None and notice and notice in line:
            first = time.perf_counter() - t0
    if p.wait() != 0:
        raise SystemExit(f"aifabric {' '.join(args)} failed:\n{''.join(lines)}")
    return {"cpu": child_cpu() - cpu, "wall": time.perf_counter() - t0, "notice": first}


def median_of(repeat: int, args, env, work: Path) -> dict:
    runs = []
    for i in range(repeat):
        runs.append(timed([a.replace("{i}", str(i)) for a in args], env))
        shutil.rmtree(work / f"run-{i}", ignore_errors=True)
    return {k: statistics.median(r[k] for r in runs) for k in ("cpu", "wall")} | {
        "spread": max(r["wall"] for r in runs) / min(r["wall"] for r in runs)
    }


def show(name: str, r: dict) -> None:
    extra = f"  (slowest/fastest wall {r['spread']:.2f})" if "spread" in r else ""
    if r.get("notice") is not None:
        extra += f"  said it was compiling after {r['notice']:.2f} s"
    elif "notice" in r:
        extra += "  compiled nothing"
    print(f"{name:<10} cpu {r['cpu']:7.2f} s   wall {r['wall']:7.2f} s{extra}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--cold", action="store_true", help="also a first run on an empty cache")
    args = ap.parse_args()

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        run = ["run", str(ONE_FLOW), "-o", str(work / "run-{i}")]
        print(f"medians of {args.repeat} runs (os.getloadavg: {os.getloadavg()[0]:.1f})")
        show("version", median_of(args.repeat, ["--version"], env, work))
        median_of(1, run, env, work)  # fills the cache if it is cold
        show("run", median_of(args.repeat, run, env, work))
        if args.cold:
            cold = dict(env, NUMBA_CACHE_DIR=str(work / "numba"))
            one = [a.replace("{i}", "cold") for a in run]
            show("cold run", timed(one, cold, notice="compiling"))
            demo = ["run", "demo", "-o", str(work / "demo")]
            show("demo", timed(demo, cold, notice="compiling"))


if __name__ == "__main__":
    main()
