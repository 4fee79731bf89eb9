"""aifabric: a lab for the RoCE backend networks that train large models."""

import sys


def main() -> None:
    """The `aifabric` command. A Ctrl-C while Python is still loading it is a quiet exit
    130, not a traceback (the command line is what installs the run's signal handling)."""
    try:
        from aifabric.cli import main as command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    command()


def __getattr__(name: str):
    if name == "__version__":
        from fabric import __version__

        return __version__
    raise AttributeError(f"module 'aifabric' has no attribute {name!r}")
