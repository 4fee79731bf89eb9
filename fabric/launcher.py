"""The MPI launcher this process was started by, read from its environment alone (no MPI
library loaded): Open MPI's `mpirun`, MPICH's and Slurm's PMI, PMIx, MVAPICH."""

from __future__ import annotations

import os

SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")


def _first_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return default


def launched_ranks() -> int:
    """The ranks of the job this process is one of (1: not started by a launcher)."""
    return max(1, _first_int(SIZE_VARIABLES, 1))


def launched_rank() -> int:
    """This process's rank in that job (0 where none is said)."""
    return _first_int(RANK_VARIABLES, 0)
