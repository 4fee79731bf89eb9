"""The replay's DCQCN reaction point (aifabric.emu.dcqcn) follows the simulator's rules: the same
cuts, byte-counter and rate-timer increases and alpha decay give the same rates, step by step."""

from __future__ import annotations

import numpy as np
import pytest

from aifabric.emu.dcqcn import ReactionPoint
from aifabric.fabric.cc import cc_parameters
from aifabric.sim import dcqcn
from aifabric.sim import layout as L

LINE = 100e9


def _sim(p):
    fl = np.zeros((1, L.FL_N), dtype=np.int64)
    fr = np.zeros((1, L.FR_N))
    fr[0, L.FR_RC_BPS] = fr[0, L.FR_RT_BPS] = fr[0, L.FR_LINE_BPS] = LINE
    fr[0, L.FR_ALPHA] = 1.0
    prm = np.zeros(L.P_NPRM, dtype=np.int64)
    prm[L.P_BYTE_COUNTER_BYTES] = p["byte_counter"]
    prm[L.P_FAST_STEPS] = p["fast_recovery_steps"]
    prm[L.P_AI_BPS] = p["additive_increase"]
    prm[L.P_HAI_BPS] = p["hyper_increase"]
    prm[L.P_MIN_RATE_BPS] = p["min_rate"]
    prm[L.P_CLAMP_TARGET] = int(p["clamp_target"])
    fprm = np.zeros(L.FP_NFPRM)
    fprm[L.FP_G] = p["g"]
    return fl, fr, prm, fprm


@pytest.mark.parametrize("preset", ["paper-40g", "cx-100g"])
@pytest.mark.parametrize("scale", [1, 1000])
def test_reaction_point_follows_the_simulators_rules(preset, scale):
    """Random CNPs, packets sent and timer periods in both; the replay's rates are the
    simulator's divided by the scale. Fails if a cut clamps the target where the preset
    keeps it, if the byte counter or the alpha timer is left out, or if the stages mix up."""
    p = cc_parameters({"preset": preset}, rate_bps=100 * 10**9)
    fl, fr, prm, fprm = _sim(p)
    rp = ReactionPoint(p, np.array([LINE / scale]), scale)
    rp.start(0)
    t_alpha, t_rate = rp.t_alpha, rp.t_rate
    rng = np.random.default_rng(7)
    now = 0.0
    armed = False  # the simulator's timers start with the first CNP
    next_alpha = next_rate = np.inf
    for _ in range(3000):
        op = rng.choice(["cnp", "sent", "wait"], p=[0.05, 0.75, 0.2])
        if op == "cnp":
            dcqcn.cut(fl, fr, 0, prm, fprm)
            rp.cut(0, now)
            armed = True
            next_alpha, next_rate = now + t_alpha, now + t_rate
        elif op == "sent":
            wire = int(rng.integers(64, 4200))
            if fr[0, L.FR_RC_BPS] < fr[0, L.FR_LINE_BPS]:  # the simulator's on_sent
                fl[0, L.FL_BC_BYTES] += wire
                if fl[0, L.FL_BC_BYTES] >= prm[L.P_BYTE_COUNTER_BYTES]:
                    fl[0, L.FL_BC_BYTES] -= prm[L.P_BYTE_COUNTER_BYTES]
                    fl[0, L.FL_B_STAGE] += 1
                    dcqcn.increase(fl, fr, 0, prm)
            rp.sent(0, wire)
        else:  # time passes: the timers that fall due fire in order
            later = now + float(rng.uniform(0, 3)) * min(t_alpha, t_rate)
            while armed and min(next_alpha, next_rate) <= later:
                if next_alpha <= next_rate:
                    dcqcn.decay_alpha(fr, 0, fprm)
                    next_alpha += t_alpha
                else:
                    fl[0, L.FL_T_STAGE] += 1
                    dcqcn.increase(fl, fr, 0, prm)
                    next_rate = next_rate + t_rate if fr[0, L.FR_RC_BPS] < LINE else np.inf
            now = later
            rp.tick(0, now)
        assert rp.rc[0] * scale == pytest.approx(fr[0, L.FR_RC_BPS], rel=1e-9)
        assert rp.rt[0] * scale == pytest.approx(fr[0, L.FR_RT_BPS], rel=1e-9)
        assert rp.alpha[0] == pytest.approx(fr[0, L.FR_ALPHA], rel=1e-9)
    assert armed and fr[0, L.FR_RC_BPS] < LINE or fl[0, L.FL_B_STAGE] > 0
