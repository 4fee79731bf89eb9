"""Only `aifabric` is installed: beside Fabric (the SSH library, whose import name is
`fabric`) in one virtual environment, both import and work."""

from __future__ import annotations

import ast
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from aifabric.fabric.checkout import FOLDERS

ROOT = Path(__file__).resolve().parent.parent

BOTH = """
import sys
import fabric
import aifabric
from aifabric.fabric.model import Fabric
from aifabric.topologies import load_fabric
from aifabric import engines

assert hasattr(fabric, "Connection"), fabric.__file__  # the SSH library's
assert not hasattr(fabric, "Fabric")
lab = load_fabric("lab-small")  # a preset: package data came along
assert isinstance(lab, Fabric) and len(lab.nodes) > 0
assert sorted(engines.ENGINES) == ["mininet", "sim"]
import aifabric.sim.engine, aifabric.experiments.crosscheck  # noqa: E401
print(aifabric.__file__)
print(aifabric.fabric.__file__)
print(fabric.__file__)
"""


def pip(python: Path, *args: str, cwd: Path) -> None:
    r = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    if r.returncode and any(
        s in r.stderr for s in ("NewConnectionError", "Temporary failure", "No matching dist")
    ):
        pytest.skip("the package index cannot be reached from here: Fabric cannot be installed")
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.slow
def test_aifabric_and_fabric_the_ssh_library_install_and_import_side_by_side(tmp_path):
    pip(Path(sys.executable), "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT),
        cwd=tmp_path)  # fmt: skip
    [wheel] = (tmp_path / "dist").glob("aifabric-*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        assert {t for t in tops if not t.endswith(".dist-info")} == {"aifabric"}
        names = set(z.namelist())
    for package in FOLDERS:  # every layer, under the one namespace
        assert "/".join(package.split(".")) + "/__init__.py" in names
    assert "aifabric/topologies/presets/lab-small.toml" in names
    assert "aifabric/emu/ecn_marker.c" in names

    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    pip(python, "install", "--no-deps", str(wheel), cwd=tmp_path)
    pip(python, "install", "fabric", cwd=tmp_path)
    # aifabric's own dependencies (numpy, numba, ...) from the test's environment, after the
    # new one's packages, so that aifabric and fabric are the new environment's
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(site) / "zz-test-dependencies.pth").write_text("\n".join(ours) + "\n")

    r = subprocess.run([str(python), "-c", BOTH], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    ours_file, layer_file, ssh_file = r.stdout.split()
    for path in (ours_file, layer_file, ssh_file):
        assert Path(path).is_relative_to(site), path
    assert Path(layer_file).parent.parent == Path(ours_file).parent


def test_tests_and_benchmarks_import_the_layers_through_the_namespace():
    """`import fabric` would be Fabric, the SSH library, where aifabric is installed (and the
    checkout's folder only by accident of the working directory): nothing imports the layers'
    folders by their bare names."""
    bare = set(FOLDERS.values()) - {"aifabric"}
    bad = []
    for folder in ("tests", "benchmarks", *FOLDERS.values()):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    targets = [node.module or ""]
                else:
                    continue
                bad += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {t}"
                    for t in targets
                    if t.partition(".")[0] in bare
                ]
    assert bad == []
