"""Faults and routes, for every engine: which ports a fault takes down and the routing after it.

A fault (`aifabric.fabric.scenario.Fault`) takes a link or a switch down, or drains it
(no new flows; flows in flight finish), at a time. The simulator and the
emulator both start from `routing_at_start` (the faults at time 0 applied)
and, for each later fault, take down `fault_ports` (a `down` fault) and
route over `routing_after`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import Routing
from aifabric.fabric.scenario import Fault

KINDS = ("link", "node")
ACTIONS = ("down", "drain")


def check_fault(fabric: Fabric, fault: Fault) -> None:
    """One sentence for a fault `fabric` cannot have."""
    if fault.kind not in KINDS:
        raise AifabricError(f"a fault is on a link or a node, not a {fault.kind!r}")
    if fault.action not in ACTIONS:
        raise AifabricError(f"a fault takes a link or node down or drains it, not {fault.action!r}")
    limit = fabric.n_links if fault.kind == "link" else fabric.n_nodes
    if not 0 <= fault.target < limit:
        raise AifabricError(f"fabric {fabric.name} has no {fault.kind} {fault.target}")
    if fault.kind == "node" and fabric.node_role[fault.target] == Role.NIC:
        raise AifabricError(f"{fabric.node_name[fault.target]} is a NIC; faults take down switches")
    if fault.at_ns < 0:
        raise AifabricError("a fault's time must not be negative")


def at_start(faults: Iterable[Fault]) -> list[Fault]:
    return [f for f in faults if f.at_ns == 0]


def during_run(faults: Iterable[Fault]) -> list[Fault]:
    """The faults after time 0, in the order they happen."""
    return sorted((f for f in faults if f.at_ns > 0), key=lambda f: f.at_ns)


def routing_at_start(
    fabric: Fabric, faults: Iterable[Fault], policy: str = "5tuple", seed: int = 0,
    *, same_seed: bool = False,
) -> Routing:  # fmt: skip
    """The routing a run starts with: its faults at time 0 applied."""
    first = at_start(faults)
    return Routing(
        fabric,
        policy,
        seed,
        same_seed=same_seed,
        failed_links=[f.target for f in first if f.kind == "link"],
        failed_nodes=[f.target for f in first if f.kind == "node"],
    )


def routing_after(fault: Fault, before: Routing) -> Routing:
    """The routing once `fault` happened: its link or switch left out (down or drained)."""
    links = [fault.target] if fault.kind == "link" else []
    nodes = [fault.target] if fault.kind == "node" else []
    return before.without(links=links, nodes=nodes)


def fault_ports(fabric: Fabric, fault: Fault) -> list[int]:
    """The ports that go down with a `down` fault: both ends of its link, or of every link
    of its switch."""
    if fault.kind == "link":
        return [2 * fault.target, 2 * fault.target + 1]
    links = np.flatnonzero((fabric.link_a == fault.target) | (fabric.link_b == fault.target))
    return [int(p) for link in links for p in (2 * link, 2 * link + 1)]


def applied(
    fabric: Fabric, fault: Fault, applied_ns: int | None = None, settled_ns: int | None = None,
    **more,
) -> dict:  # fmt: skip
    """A fault as both engines record it in the run's summary: what, at_ns (as asked),
    applied_ns (when the change began) and settled_ns (when every switch routed around it);
    the simulator applies and re-routes at once, so all three are at_ns there."""
    at = int(fault.at_ns)
    return {
        **describe(fabric, fault),
        "at_ns": at,
        "applied_ns": at if applied_ns is None else int(applied_ns),
        "settled_ns": at if settled_ns is None else int(settled_ns),
        **more,
    }


def describe(fabric: Fabric, fault: Fault) -> dict:
    """The fault as run.json records it: kind, target by name, action."""
    if fault.kind == "link":
        target = fabric.port_name(2 * fault.target)
    else:
        target = fabric.node_name[fault.target]
    return {"kind": fault.kind, "target": target, "action": fault.action}
