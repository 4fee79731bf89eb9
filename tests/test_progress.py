"""Progress on stderr: a rich bar on a terminal, one plain line per update otherwise, for a
run (its flows) and for a sweep (its points)."""

from __future__ import annotations

import io
import sys
import time
from types import SimpleNamespace

from aifabric.cli_run import _ProgressPrinter
from aifabric.experiments.runner import Progress, stderr_progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(monkeypatch, stream):
    """`stream` as sys.stderr (in the test's body: pytest sets its own between phases)."""
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def sim_progress(done: int, now_ns: int = 2_500):
    return SimpleNamespace(now_ns=now_ns, flows_done=done, flows=8, events=12_345)


def test_a_runs_progress_on_a_terminal_is_a_bar_of_its_flows(monkeypatch):
    terminal = screen(monkeypatch, Terminal())
    printer = _ProgressPrinter()
    printer(sim_progress(3))
    printer(sim_progress(8, now_ns=9_000), final=True)
    shown = terminal.getvalue()
    assert "flows" in shown and "8/8" in shown and "12,345" in shown
    assert "━" in shown  # the bar itself
    assert printer.bar is None  # stopped: the terminal is given back


def test_a_runs_progress_in_a_log_is_one_line_per_update(monkeypatch):
    log = screen(monkeypatch, io.StringIO())
    printer = _ProgressPrinter()
    printer(sim_progress(3))
    printer(sim_progress(5))  # within 0.2 s of the last: not drawn
    printer(sim_progress(8), final=True)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in log.getvalue()
    assert lines[0].endswith("flows 3/8") and lines[1].endswith("flows 8/8")


def test_a_sweeps_progress_on_a_terminal_is_a_bar_of_its_points(monkeypatch):
    terminal = screen(monkeypatch, Terminal())
    show = stderr_progress()
    show("qp: 4 points, 1 already done, 3 to run", keep=True)
    started = time.monotonic()
    show(Progress(total=4, reused=1, done=1, failed=1, started=started))
    show(Progress(total=4, reused=1, done=3, failed=1, started=started))
    show.close()
    shown = terminal.getvalue()
    assert "qp: 4 points, 1 already done, 3 to run" in shown
    assert "4/4" in shown and "1 failed" in shown and "━" in shown


def test_a_sweeps_progress_in_a_log_is_one_line_per_point(monkeypatch):
    log = screen(monkeypatch, io.StringIO())
    show = stderr_progress()
    show("qp: 2 points, 0 already done, 2 to run", keep=True)
    show(Progress(total=2, reused=0, done=1, started=time.monotonic()))
    lines = log.getvalue().splitlines()
    assert lines[0] == "qp: 2 points, 0 already done, 2 to run"
    assert lines[1].startswith("  1/2 points done  0 failed")
