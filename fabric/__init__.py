"""The core: the network model of a backend fabric, its units, ECMP routing, the run directory."""

import aifabric.fabric._numba_cache  # noqa: F401  (before anything imports numba)

__version__ = "0.1.0"

from aifabric.fabric.errors import AifabricError, SpecError

_MODEL = (
    "ROLES", "EcnProfile", "Fabric", "Link", "Node", "PfcProfile", "Port", "QueueProfile", "Role",
)  # fmt: skip

__all__ = ["__version__", "AifabricError", "SpecError", *_MODEL]


def __getattr__(name: str):
    # The model (and numpy) loads on first use, so that `import aifabric.fabric.errors`
    # or `aifabric.fabric.units` (the command line's startup) stays cheap.
    if name in _MODEL:
        from aifabric.fabric import model

        return getattr(model, name)
    raise AttributeError(f"module 'aifabric.fabric' has no attribute {name!r}")
