"""Where a signal handler must not raise: inside the import machinery or numba's compiler.

Python's signal handlers run between bytecodes of the main thread, wherever it
is. An exception raised while a module imports can be swallowed (importlib's
weak-reference callbacks print "Exception ignored" and the import goes on) or
turned into another (`__set_name__` wraps it in a RuntimeError, printed as a
traceback); one raised inside numba's compiler can leave LLVM's objects half
made, so that the process crashes later. There, a handler that means to stop at
once ends the process instead (after saying what must be said), exit 130.
"""

from __future__ import annotations

import sys
from types import FrameType

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells expect of an interrupted command


def importing(frame: FrameType | None = None) -> bool:
    """Whether an import is under way: the import system holds a module lock, or `frame`
    (where a signal handler interrupted the main thread) runs inside importlib's machinery
    (some packages execute modules through a loader directly, with no lock)."""
    bootstrap = sys.modules.get("_frozen_importlib")
    if getattr(bootstrap, "_module_locks", None):
        return True
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def numba_compiling() -> bool:
    """Whether this thread is inside numba's compiler (compiling, or loading from its cache)."""
    module = sys.modules.get("numba.core.compiler_lock")
    lock = getattr(module, "global_compiler_lock", None)
    try:
        return lock is not None and bool(lock.is_locked())
    except Exception:  # noqa: BLE001 - a numba without it: assume not
        return False


def raising_is_unsafe(frame: FrameType | None = None) -> bool:
    """Whether an exception raised by a signal handler now (having interrupted `frame`) could
    be lost or crash the process."""
    return importing(frame) or numba_compiling()
