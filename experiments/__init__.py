"""Experiments: sweeps of scenarios over keys and seeds, run on Dask, aggregated across seeds.

load_sweep(path) / sweep_from_flags(...)  -> Sweep (aifabric.experiments.spec)
run_sweep(sweep, DIR, workers=, scheduler=)  every point a run directory (experiments.runner)
aggregate(results) / effects(...)           per configuration, with 95% intervals (.stats)
build_report(DIR)                           one self-contained HTML page (.report)
experiment_names() / experiment_path(name)  the published findings shipped as specs (specs/)
"""

import aifabric.fabric  # noqa: F401  (sets the numba cache directory first)
from aifabric.experiments.spec import Sweep, load_sweep, sweep_from_flags

__all__ = ["Sweep", "load_sweep", "sweep_from_flags"]
