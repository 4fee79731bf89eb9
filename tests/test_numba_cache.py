import os
import subprocess
import sys

from fabric import _numba_cache


def _tree(root, body):
    for package in _numba_cache.PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
    (root / "fabric" / "layout.py").write_text(body)


def test_the_cache_directory_follows_the_content_of_the_sources(tmp_path):
    _tree(tmp_path, "PK_N = 11\n")
    first = _numba_cache.source_digest(tmp_path)
    os.utime(tmp_path / "fabric" / "layout.py", (0, 0))
    assert _numba_cache.source_digest(tmp_path) == first  # timestamps do not matter
    _tree(tmp_path, "PK_N = 16\n")
    assert _numba_cache.source_digest(tmp_path) != first  # a changed constant does


def test_kernels_compile_into_the_keyed_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    code = "import os, fabric, numba; print(os.environ['NUMBA_CACHE_DIR'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out.startswith(str(tmp_path / "aifabric" / "numba-"))
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == str(tmp_path / "mine")
