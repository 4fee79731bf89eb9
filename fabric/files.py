"""Writing files so that a reader never sees half of one.

Each writer writes a temporary file beside the target and renames it into
place; the file gets the permissions an ordinary `open()` would give it
(0666 less the umask), not mkstemp's private 0600.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_atomic(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename the temporary file onto `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write text or bytes to `path` atomically."""
    mode = "wb" if isinstance(data, bytes) else "w"

    def write(tmp: str) -> None:
        with open(tmp, mode) as fh:
            fh.write(data)

    replace_atomic(path, write)
