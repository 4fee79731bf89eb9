"""The packet-level simulator: the default engine.

`Simulation` (engine.py) is the Python layer; the numba kernel (kernel.py)
drives small components: pipes, egress queues (queue.py), the ECN marking
policy (ecn.py), the PFC policy (pfc.py) and DCQCN senders (dcqcn.py).
`run_scenario` runs a `fabric.scenario.Scenario` into a run directory.
"""

from fabric.cc import cc_parameters
from fabric.sim.engine import Progress, Simulation

__all__ = ["Progress", "Simulation", "cc_parameters"]
