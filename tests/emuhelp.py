"""Helpers for the emulator's root tests: a run killed with SIGKILL, then `aifabric clean`."""

from __future__ import annotations

import subprocess
import sys


def killed_then_cleaned(code: str) -> tuple[list[str], dict]:
    """Run `code` until it prints a line, SIGKILL it and run `aifabric clean`.

    Returns the words of that line and what was left behind before the clean.
    """
    from click.testing import CliRunner

    from aifabric.cli import main
    from fabric.emu.clean import leftovers

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        words = proc.stdout.readline().split()
        left = leftovers()
    finally:
        proc.kill()
        proc.wait()
    result = CliRunner().invoke(main, ["clean"])
    assert result.exit_code == 0, result.output
    assert "removed" in result.output
    return words, left
