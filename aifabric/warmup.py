"""Compile the numba kernels ahead of the first run, and say so whenever numba compiles.

numba compiles a kernel the first time it is called and keeps the machine code
in the cache directory (`aifabric.fabric._numba_cache`); compiling all of them costs
about two minutes of CPU. `warm_up()` does that once, at install time
(`aifabric warmup`, run by scripts/install), by running tiny scenarios through
the public entry points: every congestion-control kind of `aifabric.fabric.cc.KINDS`,
every ECMP policy, a link failure and a drained switch, a lossy queue, a run on two
partitions, a capture read back and analysed, the traffic packetizer, the emulator's
packet filler. It touches no kernel by name, so it keeps covering them whatever their
internals become. When it is done it leaves a marker in the cache directory.

A full compile (an empty cache directory) compiles the kernels the simulator's event loop
calls in helper processes, one per core but this one (`aifabric.sim.precompile`), while
the loop starts compiling here; before it types its calls it compiles a share of those
left and waits for the rest, then loads them all from the cache (`aifabric.sim.pipeline`).
All are compiled for a simulation without flows (`bare_simulation`), which needs no
routing kernel first. The helpers then compile what the warm-up would reach only after
the loop: routing, the Python layer's entry points to the loop, a capture's reading.

A run that finds no marker (a new version's sources make a new, empty cache
directory) warms up first, after one line saying what it is doing and about
how long it takes (`ensure_warm`). `compile_notice()` catches the rest: if
numba compiles anything while it is active (a kernel the warm-up missed, a
cache numba found stale), it says so when compiling starts and keeps a
counter of the seconds on a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from aifabric.fabric import _numba_cache
from aifabric.fabric.files import ended_with_us, forget, temporary_directory

MARKER = "aifabric-warm.json"
ESTIMATE_FILE = "compile-seconds"
DEFAULT_ESTIMATE_S = 70  # wall seconds of a full compile on 2 cores, numba 0.68 (65-72 measured
# on 2 processes, 2026-12-06)
TOPOLOGY = "lab-small"


def cache_dir() -> Path | None:
    """The directory numba writes compiled kernels to (None: numba's own default places)."""
    d = os.environ.get("NUMBA_CACHE_DIR")
    return Path(d) if d else None


def _holds_nothing(d: Path | None) -> bool:
    """Whether the cache directory holds no compiled kernel (numba's index files)."""
    return d is None or next(d.rglob("*.nbi"), None) is None


def is_warm() -> bool:
    """Whether `warm_up()` completed for the current cache directory."""
    d = cache_dir()
    return d is not None and (d / MARKER).is_file()


def estimate_s() -> int:
    """Seconds a full compile took here last time (wall clock), or a default."""
    try:
        return max(1, round(float((_numba_cache.cache_root() / ESTIMATE_FILE).read_text())))
    except (OSError, ValueError):
        return DEFAULT_ESTIMATE_S


def _about(seconds: float) -> str:
    if seconds < 90:
        return f"about {round(seconds)} s"
    return f"about {round(seconds / 60)} min"


class Stopped(Exception):
    """The warm-up was asked to stop between two of its steps (nothing is marked)."""


def warm_up(should_stop=lambda: False) -> None:
    """Call every compiled kernel once with the argument types runs use; between steps,
    `Stopped` if `should_stop()` (a kernel's compile is never cut in the middle)."""
    from aifabric.analysis.capture import read_capture
    from aifabric.analysis.metrics import capture_metrics, run_metrics
    from aifabric.emu.packets import Batch, fill_writes
    from aifabric.engines import Stop, run_scenario
    from aifabric.fabric.routing import POLICIES
    from aifabric.fabric.rundir import Run
    from aifabric.fabric.spread import random_spread
    from aifabric.scenarios import scenario_from_dict
    from aifabric.topologies import load_fabric
    from aifabric.traffic import packetize

    with temporary_directory("aifabric-warmup-") as tmp:
        for i, raw in enumerate(scenarios(POLICIES)):
            if should_stop():
                raise Stopped
            sc = scenario_from_dict(raw, f"warmup-{i}")
            path = Path(tmp) / f"run-{i}"
            # a Stop of its own that installs no handlers: a signal reaches the caller's
            run_scenario("sim", sc, path, stop=Stop())
            run_metrics(Run(path), series=True)
            for pcap in sorted((path / "captures").glob("*.pcap")):
                capture_metrics(read_capture(pcap), series=True)
            packetize(sc.flows, 100 * 10**9)
    fabric = load_fabric(TOPOLOGY)
    for policy in POLICIES:
        random_spread(fabric, 64, policy, trials=2)
    batch = Batch(4, 128)
    fill_writes(batch.buf, batch.lens, 0, 1, 0, 0, 256, 64)


def scenarios(policies) -> list[dict]:
    """Tiny scenarios on lab-small that together reach every kernel and kind."""
    from aifabric.fabric.cc import KINDS
    from aifabric.fabric.model import Role
    from aifabric.topologies import load_fabric

    f = load_fabric(TOPOLOGY)
    up = [
        p
        for p in range(f.n_ports)
        if f.node_role[f.port_node[p]] != Role.NIC and f.node_role[f.port_peer[p]] != Role.NIC
    ]
    spine = f.node_name[f.port_peer[up[0]]]
    jobs = [
        {"name": "ring", "collective": "allreduce", "size": "256KiB", "gpus": 8},
        {"name": "incast", "pattern": "incast", "senders": 3, "size": "64KiB", "gpus": 4},
    ]
    out = []
    for i, kind in enumerate(KINDS):
        for j, policy in enumerate(policies):
            if (i + j) % len(KINDS):
                continue  # each kind with some policies, every policy with some kind
            out.append(
                {
                    "scenario": {"topology": TOPOLOGY, "seed": i, "sample_interval": "2us"},
                    "workload": {"jobs": jobs},
                    "ecmp": {"policy": policy},
                    "congestion_control": {"kind": kind},
                }
            )
    nic = f.node_name[f.nic_ids[0]]
    # two partitions, each in a thread of its own where there are two cores (`windows`)
    out[1]["simulator"] = {"partitions": 2}
    out[0]["scenario"]["captures"] = [nic]
    out[0]["faults"] = [{"link": f.port_names[up[1]].split("#")[0], "at": "1us"}]
    out[-1]["faults"] = [{"node": spine, "at": "1us", "action": "drain"}]
    out[-1]["queue"] = {
        "pfc": False, "buffer": "1MiB", "ecn_kmax": "512KiB",
        "pfc_xoff": "512KiB", "pfc_xon": "384KiB", "pfc_headroom": "128KiB",
    }  # fmt: skip
    return out


def ensure_warm(stream: TextIO | None = None, should_stop=lambda: False) -> bool:
    """Warm up if the cache directory has no marker, saying so first; True if it did.

    Without a cache directory of our own (an unwritable home) there is nothing to
    mark, so nothing is done ahead. A warm-up that fails is reported in one line
    and the caller goes on: its own kernels compile when called (and are announced).
    One asked to stop (`should_stop`) ends after its current step, unmarked.
    """
    stream = stream or sys.stderr
    if cache_dir() is None or is_warm():
        return False
    try:
        run(stream, note="once per version; scripts/install does it ahead", should_stop=should_stop)
    except Stopped:
        return False
    except Exception as e:  # the run itself decides whether it can go on
        stream.write(f"aifabric: the warm-up failed ({type(e).__name__}: {e}); going on\n")
        return False
    return True


def run(
    stream: TextIO | None = None,
    *,
    note: str = "once",
    should_stop=lambda: False,
    processes: int | None = None,
) -> float:
    """Warm up, with a line first and the time it took after on `stream`; its wall seconds.
    A full compile runs on `processes` processes (default: one per core)."""
    stream = stream or sys.stderr
    warm = is_warm()
    whole = not warm and _holds_nothing(cache_dir())  # every kernel compiles: time it
    if warm:
        stream.write("aifabric: checking the simulator's kernels (compiled already)\n")
    else:
        stream.write(
            f"aifabric: compiling the simulator's kernels ({_about(estimate_s())}, {note})\n"
        )
    stream.flush()
    t0, cpu0, helpers0 = time.perf_counter(), _cpu_s(), _cpu_s(children=True)
    with compile_notice(stream, announce=warm) as notice:
        if whole:
            from aifabric.sim import pipeline

            notice.on_start()  # helpers' compiles count as compiling here
            try:
                with callees_everywhere(should_stop, processes) as finish:
                    # the loop starts compiling now and joins the helpers before it types
                    # its calls (aifabric.sim.pipeline)
                    pipeline.BEFORE_TYPING.append(finish)
                    try:
                        compile_loop(bare_simulation())
                        warm_up(should_stop)
                    finally:
                        if finish in pipeline.BEFORE_TYPING:
                            pipeline.BEFORE_TYPING.remove(finish)
            finally:
                notice.on_end()
        else:
            warm_up(should_stop)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    helpers = _cpu_s(children=True) - helpers0
    if whole and notice.compiled_s > wall / 2:
        _write(_numba_cache.cache_root() / ESTIMATE_FILE, f"{wall:.1f}\n")
    d = cache_dir()
    if d is not None:
        took = {"wall_s": wall, "cpu_s": cpu, "helpers_cpu_s": helpers}
        took = {k: round(v, 1) for k, v in took.items()}
        _write(d / MARKER, json.dumps(took) + "\n")
    stream.write(f"aifabric: kernels ready in {wall:.0f} s ({cpu:.0f} s of CPU)\n")
    stream.flush()
    return wall


@contextlib.contextmanager
def callees_everywhere(should_stop=lambda: False, processes: int | None = None):
    """Compile the kernels the simulator's event loop calls (`aifabric.sim.precompile`) in
    `processes - 1` helper processes (default: one per core), and here when the caller
    calls the function this yields: it takes its share of what is left and returns when
    every callee is in the cache (once; later calls return at once), or raises `Stopped`
    if `should_stop()`. Leaving the context does the same, then waits for the helpers'
    work after the callees, so everything is compiled when it ends normally. A helper is
    `python -m aifabric.warmup --callees ...`, not a fork: nothing of the caller's program
    runs again in it. One that cannot start, or fails, leaves its share to this process
    (or to the loop's own compile); one still at work when `should_stop()`, or when the
    context ends on an error, is stopped."""
    import subprocess

    from aifabric.sim.precompile import callees, compiled, cores, done_file, work

    names = callees()
    helpers = []
    finished = []

    def finish() -> None:
        if finished:
            return
        finished.append(True)
        work(counter, names, bare_simulation, should_stop)
        # every callee compiled, or no helper left to compile one it took
        while compiled(counter) < len(names) and not should_stop():
            if all(p.poll() is not None for p in helpers):
                return
            time.sleep(0.05)
        if should_stop():  # inside the loop's compile: it ends here, before typing
            raise Stopped

    with temporary_directory("aifabric-compile-") as tmp:
        counter = str(Path(tmp) / "next")
        Path(counter).write_text("")
        Path(done_file(counter)).write_text("")
        command = [sys.executable, "-m", "aifabric.warmup", "--callees", counter, *names]
        try:
            for _ in range(min(processes or cores(), len(names)) - 1):
                with contextlib.suppress(OSError):
                    helper = subprocess.Popen(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    helpers.append(ended_with_us(helper))
            yield finish
            finish()
            for p in helpers:  # what a helper compiles after the callees (`_helper`)
                while p.poll() is None and not should_stop():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(0.2)
        finally:
            for p in helpers:
                if p.poll() is None:
                    p.terminate()
                p.wait()
                forget(p)


def _cpu_s(children: bool = False) -> float:
    """CPU seconds of this process and of the helpers it has waited for (`children`: of
    the helpers only)."""
    t = os.times()
    helpers = t.children_user + t.children_system
    return helpers if children else t.user + t.system + helpers


def bare_simulation():
    """A simulation of the warm-up's topology without flows: the state's types, as a run's,
    with no flow to route (no routing kernel to compile first): what the event loop and
    its callees are compiled for, here and in the helpers."""
    import numpy as np

    from aifabric.sim import Simulation
    from aifabric.topologies import load_fabric
    from aifabric.traffic.flows import FlowTable

    none = {"src": np.zeros(0, np.int32), "dst": np.zeros(0, np.int32), "bytes": np.zeros(0)}
    return Simulation(load_fabric(TOPOLOGY), FlowTable.build(none, ([0], []), {}))


def compile_loop(sim) -> None:
    """Compile the event loop for the argument types `Simulation.run` calls it with."""
    import numba
    from numba import types

    from aifabric.sim import kernel

    kernel.run.compile((numba.typeof(sim._state()), types.int64, types.int64))


def small_simulation():
    """The simulation of the first warm-up scenario, built and not run."""
    from aifabric.fabric.routing import POLICIES
    from aifabric.scenarios import scenario_from_dict
    from aifabric.sim.engine import simulation_for

    return simulation_for(scenario_from_dict(scenarios(POLICIES)[0], "warmup-0"))


def _write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


class CompileNotice:
    """Listens to numba's compile events: a line when compiling starts (if `announce`),
    then the seconds so far: redrawn every second on a terminal, a line every
    `LOG_TICK_S` elsewhere (a log file)."""

    LOG_TICK_S = 10.0

    def __init__(self, stream: TextIO, announce: bool):
        self.stream = stream
        self.announce = announce
        self.tty = stream.isatty()
        self.tick_s = 1.0 if self.tty else self.LOG_TICK_S
        self.depth = 0  # numba compiles callees inside their caller's event
        self.started = 0.0
        self.compiled_s = 0.0
        self.drawn = False
        self.lock = threading.Lock()
        self.ticking = False

    def on_start(self) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            self.started = time.perf_counter()
            if self.announce:
                self.announce = False
                self.stream.write(
                    "aifabric: compiling kernels the cache does not hold "
                    f"({_about(estimate_s())} for all of them)\n"
                )
                self.stream.flush()
            if not self.ticking:
                self.ticking = True
                threading.Thread(target=self._tick, daemon=True).start()

    def on_end(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth:
                return
            self.compiled_s += time.perf_counter() - self.started
            if self.drawn:
                self.stream.write("\n")
                self.stream.flush()
                self.drawn = False

    def _tick(self) -> None:
        while True:
            time.sleep(self.tick_s)
            with self.lock:
                if not self.ticking:
                    return
                if self.depth:
                    s = self.compiled_s + time.perf_counter() - self.started
                    self.stream.write(
                        f"\r  compiling: {s:.0f} s " if self.tty else f"  compiling: {s:.0f} s\n"
                    )
                    self.stream.flush()
                    self.drawn = self.tty

    def stop(self) -> None:
        with self.lock:
            self.ticking = False
            if self.drawn:
                self.stream.write("\n")
                self.stream.flush()
                self.drawn = False


def _listen(notice: CompileNotice):
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, ev):
            notice.on_start()

        def on_end(self, ev):
            notice.on_end()

    listener = Listener()
    event.register("numba:compile", listener)
    return listener


@contextlib.contextmanager
def compile_notice(stream: TextIO | None = None, *, announce: bool = True):
    """Tell the user on `stream` (stderr) whenever numba compiles inside this block."""
    from numba.core import event

    notice = CompileNotice(stream or sys.stderr, announce)
    listener = _listen(notice)
    try:
        yield notice
    finally:
        event.unregister("numba:compile", listener)
        notice.stop()


def main() -> None:
    """`python -m aifabric.warmup`: what `aifabric warmup` does; with `--callees COUNTER
    NAME ...`, a helper of `callees_everywhere`."""
    if sys.argv[1:2] == ["--callees"]:
        _helper(sys.argv[2], sys.argv[3:])
        return
    run()


def _helper(counter: str, names: list[str]) -> None:
    """A helper of a full compile: the loop's callees with the other processes, then, while
    the loop itself compiles, what the warm-up would compile only after it: routing
    flows, the loop's entry points for the Python layer and a capture's reading."""
    import numpy as np

    from aifabric.analysis.capture import read_capture
    from aifabric.analysis.metrics import capture_metrics
    from aifabric.sim import layout as L
    from aifabric.sim.pcap import FrameBuilder, write_pcap
    from aifabric.sim.precompile import python_layer_kernels, work

    work(counter, names, bare_simulation)
    sim = small_simulation()
    python_layer_kernels(sim)
    rec = np.zeros(L.CP_N, dtype=np.int64)
    rec[L.CP_PORT] = sim.fabric.nic_port[sim.flows.src[0]]
    rec[L.CP_KIND], rec[L.CP_BYTES] = L.K_DATA, 1000
    frame = FrameBuilder(sim.fabric, sim.flows, sim.routing.ip, sim.mtu).frame(rec)
    with temporary_directory("aifabric-compile-") as tmp:
        write_pcap(Path(tmp) / "one.pcap", [(0, frame)])
        capture_metrics(read_capture(Path(tmp) / "one.pcap"), series=True)


if __name__ == "__main__":
    main()
