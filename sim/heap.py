"""The event list: a near heap, a timing wheel and a far heap of (time, key).

Every event is a row of time_ps, key, kind, a, b. The key (`tie_key`) orders the
events of one time canonically: by kind (`layout.TIE_ORDER`), then by the port,
flow or stream the event is about. Not by when it was scheduled: so the order of
events never depends on the order in which they were scheduled (which a fabric cut
into partitions, each with its own list, could not reproduce). `g[G_HEAP]` holds
the number of pending events, `g[G_FAR]` how many of them the far heap holds and
`g[G_WHEEL]` how many the wheel holds. The order of pops is that of one heap of
(time, key); two events of the same time and key (a port asked twice to look, say)
are alike, and either may go first.

`ev` has four planes of rows. The near heap `ev[NEAR]` (a binary heap) holds the
events of the present bucket: before the split time `g[G_SPLIT_PS]`, which is a
multiple of the bucket width 2**SHIFT ps (256 ps). The timing wheel holds the
events of the next BUCKETS - 1 buckets (to NEAR_WINDOW_PS, about 1 us, past the
split: a hop's frame arrival and its port's next transmit), each bucket an
unsorted list of rows in chunks of CHUNK rows of `ev[POOL]`, linked through
`ev[META]` (there too each bucket's first and last chunk and its count of
events; free chunks are a list from `g[G_FREE_CHUNK]`). The far heap `ev[FAR]`
(a binary heap) holds the rest (a paused port's resume at the end of its pause,
timers, samples), and any event no chunk was free for. A push is a row
appended to its bucket; when the near heap runs empty, the next bucket with
events becomes the present one (its rows lifted into the near heap) and the far
events the wheel now reaches move into it. So the near heap holds a bucket's
few events rather than everything within reach, and its pops stay short and in
cache. A pop takes the near heap's root, or the far heap's when that is earlier
(an event no chunk was free for), and then, were the near heap empty, moves the
next bucket in at once so that the loop's prefetch finds the next event there.
Without BUCKETS rows (a tiny list in the tests) there is no wheel: the near heap
holds the present bucket and the far heap the rest.

Both heaps move a hole rather than swapping rows: a push lifts the hole
from the end while the parent is later; a pop sinks the
hole from the root along the earlier child down to a leaf, then lifts the last
row into it from there ("bottom-up" deletion: one comparison per level on the
way down, and the last row, usually late, rarely rises).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from aifabric.sim.layout import (
    CC_TIMER_SLOTS,
    E_A,
    E_B,
    E_KEY,
    E_KIND,
    E_N,
    E_TIME_PS,
    EV_ARRIVE,
    EV_CC_TIMER,
    EV_CREDIT,
    EV_RELEASE,
    EV_SEEN,
    G_CHUNKS,
    G_FAR,
    G_FREE_CHUNK,
    G_HEAP,
    G_OVERFLOW,
    G_SPLIT_PS,
    G_WHEEL,
    TIE_ORDER,
)

NEAR, FAR, POOL, META = 0, 1, 2, 3  # planes of ev: see the module's docstring
HEAPS = 4  # planes of ev (the name the engine allocates by)
SHIFT = 8  # a wheel bucket spans 2**SHIFT ps
BUCKETS = 4096  # the wheel's buckets (a power of 2; ev needs at least this many rows)
CHUNK = 16  # rows of a bucket's chunk in ev[POOL] (a power of 2)
NEAR_WINDOW_PS = (BUCKETS - 1) << SHIFT  # how far past the present bucket the wheel reaches
# ev[META, k, M_NEXT]: the chunk after chunk k; ev[META, b, M_HEAD:]: bucket b's
M_NEXT, M_HEAD, M_TAIL, M_COUNT = 0, 1, 2, 3
TIE_RANK = np.zeros(max(TIE_ORDER) + 1, dtype=np.int64)  # kind -> its place in TIE_ORDER
TIE_RANK[list(TIE_ORDER)] = np.arange(len(TIE_ORDER))
KEY_SHIFT = 56  # a key is the kind's rank above what the event is about
STEP_BITS = 28  # a stream's events: the stream above their b (its steps: a release's order)


@njit(cache=True, inline="always")
def tie_key(kind, a, b):
    """The key that orders events of one time: the kind's place in TIE_ORDER, then what
    the event is about. An arrival: the port whose link it crossed (the low 32 bits of
    its b, `kernel.arrive_hint`; a link delivers one frame at a time). A congestion-
    control timer: its flow and which of the flow's timers. A stream's release, credit or
    step heard: the stream, then b (fewer steps first: two of one stream and time, however
    scheduled, run in one order). Every other kind: its a (a port, flow or stream; 0 for
    a sample)."""
    if kind == EV_ARRIVE:
        who = b & 0xFFFFFFFF
    elif kind == EV_CC_TIMER:
        who = a * CC_TIMER_SLOTS + b % CC_TIMER_SLOTS
    elif kind in (EV_RELEASE, EV_CREDIT, EV_SEEN):
        who = (a << STEP_BITS) | (b & ((1 << STEP_BITS) - 1))
    else:
        who = a
    return (TIE_RANK[kind] << KEY_SHIFT) | who


def pending(ev: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Every pending event's row (near heap, wheel, then far heap)."""
    far = int(g[G_FAR])
    wheel = int(g[G_WHEEL])
    rows = [ev[NEAR, : int(g[G_HEAP]) - far - wheel]]
    if wheel:
        for b in range(BUCKETS):
            c = int(ev[META, b, M_COUNT])
            k = int(ev[META, b, M_HEAD])
            while c > 0:
                rows.append(ev[POOL, k * CHUNK : k * CHUNK + min(c, CHUNK)])
                c -= CHUNK
                k = int(ev[META, k, M_NEXT])
    rows.append(ev[FAR, :far])
    return np.concatenate(rows)


def clear(ev: np.ndarray, g: np.ndarray) -> None:
    """Drop every pending event. Only the buckets' counts are reset: the other rows of
    ev[META] link chunks, read only from a bucket that counts rows, and leaving them
    untouched leaves a fresh event list's pages unwritten (the kernel's zero pages)."""
    g[G_HEAP] = g[G_FAR] = g[G_WHEEL] = g[G_CHUNKS] = g[G_FREE_CHUNK] = 0
    ev[META, :BUCKETS, M_COUNT] = 0


@njit(cache=True, inline="always")
def _less(ev, h, i, j):
    if ev[h, i, E_TIME_PS] != ev[h, j, E_TIME_PS]:
        return ev[h, i, E_TIME_PS] < ev[h, j, E_TIME_PS]
    return ev[h, i, E_KEY] < ev[h, j, E_KEY]


@njit(cache=True, inline="always")
def _move(ev, h, dst, src):
    for c in range(E_N):
        ev[h, dst, c] = ev[h, src, c]


@njit(cache=True, inline="always")
def _lift(ev, h, i, t, key, kind, a, b):
    """Put the row (t, key, kind, a, b) into heap h's hole at the end, row i."""
    while i > 0:
        parent = (i - 1) >> 1
        pt = ev[h, parent, E_TIME_PS]
        if t > pt or (t == pt and key >= ev[h, parent, E_KEY]):
            break
        _move(ev, h, i, parent)
        i = parent
    ev[h, i, E_TIME_PS] = t
    ev[h, i, E_KEY] = key
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
    key = ev[h, n, E_KEY]
    while i > 0:  # row n rises into it
        parent = (i - 1) >> 1
        pt = ev[h, parent, E_TIME_PS]
        if pt < t or (pt == t and ev[h, parent, E_KEY] <= key):
            break
        _move(ev, h, i, parent)
        i = parent
    _move(ev, h, i, n)


@njit(cache=True, inline="always")
def schedule(ev, g, t, kind, a, b):
    """Add an event. The run loop keeps room for what one event schedules (the engine
    grows `ev` between chunks); were that ever short, the event is not written and
    g[G_OVERFLOW] stops the loop. It passes every argument on as int64: numba compiles a
    called kernel once per set of argument types, and a constant (`EV_TX`) or an int32 (a
    packet row's field) is a type of its own: called directly, the loop's calls would
    compile 18 copies of `push` (about 0.6 s each), four of them while the loop itself
    is typed."""
    _schedule(ev, g, np.int64(t), np.int64(kind), np.int64(a), np.int64(b))


@njit(cache=True)
def _schedule(ev, g, t, kind, a, b):
    """`schedule`, called: one copy for the loop's arrays and one for Python's."""
    push(ev, g, t, kind, a, b)


@njit(cache=True, inline="always")
def _put(ev, g, t, key, kind, a, b):
    """Append the row to its wheel bucket's last chunk; False: no chunk free (or no wheel)."""
    if ev.shape[1] < BUCKETS:  # too few rows for the buckets' heads: no wheel
        return False
    bk = (t >> SHIFT) & (BUCKETS - 1)
    c = ev[META, bk, M_COUNT]
    slot = c & (CHUNK - 1)
    if slot == 0:  # a new chunk: from the free list, or one never used
        k = g[G_FREE_CHUNK] - 1
        if k >= 0:
            g[G_FREE_CHUNK] = ev[META, k, M_NEXT] + 1
        else:
            k = g[G_CHUNKS]
            if (k + 1) * CHUNK > ev.shape[1]:
                return False
            g[G_CHUNKS] = k + 1
        if c == 0:
            ev[META, bk, M_HEAD] = k
        else:
            ev[META, ev[META, bk, M_TAIL], M_NEXT] = k
        ev[META, bk, M_TAIL] = k
    r = ev[META, bk, M_TAIL] * CHUNK + slot
    ev[POOL, r, E_TIME_PS] = t
    ev[POOL, r, E_KEY] = key
    ev[POOL, r, E_KIND] = kind
    ev[POOL, r, E_A] = a
    ev[POOL, r, E_B] = b
    ev[META, bk, M_COUNT] = c + 1
    g[G_WHEEL] += 1
    return True


@njit(cache=True, inline="always")
def push(ev, g, t, kind, a, b):
    """`schedule`, inlined where every hop schedules (kernel.start_frame: a frame's arrival
    and its port's next look, at one call site)."""
    n = g[G_HEAP]
    if n >= ev.shape[1]:
        g[G_OVERFLOW] = 1
        return
    g[G_HEAP] = n + 1
    key = tie_key(kind, a, b)
    split = g[G_SPLIT_PS]
    far = g[G_FAR]
    h = NEAR
    i = n - far - g[G_WHEEL]
    if t >= split:
        if t < split + NEAR_WINDOW_PS and _put(ev, g, t, key, kind, a, b):
            return
        g[G_FAR] = far + 1
        h = FAR
        i = far
    _lift(ev, h, i, t, key, kind, a, b)  # one copy for either heap: push is inlined often


@njit(cache=True)
def advance(ev, g):
    """`_advance` by a call, where it is rare (`peek`: only at the start of a run)."""
    _advance(ev, g)


@njit(cache=True, inline="always")
def _advance(ev, g):
    """The near heap is empty: make the wheel's next bucket with events the present one
    (its rows into the near heap), then move the far events the wheel now reaches into
    it. With the wheel empty, the far heap's earliest event's bucket becomes the present.
    Inlined into `take`: most pops leave the near heap empty (a bucket holds a few
    events), and a call passed both arrays one field at a time."""
    split = g[G_SPLIT_PS]
    if g[G_WHEEL] > 0:
        b = split >> SHIFT
        while ev[META, b & (BUCKETS - 1), M_COUNT] == 0:
            b += 1
    else:
        t = ev[FAR, 0, E_TIME_PS]
        if t < split:  # a far event in the present bucket (no chunk was free): pop takes it
            return
        b = t >> SHIFT
    split = (b + 1) << SHIFT
    g[G_SPLIT_PS] = split
    near = 0
    if g[G_WHEEL] > 0:  # bucket b's rows into the near heap, its chunks onto the free list
        bk = b & (BUCKETS - 1)
        c = ev[META, bk, M_COUNT]
        k = ev[META, bk, M_HEAD]
        j = 0
        while j < c:
            r = k * CHUNK
            for i in range(r, r + min(CHUNK, c - j)):
                _lift(ev, NEAR, near, ev[POOL, i, E_TIME_PS], ev[POOL, i, E_KEY],
                      ev[POOL, i, E_KIND], ev[POOL, i, E_A], ev[POOL, i, E_B])  # fmt: skip
                near += 1
            j += CHUNK
            nxt = ev[META, k, M_NEXT]
            ev[META, k, M_NEXT] = g[G_FREE_CHUNK] - 1
            g[G_FREE_CHUNK] = k + 1
            k = nxt
        ev[META, bk, M_COUNT] = 0
        g[G_WHEEL] -= c
    horizon = split + NEAR_WINDOW_PS
    far = g[G_FAR]
    while far > 0 and ev[FAR, 0, E_TIME_PS] < horizon:
        t = ev[FAR, 0, E_TIME_PS]
        key = ev[FAR, 0, E_KEY]
        kind = ev[FAR, 0, E_KIND]
        a = ev[FAR, 0, E_A]
        bb = ev[FAR, 0, E_B]
        if t < split:
            _lift(ev, NEAR, near, t, key, kind, a, bb)
            near += 1
        elif not _put(ev, g, t, key, kind, a, bb):
            break
        far -= 1
        g[G_FAR] = far
        _sink(ev, FAR, far)


@njit(cache=True, inline="always")
def earliest_ps(ev, g):
    """The earliest pending event's time (the event list is not empty)."""
    return peek(ev, g)[1]


@njit(cache=True, inline="always")
def peek(ev, g):
    """The heap that holds the earliest pending event (NEAR or FAR) and its time; the
    event list is not empty. Were the near heap empty, the next bucket moves in first."""
    far = g[G_FAR]
    if g[G_HEAP] == far + g[G_WHEEL]:
        advance(ev, g)
        far = g[G_FAR]
        if g[G_HEAP] == far + g[G_WHEEL]:
            return FAR, ev[FAR, 0, E_TIME_PS]
    t = ev[NEAR, 0, E_TIME_PS]
    if far > 0:
        ft = ev[FAR, 0, E_TIME_PS]
        if ft < t or (ft == t and ev[FAR, 0, E_KEY] < ev[NEAR, 0, E_KEY]):
            return FAR, ft
    return NEAR, t


@njit(cache=True, inline="always")
def take(ev, g, h):
    """Remove the root of heap h, which `peek` found the earliest: its (kind, a, b). As
    a tuple, not an array's row, so that the loop holds no counted array (each pop would
    take and drop a reference, an atomic add each way and a call that spills registers).
    Were the near heap left empty, the next bucket moves in at once, where the loop's
    prefetch finds the next event."""
    kind = ev[h, 0, E_KIND]
    a = ev[h, 0, E_A]
    b = ev[h, 0, E_B]
    far = g[G_FAR]
    if h == FAR:
        n = far - 1
        g[G_FAR] = n
    else:
        n = g[G_HEAP] - far - g[G_WHEEL] - 1
    left = g[G_HEAP] - 1
    g[G_HEAP] = left
    _sink(ev, h, n)
    if left > 0 and left == g[G_FAR] + g[G_WHEEL]:
        _advance(ev, g)
    return kind, a, b


@njit(cache=True, inline="always")
def pop(ev, g, out):
    """Remove the earliest event into out[0:E_N]; the event list is not empty."""
    h, t = peek(ev, g)
    out[E_TIME_PS] = t
    out[E_KEY] = ev[h, 0, E_KEY]
    out[E_KIND], out[E_A], out[E_B] = take(ev, g, h)
