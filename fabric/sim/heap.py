"""The event list: a binary heap of (time, sequence) in flat int64 arrays.

Every event is a row of `ev`: time_ps, seq, kind, a, b. The sequence number
makes ties deterministic (first scheduled, first served), as in SimPy.
`g[G_HEAP]` holds the heap size and `g[G_SEQ]` the next sequence number.
"""

from __future__ import annotations

from numba import njit

from fabric.sim.layout import E_A, E_B, E_KIND, E_N, E_SEQ, E_TIME_PS, G_HEAP, G_OVERFLOW, G_SEQ


@njit(cache=True, inline="always")
def _less(ev, i, j):
    if ev[i, E_TIME_PS] != ev[j, E_TIME_PS]:
        return ev[i, E_TIME_PS] < ev[j, E_TIME_PS]
    return ev[i, E_SEQ] < ev[j, E_SEQ]


@njit(cache=True, inline="always")
def _swap(ev, i, j):
    for c in range(E_N):
        x = ev[i, c]
        ev[i, c] = ev[j, c]
        ev[j, c] = x


@njit(cache=True)
def schedule(ev, g, t, kind, a, b):
    """Add an event. The run loop keeps room for what one event schedules (the engine
    grows `ev` between chunks); were that ever short, the event is not written and
    g[G_OVERFLOW] stops the loop."""
    i = g[G_HEAP]
    if i >= ev.shape[0]:
        g[G_OVERFLOW] = 1
        return
    g[G_HEAP] = i + 1
    ev[i, E_TIME_PS] = t
    ev[i, E_SEQ] = g[G_SEQ]
    g[G_SEQ] += 1
    ev[i, E_KIND] = kind
    ev[i, E_A] = a
    ev[i, E_B] = b
    while i > 0:
        parent = (i - 1) >> 1
        if _less(ev, i, parent):
            _swap(ev, i, parent)
            i = parent
        else:
            break


@njit(cache=True)
def pop(ev, g, out):
    """Remove the earliest event into out[0:E_N]."""
    for c in range(E_N):
        out[c] = ev[0, c]
    n = g[G_HEAP] - 1
    g[G_HEAP] = n
    if n == 0:
        return
    for c in range(E_N):
        ev[0, c] = ev[n, c]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        small = left
        right = left + 1
        if right < n and _less(ev, right, left):
            small = right
        if _less(ev, small, i):
            _swap(ev, i, small)
            i = small
        else:
            break
