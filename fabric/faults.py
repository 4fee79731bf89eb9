"""Faults and routes, for every engine: which ports a fault takes down and the routing after it.

A fault (`aifabric.fabric.scenario.Fault`) takes a link or a switch down, or drains it
(no new flows; flows in flight finish), at a time, or brings one taken down or
drained earlier back up (`up`). The simulator and the emulator both start from
`routing_at_start` (the faults at time 0 applied) and, for each later fault, take
down `fault_ports` (a `down` fault) or bring back `restored_ports` (an `up`) and
route over `routing_after`. `check_faults` says in one sentence when a scenario's
faults cannot happen in their order (a restore of something that is up).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import Routing
from aifabric.fabric.scenario import Fault
from aifabric.fabric.units import format_time

KINDS = ("link", "node")
ACTIONS = ("down", "drain", "up")


def check_fault(fabric: Fabric, fault: Fault) -> None:
    """One sentence for a fault `fabric` cannot have."""
    if fault.kind not in KINDS:
        raise AifabricError(f"a fault is on a link or a node, not a {fault.kind!r}")
    if fault.action not in ACTIONS:
        raise AifabricError(
            f"a fault takes a link or node down, drains it or brings it back up, "
            f"not {fault.action!r}"
        )
    limit = fabric.n_links if fault.kind == "link" else fabric.n_nodes
    if not 0 <= fault.target < limit:
        raise AifabricError(f"fabric {fabric.name} has no {fault.kind} {fault.target}")
    if fault.kind == "node" and fabric.node_role[fault.target] == Role.NIC:
        raise AifabricError(f"{fabric.node_name[fault.target]} is a NIC; faults take down switches")
    if fault.at_ns < 0:
        raise AifabricError("a fault's time must not be negative")


def check_faults(fabric: Fabric, faults: Iterable[Fault]) -> None:
    """One sentence for faults `fabric` cannot have or that cannot happen in their order: a
    link or switch taken down (or drained) twice with no restore between, or restored
    (`up`) when it was not down or drained before that time."""
    out: dict[tuple[str, int], tuple[set[str], int]] = {}
    for fault in in_order(faults):
        check_fault(fabric, fault)
        what = describe(fabric, fault)["target"]
        actions, since_ns = out.setdefault((fault.kind, fault.target), (set(), 0))
        if fault.action == "up":
            if not actions or since_ns >= fault.at_ns:
                raise AifabricError(
                    f"{fault.kind} {what} is restored (action up) at {format_time(fault.at_ns)} "
                    "but is not down or drained before then"
                )
            actions.clear()
        elif fault.action in actions:
            raise AifabricError(
                f"{fault.kind} {what} is {fault.action} twice with no restore (action up) between"
            )
        else:
            actions.add(fault.action)
        out[(fault.kind, fault.target)] = (actions, fault.at_ns)


def in_order(faults: Iterable[Fault]) -> list[Fault]:
    """The faults in the order they happen: by time, those at one time as given."""
    return sorted(faults, key=lambda f: f.at_ns)


def at_start(faults: Iterable[Fault]) -> list[Fault]:
    return [f for f in faults if f.at_ns == 0]


def during_run(faults: Iterable[Fault]) -> list[Fault]:
    """The faults after time 0, in the order they happen."""
    return [f for f in in_order(faults) if f.at_ns > 0]


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
    """The routing once `fault` happened: its link or switch left out (down or drained), or
    back in (up): ECMP hashes over what is there again."""
    links = [fault.target] if fault.kind == "link" else []
    nodes = [fault.target] if fault.kind == "node" else []
    if fault.action == "up":
        return before.restored(links=links, nodes=nodes)
    return before.without(links=links, nodes=nodes)


def fault_ports(fabric: Fabric, fault: Fault) -> list[int]:
    """The ports that go down with a `down` fault: both ends of its link, or of every link
    of its switch."""
    if fault.kind == "link":
        return [2 * fault.target, 2 * fault.target + 1]
    links = np.flatnonzero((fabric.link_a == fault.target) | (fabric.link_b == fault.target))
    return [int(p) for link in links for p in (2 * link, 2 * link + 1)]


def ports_down(fabric: Fabric, faults: Iterable[Fault]) -> set[int]:
    """The ports down once `faults` happened, in order: those of every `down` fault not
    restored since."""
    down: dict[tuple[str, int], Fault] = {}
    for fault in in_order(faults):
        key = (fault.kind, fault.target)
        if fault.action == "down":
            down[key] = fault
        elif fault.action == "up":
            down.pop(key, None)
    return {p for fault in down.values() for p in fault_ports(fabric, fault)}


def restored_ports(fabric: Fabric, fault: Fault, earlier: Iterable[Fault]) -> list[int]:
    """The ports an `up` fault brings back after `earlier`: those its target took down,
    save the ones another fault still holds down (a link of a switch that is down)."""
    earlier = list(earlier)
    return sorted(ports_down(fabric, earlier) - ports_down(fabric, [*earlier, fault]))


def rerouted_switches(before: Routing, after: Routing) -> np.ndarray:
    """The switches whose next hops towards some NIC differ between two routings (a
    switch down in `after` is not counted: it forwards nothing)."""
    f = before.fabric
    sw_ord = before.sw_ord
    changed = np.zeros(f.n_nodes, dtype=bool)
    inter = np.flatnonzero((sw_ord[f.port_node] >= 0) & (sw_ord[f.port_peer] >= 0))
    leaf_ports = f.nic_port[f.nic_ids] ^ 1  # each leaf's port to a NIC: its last hop
    moved_leaf = before.port_alive[leaf_ports] != after.port_alive[leaf_ports]
    changed[f.port_node[leaf_ports[moved_leaf]]] = True
    for chunk in np.array_split(inter, max(1, len(inter) // 4096)):
        hops = [
            r.port_alive[chunk, None]
            & (r.dist[sw_ord[f.port_peer[chunk]]] == r.dist[sw_ord[f.port_node[chunk]]] - 1)
            for r in (before, after)
        ]
        changed[f.port_node[chunk[(hops[0] != hops[1]).any(axis=1)]]] = True
    changed[list(after.failed_nodes)] = False
    return np.flatnonzero(changed)


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


def record_key(record: dict) -> tuple:
    """What tells one fault's record (`applied`) from another's: kind, target, action, time."""
    return tuple(record.get(k) for k in ("kind", "target", "action", "at_ns"))


def describe(fabric: Fabric, fault: Fault) -> dict:
    """The fault as run.json records it: kind, target by name, action."""
    if fault.kind == "link":
        target = fabric.port_name(2 * fault.target)
    else:
        target = fabric.node_name[fault.target]
    return {"kind": fault.kind, "target": target, "action": fault.action}
