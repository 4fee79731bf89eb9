"""The experiments shipped with aifabric: sweep specs in experiments/specs/*.toml.

Each reproduces a published finding on the simulator; copy one and edit it
to ask a neighbouring question.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from aifabric.fabric.errors import AifabricError


def _folder() -> Path:
    return Path(str(resources.files("aifabric.experiments") / "specs"))


def experiment_names() -> list[str]:
    return sorted(p.stem for p in _folder().glob("*.toml") if not p.name.endswith(".scenario.toml"))


def experiment_spec(name: str) -> Path:
    path = _folder() / f"{name}.toml"
    if name not in experiment_names():
        raise AifabricError(
            f"unknown experiment {name!r}; the experiments are {', '.join(experiment_names())}"
        )
    return path


def experiments() -> list[dict]:
    """Name, description, runs by default and with --full, and the spec's path, per experiment."""
    from aifabric.experiments.spec import load_sweep

    out = []
    for name in experiment_names():
        path = experiment_spec(name)
        small, full = load_sweep(path), load_sweep(path, full=True)
        out.append(
            {
                "name": name,
                "description": small.description,
                "runs": len(small.points()),
                "runs_full": len(full.points()),
                "spec": str(experiment_spec(name)),
            }
        )
    return out
