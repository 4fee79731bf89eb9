"""RED-style ECN marking on the lossless class (the DCQCN switch profile), and the
engine's seeded random numbers (xorshift64*).

The marking probability is `aifabric.fabric.model.EcnProfile.probability`: 0 at or
below Kmin, rising linearly to Pmax at Kmax, 1 above Kmax.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aifabric.sim.layout import G_RNG


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
def uniform(g):
    """A float in [0, 1) from the generator state g[G_RNG] (never 0 after seeding)."""
    x = np.uint64(g[G_RNG])
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    g[G_RNG] = np.int64(x)
    y = x * np.uint64(2685821657736338717)
    return float(y >> np.uint64(11)) / 9007199254740992.0


@njit(cache=True, inline="always")
def should_mark(g, depth_bytes, kmin_bytes, kmax_bytes, pmax):
    p = red_probability(depth_bytes, kmin_bytes, kmax_bytes, pmax)
    if p <= 0.0:
        return False
    if p >= 1.0:
        return True
    return uniform(g) < p


def rng_state(seed: int) -> int:
    """A non-zero 64-bit generator state derived from a scenario seed."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF
    x = x or 1
    return x - (1 << 64) if x >= 1 << 63 else x
