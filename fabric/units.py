"""The one place that parses and prints quantities.

Rates are integer bit/s, times integer nanoseconds, sizes integer bytes.
Rate and size prefixes are decimal (K = 10**3) except the binary size
prefixes (KiB = 2**10), as network gear and RoCE documents use them.
Every quantity is finite and fits the signed 64-bit integers the flow
tables and the simulator store it in (`LIMIT`): a time below about 292
years, a size below 8 EiB, a rate below 9.2 Ebit/s.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from aifabric.fabric.errors import UnitError, shown

LIMIT = 2**63 - 1  # the largest quantity in any unit: int64
_MAX_DIGITS = 30  # a number with more digits before the point is far beyond LIMIT in any unit
_LIMIT_SHOWN = {"rate": "9.2 Ebit/s", "time": "about 292 years", "size": "8 EiB"}

_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")

_RATE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
}
_TIME_UNITS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,
    "ms": 10**6,
    "s": 10**9,
}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}


def _split(text: str | int | float, what: str, example: str) -> tuple[Decimal, str]:
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise UnitError(f"{shown(text)} is not a {what} (e.g. {example!r})")
    if isinstance(text, int | float):
        value, unit = Decimal(str(text)), ""
    else:
        m = _QUANTITY.match(text)
        if not m:
            raise UnitError(f"{shown(text)} is not a {what} (e.g. {example!r})")
        try:
            value, unit = Decimal(m.group(1)), m.group(2)
        except InvalidOperation:  # pragma: no cover - the regex admits only numbers
            raise UnitError(f"{shown(text)} is not a {what} (e.g. {example!r})") from None
    if not value.is_finite():
        raise UnitError(f"{shown(text)} is not a finite {what} (e.g. {example!r})")
    if value and value.adjusted() >= _MAX_DIGITS:
        raise _too_large(text, what)
    if value and value.adjusted() <= -_MAX_DIGITS:
        raise UnitError(f"{shown(text)} is too small for a {what}: no unit divides that finely")
    return value, unit


def _too_large(text, what: str) -> UnitError:
    return UnitError(f"{shown(text)} is too large for a {what}: the limit is {_LIMIT_SHOWN[what]}")


def _whole(value: Decimal, text, what: str, unit: str) -> int:
    if value != value.to_integral_value():
        raise UnitError(f"{shown(text)} is not a whole number of {unit}")
    if abs(value) > LIMIT:
        raise _too_large(text, what)
    return int(value)


def parse_rate(text: str | int) -> int:
    """'400G', '400Gbps', '400 Gb/s', '1.6T', or a plain number of bit/s (at least
    `BARE_RATE_MIN`: `rate = 800` is a unit forgotten) -> bit/s."""
    value, unit = _split(text, "rate", "400G")
    key = unit.lower()
    for suffix in ("bps", "b/s", "bit/s"):
        if key.endswith(suffix) and key != suffix[1:]:
            key = key[: -len(suffix)]
            break
    if key not in _RATE_UNITS:
        raise UnitError(f"{shown(text)} is not a rate: use bit/s with K, M, G or T (e.g. '400G')")
    bps = _whole(value * _RATE_UNITS[key], text, "rate", "bit/s")
    if bps <= 0:
        raise UnitError(f"rate {shown(text)} must be positive")
    if not unit and bps < BARE_RATE_MIN:
        raise UnitError(
            f"rate {shown(text)} has no unit, and {bps} bit/s is slower than any link: write "
            f"'{bps}G' for Gbit/s, or '{bps}bps' if you mean bit/s"
        )
    return bps


BARE_RATE_MIN = 10**6  # a number with no unit below this is a unit forgotten, not bit/s


def parse_time(text: str | int) -> int:
    """'2us', '1.5ms', '100ns', '1s', or a plain number of nanoseconds -> ns."""
    value, unit = _split(text, "time", "2us")
    key = unit.lower() if unit else "ns"
    if key not in _TIME_UNITS:
        raise UnitError(f"{shown(text)} is not a time: use ns, us, ms or s (e.g. '2us')")
    ns = _whole(value * _TIME_UNITS[key], text, "time", "nanoseconds")
    if ns < 0:
        raise UnitError(f"time {shown(text)} must not be negative")
    return ns


def parse_size(text: str | int) -> int:
    """'32MiB', '4KiB', '1MB', '4096' -> bytes."""
    value, unit = _split(text, "size", "32MiB")
    key = unit.lower()
    if key not in _SIZE_UNITS:
        raise UnitError(
            f"{shown(text)} is not a size: use B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB or PiB "
            "(e.g. '32MiB')"
        )
    size = _whole(value * _SIZE_UNITS[key], text, "size", "bytes")
    if size < 0:
        raise UnitError(f"size {shown(text)} must not be negative")
    return size


def _format(value: int, steps: list[tuple[int, str]], unit0: str) -> str:
    for scale, suffix in steps:
        if abs(value) >= scale:
            q = value / scale
            text = f"{q:.2f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    return f"{value}{unit0}"


def format_rate(bps: int) -> str:
    """400_000_000_000 -> '400G', 800 -> '800' (a prefix or none: callers add "bps")."""
    return _format(int(bps), [(10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "K")], "")


def format_time(ns: int | float) -> str:
    """1500 -> '1.5us'."""
    return _format(ns, [(10**9, "s"), (10**6, "ms"), (10**3, "us")], "ns")


def format_size(nbytes: int) -> str:
    """33554432 -> '32MiB'; sizes that are not a binary multiple under 1024 of a binary
    unit print in decimal units (2,048,000,000 is '2.05GB', not '2000000KiB')."""
    nbytes = int(nbytes)
    for scale, suffix in (
        (2**50, "PiB"),
        (2**40, "TiB"),
        (2**30, "GiB"),
        (2**20, "MiB"),
        (2**10, "KiB"),
    ):
        if nbytes >= scale and nbytes % scale == 0 and (nbytes < 1024 * scale or scale == 2**50):
            return f"{nbytes // scale}{suffix}"
    return _format(nbytes, [(10**12, "TB"), (10**9, "GB"), (10**6, "MB"), (10**3, "KB")], "B")
