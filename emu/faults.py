"""Faults during an emulated run: at its fabric time, a link or switch goes down, is drained
or comes back up.

Faults at time 0 are part of the plan (the fabric is built without them).
The rest are applied by a thread beside the replay: when the replay's clock
reaches a fault's time (scaled like every other time), the network's
`fault_actions` (worked out before the replay starts) take the interfaces
down (or up) and give the switches their new routes or OpenFlow groups. The
recorded time is when the change started; `settled_ns` is when the last
switch had its new routes, the emulator's counterpart of the simulator's
instant re-route.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from aifabric.emu.worker import Worker
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.faults import applied, at_start, during_run


class FaultInjector(Worker):
    def __init__(self, network, faults, replay, stop: threading.Event, on_routing=None):
        super().__init__("aifabric-faults")
        self.net = network
        self.faults = during_run(faults)
        self.replay = replay
        self.stop = stop
        self.on_routing = on_routing  # told each routing as it takes effect (PFC's feeds)
        self.applied: list[dict] = []
        routing = network.plan.routing
        earlier = at_start(faults)
        self.steps = []  # (fault, routing after it, [(node, apply)], switches re-routed)
        for fault in self.faults:
            routing, actions, rerouted = network.fault_actions(fault, routing, earlier)
            self.steps.append((fault, routing, actions, rerouted))
            earlier.append(fault)

    def work(self) -> None:
        if not self.faults:
            return
        while not self.replay.started.wait(0.05):
            if self.stop.is_set():
                return
        net, pl = self.net, self.net.plan
        t0 = self.replay.t0
        with ThreadPoolExecutor(max_workers=8) as pool:
            for fault, routing, actions, rerouted in self.steps:
                due = t0 + fault.at_ns * pl.scale / 1e9
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                began = time.monotonic()

                for node, err in pool.map(lambda a: (a[0], a[1]()), actions):
                    if err:
                        raise AifabricError(
                            f"applying the fault on {net.fabric.node_name[node]} failed: {err}"
                        )
                done = time.monotonic()
                if self.on_routing is not None:
                    self.on_routing(routing)
                self.applied.append(
                    applied(
                        net.fabric,
                        fault,
                        applied_ns=(began - t0) * 1e9 / pl.scale,
                        settled_ns=(done - t0) * 1e9 / pl.scale,
                        switches_rerouted=rerouted,
                    )
                )
