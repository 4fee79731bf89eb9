"""The layers of ARCHITECTURE.md hold: every import of the project's code, at the top of a
module or inside a function, points to its own layer or one the layer may use.

Each layer is one folder of the repository, installed as one package under `aifabric`;
a new folder fails these tests until it is given a place in the table below and in
`fabric/checkout.py`. Imports under `if TYPE_CHECKING:` are names for annotations, not
dependencies, and are left out.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from aifabric.fabric.checkout import FOLDERS, module_name

ROOT = Path(__file__).resolve().parent.parent

# layer -> the layers it may import. A layer is a folder of the repository (the package
# under `aifabric` that `aifabric.fabric.checkout.FOLDERS` names); `aifabric` itself (the
# Python API and the command line) sits on top. Nothing runs back up: the engines reach the
# contract, and the runner reaches an engine only by name through `ENGINES`.
MAY_USE = {
    "fabric": set(),
    "topologies": {"fabric"},
    "traffic": {"fabric"},
    "scenarios": {"fabric", "topologies", "traffic"},
    "engines": {"fabric"},
    "sim": {"fabric", "topologies", "traffic", "engines"},
    "emu": {"fabric", "topologies", "traffic", "engines"},
    "analysis": {"fabric"},  # the run directory (fabric.rundir) and the core that reads it
    "experiments": {"fabric", "topologies", "traffic", "scenarios", "engines", "analysis"},
    "aifabric": {"fabric", "topologies", "traffic", "scenarios", "engines", "sim", "emu"}
    | {"analysis", "experiments"},
}
LAYERS = {name.removeprefix("aifabric.") for name in FOLDERS if name != "aifabric"}
# what the folders were called before the namespace: an import of one of these names is of
# another distribution (Fabric, the SSH library, is `fabric`), never of this project
FOREIGN = {folder for folder in FOLDERS.values() if folder != "aifabric"}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "aifabric":
        raise AssertionError(f"{module} is outside the aifabric namespace")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "aifabric"


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
    """(module, line, imported module, names) over the project's folders: imports of the
    namespace, and of the bare folder names (which are another distribution's)."""
    for folder in FOLDERS.values():
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for line, target, names in imports(tree):
                if target.partition(".")[0] not in {"aifabric", *FOREIGN}:
                    continue
                if target == "aifabric":  # `from aifabric import traffic`: of that layer
                    for name in names:
                        yield module_name(path, root), line, f"aifabric.{name}", ()
                    continue
                yield module_name(path, root), line, target, names


def crossings(root: Path = ROOT) -> list[str]:
    """Every import that points to a layer its module's layer may not use, or out of the
    namespace to a name the folders had before it."""
    bad = []
    for module, line, target, _ in project_imports(root):
        if target.partition(".")[0] in FOREIGN:
            bad.append(f"{module}:{line} imports {target}, which is not aifabric's")
            continue
        a, b = layer(module), layer(target)
        if a == b:
            continue
        if b not in MAY_USE[a]:
            bad.append(f"{module}:{line} ({a}) imports {target} ({b})")
    return bad


def test_no_import_runs_back_up_the_layers():
    assert crossings() == []


def _is_module(dotted: str, root: Path = ROOT) -> bool:
    """Whether `dotted` (under aifabric) is a module or package of the checkout at `root`."""
    parts = dotted.split(".")
    package = next(
        (p for p in sorted(FOLDERS, key=len, reverse=True) if dotted.startswith(p)), None
    )
    if package is None:
        return False
    path = root / FOLDERS[package] / Path(*parts[len(package.split(".")) :])
    return path.is_dir() or path.with_suffix(".py").is_file()


def test_no_module_imports_a_private_name_of_another():
    bad = []
    for module, line, target, names in project_imports():
        for name in names:
            own = target == module or target.startswith(module + ".")
            submodule = _is_module(f"{target}.{name}")
            if name.startswith("_") and not name.startswith("__") and not own and not submodule:
                bad.append(f"{module}:{line} imports {target}.{name}")
    assert bad == []


def test_the_folders_are_the_layers_and_the_wheel_maps_them():
    """Every package folder at the top of the repository is one layer, and the build installs
    each under `aifabric` (pyproject's package-dir is the table of `fabric/checkout.py`)."""
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert folders == set(FOLDERS.values())
    assert set(MAY_USE) == LAYERS | {"aifabric"}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == FOLDERS
    assert sorted(p for p in setuptools["packages"] if p in FOLDERS) == sorted(FOLDERS)
    # every folder of a layer that holds data files (presets, specs) is a package of data
    held = {
        path.parent.relative_to(ROOT)
        for folder in FOLDERS.values()
        for path in (ROOT / folder).rglob("*.toml")
    }
    data = {"aifabric." + ".".join(folder.parts) for folder in held}
    assert set(setuptools["packages"]) - set(FOLDERS) == data
    for package in data:
        assert setuptools["package-data"][package] == ["*.toml"], package
    assert all(p.partition(".")[0] == "aifabric" for p in setuptools["package-data"])


def test_the_engines_modules_are_named_alike():
    """Each engine keeps its `ENGINE` in `engine.py`, as `ENGINES` registers it."""
    from aifabric.engines import ENGINES

    assert ENGINES == {"sim": "aifabric.sim.engine", "mininet": "aifabric.emu.engine"}
    for folder in ("sim", "emu"):
        tree = ast.parse((ROOT / folder / "engine.py").read_text())
        assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
        assert "ENGINE" in assigned, folder


def _tree(tmp_path):
    for folder in FOLDERS.values():
        (tmp_path / folder).mkdir()


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("fabric/rundir.py", "from aifabric.cli import main", "aifabric.fabric.rundir:1 (fabric)"),
        ("sim/x.py", "import aifabric.emu.net", "aifabric.sim.x:1 (sim) imports"),
        ("analysis/x.py", "def f():\n    from aifabric.sim import engine", "aifabric.analysis.x:2"),
        (
            "analysis/y.py",
            "from aifabric.traffic.collectives import KINDS",
            "aifabric.analysis.y:1",
        ),
        (
            "topologies/x.py",
            "import aifabric.traffic.flows",
            "aifabric.topologies.x:1 (topologies)",
        ),
        ("engines/__init__.py", "from aifabric.sim.engine import ENGINE", "aifabric.engines:1"),
        ("traffic/x.py", "from fabric.units import ns", "aifabric.traffic.x:1 imports fabric."),
    ],
)
def test_an_import_back_up_is_found(tmp_path, module, source, expected):
    _tree(tmp_path)
    path = tmp_path / module
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source + "\n")
    [found] = crossings(tmp_path)
    assert found.startswith(expected)


def test_a_type_only_import_is_no_dependency(tmp_path):
    _tree(tmp_path)
    (tmp_path / "fabric" / "scenario.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from aifabric.traffic.flows import F\n"
    )
    assert crossings(tmp_path) == []


def test_every_file_architecture_md_names_exists():
    """The map and the recipes name files by their paths in the checkout: a move that leaves
    one behind fails here."""
    import re

    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"(?<![\w/.])((?:[a-z_]+/)+[a-z_]+\.(?:py|c|toml))\b", text))
    assert len(named) > 20
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []
