"""Writing files so that a reader never sees half of one.

Each writer writes a temporary file beside the target and renames it into
place; the file gets the permissions an ordinary `open()` would give it
(0666 less the umask), not mkstemp's private 0600. A place that cannot be
written (a missing folder, a file where a folder should be, /proc, a full
disk: "disk full") is one sentence (AifabricError).

A temporary lives only while its writer runs: it is removed when the write
fails or is interrupted, and `remove_temporaries` removes those still being
written when the process must end at once (`os._exit` after a second signal,
`aifabric.engines.Stop`) or exits; `is_temporary` tells them from results. The
same holds for a scratch folder (`temporary_directory`) and for the helper
processes a step starts (`ended_with_us`): a process ending at once removes the
one and ends the others. A process killed outright (SIGKILL) removes nothing: the
next writer of the same files, once it holds their lock, removes what it left
(`remove_left_temporaries`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from aifabric.fabric.errors import AifabricError

DISK_FULL = "disk full"
_LIVE: set[str] = set()  # temporaries being written, by this process
_LIVE_DIRS: set[str] = set()  # scratch folders in use (`temporary_directory`)
_CHILDREN: set = set()  # helper processes (subprocess.Popen) to end with this one


def is_temporary(name: str) -> bool:
    """Whether a file name is one of `replace_atomic`'s temporaries."""
    return name.startswith(".") and name.endswith(".tmp")


def remove_left_temporaries(folder: Path, names) -> list[Path]:
    """Remove the temporaries of the files `names` in `folder` that a writer killed outright
    left there (SIGKILL leaves it no time to); returns them. Only for files whose every
    writer is known to be gone: a sweep's tables, once the sweep holds its folder's lock."""
    left = [p for name in names for p in Path(folder).glob(f".{name}.*.tmp")]
    for p in left:
        with contextlib.suppress(OSError):
            p.unlink()
    return left


def remove_temporaries() -> None:
    """Remove the temporaries still being written and the scratch folders in use, and end
    the helper processes still running (the process is about to end)."""
    for tmp in list(_LIVE):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _LIVE.discard(tmp)
    for child in list(_CHILDREN):
        with contextlib.suppress(OSError):
            child.kill()
        _CHILDREN.discard(child)
    for folder in list(_LIVE_DIRS):
        shutil.rmtree(folder, ignore_errors=True)
        _LIVE_DIRS.discard(folder)


@contextlib.contextmanager
def temporary_directory(prefix: str):
    """A scratch folder (its path) removed when the block ends, or when the process must
    end at once (`remove_temporaries`)."""
    path = tempfile.mkdtemp(prefix=prefix)
    _LIVE_DIRS.add(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _LIVE_DIRS.discard(path)


def ended_with_us(child):
    """Register a helper process (subprocess.Popen) that a process ending at once ends too
    (`remove_temporaries`); `forget(child)` once it is done. Returns it."""
    _CHILDREN.add(child)
    return child


def forget(child) -> None:
    _CHILDREN.discard(child)


atexit.register(remove_temporaries)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_atomic(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)`, then rename the temporary file onto `path`."""
    path = Path(path)
    tmp = None
    try:
        with _signals_held():  # a signal between the two finds the temporary in _LIVE
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            _LIVE.add(tmp)
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        _LIVE.discard(tmp)
    except OSError as e:
        _discard(tmp)
        raise AifabricError(f"cannot write {path}: {why_not_written(path, e)}") from None
    except BaseException:
        _discard(tmp)
        raise


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait (in the main thread) until the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _discard(tmp: str | None) -> None:
    """Remove a temporary; a signal arriving meanwhile finds it in `_LIVE` still."""
    if tmp is None:
        return
    with contextlib.suppress(OSError):
        os.unlink(tmp)
    _LIVE.discard(tmp)


def why_not_written(path: Path, e: OSError) -> str:
    """What is wrong with writing `path` (the error `e` said), in a few words."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DISK_FULL
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
