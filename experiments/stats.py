"""Results across seeds: per-configuration statistics and effects, with 95% intervals.

A configuration is one combination of the varied keys; its seeds are the
sample. The interval of the mean uses Student's t (scipy.stats.t) with h = t(0.975, n-1)
s / sqrt(n), s the sample standard deviation (n-1 in the denominator):

- where no value is negative (every metric of a sweep: times, bandwidths, counts) it is
  taken on a log scale, mean / f to mean * f with f = exp(h / mean) (the delta
  method's interval of log(mean)), so it stays above zero however wide it is;
- otherwise it is mean - h to mean + h.

An effect compares a configuration with the baseline in the same group (the other varied
keys equal), seed by seed: the ratio x / b of each seed's pair, the mean ratio and its
interval (log scale: ratios are positive), each minus 1, so a relative change (x - b) / b
whose interval never goes below -100%.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def t_quantile(dof: int, level: float = 0.95) -> float:
    """The t value with P(|T| < t) = level (the two-sided `level` interval's multiplier)."""
    from scipy.stats import t as student_t

    if dof < 1:
        raise ValueError("a t interval needs at least two values")
    return float(student_t.ppf((1 + level) / 2, dof))


INTERVAL_NOTE = (
    "95% intervals of the mean over seeds, Student's t on a log scale (mean / f to "
    "mean * f, f = exp(t s / (mean sqrt(n)))) where no value is negative (times, "
    "bandwidths, counts), so they stay above zero; an effect's is that of the mean ratio "
    "to the baseline, minus 1"
)
"""What the report page and `sweep show` say of their intervals."""


def half_width(values) -> float | None:
    """Student's t half-width of the 95% interval of the mean: t(0.975, n-1) s / sqrt(n)
    (None for fewer than two values)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return None
    if x.min() == x.max():
        return 0.0  # numpy's std of equal values can miss 0 by a rounding
    return t_quantile(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))


def describe(values) -> dict[str, Any]:
    """n, mean, std, min, max and the 95% interval of the mean (None where undefined);
    `interval` says how it was taken: "log" (no value below zero) or "t"."""
    x = np.asarray([v for v in values if v is not None and not _nan(v)], dtype=np.float64)
    n = len(x)
    out: dict[str, Any] = {"n": n, "mean": None, "std": None, "min": None, "max": None,
                           "ci_low": None, "ci_high": None, "interval": None}  # fmt: skip
    if not n:
        return out
    out.update(mean=float(x.mean()), min=float(x.min()), max=float(x.max()))
    if out["min"] == out["max"]:  # x.mean() of equal values can miss them by a rounding
        out["mean"] = out["min"]
        if n > 1:
            out.update(std=0.0, ci_low=out["min"], ci_high=out["min"])
    elif n > 1:
        mean, half = out["mean"], half_width(x)
        out["std"] = float(x.std(ddof=1))
        if out["min"] >= 0:  # the mean is above 0: not every value is equal
            factor = math.exp(half / mean)
            out.update(ci_low=mean / factor, ci_high=mean * factor, interval="log")
        else:
            out.update(ci_low=mean - half, ci_high=mean + half, interval="t")
    return out


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def metric_columns(frame, keys: list[str]) -> list[str]:
    """The numeric result columns of a results table (not the keys or bookkeeping)."""
    from aifabric.experiments.runner import RESULT_COLUMNS

    skip = set(keys) | set(RESULT_COLUMNS)
    return [c for c in frame.columns if c not in skip and frame[c].dtype.kind in "fiu"]


def split_metric(column: str) -> tuple[str, str]:
    """`busbw_gbps@allreduce` -> ("busbw_gbps", "allreduce"); a fabric-wide one -> (c, "")."""
    metric, _, job = column.rpartition("@")
    return (metric, job) if metric else (column, "")


def configurations(frame, keys: list[str]) -> list[tuple]:
    """The configurations of a results table, in the order they first appear."""
    if not keys:
        return [()]
    seen = dict.fromkeys(tuple(row) for row in frame[keys].itertuples(index=False))
    return list(seen)


def select_rows(frame, keys: list[str], config: tuple):
    """The rows of `frame` whose `keys` hold the values of `config` (compared as text)."""
    mask = np.ones(len(frame), dtype=bool)
    for k, v in zip(keys, config, strict=True):
        mask &= frame[k].astype(str).to_numpy() == str(v)
    return frame[mask]


def aggregate(frame, keys: list[str], metrics: list[str] | None = None) -> list[dict]:
    """Per configuration and metric column: the configuration, job, metric and `describe`."""
    done = frame[frame["status"] == "complete"]
    cols = metrics or metric_columns(frame, keys)
    out = []
    for config in configurations(frame, keys):
        rows = select_rows(done, keys, config)
        for col in cols:
            if col not in rows:
                continue
            stats = describe(rows[col].tolist())
            if stats["n"] == 0 and len(rows):
                continue  # the column does not apply here (a job this configuration lacks)
            metric, job = split_metric(col)
            out.append(
                {
                    **dict(zip(keys, config, strict=True)),
                    "job": job,
                    "metric": metric,
                    "column": col,
                    **stats,
                    "seeds": [int(s) for s in rows["seed"]],
                }
            )
    return out


RATIO_KEYS = ("mean", "ci_low", "ci_high")


def effects(frame, keys: list[str], column: str, baseline: dict[str, Any]) -> list[dict]:
    """Every configuration against the baseline of its group, paired by seed.

    `baseline` fixes some varied keys (e.g. ecmp.policy = 5tuple); the group
    of a configuration is its values of the other keys. `change` is the mean
    relative change (x - b) / b over the seeds both ran, with its interval.
    """
    unknown = [k for k in baseline if k not in keys]
    if unknown:
        from aifabric.fabric.errors import AifabricError

        raise AifabricError(f"the baseline names {unknown[0]}, which the sweep does not vary")
    done = frame[frame["status"] == "complete"]
    group_keys = [k for k in keys if k not in baseline]
    out = []
    for config in configurations(frame, keys):
        values = dict(zip(keys, config, strict=True))
        if all(str(values[k]) == str(v) for k, v in baseline.items()):
            continue
        base_config = tuple(baseline.get(k, values[k]) for k in keys)
        mine = select_rows(done, keys, config).set_index("seed")[column].dropna()
        base = select_rows(done, keys, base_config).set_index("seed")[column].dropna()
        seeds = sorted(set(mine.index) & set(base.index))
        ratio = describe([mine[s] / base[s] for s in seeds if base[s]])
        change = {k: None if ratio[k] is None else ratio[k] - 1 for k in RATIO_KEYS}
        out.append(
            {
                "configuration": values,
                "group": {k: values[k] for k in group_keys},
                "column": column,
                "mean": float(mine.mean()) if len(mine) else None,
                "baseline_mean": float(base.mean()) if len(base) else None,
                "pairs": ratio["n"],
                "change": change["mean"],
                "change_low": change["ci_low"],
                "change_high": change["ci_high"],
            }
        )
    return out
