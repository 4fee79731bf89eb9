"""A partition's thread, window after window, inside numba and without the GIL.

`aifabric.sim.partition` runs each partition in a thread of its own. Between two windows
every partition takes what the others sent it, runs to the window's end, says where it
is and waits for the others: a few microseconds of work when the fabric is cut finely,
which Python's threads (a lock, the GIL) would turn into a hundred. So each thread runs
`windows`: it loops over windows itself and waits for the others by spinning on a flag
per thread (an atomic store with release order after its figures are written, loads
with acquire order), and returns to Python only when the state needs room (the driver
grows an array and calls again: `ctl` holds where it was), to apply a fault during the
run (windows end before its time, and every thread returns at the next one), to report
progress, or at the end. Spinning keeps a core busy, so it is used with no more
partitions than cores.

`windows` calls the event loop at the address of its machine code (`loop_address`), not as
numba calls a kernel: numba would link the loop's code into `windows`' and optimize and
compile it all again, 8 of the 9.5 s `windows` took to compile; called this way, the loop
stays out of `windows`, which compiles in about 6.5 s, beside the loop's own compile.
"""

from __future__ import annotations

import numba
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from aifabric.sim import kernel
from aifabric.sim import layout as L
from aifabric.sim.heap import peek

# why `windows` returned
(
    W_END,  # the run's last event is behind this partition: done
    W_GROW_EVENTS,  # the event list needs room for ctl[C_NEED] more rows
    W_GROW_PACKETS,  # the packet pool needs ctl[C_NEED] more free rows
    W_DRAIN_SAMPLES,
    W_DRAIN_CAPTURE,
    W_YIELD,  # a while has passed: progress, a stop asked for
    W_STALL,  # no data delivered anywhere for the stall time while flows are unfinished
    W_ABORT,  # another thread gave up (flags[n] set)
    W_SPILL,  # the outbox is full: the driver keeps its rows aside (ctl[C_SPILLED])
    W_TAKE_SPILLED,  # others spilled rows for this window: the driver injects them first
    W_OVERFLOW,  # a reserve ran out of room: a bug
    W_FAULT,  # the window begins at or after the next fault's time (ctl[C_FAULT_T]): apply it
) = range(12)

# a thread's place (ctl[...]), kept across calls
(
    C_W,  # the window
    C_PHASE,  # what it does next in it (P_* below)
    C_T0,  # the window's first picosecond
    C_EPOCH,  # the barriers it has passed
    C_REACHED,  # 1 once the partition ended its quota's last flow
    C_LAST_T,  # the (time, key) of the event that did
    C_LAST_KEY,
    C_END_T,  # the run's last event
    C_END_KEY,
    C_NEED,  # rows the driver must make room for (W_GROW_*)
    C_STALL_PS,
    C_SPILLED,  # chunks of this window's outbox the driver keeps aside
    C_SPILL_TAKEN,  # 1: the driver injected what the others spilled in the window before
    C_FAULT_T,  # the time of the next fault during the run (NEVER: none)
    C_YIELD_EVENTS,  # thread 0: its partition's events when it last returned (W_YIELD)
    C_YIELD_EVERY,  # thread 0 returns after this many events of its partition, or windows
    C_N,
) = range(17)
# phases of a window
PH_TAKE, PH_RUN, PH_WAIT, PH_ON, PH_WAIT_ON, PH_NEXT, PH_END = range(7)
# what a thread publishes after its part of a window (sync[window % 2, thread, ...])
Y_REACHED, Y_LAST_T, Y_LAST_KEY, Y_FIRST, Y_PROGRESS, Y_OUT, Y_SPILLED, Y_N = range(8)
YIELD_WINDOWS = 512  # windows between two returns of thread 0 (progress, a stop asked for)
YIELD_EVENTS = 1 << 22  # or events of its partition (a second or less): big runs' windows
# are long (cluster-24k: a third of a second each)
NEVER = kernel.NEVER


def _pointer(context, builder, aryty, ary_value, index):
    ary = context.make_array(aryty)(context, builder, value=ary_value)
    return cgutils.get_item_pointer2(
        context, builder, ary.data, cgutils.unpack_tuple(builder, ary.shape),
        cgutils.unpack_tuple(builder, ary.strides), aryty.layout, [index],
        wraparound=False, boundscheck=False,
    )  # fmt: skip


@intrinsic
def load_acquire(typingctx, arr, i):
    """arr[i] (int64), loaded with acquire order: what its writer wrote before it stored
    there with release order (`store_release`) is seen too."""

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = _pointer(context, builder, sig.args[0], args[0], i)
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(arr, i), codegen


@intrinsic
def store_release(typingctx, arr, i, v):
    """arr[i] = v (int64), stored with release order (after every write before it)."""

    def codegen(context, builder, sig, args):
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = _pointer(context, builder, sig.args[0], args[0], i)
        builder.store_atomic(args[2], ptr, "release", 8)
        return context.get_dummy_value()

    return types.void(arr, i, v), codegen


@intrinsic
def call_loop(typingctx, loop, S, t_stop, max_events):
    """kernel.run(S, t_stop, max_events), called at `loop`, the address of its machine code
    compiled for S's type (`loop_address`); what it raises, this raises."""
    if not isinstance(loop, types.Integer):
        return None
    sig = types.int64(types.int64, S, types.int64, types.int64)

    def codegen(context, builder, sig, args):
        argtys = sig.args[1:]
        fnty = context.call_conv.get_function_type(sig.return_type, argtys)
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        status, res = context.call_conv.call_function(
            builder, fn, sig.return_type, argtys, args[1:]
        )
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return res

    return sig, codegen


def loop_address(state, loop=kernel.run) -> int:
    """The address of the event loop's machine code (`kernel.run`, or a kernel of the same
    arguments) compiled for `state`'s type and int64 bounds, loaded or compiled now: what
    `windows` calls through `call_loop`."""
    sig = (numba.typeof(state), types.int64, types.int64)
    loop.compile(sig)
    cres = loop.overloads[sig]
    if cres.signature.return_type != types.int64:
        raise TypeError(f"{loop.__name__} returns {cres.signature.return_type}, not int64")
    address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    if not address:
        raise RuntimeError(f"{loop.__name__}'s compiled code defines no entry point")
    return address


@njit(cache=True, inline="always")
def _arrive_and_wait(flags, k, n, ctl):
    """The barrier: this thread is at it (flags[k] = its epoch); wait until every thread
    is. False: a thread gave up (flags[n])."""
    epoch = ctl[C_EPOCH] + 1
    ctl[C_EPOCH] = epoch
    store_release(flags, k, epoch)
    for j in range(n):
        while load_acquire(flags, j) < epoch:
            if load_acquire(flags, n):
                return False
    return True


@njit(cache=True, inline="always")
def _publish(S, k, sync, slot, ctl):
    g, out = S.g, S.out
    first = peek(S.ev, g)[1]
    for r in range(g[L.G_OUT]):
        first = min(first, out[r, L.O_TIME_PS])
    y = sync[slot, k]
    y[Y_REACHED] = ctl[C_REACHED]
    y[Y_LAST_T] = ctl[C_LAST_T]
    y[Y_LAST_KEY] = ctl[C_LAST_KEY]
    y[Y_FIRST] = first
    y[Y_PROGRESS] = g[L.G_PROGRESS_T_PS]
    y[Y_OUT] = g[L.G_OUT]
    y[Y_SPILLED] = ctl[C_SPILLED]


@njit(cache=True, inline="always")
def _code(code):
    """`windows`' answer to a loop's code that needs the driver."""
    if code == L.R_GROW_EVENTS:
        return W_GROW_EVENTS
    if code == L.R_GROW_PACKETS:
        return W_GROW_PACKETS
    if code == L.R_DRAIN_SAMPLES:
        return W_DRAIN_SAMPLES
    if code == L.R_DRAIN_CAPTURE:
        return W_DRAIN_CAPTURE
    if code == L.R_DRAIN_OUT:
        return W_SPILL
    return W_OVERFLOW


@njit(cache=True, inline="always")
def _window_end(ctl, lookahead):
    """The window's last picosecond: a lookahead on, or just before the next fault."""
    return min(ctl[C_T0] + lookahead, ctl[C_FAULT_T]) - 1


@njit(cache=True, nogil=True)
def windows(S0, S1, k, n, lookahead, box, sync, flags, ctl, budget, loop):
    """Partition k's thread: window after window until the run's end or until the driver is
    needed (W_*). S0 and S1 are its state with the outbox of even and of odd windows
    (box[0, k] and box[1, k]: box holds every partition's); sync what each published;
    flags the barrier; loop the event loop's address for S0's type (`loop_address`)."""
    g, prm = S0.g, S0.prm
    while True:
        w = ctl[C_W]
        slot = w & 1
        S = S0 if slot == 0 else S1
        phase = ctl[C_PHASE]
        t_run = -1  # the phases that run the loop set how far; it runs once, below
        if phase == PH_TAKE:  # what the others sent in the window before
            if w > 0:
                need = 0
                spilled = 0
                for j in range(n):
                    if j != k:
                        need += sync[slot ^ 1, j, Y_OUT]
                        spilled += sync[slot ^ 1, j, Y_SPILLED]
                if spilled and not ctl[C_SPILL_TAKEN]:
                    return W_TAKE_SPILLED
                if g[L.G_NFREE] < need + prm[L.P_PACKET_RESERVE]:
                    ctl[C_NEED] = need
                    return W_GROW_PACKETS
                if S.ev.shape[1] - prm[L.P_EVENT_RESERVE] < g[L.G_HEAP] + need:
                    ctl[C_NEED] = need
                    return W_GROW_EVENTS
                for j in range(n):
                    if j != k:
                        kernel.inject(S, box[slot ^ 1, j], sync[slot ^ 1, j, Y_OUT], k)
            g[L.G_OUT] = 0
            ctl[C_SPILLED] = 0
            ctl[C_SPILL_TAKEN] = 0
            ctl[C_PHASE] = PH_RUN
        elif phase == PH_RUN:  # to the window's end, or to the event that ends the quota
            if ctl[C_FAULT_T] <= ctl[C_T0]:  # every thread, at the same window
                return W_FAULT
            if ctl[C_REACHED]:
                _publish(S, k, sync, slot, ctl)
                ctl[C_PHASE] = PH_WAIT
            else:
                t_run = _window_end(ctl, lookahead)
        elif phase == PH_WAIT:
            if not _arrive_and_wait(flags, k, n, ctl):
                return W_ABORT
            reached = 0
            end_t, end_key = -1, -1
            for j in range(n):
                y = sync[slot, j]
                reached += y[Y_REACHED]
                if y[Y_LAST_T] > end_t or (y[Y_LAST_T] == end_t and y[Y_LAST_KEY] > end_key):
                    end_t, end_key = y[Y_LAST_T], y[Y_LAST_KEY]
            if reached == n:  # the run ends with the latest quota's last event
                ctl[C_END_T] = end_t
                ctl[C_END_KEY] = end_key
                ctl[C_PHASE] = PH_END
            elif reached:
                ctl[C_PHASE] = PH_ON
            else:
                ctl[C_PHASE] = PH_NEXT
        elif phase == PH_ON:  # past its quota: to the window's end, once all are there
            if ctl[C_REACHED]:
                t_run = _window_end(ctl, lookahead)
            else:
                ctl[C_PHASE] = PH_WAIT_ON
        elif phase == PH_WAIT_ON:
            if not _arrive_and_wait(flags, k, n, ctl):
                return W_ABORT
            ctl[C_PHASE] = PH_NEXT
        elif phase == PH_NEXT:
            # the next window begins at the earliest event, or at the next fault's time: what
            # the fault sends across the cut then comes a lookahead after it, in time
            t0 = ctl[C_FAULT_T]
            progressed = 0
            for j in range(n):
                t0 = min(t0, sync[slot, j, Y_FIRST])
                progressed = max(progressed, sync[slot, j, Y_PROGRESS])
            window_end = _window_end(ctl, lookahead)
            ctl[C_T0] = t0
            ctl[C_W] = w + 1
            ctl[C_PHASE] = PH_TAKE
            if window_end - progressed > ctl[C_STALL_PS]:
                return W_STALL
            if k == 0 and (
                (w + 1) % YIELD_WINDOWS == 0
                or g[L.G_EVENTS] - ctl[C_YIELD_EVENTS] >= ctl[C_YIELD_EVERY]
            ):
                ctl[C_YIELD_EVENTS] = g[L.G_EVENTS]
                return W_YIELD
        else:  # PH_END: to the run's last event, with its key
            if ctl[C_LAST_T] == ctl[C_END_T] and ctl[C_LAST_KEY] == ctl[C_END_KEY]:
                return W_END
            g[L.G_KEY_STOP] = ctl[C_END_KEY]
            t_run = ctl[C_END_T]
        if t_run < 0:
            continue
        code = call_loop(loop, S, t_run, budget)  # then what the phase does with its answer
        if code == L.R_LIMIT:  # the budget of events: again, after the driver's turn
            if phase == PH_END:
                g[L.G_KEY_STOP] = NEVER
            continue
        if phase == PH_RUN:
            if code == L.R_DONE:
                ctl[C_REACHED] = 1
                ctl[C_LAST_T] = g[L.G_NOW_PS]
                ctl[C_LAST_KEY] = g[L.G_LAST_KEY]
                prm[L.P_QUOTA] = NEVER
            elif code != L.R_STOP:
                return _code(code)
            _publish(S, k, sync, slot, ctl)
            ctl[C_PHASE] = PH_WAIT
        elif phase == PH_ON:
            if code != L.R_STOP:
                return _code(code)
            _publish(S, k, sync, slot, ctl)
            ctl[C_PHASE] = PH_WAIT_ON
        else:  # PH_END
            g[L.G_KEY_STOP] = NEVER
            if code != L.R_STOP and code != L.R_DONE:
                return _code(code)
            return W_END
