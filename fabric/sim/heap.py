"""The event list: a binary heap of (time, sequence) in flat int64 arrays.

Every event is a row of `ev`: time_ps, seq, kind, a, b. The sequence number
makes ties deterministic (first scheduled, first served), as in SimPy.
`g[G_HEAP]` holds the heap size and `g[G_SEQ]` the next sequence number.

Both operations move a hole rather than swapping rows: `schedule` lifts the
hole from the end while the parent is later (a new event's sequence number is
the largest yet, so an equal time never moves it above its parent); `pop`
sinks the hole from the root along the earlier child down to a leaf, then
lifts the last row into it from there ("bottom-up" deletion: one comparison
per level on the way down, and the last row, scheduled late, rarely rises).
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
def _move(ev, dst, src):
    for c in range(E_N):
        ev[dst, c] = ev[src, c]


@njit(cache=True)
def schedule(ev, g, t, kind, a, b):
    """Add an event. The run loop keeps room for what one event schedules (the engine
    grows `ev` between chunks); were that ever short, the event is not written and
    g[G_OVERFLOW] stops the loop."""
    push(ev, g, t, kind, a, b)


@njit(cache=True, inline="always")
def push(ev, g, t, kind, a, b):
    """`schedule`, inlined where every hop schedules (kernel.put_on_wire, kernel.want_tx)."""
    i = g[G_HEAP]
    if i >= ev.shape[0]:
        g[G_OVERFLOW] = 1
        return
    g[G_HEAP] = i + 1
    seq = g[G_SEQ]
    g[G_SEQ] = seq + 1
    while i > 0:
        parent = (i - 1) >> 1
        if t >= ev[parent, E_TIME_PS]:  # at an equal time the parent came first
            break
        _move(ev, i, parent)
        i = parent
    ev[i, E_TIME_PS] = t
    ev[i, E_SEQ] = seq
    ev[i, E_KIND] = kind
    ev[i, E_A] = a
    ev[i, E_B] = b


@njit(cache=True, inline="always")
def pop(ev, g, out):
    """Remove the earliest event into out[0:E_N] (inlined into the loop)."""
    for c in range(E_N):
        out[c] = ev[0, c]
    n = g[G_HEAP] - 1
    g[G_HEAP] = n
    if n == 0:
        return
    i = 0
    while True:  # the hole sinks to a leaf of the heap without row n
        left = 2 * i + 1
        if left >= n:
            break
        small = left
        right = left + 1
        if right < n and _less(ev, right, left):
            small = right
        _move(ev, i, small)
        i = small
    t = ev[n, E_TIME_PS]
    seq = ev[n, E_SEQ]
    while i > 0:  # row n rises into it
        parent = (i - 1) >> 1
        pt = ev[parent, E_TIME_PS]
        if pt < t or (pt == t and ev[parent, E_SEQ] < seq):
            break
        _move(ev, i, parent)
        i = parent
    _move(ev, i, n)
