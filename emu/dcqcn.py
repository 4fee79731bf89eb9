"""DCQCN's reaction point for the replay: the simulator's rules (`aifabric.sim.dcqcn`) in wall time.

Per flow: the current rate RC, the target RT and alpha. On a CNP: RT = RC
when `clamp_target` is on (off on ConnectX NICs: the target stays), RC cut
by alpha / 2 (not below `min_rate`), alpha raised by g, both stage counts
and the byte counter reset, and both timers restarted. The alpha timer
(armed by the first CNP) decays alpha every period; the rate timer, while
RC is below line rate, counts a stage and raises the rate every period, and
so does the byte counter every `byte_counter` bytes sent below line rate:
fast recovery (RC halfway to RT) while both stage counts are below F, additive
increase (RT + AI) once either reaches F, hyper increase (RT + HAI) once
both exceed F. Rates and timers are scaled (rates divided, times multiplied
by the emulation's scale); bytes are bytes.
"""

from __future__ import annotations

import math

import numpy as np


class ReactionPoint:
    def __init__(self, params: dict, line_bps: np.ndarray, scale: int):
        n = len(line_bps)
        self.line = line_bps.astype(float)
        self.rc = self.line.copy()
        self.rt = self.line.copy()
        self.alpha = np.ones(n)
        self.t_stage = np.zeros(n, dtype=np.int64)
        self.b_stage = np.zeros(n, dtype=np.int64)
        self.bc = np.zeros(n, dtype=np.int64)
        self.alpha_at = np.full(n, math.inf)  # the alpha timer's last period (inf: not armed)
        self.rate_at = np.zeros(n)  # the rate timer's last period
        self.g = float(params["g"])
        self.t_alpha = params["alpha_timer"] * scale / 1e9
        self.t_rate = params["rate_timer"] * scale / 1e9
        self.ai = float(params["additive_increase"]) / scale
        self.hai = float(params["hyper_increase"]) / scale
        self.min_rate = float(params["min_rate"]) / scale
        self.fast = int(params["fast_recovery_steps"])
        self.byte_counter = int(params["byte_counter"])
        self.clamp = bool(params["clamp_target"])

    def start(self, f: int) -> None:
        self.alpha[f] = 1.0

    def cut(self, f: int, now: float) -> None:
        """A CNP for flow f."""
        if self.clamp:
            self.rt[f] = self.rc[f]
        self.rc[f] = max(self.rc[f] * (1.0 - self.alpha[f] / 2.0), self.min_rate)
        self.alpha[f] = (1.0 - self.g) * self.alpha[f] + self.g
        self.t_stage[f] = 0
        self.b_stage[f] = 0
        self.bc[f] = 0
        self.alpha_at[f] = now
        self.rate_at[f] = now

    def _increase(self, f: int) -> None:
        t, b = self.t_stage[f], self.b_stage[f]
        line = self.line[f]
        if min(t, b) > self.fast:
            self.rt[f] = min(self.rt[f] + self.hai, line)
        elif max(t, b) >= self.fast:
            self.rt[f] = min(self.rt[f] + self.ai, line)
        self.rc[f] = min((self.rt[f] + self.rc[f]) / 2.0, line)

    def tick(self, f: int, now: float) -> None:
        """Fire flow f's timers that came due by `now`."""
        if now - self.alpha_at[f] >= self.t_alpha:
            k = int((now - self.alpha_at[f]) // self.t_alpha)
            self.alpha[f] *= (1.0 - self.g) ** k
            self.alpha_at[f] += k * self.t_alpha
        while self.rc[f] < self.line[f] and now - self.rate_at[f] >= self.t_rate:
            self.rate_at[f] += self.t_rate
            self.t_stage[f] += 1
            self._increase(f)

    def sent(self, f: int, wire_bytes: int) -> None:
        """Flow f sent `wire_bytes`: the byte counter's stages."""
        if self.rc[f] >= self.line[f]:
            return
        self.bc[f] += wire_bytes
        while self.bc[f] >= self.byte_counter and self.rc[f] < self.line[f]:
            self.bc[f] -= self.byte_counter
            self.b_stage[f] += 1
            self._increase(f)
