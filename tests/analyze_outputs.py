"""What `aifabric analyze` prints (text, --json, --json --series) for every scenario preset
and every capture of tests/data: the outputs `tests/test_analyze_outputs.py` holds equal,
byte for byte, to those recorded in tests/data/analyze/ (first written by the code before
the metrics became typed results; re-recorded once when rich took over the tables' layout,
the --json outputs then differing only by the `cost_ns` that hot ports' rows used to carry;
re-recorded when each op gained `protocol` and `predicted_ns`, the --json outputs differing
by those two keys alone; re-recorded when collectives became streams with NCCL's latencies
and the source ports the Linux RDMA core's: the presets' times, flows and ports changed;
re-recorded when DCQCN's default preset began to follow the NICs' line rate, cx-400g on
lab-medium instead of paper-40g: demo, ecmp-permutation and link-failure changed;
re-recorded for link-failure alone when `analyze` gained its faults section, which only
that preset's outputs show; re-recorded when a job of patterns (an incast, a permutation)
got a goodput instead of a busbw: the five presets' jobs tables gained a goodput column and
their --json jobs `goodput_bps`, the pattern jobs' busbw left empty, nothing else;
re-recorded when events of one picosecond began to be taken in a fixed order of kind and
port or flow rather than first scheduled, first served, and ECN marking to draw from a
random stream per port: times, queues and counters moved where events tie).

    .venv/bin/python -m tests.analyze_outputs     re-record them (after a deliberate change)

A run's directory is written as RUN in the outputs (it is a temporary folder).
"""

from __future__ import annotations

import gzip
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).parent / "data"
RECORDED = DATA / "analyze"
VARIANTS = {"text": [], "json": ["--json"], "series": ["--json", "--series"]}
# one preset also with a capture, so that a run's capture metrics are covered
CAPTURED = {"incast-pfc": "z0-r0-h1-nic7"}


def presets() -> list[str]:
    from aifabric.scenarios import scenario_presets

    return scenario_presets()


def captures() -> list[Path]:
    """The captures of tests/data that `analyze` reads (one is not a capture at all)."""
    from aifabric.analysis.capture import sniff

    pcaps = (p for p in DATA.iterdir() if p.suffix in (".pcap", ".pcapng"))
    return sorted(p for p in pcaps if sniff(p) is not None)


def simulate(preset: str, path: Path) -> None:
    """The preset on the simulator into `path` (captures as `CAPTURED` says)."""
    from aifabric.engines import run_scenario
    from aifabric.scenarios import load_scenario, with_captures

    sc = load_scenario(preset)
    if preset in CAPTURED:
        sc = with_captures(sc, [CAPTURED[preset]])
    run_scenario("sim", sc, path)


def analyze(target: Path, variant: str) -> str:
    """`aifabric analyze TARGET` as printed, the run directory's path written RUN."""
    from click.testing import CliRunner

    from aifabric.cli import main

    r = CliRunner().invoke(main, ["analyze", str(target), *VARIANTS[variant]])
    assert r.exit_code == 0, r.output
    return r.stdout.replace(str(target), "RUN") if target.is_dir() else r.stdout


def recorded_name(name: str, variant: str) -> str:
    return f"{name}.{variant}.gz"


def read_recorded(name: str, variant: str) -> str:
    return gzip.decompress((RECORDED / recorded_name(name, variant)).read_bytes()).decode()


def record() -> None:
    RECORDED.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        targets = []
        for preset in presets():
            path = Path(tmp) / preset
            simulate(preset, path)
            targets.append((preset, path))
        targets += [(p.name, p) for p in captures()]
        for name, target in targets:
            for variant in VARIANTS:
                out = analyze(target, variant).encode()
                # mtime 0: the same output makes the same file
                blob = gzip.compress(out, mtime=0)
                (RECORDED / recorded_name(name, variant)).write_bytes(blob)
                print(f"{name} {variant}: {len(out):,} bytes", file=sys.stderr)


if __name__ == "__main__":
    record()
