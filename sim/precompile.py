"""Compile the event loop's callees in several processes before the loop itself.

numba compiles `kernel.run` in one piece, and every kernel it calls (`kick`,
`send_control`, `retransmit` ...) while it types it: on one core, one after another.
Those callees do not depend on each other's machine code until a caller links them, and
numba caches each one with the bitcode a caller links in, so other processes can compile
them first, into the same cache directory, and the loop's own compile then loads them.

`callees()` lists them, the largest first (a function's size counted with everything it
inlines); `compile_callee` compiles one for the loop's state (`kernel.borrowed(S)`) and
int64 arguments, the types the loop calls them with (a kernel called with other types
compiles again when the loop is typed: slower, never wrong; tests/test_warmup.py checks
that every large kernel compiles once). Processes share the list through a counter in a
file (`work`); aifabric.warmup starts them.
"""

from __future__ import annotations

import fcntl
import inspect
import os

from aifabric.sim import kernel

# the loop itself, what it calls first to type the rest, and the two callees it calls with
# int32 or constant arguments
EXCLUDED = ("run", "borrowed", "record", "shortest_queue")


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


def callees() -> list[str]:
    """The kernels of kernel.py the loop calls rather than inlines that take the state
    first, largest first."""
    found = []
    for name, d in _dispatchers(kernel).items():
        params = list(inspect.signature(d.py_func).parameters)
        if name not in EXCLUDED and not _inlined(d) and params[:1] == ["S"]:
            found.append((-_size(d, set()), name))
    return [name for _, name in sorted(found)]


def state_type(sim):
    """The numba type of `kernel.borrowed(S)` for a simulation's state."""
    import numba

    t = numba.typeof(sim._state())
    kernel.borrowed.compile((t,))
    return kernel.borrowed.overloads[(t,)].signature.return_type


def compile_callee(name: str, state) -> None:
    from numba import types

    d = getattr(kernel, name)
    n = len(inspect.signature(d.py_func).parameters)
    d.compile((state, *(types.int64,) * (n - 1)))


def take(counter: str) -> int:
    """The next index of a counter shared by processes (a file holding a number)."""
    with open(counter, "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        i = int(fh.read() or 0)
        fh.seek(0)
        fh.write(str(i + 1))
        fh.truncate()
    return i  # the lock goes with the file's closing


def work(counter: str, names: list[str], make_sim, should_stop=lambda: False) -> None:
    """Compile the callees `names[take(counter)]` until none is left (or `should_stop()`):
    what each process of a full compile does, with the others."""
    state = None
    while not should_stop():
        i = take(counter)
        if i >= len(names):
            return
        if state is None:
            state = state_type(make_sim())
        compile_callee(names[i], state)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
