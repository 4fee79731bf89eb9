"""Load-imbalance statistics over a set of bins (uplinks, ports, paths)."""

from __future__ import annotations

import numpy as np


def imbalance(load) -> dict[str, float]:
    """max/mean, coefficient of variation and Jain's fairness index of a load vector.

    An empty or all-zero vector is perfectly balanced: max/mean 1, CV 0, Jain 1.
    """
    x = np.asarray(load, dtype=np.float64)
    if x.size == 0 or not x.any():
        return {
            "bins": int(x.size),
            "mean": 0.0,
            "max": 0.0,
            "max_mean": 1.0,
            "cv": 0.0,
            "jain": 1.0,
        }
    mean = float(x.mean())
    return {
        "bins": int(x.size),
        "mean": mean,
        "max": float(x.max()),
        "max_mean": float(x.max() / mean),
        "cv": float(x.std() / mean),
        "jain": float(x.sum() ** 2 / (x.size * (x**2).sum())),
    }
