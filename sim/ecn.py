"""RED-style ECN marking on the lossless class (the DCQCN switch profile), and the
engine's seeded random numbers (xorshift64*, a stream per port: `rng_state`).

The marking probability is `aifabric.fabric.model.EcnProfile.probability`: 0 at or
below Kmin, rising linearly to Pmax at Kmax, 1 above Kmax.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def red_probability(depth_bytes, kmin_bytes, kmax_bytes, pmax):
    if depth_bytes <= kmin_bytes:
        return 0.0
    if depth_bytes > kmax_bytes:
        return 1.0
    if kmax_bytes == kmin_bytes:
        return pmax
    return pmax * (depth_bytes - kmin_bytes) / (kmax_bytes - kmin_bytes)


@njit(cache=True)
def uniform(state, i, c):
    """A float in [0, 1) from the generator state state[i, c] (never 0 after seeding)."""
    x = np.uint64(state[i, c])
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    state[i, c] = np.int64(x)
    y = x * np.uint64(2685821657736338717)
    return float(y >> np.uint64(11)) / 9007199254740992.0


@njit(cache=True, inline="always")
def should_mark(state, i, c, depth_bytes, kmin_bytes, kmax_bytes, pmax):
    """Whether to mark, drawing (where the probability is strictly between 0 and 1) from
    the generator state state[i, c]: a port's own stream, so that what one port draws
    does not depend on the order in which other ports mark."""
    p = red_probability(depth_bytes, kmin_bytes, kmax_bytes, pmax)
    if p <= 0.0:
        return False
    if p >= 1.0:
        return True
    return uniform(state, i, c) < p


def rng_state(seed: int, streams: int = 1) -> np.ndarray:
    """Non-zero 64-bit generator states (int64), one per stream, derived from a scenario
    seed and the stream's number by splitmix64's finalizer, so that neighbouring streams
    start far apart."""
    with np.errstate(over="ignore"):
        x = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
        x = x + np.arange(1, streams + 1, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    x[x == 0] = 1
    return x.view(np.int64)
