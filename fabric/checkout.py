"""The folders of a checkout and the packages they are under `aifabric`.

Only `aifabric` is installed. Its layers keep their own folders at the top of
the repository, and each folder is one layer (`tests/test_layers.py`):

    fabric/      aifabric.fabric       the core: model, units, routing, the run directory
    topologies/  aifabric.topologies   topology specs -> Fabric
    traffic/     aifabric.traffic      workloads -> flows
    scenarios/   aifabric.scenarios    scenarios loaded and checked once
    engines/     aifabric.engines      the engine contract and the one runner
    sim/         aifabric.sim          the simulator engine
    emu/         aifabric.emu          the emulator engine
    analysis/    aifabric.analysis     run directories and captures -> metrics, reports
    experiments/ aifabric.experiments  sweeps, experiments, crosscheck
    aifabric/    aifabric              the Python API and the command line

A wheel holds them nested (`package-dir` in pyproject.toml, which a test keeps
equal to `FOLDERS`); in a checkout, `aifabric/__init__.py` adds the repository's
top level to its package path, so the folders import as they are, installed
editable or not.
"""

from __future__ import annotations

from pathlib import Path

FOLDERS = {
    "aifabric": "aifabric",
    "aifabric.fabric": "fabric",
    "aifabric.topologies": "topologies",
    "aifabric.traffic": "traffic",
    "aifabric.scenarios": "scenarios",
    "aifabric.engines": "engines",
    "aifabric.sim": "sim",
    "aifabric.emu": "emu",
    "aifabric.analysis": "analysis",
    "aifabric.experiments": "experiments",
}


def module_name(path: Path, root: Path) -> str:
    """The dotted name under `aifabric` of the source file `path` of the checkout at `root`."""
    parts = path.relative_to(root).with_suffix("").parts
    package = next(p for p, folder in FOLDERS.items() if folder == parts[0])
    rest = parts[1:-1] if parts[-1] == "__init__" else parts[1:]
    return ".".join((package, *rest))


def source_files(root: Path):
    """(dotted name, path) of every source file, in a fixed order: of the checkout at `root`,
    or, where `root` is an installed `aifabric` package (a wheel's nested folders), of it."""
    if not (root / "aifabric" / "__init__.py").is_file():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            yield ".".join(("aifabric", *(parts[:-1] if parts[-1] == "__init__" else parts))), path
        return
    for folder in FOLDERS.values():
        for path in sorted((root / folder).rglob("*.py")):
            yield module_name(path, root), path
