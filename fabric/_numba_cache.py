"""Where numba keeps compiled kernels: a directory named by a hash of the sources kernels use.

numba's own cache checks only the timestamp of the file a kernel lives in.
Kernels read constants from other modules (the simulator's column layout,
for one) and freeze them at compile time, so after an update that changes
such a module, a cache beside the sources would serve kernels compiled for
the old layout: wrong results, or memory overruns. Keying the cache
directory on the content of those modules rules that out. An explicit
NUMBA_CACHE_DIR is respected.

Which modules: the kernel modules (those that import numba at their top
level) and every project module they import, transitively: for `import a.b`
the packages a and a.b and their imports; for `from a.b import c` the module
a.b.c when it is one (and a.b's file), else a.b and its imports. Imports
inside functions count too. A kernel sees only names bound in its module, and
those come through these imports, so an edit elsewhere (the command line,
reports, workload generation, the engine's Python layer) keeps the cache.
(The hole: a package's `__init__` that reassigns another module's constant
when imported. Do not do that.) The imports are found with a regular
expression, not `ast`, so that every command's startup stays cheap; a test
checks it against `ast` on every source file.

The directory is keyed on the checkout's path too: numba files a kernel's
machine code under the path of its source file, so two checkouts of the same
sources share nothing, and a warm-up marker shared between them would tell
the second one, wrongly, that its kernels are compiled.

This must run before numba is imported; every package of the project
imports `aifabric.fabric` first for that reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import shutil
import struct
import time
from pathlib import Path

from aifabric.fabric.checkout import source_files

KEEP_OLD_DAYS = 7


# A line starts after a newline (a text is searched with one put in front): a pattern that
# begins with one lets `re` skip from newline to newline rather than try every position
# (twice to six times faster; every command's startup pays for this scan).
_IMPORT = re.compile(
    rb"\n[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import[ \t]*(\([^)]*\)|(?:[^\n#;\\]|\\\r?\n)*)"
    rb"|import[ \t]+((?:[^\n#;\\]|\\\r?\n)*))"
)
_NUMBA = re.compile(rb"\n(?:from[ \t]+numba[ \t.]|import[ \t]+numba\b)")


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every source file of the project's packages."""
    return dict(source_files(root))


def imports(name: str, path: Path, text: bytes) -> list[tuple[str, tuple[str, ...] | None]]:
    """The imports of a module: (module, None) for `import module`, (module, names) for
    `from module import names`, relative ones made absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for base, names, plain in _IMPORT.findall(b"\n" + text):
        if plain:
            for item in plain.decode().replace("\\", " ").split(","):
                if item.split():
                    out.append((item.split()[0], None))
            continue
        module = base.decode()
        level = len(module) - len(module.lstrip("."))
        if level:
            head = package.split(".")[: len(package.split(".")) - (level - 1)]
            module = ".".join([*head, module[level:]] if module[level:] else head)
        listed = re.sub(r"#[^\n]*|[()\\]", " ", names.decode()).split(",")
        out.append((module, tuple(n.split()[0] for n in listed if n.split())))
    return out


def imports_numba(text: bytes) -> bool:
    """Whether a module imports numba at its top level (a kernel module)."""
    return _NUMBA.search(b"\n" + text) is not None


def kernel_sources(root: Path) -> list[Path]:
    """The kernel modules and every project module they import (see the docstring)."""
    mods = modules(root)
    texts = {name: path.read_bytes() for name, path in mods.items()}
    todo = [name for name, text in texts.items() if imports_numba(text)]
    followed: set[str] = set()
    hashed: set[str] = set()

    def parents(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts))]

    while todo:
        name = todo.pop()
        if name in followed or name not in mods:
            continue
        followed.add(name)
        hashed.update([name, *parents(name)])
        for module, names in imports(name, mods[name], texts[name]):
            if names is None:
                todo += [module, *parents(module)]
                continue
            subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in mods]
            todo += subs
            if len(subs) < len(names):
                todo.append(module)
            hashed.update([module, *parents(module)])
    return sorted(mods[name] for name in hashed if name in mods)


def source_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in kernel_sources(root):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_key(root: Path) -> str:
    """The cache directory's name for the checkout at `root`: its path and its sources."""
    return hashlib.sha256(f"{root.resolve()}\0{source_digest(root)}".encode()).hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "aifabric"


def configure() -> None:
    if "NUMBA_CACHE_DIR" in os.environ:
        return
    root = Path(__file__).resolve().parent.parent
    target = cache_root() / f"numba-{cache_key(root)}"
    try:
        target.mkdir(parents=True, exist_ok=True)
        os.utime(target)
    except OSError:
        return  # an unwritable home: numba falls back to its own places
    os.environ["NUMBA_CACHE_DIR"] = str(target)
    cutoff = time.time() - KEEP_OLD_DAYS * 86400
    for old in target.parent.glob("numba-*"):
        if old != target and old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)


def lean_loads() -> None:
    """Load cached kernels without numba's registries (call once numba is imported).

    Before numba loads a kernel's machine code from its cache, it refreshes its
    compiler's contexts: it imports and installs every typing and lowering table
    it has (about 0.1 s of CPU, a fifth of a small run's). Running cached code
    needs none of them, only the symbols its machine code names: numba's C
    helpers and exception classes (installed when its contexts are made), its
    runtime's functions (installed here) and the hash secrets of string hashing
    (installed when numba.cpython.hashing is imported, as here). Compiling still
    refreshes the contexts first (numba's compiler does), so a kernel that is not
    in the cache compiles as before. Nothing changes if numba's internals are not
    where this expects them.
    """
    try:
        import numba.cpython.hashing  # noqa: F401  (its symbols)
        from numba.core import caching
        from numba.core.runtime import rtsys
    except ImportError:
        return
    cache = getattr(caching, "Cache", None)
    if cache is None or getattr(cache.load_overload, "lean", False):
        return
    if not all(hasattr(cache, a) for a in ("_load_overload", "_guard_against_spurious_io_errors")):
        return

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
        return None  # the guard swallowed an error: compile instead

    load_overload.lean = True
    cache.load_overload = load_overload
    _link_modules_on_demand()
    _runtime_from_the_cache()
    _on_first_compile()


def _link_modules_on_demand() -> None:
    """Parse a cached kernel's LLVM bitcode only when something links it.

    numba caches a kernel as its machine code (an object file) and the bitcode of its
    module, which it parses at once on loading (about 0.03 s of CPU for the event loop's
    0.9 MB), for two uses: the names the module defines, which its engine keeps to find
    the kernel's entry points, and linking the kernel into code compiled later that
    calls it. A run from the cache compiles nothing: here the names come from the
    object file's symbol table (the same names but private ones, which nothing outside
    the module can name; the project's 159 cached libraries have none), and the bitcode
    is parsed when a compile first asks for the module. Nothing changes where numba's
    internals are not where this expects them, or for an object file that is not 64-bit
    little-endian ELF.
    """
    try:
        from llvmlite import binding as ll
        from numba.core import codegen
    except ImportError:
        return
    library = getattr(codegen, "CPUCodeLibrary", None)
    unserialize = getattr(library, "__dict__", {}).get("_unserialize")
    if not isinstance(unserialize, classmethod) or getattr(unserialize.__func__, "lazy", False):
        return
    needed = ("_get_module_for_linking", "enable_object_caching", "_set_compiled_object")
    if not all(hasattr(library, a) for a in (*needed, "_finalize_final_module")):
        return
    eager, link = unserialize.__func__, library._get_module_for_linking

    def _unserialize(cls, codegen_, state):
        name, kind, data = state
        engine = getattr(codegen_, "_engine", None)
        symbols = elf_defined_symbols(data[0]) if kind == "object" else None
        if symbols is None or not isinstance(getattr(engine, "_defined_symbols", None), set):
            return eager(cls, codegen_, state)
        object_code, bitcode = data
        self = codegen_.create_library(name)
        self.enable_object_caching()
        self._set_compiled_object(object_code)
        self._aifabric_bitcode = bitcode
        self._finalize_final_module()
        engine._defined_symbols |= symbols
        return self

    def _get_module_for_linking(self):
        bitcode = self.__dict__.pop("_aifabric_bitcode", None)
        if bitcode is not None:
            self._shared_module = ll.parse_bitcode(bitcode)
        return link(self)

    _unserialize.lazy = True
    library._unserialize = classmethod(_unserialize)
    library._get_module_for_linking = _get_module_for_linking


def _runtime_from_the_cache() -> None:
    """Load the machine code of numba's runtime functions from the kernel cache.

    Before the first kernel runs, numba compiles its runtime's functions (reference counts
    and the like: an LLVM module it builds, optimizes and compiles, about 0.015 s of CPU)
    in every process. The first time, here, they are compiled as numba does but keeping
    their object code, which is written to the kernel cache directory, keyed on numba's and
    llvmlite's versions and the CPU; later processes load it as a cached kernel's. Nothing
    changes where numba's internals are not where this expects them, or without a cache
    directory.
    """
    try:
        from numba.core.runtime import nrtdynmod
    except ImportError:
        return
    compile_functions = getattr(nrtdynmod, "compile_nrt_functions", None)
    if getattr(compile_functions, "cached", False) or not hasattr(nrtdynmod, "create_nrt_module"):
        return

    def compile_nrt_functions(ctx):
        codegen = ctx.codegen()
        path = _runtime_path(codegen)
        if path is None:
            return compile_functions(ctx)
        try:
            return codegen.unserialize_library(pickle.loads(path.read_bytes()))
        except Exception:  # noqa: BLE001  (none yet, or not loadable: compile it)
            pass
        module, library = nrtdynmod.create_nrt_module(ctx)
        library.enable_object_caching()
        library.add_ir_module(module)
        library.finalize()
        with contextlib.suppress(Exception):
            data = pickle.dumps(library.serialize_using_object_code())
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return library

    compile_nrt_functions.cached = True
    nrtdynmod.compile_nrt_functions = compile_nrt_functions


def _runtime_path(codegen) -> Path | None:
    """Where the runtime's object code is kept, or None (no cache directory)."""
    import llvmlite
    import numba

    where = os.environ.get("NUMBA_CACHE_DIR")
    if not where or not os.path.isdir(where):
        return None
    key = repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple()))
    return Path(where) / f"aifabric-runtime-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pkl"


def elf_defined_symbols(data) -> set[str] | None:
    """The names of the symbols an ELF object file defines (functions and data, of any
    binding; not sections or files), or None if `data` is not a 64-bit little-endian ELF
    object."""
    data = bytes(data)
    if len(data) < 64 or data[:6] != b"\x7fELF\x02\x01":
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
        ]
        names = set()
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != 2 or not entsize:  # SHT_SYMTAB
                continue
            strings = sections[link][4]
            for name, info, _, shndx, _, _ in struct.iter_unpack(
                "<IBBHQQ", data[offset : offset + size]
            ):
                if name and shndx and info & 0xF not in (3, 4):  # defined; not STT_SECTION/FILE
                    start = strings + name
                    names.add(data[start : data.index(b"\0", start)].decode())
        return names
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        return None


_LISTENING: list = []  # the listener, once registered


def _on_first_compile() -> None:
    """Apply `_copy_inlinees_once` when numba first starts compiling in this process (never
    in a run whose kernels all come from the cache: it imports nothing for it)."""
    if _LISTENING:
        return
    from numba.core import event

    class Listener(event.Listener):
        done = False

        def on_start(self, ev):
            if not self.done:
                self.done = True
                _copy_inlinees_once()

        def on_end(self, ev):
            pass

    _LISTENING.append(Listener())
    event.register("numba:compile", _LISTENING[0])


def _copy_inlinees_once() -> None:
    """Copy an inlined function's IR in time linear in its size.

    numba inlines a function marked `inline="always"` by deep-copying its IR block by
    block (twice per call site), each block with a memo of its own. A block's variables
    point to their scope, and the scope to every variable of the function, so each block
    copies the whole function again: time grows with blocks x variables. The simulator's
    kernels inline large functions into larger ones (its event loop holds about 10,000
    statements), and that copying was 45 of the 156 s the first compile took here. With
    one memo per copy of a function, its scope is copied once and shared by its blocks,
    as in the IR copied. Nothing else changes: the machine code, and so every result, is
    the same (benchmarks/sim_fingerprint.py compares). Applied only where numba's source
    has the two lines this changes, as numba 0.68's does; otherwise numba is left as it
    is.
    """
    import inspect
    import textwrap

    try:
        from numba.core import inline_closurecall as icc

        method = icc.InlineWorker.inline_ir
        if getattr(method, "one_memo", False):
            return
        src = textwrap.dedent(inspect.getsource(method))
    except (ImportError, AttributeError, OSError, TypeError):
        return
    fresh, copied = "kernel_copy.blocks = {}", "copy.deepcopy(the_ir.blocks[block_label])"
    if src.count(fresh) != 1 or src.count(copied) != 1 or "memo" in src:
        return
    src = src.replace(fresh, fresh + "; memo = {}").replace(copied, copied[:-1] + ", memo)")
    made: dict = {}
    try:
        exec(compile(src, icc.__file__, "exec"), vars(icc), made)  # noqa: S102
    except SyntaxError:
        return
    made["inline_ir"].one_memo = True
    icc.InlineWorker.inline_ir = made["inline_ir"]


configure()
