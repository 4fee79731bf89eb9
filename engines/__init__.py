"""The engine contract: what an engine implements, the engines by name, and the one runner.

An engine is one module holding `ENGINE`, an object with

    name                        "sim", "mininet", ...
    options                     {option: one line of help}: what it takes beyond the scenario
    unavailable(**options)      None, or one sentence why it cannot run on this machine
    session(scenario, **options) -> a session; decides and probes, builds nothing

and a session with

    features                    {feature: Support} for every feature the scenario uses
                                (`scenario_features`): implemented, approximated (why) or
                                refused (why); answered before anything runs
    notice                      optional: one line for the person running it (what the run
                                will take, say), shown before anything is built
    build_abortable             True when a signal may cut `build` short at once (it cleans
                                up in `close`); else the build finishes first. Such a build
                                calls `stop.enter("build")` once what it built can be written:
                                from then on a first signal only sets the flag
    build(writer, stop)         compile, build, note settings in run.json
    run(stop, progress) -> bool True when everything ran; returns soon after `stop` is set;
                                not called when asked to stop before it. It may call
                                `progress(p)` as it goes (p has now_ns, flows_done, flows,
                                events) and then `progress(p, final=True)` with the end state
    write(writer) -> dict       the results into the run directory (also when `run` was
                                stopped or never called); returns the summary
    close()                     tear down; always called, after errors too

`run_scenario` is the only caller. It refuses what an engine refuses, makes the
run directory, and around every phase (setup, build, run, write, teardown) keeps
`run.json`'s status honest: `running`, then `complete`, `partial` (interrupted,
or not everything finished) or `failed` (an error, its sentence recorded).
SIGINT and SIGTERM set `Stop`; a second one stops at once. A new engine is one
module and one line in `ENGINES`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.files import remove_temporaries
from aifabric.fabric.interrupts import EXIT_INTERRUPTED, numba_compiling, raising_is_unsafe
from aifabric.fabric.model import Role
from aifabric.fabric.rundir import RunWriter, check_run_dir
from aifabric.fabric.scenario import Scenario

ENGINES = {
    "sim": "aifabric.sim.engine",
    "mininet": "aifabric.emu.engine",
}  # name -> module with ENGINE
SUPPORT = ("implemented", "approximated", "refused")


@dataclass(frozen=True)
class Support:
    """What an engine does with one feature: `state` in SUPPORT, and `how` in one sentence."""

    state: str
    how: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"support": self.state, "how": self.how} if self.how else {"support": self.state}


def implemented(how: str = "") -> Support:
    return Support("implemented", how)


def approximated(why: str) -> Support:
    return Support("approximated", why)


def refused(why: str) -> Support:
    return Support("refused", why)


class Session(Protocol):
    features: dict[str, Support]
    build_abortable: bool

    def build(self, writer, stop: Stop) -> None: ...
    def run(self, stop: Stop, progress: Callable[[Any], None] | None) -> bool: ...
    def write(self, writer) -> dict: ...
    def close(self) -> None: ...


class Engine(Protocol):
    name: str
    options: dict[str, str]

    def unavailable(self, **options) -> str | None: ...
    def session(self, scenario: Scenario, **options) -> Session: ...


def engine(name: str) -> Engine:
    """The engine registered as `name`, or one sentence why there is none."""
    if name not in ENGINES:
        raise AifabricError(f"unknown engine {name!r}; the engines are {', '.join(ENGINES)}")
    try:
        module = importlib.import_module(ENGINES[name])
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] == "aifabric":
            raise  # our own code is broken: not a missing dependency
        raise AifabricError(
            f"the {name} engine is not available in this installation: "
            f"it needs the Python module {e.name}"
        ) from None
    return module.ENGINE


def scenario_features(sc: Scenario) -> dict[str, str]:
    """The features `sc` uses, each with what it asks for: what every engine must answer."""
    f = sc.fabric
    roles = [Role(int(r)) for r in sorted(set(f.node_role.tolist())) if r != Role.NIC]
    queues = [f.queue(r) for r in roles]
    out = {
        "links.rate": "link rates as given",
        "links.delay": "propagation delay per link",
        "links.mtu": f"{int(f.link_mtu_bytes.min()) if f.n_links else 0}-byte payloads",
        "queues.buffer": "switch buffers: "
        + ", ".join(f"{r.label} {q.model}" for r, q in zip(roles, queues, strict=True)),
        "ecmp.policy": sc.ecmp,
        "congestion_control.kind": sc.cc,
        **transport_features(sc),
        "sample_interval": f"{sc.sample_interval_ns} ns",
    }
    if sc.same_seed:
        out["ecmp.same_seed"] = "one hash seed on every switch"
    if any(q.ecn.enabled for q in queues):
        out["queues.ecn"] = "RED ECN marking"
    if any(q.pfc.enabled for q in queues):
        out["queues.pfc"] = "PFC on the lossless priority"
    if any(x.at_ns == 0 for x in sc.faults):
        out["faults.at_start"] = "links or switches down from the start"
    if any(x.at_ns > 0 for x in sc.faults):
        out["faults.mid_run"] = "links or switches going down during the run"
    if any(x.action == "drain" for x in sc.faults):
        out["faults.drain"] = "drained: no new flows, flows in flight finish"
    if any(x.action == "up" for x in sc.faults):
        out["faults.restore"] = "links or switches brought back up during the run"
    if sc.captures:
        out["captures"] = ", ".join(sc.captures)
    return out


def transport_features(sc: Scenario) -> dict[str, str]:
    """The measurement conventions and loss recovery `sc` asks for (fabric.cc's parameters)."""
    p = sc.cc_parameters()
    every = p["ack_every"]
    return {
        "loss_recovery": p["loss_recovery"],
        "acks": "one per flow" if every == "flow" else f"every {every} packets",
        "finish": p["finish"],
        "header_overhead": f"{p['header_overhead']} bytes",
    }


def check_features(name: str, sc: Scenario, features: dict[str, Support]) -> None:
    """One sentence when the engine refuses a feature `sc` uses, or does not answer for one."""
    problems = []
    for feature, asked in scenario_features(sc).items():
        s = features.get(feature)
        if s is None:
            problems.append(f"{feature} (the engine does not say what it does with it)")
        elif s.state not in SUPPORT:
            problems.append(f"{feature} (the engine answers {s.state!r})")
        elif s.state == "refused":
            problems.append(f"{feature} = {asked}: {s.how}")
    if problems:
        raise AifabricError(
            f"the {name} engine cannot run scenario {sc.name}: {'; '.join(problems)}"
        )


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM where the run stops at once."""


class Stop:
    """Whether the run was asked to stop, and how a signal may stop it in each phase.

    A phase is abortable (a signal raises `Interrupted` at once: nothing is
    half-written that the phase does not clean up), cooperative (the first
    signal only sets the flag, which the engine polls; a second raises),
    compiling (the first signal sets the flag; a second ends the process at
    once, exit 130: nothing is written yet, and an exception raised inside
    numba's or LLVM's callbacks would be printed and dropped, not propagated)
    or shielded (never raises: teardown and the final status).
    """

    def __init__(self):
        self.event = threading.Event()
        self.signals = 0
        self.phase = "setup"
        self.mode = "abortable"
        self.first = ""  # the phase the first signal came in
        # what a run says before the process ends at once (set while a run directory is open)
        self.last_words: Callable[[], str] | None = None

    def is_set(self) -> bool:
        return self.event.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self.event.wait(timeout_s)

    def set(self) -> None:
        self.event.set()

    def enter(self, phase: str, mode: str = "cooperative") -> None:
        self.phase, self.mode = phase, mode
        if mode == "abortable" and self.is_set():
            raise Interrupted(phase)

    def check(self) -> None:
        """Raise `Interrupted` if asked to stop (between phases)."""
        if self.is_set():
            raise Interrupted(self.phase)

    def _on_signal(self, signum, frame) -> None:
        self.signals += 1
        self.first = self.first or self.phase
        self.set()
        if self.mode == "shielded":
            return
        at_once = self.mode == "abortable" or self.signals > 1
        if at_once and (self.mode == "compiling" or raising_is_unsafe(frame)):
            self._exit_now(signal.Signals(signum).name)
        if at_once:
            raise Interrupted(self.phase)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"\n{signal.Signals(signum).name}: stopping after this step ...\n")

    def _exit_now(self, name: str) -> NoReturn:
        """Stop where raising is unsafe (`aifabric.fabric.interrupts`: while compiling, importing):
        the run's last words (`last_words`: teardown and the final status) are said here
        and the process ends at once, exit 130."""
        said = "nothing was written"
        remove_temporaries()  # a file half written when the signal came
        if self.last_words is not None:
            self.mode = "shielded"
            try:
                said = self.last_words()
            except BaseException as e:  # noqa: BLE001 - the process ends here whatever happened
                said = f"the run's status could not be written ({type(e).__name__}: {e})"
        with contextlib.suppress(OSError, ValueError):
            how = "while compiling" if self.mode == "compiling" or numba_compiling() else "at once"
            sys.stderr.write(f"\n{name}: stopped {how}; {said}\n")
            sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    @contextlib.contextmanager
    def handling(self) -> Iterator[Stop]:
        """SIGINT and SIGTERM set this stop (in the main thread; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable(hook)
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if not self.is_set():
                sys.unraisablehook = hook

    def _unraisable(self, hook):
        """Once a signal asked to stop, what finalizers cannot raise is not printed: an
        `Interrupted` raised in numba's or LLVM's middle leaves their objects half made, and
        their `__del__` then fails (the run's status and files already say what happened).
        Stays installed for the rest of the process, whose exit collects those objects."""

        def unraisable(info):
            if not self.is_set():
                hook(info)

        return unraisable


def takers(option: str) -> list[str]:
    """The engines that take `option`."""
    out = []
    for name in ENGINES:
        try:
            if option in engine(name).options:
                out.append(name)
        except AifabricError:
            continue
    return out


def check_options(eng: Engine, options: dict[str, Any]) -> dict[str, Any]:
    """The options given (not None) that `eng` takes; one sentence for one it does not."""
    given = {k: v for k, v in options.items() if v is not None}
    for key in given:
        if key not in eng.options:
            where = " and ".join(takers(key))
            if not where:
                raise AifabricError(f"no engine takes option {key}")
            raise AifabricError(f"option {key} applies to the {where} engine, not to {eng.name}")
    return given


def run_scenario(
    name: str,
    sc: Scenario,
    path: str | Path,
    *,
    options: dict[str, Any] | None = None,
    progress: Callable[[Any], None] | None = None,
    stop: Stop | None = None,
    notify: Callable[[str], None] | None = None,
    owner: str | None = None,
) -> dict:
    """Run `sc` on engine `name` into the run directory `path`; returns the summary
    (with `status`, `message` and `run_dir`), also recorded in run.json.

    `notify` gets the session's `notice`, if it has one, before the build. `owner`, when
    given, is recorded as the attempt that owns the directory (a sweep's task key).

    Signals are handled here when `stop` is not given; a caller that gives one
    installs its handlers (`Stop.handling`).
    """
    eng = engine(name)
    opts = check_options(eng, options or {})
    reason = eng.unavailable(**opts)
    if reason:
        raise AifabricError(reason)
    check_run_dir(path)
    session = eng.session(sc, **opts)
    check_features(eng.name, sc, session.features)
    if notify is not None and getattr(session, "notice", None):
        notify(session.notice)
    own = stop is None
    stop = stop or Stop()
    with stop.handling() if own else contextlib.nullcontext():
        stop.enter("setup")
        features = {k: v.to_dict() for k, v in session.features.items()}
        writer = RunWriter(path, eng.name, sc.to_dict(), features=features, owner=owner)
        return _phases(eng, sc, session, writer, stop, progress)


def _phases(eng, sc, session, writer, stop: Stop, progress) -> dict:
    summary: dict = {}
    status, message = "complete", ""
    error: BaseException | None = None
    ran = False  # the run phase began
    ran_all = False  # the engine says everything ran
    ran_out = False  # stopped before the run phase ended

    def last_words() -> str:
        with contextlib.suppress(Exception):
            session.close()
        writer.finish("partial", f"interrupted while {_doing(stop.phase)}; {_files(writer)}")
        return f"{writer.path} records the run as partial"

    stop.last_words = last_words
    try:
        writer.topology(sc.fabric)
        stop.check()
        stop.enter("build", "abortable" if session.build_abortable else "cooperative")
        session.build(writer, stop)
        if not stop.is_set():
            stop.enter("run")
            ran = True
            ran_all = session.run(stop, progress)
        ran_out = stop.is_set()
        # the next signal stops the writing at once; every file is written whole or not at all
        stop.enter("write", "cooperative" if ran_out else "abortable")
        summary = session.write(writer)
        missed = _faults_not_reached(sc, summary)
        if missed:
            summary["faults_not_reached"] = missed
            writer.note(faults_not_reached=missed)
        stop.enter("written", "shielded")
    except BaseException as e:  # noqa: BLE001 - every exit path ends in one recorded status
        if isinstance(e, Interrupted) or stop.is_set():
            status = "partial"
            message = f"interrupted while {_doing(stop.phase)}; {_files(writer)}"
        else:
            status, error = "failed", e
            message = str(e) if isinstance(e, AifabricError) else f"{type(e).__name__}: {e}"
    finally:
        stop.enter("teardown", "shielded")
        try:
            session.close()
        except Exception as e:  # noqa: BLE001
            if status != "failed":
                status, message = "failed", f"tearing down failed: {type(e).__name__}: {e}"
    if status == "complete":
        done, total = summary.get("flows_done"), summary.get("flows")
        if ran_out:
            what = "the results cover what ran" if ran else "nothing ran"
            status, message = "partial", f"interrupted while {_doing(stop.first)}; {what}"
        elif not ran_all or (done is not None and total is not None and done < total):
            status = "partial"
            message = summary.get("incomplete") or (
                f"{total - done} flows did not complete (no path, or waiting on ones that did not)"
                if done is not None and total is not None and done < total
                else f"the {eng.name} engine did not run everything"
            )
    summary.pop("incomplete", None)
    stop.enter("finish", "shielded")
    stop.last_words = None
    writer.finish(status, message)
    if isinstance(error, MemoryError):
        raise AifabricError(
            f"the run needed more memory than this machine has; {writer.path} records it as failed"
        ) from None
    if error is not None:
        raise error
    summary.update(status=status, message=message, run_dir=str(writer.path))
    summary["interrupted"] = stop.is_set()
    return summary


def _faults_not_reached(sc: Scenario, summary: dict) -> list[dict]:
    """The scenario's faults an engine did not apply (the run ended before their time)."""
    from aifabric.fabric.faults import describe, record_key

    done = {record_key(f) for f in summary.get("faults", [])}
    out = []
    for fault in sc.faults:
        d = {**describe(sc.fabric, fault), "at_ns": int(fault.at_ns)}
        if record_key(d) not in done:
            out.append(d)
    return out


def _doing(phase: str) -> str:
    return {
        "setup": "setting up",
        "build": "building",
        "run": "running",
        "write": "writing the results",
        "written": "finishing",
    }.get(phase, phase)


def _files(writer) -> str:
    names = sorted(
        p.name
        for p in writer.path.iterdir()
        if p.is_file() and p.name != "run.lock" and not p.name.startswith(".")  # temporaries
    )
    return "written: " + (", ".join(names) if names else "nothing")
