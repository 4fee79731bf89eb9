"""aifabric: a lab for the RoCE backend networks that train large models."""

import contextlib
import gc
import os
import signal
import sys

# In a checkout the layers are the repository's top-level folders (fabric/, traffic/, ...:
# `aifabric.fabric.checkout`); a wheel has them inside this package. Either way they import
# as `aifabric.fabric`, `aifabric.traffic`, ...
_checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_checkout, "pyproject.toml")) and os.path.isfile(
    os.path.join(_checkout, "fabric", "checkout.py")
):
    __path__.append(_checkout)


def _interrupted(signum, frame) -> None:
    """SIGINT before a command installs its own handling: KeyboardInterrupt, as Python's own
    handler, except inside an import, where the exception could be swallowed or turned into
    another (`aifabric.fabric.interrupts`): there, nothing is written yet, and the process ends."""
    interrupts = sys.modules.get("aifabric.fabric.interrupts")
    if interrupts is None or interrupts.importing(frame):
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("\naifabric: interrupted\n")
            sys.stderr.flush()
        os._exit(130)
    raise KeyboardInterrupt


def main() -> None:
    """The `aifabric` command. A Ctrl-C while Python is still loading it is a quiet exit
    130, not a traceback (the command line is what installs the run's signal handling)."""
    signal.signal(signal.SIGINT, _interrupted)
    # The lab multiplies no matrices: the threads OpenBLAS starts when numpy loads would
    # only cost CPU (about 0.04 s of a 0.4-s run on two cores). Set before numpy loads; a
    # value given is kept, and children (a sweep's workers) inherit it.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # The collector waits while the command line loads (numpy, numba, a scenario): what
    # loading makes lives until the process ends, and collecting it as it comes costs
    # about 0.04 s of CPU. Each command turns it back on (`aifabric.cli.loaded`).
    gc.disable()
    import aifabric.fabric.interrupts  # noqa: F401  (what the handler asks once it is loaded)
    from aifabric.cli import main as command

    try:
        command()
    finally:
        # The command is done and its run written: a signal while Python exits (its atexit
        # handlers, numba's finalizers) would only print a KeyboardInterrupt traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


# The Python API (`aifabric.api`), loaded on first use: `import aifabric` and the command
# line stay as cheap as they were.
API = ("run", "load", "sweep", "open_sweep", "Run", "Sweep")


def __getattr__(name: str):
    if name == "__version__":
        from aifabric.fabric import __version__

        return __version__
    if name in API:
        from aifabric import api

        return getattr(api, name)
    if name == "AifabricError":
        from aifabric.fabric.errors import AifabricError

        return AifabricError
    raise AttributeError(f"module 'aifabric' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *API, "AifabricError", "__version__"])
