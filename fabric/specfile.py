"""Specs by name or by path: the presets a package ships, or a user's TOML file.

Topologies, workloads and scenarios are all found the same way: a source
that ends in `.toml`, contains a `/` or names an existing file is a file;
anything else is the name of a preset shipped in `package/folder/NAME.toml`.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from aifabric.fabric.errors import SpecError, UnitError, cut, shown
from aifabric.fabric.units import (
    LIMIT,
    format_rate,
    format_size,
    format_time,
    parse_rate,
    parse_size,
    parse_time,
)


@dataclass(frozen=True)
class Key:
    """One key of a spec table: how to parse it, its default (None: required), its bounds."""

    parse: Callable[[Any], Any]
    default: Any = None
    minimum: float | None = None
    doc: str = ""
    maximum: float | None = None


def load_toml(text: str, what: str) -> dict:
    """TOML text -> a table, or one SpecError naming `what` ("topology x") and the fault."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{what} is not valid TOML: {e}") from None
    except RecursionError:
        raise SpecError(
            f"{what} is not valid TOML here: it nests arrays or tables too deep"
        ) from None


def parse_keys(what: str, where: str, body: dict, keys: dict[str, Key]) -> dict[str, Any]:
    """Every key of `keys` from `body`, parsed, checked and defaulted.

    `what` names the spec ("topology lab-small"), `where` the key's place
    ("zone."); errors are one sentence naming the key and the value.
    Unknown keys are the caller's to report, with what the table takes.
    """
    out = {}
    for key, rule in keys.items():
        if key not in body:
            if rule.default is None:
                raise SpecError(f"{what}: {where}{key} is missing")
            out[key] = rule.default
            continue
        value = body[key]
        try:
            parsed = rule.parse(value)
        except UnitError as e:
            raise SpecError(f"{what}: {where}{key}: {e}") from None
        except ValueError as e:
            raise SpecError(f"{what}: {where}{key} = {shown(value)} {e}") from None
        said = f"{what}: {where}{key} = {shown(value)}"
        if rule.minimum is not None and parsed < rule.minimum:
            raise SpecError(f"{said} must be at least {_bound(rule, rule.minimum)}")
        if rule.maximum is not None and parsed > rule.maximum:
            raise SpecError(f"{said} must be at most {_bound(rule, rule.maximum)}")
        out[key] = parsed
    return out


def check_table(what: str, table: str, body: Any, keys) -> dict:
    """`body` if it is a table of known keys; else one sentence naming the table or key."""
    if not isinstance(body, dict):
        raise SpecError(f"{what}: [{table}] must be a table")
    for key in body:
        if key not in keys:
            raise SpecError(f"{what}: unknown key {table}.{key}; [{table}] takes {', '.join(keys)}")
    return body


def relative_to(value: str, folder: Path | None) -> str:
    """A file named in a spec, relative to the spec's folder; a preset name unchanged."""
    if folder is not None and (Path(value).suffix or "/" in value):
        path = Path(value)
        if not path.is_absolute():
            return str(folder / path)
    return value


_FORMATS = {parse_rate: format_rate, parse_size: format_size, parse_time: format_time}


def _bound(rule: Key, x: float) -> str:
    """A bound as the key is written: a quantity in its unit, a count with commas."""
    if rule.parse in _FORMATS:
        return _FORMATS[rule.parse](int(x))
    return f"{int(x):,}" if x == int(x) else f"{x:g}"


def as_int(value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be a whole number")
    if abs(value) > LIMIT:
        raise ValueError("is too large: whole numbers stay below 2**63")
    return value


def as_number(value):
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    if abs(value) > LIMIT:
        raise ValueError("is too large: numbers stay below 2**63")
    return float(value)


def as_str(value):
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def as_bool(value):
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


@dataclass(frozen=True)
class Presets:
    package: str  # the package that ships them, e.g. "aifabric.topologies"
    folder: str  # their folder inside it, e.g. "presets"
    what: str  # how errors name one, e.g. "topology"

    def names(self) -> list[str]:
        folder = resources.files(self.package) / self.folder
        return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))

    def read(self, source: str | Path) -> tuple[str, str, Path | None]:
        """(text, name, folder of the file or None for a preset), or one-sentence SpecError."""
        text_source = str(source)
        if text_source.endswith(".toml") or "/" in text_source or _is_file(text_source):
            path = Path(text_source)
            where = cut(text_source, 200)  # a path: whole, unless absurdly long
            if path.is_dir():
                raise SpecError(f"{where} is a directory, not a {self.what} file")
            if not path.exists():
                raise SpecError(f"{self.what} file {where} does not exist")
            if not _is_file(text_source):
                raise SpecError(f"{where} is not a regular file (a FIFO or a device?)")
            try:
                return path.read_text(), path.stem, path.parent
            except (OSError, UnicodeDecodeError) as e:
                raise SpecError(
                    f"{self.what} file {where} cannot be read: {e.__class__.__name__}"
                    if isinstance(e, UnicodeDecodeError)
                    else f"{self.what} file {where} cannot be read: {e.strerror}"
                ) from None
        return self.text(text_source), text_source, None

    def text(self, name: str) -> str:
        """The TOML text of the preset `name`."""
        path = resources.files(self.package) / self.folder / f"{name}.toml"
        if name not in self.names():
            raise SpecError(
                f"unknown {self.what} preset {shown(name)}; the presets are "
                f"{', '.join(self.names())}, or give a TOML file"
            )
        return path.read_text()


def _is_file(path: str) -> bool:
    """Whether `path` names a file; a name the system cannot even look up (too long) does not."""
    try:
        return Path(path).is_file()
    except OSError:
        return False
