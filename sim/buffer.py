"""The shared-buffer switch: one pool per switch, reserved minimums, dynamic thresholds,
PFC from the ingress accounting, headroom apart (the model `aifabric.fabric.model.QueueProfile`
describes; the kernel calls this module only for ports with PT_SHARED set).

Every switch keeps in nd[s, ...] its shared pool (ND_SB_SIZE: the buffer less every
port's reserved minimums), the bytes of it in use (ND_SB_USED), and alpha
(ND_SB_ALPHA, in units of 1/ALPHA_SCALE). A counter (an egress queue of a lossy class,
or an ingress port's lossless bytes) of c bytes holds min(c, reserved) of its port's
reserve and max(c - reserved, 0) of the shared pool, so the pool's use is the sum of
the counters' shared parts. The dynamic threshold (Choudhury and Hahne) is

    T = alpha x (ND_SB_SIZE - ND_SB_USED)

taken before a frame is admitted: a frame that would take a counter's shared part above
T (or the pool past its size) is over the threshold.

- Lossy classes (control; data with PFC off) are accounted at the egress queue: a frame
  over the threshold is dropped.
- The lossless class (data with PFC on) is accounted at its ingress port k: a frame over
  the threshold goes to k's headroom (PT_HDRM_BYTES, at most PT_HEADROOM_BYTES, apart
  from the pool), and one that does not fit there either is dropped. Port k pauses its
  peer once its headroom holds bytes or its shared part has reached the threshold; it
  resumes once the headroom is empty and the shared part is PT_XON_OFFSET_BYTES below
  the threshold (or zero). Bytes leave the headroom first. Lossless bytes are not
  counted at the egress (as on Broadcom switches, whose lossless queues have no egress
  limit).
"""

from __future__ import annotations

from numba import njit

from aifabric.fabric.model import ALPHA_SCALE
from aifabric.sim.layout import (
    ND_SB_ALPHA,
    ND_SB_SIZE,
    ND_SB_USED,
    PT_HDRM_BYTES,
    PT_HEADROOM_BYTES,
    PT_ING_BYTES,
    PT_NODE,
    PT_PFC_ON,
    PT_Q0_BYTES,
    PT_RESERVED_BYTES,
    PT_XOFF,
    PT_XON_OFFSET_BYTES,
)
from aifabric.sim.pfc import ADMIT, ADMIT_XOFF, DROP

ALPHA_SHIFT = ALPHA_SCALE.bit_length() - 1
assert 1 << ALPHA_SHIFT == ALPHA_SCALE


@njit(cache=True, inline="always")
def threshold(nd, s):
    """Switch s's dynamic threshold now: alpha x its free shared bytes."""
    free = nd[s, ND_SB_SIZE] - nd[s, ND_SB_USED]
    if free <= 0:
        return 0
    return (free * nd[s, ND_SB_ALPHA]) >> ALPHA_SHIFT


@njit(cache=True, inline="always")
def shared_part(count, reserved):
    return count - reserved if count > reserved else 0


@njit(cache=True)
def admit_egress(pt, nd, q, cls, wire):
    """A lossy frame of `wire` bytes for class `cls` of port q: True if it fits (its pool
    bytes taken), False if it is dropped. The caller enqueues it."""
    s = pt[q, PT_NODE]
    r = pt[q, PT_RESERVED_BYTES]
    count = pt[q, PT_Q0_BYTES + cls]
    after = shared_part(count + wire, r)
    grow = after - shared_part(count, r)
    if grow > 0:
        if after > threshold(nd, s) or nd[s, ND_SB_USED] + grow > nd[s, ND_SB_SIZE]:
            return False
        nd[s, ND_SB_USED] += grow
    return True


@njit(cache=True)
def release_egress(pt, nd, q, cls, wire):
    """A lossy frame of `wire` bytes left class `cls` of port q (already dequeued)."""
    r = pt[q, PT_RESERVED_BYTES]
    count = pt[q, PT_Q0_BYTES + cls]
    nd[pt[q, PT_NODE], ND_SB_USED] -= shared_part(count + wire, r) - shared_part(count, r)


@njit(cache=True, inline="always")
def admit_lossless(pt, nd, k, wire):
    """A lossless frame arrives over ingress port k's link: ADMIT, ADMIT_XOFF (pause the
    peer) or DROP (over the threshold and the headroom is full). Inlined: a shared switch
    admits every data frame of a hop so."""
    s = pt[k, PT_NODE]
    r = pt[k, PT_RESERVED_BYTES]
    count = pt[k, PT_ING_BYTES]
    after = shared_part(count + wire, r)
    grow = after - shared_part(count, r)
    if grow == 0 or (after <= threshold(nd, s) and nd[s, ND_SB_USED] + grow <= nd[s, ND_SB_SIZE]):
        pt[k, PT_ING_BYTES] = count + wire
        nd[s, ND_SB_USED] += grow
    elif pt[k, PT_HDRM_BYTES] + wire <= pt[k, PT_HEADROOM_BYTES]:
        pt[k, PT_HDRM_BYTES] += wire
    else:
        return DROP
    if pt[k, PT_XOFF] == 0:
        part = shared_part(pt[k, PT_ING_BYTES], r)
        if pt[k, PT_HDRM_BYTES] > 0 or (part > 0 and part >= threshold(nd, s)):
            pt[k, PT_XOFF] = 1
            return ADMIT_XOFF
    return ADMIT


@njit(cache=True, inline="always")
def release_lossless(pt, nd, k, wire):
    """A lossless frame that came in over port k leaves the switch; True: send a resume."""
    s = pt[k, PT_NODE]
    rest = wire
    held = pt[k, PT_HDRM_BYTES]
    if held > 0:
        take = held if held < wire else wire
        pt[k, PT_HDRM_BYTES] = held - take
        rest = wire - take
    if rest > 0:
        r = pt[k, PT_RESERVED_BYTES]
        count = pt[k, PT_ING_BYTES]
        pt[k, PT_ING_BYTES] = count - rest
        nd[s, ND_SB_USED] -= shared_part(count, r) - shared_part(count - rest, r)
    if pt[k, PT_XOFF] == 1 and pt[k, PT_HDRM_BYTES] == 0:
        part = shared_part(pt[k, PT_ING_BYTES], pt[k, PT_RESERVED_BYTES])
        if part == 0 or part + pt[k, PT_XON_OFFSET_BYTES] <= threshold(nd, s):
            pt[k, PT_XOFF] = 0
            return True
    return False


@njit(cache=True, inline="always")
def release_data(pt, nd, q, k, wire):
    """A data frame that came in over port k left port q of a shared switch (dequeued);
    True: port k sends a resume."""
    if pt[k, PT_PFC_ON]:
        return release_lossless(pt, nd, k, wire)
    release_egress(pt, nd, q, 1, wire)
    return False
