"""The layers of ARCHITECTURE.md hold: every import of the project's code, at the top of a
module or inside a function, points to its own layer or one the layer may use.

Imports under `if TYPE_CHECKING:` are names for annotations, not dependencies, and are
left out. A module of `fabric/` that is in no layer below fails the test until it is
given one, so a new module is placed on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fabric", "topologies", "traffic", "analysis", "experiments", "aifabric")

CORE = {
    "model", "units", "addressing", "routing", "emuhash", "cc", "faults", "scenario",
    "results", "rundir", "files", "errors", "frames", "imbalance", "specfile", "switch_profiles",
    "_numba_cache", "interrupts", "export", "spread", "summary",
}  # fmt: skip
FABRIC_LAYERS = {"scenarios": "scenarios", "overrides": "scenarios", "engines": "contract"}
FABRIC_LAYERS |= {"sim": "sim", "emu": "emu", "crosscheck": "crosscheck"}

# layer -> the other layers it may import (nothing runs back up; the engines reach the
# runner's contract, the runner reaches an engine only by name through `ENGINES`)
MAY_USE = {
    "core": set(),
    "topologies": {"core"},
    "traffic": {"core"},
    "scenarios": {"core", "topologies", "traffic"},
    "contract": {"core"},
    "sim": {"core", "topologies", "traffic", "contract"},
    "emu": {"core", "topologies", "traffic", "contract"},
    "crosscheck": {"core", "scenarios", "contract"},
    "analysis": {"core"},  # the run directory (fabric.rundir) and the core that reads it
    "experiments": {"core", "topologies", "traffic", "scenarios", "contract", "analysis"},
    "aifabric": {"core", "topologies", "traffic", "scenarios", "contract", "sim", "emu"}
    | {"crosscheck", "analysis", "experiments"},
}


def layer(module: str) -> str:
    top, _, rest = module.partition(".")
    if top != "fabric":
        return top
    first = rest.partition(".")[0]
    if not first or first in CORE:
        return "core"
    if first not in FABRIC_LAYERS:
        raise AssertionError(f"fabric.{first} is in no layer: add it to tests/test_layers.py")
    return FABRIC_LAYERS[first]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def imports(tree: ast.AST):
    """(line, imported module, names) of every import outside `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if _type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, tuple(a.name for a in node.names)
        todo.extend(ast.iter_child_nodes(node))


def project_imports(root: Path = ROOT):
    """(module, line, imported project module, names) over the project's packages."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for line, target, names in imports(tree):
                if target.partition(".")[0] in PACKAGES:
                    yield module_name(path, root), line, target, names


def crossings(root: Path = ROOT) -> list[str]:
    """Every import that points to a layer its module's layer may not use."""
    bad = []
    for module, line, target, _ in project_imports(root):
        a, b = layer(module), layer(target)
        if a == b:
            continue
        if b not in MAY_USE[a]:
            bad.append(f"{module}:{line} ({a}) imports {target} ({b})")
    return bad


def test_no_import_runs_back_up_the_layers():
    assert crossings() == []


def test_no_module_imports_a_private_name_of_another():
    bad = []
    for module, line, target, names in project_imports():
        for name in names:
            own = target == module or target.startswith(module + ".")
            submodule = (ROOT / Path(*target.split("."), name)).exists() or (
                ROOT / Path(*target.split("."), f"{name}.py")
            ).exists()
            if name.startswith("_") and not name.startswith("__") and not own and not submodule:
                bad.append(f"{module}:{line} imports {target}.{name}")
    assert bad == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("fabric/rundir.py", "from aifabric.cli import main", "fabric.rundir:1 (core) imports"),
        ("fabric/sim/x.py", "import fabric.emu.net", "fabric.sim.x:1 (sim) imports"),
        ("analysis/x.py", "def f():\n    from fabric.sim import run", "analysis.x:2 (analysis)"),
        ("analysis/y.py", "from traffic.collectives import KINDS", "analysis.y:1 (analysis)"),
        ("topologies/x.py", "import traffic.flows", "topologies.x:1 (topologies) imports"),
        ("fabric/engines.py", "from fabric.sim.run import ENGINE", "fabric.engines:1 (contract)"),
    ],
)
def test_an_import_back_up_is_found(tmp_path, module, source, expected):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    path = tmp_path / module
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source + "\n")
    [found] = crossings(tmp_path)
    assert found.startswith(expected)


def test_a_type_only_import_and_a_module_in_no_layer(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "fabric" / "scenario.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from traffic.flows import F\n"
    )
    assert crossings(tmp_path) == []
    (tmp_path / "fabric" / "gadget.py").write_text("import fabric.model\n")
    with pytest.raises(AssertionError, match="fabric.gadget is in no layer"):
        crossings(tmp_path)
