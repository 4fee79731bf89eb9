import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from aifabric.fabric import _numba_cache
from aifabric.fabric.checkout import FOLDERS

ROOT = Path(__file__).resolve().parent.parent


def _tree(root, layout="PK_N = 11\n", report="TITLE = 'a'\n"):
    files = {
        "fabric/__init__.py": "",
        "sim/__init__.py": "from aifabric.sim.driver import Simulation\n",
        "sim/driver.py": "from aifabric.sim.kernel import run\nSimulation = object\n",
        "sim/kernel.py": (
            "from numba import njit\n\nfrom aifabric.sim import (\n    heap,  # a comment\n"
            "    layout as L,\n)\nfrom aifabric.fabric.units import ns, \\\n    us\n"
        ),
        "sim/layout.py": layout,
        "sim/heap.py": "",
        "fabric/units.py": "ns, us = 1, 1000\n",
        "analysis/__init__.py": "",
        "analysis/report.py": "import aifabric.sim.kernel\n" + report,
    }
    files["aifabric/__init__.py"] = ""
    for folder in FOLDERS.values():
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_cache_directory_follows_the_content_of_the_sources_kernels_import(tmp_path):
    _tree(tmp_path)
    first = _numba_cache.source_digest(tmp_path)
    os.utime(tmp_path / "sim" / "layout.py", (0, 0))
    assert _numba_cache.source_digest(tmp_path) == first  # timestamps do not matter
    _tree(tmp_path, report="TITLE = 'b'\n")
    assert _numba_cache.source_digest(tmp_path) == first  # nor what no kernel imports
    _tree(tmp_path, layout="PK_N = 16\n")
    assert _numba_cache.source_digest(tmp_path) != first  # a changed constant does
    _tree(tmp_path)
    (tmp_path / "fabric" / "units.py").write_text("ns, us = 1, 1024\n")  # a name after a
    assert _numba_cache.source_digest(tmp_path) != first  # line continuation counts too


def test_two_checkouts_of_the_same_sources_keep_apart_caches(tmp_path):
    """numba files machine code under its source's path: one checkout's warm cache (and its
    warm-up marker) says nothing about another's."""
    _tree(tmp_path / "one")
    _tree(tmp_path / "two")
    assert _numba_cache.source_digest(tmp_path / "one") == _numba_cache.source_digest(
        tmp_path / "two"
    )
    key = _numba_cache.cache_key(tmp_path / "one")
    assert key != _numba_cache.cache_key(tmp_path / "two")
    assert key == _numba_cache.cache_key(tmp_path / "one" / "fabric" / "..")
    (tmp_path / "one" / "sim/layout.py").write_text("PK_N = 12\n")
    assert _numba_cache.cache_key(tmp_path / "one") != key


def test_the_project_keys_the_cache_on_kernel_modules_and_their_imports(tmp_path):
    for folder in FOLDERS.values():
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__py*"))
    used = {str(p.relative_to(tmp_path)) for p in _numba_cache.kernel_sources(tmp_path)}
    assert {"sim/kernel.py", "sim/layout.py", "fabric/routing.py"} <= used
    assert {"analysis/capture.py", "traffic/flow_packets.py", "fabric/frames.py"} <= used
    assert not {"analysis/report.py", "aifabric/cli.py", "aifabric/warmup.py"} & used
    first = _numba_cache.source_digest(tmp_path)
    with open(tmp_path / "analysis" / "report.py", "a") as f:
        f.write("\nEDITED = True\n")
    assert _numba_cache.source_digest(tmp_path) == first
    layout = tmp_path / "sim" / "layout.py"
    layout.write_text(layout.read_text() + "\nEDITED = True\n")
    assert _numba_cache.source_digest(tmp_path) != first


def _ast_imports(name: str, path: Path):
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                head = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*head, module] if module else head)
            yield module, tuple(a.name for a in node.names)


def test_the_import_scan_finds_what_the_python_parser_finds_in_every_source_file():
    for name, path in _numba_cache.modules(ROOT).items():
        text = path.read_bytes()
        found = set(_numba_cache.imports(name, path, text))
        assert set(_ast_imports(name, path)) <= found, path
        top = any(
            isinstance(node, (ast.Import, ast.ImportFrom))
            and any(
                m.split(".")[0] == "numba"
                for m in ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
                + ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            for node in ast.parse(text).body
        )
        assert _numba_cache.imports_numba(text) == top, path


def test_kernels_compile_into_the_keyed_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = "import os, aifabric.fabric, numba; print(os.environ['NUMBA_CACHE_DIR'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out.startswith(str(tmp_path / "aifabric" / "numba-"))
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == str(tmp_path / "mine")


def test_whichever_project_module_is_imported_first_numba_uses_the_keyed_directory(tmp_path):
    """numba reads NUMBA_CACHE_DIR once, when it is first imported: a module importing
    numba before `aifabric.fabric` has set it would compile into `__pycache__` beside the
    sources, keyed on file times only (the stale-kernel hazard the keyed directory rules
    out). Each module that imports numba, imported first in a fresh interpreter."""
    from aifabric.fabric.checkout import source_files

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = (
        "import importlib, os, sys\n"
        "importlib.import_module(sys.argv[1])\n"
        "import numba\n"
        "print(numba.config.CACHE_DIR == os.environ.get('NUMBA_CACHE_DIR', '-'))\n"
    )
    names = [
        name for name, path in source_files(ROOT) if _numba_cache.imports_numba(path.read_bytes())
    ]
    assert "aifabric.sim.kernel" in names and "aifabric.sim.driver" in names
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", code, name], env=env, stdout=subprocess.PIPE, text=True
        )
        for name in names
    }
    wrong = [name for name, p in procs.items() if p.communicate()[0].strip() != "True"]
    assert not wrong


_INLINEE = """
from numba import njit

@njit(inline="always")
def spread(x):
    t = 0
{branches}    return t

@njit
def caller(x):
    return spread(x) + spread(x + 1)
"""


def test_an_inlined_function_is_copied_in_time_linear_in_its_size(tmp_path):
    """numba copies an inlinee's IR block by block; with a memo per block each block copies
    the function's whole scope again (blocks x variables). Once a compile has started, the
    project's kernels copy each function's scope once: the variables copied per inlining
    stay near the function's own count, and the inlined code computes the same."""
    branch = "    if x > {i}:\n        v{i} = x * {i}\n        t += v{i}\n"
    branches = "".join(branch.format(i=i) for i in range(60))
    (tmp_path / "inlinee.py").write_text(_INLINEE.format(branches=branches))
    code = (
        "import sys, collections\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import aifabric.fabric.routing\n"  # a kernel module: installs the project's hooks
        "from numba.core import ir\n"
        "copies = collections.Counter()\n"
        "deepcopy = ir.Var.__deepcopy__\n"
        "def counted(self, memo):\n"
        "    copies['var'] += 1\n"
        "    return deepcopy(self, memo)\n"
        "ir.Var.__deepcopy__ = counted\n"
        "import inlinee\n"
        "got = inlinee.caller(30)\n"
        "want = sum(30 * i for i in range(30)) + sum(31 * i for i in range(31))\n"
        "from numba.core.inline_closurecall import InlineWorker\n"
        "print(got == want, getattr(InlineWorker.inline_ir, 'one_memo', False), copies['var'])\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    same, patched, copies = out[0] == "True", out[1] == "True", int(out[2])
    assert same and patched
    # 2 call sites x 2 copies of about 60 x 3 variables each; per block (about 120 blocks)
    # it was over 100 times that
    assert copies < 2 * 2 * 60 * 3 * 5, copies


def _kernel_twice(tmp_path, name: str, source: str, first: str, then: str) -> list[str]:
    """`first`, then `then`, each in a Python that has imported the kernel module `name`
    (`source`) after the project's hooks, on one cache directory: the second's output."""
    (tmp_path / f"{name}.py").write_text(source)
    head = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import aifabric.fabric.routing\n"  # a kernel module: installs the project's hooks
        f"import {name}\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-c", head + first], env=env, check=True)  # compiles
    return subprocess.run(
        [sys.executable, "-c", head + then], env=env, capture_output=True, text=True, check=True
    ).stdout.split()


_CACHED = """
from numba import njit

@njit(cache=True)
def square(x):
    return x * x
"""


def test_a_cached_kernel_loads_without_parsing_its_bitcode_until_something_links_it(tmp_path):
    """A kernel from the cache runs with its module's bitcode unparsed; its engine knows the
    names the module defines (from the object file's symbol table: the same names the
    bitcode defines), and a function compiled later that calls it links it as before."""
    check = (
        "from llvmlite import binding as ll\n"
        "from numba import njit\n"
        "got = cached.square(4)\n"
        "lib = cached.square.overloads[cached.square.signatures[0]].library\n"
        "bitcode = lib.__dict__.get('_aifabric_bitcode')\n"
        "module = ll.parse_bitcode(bitcode)\n"
        "defined = {g.name for gs in (module.functions, module.global_variables) for g in gs\n"
        "           if not g.is_declaration}\n"
        "engine = lib._codegen._engine\n"
        "known = all(engine.is_symbol_defined(n) for n in defined)\n"
        "@njit\n"
        "def plus_one(x):\n"
        "    return cached.square(x) + 1\n"
        "print(got, bool(defined), known, plus_one(5), '_aifabric_bitcode' in lib.__dict__)\n"
    )
    out = _kernel_twice(tmp_path, "cached", _CACHED, "cached.square(3)\n", check)
    assert out == ["16", "True", "True", "26", "False"]


def test_the_defined_symbols_of_an_object_file_are_read_from_its_symbol_table():
    """What a module defines but its private globals (which no other module can name)."""
    assert _numba_cache.elf_defined_symbols(b"not an object file") is None
    from llvmlite import binding as ll

    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    module = ll.parse_assembly(
        "@table = global [2 x i64] [i64 1, i64 2]\n"
        "@hidden = private constant i64 7\n"
        "declare i64 @elsewhere(i64)\n"
        "define i64 @f(i64 %x) {\n"
        "  %y = call i64 @elsewhere(i64 %x)\n"
        "  %z = load i64, i64* @hidden\n"
        "  %w = add i64 %y, %z\n"
        "  ret i64 %w\n"
        "}\n"
        "define internal i64 @g(i64 %x) {\n  ret i64 %x\n}\n"
    )
    target = ll.Target.from_triple(ll.get_process_triple()).create_target_machine()
    if target.triple.split("-")[0] not in ("x86_64", "aarch64"):
        return
    assert _numba_cache.elf_defined_symbols(target.emit_object(module)) == {"table", "f", "g"}


_ALLOCATES = """
import numpy as np
from numba import njit

@njit(cache=True)
def ones(n):
    return np.ones(n)
"""


def test_the_runtimes_functions_are_compiled_once_then_loaded_from_the_cache(tmp_path):
    """numba compiles its runtime's functions in every process; the first process keeps
    their machine code in the cache directory, and the next runs a kernel that allocates
    (and so uses them) without compiling them."""
    check = (
        "from numba.core.runtime import nrtdynmod\n"
        "def compiling(ctx):\n"
        "    raise AssertionError('compiled the runtime again')\n"
        "nrtdynmod.create_nrt_module = compiling\n"
        "print(allocates.ones(4).sum())\n"
    )
    out = _kernel_twice(tmp_path, "allocates", _ALLOCATES, "allocates.ones(3)\n", check)
    assert out == ["4.0"]
    assert len(list((tmp_path / "cache").glob("aifabric-runtime-*.pkl"))) == 1
