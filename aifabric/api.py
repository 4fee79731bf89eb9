"""The Python API: run a scenario, open a run directory, sweep, for notebooks and scripts.

    import aifabric

    run = aifabric.run("demo", workload__jobs__allreduce__qps=2)   # or aifabric.load(path)
    run.flows          # pandas DataFrames, units in the column names
    run.metrics()      # typed results (aifabric.analysis.results.RunMetrics)

The functions go through the library the command line uses (the scenario
loader, `aifabric.engines.run_scenario`, the sweep runner, the analyzer); the
commands `aifabric run` and `aifabric analyze` print what these return.
Overrides are the dotted keys of `--set` (`aifabric.scenarios.overrides`),
written as keywords with a double underscore for each dot (`workload__qps=4`
is `--set workload.qps=4`), or given as a mapping, `set={"workload.qps": 4}`.
Errors are `AifabricError`, one sentence.

This module imports neither pandas nor numpy: the command line imports it,
and pandas loads when a table is first asked for (`aifabric.analysis.frames`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from aifabric.fabric.errors import AifabricError


def overrides_of(keywords: Mapping[str, Any], set: Mapping[str, Any] | None = None):
    """(dotted key, value) pairs from keywords (`workload__qps` is `workload.qps`) and a
    mapping of dotted keys; a key given twice is refused."""
    for key in keywords:
        if "__" not in key:
            raise AifabricError(
                f"keyword {key}= is no override: write each dot of a key as a double "
                f"underscore (workload__{key}=...) or give set={{'table.{key}': ...}}"
            )
    pairs = [(k.replace("__", "."), v) for k, v in keywords.items()]
    if set is not None and not isinstance(set, Mapping):
        raise AifabricError(f"set= takes a mapping of dotted keys to values, not {set!r}")
    pairs += [(str(k), v) for k, v in (set or {}).items()]
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise AifabricError(f"override {key} is given twice (as a keyword and in set=)")
        seen[key] = value
    return list(seen.items())


def scenario_of(scenario, *, seed: int | None = None, overrides=(), captures: Iterable[str] = ()):
    """A `Scenario` from a preset name, a TOML path or a loaded scenario, with the seed,
    the overrides and the captured ports given (what `aifabric run` runs)."""
    from aifabric.fabric.scenario import Scenario
    from aifabric.scenarios import load_scenario, with_captures

    if isinstance(scenario, Scenario):
        if overrides or seed is not None:
            raise AifabricError(
                "overrides and seed apply to a preset name or a TOML path, not to a loaded "
                "scenario (load it with them: aifabric.scenarios.load_scenario)"
            )
        sc = scenario
    elif isinstance(scenario, str | os.PathLike):
        sc = load_scenario(os.fspath(scenario), seed=seed, overrides=list(overrides))
    else:
        raise AifabricError(
            f"a scenario is a preset name, a TOML path or a loaded Scenario, not {scenario!r}"
        )
    names = [c for item in captures for c in item.split(",") if c]
    return with_captures(sc, names) if names else sc


def _path(value, what: str) -> Path:
    """`value` as a path, or one sentence saying it is none."""
    if not isinstance(value, str | os.PathLike):
        raise AifabricError(f"{what} is a path, not {value!r}")
    return Path(value)


def default_output(sc) -> Path:
    """Where a run goes when no directory is named: runs/SCENARIO-UTCSTAMP."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(f"runs/{sc.name}-{stamp}")


def run(
    scenario,
    output: str | os.PathLike | None = None,
    engine: str = "sim",
    *,
    seed: int | None = None,
    set: Mapping[str, Any] | None = None,
    captures: Iterable[str] = (),
    options: Mapping[str, Any] | None = None,
    force: bool = False,
    progress: Callable[[Any], None] | None = None,
    **overrides,
) -> Run:
    """Run `scenario` (a preset name, a TOML path or a loaded scenario) on `engine` into
    `output` (default: runs/NAME-STAMP, as `aifabric run` names it) and open the run.

    `seed` replaces the scenario's seed; overrides as keywords (`workload__qps=4`) or
    `set={"workload.qps": 4}`; `captures` names ports (or NICs) to capture; `options` are
    the engine's (`{"switch": "ovs", "scale": 100}` for mininet); `force` replaces an
    existing run directory; `progress` is called with the engine's progress while it runs.
    A run that ends partial or failed is returned too: look at `.status`."""
    from aifabric.engines import run_scenario
    from aifabric.fabric.rundir import check_run_dir, remove_run_dir
    from aifabric.warmup import ensure_warm

    if output is not None:
        output = _path(output, "output")
        check_run_dir(output, replace=force)
    sc = scenario_of(scenario, seed=seed, overrides=overrides_of(overrides, set), captures=captures)
    if engine == "sim":
        ensure_warm()  # an empty kernel cache: compile it all now, and say so
    path = Path(output) if output is not None else default_output(sc)
    if force:
        remove_run_dir(path)
    run_scenario(engine, sc, path, options=dict(options or {}), progress=progress, notify=_say)
    return Run(path)


def _say(line: str) -> None:
    """An engine's notice for the person running it (the emulator's, before it builds), on
    stderr as `aifabric run` prints it."""
    import sys

    print(line, file=sys.stderr, flush=True)


def load(path: str | os.PathLike) -> Run:
    """Open the run directory at `path` (any engine's)."""
    return Run(path)


def sweep(
    spec_or_scenario,
    output: str | os.PathLike,
    *,
    vary: Mapping[str, Any] | None = None,
    zip: Mapping[str, Any] | None = None,
    seeds: Any = None,
    set: Mapping[str, Any] | None = None,
    full: bool = False,
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool = False,
    **overrides,
) -> Sweep:
    """Run a sweep into the folder `output` (resumed when it holds the same sweep) and open it.

    `spec_or_scenario` is a sweep spec (TOML with a [sweep] table; `full` takes its [full]
    size) or a scenario (a preset name or a TOML path) with `vary` (dotted key -> its
    values, every combination), `zip` (keys varied together, position by position) and
    overrides for every run (keywords or `set=`, as `run` takes them); `seeds` as a spec
    gives them (`[1, 2]`, `"1-5"`, 3). Points run on a local Dask cluster of `workers`
    processes, or on the cluster at `scheduler`; `progress` prints the counter on stderr."""
    from dataclasses import replace

    from aifabric.experiments.runner import run_sweep, stderr_progress
    from aifabric.experiments.spec import is_sweep_file, load_sweep, parse_seeds, sweep_of
    from aifabric.fabric.scenario import Scenario
    from aifabric.warmup import ensure_warm

    if isinstance(spec_or_scenario, Scenario):
        raise AifabricError(
            "a sweep loads its scenario on every worker: give its preset name or TOML path"
        )
    if not isinstance(spec_or_scenario, str | os.PathLike):
        raise AifabricError(
            f"a sweep is a spec or a scenario's name or path, not {spec_or_scenario!r}"
        )
    if workers is not None and scheduler is not None:
        raise AifabricError(
            "workers sizes a local cluster; with a scheduler the cluster has its own"
        )
    output = _path(output, "output")
    source = os.fspath(spec_or_scenario)
    fixed = overrides_of(overrides, set)
    if is_sweep_file(source):
        if vary or zip or fixed:
            raise AifabricError("vary, zip and overrides go with a scenario, not a sweep spec")
        spec = load_sweep(source, full=full)
        if seeds is not None:
            spec = replace(spec, seeds=parse_seeds(seeds))
    else:
        if full:
            raise AifabricError("full goes with a sweep spec that has a [full] section")
        spec = sweep_of(
            source, grid=vary, together=zip, fixed=dict(fixed), seeds=1 if seeds is None else seeds
        )
    if scheduler is None:
        ensure_warm()  # else every local worker compiles all of it at once on its first point
    outcome = run_sweep(
        spec, output, workers=workers, scheduler=scheduler,
        echo=stderr_progress() if progress else None,
    )  # fmt: skip
    return Sweep(output, outcome)


class Run:
    """A run directory: its record (`status`, `scenario`, ...), its tables as DataFrames
    (`flows`, `ports`, `collectives`: `aifabric.analysis.frames` says their columns) and
    its metrics (`metrics()`, what `aifabric analyze` shows). Tables load on first use."""

    def __init__(self, path: str | os.PathLike):
        from aifabric.fabric.rundir import Run as RunDir

        self._dir = RunDir(_path(path, "a run directory"))
        self._tables: dict[str, Any] = {}
        self._metrics: dict[tuple, Any] = {}

    def __repr__(self) -> str:
        return f"<aifabric.Run {self.path} ({self.engine}, {self.status})>"

    @property
    def path(self) -> Path:
        return self._dir.path

    @property
    def status(self) -> str:
        """complete, partial, failed, running or killed (`aifabric.fabric.rundir`)."""
        return self._dir.status

    @property
    def message(self) -> str:
        """Why a run is not complete (empty when it is)."""
        return self._dir.meta.get("message", "")

    @property
    def engine(self) -> str:
        return self._dir.engine

    @property
    def scenario(self) -> dict[str, Any]:
        """The scenario as run.json records it (fabric, workload, ECMP, queues, cc, seeds)."""
        return self._dir.meta.get("scenario", {})

    @property
    def meta(self) -> dict[str, Any]:
        """All of run.json."""
        return self._dir.meta

    @property
    def summary(self) -> dict[str, Any]:
        """The engine's own summary of the run (what `aifabric run` printed)."""
        return (self._dir.meta.get("results") or {}).get("summary", {})

    @property
    def fabric(self):
        """The run's `Fabric` (from topology.json): node and port names, rates, links."""
        if "fabric" not in self._tables:
            from aifabric.fabric.export import fabric_from_topology

            self._tables["fabric"] = fabric_from_topology(self._dir.topology())
        return self._tables["fabric"]

    def _table(self, name: str):
        if name not in self._tables:
            from aifabric.analysis import frames

            make = {
                "flows": lambda: frames.flows(self._dir, self.fabric),
                "ports": lambda: frames.ports(self._dir, self.fabric),
                "port_cells": lambda: frames.ports(self._dir, self.fabric, every_cell=True),
                "collectives": lambda: frames.collectives(self._dir),
            }[name]
            self._tables[name] = make()
        return self._tables[name]

    @property
    def flows(self):
        """One row per flow (DataFrame; `aifabric.analysis.frames.flows`)."""
        return self._table("flows")

    @property
    def ports(self):
        """One row per sample and recorded port in which the port carried, queued or signalled
        something (DataFrame; `aifabric.analysis.frames.ports`)."""
        return self._table("ports")

    @property
    def port_cells(self):
        """`ports` with a row of zeros for every other sample and port: samples x ports rows
        (`aifabric.analysis.frames.ports` with `every_cell`)."""
        return self._table("port_cells")

    @property
    def collectives(self):
        """One row per collective op (DataFrame; `aifabric.analysis.frames.collectives`)."""
        return self._table("collectives")

    @property
    def captures(self) -> list[Path]:
        """The packet captures the run took (captures/PORT.pcap)."""
        return self._dir.captures()

    def metrics(self, *, top: int = 10, series: bool = False, rate_bps: int | None = None):
        """The run's metrics (`aifabric.analysis.results.RunMetrics`), as `aifabric analyze`
        computes them: `top` rows per ranking, `series` adds the time series, `rate_bps`
        times captures' PFC quanta (default: the fabric's slowest link)."""
        key = (top, series, rate_bps)
        if key not in self._metrics:
            from aifabric.analysis.metrics import run_metrics

            self._metrics[key] = run_metrics(self._dir, top=top, series=series, rate_bps=rate_bps)
        return self._metrics[key]

    def report(self, output: str | os.PathLike = "report.html") -> Path:
        """Write the run's HTML report (`aifabric report`) to `output`; its path."""
        from aifabric.analysis.report import build_report
        from aifabric.fabric.files import write_atomic

        write_atomic(output, build_report(self._dir))
        return Path(output)


class Sweep:
    """A sweep's folder: its results table (`results`, one row per point), its points' runs
    (`runs`, `run(name)`), and what the last `aifabric.sweep` call did (`outcome`)."""

    def __init__(self, path: str | os.PathLike, outcome: dict[str, Any] | None = None):
        from aifabric.experiments.sweepdir import open_sweep

        self._results = open_sweep(path)
        self.outcome = outcome

    def __repr__(self) -> str:
        return f"<aifabric.Sweep {self.path} ({len(self.results)} points)>"

    @property
    def path(self) -> Path:
        return self._results.path

    @property
    def spec(self) -> dict[str, Any]:
        """The sweep as run (sweep.json)."""
        return self._results.spec

    @property
    def keys(self) -> list[str]:
        """The keys it varies."""
        return self._results.keys

    @property
    def results(self):
        """results.csv as a DataFrame: point, run_dir, seed, status, the varied keys, the
        metrics (`aifabric.experiments.columns`)."""
        return self._results.frame

    @property
    def runs(self) -> list[Run]:
        """The run of every point in the table whose run directory exists, in table order."""
        out = []
        for d in self.results["run_dir"]:
            path = self.path / str(d)
            if (path / "run.json").is_file():
                out.append(Run(path))
        return out

    def run(self, name: str) -> Run:
        """The run of the point named `name` (its run_dir: `workload.qps=4,seed=1`)."""
        names = [str(d) for d in self.results["run_dir"]]
        if name not in names:
            raise AifabricError(f"sweep {self.path} has no point {name!r}")
        return Run(self.path / name)

    def aggregate(self, metrics: Iterable[str] = ()):
        """Per configuration and metric: mean, std, min, max and the 95% interval over
        seeds, as `aifabric sweep show` prints them (a DataFrame)."""
        import pandas as pd

        return pd.DataFrame(self._results.aggregate(list(metrics)))


def open_sweep(path: str | os.PathLike) -> Sweep:
    """Open a sweep's folder (one `aifabric sweep` wrote)."""
    return Sweep(path)
