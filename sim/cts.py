"""Clear-to-send (receiver-driven admission) as a congestion-control component.

A starting sender asks its receiver for grants (a REQ); the receiver keeps up
to `window` chunks of the flow granted and not yet received, granting more as
data arrives; a sender sends only what it was granted. The hooks are what
`congestion` calls.
"""

from __future__ import annotations

from numba import njit

from aifabric.sim.layout import (
    DO_GRANT,
    DO_KICK,
    DO_REQUEST,
    FL_ALLOW_BYTES,
    FL_BYTES,
    FL_CHUNK_BYTES,
    FL_DELIV_BYTES,
    FL_GRANTED_BYTES,
    FL_WINDOW,
)


@njit(cache=True)
def on_flow_start(S, f):
    return DO_REQUEST


@njit(cache=True, inline="always")
def may_send(S, f):
    return S.fl[f, FL_ALLOW_BYTES] > 0


@njit(cache=True)
def send_allowance(S, f, size):
    """A data packet of at most `size` bytes is due: it takes what the grants allow."""
    fl = S.fl
    size = min(size, fl[f, FL_ALLOW_BYTES])
    fl[f, FL_ALLOW_BYTES] -= size
    return size


@njit(cache=True)
def on_data(S, f, ce, now_ps):
    return DO_GRANT


@njit(cache=True)
def next_grant(S, f):
    """Receiver: the bytes of the next grant to send now, 0 while the window is full."""
    fl = S.fl
    if fl[f, FL_GRANTED_BYTES] >= fl[f, FL_BYTES]:
        return 0
    chunk = fl[f, FL_CHUNK_BYTES]
    n = min(chunk, fl[f, FL_BYTES] - fl[f, FL_GRANTED_BYTES])
    if fl[f, FL_GRANTED_BYTES] + n - fl[f, FL_DELIV_BYTES] > fl[f, FL_WINDOW] * chunk:
        return 0
    fl[f, FL_GRANTED_BYTES] += n
    return n


@njit(cache=True)
def on_grant(S, f, nbytes):
    S.fl[f, FL_ALLOW_BYTES] += nbytes
    return DO_KICK


@njit(cache=True)
def on_grant_request(S, f):
    return DO_GRANT


@njit(cache=True)
def on_resend(S, f, nbytes):
    """Lost data is sent again on the grant it was sent on."""
    S.fl[f, FL_ALLOW_BYTES] += nbytes
