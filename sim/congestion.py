"""Congestion control in the kernel: the hooks the event loop calls, dispatched by kind.

A congestion-control algorithm is a component module (`dcqcn`, `cts`) of
numba functions with these hooks; `none` is the defaults below. The loop
calls a hook where the event happens and does what the returned DO_* flags
(layout) ask, so a component changes flow state and schedules its own timers
but never sends or queues a frame itself:

    on_flow_start(S, f)          a flow starts: DO_KICK to send, DO_REQUEST to ask for grants
    may_send(S, f)               may the sender put a data frame of f on the wire now
    send_allowance(S, f, size)   how many of `size` payload bytes the next frame may carry
    on_sent(S, f, wire_bytes)    a data frame went out
    on_data(S, f, ce, now_ps)    receiver: a data frame arrived, CE-marked or not
    on_cnp(S, f, now_ps)         sender: a CNP arrived
    on_timer(S, f, timer)        one of the component's timers fired (EV_CC_TIMER)
    timer_period_ps(S, timer)    when it fires again after DO_REARM
    next_grant(S, f)             receiver: bytes of the next grant due, 0 for none
    on_grant(S, f, nbytes)       sender: a grant arrived
    on_grant_request(S, f)       receiver: a sender asked for grants
    on_resend(S, f, nbytes)      sender: lost data is to be sent again

A new algorithm is one module with these hooks, its kind and parameters in
aifabric.fabric.cc, and one branch per hook below (the registration).
"""

from __future__ import annotations

from numba import njit

from aifabric.sim import cts, dcqcn
from aifabric.sim.layout import CC_CTS, CC_DCQCN, CC_TIMER_SLOTS, DO_KICK, P_CC


@njit(cache=True, inline="always")
def timer_of(b):
    """An EV_CC_TIMER's b: (generation, timer)."""
    return b // CC_TIMER_SLOTS, b % CC_TIMER_SLOTS


@njit(cache=True)
def on_flow_start(S, f):
    kind = S.prm[P_CC]
    if kind == CC_DCQCN:
        return dcqcn.on_flow_start(S, f)
    if kind == CC_CTS:
        return cts.on_flow_start(S, f)
    return DO_KICK


@njit(cache=True, inline="always")
def may_send(S, f):
    if S.prm[P_CC] == CC_CTS:
        return cts.may_send(S, f)
    return True


@njit(cache=True, inline="always")
def send_allowance(S, f, size):
    if S.prm[P_CC] == CC_CTS:
        return cts.send_allowance(S, f, size)
    return size


@njit(cache=True, inline="always")
def on_sent(S, f, wire_bytes):
    if S.prm[P_CC] == CC_DCQCN:
        dcqcn.on_sent(S, f, wire_bytes)


@njit(cache=True, inline="always")
def on_data(S, f, ce, now_ps):
    kind = S.prm[P_CC]
    if kind == CC_DCQCN:
        return dcqcn.on_data(S, f, ce, now_ps)
    if kind == CC_CTS:
        return cts.on_data(S, f, ce, now_ps)
    return 0


@njit(cache=True)
def on_cnp(S, f, now_ps):
    if S.prm[P_CC] == CC_DCQCN:
        return dcqcn.on_cnp(S, f, now_ps)
    return 0


@njit(cache=True)
def on_timer(S, f, timer):
    if S.prm[P_CC] == CC_DCQCN:
        return dcqcn.on_timer(S, f, timer)
    return 0


@njit(cache=True)
def timer_period_ps(S, timer):
    if S.prm[P_CC] == CC_DCQCN:
        return dcqcn.timer_period_ps(S, timer)
    return 1


@njit(cache=True)
def next_grant(S, f):
    if S.prm[P_CC] == CC_CTS:
        return cts.next_grant(S, f)
    return 0


@njit(cache=True)
def on_grant(S, f, nbytes):
    if S.prm[P_CC] == CC_CTS:
        return cts.on_grant(S, f, nbytes)
    return 0


@njit(cache=True)
def on_grant_request(S, f):
    if S.prm[P_CC] == CC_CTS:
        return cts.on_grant_request(S, f)
    return 0


@njit(cache=True)
def on_resend(S, f, nbytes):
    if S.prm[P_CC] == CC_CTS:
        cts.on_resend(S, f, nbytes)
