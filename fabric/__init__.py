"""The network model of a backend fabric, its units, ECMP routing and the engines."""

import fabric._numba_cache  # noqa: F401  (before anything imports numba)

__version__ = "0.1.0"

from fabric.errors import AifabricError, SpecError
from fabric.model import (
    ROLES,
    EcnProfile,
    Fabric,
    Link,
    Node,
    PfcProfile,
    Port,
    QueueProfile,
    Role,
)

__all__ = [
    "__version__",
    "ROLES",
    "AifabricError",
    "EcnProfile",
    "Fabric",
    "Link",
    "Node",
    "PfcProfile",
    "Port",
    "QueueProfile",
    "Role",
    "SpecError",
]
