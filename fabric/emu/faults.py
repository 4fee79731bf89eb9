"""Faults during an emulated run: at its fabric time, a link or switch goes down (or is drained).

Faults at time 0 are part of the plan (the fabric is built without them).
The rest are applied by a thread beside the replay: when the replay's clock
reaches a fault's time (scaled like every other time), `plan.fault_lines`
says which interfaces go down and which switches get new routes, and each
node runs its lines in one `ip -batch`. The recorded time is when the change
started; `settled_ns` is when the last switch had its new routes, the
emulator's counterpart of the simulator's instant re-route.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fabric.emu.plan import fault_lines
from fabric.errors import AifabricError


class FaultInjector(threading.Thread):
    def __init__(self, network, faults, replay, stop: threading.Event, on_routing=None):
        super().__init__(name="aifabric-faults", daemon=True)
        self.net = network
        self.faults = sorted((f for f in faults if f.at_ns > 0), key=lambda f: f.at_ns)
        self.replay = replay
        self.stop = stop
        self.on_routing = on_routing  # told each routing as it takes effect (PFC's feeds)
        self.applied: list[dict] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - reported by the engine
            self.error = e

    def _run(self) -> None:
        if not self.faults:
            return
        while not self.replay.started.wait(0.05):
            if self.stop.is_set():
                return
        net, pl = self.net, self.net.plan
        t0 = self.replay.t0
        routing = pl.routing
        with ThreadPoolExecutor(max_workers=8) as pool:
            for fault in self.faults:
                due = t0 + fault.at_ns * pl.scale / 1e9
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    return
                began = time.monotonic()
                routing, lines = fault_lines(pl, net.fabric, fault, routing)
                if self.on_routing is not None:
                    self.on_routing(routing)

                def apply(item):
                    node, batch = item
                    return node, net.run(node, ["ip", "-batch", "-"], input="\n".join(batch) + "\n")

                for node, r in pool.map(apply, lines.items()):
                    if r.returncode != 0:
                        err = (r.stderr.strip().splitlines() or ["failed"])[-1]
                        raise AifabricError(
                            f"applying the fault on {net.fabric.node_name[node]} failed: {err}"
                        )
                done = time.monotonic()
                self.applied.append(
                    {
                        **_describe(net.fabric, fault),
                        "at_ns": int(fault.at_ns),
                        "applied_ns": int((began - t0) * 1e9 / pl.scale),
                        "settled_ns": int((done - t0) * 1e9 / pl.scale),
                        "switches_rerouted": sum(
                            1 for v, b in lines.items() if any(x.startswith("route") for x in b)
                        ),
                    }
                )


def _describe(fabric, fault) -> dict:
    if fault.kind == "link":
        a, b = int(fabric.link_a[fault.target]), int(fabric.link_b[fault.target])
        target = f"{fabric.node_name[a]}--{fabric.node_name[b]}"
    else:
        target = fabric.node_name[fault.target]
    return {"kind": fault.kind, "target": target, "action": fault.action}
