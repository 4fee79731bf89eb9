"""The simulator's own clock (wall_s, behind events/s in a run's summary) counts simulating,
not numba loading the kernel's machine code, which a first call does."""

from __future__ import annotations

import types

from aifabric.sim import driver, kernel
from tests.conftest import fabric as preset
from tests.simhelp import flows

LOAD_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FirstCallLoads:
    """kernel.run as numba's dispatcher behaves with a warm cache: the first call, or an
    explicit compile, loads the machine code (here: LOAD_S seconds on `clock`)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.signatures: list = []
        self.compiled: list = []

    def _load(self) -> None:
        if not self.signatures:
            self.clock.now += LOAD_S
            self.signatures.append("loaded")

    def compile(self, sig) -> None:
        self.compiled.append(sig)
        self._load()

    def __call__(self, *args):
        self._load()
        return kernel.run(*args)


def test_a_runs_wall_time_leaves_out_loading_the_kernel(monkeypatch):
    clock = Clock()
    fake = FirstCallLoads(clock)
    proxy = types.SimpleNamespace(**{k: getattr(kernel, k) for k in dir(kernel)})
    proxy.run = fake
    monkeypatch.setattr(driver, "kernel", proxy)
    monkeypatch.setattr(driver.time, "perf_counter", clock)
    f = preset("lab-small")
    nics = f.nic_ids
    sim = driver.Simulation(f, flows([nics[0]], [nics[-1]], 4096))
    assert sim.run()
    assert fake.compiled, "the kernel was not loaded before the timer started"
    assert sim.wall_s < LOAD_S
    assert sim.flows_done == 1
