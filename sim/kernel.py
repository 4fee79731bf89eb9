"""The event loop and the components it drives: pipes (serialization, propagation),
switch egress ports (queues + ECN + PFC), NIC senders and receivers.

State is one `layout.State` named tuple `S` of flat arrays (`layout` names their
columns); congestion control is a component behind the hooks of `congestion`.

`run` processes events until the flows are done, a time or event budget is
reached, or a buffer needs room; the Python layer then grows or drains it
and calls again: the state carries over, so a run can stop anywhere.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.datamodel import models, register_default
from numba.extending import intrinsic

from aifabric.fabric.addressing import ROCE_UDP_PORT
from aifabric.fabric.routing import MODE_SPRAY, Live, Net, flow_hash, is_next_hop, route_packet
from aifabric.sim import buffer, congestion, ecn, pfc
from aifabric.sim.heap import NEAR, peek, push, schedule, take
from aifabric.sim.layout import (
    ACK_EXTRA_BYTES,
    CC_NONE,
    CNP_EXTRA_BYTES,
    CP_ARG,
    CP_BYTES,
    CP_CE,
    CP_FLOW,
    CP_KIND,
    CP_PORT,
    CP_PSN,
    CP_TIME,
    CREDIT_SLOTS,
    CTS_EXTRA_BYTES,
    DO_CNP,
    DO_GRANT,
    DO_KICK,
    DO_REARM,
    DO_REPACE,
    DO_REQUEST,
    E_A,
    E_B,
    E_KEY,
    E_KIND,
    EV_ACK_RTO,
    EV_ARRIVE,
    EV_CC_TIMER,
    EV_CREDIT,
    EV_DEP,
    EV_FLOW_START,
    EV_LOST,
    EV_PFC,
    EV_PFC_REFRESH,
    EV_RELEASE,
    EV_RETX,
    EV_RTO,
    EV_SAMPLE,
    EV_SEEN,
    EV_TX,
    FL_ACKED_BYTES,
    FL_ACKED_PSN,
    FL_BASE_PS,
    FL_BYTES,
    FL_DELIV_BYTES,
    FL_DEPS,
    FL_DQPN,
    FL_DST,
    FL_EARLIEST_PS,
    FL_GEN,
    FL_GROUP,
    FL_HELD_BYTES,
    FL_LAST_TX_PS,
    FL_LAST_WIRE_BYTES,
    FL_LAT_PS,
    FL_MAY_REORDER,
    FL_NAKED,
    FL_NEXT_SEND_PS,
    FL_OP,
    FL_PACE_PS,
    FL_PACER,
    FL_PSN,
    FL_QP,
    FL_READY_PS,
    FL_REWIND_PS,
    FL_RX_PSN,
    FL_SENT_PKTS,
    FL_SLOT,
    FL_SPORT,
    FL_SRC,
    FL_STATE,
    FL_STEPS_DONE,
    FL_T_END_PS,
    FL_T_RECEIVED_PS,
    FL_T_START_PS,
    FL_UNACKED,
    FL_UNSENT_BYTES,
    FL_WATCH_BYTES,
    FR_LINE_BPS,
    FR_PACE_BPS,
    FR_RC_BPS,
    FR_RT_BPS,
    G_CAPS,
    G_CNP,
    G_DONE,
    G_DROPS,
    G_ECN,
    G_EVENTS,
    G_FAR,
    G_FREE,
    G_HEAP,
    G_HOPS,
    G_KEY_STOP,
    G_LAST_KEY,
    G_NFREE,
    G_NOW_PS,
    G_OUT,
    G_OVERFLOW,
    G_PFC,
    G_PROGRESS_T_PS,
    G_PURGING,
    G_RETX_BYTES,
    G_SAMPLE_T_PS,
    G_SAMPLES,
    G_STUCK,
    G_WHEEL,
    GR_BYTES,
    GR_CHUNK,
    GR_DONE,
    GR_EMPTY,
    GR_FLOW0,
    GR_IN_N,
    GR_IN_OFF,
    GR_LAT_PS,
    GR_LOOP,
    GR_NQP,
    GR_OFFSET,
    GR_OUT_N,
    GR_OUT_OFF,
    GR_PROP_PS,
    GR_RELEASED,
    GR_RR,
    GR_SCHED,
    GR_SEEN,
    GR_STARTED,
    GR_STEPS,
    GR_WINDOW,
    K_ACK,
    K_CNP,
    K_CTS,
    K_DATA,
    K_PFC,
    K_REQ,
    ND_CNT,
    ND_OFF,
    ND_PART,
    ND_RR,
    O_A,
    O_B,
    O_KIND,
    O_PART,
    O_PC,
    O_PK,
    O_TIME_PS,
    P_ACK_EVERY,
    P_ADAPTIVE,
    P_CC,
    P_EVENT_RESERVE,
    P_FINISH_AT_SENDER,
    P_GO_BACK_N,
    P_LOOKAHEAD_PS,
    P_MTU_BYTES,
    P_OUT_RESERVE,
    P_OVERHEAD_BYTES,
    P_PACKET_RESERVE,
    P_PART,
    P_PARTITIONED,
    P_QUOTA,
    P_RTO_PS,
    P_SAMPLE_PS,
    P_SPRAY,
    P_STALL_PS,
    PC_ARG,
    PC_N,
    PC_OFFSET_BYTES,
    PC_PSN,
    PFC_WIRE_BYTES,
    PK_BYTES,
    PK_CE,
    PK_FLOW,
    PK_HOP,
    PK_KIND,
    PK_N,
    PK_NEXT,
    PK_NHOPS,
    PK_ROUTE,
    PK_WIRE_BYTES,
    PS_PER_NS,
    PT_ALIVE,
    PT_BUF_BYTES,
    PT_CAPTURE,
    PT_DELAY_PS,
    PT_ECN_ON,
    PT_FAR_PART,
    PT_FREE_AT_PS,
    PT_HEAD0,
    PT_HEAD1,
    PT_HEADROOM_BYTES,
    PT_IS_NIC,
    PT_KMAX_BYTES,
    PT_KMIN_BYTES,
    PT_NODE,
    PT_PAUSE_UNTIL_PS,
    PT_PFC_ON,
    PT_PFC_PENDING,
    PT_PURGE,
    PT_Q0_BYTES,
    PT_Q1_BYTES,
    PT_QUANTA,
    PT_RATE_BPS,
    PT_REFRESH,
    PT_RNG,
    PT_S_CNP,
    PT_S_DROPS,
    PT_S_ECN,
    PT_S_PAUSED_PS,
    PT_S_PFC,
    PT_S_QINT_BYTE_PS,
    PT_S_QMAX_BYTES,
    PT_S_QT_PS,
    PT_S_TX_BYTES,
    PT_SHARED,
    PT_TXEV_PS,
    PT_WAKE_PS,
    PT_XOFF,
    R_DONE,
    R_DRAIN_CAPTURE,
    R_DRAIN_OUT,
    R_DRAIN_SAMPLES,
    R_GROW_EVENTS,
    R_GROW_PACKETS,
    R_LIMIT,
    R_OVERFLOW,
    R_STALLED,
    R_STOP,
    SM_CNP_SENT,
    SM_DROPS,
    SM_ECN_MARKED,
    SM_PAUSED_NS,
    SM_PFC_SENT,
    SM_QDEPTH_MAX_BYTES,
    SM_QDEPTH_MEAN_BYTES,
    SM_TX_BYTES,
    ST_ACTIVE,
    ST_DONE,
    ST_NOPATH,
    ST_SENT,
    State,
)
from aifabric.sim.pipeline import LoopCompiler
from aifabric.sim.queue import depth_bytes, dequeue, enqueue, settle


class BorrowedArray(types.Array):
    """An array the loop uses without counting references to it (see `_borrow`)."""

    def __init__(self, dtype, ndim, layout):
        super().__init__(dtype, ndim, layout, name=f"borrowed({dtype}, {ndim}d, {layout})")


@register_default(BorrowedArray)
class BorrowedArrayModel(models.StructModel):
    """An array's fields, its meminfo an untracked pointer: numba emits no reference
    counting for a value that holds no meminfo (`NRT_incref` and `NRT_decref` are calls)."""

    def __init__(self, dmm, fe_type):
        members = [
            ("meminfo", types.voidptr),
            ("parent", types.pyobject),
            ("nitems", types.intp),
            ("itemsize", types.intp),
            ("data", types.CPointer(fe_type.dtype)),
            ("shape", types.UniTuple(types.intp, fe_type.ndim)),
            ("strides", types.UniTuple(types.intp, fe_type.ndim)),
        ]
        super().__init__(dmm, fe_type, members)


@intrinsic
def _borrow(typingctx, arr):
    """The same array as a `BorrowedArray`, with no reference count (meminfo and parent NULL).

    The kernel's helpers take the whole state tuple, and numba counts a reference to
    each of its arrays where a helper takes it and again where the helper is done with
    it: a call of NRT_incref and one of NRT_decref per array per helper call. With NULL
    meminfos they do nothing, yet compiling none cut the demo's time by a third. A value
    of this type holds no meminfo, so no such call is compiled. The caller of `run` keeps
    the real arrays alive; a view of a borrowed array (a row, a slice) is an ordinary
    array with a NULL meminfo.
    """
    ty = BorrowedArray(arr.dtype, arr.ndim, arr.layout)

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, value=args[0])
        out = context.make_array(sig.return_type)(context, builder)
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        out.parent = cgutils.get_null_value(out.parent.type)
        for name in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(out, name, getattr(src, name))
        return out._getvalue()

    return ty(arr), codegen


@intrinsic
def prefetch(typingctx, arr, i, j):
    """Hint the CPU to bring the cache line of arr[i, j] into the cache; no effect on results.

    The loop peeks at the next event while it handles the current one, so that the
    packet and port rows the next event needs (usually not touched since it was queued,
    and on a large fabric out of every cache) are on their way in the meantime.
    """

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, value=args[0])
        row = context.cast(builder, args[1], sig.args[1], types.intp)
        col = context.cast(builder, args[2], sig.args[2], types.intp)
        ptr = cgutils.get_item_pointer2(
            context, builder, ary.data, cgutils.unpack_tuple(builder, ary.shape),
            cgutils.unpack_tuple(builder, ary.strides), aryty.layout,
            [row, col], wraparound=False, boundscheck=False,
        )  # fmt: skip
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read, keep in all levels, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, i, j), codegen


@njit(cache=True)
def borrowed(S):
    """`S` with every array borrowed (see `_borrow`)."""
    net, live = S.net, S.live
    return State(
        _borrow(S.g), _borrow(S.prm), _borrow(S.fprm), _borrow(S.pt), _borrow(S.pmax),
        _borrow(S.fl), _borrow(S.fr), _borrow(S.nd), _borrow(S.act), _borrow(S.pk),
        _borrow(S.pc), _borrow(S.ev), _borrow(S.path_ptr), _borrow(S.path_port),
        _borrow(S.dep_ptr), _borrow(S.dep), _borrow(S.smp), _borrow(S.cap),
        Net(
            _borrow(net.nic_port), _borrow(net.nic_switch), _borrow(net.port_peer),
            _borrow(net.adj_ptr), _borrow(net.adj_port), _borrow(net.sw_ord),
            _borrow(net.leaf_ord),
        ),
        Live(
            _borrow(live.port_alive), _borrow(live.dist), _borrow(live.dist0),
            _borrow(live.seeds), _borrow(live.crc_table),
        ),
        _borrow(S.nic_ip), _borrow(S.load), _borrow(S.rnd), _borrow(S.gr), _borrow(S.gio),
        _borrow(S.gx), _borrow(S.out),
    )  # fmt: skip


@njit(cache=True)
def purge_port(S_counted, p, now):
    """`purge` for the Python layer (a fault takes a port down), on the state as `run`
    holds it: the loop's one compiled copy, not a second one for counted arrays."""
    return purge(borrowed(S_counted), p, now)


@njit(cache=True)
def sample(S_counted, now):
    """`close_sample` for the Python layer (the run's last interval), as `purge_port`."""
    close_sample(borrowed(S_counted), now)


PS_PER_S_BITS = 8 * 1_000_000_000_000  # ps per second, times 8 bits per byte
NEVER = np.int64(2**62)


# pipes ----------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def serialization_ps(wire_bytes, rate_bps):
    return (wire_bytes * PS_PER_S_BITS + rate_bps - 1) // rate_bps


@njit(cache=True, inline="always")
def want_tx(S, p, t):
    """Make sure port p looks for work again at time t (`tx_event`). Where a hop asks it
    of the port it left, `start_frame` does this itself, in its one push."""
    tx_event(S.pt, S.ev, S.g, p, t)


@njit(cache=True)
def wait_tx(pt, ev, g, p, t):
    """`want_tx` by a call, where a port waits (a pause, a PFC frame sent, a flow without a
    path): rare on a hop's path, and each of `start_frame`'s copies has less to compile.

    A port paused by PFC waits until the pause ends, often hundreds of microseconds ahead,
    and most pauses are lifted early (an XON) and taken again: an event per pause would
    leave one superseded event per pause in the far heap (250,000 on a k=16 permutation).
    So one event this pushed and still to come (its time in PT_WAKE_PS) carries any look
    asked this way for the same time or later: when it comes up, the loop pushes the
    port's live look (`carry`). An earlier look gets an event of its own, and the carrier
    stays. Events of one time run in an order that does not depend on when they were
    pushed, so the port looks at the same times as with an event each.

    A carrier is still to come while its time is later than now: one at now or before
    has come up (or is about to, and pushing an event of the same time is harmless)."""
    if pt[p, PT_TXEV_PS] == t:
        return
    pt[p, PT_TXEV_PS] = t
    w = pt[p, PT_WAKE_PS]
    if g[G_NOW_PS] < w <= t:
        return
    if w <= g[G_NOW_PS]:
        pt[p, PT_WAKE_PS] = t
    push(ev, g, t, EV_TX, p, pt[p, PT_HEAD1])


@njit(cache=True, inline="always")
def carry(pt, ev, g, p, now):
    """An EV_TX of port p came up at `now` that the port's live look no longer matches:
    if it was the carrier `wait_tx` pushed and the live look is later, push that look (an
    event of its own, or a copy of one the loop then passes over: two EV_TX of one port
    and time run as one)."""
    if pt[p, PT_WAKE_PS] == now:
        t = pt[p, PT_TXEV_PS]
        if t > now:
            pt[p, PT_WAKE_PS] = t
            schedule(ev, g, t, EV_TX, p, pt[p, PT_HEAD1])


@njit(cache=True, inline="always")
def tx_event(pt, ev, g, p, t):
    """Port p's one live EV_TX is at PT_TXEV_PS: a new time replaces it, and the loop
    passes over the event it replaced when that comes up (a port asks for a later look
    only when nothing could start before it, and whatever changes that asks again)."""
    if pt[p, PT_TXEV_PS] != t:
        pt[p, PT_TXEV_PS] = t
        push(ev, g, t, EV_TX, p, pt[p, PT_HEAD1])


@njit(cache=True, inline="always")
def arrive_hint(p, q):
    """An EV_ARRIVE's b: the port the packet is on and the next one (-1: none), for prefetching."""
    return p | ((q + 1) << 32)


@njit(cache=True, inline="always")
def prefetch_next(S, ev):
    """Start loading the rows the near heap's earliest event will touch (see `prefetch`)."""
    pt, pk = S.pt, S.pk
    kind = ev[NEAR, 0, E_KIND]
    a = ev[NEAR, 0, E_A]
    b = ev[NEAR, 0, E_B]
    if kind == EV_ARRIVE:
        prefetch(pk, a, 0)
        p = b & 0xFFFFFFFF
        q = (b >> 32) - 1
        prefetch(pt, p, PT_ALIVE)
        prefetch(pt, p ^ 1, PT_PFC_ON)
        prefetch(pt, p ^ 1, PT_HEADROOM_BYTES)
        if q >= 0:
            prefetch(pt, q, PT_FREE_AT_PS)
            prefetch(pt, q, PT_Q0_BYTES)
    elif kind == EV_TX:
        prefetch(pt, a, PT_FREE_AT_PS)
        prefetch(pt, a, PT_Q0_BYTES)
        prefetch(pt, a, PT_ECN_ON)
        prefetch(pt, a, PT_KMIN_BYTES)
        if b >= 0:
            prefetch(pk, b, 0)


@njit(cache=True)
def record(S, p, kind, f, psn, nbytes, ce, arg, now):
    g, cap = S.g, S.cap
    c = g[G_CAPS]
    if c >= cap.shape[0]:  # the loop keeps room for what one event sends; never reached
        g[G_OVERFLOW] = 1
        return
    cap[c, CP_TIME] = now
    cap[c, CP_PORT] = p
    cap[c, CP_KIND] = kind
    cap[c, CP_FLOW] = f
    cap[c, CP_PSN] = psn
    cap[c, CP_BYTES] = nbytes
    cap[c, CP_CE] = ce
    cap[c, CP_ARG] = arg
    g[G_CAPS] = c + 1


@njit(cache=True, inline="always")
def put_on_wire(S, p, i, now):
    """Port p starts sending packet i: it arrives at the far end after serialization and
    delay. Returns that time and the arrival's b (`arrive_hint`) for the caller to push its
    EV_ARRIVE (`start_frame`, with the port's next look: one push for both); -1: none here,
    the far end is another partition's."""
    g, pt, pk, pc = S.g, S.pt, S.pk, S.pc
    ser = serialization_ps(pk[i, PK_WIRE_BYTES], pt[p, PT_RATE_BPS])
    pt[p, PT_FREE_AT_PS] = now + ser
    h = pk[i, PK_HOP] + 1
    q = pk[i, PK_ROUTE + h] if h < pk[i, PK_NHOPS] else -1
    far = pt[p, PT_FAR_PART]
    t = now + ser + pt[p, PT_DELAY_PS]
    pt[p, PT_S_TX_BYTES] += pk[i, PK_WIRE_BYTES]
    g[G_HOPS] += 1
    if pt[p, PT_CAPTURE]:
        record(
            S, p, pk[i, PK_KIND], pk[i, PK_FLOW], pc[i, PC_PSN], pk[i, PK_BYTES],
            pk[i, PK_CE], pc[i, PC_ARG], now,
        )  # fmt: skip
    if far:
        export(S, far - 1, t, np.int64(EV_ARRIVE), np.int64(i), arrive_hint(p, q))
        return np.int64(-1), np.int64(0)
    return t, arrive_hint(p, q)


@njit(cache=True)
def put_pfc_on_wire(S, p, now):
    """Port p sends its pending PFC frame (PT_PFC_PENDING: its quanta); its peer's port
    towards us is paused when it arrives, and p looks again when the frame is out. A call:
    PFC frames are rare on a hop's path, and `start_frame` has less to compile."""
    g, pt, ev = S.g, S.pt, S.ev
    quanta = pt[p, PT_PFC_PENDING]
    pt[p, PT_PFC_PENDING] = -1
    ser = serialization_ps(PFC_WIRE_BYTES, pt[p, PT_RATE_BPS])
    pt[p, PT_FREE_AT_PS] = now + ser
    far = pt[p, PT_FAR_PART]
    if far:
        t = now + ser + pt[p, PT_DELAY_PS]
        export(S, far - 1, t, np.int64(EV_PFC), np.int64(p ^ 1), np.int64(quanta))
    else:
        schedule(ev, g, now + ser + pt[p, PT_DELAY_PS], EV_PFC, p ^ 1, quanta)
    pt[p, PT_S_TX_BYTES] += PFC_WIRE_BYTES
    pt[p, PT_S_PFC] += 1
    g[G_PFC] += 1
    if pt[p, PT_CAPTURE]:
        record(S, p, K_PFC, -1, 0, 0, 0, quanta, now)
    wait_tx(pt, ev, g, p, pt[p, PT_FREE_AT_PS])


@njit(cache=True)
def export(S, part, t, kind, a, b):
    """An event at time t for partition `part` (the far end of a link): into the outbox,
    for the driver to hand over after this window (aifabric.sim.partition). An arrival
    takes its packet along: its rows are copied and the row is free here."""
    g, out = S.g, S.out
    n = g[G_OUT]
    if n >= out.shape[0]:  # the loop keeps P_OUT_RESERVE rows free; never reached
        g[G_OVERFLOW] = 1
        return
    out[n, O_TIME_PS] = t
    out[n, O_PART] = part
    out[n, O_KIND] = kind
    out[n, O_A] = a
    out[n, O_B] = b
    if kind == EV_ARRIVE:
        for j in range(PK_N):
            out[n, O_PK + j] = S.pk[a, j]
        for j in range(PC_N):
            out[n, O_PC + j] = S.pc[a, j]
        release_packet(S, a)
    g[G_OUT] = n + 1


@njit(cache=True)
def inject(S_counted, rows, n, part):
    """Of the first n outbox rows of another partition, those for partition `part` (this
    one): an arrival's packet gets a row here. The driver makes room first (packets and
    events for n rows)."""
    S = borrowed(S_counted)
    pk, pc = S.pk, S.pc
    for r in range(n):
        if rows[r, O_PART] != part:
            continue
        kind = rows[r, O_KIND]
        a = rows[r, O_A]
        if kind == EV_ARRIVE:
            a = alloc(S)
            for j in range(PK_N):
                pk[a, j] = rows[r, O_PK + j]
            for j in range(PC_N):
                pc[a, j] = rows[r, O_PC + j]
        push(S.ev, S.g, rows[r, O_TIME_PS], kind, a, rows[r, O_B])


# packets --------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def alloc(S):
    """A free packet row. The run loop keeps enough free for what one event allocates;
    were that ever short, the last row (never in the free list) is handed out as scratch
    and g[G_OVERFLOW] stops the loop."""
    g, pk = S.g, S.pk
    i = g[G_FREE]
    if i < 0:
        g[G_OVERFLOW] = 1
        i = pk.shape[0] - 1
        pk[i, PK_NEXT] = -1
        pk[i, PK_CE] = 0
        pk[i, PK_HOP] = 0
        return i
    g[G_FREE] = pk[i, PK_NEXT]
    g[G_NFREE] -= 1
    pk[i, PK_NEXT] = -1
    pk[i, PK_CE] = 0
    pk[i, PK_HOP] = 0
    return i


@njit(cache=True, inline="always")
def release_packet(S, i):
    g, pk = S.g, S.pk
    pk[i, PK_NEXT] = g[G_FREE]
    pk[i, PK_KIND] = -1
    g[G_FREE] = i
    g[G_NFREE] += 1


@njit(cache=True, inline="always")
def drop(S, i, p, now):
    """Packet i is lost at port p; the sender finds out after the retransmission timeout.
    By a call with int64 arguments (`_drop`): the loop passes a port from a packet's row,
    an int32, at most places, which would compile a second copy while the loop is typed."""
    _drop(S, np.int64(i), np.int64(p), np.int64(now))


@njit(cache=True)
def _drop(S, i, p, now):
    """`drop`'s body, compiled once."""
    g, prm, pt, pk, pc = S.g, S.prm, S.pt, S.pk, S.pc
    pt[p, PT_S_DROPS] += 1
    g[G_DROPS] += 1
    kind = pk[i, PK_KIND]
    f = pk[i, PK_FLOW]
    # the timeout is the NIC's that acts on it: with partitions, a message to its own
    # (`send`), a window or more away (the driver checks the timeout against the lookahead)
    t = now + prm[P_RTO_PS]
    sender = S.fl[f, FL_SRC]
    if kind == K_DATA:
        may_reorder(S, f, now)
    if kind == K_DATA and prm[P_GO_BACK_N]:
        send(S, sender, t, EV_RTO, f, pc[i, PC_OFFSET_BYTES])
    elif kind == K_DATA:
        send(S, sender, t, EV_RETX, f, pk[i, PK_BYTES])
    elif kind == K_CTS:
        send(S, sender, t, EV_RETX, f, -pc[i, PC_ARG])
    elif kind == K_REQ:
        send(S, sender, t, EV_RETX, f, 0)
    elif kind == K_ACK and last_ack(S, i):
        send(S, S.fl[f, FL_DST], t, EV_ACK_RTO, f, 0)
    release_packet(S, i)


@njit(cache=True, inline="always")
def may_reorder(S, f, now):
    """Data of flow f was lost: what follows it may reach the receiver out of order (a
    go-back-N receiver then checks each packet's offset: `deliver`). With partitions, the
    receiver's partition hears it a lookahead later (EV_LOST), before the flow's next packet
    can get there: that packet is behind the lost one, a link between partitions away."""
    part = elsewhere(S, S.fl[f, FL_DST])
    if part >= 0:
        t = now + S.prm[P_LOOKAHEAD_PS]
        export(S, part, t, np.int64(EV_LOST), np.int64(f), np.int64(0))
        return
    S.fl[f, FL_MAY_REORDER] = 1


@njit(cache=True, inline="always")
def last_ack(S, i):
    """Is packet i the ACK of its flow's last byte, which tells the sender it is done (and
    ends the flow when it finishes at the sender)?"""
    return S.pc[i, PC_ARG] == 0 and S.pc[i, PC_OFFSET_BYTES] >= S.fl[S.pk[i, PK_FLOW], FL_BYTES]


@njit(cache=True)
def send_control(S, f, kind, arg, now):
    """The receiver of flow f (or, for REQ, its sender) sends a control packet. Callers
    pass int64 for every argument (`np.int64(K_CTS)`, not `K_CTS`): numba compiles a called
    kernel once per argument type, and a constant is a type of its own (a literal)."""
    p = queue_control(S, f, kind, arg, now)
    if p >= 0:
        kick(S, p, now)


@njit(cache=True, inline="always")
def queue_control(S, f, kind, arg, now):
    """Queue a control packet of flow f at the port it leaves by, and return that port
    (-1: none, the packet was dropped or there is no path), whose `start_frame` sends it
    next (control before data). Inlined where an ACK is sent for delivered data
    (`deliver`), which leaves that start to the loop's one `start_frame`."""
    pt, fl, pk, pc, path_ptr, path_port = S.pt, S.fl, S.pk, S.pc, S.path_ptr, S.path_port
    a = path_ptr[f]
    n = path_ptr[f + 1] - a
    if n == 0:
        return -1
    i = alloc(S)
    pk[i, PK_FLOW] = f
    pk[i, PK_KIND] = kind
    pk[i, PK_BYTES] = 0
    # a request is its sender's; the rest its receiver's, carrying the last PSN it took
    pc[i, PC_PSN] = fl[f, FL_PSN] if kind == K_REQ else fl[f, FL_RX_PSN] - 1
    pk[i, PK_NHOPS] = n
    pc[i, PC_ARG] = arg
    overhead = S.prm[P_OVERHEAD_BYTES]
    if kind == K_CNP:
        pk[i, PK_WIRE_BYTES] = overhead + CNP_EXTRA_BYTES
    elif kind == K_ACK:
        pk[i, PK_WIRE_BYTES] = overhead + ACK_EXTRA_BYTES
        pc[i, PC_OFFSET_BYTES] = fl[f, FL_DELIV_BYTES]  # cumulative: what the receiver has
    else:
        pk[i, PK_WIRE_BYTES] = overhead + CTS_EXTRA_BYTES
    if kind == K_REQ:
        for j in range(n):
            pk[i, PK_ROUTE + j] = path_port[a + j]
    else:
        for j in range(n):
            pk[i, PK_ROUTE + j] = path_port[a + n - 1 - j] ^ 1
    p = pk[i, PK_ROUTE]
    if not pt[p, PT_ALIVE]:
        drop(S, i, p, now)
        return -1
    enqueue(pt, pk, p, 0, i, now)
    return p


# NIC senders ----------------------------------------------------------------------------


@njit(cache=True, inline="always")
def list_add(S, f):
    fl, nd, act = S.fl, S.nd, S.act
    v = fl[f, FL_SRC]
    c = nd[v, ND_CNT]
    act[nd[v, ND_OFF] + c] = f
    fl[f, FL_SLOT] = c
    nd[v, ND_CNT] = c + 1


@njit(cache=True, inline="always")
def list_remove(S, f):
    fl, nd, act = S.fl, S.nd, S.act
    v = fl[f, FL_SRC]
    off = nd[v, ND_OFF]
    c = nd[v, ND_CNT] - 1
    s = fl[f, FL_SLOT]
    last = act[off + c]
    act[off + s] = last
    fl[last, FL_SLOT] = s
    fl[f, FL_SLOT] = -1
    nd[v, ND_CNT] = c


@njit(cache=True, inline="always")
def send_data(S, f, p, now):
    """Flow f's next data packet, for its NIC's port p to put on the wire (`start_frame`)."""
    prm, fl, fr, pk, pc = S.prm, S.fl, S.fr, S.pk, S.pc
    path_ptr, path_port = S.path_ptr, S.path_port
    controlled = prm[P_CC] != CC_NONE  # `none` has no hooks: the common path skips them
    size = min(prm[P_MTU_BYTES], fl[f, FL_UNSENT_BYTES])
    if controlled:
        size = congestion.send_allowance(S, f, size)
    fl[f, FL_UNSENT_BYTES] -= size
    i = alloc(S)
    pk[i, PK_FLOW] = f
    pk[i, PK_KIND] = K_DATA
    pk[i, PK_BYTES] = size
    wire = size + prm[P_OVERHEAD_BYTES]
    pk[i, PK_WIRE_BYTES] = wire
    psn = fl[f, FL_PSN]
    pc[i, PC_PSN] = psn
    pc[i, PC_OFFSET_BYTES] = fl[f, FL_BYTES] - fl[f, FL_UNSENT_BYTES] - fl[f, FL_HELD_BYTES] - size
    entropy = fl[f, FL_SENT_PKTS]
    pc[i, PC_ARG] = entropy
    fl[f, FL_PSN] = psn + 1
    fl[f, FL_SENT_PKTS] = entropy + 1
    n = -1
    if prm[P_SPRAY]:
        ip = S.nic_ip
        src = fl[f, FL_SRC]
        dst = fl[f, FL_DST]
        n = route_packet(
            src, dst, ip[src], ip[dst], fl[f, FL_SPORT], fl[f, FL_DQPN], entropy & 0xFFFFFF,
            S.rnd, MODE_SPRAY, S.net, S.live, S.load, 0.0, pk[i, PK_ROUTE:],
        )  # fmt: skip
    if n <= 0:
        a = path_ptr[f]
        n = path_ptr[f + 1] - a
        for j in range(n):
            pk[i, PK_ROUTE + j] = path_port[a + j]
    pk[i, PK_NHOPS] = n
    rc = fr[f, FR_RC_BPS]
    fl[f, FL_LAST_TX_PS] = now
    fl[f, FL_LAST_WIRE_BYTES] = wire
    fl[f, FL_NEXT_SEND_PS] = now + np.int64(np.ceil(wire * PS_PER_S_BITS / rc))
    pacer = fl[f, FL_PACER] - 1
    if pacer >= 0:  # the op's flows from this NIC share its protocol's rate
        gap = np.int64(np.ceil(wire * PS_PER_S_BITS / fr[pacer, FR_PACE_BPS]))
        fl[pacer, FL_PACE_PS] = now + gap
    if controlled:
        congestion.on_sent(S, f, wire)
    if fl[f, FL_UNSENT_BYTES] == 0:
        list_remove(S, f)
        if fl[f, FL_HELD_BYTES] == 0:  # else it waits for a release of its stream
            fl[f, FL_STATE] = ST_SENT
    return i


@njit(cache=True)
def lose_path(S, f):
    """Flow f has data to send but no route left (a fault cut its destination off)."""
    list_remove(S, f)
    S.fl[f, FL_STATE] = ST_NOPATH
    S.g[G_STUCK] += 1


@njit(cache=True, inline="always")
def nic_pick(S, p, now):
    """Round robin over the NIC's flows that may send now: (that flow, NEVER), or (-1, the
    soonest time one may; NEVER if none)."""
    fl, nd, act = S.fl, S.nd, S.act
    v = S.pt[p, PT_NODE]
    cnt = nd[v, ND_CNT]
    if cnt == 0:
        return np.int64(-1), NEVER
    off = nd[v, ND_OFF]
    rr = nd[v, ND_RR] % cnt
    controlled = S.prm[P_CC] != CC_NONE
    soonest = NEVER
    for j in range(cnt):
        idx = rr + j
        if idx >= cnt:
            idx -= cnt
        f = act[off + idx]
        if controlled and not congestion.may_send(S, f):
            continue
        t = send_time(fl, f)
        if t <= now:
            nd[v, ND_RR] = idx + 1
            return np.int64(f), NEVER
        if t < soonest:
            soonest = t
    return np.int64(-1), soonest


@njit(cache=True, inline="always")
def send_time(fl, f):
    """When flow f may send its next packet: its own gap after its last, and its op's
    protocol rate (`FL_PACER`) over the op's flows from this NIC."""
    t = fl[f, FL_NEXT_SEND_PS]
    pacer = fl[f, FL_PACER] - 1
    if pacer >= 0 and fl[pacer, FL_PACE_PS] > t:
        t = fl[pacer, FL_PACE_PS]
    return t


@njit(cache=True, inline="always")
def next_look(S, p, f, free_at):
    """When NIC port p, free at free_at, looks for its next frame once flow f has sent
    one: then, unless f is paced and no flow of the NIC may send before a later time,
    the soonest such. Else a port faster than its op's protocol rate wakes once to find
    nothing and again to send: two events per packet. Whatever lets a flow send sooner
    kicks the port itself (a release, a rate change, a grant, a control packet, a resume)."""
    fl = S.fl
    if fl[f, FL_PACER] == 0:
        return free_at
    nd, act = S.nd, S.act
    v = S.pt[p, PT_NODE]
    off = nd[v, ND_OFF]
    controlled = S.prm[P_CC] != CC_NONE
    soonest = NEVER
    for j in range(nd[v, ND_CNT]):
        h = act[off + j]
        if controlled and not congestion.may_send(S, h):
            continue
        t = send_time(fl, h)
        if t <= free_at:
            return free_at
        if t < soonest:
            soonest = t
    return soonest if soonest < NEVER else free_at


# ports ------------------------------------------------------------------------------------


@njit(cache=True)
def kick(S, p, now):
    """Port p starts its next frame if it is free (`start_frame`)."""
    start_frame(S, p, now)


@njit(cache=True, inline="always")
def kick_sender(S, f, now):
    """`kick` the NIC port of flow f's sender, as an int64 like every port `kick` is given:
    numba compiles a called kernel once per argument type, and this one is large."""
    kick(S, np.int64(S.net.nic_port[S.fl[f, FL_SRC]]), now)


@njit(cache=True, inline="always")
def idle_nic_or_switch(S, p):
    """Port p is a switch's, or a NIC's with no flow to send: once its queues are empty it
    has nothing to look for until a frame is queued there or a flow is added, and each
    of those starts the port's next frame (`start_frame`, `kick_sender`)."""
    return not S.pt[p, PT_IS_NIC] or S.nd[S.pt[p, PT_NODE], ND_CNT] == 0


@njit(cache=True, inline="always")
def start_frame(S, p, now):
    """Port p starts its next frame if it is free: PFC first, then control, then data; and
    asks to look again when it may start another. Inlined where a hop calls it (the loop,
    once: after an EV_TX, after a packet is queued by `arrive_at_switch` and after an ACK
    is queued by `deliver`), with what a NIC calls to send data (`nic_pick`, `send_data`):
    a call passes every array of the state one field at a time, a large part of a hop's
    cost. Whatever the frame, it goes on the wire at one place and the port's next look
    is asked at one place: each is an event push the compiler would otherwise copy.

    A port that has put its last queued frame on the wire and has no flow to send asks
    for no look (`idle_nic_or_switch`): the frame queued next, or the flow added next,
    calls this, which starts it or, while the port is busy, asks for the look then (a
    look that found nothing was a quarter of the events)."""
    g, pt, pmax, pk = S.g, S.pt, S.pmax, S.pk
    i = -1  # the packet to put on the wire
    f = -1  # its flow, where a NIC sends data
    look = NEVER  # when the port looks again
    if pt[p, PT_FREE_AT_PS] > now:
        look = pt[p, PT_FREE_AT_PS]
    elif pt[p, PT_PFC_PENDING] >= 0:
        put_pfc_on_wire(S, p, now)
        return
    elif pt[p, PT_HEAD0] >= 0:
        i = dequeue(pt, pk, p, 0, now)
        if pt[p, PT_SHARED]:
            buffer.release_egress(pt, S.nd, p, 0, pk[i, PK_WIRE_BYTES])
    elif pt[p, PT_IS_NIC]:
        if S.nd[pt[p, PT_NODE], ND_CNT] == 0:
            return
        if pt[p, PT_PAUSE_UNTIL_PS] > now:
            wait_tx(pt, S.ev, g, p, pt[p, PT_PAUSE_UNTIL_PS])
            return
        f, look = nic_pick(S, p, now)
        if f >= 0 and S.path_ptr[f + 1] == S.path_ptr[f]:
            lose_path(S, f)
            wait_tx(pt, S.ev, g, p, now)  # another flow of this NIC may send
            return
        if f >= 0:
            i = send_data(S, f, p, now)
    else:
        if pt[p, PT_HEAD1] < 0:
            return
        if pt[p, PT_PAUSE_UNTIL_PS] > now:
            wait_tx(pt, S.ev, g, p, pt[p, PT_PAUSE_UNTIL_PS])
            return
        i = dequeue(pt, pk, p, 1, now)
        if pt[p, PT_ECN_ON] and pk[i, PK_CE] == 0:
            depth = pt[p, PT_Q1_BYTES] + pk[i, PK_WIRE_BYTES]
            kmin, kmax = pt[p, PT_KMIN_BYTES], pt[p, PT_KMAX_BYTES]
            if ecn.should_mark(pt, p, PT_RNG, depth, kmin, kmax, pmax[p]):
                pk[i, PK_CE] = 1
                pt[p, PT_S_ECN] += 1
                g[G_ECN] += 1
        k = pk[i, PK_ROUTE + pk[i, PK_HOP] - 1] ^ 1
        if pt[p, PT_SHARED]:
            if buffer.release_data(pt, S.nd, p, k, pk[i, PK_WIRE_BYTES]):
                send_pfc(S, k, np.int64(0), now)
        elif pt[k, PT_PFC_ON] and pfc.release(pt, k, pk[i, PK_WIRE_BYTES]):
            send_pfc(S, k, np.int64(0), now)
    arrive, hint = np.int64(-1), np.int64(0)
    if i >= 0:
        arrive, hint = put_on_wire(S, p, i, now)
        look = pt[p, PT_FREE_AT_PS]
        if f >= 0:
            look = next_look(S, p, f, look)
        elif pt[p, PT_HEAD0] < 0 and pt[p, PT_HEAD1] < 0 and idle_nic_or_switch(S, p):
            look = NEVER  # nothing left to send: what queues a frame or adds a flow asks
    # the frame's arrival, then the port's next look (`want_tx`): one push for both
    ev = S.ev
    for j in range(2):
        if j == 0:
            if arrive < 0:
                continue
            t, kind, a, b = arrive, EV_ARRIVE, i, hint
        else:
            if look == NEVER or pt[p, PT_TXEV_PS] == look:
                continue
            pt[p, PT_TXEV_PS] = look
            t, kind, a, b = look, EV_TX, p, pt[p, PT_HEAD1]
        push(ev, g, t, kind, a, b)


@njit(cache=True)
def send_pfc(S, k, quanta, now):
    """Switch port k asks its peer to pause for `quanta` (0: resume) as soon as it can."""
    g, pt, ev = S.g, S.pt, S.ev
    if not pt[k, PT_ALIVE]:
        return
    pt[k, PT_PFC_PENDING] = quanta
    if quanta > 0 and pt[k, PT_REFRESH] == 0:
        pt[k, PT_REFRESH] = 1
        half = pfc.pause_ps(quanta, pt[k, PT_RATE_BPS]) // 2
        schedule(ev, g, now + max(half, 1), EV_PFC_REFRESH, k, 0)
    want_tx(S, k, max(now, pt[k, PT_FREE_AT_PS]))


@njit(cache=True)
def shortest_queue(S, s, lj, h):
    """Adaptive routing at switch s: its live next hop towards leaf lj with the fewest bytes
    queued (both classes) now; among equally short queues the packet's hash h picks, so
    packets spread over idle next hops as they would sprayed. -1 if there is none."""
    net, live, pt = S.net, S.live, S.pt
    d = live.dist[net.sw_ord[s], lj]
    shortest = -1
    ties = 0
    for k in range(net.adj_ptr[s], net.adj_ptr[s + 1]):
        q = net.adj_port[k]
        if is_next_hop(q, lj, d, net, live):
            depth = pt[q, PT_Q0_BYTES] + pt[q, PT_Q1_BYTES]
            if shortest < 0 or depth < shortest:
                shortest = depth
                ties = 1
            elif depth == shortest:
                ties += 1
    if ties == 0:
        return -1
    want = h % np.uint32(ties)
    i = 0
    for k in range(net.adj_ptr[s], net.adj_ptr[s + 1]):
        q = net.adj_port[k]
        if is_next_hop(q, lj, d, net, live) and pt[q, PT_Q0_BYTES] + pt[q, PT_Q1_BYTES] == shortest:
            if i == want:
                return q
            i += 1
    return -1


@njit(cache=True)
def adapt_route(S, i, j):
    """Data packet i is at the switch that sends it out of its route's port j: it goes out of
    the next hop with the shortest queue now instead (`shortest_queue`), and so at every
    switch after; the rest of its route is rewritten the same way here and decided again at
    each switch. The last hop (the leaf's port to the NIC) is fixed."""
    pk, net, fl = S.pk, S.net, S.fl
    n = pk[i, PK_NHOPS]
    f = pk[i, PK_FLOW]
    src = fl[f, FL_SRC]
    dst = fl[f, FL_DST]
    lj = net.leaf_ord[net.nic_switch[dst]]
    s = net.port_peer[pk[i, PK_ROUTE + j - 1]]
    seeds, table, ip = S.live.seeds, S.live.crc_table, S.nic_ip
    entropy = S.pc[i, PC_ARG] & 0xFFFFFF
    while j < n - 1:
        h = flow_hash(ip[src], ip[dst], fl[f, FL_SPORT], ROCE_UDP_PORT, fl[f, FL_DQPN], entropy,
                      MODE_SPRAY, seeds[s], table)  # fmt: skip
        q = shortest_queue(S, s, lj, h)
        if q < 0:
            return
        pk[i, PK_ROUTE + j] = q
        s = net.port_peer[q]
        j += 1


@njit(cache=True, inline="always")
def arrive_at_switch(S, i, p_in, q, now):
    """Packet i came over port p_in into a switch and goes out of its port q: True if it is
    queued there (the loop then starts port q's next frame: `start_frame`, written once in
    the loop for this and EV_TX, as it is the largest part of the loop to compile). Inlined
    into the loop, as is `arrive_shared`: a call would pass every array of the state one
    field at a time."""
    pt, pk = S.pt, S.pk
    if not pt[q, PT_ALIVE]:
        drop(S, i, q, now)
        return False
    wire = pk[i, PK_WIRE_BYTES]
    if pt[q, PT_SHARED]:
        if not arrive_shared(S, i, p_in ^ 1, q, wire, now):
            return False
    elif pk[i, PK_KIND] == K_DATA:
        k = p_in ^ 1
        if pt[k, PT_PFC_ON]:
            verdict = pfc.admit(pt, k, wire)
            if verdict == pfc.DROP:
                drop(S, i, q, now)
                return False
            if verdict == pfc.ADMIT_XOFF:
                send_pfc(S, k, pt[k, PT_QUANTA], now)
        elif pt[q, PT_Q1_BYTES] + wire > pt[q, PT_BUF_BYTES]:
            drop(S, i, q, now)
            return False
        enqueue(pt, pk, q, 1, i, now)
    else:
        if pt[q, PT_Q0_BYTES] + wire > pt[q, PT_BUF_BYTES]:
            drop(S, i, q, now)
            return False
        enqueue(pt, pk, q, 0, i, now)
    return True


@njit(cache=True, inline="always")
def arrive_shared(S, i, k, q, wire, now):
    """Packet i came in over port k of a shared-buffer switch and goes out of its port q
    (sim/buffer.py decides whether it fits and whether port k pauses its peer):
    True if it is queued there, False if it is dropped."""
    pt, pk = S.pt, S.pk
    cls = 1 if pk[i, PK_KIND] == K_DATA else 0
    if cls == 1 and pt[k, PT_PFC_ON]:
        verdict = buffer.admit_lossless(pt, S.nd, k, wire)
        if verdict == pfc.DROP:
            drop(S, i, q, now)
            return False
        if verdict == pfc.ADMIT_XOFF:
            send_pfc(S, k, pt[k, PT_QUANTA], now)
    elif not buffer.admit_egress(pt, S.nd, q, cls, wire):
        drop(S, i, q, now)
        return False
    enqueue(pt, pk, q, cls, i, now)
    return True


# NIC receivers and flows ------------------------------------------------------------------


@njit(cache=True)
def grant(S, f, now):
    """The receiver of flow f sends the grants that are due (congestion.next_grant)."""
    while True:
        n = congestion.next_grant(S, f)
        if n <= 0:
            return
        send_control(S, f, np.int64(K_CTS), n, now)


@njit(cache=True)
def send_ack(S, f, now):
    """The receiver of flow f acknowledges every byte it has (one ACK: cumulative). Once a
    flow or after a lost ACK: `send_control` by a call (`ack` inlines what it does)."""
    S.fl[f, FL_UNACKED] = 0
    send_control(S, f, np.int64(K_ACK), np.int64(0), now)


@njit(cache=True, inline="always")
def ack(S, f, now):
    """`send_ack`, inlined where data is delivered (`deliver`): the port to start, or -1."""
    S.fl[f, FL_UNACKED] = 0
    return queue_control(S, f, K_ACK, 0, now)


@njit(cache=True)
def received(S, f, now):
    """The receiver of flow f has every byte: it sends the flow's one ACK (ack_every =
    "flow"; a coalescing receiver has just acknowledged the last packet), and the flow
    is complete here when it finishes at the receiver, else when that ACK returns."""
    S.fl[f, FL_T_RECEIVED_PS] = now
    data_arrived(S, f, now)
    if S.prm[P_ACK_EVERY] == 0:
        send_ack(S, f, now)
    if not S.prm[P_FINISH_AT_SENDER]:
        complete(S, f, now)


@njit(cache=True)
def data_arrived(S, f, now):
    """Every byte of flow f is at its receiver: the transfers of its op waiting on it may
    start, a step latency from now (those of later ops wait for it to complete). Each
    hears it at its sender then (EV_DEP): a message, so that sender may be another
    partition's."""
    fl, dep_ptr, dep = S.fl, S.dep_ptr, S.dep
    op = fl[f, FL_OP]
    for j in range(dep_ptr[f], dep_ptr[f + 1]):
        h = dep[j]
        if fl[h, FL_OP] == op:
            send(S, fl[h, FL_SRC], now + fl[h, FL_LAT_PS], EV_DEP, h, 0)


@njit(cache=True, inline="always")
def send(S, node, t, kind, a, b):
    """An event at time t at `node` (a NIC): here, or into the outbox when another
    partition holds that node (then t is a message's delay away, at least the lookahead:
    aifabric.sim.partition checks before it runs)."""
    part = elsewhere(S, node)
    if part >= 0:
        export(S, part, t, np.int64(kind), np.int64(a), np.int64(b))
        return
    schedule(S.ev, S.g, t, kind, a, b)


@njit(cache=True, inline="always")
def elsewhere(S, node):
    """The partition that holds `node` (a NIC) when this one does not, else -1."""
    if S.prm[P_PARTITIONED]:
        part = S.nd[node, ND_PART]
        if part != S.prm[P_PART]:
            return part
    return -1


@njit(cache=True, inline="always")
def release_dep(S, h, t):
    """One prerequisite of flow h is met, as of time t (EV_DEP): h starts when the last
    one is."""
    fl = S.fl
    fl[h, FL_DEPS] -= 1
    if t > fl[h, FL_READY_PS]:
        fl[h, FL_READY_PS] = t
    if fl[h, FL_DEPS] == 0:
        schedule(S.ev, S.g, max(fl[h, FL_READY_PS], fl[h, FL_EARLIEST_PS]), EV_FLOW_START, h, 0)


@njit(cache=True)
def acknowledged(S, f, now):
    """The ACK of flow f's last byte reached its sender: the sender is done, and a sender
    that went back on a NAK sent before that ACK has nothing left to send. The flow ends
    now if it finishes at the sender; if it finishes at its receiver it ended there, and
    until now its sender went on as a NIC does, on what its ACKs and NAKs told it."""
    if S.fl[f, FL_SLOT] >= 0:
        list_remove(S, f)
    if S.prm[P_FINISH_AT_SENDER]:
        complete(S, f, now)
    else:
        S.fl[f, FL_STATE] = ST_DONE


@njit(cache=True)
def complete(S, f, now):
    """Flow f ends now (see `received`): the flows of later ops waiting on it may start.
    Its state is its sender's: done here if it ends at its sender, else when its sender
    hears the last ACK (`acknowledged`); but a flow that lost its route is done where it
    ends."""
    g, fl, dep_ptr, dep = S.g, S.fl, S.dep_ptr, S.dep
    if fl[f, FL_STATE] == ST_NOPATH:  # its last bytes arrived after its route was lost
        g[G_STUCK] -= 1
        fl[f, FL_STATE] = ST_DONE
    elif S.prm[P_FINISH_AT_SENDER]:
        fl[f, FL_STATE] = ST_DONE
    fl[f, FL_T_END_PS] = now
    g[G_DONE] += 1
    op = fl[f, FL_OP]
    for j in range(dep_ptr[f], dep_ptr[f + 1]):
        h = dep[j]
        if fl[h, FL_OP] != op:
            send(S, fl[h, FL_SRC], now + fl[h, FL_BASE_PS], EV_DEP, h, 0)


# streams --------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def qp_bytes(gr, s, x, q):
    """Bytes QP q of stream s carries of the stream's first x bytes (as
    aifabric.traffic.generate.qp_bytes): a floor/ceil share of every byte range (split), or
    of whole messages dealt to the QPs in turn (round-robin)."""
    n = gr[s, GR_NQP]
    if n == 1:
        return x
    if gr[s, GR_RR] == 0:
        return (x * (q + 1)) // n - (x * q) // n
    c = gr[s, GR_CHUNK]
    full = x // c
    count = (full - q + n - 1) // n
    if count < 0:
        count = 0
    out = count * c
    if full % n == q:
        out += x % c
    return out


@njit(cache=True, inline="always")
def step_end(gr, s, k):
    """Bytes of stream s in its first k steps: floor(GR_BYTES * k / GR_STEPS), without
    overflowing."""
    steps = gr[s, GR_STEPS]
    b = gr[s, GR_BYTES]
    return (b // steps) * k + ((b % steps) * k) // steps


@njit(cache=True, inline="always")
def flow_step_end(S, f, k):
    """Bytes flow f (a QP of a stream) carries in its stream's first k steps."""
    s = S.fl[f, FL_GROUP]
    return qp_bytes(S.gr, s, step_end(S.gr, s, k), S.fl[f, FL_QP])


@njit(cache=True)
def step_arrived(S, s, now):
    """The receiver of stream s may have more of its steps. A step is there once every
    QP's share of it is (a QP with no bytes in a step has that share at once) and, where
    some steps carry no byte at all (GR_EMPTY), once the receiver has heard the step was
    released (EV_SEEN). The streams sent from here that wait on it are released a step
    latency later."""
    fl, gr = S.fl, S.gr
    steps = gr[s, GR_STEPS]
    bound = gr[s, GR_SEEN] if gr[s, GR_EMPTY] else steps
    f0 = gr[s, GR_FLOW0]
    done = steps
    for j in range(gr[s, GR_NQP]):
        f = f0 + j
        k = fl[f, FL_STEPS_DONE]
        have = fl[f, FL_DELIV_BYTES]
        while k < bound and flow_step_end(S, f, k + 1) <= have:
            k += 1
        fl[f, FL_STEPS_DONE] = k
        fl[f, FL_WATCH_BYTES] = flow_step_end(S, f, k + 1) if k < steps else NEVER
        if k < done:
            done = k
    if done <= gr[s, GR_DONE]:
        return
    gr[s, GR_DONE] = done
    gio = S.gio
    for j in range(gr[s, GR_OUT_OFF], gr[s, GR_OUT_OFF] + gr[s, GR_OUT_N]):
        o = gio[j]
        t = release_target(S, o)
        if t > gr[o, GR_SCHED]:
            gr[o, GR_SCHED] = t
            schedule(S.ev, S.g, now + gr[o, GR_LAT_PS], EV_RELEASE, o, t)


@njit(cache=True, inline="always")
def release_target(S, s):
    """Steps of stream s that may be released now: those its inputs have delivered
    (`releasable`; all of them if it has none), within its window (`in_window`)."""
    gr, gio = S.gr, S.gio
    if gr[s, GR_IN_N] == 0:
        return in_window(S, s, gr[s, GR_STEPS])
    t = NEVER
    for i in range(gr[s, GR_IN_OFF], gr[s, GR_IN_OFF] + gr[s, GR_IN_N]):
        if gr[gio[i], GR_DONE] < t:
            t = gr[gio[i], GR_DONE]
    return in_window(S, s, releasable(gr, s, t))


@njit(cache=True, inline="always")
def in_window(S, s, t):
    """At most t steps of stream s, and at most GR_WINDOW beyond the steps each of its outputs
    has released, as its sender last heard (`credit`): its receiver's buffer holds a step
    until the receiver sends on what it carries (NCCL's connection buffer; the output's
    release frees it, `release`)."""
    gr, gx = S.gr, S.gx
    w = gr[s, GR_WINDOW]
    if w == 0:
        return t
    for j in range(gr[s, GR_OUT_OFF], gr[s, GR_OUT_OFF] + gr[s, GR_OUT_N]):
        c = gx[j] + w
        if c < t:
            t = c
    return t


@njit(cache=True, inline="always")
def releasable(gr, s, done):
    """Steps of stream s its inputs release when each has delivered `done` steps: `offset`
    more, and on a ring the next loop's first step, which sends the rank's own data."""
    t = done + gr[s, GR_OFFSET]
    loop = gr[s, GR_LOOP]
    if loop == 1:
        t = gr[s, GR_STEPS]
    elif loop > 1 and t % loop == 0:
        t += 1
    return min(t, gr[s, GR_STEPS])


@njit(cache=True)
def release(S, s, t, now):
    """Stream s may send its first t steps: its started QPs get their share of the new ones.
    The buffer of each input with a window frees here: a credit goes to the input's sender
    (EV_CREDIT, a path's propagation away); on a stream with steps of no bytes, the
    release itself goes to its receiver (EV_SEEN)."""
    fl, gr, gx = S.fl, S.gr, S.gx
    old = gr[s, GR_RELEASED]
    if t <= old:
        return
    gr[s, GR_RELEASED] = t
    gio = S.gio
    for j in range(gr[s, GR_IN_OFF], gr[s, GR_IN_OFF] + gr[s, GR_IN_N]):
        i = gio[j]
        if gr[i, GR_WINDOW] > 0:
            slot = gx[j] - gr[i, GR_OUT_OFF]
            sender = fl[gr[i, GR_FLOW0], FL_SRC]
            send(S, sender, now + gr[i, GR_PROP_PS], EV_CREDIT, i, t * CREDIT_SLOTS + slot)
    f0 = gr[s, GR_FLOW0]
    if gr[s, GR_EMPTY]:
        send(S, fl[f0, FL_DST], now + gr[s, GR_PROP_PS], EV_SEEN, s, t)
    woke = False
    for j in range(gr[s, GR_NQP]):
        f = f0 + j
        state = fl[f, FL_STATE]
        if state != ST_ACTIVE and state != ST_SENT:
            continue  # not started (it takes what is released when it starts), or stuck
        add = flow_step_end(S, f, t) - flow_step_end(S, f, old)
        if add <= 0:
            continue
        fl[f, FL_HELD_BYTES] -= add
        fl[f, FL_UNSENT_BYTES] += add
        if fl[f, FL_SLOT] < 0:
            fl[f, FL_STATE] = ST_ACTIVE
            if fl[f, FL_NEXT_SEND_PS] < now:
                fl[f, FL_NEXT_SEND_PS] = now
            list_add(S, f)
        woke = True
    if woke:
        kick_sender(S, f0, now)


@njit(cache=True)
def start_stream(S, f, now):
    """Flow f of a stream starts: the stream's first steps are released now, once (its own data
    needs no input: all of it on a stream with no inputs, `offset` steps on a ring), and f
    may send what is released so far."""
    fl, gr = S.fl, S.gr
    s = fl[f, FL_GROUP]
    if gr[s, GR_STARTED] == 0:
        gr[s, GR_STARTED] = 1
        t = in_window(S, s, gr[s, GR_STEPS] if gr[s, GR_IN_N] == 0 else releasable(gr, s, 0))
        if t > gr[s, GR_SCHED]:
            gr[s, GR_SCHED] = t
            schedule(S.ev, S.g, now, EV_RELEASE, s, t)
    allowed = flow_step_end(S, f, gr[s, GR_RELEASED])
    fl[f, FL_UNSENT_BYTES] = allowed
    fl[f, FL_HELD_BYTES] = fl[f, FL_BYTES] - allowed


@njit(cache=True)
def credit(S, i, b, now):
    """Output b % CREDIT_SLOTS of stream i (sent from i's receiver) released b // CREDIT_SLOTS
    steps: the buffer those held at i's receiver is free, and i may release more."""
    gr, gx = S.gr, S.gx
    j = gr[i, GR_OUT_OFF] + b % CREDIT_SLOTS
    t = b // CREDIT_SLOTS
    if t <= gx[j]:
        return
    gx[j] = t
    if gr[i, GR_STARTED]:
        ti = release_target(S, i)
        if ti > gr[i, GR_SCHED]:
            gr[i, GR_SCHED] = ti
            schedule(S.ev, S.g, now, EV_RELEASE, i, ti)


@njit(cache=True)
def seen(S, s, t, now):
    """The receiver of stream s (GR_EMPTY) hears that its first t steps were released."""
    gr = S.gr
    if t > gr[s, GR_SEEN]:
        gr[s, GR_SEEN] = t
        step_arrived(S, s, now)


@njit(cache=True)
def repace(S, f, now):
    """Flow f changed rate: its next frame is due one gap (at the new rate) after its last."""
    fl, fr = S.fl, S.fr
    gap = np.int64(np.ceil(fl[f, FL_LAST_WIRE_BYTES] * PS_PER_S_BITS / fr[f, FR_RC_BPS]))
    fl[f, FL_NEXT_SEND_PS] = fl[f, FL_LAST_TX_PS] + gap
    if fl[f, FL_SLOT] >= 0:
        kick_sender(S, f, now)


@njit(cache=True, inline="always")
def deliver(S, i, now):
    """Packet i reached the NIC at the end of its route. Inlined into the loop (see
    `start_frame`), with the ACK it may queue (`ack`): the port that ACK leaves by, for the
    loop's `start_frame` to start (-1: none). The frame starts at this time all the same,
    control before data, whatever else this event asks of that port first."""
    g, fl, pk = S.g, S.fl, S.pk
    port = -1
    f = np.int64(pk[i, PK_FLOW])  # the loop's type for a flow: one compile of what it calls
    kind = pk[i, PK_KIND]
    # go-back-N: data out of order (possible only after a loss, a new route or under
    # spray; the check reads one more row) is dropped, and the first gap NAKed once
    if (
        kind == K_DATA
        and S.prm[P_GO_BACK_N]
        and (fl[f, FL_MAY_REORDER] or S.prm[P_SPRAY])
        and S.pc[i, PC_OFFSET_BYTES] != fl[f, FL_DELIV_BYTES]
    ):
        offset = S.pc[i, PC_OFFSET_BYTES]
        gap = offset > fl[f, FL_DELIV_BYTES]
        if not gap:
            # a duplicate (the sender went back further than it had to): acknowledged at
            # once, as a responder answers a duplicate request, so that a sender whose
            # timeout went back to its last ACK hears what the receiver has
            send_ack(S, f, now)
        elif fl[f, FL_NAKED] == 0 and fl[f, FL_STATE] != ST_DONE:
            fl[f, FL_NAKED] = 1
            send_control(S, f, np.int64(K_ACK), fl[f, FL_DELIV_BYTES] + 1, now)
        if gap and offset + pk[i, PK_BYTES] >= fl[f, FL_BYTES]:
            # the flow's last packet, dropped here: nothing after it may come to NAK a gap
            # (this one's NAK may have been sent already, and the sender may have passed
            # over it), so the sender's timeout goes back if nothing else has (`drop`)
            send(S, fl[f, FL_SRC], now + S.prm[P_RTO_PS], EV_RTO, f, offset)
    elif kind == K_DATA:
        fl[f, FL_NAKED] = 0
        fl[f, FL_RX_PSN] = S.pc[i, PC_PSN] + 1
        fl[f, FL_DELIV_BYTES] += pk[i, PK_BYTES]
        g[G_PROGRESS_T_PS] = now
        if fl[f, FL_DELIV_BYTES] >= fl[f, FL_WATCH_BYTES]:
            step_arrived(S, fl[f, FL_GROUP], now)
        todo = 0
        if S.prm[P_CC] != CC_NONE:
            todo = congestion.on_data(S, f, pk[i, PK_CE], now)
        if todo & DO_CNP:
            g[G_CNP] += 1
            S.pt[S.net.nic_port[fl[f, FL_DST]], PT_S_CNP] += 1
            send_control(S, f, np.int64(K_CNP), np.int64(0), now)
        if todo & DO_GRANT:
            grant(S, f, now)
        every = S.prm[P_ACK_EVERY]
        if every > 0:
            fl[f, FL_UNACKED] += 1
            if fl[f, FL_UNACKED] >= every or fl[f, FL_DELIV_BYTES] >= fl[f, FL_BYTES]:
                port = ack(S, f, now)
        if fl[f, FL_DELIV_BYTES] >= fl[f, FL_BYTES] and fl[f, FL_T_RECEIVED_PS] < 0:
            received(S, f, now)
    elif kind == K_ACK:
        # an ACK or a NAK: the sender hears how many bytes the receiver had as it sent it
        if S.pc[i, PC_OFFSET_BYTES] > fl[f, FL_ACKED_BYTES]:
            fl[f, FL_ACKED_BYTES] = S.pc[i, PC_OFFSET_BYTES]
            fl[f, FL_ACKED_PSN] = S.pc[i, PC_PSN] + 1
        if S.pc[i, PC_ARG] > 0:  # a NAK
            go_back(S, f, S.pc[i, PC_ARG] - 1, S.pc[i, PC_PSN] + 1, now)
        elif last_ack(S, i) and fl[f, FL_STATE] != ST_DONE:
            acknowledged(S, f, now)
    elif kind == K_CNP:
        if fl[f, FL_STATE] == ST_ACTIVE and congestion.on_cnp(S, f, now) & DO_REPACE:
            repace(S, f, now)
    elif kind == K_CTS:
        if congestion.on_grant(S, f, S.pc[i, PC_ARG]) & DO_KICK and fl[f, FL_SLOT] >= 0:
            kick_sender(S, f, now)
    elif kind == K_REQ and congestion.on_grant_request(S, f) & DO_GRANT:
        grant(S, f, now)
    release_packet(S, i)
    return port


@njit(cache=True)
def start_flow(S, f, now):
    g, fl, fr, path_ptr = S.g, S.fl, S.fr, S.path_ptr
    if path_ptr[f + 1] == path_ptr[f]:
        fl[f, FL_STATE] = ST_NOPATH
        g[G_STUCK] += 1
        return
    # a stream's QP starts as its first step is released; its op started its latency before
    fl[f, FL_T_START_PS] = now - fl[f, FL_BASE_PS] if fl[f, FL_GROUP] >= 0 else now
    fl[f, FL_STATE] = ST_ACTIVE
    g[G_PROGRESS_T_PS] = now
    fl[f, FL_UNSENT_BYTES] = fl[f, FL_BYTES]
    if fl[f, FL_GROUP] >= 0:
        start_stream(S, f, now)
    if fl[f, FL_BYTES] == 0:  # nothing to send or acknowledge: done as it starts
        fl[f, FL_T_RECEIVED_PS] = now
        data_arrived(S, f, now)
        if S.prm[P_ACK_EVERY] == 0:
            send_ack(S, f, now)
        complete(S, f, now)
        fl[f, FL_STATE] = ST_DONE  # its sender has nothing to wait for
        return
    fr[f, FR_RC_BPS] = fr[f, FR_LINE_BPS]
    fr[f, FR_RT_BPS] = fr[f, FR_LINE_BPS]
    fl[f, FL_NEXT_SEND_PS] = now
    if fl[f, FL_UNSENT_BYTES] > 0:
        list_add(S, f)
    todo = congestion.on_flow_start(S, f)
    if todo & DO_REQUEST:
        send_control(S, f, np.int64(K_REQ), np.int64(0), now)
    if todo & DO_KICK:
        kick_sender(S, f, now)


@njit(cache=True)
def retransmit(S, f, nbytes, now):
    """The sender learned of a loss: nbytes > 0 of data to send again; a lost grant
    (-nbytes) counts as received, a lost request (0) is repeated."""
    fl = S.fl
    if fl[f, FL_STATE] == ST_NOPATH:
        return
    if nbytes == 0:
        send_control(S, f, np.int64(K_REQ), np.int64(0), now)
        return
    if nbytes < 0:
        congestion.on_grant(S, f, -nbytes)
        if fl[f, FL_SLOT] >= 0:
            kick_sender(S, f, now)
    else:
        resend(S, f, nbytes, now)


@njit(cache=True)
def resend(S, f, nbytes, now):
    """The sender of flow f sends nbytes of its data again."""
    g, fl = S.g, S.fl
    fl[f, FL_UNSENT_BYTES] += nbytes
    g[G_RETX_BYTES] += nbytes
    congestion.on_resend(S, f, nbytes)
    if fl[f, FL_SLOT] < 0:
        fl[f, FL_STATE] = ST_ACTIVE
        if fl[f, FL_NEXT_SEND_PS] < now:
            fl[f, FL_NEXT_SEND_PS] = now
        list_add(S, f)
    kick_sender(S, f, now)


@njit(cache=True)
def go_back(S, f, offset, psn, now):
    """Go-back-N: the sender of flow f sends everything again from byte `offset` on, from
    `psn` on (the PSN its receiver expects there, which a NAK or the last ACK told it)."""
    fl = S.fl
    state = fl[f, FL_STATE]
    if state not in (ST_ACTIVE, ST_SENT):
        return
    sent = fl[f, FL_BYTES] - fl[f, FL_UNSENT_BYTES] - fl[f, FL_HELD_BYTES]
    if offset < sent:
        fl[f, FL_REWIND_PS] = now
        fl[f, FL_PSN] = psn
        resend(S, f, sent - offset, now)


@njit(cache=True)
def data_timeout(S, f, offset, now):
    """Go-back-N: data at `offset` was lost one timeout ago. Unless the sender went back
    since (a NAK) or has heard the receiver has it (an ACK past it), it goes back to what it
    last heard the receiver had, as a NIC's timer does: what the receiver had and did not
    ACK yet it sends again, and the receiver drops as duplicates. Only the sender's state
    is read, whichever end the flow finishes at: a receiver that has every byte does not
    stop its sender until that sender hears so."""
    fl, prm = S.fl, S.prm
    lost_at = now - prm[P_RTO_PS]
    if fl[f, FL_REWIND_PS] >= lost_at or fl[f, FL_ACKED_BYTES] > offset:
        return
    go_back(S, f, fl[f, FL_ACKED_BYTES], fl[f, FL_ACKED_PSN], now)


# samples ----------------------------------------------------------------------------------


@njit(cache=True)
def close_sample(S, now):
    """Write one row of every port series for [G_SAMPLE_T_PS, now) and open the next."""
    g, pt, smp = S.g, S.pt, S.smp
    row = g[G_SAMPLES]
    span = max(now - g[G_SAMPLE_T_PS], 1)
    for p in range(pt.shape[0]):
        settle(pt, p, now)
        pfc.account_pause(pt, p, now)
        smp[SM_TX_BYTES, row, p] = pt[p, PT_S_TX_BYTES]
        smp[SM_QDEPTH_MAX_BYTES, row, p] = pt[p, PT_S_QMAX_BYTES]
        smp[SM_QDEPTH_MEAN_BYTES, row, p] = pt[p, PT_S_QINT_BYTE_PS] // span
        smp[SM_ECN_MARKED, row, p] = pt[p, PT_S_ECN]
        smp[SM_PAUSED_NS, row, p] = pt[p, PT_S_PAUSED_PS] // PS_PER_NS
        smp[SM_PFC_SENT, row, p] = pt[p, PT_S_PFC]
        smp[SM_DROPS, row, p] = pt[p, PT_S_DROPS]
        smp[SM_CNP_SENT, row, p] = pt[p, PT_S_CNP]
        pt[p, PT_S_TX_BYTES] = 0
        pt[p, PT_S_QMAX_BYTES] = depth_bytes(pt, p)
        pt[p, PT_S_QINT_BYTE_PS] = 0
        pt[p, PT_S_QT_PS] = now
        pt[p, PT_S_ECN] = 0
        pt[p, PT_S_PAUSED_PS] = 0
        pt[p, PT_S_PFC] = 0
        pt[p, PT_S_DROPS] = 0
        pt[p, PT_S_CNP] = 0
    g[G_SAMPLES] = row + 1
    g[G_SAMPLE_T_PS] = now


# faults -------------------------------------------------------------------------------------


PURGE_ROOM = 4  # free event (and outbox) rows one purged packet needs: its resend, a PFC
# resume, with partitions its timeout and its loss told to another partition


@njit(cache=True)
def purge(S, p, now):
    """Port p went down: what waits in its queues is lost. Returns False when the event
    list ran out of room first (or other purges wait): the loop finishes it, before any
    other event, once the engine has grown the list."""
    g, pt, pk, ev = S.g, S.pt, S.pk, S.ev
    if g[G_PURGING] > pt[p, PT_PURGE]:
        return defer_purge(S, p)
    for cls in range(2):
        while pt[p, PT_HEAD0 + 2 * cls] >= 0:
            if g[G_HEAP] + PURGE_ROOM > ev.shape[1] or outbox_full(S, PURGE_ROOM):
                return defer_purge(S, p)
            i = dequeue(pt, pk, p, cls, now)
            if pt[p, PT_SHARED]:
                k = pk[i, PK_ROUTE + pk[i, PK_HOP] - 1] ^ 1
                if cls == 0:
                    buffer.release_egress(pt, S.nd, p, 0, pk[i, PK_WIRE_BYTES])
                elif buffer.release_data(pt, S.nd, p, k, pk[i, PK_WIRE_BYTES]):
                    send_pfc(S, k, np.int64(0), now)
            elif cls == 1 and not pt[p, PT_IS_NIC]:
                k = pk[i, PK_ROUTE + pk[i, PK_HOP] - 1] ^ 1
                if pt[k, PT_PFC_ON] and pfc.release(pt, k, pk[i, PK_WIRE_BYTES]):
                    send_pfc(S, k, np.int64(0), now)
            drop(S, i, p, now)
    pt[p, PT_PFC_PENDING] = -1
    pt[p, PT_XOFF] = 0
    if pt[p, PT_PURGE]:
        pt[p, PT_PURGE] = 0
        g[G_PURGING] -= 1
    return True


@njit(cache=True, inline="always")
def outbox_full(S, more):
    """With partitions: the outbox has no room for `more` rows beyond its reserve (the
    loop then has the driver keep its rows aside: R_DRAIN_OUT)."""
    return S.prm[P_PARTITIONED] and S.g[G_OUT] + S.prm[P_OUT_RESERVE] + more > S.out.shape[0]


@njit(cache=True)
def defer_purge(S, p):
    if S.pt[p, PT_PURGE] == 0:
        S.pt[p, PT_PURGE] = 1
        S.g[G_PURGING] += 1
    return False


@njit(cache=True)
def finish_purges(S, now):
    """Go on with the purges that ran out of room, in port order; False: still no room."""
    pt = S.pt
    for p in range(pt.shape[0]):  # noqa: SIM110 (numba compiles no generators)
        if pt[p, PT_PURGE] and not purge(S, p, now):
            return False
    return True


@njit(cache=True)
def any_flow_underway(S):
    """Is a flow started and not finished (sending, or waiting for its data to arrive)? A
    flow that ended at its receiver is finished, though its sender may not know yet."""
    fl = S.fl
    for f in range(fl.shape[0]):
        state = fl[f, FL_STATE]
        if state in (ST_ACTIVE, ST_SENT) and fl[f, FL_T_END_PS] < 0:
            return True
    return False


# the loop -----------------------------------------------------------------------------------


@njit(cache=True, nogil=True, pipeline_class=LoopCompiler)
def run(S_counted, t_stop, max_events):
    """Process events in (time, key) order; returns why it stopped (see layout.R_*). It
    stops before an event later than t_stop, or of time t_stop with a key greater than
    g[G_KEY_STOP]. Without the GIL: partitions run in threads (aifabric.sim.partition)."""
    S = borrowed(S_counted)
    g, prm, pt, fl, pk, ev, smp, cap = S.g, S.prm, S.pt, S.fl, S.pk, S.ev, S.smp, S.cap
    n_flows = prm[P_QUOTA]
    partitioned = prm[P_PARTITIONED]
    key = g[G_LAST_KEY]
    done_events = 0
    event_rows = ev.shape[1] - prm[P_EVENT_RESERVE]  # the event list may hold this many
    packet_reserve = prm[P_PACKET_RESERVE]
    while True:
        if g[G_OVERFLOW] | g[G_PURGING]:
            if g[G_OVERFLOW]:
                return R_OVERFLOW
            if not finish_purges(S, g[G_NOW_PS]):
                return R_DRAIN_OUT if outbox_full(S, PURGE_ROOM) else R_GROW_EVENTS
        if g[G_DONE] + g[G_STUCK] >= n_flows or g[G_HEAP] == 0:
            g[G_LAST_KEY] = key
            return R_DONE
        if g[G_HEAP] > event_rows:
            return R_GROW_EVENTS
        if g[G_NFREE] < packet_reserve:
            return R_GROW_PACKETS
        if g[G_CAPS] + 16 > cap.shape[0]:
            return R_DRAIN_CAPTURE
        if g[G_SAMPLES] >= smp.shape[1]:
            return R_DRAIN_SAMPLES
        if g[G_OUT] + prm[P_OUT_RESERVE] > S.out.shape[0]:
            return R_DRAIN_OUT
        h, now = peek(ev, g)
        if now >= t_stop and (now > t_stop or ev[h, 0, E_KEY] > g[G_KEY_STOP]):
            return R_STOP
        key = ev[h, 0, E_KEY]
        if done_events >= max_events:
            return R_LIMIT
        kind, a, b = take(ev, g, h)
        if g[G_HEAP] > g[G_FAR] + g[G_WHEEL]:  # the near heap is not empty
            prefetch_next(S, ev)
        g[G_NOW_PS] = now
        g[G_EVENTS] += 1
        done_events += 1
        port = -1  # a port to start its next frame (`start_frame`) after the event
        if kind == EV_ARRIVE:
            h = pk[a, PK_HOP]
            p = pk[a, PK_ROUTE + h]
            if not pt[p, PT_ALIVE]:  # its link went down on the way: lost where it arrives,
                drop(S, a, p ^ 1, now)  # as a receiver counts a cut frame (its partition's)
            elif h + 1 == pk[a, PK_NHOPS]:
                port = deliver(S, a, now)
            else:
                pk[a, PK_HOP] = h + 1
                if S.prm[P_ADAPTIVE] and pk[a, PK_KIND] == K_DATA:
                    adapt_route(S, a, h + 1)
                q = pk[a, PK_ROUTE + h + 1]
                if arrive_at_switch(S, a, p, q, now):
                    port = q
        elif kind == EV_TX:
            if pt[a, PT_TXEV_PS] == now:
                pt[a, PT_TXEV_PS] = -1
                port = a
            else:  # a later look superseded it; it may carry that look (`wait_tx`)
                carry(pt, ev, g, a, now)
        elif kind == EV_FLOW_START:
            start_flow(S, a, now)
        elif kind == EV_RELEASE:
            release(S, a, b, now)
        elif kind == EV_DEP:
            release_dep(S, a, now)
        elif kind == EV_CREDIT:
            credit(S, a, b, now)
        elif kind == EV_SEEN:
            seen(S, a, b, now)
        elif kind == EV_PFC:
            if pt[a, PT_ALIVE]:
                pfc.pause(pt, a, b, now)
                if b == 0:
                    kick(S, a, now)
        elif kind == EV_PFC_REFRESH:
            pt[a, PT_REFRESH] = 0
            if pt[a, PT_XOFF] == 1:
                send_pfc(S, a, pt[a, PT_QUANTA], now)
        elif kind == EV_CC_TIMER:
            gen, timer = congestion.timer_of(b)
            if gen == fl[a, FL_GEN] and fl[a, FL_STATE] == ST_ACTIVE:
                todo = congestion.on_timer(S, a, timer)
                if todo & DO_REPACE:
                    repace(S, a, now)
                if todo & DO_REARM:
                    schedule(ev, g, now + congestion.timer_period_ps(S, timer), EV_CC_TIMER, a, b)
        elif kind == EV_RETX:
            retransmit(S, a, b, now)
        elif kind == EV_RTO:
            data_timeout(S, a, b, now)
        elif kind == EV_ACK_RTO:
            # the sender timed out on its last ACK; the receiver ACKs again (whether the
            # sender has heard a duplicate's ACK since is its partition's to know)
            send_ack(S, a, now)
        elif kind == EV_LOST:  # partitions' bookkeeping, not an event of one partition's run
            fl[a, FL_MAY_REORDER] = 1
            g[G_EVENTS] -= 1
        elif kind == EV_SAMPLE:
            close_sample(S, now)
            if partitioned:  # the driver sees the whole run: it tells a stall
                schedule(ev, g, now + prm[P_SAMPLE_PS], EV_SAMPLE, 0, 0)
            elif g[G_DONE] + g[G_STUCK] < n_flows:
                idle = g[G_HEAP] == 0  # nothing but sampling would ever happen again
                if idle or now - g[G_PROGRESS_T_PS] > prm[P_STALL_PS]:
                    if any_flow_underway(S):
                        return R_STALLED
                    if idle:  # what is left waits on flows that found no path
                        return R_DONE
                schedule(ev, g, now + prm[P_SAMPLE_PS], EV_SAMPLE, 0, 0)
        if port >= 0:
            start_frame(S, port, now)
