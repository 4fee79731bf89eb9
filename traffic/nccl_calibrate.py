"""NCCL's cost model fitted to measured collective times (`aifabric calibrate`).

For one algorithm and protocol NCCL's tuner predicts

    time(size) = base_latency + steps(n) x net_latency
                 + busbw_factor(n) x size / (line_rate x bandwidth_factor)

with steps(n) 2(n-1) for a ring AllReduce, n-1 for a ring AllGather, ReduceScatter or
AllToAll, 2 ceil(log2 n) for a tree AllReduce; busbw_factor is nccl-tests' for a ring
(the bytes a rank's busiest link carries, over size: NCCL's nRanks / nsteps inverted) and
2 for a tree (NCCL's tuner gives a tree half the bus bandwidth), line_rate a NIC's link
rate. A bandwidth factor above 1 (the log ran faster than the NICs allow) is refused:
the log is not of this fabric, or its ranks shared NVLink. The model is
linear in (net_latency, 1 / bandwidth_factor), and in base_latency when it is fitted too:
`fit` solves it by least squares over relative error (each row weighted by 1 / its
measured time, so small sizes count as much as large ones), non-negative, one protocol at
a time. At one rank count base and per-step latency are one constant, so fitting the base
needs logs at two or more rank counts.

A log mixes protocols (NCCL picks LL for small sizes, LL128 or Simple for large ones).
With protocol "auto" the sizes are first cut into one to three runs of consecutive sizes,
named in NCCL's order of bandwidth (one: simple; two: ll, simple; three: ll, ll128,
simple), the cut that the Bayesian information criterion prefers; then each size goes to
the protocol whose fitted model is fastest, and the protocols are fitted again, until the
assignment holds (at most `AUTO_ROUNDS` rounds).

The default base latencies are NCCL's, from `aifabric.traffic.nccl.DEFAULT`, the table
the written [nccl] keys are laid over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.traffic.nccl import ALGORITHMS, DEFAULT, PROTOCOLS, nic_rate_bps

KINDS = ("allreduce", "allgather", "reducescatter", "alltoall")
AUTO_ROUNDS = 10
# relative error below which a fit counts as exact when auto weighs one cut against another
# (a log's own noise is larger; without a floor an exact fit's log(0) would decide)
ERROR_FLOOR = 1e-3


def steps(kind: str, algorithm: str, n: int) -> int:
    """The model's latency steps of one op over n ranks."""
    if algorithm == "tree":
        if kind != "allreduce":
            raise AifabricError(f"NCCL runs {kind} as a ring only; give --algorithm ring")
        return 2 * math.ceil(math.log2(n))
    return 2 * (n - 1) if kind == "allreduce" else n - 1


def busbw_factor(kind: str, n: int) -> float:
    from aifabric.traffic.collectives import busbw_factor as factor

    return factor(kind, n)


def nic_line_rate_bps(fabric) -> float:
    """The NICs' link rate (the slowest, if they differ)."""
    if not len(fabric.nic_ids):
        raise AifabricError(f"fabric {fabric.name} has no NICs")
    return nic_rate_bps(fabric, fabric.nic_ids)


@dataclass(frozen=True)
class Samples:
    """Measured ops: size in bytes, ranks, time in microseconds (arrays of one length)."""

    size: np.ndarray
    ranks: np.ndarray
    time_us: np.ndarray

    def __len__(self) -> int:
        return len(self.size)


@dataclass(frozen=True)
class ProtocolFit:
    protocol: str
    base_latency_us: float
    net_latency_us: float
    bandwidth_factor: float
    rows: int  # samples assigned to it


@dataclass(frozen=True)
class Fit:
    kind: str
    algorithm: str
    line_rate_bps: float
    fit_base: bool
    protocols: dict[str, ProtocolFit]
    protocol: tuple[str, ...]  # per sample: the protocol it is assigned to
    fitted_us: np.ndarray  # per sample
    error: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (fitted - measured) / measured

    def predict(self, protocol: str, size, ranks) -> np.ndarray:
        p = self.protocols[protocol]
        x = _design(self.kind, self.algorithm, self.line_rate_bps, size, ranks)
        return p.base_latency_us + x[:, 0] * p.net_latency_us + x[:, 1] / p.bandwidth_factor


def _design(kind, algorithm, line_rate_bps, size, ranks) -> np.ndarray:
    """Per sample: (steps, microseconds the bus bytes take at the line rate)."""
    size, ranks = np.asarray(size, np.float64), np.asarray(ranks, np.int64)
    st = np.array([steps(kind, algorithm, int(n)) for n in ranks], np.float64)
    factor = np.array(
        [2.0 if algorithm == "tree" else busbw_factor(kind, int(n)) for n in ranks], np.float64
    )
    return np.column_stack([st, factor * size * 8e6 / line_rate_bps])


def _solve(x, t, base, fit_base):
    """(base, latency, 1 / bandwidth factor, weighted residual sum of squares) by non-negative
    least squares over relative error."""
    from scipy.optimize import nnls

    w = 1.0 / t
    cols = [x[:, 0], x[:, 1]] + ([np.ones(len(t))] if fit_base else [])
    a = np.column_stack(cols) * w[:, None]
    b = (t - (0.0 if fit_base else base)) * w
    coef, _ = nnls(a, b)
    lat, inv = coef[0], coef[1]
    if fit_base:
        base = coef[2]
    pred = base + x[:, 0] * lat + x[:, 1] * inv
    return base, lat, inv, float((((pred - t) / t) ** 2).sum())


def _fit_one(kind, algorithm, protocol, x, t, fit_base) -> tuple[ProtocolFit | None, float]:
    base0 = DEFAULT.base_latency_us[algorithm][protocol]
    base, lat, inv, rss = _solve(x, t, base0, fit_base)
    if inv <= 0:  # the times do not grow with the size: no bandwidth to fit
        return None, rss
    return ProtocolFit(protocol, float(base), float(lat), float(1.0 / inv), len(t)), rss


def _names(k: int) -> tuple[str, ...]:
    return {1: ("simple",), 2: ("ll", "simple"), 3: PROTOCOLS}[k]


def _fits(kind, algorithm, x, t, labels, fit_base) -> tuple[dict[str, ProtocolFit], float]:
    out, rss = {}, 0.0
    for p in dict.fromkeys(labels):
        sel = np.array([lab == p for lab in labels])
        f, r = _fit_one(kind, algorithm, p, x[sel], t[sel], fit_base)
        if f is None:
            return {}, math.inf
        out[p] = f
        rss += r
    return out, rss


def _first_cut(kind, algorithm, x, t, size, fit_base) -> list[str]:
    """Protocol per sample: the cut of the sorted sizes into runs that BIC prefers."""
    distinct = np.unique(size)
    per = 3 if fit_base else 2  # unknowns per protocol
    m = len(t)
    best, best_score = None, math.inf
    for k in (1, 2, 3):
        if len(distinct) < 2 * k:  # each run needs two sizes at least
            break
        for cuts in _cut_points(len(distinct), k):
            edges = [distinct[c] for c in cuts]  # first size of each run after the first
            run = np.searchsorted(edges, size, side="right")
            labels = [_names(k)[r] for r in run]
            _, rss = _fits(kind, algorithm, x, t, labels, fit_base)
            if not math.isfinite(rss):
                continue
            score = m * math.log(max(rss / m, ERROR_FLOOR**2)) + k * per * math.log(m)
            if score < best_score - 1e-9:
                best, best_score = labels, score
    if best is None:
        raise AifabricError("no protocol's model fits the log: its times do not grow with size")
    return best


def _cut_points(n: int, k: int):
    """Indices 2.. where k runs of at least two of n sorted sizes begin (after the first)."""
    if k == 1:
        yield ()
        return
    for first in range(2, n - 2 * (k - 1) + 1):
        for rest in _cut_points(n - first, k - 1):
            yield (first, *(first + r for r in rest))


def fit(
    kind: str,
    algorithm: str,
    protocol: str,
    samples: Samples,
    line_rate_bps: float,
    *,
    fit_base: bool = False,
) -> Fit:
    """The model's terms for `samples` of one collective (`protocol` one of PROTOCOLS, or
    "auto")."""
    if kind not in KINDS:
        raise AifabricError(f"calibrate fits {', '.join(KINDS)}, not {kind}")
    if algorithm not in ALGORITHMS:
        raise AifabricError(f"unknown algorithm {algorithm}; known: {', '.join(ALGORITHMS)}")
    if protocol != "auto" and protocol not in PROTOCOLS:
        raise AifabricError(f"unknown protocol {protocol}; known: {', '.join(PROTOCOLS)}, auto")
    size = np.asarray(samples.size, np.float64)
    t = np.asarray(samples.time_us, np.float64)
    ranks = np.asarray(samples.ranks, np.int64)
    if (ranks < 2).any():
        raise AifabricError("a collective over fewer than 2 ranks has no network time to fit")
    if len(np.unique(size)) < 2:
        raise AifabricError("the log has one size only: latency and bandwidth need two or more")
    if fit_base and len(np.unique(ranks)) < 2:
        raise AifabricError(
            "--fit-base needs logs at two or more rank counts: at one, the base and the "
            "per-step latency are one constant"
        )
    x = _design(kind, algorithm, line_rate_bps, size, ranks)
    if protocol == "auto":
        labels = _first_cut(kind, algorithm, x, t, size, fit_base)
        fits, _ = _fits(kind, algorithm, x, t, labels, fit_base)
        for _ in range(AUTO_ROUNDS):
            partial = Fit(kind, algorithm, line_rate_bps, fit_base, fits, (), np.zeros(0))
            pred = np.stack([partial.predict(p, size, ranks) for p in fits])
            names = list(fits)
            new = [names[i] for i in pred.argmin(axis=0)]
            # a protocol left with fewer than two sizes cannot be fitted: its sizes go elsewhere
            for p in names:
                if len(np.unique(size[[lab == p for lab in new]])) < 2:
                    others = [q for q in names if q != p]
                    for i, lab in enumerate(new):
                        if lab == p:
                            new[i] = min(others, key=lambda q: pred[names.index(q), i])
            refit, rss = _fits(kind, algorithm, x, t, new, fit_base)
            if not math.isfinite(rss) or new == labels:
                break
            labels, fits = new, refit
    else:
        labels = [protocol] * len(t)
        fits, rss = _fits(kind, algorithm, x, t, labels, fit_base)
        if not fits:
            raise AifabricError(f"the times do not grow with size: no {protocol} bandwidth to fit")
    fits = {p: fits[p] for p in PROTOCOLS if p in fits}
    for p in fits.values():
        if p.bandwidth_factor > 1:
            raise AifabricError(
                f"the fitted {p.protocol} bandwidth factor {p.bandwidth_factor:.3g} is above "
                f"1: the log ran faster than the NICs' line rate "
                f"({line_rate_bps / 1e9:g} Gbit/s) allows; is it this fabric's log?"
            )
    result = Fit(kind, algorithm, line_rate_bps, fit_base, fits, tuple(labels), np.zeros(0))
    fitted = np.array(
        [result.predict(p, size[i : i + 1], ranks[i : i + 1])[0] for i, p in enumerate(labels)]
    )
    return Fit(
        kind, algorithm, line_rate_bps, fit_base, fits, tuple(labels), fitted, (fitted - t) / t
    )


def nccl_table(f: Fit) -> dict:
    """The [nccl] keys the fit determined: net latency and bandwidth factor of the fitted
    algorithm's protocols, and their base latency when it was fitted."""
    keys = ["net_latency_us", "bandwidth_factor"] + (["base_latency_us"] if f.fit_base else [])
    return {
        key: {f.algorithm: {p: getattr(pf, key) for p, pf in f.protocols.items()}} for key in keys
    }


def _toml_float(x: float) -> str:
    return repr(float(f"{x:.6g}"))


def to_toml(table: dict, comments: list[str]) -> str:
    """`table` as a TOML [nccl] table (inline tables per algorithm), after comment lines."""
    lines = [f"# {c}" for c in comments] + ["[nccl]"]
    for key, algorithms in table.items():
        inner = ", ".join(
            f"{a} = {{ " + ", ".join(f"{p} = {_toml_float(v)}" for p, v in ps.items()) + " }"
            for a, ps in algorithms.items()
        )
        lines.append(f"{key} = {{ {inner} }}")
    return "\n".join(lines) + "\n"
