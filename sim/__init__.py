"""The packet-level simulator: the default engine.

`Simulation` (engine.py) is the Python layer; the numba kernel (kernel.py)
drives small components: pipes, egress queues (queue.py), the ECN marking
policy (ecn.py), the PFC policy (pfc.py) and DCQCN senders (dcqcn.py).
`run.ENGINE` is the simulator as `aifabric.engines` runs it: a
`aifabric.fabric.scenario.Scenario` into a run directory.
"""

import aifabric.fabric  # noqa: F401  (sets the numba cache directory first)
from aifabric.sim.driver import Progress, Simulation

__all__ = ["Progress", "Simulation"]
