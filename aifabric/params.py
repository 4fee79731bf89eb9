"""click parameter types for the quantities commands take: sizes, rates, times, GPU counts.

Each parses with `aifabric.fabric.units` (one spelling of units for files and the command
line) and turns a bad value into click's usage error naming the option, e.g.
`--size 3 parsecs: '3 parsecs' is not a size ...`. Use them as
`click.option("--size", type=SIZE)`; the value the command receives is an int in
the unit the name says (bytes, bit/s, ns).

`choice(names)` is a click.Choice over one of the library's own tables (routing
policies, collective kinds, congestion-control kinds), so a new entry there is
a new choice here without editing the command. `names` may be a function that
returns the table: it is called when a command line is parsed or help shown, so
a command module need not import the library (and numba) to declare options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import click

from aifabric.fabric.errors import UnitError
from aifabric.fabric.units import parse_rate, parse_size, parse_time


class Quantity(click.ParamType):
    """A number with a unit, parsed by `aifabric.fabric.units` to an int."""

    def __init__(self, name: str, parse: Callable[[str], int]):
        self.name = name
        self._parse = parse

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return self._parse(value)
        except UnitError as e:
            self.fail(str(e), param, ctx)


SIZE = Quantity("size", parse_size)  # -> bytes
RATE = Quantity("rate", parse_rate)  # -> bit/s
TIME = Quantity("time", parse_time)  # -> ns


class GpuCount(click.ParamType):
    """A positive number of GPUs, or "all" (returned as the text "all")."""

    name = "gpus"

    def convert(self, value, param, ctx):
        if value == "all" or (isinstance(value, int) and value > 0):
            return value
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
        self.fail(f'{value!r} is not a positive number of GPUs or "all"', param, ctx)


GPUS = GpuCount()


class TableChoice(click.Choice):
    """A click.Choice whose names are read from a library table each time they are asked
    for (not kept: an entry added to the table later, an engine registered, is a choice)."""

    def __init__(self, names: Callable[[], Iterable[str]]):
        self._names = names
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self._names())


def choice(names: Iterable[str] | Callable[[], Iterable[str]]) -> click.Choice:
    """A choice among the names of one of the library's tables (or a function returning them)."""
    if callable(names):
        return TableChoice(names)
    return click.Choice(list(names))


class Fraction(click.FloatRange):
    """A number in (0, 1]: what click's FloatRange checks, and NaN refused (every comparison
    with NaN is false, so a range check alone lets it through)."""

    def __init__(self):
        super().__init__(0, 1, min_open=True)

    def convert(self, value, param, ctx):
        import math

        out = super().convert(value, param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a number in (0, 1]", param, ctx)
        return out
