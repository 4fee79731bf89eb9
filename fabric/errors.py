"""Errors a user can cause: each carries one sentence that says what to fix."""


class AifabricError(Exception):
    """Bad input or an impossible request; the CLI prints the message and exits 1."""


class SpecError(AifabricError, ValueError):
    """A topology, workload or scenario spec that cannot be built."""


class UnitError(AifabricError, ValueError):
    """A quantity ("400G", "2us", "32MiB") that does not parse."""
