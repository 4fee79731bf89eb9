"""aifabric: a lab for the RoCE backend networks that train large models."""

import signal
import sys


def main() -> None:
    """The `aifabric` command. A Ctrl-C while Python is still loading it is a quiet exit
    130, not a traceback (the command line is what installs the run's signal handling)."""
    try:
        from aifabric.cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    try:
        command()
    finally:
        # The command is done and its run written: a signal while Python exits (its atexit
        # handlers, numba's finalizers) would only print a KeyboardInterrupt traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def __getattr__(name: str):
    if name == "__version__":
        from fabric import __version__

        return __version__
    raise AttributeError(f"module 'aifabric' has no attribute {name!r}")
