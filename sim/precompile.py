"""Compile the event loop's callees in several processes, beside the loop itself.

numba compiles `kernel.run` in one piece, and every kernel it calls (`kick`,
`send_control`, `retransmit` ...) while it types it: on one core, one after another.
Those callees do not depend on each other's machine code until a caller links them, and
numba caches each one with the bitcode a caller links in, so other processes can compile
them, into the same cache directory, while the loop's own compile does its untyped
passes; when it reaches typing it takes a share of what is left and waits for the rest
(`aifabric.sim.pipeline`), then loads them all from the cache.

`callees()` lists them, the longest chain of compiles first (each after those it calls);
`compile_callee` compiles one for the loop's state (`kernel.borrowed(S)`), a field's type
for a parameter named as a field, and int64 for the rest: the types the loop calls them
with (a kernel called with other types compiles again when the loop is typed: slower,
never wrong; tests/test_warmup.py checks that every large kernel compiles once).
Processes take the callees from a list in a file, each one whose callees are compiled,
and mark it done in another (`work`); each kernel compiles in one process at a time
(`one_at_a_time`); aifabric.warmup starts them."""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import os
import sys

# the loop itself, what it calls first to type the rest, and the two callees it calls with
# int32 or constant arguments
EXCLUDED = ("kernel.run", "kernel.borrowed", "kernel.record", "kernel.shortest_queue")
# the modules whose kernels the loop calls by name: its own, and the hooks every kind of
# congestion control sits behind (what those call compiles inside them, for the types used)
MODULES = ("kernel", "congestion")
ALSO = ("heap.advance",)  # the event list's rare refill, called by the loop's `take`


def _module(name: str):
    import importlib

    return importlib.import_module(f"aifabric.sim.{name}")


def _kernel(name: str):
    """The kernel `module.name` of aifabric.sim."""
    m, _, fn = name.rpartition(".")
    return getattr(_module(m), fn)


def _dispatchers(module) -> dict[str, object]:
    from numba.core.registry import CPUDispatcher

    return {
        name: d
        for name, d in vars(module).items()
        if isinstance(d, CPUDispatcher) and d.py_func.__module__ == module.__name__
    }


def _inlined(d) -> bool:
    return d.targetoptions.get("inline") == "always"


def _kernels_named(d) -> list:
    """The kernels a kernel names in its code (what it calls, inlined or not): a global
    name (`start_frame`), or an attribute of a module of the project (`pfc.release`, which
    is not `kernel.release`)."""
    import dis

    glob = d.py_func.__globals__
    found = []
    last = None  # the module a LOAD_GLOBAL just loaded
    for ins in dis.get_instructions(d.py_func):
        obj = None
        if ins.opname == "LOAD_GLOBAL":
            obj = glob.get(ins.argval)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and last is not None:
            obj = getattr(last, ins.argval, None)
        last = obj if inspect.ismodule(obj) and obj.__name__.startswith("aifabric.") else None
        if hasattr(obj, "targetoptions"):
            found.append(obj)
    return found


def _size(d, seen: set) -> int:
    """Source lines of a kernel and of every kernel it inlines, once each."""
    if id(d) in seen:
        return 0
    seen.add(id(d))
    lines = len(inspect.getsource(d.py_func).splitlines())
    for callee in _kernels_named(d):
        if _inlined(callee):
            lines += _size(callee, seen)
    return lines


def _calls(d, seen: set) -> set:
    """The kernels a kernel calls rather than inlines (its own and those it inlines)."""
    if id(d) in seen:
        return set()
    seen.add(id(d))
    out = set()
    for callee in _kernels_named(d):
        if _inlined(callee):
            out |= _calls(callee, seen)
        else:
            out.add(callee)
    return out


def _takes_state(d) -> bool:
    return next(iter(inspect.signature(d.py_func).parameters), None) == "S"


def callees() -> list[str]:
    """The kernels (`module.name`) of `MODULES` that the loop calls rather than inlines and
    that take the state first, and `ALSO`: the longest chain of compiles first (a callee's
    size, counted with what it inlines, plus the longest chain of callees that call it),
    so each comes after those it calls. A callee compiles what it calls inside its own
    compile: `kick` took 16-18 s of one process, most of it kernels it calls, while the
    other waited for it to compile `release`; and the callees that call `kick` wait for it."""
    found = []
    for m in MODULES:
        for name, d in _dispatchers(_module(m)).items():
            qualified = f"{m}.{name}"
            if qualified not in EXCLUDED and not _inlined(d) and _takes_state(d):
                found.append(qualified)
    found.extend(ALSO)
    size = [_size(_kernel(q), set()) for q in found]
    wanted = needs(found)
    chain: dict[int, int] = {}

    def longest(i: int) -> int:  # from callee i to the end of the compile
        if i not in chain:
            after = [longest(j) for j in range(len(found)) if i in wanted[j]]
            chain[i] = size[i] + max(after, default=0)
        return chain[i]

    return [found[i] for i in sorted(range(len(found)), key=lambda i: (-longest(i), found[i]))]


def state_type(sim):
    """The numba type of `kernel.borrowed(S)` for a simulation's state."""
    import numba

    from aifabric.sim import kernel

    t = numba.typeof(sim._state())
    kernel.borrowed.compile((t,))
    return kernel.borrowed.overloads[(t,)].signature.return_type


def compile_callee(name: str, state) -> None:
    """Compile `module.name` for the argument types the loop calls it with: the state for
    `S`, a field's type for a parameter named as one of the state's fields, else int64."""
    from numba import types

    d = _kernel(name)
    fields = dict(zip(state.fields, state.types, strict=True))
    d.compile(
        tuple(
            state if p == "S" else fields.get(p, types.int64)
            for p in inspect.signature(d.py_func).parameters
        )
    )


def _indices(fh) -> set[int]:
    return {int(x) for x in fh.read().split()}


def take(counter: str, n: int, needs: list[set[int]] | None = None) -> int:
    """The next of n indices shared by processes through `counter` (a file of the indices
    taken): the first not taken all of whose `needs` (indices) are compiled (`done`), else
    the first not taken (its compile then waits for what it needs, `one_at_a_time`, and
    compiles it if the process that took it is gone); n when every one is taken."""
    with open(counter, "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        taken = _indices(fh)
        done = _done(counter) if needs else set()
        left = [i for i in range(n) if i not in taken]
        if not left:
            return n
        i = next((i for i in left if not needs or needs[i] <= done), left[0])
        fh.write(f" {i}")
    return i  # the lock goes with the file's closing


def done_file(counter: str) -> str:
    """The file of the callees compiled so far, beside the file of those taken."""
    return counter + ".done"


def _done(counter: str) -> set[int]:
    try:
        with open(done_file(counter)) as fh:
            return _indices(fh)
    except (OSError, ValueError):
        return set()


def done(counter: str, i: int) -> None:
    """Index i is compiled."""
    with open(done_file(counter), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(f" {i}")


def compiled(counter: str) -> int:
    """How many callees the processes sharing `counter` have compiled."""
    return len(_done(counter))


def needs(names: list[str]) -> list[set[int]]:
    """For each callee, the others it calls, directly or through kernels not listed."""
    ds = [_kernel(name) for name in names]
    index = {id(d): i for i, d in enumerate(ds)}
    out = []
    for d in ds:
        found, seen, todo = set(), {id(d)}, list(_calls(d, set()))
        while todo:
            c = todo.pop()
            if id(c) in seen:
                continue
            seen.add(id(c))
            if id(c) in index:
                found.add(index[id(c)])
            else:
                todo.extend(_calls(c, set()))
        out.append(found)
    return out


def work(counter: str, names: list[str], make_sim, should_stop=lambda: False) -> None:
    """Compile the callees `names[take(...)]` until none is left (or `should_stop()`),
    marking each one done: what each process of a full compile does, with the others. A
    process takes a callee whose own callees are compiled where there is one, and each
    kernel compiles in one process at a time (`one_at_a_time`)."""
    state = None
    wanted = needs(names)
    with one_at_a_time(counter):
        while not should_stop():
            i = take(counter, len(names), wanted)
            if i >= len(names):
                return
            if state is None:
                state = state_type(make_sim())
            compile_callee(names[i], state)
            done(counter, i)


@contextlib.contextmanager
def one_at_a_time(counter: str):
    """Inside it, a kernel of the project compiles in one of the processes sharing `counter`
    at a time. A callee compiles every kernel it calls that is not in the cache yet: two
    callees that call `kick` (`release`, `credit` ...) taken by two processes at once
    each compiled it, and everything it calls (10-15 s each). Now the second waits for the
    first (a lock file per kernel beside the counter), then loads it from the cache. The
    kernels call each other without cycles (tests/test_sim_kernels.py), so no two
    processes wait for each other."""
    from numba.core.registry import CPUDispatcher

    held: set[str] = set()
    guarded = []

    def guard(d, key: str):
        plain = d.compile

        def compile(sig):
            if key in held:  # this process compiles it already (not reached: no cycles)
                return plain(sig)
            with open(f"{counter}.{key}.lock", "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                held.add(key)
                try:
                    return plain(sig)  # from the cache, if another process compiled it
                finally:
                    held.discard(key)

        d.compile = compile
        guarded.append(d)

    for name, module in list(sys.modules.items()):
        if not name.startswith("aifabric."):
            continue
        for attr, d in list(vars(module).items()):
            if (
                isinstance(d, CPUDispatcher)
                and d.py_func.__module__ == name
                and not _inlined(d)
                and "compile" not in vars(d)
            ):
                guard(d, f"{name}.{attr}")
    try:
        yield
    finally:
        for d in guarded:
            del d.compile


def python_layer_kernels(sim) -> None:
    """Compile the loop's entry points for the Python layer (`purge_port`, `sample`; and
    for partitions `windows`, `inject` and `earliest_ps`: the state as the driver holds
    it, int64 arguments), which a run otherwise compiles after the loop."""
    import numba
    from numba import types

    from aifabric.sim import heap, kernel
    from aifabric.sim import windows as W

    counted = numba.typeof(sim._state())
    i64 = types.int64
    # a partition's thread (`PartitionedRun._spin`): the outboxes, the published figures,
    # the barrier's flags and its place, then its budget of events and the loop's address
    box, sync, flags = types.int64[:, :, :, ::1], types.int64[:, :, ::1], types.int64[::1]
    W.windows.compile((counted, counted, i64, i64, i64, box, sync, flags, flags, i64, i64))
    kernel.purge_port.compile((counted, i64, i64))
    kernel.sample.compile((counted, i64))
    # partitions (aifabric.sim.partition): what the driver and the threads call
    kernel.inject.compile((counted, types.int64[:, ::1], i64, i64))
    heap.earliest_ps.compile((numba.typeof(sim.ev), numba.typeof(sim.g)))


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
