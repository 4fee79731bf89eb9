"""`python -m aifabric` and the installed `aifabric` script (`command_line`)."""

import os
import sys

from aifabric import main


def command_line() -> None:
    """The `aifabric` program: `main`, with numba loaded without two modules the program
    does not need (`_NumbasOptionalImports`); then, where the command succeeded and said
    there is nothing to tear down (`aifabric.cli.nothing_to_tear_down`), the process ends
    without Python's teardown of every module and object (numba's and LLVM's among them:
    about 0.015 s of CPU of a 0.5-s `aifabric run`), once the exit handlers have run and
    the output is flushed, as at any exit. `main` itself returns as before (tests call it)."""
    sys.meta_path.insert(0, _NumbasOptionalImports())
    code = 1
    try:
        if _mpi_follower():
            code = 0
            return
        main()
    except SystemExit as e:
        code = e.code
        raise
    finally:
        cli = sys.modules.get("aifabric.cli")
        if code in (None, 0) and cli is not None and cli.NOTHING_TO_TEAR_DOWN:
            _end_now()


def _mpi_follower() -> bool:
    """Under `mpirun -n N` (N > 1): True on every rank but 0, once it has served rank 0's
    run (aifabric.sim.mpi), which alone runs the command and prints; a missing mpi4py
    is one sentence, said by rank 0."""
    from aifabric.fabric.launcher import launched_rank, launched_ranks

    if launched_ranks() < 2:
        return False
    from aifabric.fabric.errors import AifabricError
    from aifabric.sim import mpi

    try:
        if not mpi.follower():
            return False
    except AifabricError as e:
        if launched_rank() == 0:
            print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)
    mpi.serve()
    return True


class _NumbasOptionalImports:
    """While numba loads, two modules it imports if they are there and the program does not
    need: SciPy, which numba imports only to check its version (the project requires a
    newer one than numba does), and PyYAML, for a `.numba_config.yaml` in the current
    directory (kept where there is one). numba goes on as without them; 0.013 of the 0.10 s
    of CPU its import takes. Once numba has loaded, either imports as usual."""

    def find_spec(self, name, path=None, target=None):
        if name not in ("scipy", "yaml") or (name == "yaml" and os.path.exists(NUMBA_CONFIG)):
            return None
        numba = sys.modules.get("numba")
        if numba is not None and getattr(getattr(numba, "__spec__", None), "_initializing", False):
            raise ModuleNotFoundError(f"{name} is not loaded with numba here", name=name)
        return None


NUMBA_CONFIG = ".numba_config.yaml"


def _end_now() -> None:
    """End the process as Python would at exit, but for the teardown: not while a thread
    Python would wait for still runs, nor where the exit handlers cannot be run first."""
    import atexit
    import threading

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    here = threading.current_thread()
    if run_exit_handlers is None or any(
        t is not here and not t.daemon and t.is_alive() for t in threading.enumerate()
    ):
        return
    run_exit_handlers()  # and they are not run again, should the process exit as usual
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # the usual exit says what went wrong
    os._exit(0)


if __name__ == "__main__":
    command_line()
