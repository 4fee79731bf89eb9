"""Errors a user can cause: each carries one sentence that says what to fix."""

from __future__ import annotations

import reprlib


class AifabricError(Exception):
    """Bad input or an impossible request; the CLI prints the message and exits 1."""


class SpecError(AifabricError, ValueError):
    """A topology, workload or scenario spec that cannot be built."""


class UnitError(AifabricError, ValueError):
    """A quantity ("400G", "2us", "32MiB") that does not parse."""


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 2, 4, 4
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 40


def shown(value) -> str:
    """`value` as an error message quotes it: its repr, cut short (a long string, a deep list)."""
    return _SHORT.repr(value)


def cut(text: str, limit: int = 40) -> str:
    """A name as an error message quotes it: as it is, cut short in the middle if long."""
    text = str(text)
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"
