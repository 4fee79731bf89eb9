"""Warm-up: the kernels compiled ahead of the first run, and a user told whenever numba compiles."""

from __future__ import annotations

import io
import json
import time

from click.testing import CliRunner
from numba import njit

from aifabric import warmup
from aifabric.cli import main

ONE_FLOW = """
[scenario]
topology = "lab-small"

[workload]
pattern = "incast"
senders = 1
gpus = 2
size = "4KiB"
"""

OTHER = """
[scenario]
topology = "lab-small"
seed = 7
sample_interval = "3us"
captures = ["z0-r1-h0-nic0"]

[workload]
collective = "alltoall"
size = "512KiB"
gpus = 16

[ecmp]
policy = "eecmp"
same_seed = true

[queue]
ecn_kmin = "20KiB"

[congestion_control]
kind = "dcqcn"
rate_timer = "20us"

[[faults]]
link = "z0-r1-rtsw--z0-ctsw1"
at = "5us"
"""


def test_after_warm_up_other_runs_and_analyses_compile_nothing(tmp_path):
    import tomllib

    from aifabric.analysis.capture import read_capture
    from aifabric.analysis.metrics import capture_metrics, run_metrics
    from aifabric.engines import Stop, run_scenario
    from aifabric.fabric.rundir import Run
    from aifabric.fabric.spread import random_spread
    from aifabric.scenarios import scenario_from_dict
    from aifabric.topologies import load_fabric

    warmup.warm_up()
    out = io.StringIO()
    with warmup.compile_notice(out) as notice:
        sc = scenario_from_dict(tomllib.loads(OTHER), "other")
        run_scenario("sim", sc, tmp_path / "run", stop=Stop())
        run_metrics(Run(tmp_path / "run"), series=True)
        (pcap,) = (tmp_path / "run" / "captures").glob("*.pcap")
        capture_metrics(read_capture(pcap))
        random_spread(load_fabric("lab-medium"), 100, "5tuple", qps=2, same_seed=True)
    assert notice.compiled_s == 0 and out.getvalue() == ""


def test_a_compile_is_announced_when_it_starts():
    @njit
    def fresh(x):
        return x + 1

    out = io.StringIO()
    with warmup.compile_notice(out) as notice:
        assert fresh(2) == 3
        said = out.getvalue()
        fresh(3)  # compiled already: nothing more
    assert said.startswith("aifabric: compiling kernels the cache does not hold (about ")
    assert out.getvalue() == said and notice.compiled_s > 0
    fresh(2.5)  # a new signature outside the block: the listener is gone
    assert out.getvalue() == said


def test_while_numba_compiles_the_seconds_so_far_are_reported(monkeypatch):
    monkeypatch.setattr(warmup.CompileNotice, "LOG_TICK_S", 0.05)
    out = io.StringIO()
    notice = warmup.CompileNotice(out, announce=True)
    notice.on_start()
    notice.on_start()  # a callee compiled inside its caller
    time.sleep(0.5)
    notice.on_end()
    assert notice.compiled_s == 0  # the caller is still compiling
    notice.on_end()
    notice.stop()
    head, *ticks = out.getvalue().splitlines()
    assert head.startswith("aifabric: compiling kernels the cache does not hold")
    assert ticks and all(t.startswith("  compiling: ") and t.endswith(" s") for t in ticks)
    assert notice.compiled_s >= 0.5


def test_a_run_on_a_cache_without_the_marker_warms_up_first_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    scenario = tmp_path / "one.toml"
    scenario.write_text(ONE_FLOW)
    assert not warmup.is_warm()

    first = CliRunner().invoke(main, ["run", str(scenario), "-o", str(tmp_path / "a"), "--json"])
    assert first.exit_code == 0, first.output
    assert first.stderr.startswith("aifabric: compiling the simulator's kernels (about ")
    assert "aifabric: kernels ready in " in first.stderr
    assert json.loads(first.stdout)["flows_done"] == 1
    assert warmup.is_warm()

    again = CliRunner().invoke(main, ["run", str(scenario), "-o", str(tmp_path / "b"), "--json"])
    assert again.exit_code == 0, again.output
    assert "compiling" not in again.stderr


def test_a_failed_warm_up_is_one_line_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))

    def broken(should_stop=None):
        raise OSError("disk full")

    monkeypatch.setattr(warmup, "warm_up", broken)
    scenario = tmp_path / "one.toml"
    scenario.write_text(ONE_FLOW)
    r = CliRunner().invoke(main, ["run", str(scenario), "-o", str(tmp_path / "a"), "--json"])
    assert r.exit_code == 0, r.output
    assert "aifabric: the warm-up failed (OSError: disk full); going on\n" in r.stderr
    assert json.loads(r.stdout)["flows_done"] == 1
    assert not warmup.is_warm()


def test_a_mistake_in_the_command_is_reported_before_any_warm_up(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(main, ["run", "no-such-scenario"])
    assert r.exit_code == 1 and "unknown scenario" in r.output
    assert "compiling" not in r.stderr and not warmup.is_warm()


def test_only_a_full_compile_sets_the_estimate_a_warm_up_announces(tmp_path, monkeypatch):
    """A warm-up that compiles only a few kernels (a marked cache and a new signature, or an
    unmarked cache that holds some) does not make the next full compile promise seconds."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))

    def compiles_one(should_stop=lambda: False):
        @njit
        def fresh(x):
            return x * 3

        fresh(1)

    monkeypatch.setattr(warmup, "warm_up", compiles_one)
    estimate = warmup._numba_cache.cache_root() / warmup.ESTIMATE_FILE
    warmup.run(io.StringIO())  # no marker: a full compile, timed
    assert warmup.is_warm() and estimate.is_file()
    estimate.write_text("80.0\n")
    out = io.StringIO()
    warmup.run(out)  # marked: what compiles now is not the whole set
    assert "compiling kernels the cache does not hold (about 80 s" in out.getvalue()
    assert estimate.read_text() == "80.0\n"
    (tmp_path / "cache" / warmup.MARKER).unlink()
    (tmp_path / "cache" / "kernel.nbi").write_bytes(b"")
    warmup.run(io.StringIO())  # unmarked, but some kernels come from the cache
    assert estimate.read_text() == "80.0\n"


# Small kernels that are called with more than one set of argument types; each copy costs
# well under a second to compile. The last four: the kernel passes them the packet table's
# int32 wire bytes, and tests/test_sim_kernels.py and test_sim_shared_buffer.py call them
# from Python, whose ints are int64 (the same cache holds both copies once those have run).
SMALL = {
    "heap.schedule", "kernel.record", "kernel.drop", "kernel.send_pfc", "kernel.wait_tx",
    "queue.dequeue", "queue.enqueue", "queue.settle", "pfc.pause_ps", "buffer.release_egress",
    "pfc.admit", "pfc.release", "buffer.admit_lossless", "buffer.admit_egress",
}  # fmt: skip


def test_every_large_kernel_compiles_once():
    """numba compiles a called kernel once per set of argument types, and a constant or an
    int32 argument is a type of its own: one `send_control(S, f, K_CNP, 0, now)` among
    int64 calls compiles `send_control`, and all it inlines, a second time. The warm-up
    reaches every kernel; the cache then holds one file per compiled copy of each."""
    import re
    from collections import Counter

    warmup.warm_up()  # a moment on a warm cache; what is missing compiles
    copies = Counter()
    for f in warmup.cache_dir().glob("sim_*/*.nbc"):
        m = re.fullmatch(r"(\w+\.\w+)-\d+\.py\d+\.\d+\.nbc", f.name)
        assert m, f.name
        copies[m.group(1)] += 1
    for name in ("kernel.run", "kernel.kick", "kernel.send_control", "kernel.send_ack"):
        assert copies[name] == 1, name
    more = {name: n for name, n in copies.items() if n > 1 and name not in SMALL}
    assert not more, f"compiled more than once: {more}"
