"""aifabric against htsim's RoCE model on the same work, side by side.

    python benchmarks/bench_htsim.py [k8 k16 incast] [--htsim PATH] [--repeat N] [--warm]
        [--partitions N|auto]

The reference is htsim_roce from Broadcom/csg-htsim, built outside this repository
(in its `sim/`: `make libhtsim.a`, then in `sim/datacenter`: `make htsim_roce`) and
named by --htsim or $HTSIM_ROCE. Without it this prints one line and exits 0.

The cases, each one connection matrix that both simulators read (htsim's `.cm`
format, which `aifabric run` takes as a workload):

  k8      fat-tree-k8 (128 hosts), a random permutation of 2 MB flows
  k16     fat-tree-k16 (1,024 hosts), the same
  incast  fat-tree-k16, 64 hosts each send 1 MB to one

Both at 100 Gb/s, a 4,000-byte MTU and 0.5 us per link, per-flow ECMP, PFC on,
no congestion control; aifabric set to htsim's conventions: an ACK per packet,
per-port static buffers pausing an ingress port at 15 packets and resuming it at
12 (htsim's LosslessInputQueue defaults), 64 bytes of header overhead per packet.

Each case alternates whole commands (`htsim_roce ...` and `aifabric run ...`, a
process each, as a user runs them; aifabric's kernels already compiled) `--repeat`
times and prints the medians of CPU seconds (user + system), wall seconds and
peak memory, and the ratio reference / aifabric (above 1: aifabric is faster).
`--warm` also times aifabric's run inside one process after a first run, as a
sweep worker runs it. Beside the times, each prints what it simulated (flows
finished and the last one's end, from the first run: htsim's varies a little from
run to run, aifabric's does not), so a reader sees both did the same work.
aifabric runs on one partition (one core, as htsim) unless `--partitions` says
otherwise: `--partitions 2` for its wall time on two cores (its results are the same).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MTU = 4000
PFC_HIGH_PACKETS, PFC_LOW_PACKETS = 15, 12  # htsim_roce's LosslessInputQueue defaults
HEADER_OVERHEAD = 64  # htsim's per-packet header bytes beside the payload


@dataclass(frozen=True)
class Case:
    name: str
    topology: str
    hosts: int
    pairs: tuple[tuple[int, int], ...]
    size: int


def permutation(hosts: int, seed: int) -> tuple[tuple[int, int], ...]:
    """Every host sends to one other and receives from one (no host to itself)."""
    rng = random.Random(seed)
    while True:
        dst = list(range(hosts))
        rng.shuffle(dst)
        if all(d != s for s, d in enumerate(dst)):
            return tuple(enumerate(dst))


def cases(seed: int) -> dict[str, Case]:
    incast = tuple((s, 0) for s in range(1, 65))
    return {
        "k8": Case("k8", "fat-tree-k8", 128, permutation(128, seed), 2_000_000),
        "k16": Case("k16", "fat-tree-k16", 1024, permutation(1024, seed), 2_000_000),
        "incast": Case("incast", "fat-tree-k16", 1024, incast, 1_000_000),
    }


def write_matrix(case: Case, path: Path) -> None:
    """The case as htsim's connection matrix."""
    lines = [f"Nodes {case.hosts}", f"Connections {len(case.pairs)}"]
    for i, (s, d) in enumerate(case.pairs):
        lines.append(f"{s}->{d} id {i + 1} start 0 size {case.size}")
    path.write_text("\n".join(lines) + "\n")


def write_scenario(case: Case, matrix: Path, path: Path, partitions: str = "1") -> None:
    """An aifabric scenario running the matrix under htsim's conventions."""
    path.write_text(
        f"""[scenario]
topology = "{case.topology}"
workload = "./{matrix.name}"

[simulator]
partitions = {partitions if partitions != "auto" else '"auto"'}

[queue]
model = "static"
pfc_xoff = "{PFC_HIGH_PACKETS * MTU}B"
pfc_xon = "{PFC_LOW_PACKETS * MTU}B"

[congestion_control]
kind = "none"
ack_every = 1
header_overhead = {HEADER_OVERHEAD}
"""
    )


def htsim_command(binary: str, case: Case, matrix: Path) -> list[str]:
    return [
        binary, "-tm", str(matrix), "-nodes", str(case.hosts), "-tiers", "3",
        "-linkspeed", "100000", "-mtu", str(MTU), "-hop_latency", "0.5",
        "-strat", "ecmp_host", "-paths", "1", "-end", "1000000", "-o", os.devnull,
    ]  # fmt: skip


@dataclass
class Timing:
    cpu_s: float
    wall_s: float
    peak_mib: float
    done: int
    last_end_us: float


def timed(command: list[str], cwd: Path) -> tuple[Timing, str]:
    """Run `command` in `cwd`; its CPU (user + system), wall, peak memory and its stdout.
    The peak is the process's VmHWM, read while it runs: its rusage would count this
    process's memory too, which the child shares until it executes the command."""
    out_path, err_path = cwd / "stdout.txt", cwd / "stderr.txt"
    actions = [
        (os.POSIX_SPAWN_OPEN, 1, str(out_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_OPEN, 2, str(err_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    ]
    here = os.getcwd()
    os.chdir(cwd)  # posix_spawn has no cwd of its own
    try:
        t0 = time.perf_counter()
        pid = os.posix_spawnp(command[0], command, os.environ, file_actions=actions)
    finally:
        os.chdir(here)
    peak_kib = 0
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        peak_kib = max(peak_kib, _hwm_kib(pid))
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench_htsim: {' '.join(command[:2])} failed:\n{err_path.read_text()[-2000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    return Timing(cpu, wall, peak_kib / 1024, 0, 0.0), out_path.read_text()


def _hwm_kib(pid: int) -> int:
    """The resident high-water mark of a running process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_htsim(binary: str, case: Case, matrix: Path, work: Path) -> Timing:
    t, out = timed(htsim_command(binary, case, matrix), work)
    ends = [float(m) for m in re.findall(r"finished at ([0-9.]+)", out)]
    t.done, t.last_end_us = len(ends), max(ends, default=0.0)
    return t


def run_aifabric(scenario: Path, work: Path) -> Timing:
    out_dir = work / "run"
    command = [sys.executable, "-m", "aifabric", "run", str(scenario), "-o", str(out_dir)]
    t, _ = timed([*command, "--force"], work)
    return _with_results(t, out_dir)


def _with_results(t: Timing, out_dir: Path) -> Timing:
    summary = json.loads((out_dir / "run.json").read_text())["results"]["summary"]
    t.done, t.last_end_us = summary["flows_done"], summary["completion_ns"] / 1000
    return t


def run_warm(scenario: Path, work: Path, repeat: int) -> list[Timing]:
    """aifabric's run inside this process, after a first run that loads everything."""
    from aifabric import api

    out = []
    for i in range(repeat + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        api.run(str(scenario), work / "warm", force=True)
        t = Timing(time.process_time() - c0, time.perf_counter() - t0, 0.0, 0, 0.0)
        if i:
            out.append(_with_results(t, work / "warm"))
    return out


def median(values) -> float:
    return statistics.median(values)


def report(what: str, runs: list[Timing]) -> None:
    t = runs[0]
    peak = median(r.peak_mib for r in runs)
    print(
        f"  {what:<22} CPU {median(r.cpu_s for r in runs):7.2f} s  "
        f"wall {median(r.wall_s for r in runs):7.2f} s  "
        f"peak {f'{peak:.0f} MiB' if peak else '-':>8}  "
        f"flows {t.done}, last ends at {t.last_end_us:,.1f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("cases", nargs="*", help="of k8 k16 incast (default: all)")
    ap.add_argument("--htsim", default=os.environ.get("HTSIM_ROCE"), help="htsim_roce binary")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1, help="the permutations' seed")
    ap.add_argument("--warm", action="store_true", help="also time aifabric in a warm process")
    ap.add_argument("--partitions", default="1", help="aifabric's partitions (N or auto)")
    args = ap.parse_args()
    binary = args.htsim and shutil.which(args.htsim)
    if not binary:
        print(
            "bench_htsim: no htsim_roce binary (build it from github.com/Broadcom/csg-htsim and "
            "pass --htsim PATH or set HTSIM_ROCE); nothing to compare"
        )
        return
    known = cases(args.seed)
    chosen = args.cases or list(known)
    unknown = [c for c in chosen if c not in known]
    if unknown:
        ap.error(f"unknown case {unknown[0]!r}: choose from {', '.join(known)}")
    print(f"reference: {binary}; {args.repeat} alternating runs each, medians")
    with tempfile.TemporaryDirectory(prefix="bench-htsim-") as tmp:
        for name in chosen:
            compare(known[name], Path(tmp) / name, binary, args.repeat, args.warm, args.partitions)


def compare(
    case: Case, work: Path, binary: str, repeat: int, warm: bool, partitions: str = "1"
) -> None:
    """One case: alternating whole commands, then (with `warm`) aifabric in this process."""
    work.mkdir()
    matrix, scenario = work / f"{case.name}.cm", work / f"{case.name}.toml"
    write_matrix(case, matrix)
    write_scenario(case, matrix, scenario, partitions)
    run_aifabric(scenario, work)  # a first run: the kernel cache is warm after it
    ref, aif = [], []
    for _ in range(repeat):
        ref.append(run_htsim(binary, case, matrix, work))
        aif.append(run_aifabric(scenario, work))
    load = os.getloadavg()[0]
    flows = f"{len(case.pairs)} flows of {case.size:,} B"
    print(
        f"{case.name}: {case.topology}, {flows}, aifabric partitions {partitions} (load {load:.1f})"
    )
    report("htsim_roce", ref)
    report("aifabric run", aif)
    ref_cpu = median(r.cpu_s for r in ref)
    ratio_wall = median(r.wall_s for r in ref) / median(r.wall_s for r in aif)
    line = f"  reference / aifabric:  CPU {ref_cpu / median(r.cpu_s for r in aif):.2f}x"
    line += f"  wall {ratio_wall:.2f}x (command)"
    if warm:
        runs = run_warm(scenario, work, repeat)
        report("aifabric, warm process", runs)
        line += f", CPU {ref_cpu / median(r.cpu_s for r in runs):.2f}x (warm)"
    print(line)


if __name__ == "__main__":
    main()
