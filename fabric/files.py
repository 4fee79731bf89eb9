"""Writing files so that a reader never sees half of one.

Each writer writes a temporary file beside the target and renames it into
place; the file gets the permissions an ordinary `open()` would give it
(0666 less the umask), not mkstemp's private 0600. A place that cannot be
written (a missing folder, a file where a folder should be, /proc) is one
sentence (AifabricError).
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from aifabric.fabric.errors import AifabricError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_atomic(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename the temporary file onto `path`."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise AifabricError(f"cannot write {path}: {why_not_written(path, e)}") from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise AifabricError(f"cannot write {path}: {why_not_written(path, e)}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def why_not_written(path: Path, e: OSError) -> str:
    """What is wrong with writing `path` (the error `e` said), in a few words."""
    up = path.parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        return f"{up} is not a directory"
    if up != path.parent:
        return f"the directory {path.parent} does not exist"
    if path.is_dir():
        return "it is a directory"
    if e.errno == errno.ENOENT:  # the folder exists but makes no files (/proc, /sys)
        return f"{up} does not take new files"
    return e.strerror or str(e)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write text or bytes to `path` atomically."""
    mode = "wb" if isinstance(data, bytes) else "w"

    def write(tmp: str) -> None:
        with open(tmp, mode) as fh:
            fh.write(data)

    replace_atomic(path, write)
