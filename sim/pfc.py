"""802.1Qbb PFC as a policy on a switch's ingress: lossless bytes are counted per
ingress port (the switch's own port of the link they came over); above XOFF the
switch asks the peer to pause, below XON to resume; beyond XOFF + headroom a
frame is dropped (headroom too small). Pauses last `quanta` x 512 bit times.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aifabric.sim.layout import (
    PT_HEADROOM_BYTES,
    PT_ING_BYTES,
    PT_PAUSE_FROM_PS,
    PT_PAUSE_UNTIL_PS,
    PT_RATE_BPS,
    PT_S_PAUSED_PS,
    PT_XOFF,
    PT_XOFF_BYTES,
    PT_XON_BYTES,
)

ADMIT, ADMIT_XOFF, DROP = 0, 1, 2


@njit(cache=True)
def admit(pt, k, wire):
    """A lossless frame arrives over port k's link; ADMIT, ADMIT_XOFF (send a pause) or DROP."""
    ing = pt[k, PT_ING_BYTES] + wire
    if ing > pt[k, PT_XOFF_BYTES] + pt[k, PT_HEADROOM_BYTES]:
        return DROP
    pt[k, PT_ING_BYTES] = ing
    if ing > pt[k, PT_XOFF_BYTES] and pt[k, PT_XOFF] == 0:
        pt[k, PT_XOFF] = 1
        return ADMIT_XOFF
    return ADMIT


@njit(cache=True)
def release(pt, k, wire):
    """A lossless frame that came in over port k leaves the switch; True: send a resume."""
    pt[k, PT_ING_BYTES] -= wire
    if pt[k, PT_XOFF] == 1 and pt[k, PT_ING_BYTES] <= pt[k, PT_XON_BYTES]:
        pt[k, PT_XOFF] = 0
        return True
    return False


@njit(cache=True)
def pause_ps(quanta, rate_bps):
    """How long `quanta` pause quanta (512 bit times each) last at a port's rate."""
    return np.int64(np.ceil(quanta * 512 * 1e12 / rate_bps))


@njit(cache=True)
def account_pause(pt, p, now):
    """Add the paused time of port p up to `now` to its open sample."""
    until = pt[p, PT_PAUSE_UNTIL_PS]
    start = pt[p, PT_PAUSE_FROM_PS]
    if until > start:
        pt[p, PT_S_PAUSED_PS] += min(now, until) - start
    pt[p, PT_PAUSE_FROM_PS] = now


@njit(cache=True)
def pause(pt, p, quanta, now):
    """A PFC frame with `quanta` reached port p's sender (0 resumes it)."""
    account_pause(pt, p, now)
    if quanta == 0:
        pt[p, PT_PAUSE_UNTIL_PS] = now
    else:
        pt[p, PT_PAUSE_UNTIL_PS] = now + pause_ps(quanta, pt[p, PT_RATE_BPS])
