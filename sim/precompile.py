"""Compile the event loop's callees in several processes, beside the loop itself.

numba compiles `kernel.run` in one piece, and every kernel it calls (`kick`,
`send_control`, `retransmit` ...) while it types it: on one core, one after another.
Those callees do not depend on each other's machine code until a caller links them, and
numba caches each one with the bitcode a caller links in, so other processes can compile
them, into the same cache directory, while the loop's own compile does its untyped
passes; when it reaches typing it takes a share of what is left and waits for the rest
(`aifabric.sim.pipeline`), then loads them all from the cache.

`callees()` lists them, the largest first (a function's size counted with everything it
inlines); `compile_callee` compiles one for the loop's state (`kernel.borrowed(S)`), a
field's type for a parameter named as a field, and int64 for the rest: the types the loop
calls them with (a kernel called with other types compiles again when the loop is typed:
slower, never wrong; tests/test_warmup.py checks that every large kernel compiles once).
Processes share the list through a counter in a file (`work`), and count what they have
compiled in another (`compiled`); aifabric.warmup starts them."""

from __future__ import annotations

import fcntl
import inspect
import os

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


def _dispatchers(module) -> dict[str, object]:
    from numba.core.registry import CPUDispatcher

    return {
        name: d
        for name, d in vars(module).items()
        if isinstance(d, CPUDispatcher) and d.py_func.__module__ == module.__name__
    }


def _inlined(d) -> bool:
    return d.targetoptions.get("inline") == "always"


def _size(d, seen: set) -> int:
    """Source lines of a kernel and of every kernel it inlines, once each."""
    if id(d) in seen:
        return 0
    seen.add(id(d))
    lines = len(inspect.getsource(d.py_func).splitlines())
    glob = d.py_func.__globals__
    places = [glob] + [  # `start_frame(...)`, and `pfc.pause(...)` of a module it imports
        vars(v)
        for v in glob.values()
        if inspect.ismodule(v) and v.__name__.startswith("aifabric.sim.")
    ]
    for name in d.py_func.__code__.co_names:
        for place in places:
            callee = place.get(name)
            if hasattr(callee, "targetoptions") and _inlined(callee):
                lines += _size(callee, seen)
    return lines


def _takes_state(d) -> bool:
    return next(iter(inspect.signature(d.py_func).parameters), None) == "S"


def callees() -> list[str]:
    """The kernels (`module.name`) of `MODULES` that the loop calls rather than inlines and
    that take the state first, and `ALSO`: largest first."""
    found = []
    for m in MODULES:
        for name, d in _dispatchers(_module(m)).items():
            qualified = f"{m}.{name}"
            if qualified not in EXCLUDED and not _inlined(d) and _takes_state(d):
                found.append((-_size(d, set()), qualified))
    for qualified in ALSO:
        m, _, name = qualified.partition(".")
        found.append((-_size(getattr(_module(m), name), set()), qualified))
    return [name for _, name in sorted(found)]


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

    m, _, fn = name.rpartition(".")
    d = getattr(_module(m), fn)
    fields = dict(zip(state.fields, state.types, strict=True))
    d.compile(
        tuple(
            state if p == "S" else fields.get(p, types.int64)
            for p in inspect.signature(d.py_func).parameters
        )
    )


def take(counter: str) -> int:
    """The next index of a counter shared by processes (a file holding a number)."""
    with open(counter, "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        i = int(fh.read() or 0)
        fh.seek(0)
        fh.write(str(i + 1))
        fh.truncate()
    return i  # the lock goes with the file's closing


def done_file(counter: str) -> str:
    """The file counting the callees compiled so far, beside the counter of those taken."""
    return counter + ".done"


def compiled(counter: str) -> int:
    """How many callees the processes sharing `counter` have compiled."""
    try:
        with open(done_file(counter)) as fh:
            return int(fh.read() or 0)
    except (OSError, ValueError):
        return 0


def work(counter: str, names: list[str], make_sim, should_stop=lambda: False) -> None:
    """Compile the callees `names[take(counter)]` until none is left (or `should_stop()`),
    counting each one done (`compiled`): what each process of a full compile does, with
    the others."""
    state = None
    while not should_stop():
        i = take(counter)
        if i >= len(names):
            return
        if state is None:
            state = state_type(make_sim())
        compile_callee(names[i], state)
        take(done_file(counter))


def python_layer_kernels(sim) -> None:
    """Compile the loop's entry points for the Python layer (`purge_port`, `sample`; and
    for partitions `inject` and `earliest_ps`: the state as the driver holds it, int64
    arguments), which a run otherwise compiles after the loop."""
    import numba
    from numba import types

    from aifabric.sim import heap, kernel

    counted = numba.typeof(sim._state())
    i64 = types.int64
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
