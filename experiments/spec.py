"""Sweep specs: a base scenario, keys to vary, seeds, metrics; expanded into runs.

A spec is TOML (or the same from `aifabric sweep SCENARIO --vary ...` flags):

    [sweep]
    name = "qp-scaling"                 # default: the file's stem
    description = "..."
    scenario = "base.toml"              # a scenario preset or file (relative to this spec)
    seeds = [1, 2, 3]                   # or "1-5", or "1,3,7"
    metrics = ["busbw", "completion"]   # groups of columns (default: all, see METRIC_GROUPS)

    [set]                               # overrides every run gets
    "queue.ecn_kmin" = "50KiB"

    [grid]                              # every combination of these
    "ecmp.policy" = ["5tuple", "eecmp"]
    "workload.qps" = [1, 2, 4]

    [zip]                               # these vary together, position by position
    "workload.placement" = ["packed", "fragmented"]
    "workload.gpus" = [8, 12]

    [grid.faults]                       # values may be named: the name is what tables show
    none = []
    uplink-down = [{ link = "z0-r0-rtsw--z0-ctsw0", at = "0us" }]

    [report]                            # what `sweep report` leads with (all optional)
    metric = "busbw_gbps@allreduce"
    higher_is_better = true
    baseline = { "ecmp.policy" = "5tuple" }    # effects: each configuration against this
    headline = { "ecmp.policy" = "pinned" }     # the effects quoted first (default: the best)
    label = "fragmentation"                     # what the comparison is called
    mechanism = "ecmp_max_mean.rtsw>ctsw"       # the results column charted beside `metric`
                                                # (default: the uplinks' ECMP imbalance, else
                                                # the time paused by PFC)

    [[report.contrasts]]                        # more comparisons, each with the keys
    baseline = { "ecmp.policy" = "5tuple" }     # baseline, headline, label, published,
                                                # published_band
    finding = "..."                     # the hypothesis the sweep tests
    published = "..."                   # the published figure and its source, quoted
    published_band = [0, 0.40]          # the same as a relative change of `metric`: "up to
                                        # 40%"; an open end is inf or -inf ("more than
                                        # 30%": [0.30, inf]); the verdict measures against it

    [full]                              # `experiment run --full`: seeds, set, grid, zip
    seeds = "1-10"                      # replacing the ones above

Keys are dotted keys of the scenario's tables (aifabric.scenarios.overrides); quote them
in TOML or write them as nested tables, both read the same. Every run is
one combination of the grid, one position of the zip, and one seed.
"""

from __future__ import annotations

import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aifabric.fabric.errors import SpecError
from aifabric.fabric.specfile import check_table, relative_to
from aifabric.scenarios.overrides import check_key, parse_value

SECTIONS = ("sweep", "set", "grid", "zip", "report", "full")
SWEEP_KEYS = ("name", "description", "scenario", "seeds", "metrics", "engine")
REPORT_KEYS = (
    "metric", "higher_is_better", "baseline", "headline", "label", "finding", "published",
    "published_band", "contrasts", "mechanism",
)  # fmt: skip
CONTRAST_KEYS = ("baseline", "headline", "label", "published", "published_band")
FULL_KEYS = ("seeds", "set", "grid", "zip")
METRIC_GROUPS = (
    "busbw", "completion", "ecmp", "ecn", "pfc", "drops", "fct", "queue", "maintenance",
    "scheduling",
)  # fmt: skip
ENGINES = ("sim",)


@dataclass(frozen=True)
class Point:
    """One run of a sweep: a configuration (the varied keys' labels) and a seed."""

    index: int
    name: str  # its run directory under runs/
    labels: dict[str, Any]  # varied key -> the value (or its name) as tables show it
    overrides: tuple[tuple[str, Any], ...]  # fixed and varied keys, as the loader takes them
    seed: int


@dataclass(frozen=True)
class Sweep:
    name: str
    scenario: str  # preset name or absolute path
    seeds: tuple[int, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)  # key -> (label, value)
    zip: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    metrics: tuple[str, ...] = METRIC_GROUPS
    engine: str = "sim"
    description: str = ""
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return [*self.grid, *self.zip]

    def configurations(self) -> list[dict[str, tuple[str, Any]]]:
        """Each configuration: varied key -> (label, value)."""
        zip_rows = list(zip(*self.zip.values(), strict=True)) if self.zip else [()]
        grid_rows = itertools.product(*self.grid.values())
        out = []
        for g in grid_rows:
            for z in zip_rows:
                out.append(dict(zip(self.keys, (*g, *z), strict=True)))
        return out

    def points(self) -> list[Point]:
        out = []
        for config in self.configurations():
            labels = {k: label for k, (label, _) in config.items()}
            overrides = (*self.fixed.items(), *((k, v) for k, (_, v) in config.items()))
            for seed in self.seeds:
                out.append(
                    Point(len(out), point_name(labels, seed), labels, tuple(overrides), seed)
                )
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Sweep:
        """The sweep `to_dict` wrote (a sweep directory's sweep.json)."""

        def pairs(table: dict) -> dict[str, list[tuple[Any, Any]]]:
            return {k: [tuple(p) for p in v] for k, v in table.items()}

        return cls(
            name=d["name"], scenario=d["scenario"], seeds=tuple(d["seeds"]),
            fixed=dict(d.get("set", {})), grid=pairs(d.get("grid", {})),
            zip=pairs(d.get("zip", {})), metrics=tuple(d.get("metrics", METRIC_GROUPS)),
            engine=d.get("engine", "sim"), description=d.get("description", ""),
            report=dict(d.get("report", {})),
        )  # fmt: skip

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "scenario": self.scenario,
            "seeds": list(self.seeds),
            "set": self.fixed,
            "grid": self.grid,
            "zip": self.zip,
            "keys": self.keys,
            "metrics": list(self.metrics),
            "engine": self.engine,
            "report": self.report,
        }


def point_name(labels: dict[str, Any], seed: int) -> str:
    """A run directory name that says what the run is: `ecmp.policy=eecmp,workload.qps=4,seed=1`."""
    parts = [f"{k}={_slug(v)}" for k, v in labels.items()] + [f"seed={seed}"]
    name = ",".join(parts)
    if len(name) > 200:
        import hashlib

        name = f"{name[:180]}~{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return name


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", str(value)).strip("_") or "_"


def parse_seeds(value: Any) -> tuple[int, ...]:
    """`[1, 2, 3]`, `"1-5"`, `"1,3,7"` or `5` (one seed) -> the seeds, in order, once each."""
    if isinstance(value, bool):
        raise SpecError(f"seeds = {value!r} must be a list, a range '1-5' or a number")
    if isinstance(value, int):
        seeds = [value]
    elif isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        seeds = list(value)
    elif isinstance(value, str):
        seeds = []
        for part in value.split(","):
            lo, dash, hi = part.strip().partition("-")
            if not lo.strip().isdigit() or (dash and not hi.strip().isdigit()):
                raise SpecError(f"seeds = {value!r}: write a list, a range '1-5' or '1,3,7'")
            a, b = int(lo), int(hi) if dash else int(lo)
            if b < a:
                raise SpecError(f"seeds = {value!r}: the range {part.strip()} runs backwards")
            if len(seeds) + b - a + 1 > MAX_POINTS:
                count = len(seeds) + b - a + 1
                raise SpecError(
                    f"seeds = {value!r} is {count:,} seeds, about "
                    f"{count * POINT_BYTES / 1e9:,.1f} GB to plan and as many runs; a sweep "
                    f"runs at most {MAX_POINTS:,} points"
                )
            seeds.extend(range(a, b + 1))
    else:
        raise SpecError(f"seeds = {value!r} must be a list, a range '1-5' or a number")
    if not seeds:
        raise SpecError("seeds: give at least one seed")
    return tuple(dict.fromkeys(seeds))


def split_values(text: str) -> list[Any]:
    """`5tuple,eecmp` or `1,4,8` or `[1,2],[3]` -> values (commas inside [] or "" stay)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    values = [parse_value(p) for p in parts if p.strip()]
    if not values:
        raise SpecError(f"no values in {text!r}")
    return values


def _is_key(path: str) -> bool:
    try:
        check_key(path)
    except SpecError:
        return False
    return True


def flatten_keys(section: str, body: Any, prefix: str = "") -> dict[str, Any]:
    """`{"ecmp": {"policy": x}}` or `{"ecmp.policy": x}` -> `{"ecmp.policy": x}`."""
    if not isinstance(body, dict):
        raise SpecError(f"[{section}] must be a table of keys")
    out = {}
    for key, value in body.items():
        path = f"{prefix}{key}"
        if _is_key(path):
            out[path] = value
        elif isinstance(value, dict):
            out.update(flatten_keys(section, value, f"{path}."))
        else:
            check_key(path)  # raises, naming the key
    return out


def _values(section: str, key: str, value: Any) -> list[tuple[Any, Any]]:
    """A list of values, or a table of named values -> [(label, value)]."""
    if isinstance(value, dict) and value:
        return list(value.items())
    if isinstance(value, list) and value:
        labels = [v if isinstance(v, str | int | float | bool) else repr(v) for v in value]
        if section == "grid" and len(set(map(str, labels))) != len(labels):
            raise SpecError(f"[{section}] {key}: the values repeat")
        return list(zip(labels, value, strict=True))
    raise SpecError(f"[{section}] {key} must be a non-empty list of values or a table of them")


def sweep_from_dict(raw: dict, name: str, *, folder: Path | None = None, full: bool = False):
    """A parsed spec -> a checked `Sweep` (`full`: with its [full] section laid over)."""
    for section in raw:
        if section not in SECTIONS:
            raise SpecError(
                f"sweep {name}: unknown section [{section}]; a spec has {', '.join(SECTIONS)}"
            )
    head = _checked(name, "sweep", raw.get("sweep", {}), SWEEP_KEYS)
    report = _checked(name, "report", raw.get("report", {}), REPORT_KEYS)
    body = {k: raw.get(k, {}) for k in ("set", "grid", "zip")}
    seeds = head.get("seeds", [1])
    if full:
        extra = _checked(name, "full", raw.get("full", {}), FULL_KEYS)
        seeds = extra.get("seeds", seeds)
        body.update({k: v for k, v in extra.items() if k != "seeds"})
    if "scenario" not in head:
        raise SpecError(f"sweep {name}: sweep.scenario is missing (the base scenario)")
    scenario = relative_to(str(head["scenario"]), folder)
    if scenario.endswith(".toml") or "/" in scenario:
        scenario = str(Path(scenario).resolve())
    from aifabric.scenarios import PRESETS

    PRESETS.read(scenario)  # a missing file or an unknown preset: one sentence, now
    fixed = flatten_keys("set", body["set"])
    grid = {k: _values("grid", k, v) for k, v in flatten_keys("grid", body["grid"]).items()}
    zipped = {k: _values("zip", k, v) for k, v in flatten_keys("zip", body["zip"]).items()}
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        raise SpecError(f"sweep {name}: the [zip] keys must have as many values each")
    if "scenario.seed" in {*fixed, *grid, *zipped}:
        raise SpecError(f"sweep {name}: give seeds as sweep.seeds (--seeds), not scenario.seed")
    both = set(grid) & set(zipped) | (set(fixed) & (set(grid) | set(zipped)))
    if both:
        raise SpecError(f"sweep {name}: {sorted(both)[0]} is given twice ([set], [grid], [zip])")
    metrics = head.get("metrics", list(METRIC_GROUPS))
    if not isinstance(metrics, list) or any(m not in METRIC_GROUPS for m in metrics):
        raise SpecError(
            f"sweep {name}: sweep.metrics = {metrics!r}; choose from {', '.join(METRIC_GROUPS)}"
        )
    engine = head.get("engine", "sim")
    if engine not in ENGINES:
        raise SpecError(f"sweep {name}: sweep.engine = {engine!r}; sweeps run on the simulator")
    keys = [*grid, *zipped]
    contrasts = report.get("contrasts", [])
    if not isinstance(contrasts, list):
        raise SpecError(f"sweep {name}: report.contrasts must be [[report.contrasts]] tables")
    report = {**report, "contrasts": [dict(c) for c in contrasts if isinstance(c, dict)]}
    for i, contrast in enumerate([report, *report["contrasts"]]):
        where = "report" if i == 0 else f"report.contrasts.{i - 1}"
        if i:
            _checked(name, where, contrast, CONTRAST_KEYS)
        if "published_band" in contrast:
            contrast["published_band"] = _band(name, where, contrast["published_band"])
        for part in ("baseline", "headline"):
            if part not in contrast:
                continue
            contrast[part] = flatten_keys(f"{where}.{part}", contrast[part])
            for key in contrast[part]:
                if key not in keys:
                    raise SpecError(
                        f"sweep {name}: {where}.{part} names {key}, which the sweep does not vary"
                    )
    seeds = parse_seeds(seeds)
    check_size(name, grid, zipped, len(seeds))
    sweep = Sweep(
        name=str(head.get("name", name)),
        scenario=scenario,
        seeds=seeds,
        fixed=fixed,
        grid=grid,
        zip=zipped,
        metrics=tuple(metrics),
        engine=engine,
        description=str(head.get("description", "")),
        report=report,
    )
    configurations = [
        {k: str(label) for k, (label, _) in c.items()} for c in sweep.configurations()
    ]
    for i, contrast in enumerate([report, *report["contrasts"]]):
        where = "report" if i == 0 else f"report.contrasts.{i - 1}"
        for part in ("baseline", "headline"):
            wanted = {k: str(v) for k, v in contrast.get(part, {}).items()}
            named = any(all(c[k] == v for k, v in wanted.items()) for c in configurations)
            if wanted and not named:
                shown_ = ", ".join(f"{k} = {v}" for k, v in wanted.items())
                raise SpecError(
                    f"sweep {name}: {where}.{part} ({shown_}) names no configuration of the grid"
                )
    return sweep


MAX_POINTS = 100_000  # runs of one sweep: each a run directory, a task and a row
POINT_BYTES = 2_000  # what planning one point takes (its name, labels, overrides, future)


def check_size(name: str, grid: dict, zipped: dict, seeds: int) -> None:
    """One sentence, before anything is planned, for a sweep of more than `MAX_POINTS`."""
    configurations = 1
    for values in grid.values():
        configurations *= len(values)
    if zipped:
        configurations *= len(next(iter(zipped.values())))
    points = configurations * seeds
    if points > MAX_POINTS:
        raise SpecError(
            f"sweep {name} has {points:,} points ({configurations:,} configurations x {seeds:,} "
            f"seeds), about {points * POINT_BYTES / 1e9:,.1f} GB to plan before the first runs "
            f"and as many run directories; a sweep runs at most {MAX_POINTS:,}"
        )


def _band(name: str, where: str, band: Any) -> list[float | None]:
    """A published band [low, high] as a relative change, an infinite end open (None, so
    that sweep.json stays JSON); one sentence unless it is two numbers, low below high, on
    one side of zero (a published figure has a direction)."""
    numbers = isinstance(band, list) and all(
        isinstance(x, int | float) and not isinstance(x, bool) and not math.isnan(x) for x in band
    )
    if not numbers or len(band) != 2 or not band[0] < band[1] or band[0] < 0 < band[1]:
        raise SpecError(
            f"sweep {name}: {where}.published_band = {band!r} must be [low, high], a relative "
            "change with low below high, both at or above 0 or both at or below 0 (up to "
            "40%: [0, 0.40]; more than 30%: [0.30, inf])"
        )
    return [None if math.isinf(x) else float(x) for x in band]


def _checked(name: str, section: str, body: Any, keys: tuple[str, ...]) -> dict:
    return check_table(f"sweep {name}", section, body, keys)


def is_sweep_file(source: str) -> bool:
    """Whether `source` is a sweep spec (a TOML file with a [sweep] table)."""
    path = Path(source)
    if not path.is_file():
        return False
    try:
        return "sweep" in tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False


def load_sweep(source: str | Path, *, full: bool = False) -> Sweep:
    path = Path(source)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise SpecError(f"sweep spec {path} cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"sweep spec {path} is not valid TOML: {e}") from None
    return sweep_from_dict(raw, path.stem, folder=path.parent, full=full)


def sweep_from_flags(
    scenario: str,
    *,
    vary: list[str] = (),
    together: list[str] = (),
    assignments: list[str] = (),
    seeds: str = "1",
    metrics: list[str] | None = None,
) -> Sweep:
    """`aifabric sweep SCENARIO --vary k=a,b --zip k=a,b --set k=v --seeds 1-5`."""
    from aifabric.scenarios.overrides import parse_assignment

    def pairs(texts, option):
        out = {}
        for text in texts:
            key, sep, values = text.partition("=")
            if not sep or not key.strip():
                raise SpecError(f"{option} {text!r} must be KEY=V1,V2,... e.g. workload.qps=1,4")
            out[key.strip()] = split_values(values)
        return out

    return sweep_of(
        scenario,
        grid=pairs(vary, "--vary"),
        together=pairs(together, "--zip"),
        fixed=dict(parse_assignment(t) for t in assignments),
        seeds=seeds,
        metrics=metrics,
    )


def sweep_of(
    scenario: str,
    *,
    grid: dict[str, Any] | None = None,
    together: dict[str, Any] | None = None,
    fixed: dict[str, Any] | None = None,
    seeds: Any = 1,
    metrics: list[str] | None = None,
) -> Sweep:
    """A sweep of `scenario` (a preset name or a TOML path) from values: `grid` and
    `together` map dotted keys to their values (or to a table of named values), `fixed`
    sets keys in every run, `seeds` as a spec gives them."""
    raw = {
        "sweep": {"scenario": scenario, "seeds": seeds, "metrics": metrics or list(METRIC_GROUPS)},
        "set": dict(fixed or {}),
        "grid": dict(grid or {}),
        "zip": dict(together or {}),
    }
    stem = Path(scenario).stem
    path = Path(scenario)
    if path.is_file() or scenario.endswith(".toml") or "/" in scenario:
        raw["sweep"]["scenario"] = str(path.resolve())
    return sweep_from_dict(raw, stem)
