"""The event list: two binary heaps of (time, sequence) in one flat int64 array.

Every event is a row of `ev[heap]`: time_ps, seq, kind, a, b. The sequence number
makes ties deterministic (first scheduled, first served), as in SimPy.
`g[G_HEAP]` holds the number of pending events, `g[G_FAR]` how many of them the
far heap holds, and `g[G_SEQ]` the next sequence number.

The near heap `ev[NEAR]` holds the events before a split time `g[G_SPLIT_PS]`,
the far heap `ev[FAR]` those at or after it, so the near heap's root is the
earliest event whenever the near heap is not empty. Before each pop the split
moves to NEAR_WINDOW_PS past the earliest event's time, and the far events it
passes move into the near heap. Most events a hop schedules (its frame's
arrival, its port's next transmit) fall within the window and go to the small,
cache-resident near heap; those far ahead (a paused port's resume at the end of
its pause, timers, samples: on a large fabric most of what is pending) wait in
the far heap and cost the near heap's pops nothing. The order of pops is that of
one heap of (time, sequence).

Both operations move a hole rather than swapping rows: a push lifts the hole
from the end while the parent is later (a new event's sequence number is the
largest yet, so an equal time never moves it above its parent); a pop sinks the
hole from the root along the earlier child down to a leaf, then lifts the last
row into it from there ("bottom-up" deletion: one comparison per level on the
way down, and the last row, scheduled late, rarely rises).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from fabric.sim.layout import (
    E_A,
    E_B,
    E_KIND,
    E_N,
    E_SEQ,
    E_TIME_PS,
    G_FAR,
    G_HEAP,
    G_OVERFLOW,
    G_SEQ,
    G_SPLIT_PS,
)

NEAR, FAR = 0, 1  # ev[NEAR]: events before the split time; ev[FAR]: the rest
HEAPS = 2
NEAR_WINDOW_PS = 4_000_000  # how far past the earliest event the near heap reaches


def pending(ev: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Every pending event's row (near heap, then far heap; each in heap order)."""
    far = int(g[G_FAR])
    return np.concatenate([ev[NEAR, : int(g[G_HEAP]) - far], ev[FAR, :far]])


@njit(cache=True, inline="always")
def _less(ev, h, i, j):
    if ev[h, i, E_TIME_PS] != ev[h, j, E_TIME_PS]:
        return ev[h, i, E_TIME_PS] < ev[h, j, E_TIME_PS]
    return ev[h, i, E_SEQ] < ev[h, j, E_SEQ]


@njit(cache=True, inline="always")
def _move(ev, h, dst, src):
    for c in range(E_N):
        ev[h, dst, c] = ev[h, src, c]


@njit(cache=True, inline="always")
def _lift(ev, h, i, t, seq, kind, a, b):
    """Put the row (t, seq, kind, a, b) into heap h's hole at the end, row i."""
    while i > 0:
        parent = (i - 1) >> 1
        pt = ev[h, parent, E_TIME_PS]
        if t > pt or (t == pt and seq > ev[h, parent, E_SEQ]):
            break
        _move(ev, h, i, parent)
        i = parent
    ev[h, i, E_TIME_PS] = t
    ev[h, i, E_SEQ] = seq
    ev[h, i, E_KIND] = kind
    ev[h, i, E_A] = a
    ev[h, i, E_B] = b


@njit(cache=True, inline="always")
def _sink(ev, h, n):
    """Remove heap h's root: its last row, n, fills the hole the root leaves."""
    if n == 0:
        return
    i = 0
    while True:  # the hole sinks to a leaf of the heap without row n
        left = 2 * i + 1
        if left >= n:
            break
        small = left
        right = left + 1
        if right < n and _less(ev, h, right, left):
            small = right
        _move(ev, h, i, small)
        i = small
    t = ev[h, n, E_TIME_PS]
    seq = ev[h, n, E_SEQ]
    while i > 0:  # row n rises into it
        parent = (i - 1) >> 1
        pt = ev[h, parent, E_TIME_PS]
        if pt < t or (pt == t and ev[h, parent, E_SEQ] < seq):
            break
        _move(ev, h, i, parent)
        i = parent
    _move(ev, h, i, n)


@njit(cache=True)
def schedule(ev, g, t, kind, a, b):
    """Add an event. The run loop keeps room for what one event schedules (the engine
    grows `ev` between chunks); were that ever short, the event is not written and
    g[G_OVERFLOW] stops the loop."""
    push(ev, g, t, kind, a, b)


@njit(cache=True, inline="always")
def push(ev, g, t, kind, a, b):
    """`schedule`, inlined where every hop schedules (kernel.put_on_wire, kernel.want_tx)."""
    n = g[G_HEAP]
    if n >= ev.shape[1]:
        g[G_OVERFLOW] = 1
        return
    g[G_HEAP] = n + 1
    seq = g[G_SEQ]
    g[G_SEQ] = seq + 1
    far = g[G_FAR]
    h = NEAR
    i = n - far
    if t >= g[G_SPLIT_PS]:
        g[G_FAR] = far + 1
        h = FAR
        i = far
    _lift(ev, h, i, t, seq, kind, a, b)  # one copy for either heap: push is inlined often


@njit(cache=True, inline="always")
def earliest_ps(ev, g):
    """The earliest pending event's time (the event list is not empty)."""
    if g[G_HEAP] > g[G_FAR]:
        return ev[NEAR, 0, E_TIME_PS]
    return ev[FAR, 0, E_TIME_PS]


@njit(cache=True, inline="always")
def pop(ev, g, out):
    """Remove the earliest event into out[0:E_N] (inlined into the loop); the event
    list is not empty."""
    split = earliest_ps(ev, g) + NEAR_WINDOW_PS
    if split > g[G_SPLIT_PS]:
        g[G_SPLIT_PS] = split
        far = g[G_FAR]
        near = g[G_HEAP] - far
        while far > 0 and ev[FAR, 0, E_TIME_PS] < split:  # into the near heap
            for c in range(E_N):
                out[c] = ev[FAR, 0, c]
            far -= 1
            _sink(ev, FAR, far)
            _lift(ev, NEAR, near, out[E_TIME_PS], out[E_SEQ], out[E_KIND], out[E_A], out[E_B])
            near += 1
        g[G_FAR] = far
    for c in range(E_N):
        out[c] = ev[NEAR, 0, c]
    n = g[G_HEAP] - 1
    g[G_HEAP] = n
    _sink(ev, NEAR, n - g[G_FAR])
