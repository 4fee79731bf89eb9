"""DCQCN at the sender (reaction point), after Zhu et al., SIGCOMM 2015.

On a CNP: target rate = current rate, current rate cut by alpha / 2, alpha
raised by g. Without CNPs, alpha decays every alpha timer period. The rate
recovers in stages counted by a timer and a byte counter: while both stage
counts are below F, fast recovery (current rate halfway to the target);
once either reaches F, additive increase (target + AI); once both exceed F,
hyper increase (target + HAI).
"""

from __future__ import annotations

from numba import njit

from fabric.sim.layout import (
    FL_B_STAGE,
    FL_BC,
    FL_T_STAGE,
    FP_G,
    FR_ALPHA,
    FR_LINE,
    FR_RC,
    FR_RT,
    P_AI_BPS,
    P_FAST_STEPS,
    P_HAI_BPS,
    P_MIN_RATE_BPS,
)


@njit(cache=True)
def on_cnp(fl, fr, f, prm, fprm):
    g = fprm[FP_G]
    fr[f, FR_RT] = fr[f, FR_RC]
    fr[f, FR_RC] = max(fr[f, FR_RC] * (1.0 - fr[f, FR_ALPHA] / 2.0), float(prm[P_MIN_RATE_BPS]))
    fr[f, FR_ALPHA] = (1.0 - g) * fr[f, FR_ALPHA] + g
    fl[f, FL_T_STAGE] = 0
    fl[f, FL_B_STAGE] = 0
    fl[f, FL_BC] = 0


@njit(cache=True)
def on_alpha_timer(fr, f, fprm):
    fr[f, FR_ALPHA] = (1.0 - fprm[FP_G]) * fr[f, FR_ALPHA]


@njit(cache=True)
def increase(fl, fr, f, prm):
    """One rate-increase event (timer or byte counter)."""
    t = fl[f, FL_T_STAGE]
    b = fl[f, FL_B_STAGE]
    fast = prm[P_FAST_STEPS]
    line = fr[f, FR_LINE]
    if min(t, b) > fast:
        fr[f, FR_RT] = min(fr[f, FR_RT] + prm[P_HAI_BPS], line)
    elif max(t, b) >= fast:
        fr[f, FR_RT] = min(fr[f, FR_RT] + prm[P_AI_BPS], line)
    fr[f, FR_RC] = min((fr[f, FR_RT] + fr[f, FR_RC]) / 2.0, line)
