"""Warm-up: the kernels compiled ahead of the first run, and a user told whenever numba compiles."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
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

# three flows into one NIC, on two partitions
TWO_PARTITIONS = (
    ONE_FLOW.replace("senders = 1", "senders = 3").replace("gpus = 2", "gpus = 4")
    + "\n[simulator]\npartitions = 2\n"
)

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
# well under a second to compile. The loop passes some of them a packet row's int32 fields
# (its wire bytes, a port), which tests/test_sim_kernels.py and test_sim_shared_buffer.py
# pass from Python as int64 (the same cache holds both copies once those have run); and
# it hands its callees borrowed arrays (`kernel.BorrowedArray`), where the tests of the
# heap, ECN and DCQCN and the simulator's Python layer pass ordinary ones: a copy for
# each. A kernel the loop calls from many places with constants and int32 fields takes
# them through a wrapper inlined at each that passes int64 on (`heap.schedule`,
# `kernel.drop`); called directly, they compiled 18 copies of the event list's push and
# two of `drop`.
SMALL = {
    "heap._schedule", "kernel.record", "kernel.send_pfc", "kernel.wait_tx",
    "queue.dequeue", "queue.enqueue", "queue.settle", "pfc.pause_ps", "buffer.release_egress",
    "pfc.admit", "pfc.release", "buffer.admit_lossless", "buffer.admit_egress",
    "heap.advance", "ecn.uniform", "dcqcn.cut", "dcqcn.decay_alpha", "dcqcn.increase",
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
    assert copies["kernel._drop"] == 1
    assert 1 <= copies["heap._schedule"] <= 2  # the loop's arrays, and Python's
    more = {name: n for name, n in copies.items() if n > 1 and name not in SMALL}
    assert not more, f"compiled more than once: {more}"


def test_after_warm_up_a_run_on_two_partitions_compiles_nothing(tmp_path):
    """With a core per partition, partitions run in `windows` (aifabric.sim.windows). The
    warm-up did not compile it, so a user's first partitioned run did (11-12 s)."""
    import tomllib

    from aifabric.engines import Stop, run_scenario
    from aifabric.scenarios import scenario_from_dict
    from aifabric.sim.partition import cores

    if cores() < 2:
        pytest.skip("partitions run in windows only with a core each")
    warmup.warm_up()
    out = io.StringIO()
    with warmup.compile_notice(out) as notice:
        sc = scenario_from_dict(tomllib.loads(TWO_PARTITIONS), "two")
        run_scenario("sim", sc, tmp_path / "run", stop=Stop())
    summary = json.loads((tmp_path / "run" / "run.json").read_text())["results"]["summary"]
    assert summary["partitions"]["partitions"] == 2
    assert notice.compiled_s == 0 and out.getvalue() == ""


def test_the_partitions_kernel_holds_no_copy_of_the_event_loop():
    """numba links a called kernel's code into its caller's and compiles it all again:
    `windows` calling the loop took 9.5 s to compile, 8 of them the loop once more. It
    calls the loop at its address now (`windows.call_loop`), so its compiled code in the
    cache is a fraction of the loop's."""
    import re

    warmup.warm_up()
    size: dict[str, list[int]] = {}
    for f in warmup.cache_dir().glob("sim_*/*.nbc"):
        name = re.fullmatch(r"(\w+\.\w+)-\d+\.py\d+\.\d+\.nbc", f.name).group(1)
        size.setdefault(name, []).append(f.stat().st_size)
    assert size["windows.windows"] and size["kernel.run"]
    assert max(size["windows.windows"]) < min(size["kernel.run"]) / 3, size


def test_the_loops_callees_are_the_kernels_it_calls_each_after_those_it_calls():
    """What a full compile shares among processes: kernels of kernel.py and of the
    congestion-control hooks that the event loop calls rather than inlines, taking the state
    first, and the event list's refill; the loop itself left out; each after the callees it
    calls (`kick` after `send_pfc`, `release` after `kick`), so that a process seldom waits
    for another's compile."""
    import inspect

    from aifabric.sim import congestion, heap, kernel, precompile

    names = precompile.callees()
    source = "".join(inspect.getsource(m) for m in (kernel, congestion, heap))
    assert "kernel.run" not in names and "kernel.borrowed" not in names and len(names) > 25
    assert len(set(names)) == len(names)
    for name in names:
        module, _, fn = name.partition(".")
        d = getattr({"kernel": kernel, "congestion": congestion}.get(module) or heap, fn)
        assert d.targetoptions.get("inline") != "always", name
        first = list(inspect.signature(d.py_func).parameters)[0]
        assert first == "S" or name == "heap.advance", name
        assert f"{fn}({first}" in source.replace(f"def {fn}({first}", ""), name  # called
    for caller, callee in (("kick", "send_pfc"), ("kick", "put_pfc_on_wire"),
                           ("release", "kick"), ("send_control", "kick"),
                           ("send_ack", "send_control")):  # fmt: skip
        assert names.index(f"kernel.{callee}") < names.index(f"kernel.{caller}"), caller
    for i, name in enumerate(names):  # nothing it calls comes later
        m, _, fn = name.partition(".")
        d = getattr({"kernel": kernel, "congestion": congestion}.get(m) or heap, fn)
        later = {id(getattr(kernel, n.partition(".")[2], None)) for n in names[i + 1 :]}
        assert not {id(c) for c in precompile._calls(d, set())} & later, name
    assert {"congestion.on_cnp", "congestion.on_timer", "heap.advance"} <= set(names)
    inlined = {n for n, d in vars(kernel).items() if getattr(d, "targetoptions", {}).get("inline")}
    assert not inlined & {n.partition(".")[2] for n in names} and "start_frame" in inlined


def test_a_kernel_another_process_is_compiling_is_waited_for_not_compiled_again(tmp_path):
    """In a full compile a kernel compiles in one process at a time: a process that needs
    one another holds (its lock file beside the shared counter) waits, then finds it in
    the cache, instead of compiling it, and all it calls, a second time. Outside, the
    kernels compile as numba does."""
    import fcntl
    import threading

    import numba
    import numpy as np

    from aifabric.sim import heap, precompile

    counter = str(tmp_path / "next")
    sig = (numba.typeof(np.zeros((4, 16, 5), np.int64)), numba.typeof(np.zeros(8, np.int64)))
    with open(f"{counter}.aifabric.sim.heap.advance.lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another process is compiling it
        with precompile.one_at_a_time(counter):
            assert "compile" in vars(heap.advance)
            done = threading.Event()
            waiter = threading.Thread(target=lambda: (heap.advance.compile(sig), done.set()))
            waiter.start()
            waiter.join(1.0)
            assert waiter.is_alive() and not done.is_set()
            fcntl.flock(other, fcntl.LOCK_UN)
            waiter.join(120)
            assert done.is_set()
    assert "compile" not in vars(heap.advance) and sig in heap.advance.signatures


def test_a_process_takes_a_callee_whose_callees_are_compiled_first(tmp_path):
    """`take` gives the first callee not taken whose callees are done, else the first not
    taken (its compile waits for what it needs), then n."""
    from aifabric.sim import precompile

    counter = tmp_path / "next"
    counter.write_text("")
    needs = [set(), {0}, set(), {1}]
    assert [precompile.take(str(counter), 4, needs) for _ in range(2)] == [0, 2]
    assert precompile.take(str(counter), 4, needs) == 1  # 0 still compiling: none ready
    precompile.done(str(counter), 0)
    precompile.done(str(counter), 1)
    assert precompile.take(str(counter), 4, needs) == 3
    assert precompile.take(str(counter), 4, needs) == 4
    assert precompile.compiled(str(counter)) == 2


def test_a_callee_whose_callee_was_taken_by_a_process_that_is_gone_still_compiles(tmp_path):
    """A process that took a callee and died (no lock held, never marked done) does not
    hold the others up: the callee that needs it compiles it inside its own compile."""
    import threading

    from aifabric.sim import kernel, precompile

    counter = tmp_path / "next"
    counter.write_text(" 0")  # `complete`, taken by a process that is gone
    names = ["kernel.complete", "kernel.acknowledged"]
    assert precompile.needs(names) == [set(), {0}]
    worker = threading.Thread(
        target=precompile.work, args=(str(counter), names, warmup.bare_simulation)
    )
    worker.start()
    worker.join(120)
    assert not worker.is_alive()
    assert precompile.compiled(str(counter)) == 1 and kernel.acknowledged.signatures


def test_a_callee_compiles_for_the_types_the_loop_passes():
    """`compile_callee` types `S` as the loop's state, a parameter named as one of the
    state's fields as that field, the rest as int64: what the loop passes."""
    from numba import types

    from aifabric.sim import congestion, heap, precompile

    state = precompile.state_type(warmup.small_simulation())
    fields = dict(zip(state.fields, state.types, strict=True))
    precompile.compile_callee("heap.advance", state)
    precompile.compile_callee("congestion.on_timer", state)
    assert (fields["ev"], fields["g"]) in heap.advance.signatures
    assert (state, types.int64, types.int64) in congestion.on_timer.signatures


def test_the_loop_compiles_for_a_simulation_without_flows_as_for_a_run():
    """A full compile starts the loop, and its callees, on a simulation with no flows, which
    routes nothing (no routing kernel compiles before the loop): its state has the types
    of a run's state, so a run loads that machine code."""
    import numba

    bare, small = warmup.bare_simulation(), warmup.small_simulation()
    assert len(bare.flows) == 0 and len(small.flows) > 0
    assert numba.typeof(bare._state()) == numba.typeof(small._state())
    assert bare.path_ptr.tolist() == [0]


def test_a_step_queued_for_the_loop_runs_after_its_untyped_passes_before_typing():
    """`pipeline.LoopCompiler` (the event loop's pipeline) runs what `BEFORE_TYPING`
    holds once, when the untyped passes are done and no call has been typed: a callee is
    not compiled yet. The next compile finds nothing queued."""
    from numba import njit

    from aifabric.sim import kernel, pipeline

    @njit
    def callee(x):
        return x + 1

    @njit(pipeline_class=pipeline.LoopCompiler)
    def loop(x):
        return callee(x) * 2

    seen = []
    pipeline.BEFORE_TYPING.append(lambda: seen.append(len(callee.signatures)))
    assert loop(3) == 8
    assert seen == [0] and not pipeline.BEFORE_TYPING and len(callee.signatures) == 1
    assert loop(2.5) == 7.0 and seen == [0]
    assert kernel.run._compiler.pipeline_class is pipeline.LoopCompiler

    def stop():
        raise warmup.Stopped

    pipeline.BEFORE_TYPING.append(stop)  # a warm-up asked to stop: the compile ends there
    with pytest.raises(warmup.Stopped):
        loop(complex(1, 1))  # types not compiled yet
    assert loop(complex(1, 1)) == complex(4, 2) and not pipeline.BEFORE_TYPING


def test_a_full_compile_asked_to_stop_ends_before_the_loop_types_its_calls():
    with pytest.raises(warmup.Stopped):  # noqa: SIM117 (the context's exit is tested too)
        with warmup.callees_everywhere(lambda: True, processes=1) as finish:
            finish()


def test_processes_sharing_the_callees_take_each_once(tmp_path):
    """The counter the compiling processes share: three processes taking indices at once
    get every index once."""
    import subprocess
    import sys

    counter = tmp_path / "next"
    counter.write_text("")
    code = (
        "import sys\n"
        "from aifabric.sim.precompile import take\n"
        "got = []\n"
        "while (i := take(sys.argv[1], 300)) < 300:\n"
        "    got.append(i)\n"
        "print(' '.join(map(str, got)))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(counter)], stdout=subprocess.PIPE)
        for _ in range(3)
    ]
    taken = [int(x) for p in procs for x in p.communicate()[0].split()]
    assert sorted(taken) == list(range(300))


@pytest.mark.slow
def test_a_full_compile_on_two_processes_leaves_a_cache_the_loop_uses_whole(tmp_path):
    """`aifabric warmup --processes 2` on an empty cache: a helper process compiles some of
    the loop's callees; afterwards a run compiles nothing and no large kernel was compiled
    twice (a callee compiled for argument types the loop does not use would be)."""
    import re
    import subprocess
    import sys
    from collections import Counter

    from aifabric.sim.partition import cores

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run(
        [sys.executable, "-m", "aifabric", "warmup", "--processes", "2"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert re.search(r"kernels ready in \d+ s \(\d+ s of CPU\)", r.stderr), r.stderr
    # two processes were at work: the helper compiled (its start alone takes about 1 s of
    # CPU, its share of the callees tens); not CPU against wall time, which the load moves
    took = json.loads((tmp_path / "cache" / warmup.MARKER).read_text())
    assert took["helpers_cpu_s"] > 5, took

    def first_run(text: str, name: str) -> subprocess.CompletedProcess:
        scenario = tmp_path / f"{name}.toml"
        scenario.write_text(text)
        return subprocess.run(
            [sys.executable, "-m", "aifabric", "run", str(scenario), "-o", str(tmp_path / name)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    again = first_run(ONE_FLOW, "one")
    assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr
    if cores() >= 2:  # partitions in `windows`, which a helper compiled beside the loop
        two = first_run(TWO_PARTITIONS, "two")
        assert two.returncode == 0 and "compiling" not in two.stderr, two.stderr
        assert "partitions        2, windows of" in two.stdout, two.stdout
    copies = Counter()
    for f in (tmp_path / "cache").glob("sim_*/*.nbc"):
        copies[re.fullmatch(r"(\w+\.\w+)-\d+\.py\d+\.\d+\.nbc", f.name).group(1)] += 1
    assert copies["kernel.run"] == copies["kernel.kick"] == 1
    assert not {n: k for n, k in copies.items() if k > 1 and n not in SMALL}
