"""DCQCN (Zhu et al., SIGCOMM 2015) as a congestion-control component of the kernel.

At the receiver (notification point): a CE-marked data packet makes it send a
CNP, at most one per flow per CNP interval. At the sender (reaction point): on
a CNP, target rate = current rate (unless `clamp_target` is off, as on ConnectX
NICs by default: the target then stays), current rate cut by alpha / 2, alpha
raised by g, and both timers restart. Without CNPs, alpha decays every alpha timer
period. The rate recovers in stages counted by a timer and a byte counter:
while both stage counts are below F, fast recovery (current rate halfway to
the target); once either reaches F, additive increase (target + AI); once
both exceed F, hyper increase (target + HAI).

The hooks (`on_flow_start` ... `timer_period`) are what `congestion` calls;
`cut`, `decay_alpha` and `increase` are the rate arithmetic they share.
"""

from __future__ import annotations

from numba import njit

from aifabric.sim.heap import schedule
from aifabric.sim.layout import (
    CC_TIMER_SLOTS,
    DO_CNP,
    DO_KICK,
    DO_REARM,
    DO_REPACE,
    EV_CC_TIMER,
    FL_B_STAGE,
    FL_BC_BYTES,
    FL_GEN,
    FL_LAST_CNP_PS,
    FL_T_STAGE,
    FP_G,
    FR_ALPHA,
    FR_LINE_BPS,
    FR_RC_BPS,
    FR_RT_BPS,
    P_AI_BPS,
    P_ALPHA_TIMER_PS,
    P_BYTE_COUNTER_BYTES,
    P_CLAMP_TARGET,
    P_CNP_INTERVAL_PS,
    P_FAST_STEPS,
    P_HAI_BPS,
    P_MIN_RATE_BPS,
    P_RATE_TIMER_PS,
)

ALPHA_TIMER, RATE_TIMER = range(2)


# rate arithmetic ------------------------------------------------------------------------


@njit(cache=True)
def cut(fl, fr, f, prm, fprm):
    g = fprm[FP_G]
    if prm[P_CLAMP_TARGET]:
        fr[f, FR_RT_BPS] = fr[f, FR_RC_BPS]
    fr[f, FR_RC_BPS] = max(
        fr[f, FR_RC_BPS] * (1.0 - fr[f, FR_ALPHA] / 2.0), float(prm[P_MIN_RATE_BPS])
    )
    fr[f, FR_ALPHA] = (1.0 - g) * fr[f, FR_ALPHA] + g
    fl[f, FL_T_STAGE] = 0
    fl[f, FL_B_STAGE] = 0
    fl[f, FL_BC_BYTES] = 0


@njit(cache=True)
def decay_alpha(fr, f, fprm):
    fr[f, FR_ALPHA] = (1.0 - fprm[FP_G]) * fr[f, FR_ALPHA]


@njit(cache=True)
def increase(fl, fr, f, prm):
    """One rate-increase event (timer or byte counter)."""
    t = fl[f, FL_T_STAGE]
    b = fl[f, FL_B_STAGE]
    fast = prm[P_FAST_STEPS]
    line = fr[f, FR_LINE_BPS]
    if min(t, b) > fast:
        fr[f, FR_RT_BPS] = min(fr[f, FR_RT_BPS] + prm[P_HAI_BPS], line)
    elif max(t, b) >= fast:
        fr[f, FR_RT_BPS] = min(fr[f, FR_RT_BPS] + prm[P_AI_BPS], line)
    fr[f, FR_RC_BPS] = min((fr[f, FR_RT_BPS] + fr[f, FR_RC_BPS]) / 2.0, line)


# hooks ----------------------------------------------------------------------------------


@njit(cache=True)
def on_flow_start(S, f):
    S.fr[f, FR_ALPHA] = 1.0
    return DO_KICK


@njit(cache=True)
def on_sent(S, f, wire_bytes):
    """The byte counter: one increase step per `byte_counter` bytes sent below line rate."""
    fl, fr, prm = S.fl, S.fr, S.prm
    if fr[f, FR_RC_BPS] < fr[f, FR_LINE_BPS]:
        fl[f, FL_BC_BYTES] += wire_bytes
        if fl[f, FL_BC_BYTES] >= prm[P_BYTE_COUNTER_BYTES]:
            fl[f, FL_BC_BYTES] -= prm[P_BYTE_COUNTER_BYTES]
            fl[f, FL_B_STAGE] += 1
            increase(fl, fr, f, prm)


@njit(cache=True)
def on_data(S, f, ce, now_ps):
    """Receiver: a CE mark asks for a CNP unless one went out within the interval."""
    if ce:
        fl = S.fl
        last = fl[f, FL_LAST_CNP_PS]
        if last < 0 or now_ps - last >= S.prm[P_CNP_INTERVAL_PS]:
            fl[f, FL_LAST_CNP_PS] = now_ps
            return DO_CNP
    return 0


@njit(cache=True)
def on_cnp(S, f, now_ps):
    """Sender: cut the rate and restart both timers (a new generation voids the old ones)."""
    fl, prm = S.fl, S.prm
    cut(fl, S.fr, f, prm, S.fprm)
    fl[f, FL_GEN] += 1
    gen = fl[f, FL_GEN]
    schedule(S.ev, S.g, now_ps + prm[P_ALPHA_TIMER_PS], EV_CC_TIMER, f,
             gen * CC_TIMER_SLOTS + ALPHA_TIMER)  # fmt: skip
    schedule(S.ev, S.g, now_ps + prm[P_RATE_TIMER_PS], EV_CC_TIMER, f,
             gen * CC_TIMER_SLOTS + RATE_TIMER)  # fmt: skip
    return DO_REPACE


@njit(cache=True)
def on_timer(S, f, timer):
    if timer == ALPHA_TIMER:
        decay_alpha(S.fr, f, S.fprm)
        return DO_REARM
    fl, fr = S.fl, S.fr
    fl[f, FL_T_STAGE] += 1
    increase(fl, fr, f, S.prm)
    if fr[f, FR_RC_BPS] < fr[f, FR_LINE_BPS]:
        return DO_REPACE | DO_REARM
    return DO_REPACE


@njit(cache=True)
def timer_period_ps(S, timer):
    if timer == ALPHA_TIMER:
        return S.prm[P_ALPHA_TIMER_PS]
    return S.prm[P_RATE_TIMER_PS]
