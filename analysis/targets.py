"""What `analyze`, `report`, `compare` and `pcap show` are given: a run directory or a capture.

Each command calls one function here and prints what it returns. A target
that is neither is one sentence (`AifabricError`), never a wait: a FIFO with
no writer, a device or a socket is named as such. A pipe that something
writes to (`analyze <(cat x.pcap)`) is read to its end into a temporary file
first, since the capture reader needs a file it can map and sniff again; when
its writer has not closed it after a few seconds, stderr says so.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aifabric.fabric.errors import AifabricError

PIPE_CHUNK = 1 << 20
PIPE_NOTICE_S = 2.0  # a pipe still open after this long: say what the command waits for


@dataclass
class Target:
    kind: str  # "run" or "capture"
    path: Path  # what to read (a temporary copy of a pipe's bytes)
    name: str  # what the user typed
    pipe: bool = False  # path is a copy of a pipe's bytes
    warnings: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The capture's name in an analysis: its file name, or the pipe's whole path (a
        pipe's own name, such as the 63 of /dev/fd/63, says nothing)."""
        return self.name if self.pipe else Path(self.name).name or self.name


def _kind_of(mode: int) -> str | None:
    for test, what in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return None


def _drain_pipe(path: Path, into: Path) -> None:
    """Copy a FIFO's bytes to `into`; refuse at once when nothing writes to it, and say on
    stderr what is awaited when the writer has not closed it after `PIPE_NOTICE_S`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise AifabricError(f"{path} is a FIFO that cannot be opened: {e.strerror}") from None
    with open(into, "wb") as out, os.fdopen(fd, "rb", buffering=0) as pipe:
        try:
            first = pipe.read(PIPE_CHUNK)
        except BlockingIOError:
            first = None  # a writer holds it open, nothing written yet
        if first == b"":
            raise AifabricError(
                f"{path} is a FIFO (named pipe) with nothing writing to it; give a capture "
                "file or a run directory, or start the writer first"
            )
        os.set_blocking(fd, True)
        if first:
            out.write(first)
        deadline = time.monotonic() + PIPE_NOTICE_S
        while True:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not select.select([fd], [], [], wait)[0]:
                print(
                    f"aifabric: reading {path} until its writer closes it "
                    f"({out.tell():,} bytes so far; Ctrl-C stops)",
                    file=sys.stderr,
                    flush=True,
                )
                deadline = None
                continue
            chunk = pipe.read(PIPE_CHUNK)
            if not chunk:
                return
            out.write(chunk)


@contextmanager
def opened(target: str) -> Iterator[Target]:
    """The run directory or capture file `target` names (see the module docstring)."""
    from aifabric.analysis.capture import sniff

    path = Path(target)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise AifabricError(f"{target} does not exist") from None
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            raise AifabricError(f"{target} does not exist") from None
        raise AifabricError(f"{target} cannot be read: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        yield Target("run", path, target)
        return
    what = _kind_of(mode)
    if what:
        raise AifabricError(f"{target} is {what}, not a capture file or a run directory")
    if stat.S_ISFIFO(mode):
        with tempfile.TemporaryDirectory(prefix="aifabric-pipe-") as tmp:
            copy = Path(tmp) / (path.name or "pipe")
            _drain_pipe(path, copy)
            if copy.stat().st_size == 0:
                raise AifabricError(f"{target} is a pipe that ended without a byte")
            if sniff(copy) is None:
                raise AifabricError(f"{target} is a pipe whose bytes are not a pcap or pcapng")
            yield Target("capture", copy, target, pipe=True)
        return
    if sniff(path) is None:
        raise AifabricError(f"{target} is neither a run directory nor a pcap or pcapng capture")
    yield Target("capture", path, target)


def _run_warning(run) -> list[str]:
    if run.status == "complete":
        return []
    why = f" ({run.meta['message']})" if run.meta.get("message") else ""
    return [f"run {run.path.name} is {run.status}{why}; the analysis covers what it wrote."]


def _capture_warning(m) -> list[str]:
    return [f"{m.problem}; the analysis covers what was read."] if m.problem else []


def analyze(target: str, *, rate_bps=None, top: int = 10, series: bool = False):
    """(metrics, warnings) of a run directory or a capture: a `RunMetrics` or a
    `CaptureMetrics` (`aifabric.analysis.metrics`)."""
    from dataclasses import replace

    from aifabric.analysis.metrics import DEFAULT_RATE_BPS, capture_metrics, run_metrics

    with opened(target) as t:
        if t.kind == "run":
            from aifabric.fabric.rundir import Run

            run = Run(t.path)
            m = run_metrics(run, top=top, series=series, rate_bps=rate_bps)
            warnings = _run_warning(run)
            for c in m.captures:
                warnings += _capture_warning(c)
            return m, warnings
        from aifabric.analysis.capture import read_capture

        m = capture_metrics(
            read_capture(t.path), rate_bps=rate_bps or DEFAULT_RATE_BPS, top=top, series=series
        )
        m = replace(m, file=t.label)
        return m, _capture_warning(m)


def nccl_tests(target: str) -> tuple[str, list[str]]:
    """(nccl-tests' rows of a run directory's collective ops, warnings): a block per job
    (`aifabric.analysis.nccltests`). A capture has no ops: one sentence."""
    from aifabric.analysis import nccltests
    from aifabric.analysis.metrics import run_metrics

    with opened(target) as t:
        if t.kind != "run":
            raise AifabricError(
                f"{t.label} is a capture: it has no collective ops to print as nccl-tests rows"
            )
        from aifabric.fabric.rundir import Run

        run = Run(t.path)
        m = run_metrics(run, top=1)
        ops = nccltests.ops_of_run(m.collectives.ops, run.meta["scenario"].get("workload", {}))
        if not ops:
            raise AifabricError(f"run {t.label} has no collective ops")
        lead = [f"aifabric analyze {t.label}: {m.engine} run of {m.fabric}, fabric time"]
        return nccltests.render_blocks(nccltests.blocks(ops), lead), _run_warning(run)


def report(target: str) -> tuple[str, list[str]]:
    """(the HTML report, warnings) of a run directory or a capture (`aifabric.analysis.report`)."""
    from aifabric.analysis.report import build_capture_report, build_report

    with opened(target) as t:
        if t.kind == "run":
            from aifabric.fabric.rundir import Run

            run = Run(t.path)
            return build_report(run), _run_warning(run)
        html, m = build_capture_report(t.path, name=t.label)
        return html, _capture_warning(m)


def compare(targets, *, rate_bps=None) -> tuple[list, list[str]]:
    """(one `metrics.summary` per target, warnings)."""
    from aifabric.analysis.metrics import summary

    rows, warnings = [], []
    for target in targets:
        m, w = analyze(target, rate_bps=rate_bps)
        rows.append(summary(m))
        warnings += w
    return rows, warnings


def packets(target: str, index: int, count: int) -> tuple[list[dict], str, list[str]]:
    """(packets index .. index + count - 1 dissected, their text, warnings) of a capture."""
    from aifabric.analysis.capture import read_capture
    from aifabric.analysis.dissect import packets as dissected
    from aifabric.analysis.dissect import text

    with opened(target) as t:
        if t.kind != "capture":
            raise AifabricError(f"{target} is a directory; pcap show reads one capture file")
        cap = read_capture(t.path)
        warnings = [f"{cap.problem}."] if cap.problem else []
        if len(cap) and index >= len(cap):
            raise AifabricError(f"{target} has {len(cap):,} packets; --index must be below that")
        rows = dissected(cap, index, count)
        return rows, text(rows) if rows else f"{target} holds no packets", warnings
