"""Where numba keeps compiled kernels: a directory named by a hash of the sources.

numba's own cache checks only the timestamp of the file a kernel lives in.
Kernels read constants from other modules (the simulator's column layout,
for one) and freeze them at compile time, so after an update that changes
such a module, a cache beside the sources would serve kernels compiled for
the old layout: wrong results, or memory overruns. Keying the cache
directory on the content of every source file of the project rules that
out. An explicit NUMBA_CACHE_DIR is respected.

This must run before numba is imported; every package of the project
imports `fabric` first for that reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

PACKAGES = ("fabric", "traffic", "analysis", "topologies", "aifabric", "experiments")
KEEP_OLD_DAYS = 7


def source_digest(root: Path) -> str:
    h = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "aifabric"


def configure() -> None:
    if "NUMBA_CACHE_DIR" in os.environ:
        return
    root = Path(__file__).resolve().parent.parent
    target = cache_root() / f"numba-{source_digest(root)}"
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


configure()
