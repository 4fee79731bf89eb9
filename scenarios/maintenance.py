"""A drain plan: switches taken out for maintenance in waves while jobs run.

`[maintenance]` selects switches (a tier, optionally within zones, or an explicit
list), cuts them into waves of `wave_size` in the plan's `order`, and drains each
wave at its time, holds it for `hold` and restores it (`up`), `gap` before the
next wave. The switches are split into maintenance domains (`domains`), and the
plan keeps the guarantee Meta's maintenance keeps ("Maintaining large-scale AI
capacity at Meta", 2024): at most one maintenance domain out at a time, so a wave
lies inside one domain and waves never overlap.

`expand` turns the plan into ordinary faults, a `drain` and an `up` per switch,
which the scenario's other faults join and `check_faults` checks; the waves
themselves (`Wave.to_dict`) are recorded in run.json (`scenario.maintenance.waves`)
for the analyzer, which reads each wave's window from there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aifabric.fabric.errors import AifabricError, SpecError, UnitError
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import Routing
from aifabric.fabric.scenario import Fault, job_names
from aifabric.fabric.specfile import check_table
from aifabric.fabric.units import parse_time

KEYS = ("tier", "zones", "switches", "wave_size", "order", "start", "hold", "gap", "domains")
ORDERS = ("index", "reverse")
TIERS = tuple(r.label for r in Role if r != Role.NIC)


@dataclass(frozen=True)
class Wave:
    """One wave of the plan: its switches (node ids), their maintenance domain, when
    they are drained and when restored."""

    index: int
    switches: tuple[int, ...]
    domain: int
    drain_ns: int
    restore_ns: int

    def faults(self) -> list[Fault]:
        drains = [Fault("node", s, self.drain_ns, "drain") for s in self.switches]
        return drains + [Fault("node", s, self.restore_ns, "up") for s in self.switches]

    def to_dict(self, fabric: Fabric) -> dict:
        return {
            "wave": self.index,
            "switches": [fabric.node_name[s] for s in self.switches],
            "domain": self.domain,
            "drain_ns": self.drain_ns,
            "restore_ns": self.restore_ns,
        }


def plan(fabric: Fabric, body: dict, flows=None, workload: dict | None = None) -> list[Wave]:
    """The waves of a `[maintenance]` table on `fabric` (none for an empty table), checked:
    the guarantee (one maintenance domain out at a time) and, given the flow table, that
    no wave cuts a job off (a flow that lost every path is not revived)."""
    body = check_table("maintenance", "maintenance", body, KEYS)
    if not body:
        return []
    switches = _selected(fabric, body)
    order = body.get("order", "index")
    if order not in ORDERS:
        raise SpecError(f"maintenance.order = {order!r} must be one of {', '.join(ORDERS)}")
    size = body.get("wave_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise SpecError(f"maintenance.wave_size = {size!r} must be a whole number, 1 or more")
    start, hold, gap = _time(body, "start", 0), _time(body, "hold", None), _time(body, "gap", 0)
    if hold <= 0:
        raise SpecError("maintenance.hold must be positive: a wave is drained, held, restored")
    domain = _domains(fabric, body.get("domains"), switches)
    walk = switches if order == "index" else switches[::-1]
    waves = []
    for i in range(0, len(walk), size):
        members = tuple(walk[i : i + size])
        held = sorted({domain[s] for s in members})
        k = len(waves)
        if len(held) > 1:
            raise SpecError(
                f"maintenance: wave {k} ({_names(fabric, members)}) takes out switches of "
                f"{len(held)} maintenance domains at once; the guarantee allows one domain "
                "out at a time"
            )
        at = start + k * (hold + gap)
        waves.append(Wave(k, members, held[0], at, at + hold))
    if flows is not None:
        _check_routable(fabric, waves, flows, workload or {})
    return waves


def expand(waves: list[Wave]) -> tuple[Fault, ...]:
    """The plan's faults: per wave a drain of each switch, then its restore."""
    return tuple(f for wave in waves for f in wave.faults())


def _time(body: dict, key: str, default) -> int:
    if key not in body and default is None:
        raise SpecError(f"maintenance.{key} is missing (a time, e.g. '200us')")
    try:
        value = parse_time(body.get(key, default))
    except UnitError as e:
        raise SpecError(f"maintenance.{key}: {e}") from None
    if value < 0:
        raise SpecError(f"maintenance.{key} must not be negative")
    return value


def _node(fabric: Fabric, name) -> int:
    try:
        node = fabric.node_id(name) if isinstance(name, str) else -1
    except AifabricError:
        node = -1
    if node < 0:
        raise SpecError(f"maintenance: fabric {fabric.name} has no switch {name!r}")
    if fabric.node_role[node] == Role.NIC:
        raise SpecError(f"maintenance: {name} is a NIC; maintenance drains switches")
    return node


def _selected(fabric: Fabric, body: dict) -> list[int]:
    """The plan's switches in their order: an explicit list as given, or a tier's switches
    (within `zones`) by node id."""
    if ("switches" in body) == ("tier" in body):
        raise SpecError("maintenance: give either tier (with zones) or switches, not both")
    if "switches" in body:
        if "zones" in body:
            raise SpecError("maintenance: zones select a tier's switches, not a list's")
        names = body["switches"]
        if not isinstance(names, list) or not names:
            raise SpecError("maintenance.switches must be a list of switch names")
        nodes = [_node(fabric, n) for n in names]
        if len(set(nodes)) < len(nodes):
            raise SpecError("maintenance.switches names a switch twice")
        return nodes
    tier = body["tier"]
    if tier not in TIERS:
        raise SpecError(f"maintenance.tier = {tier!r} must be one of {', '.join(TIERS)}")
    chosen = fabric.node_role == Role[tier.upper()]
    if "zones" in body:
        zones = body["zones"]
        zones = [zones] if isinstance(zones, int) and not isinstance(zones, bool) else zones
        if not isinstance(zones, list) or not all(isinstance(z, int) for z in zones):
            raise SpecError("maintenance.zones must be a zone number or a list of them")
        chosen &= np.isin(fabric.node_zone, zones)
    nodes = [int(n) for n in np.flatnonzero(chosen)]
    if not nodes:
        raise SpecError(f"maintenance: fabric {fabric.name} has no {tier} switch to maintain")
    return nodes


def _domains(fabric: Fabric, spec, switches: list[int]) -> dict[int, int]:
    """Each switch's maintenance domain: by default its own; `N` splits the switches, by node
    id, into N runs of consecutive switches; "zone" is each AI Zone; a list of lists of
    names gives them."""
    ordered = sorted(switches)
    if spec is None:
        return {s: i for i, s in enumerate(ordered)}
    if spec == "zone":
        return {s: int(fabric.node_zone[s]) for s in ordered}
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not 1 <= spec <= len(ordered):
            raise SpecError(
                f"maintenance.domains = {spec} must be between 1 and the plan's "
                f"{len(ordered)} switches"
            )
        return {int(s): d for d, run in enumerate(np.array_split(ordered, spec)) for s in run}
    if isinstance(spec, list) and all(isinstance(d, list) for d in spec):
        out: dict[int, int] = {}
        for d, names in enumerate(spec):
            for name in names:
                node = _node(fabric, name)
                if node in out:
                    raise SpecError(f"maintenance.domains puts {name} in two domains")
                out[node] = d
        missing = [s for s in ordered if s not in out]
        if missing:
            raise SpecError(f"maintenance.domains leaves {_names(fabric, missing)} in no domain")
        return out
    raise SpecError(
        'maintenance.domains must be a number of domains, "zone", or lists of switch names'
    )


def _check_routable(fabric: Fabric, waves: list[Wave], flows, workload: dict) -> None:
    """One sentence for a wave that leaves some job's NICs no path to each other."""
    pairs = np.unique(np.stack([flows.src, flows.dst, flows.job], axis=1), axis=0)
    if not len(pairs):
        return
    names = job_names(workload) if workload else []
    for wave in waves:
        reach = Routing(fabric, failed_nodes=wave.switches).paths(pairs[:, 0], pairs[:, 1])
        cut = np.flatnonzero(~reach.reachable)
        if len(cut):
            src, dst, job = (int(x) for x in pairs[cut[0]])
            who = names[job] if job < len(names) else f"job {job}"
            raise SpecError(
                f"maintenance: wave {wave.index} ({_names(fabric, wave.switches)}) would cut "
                f"job {who} off ({fabric.node_name[src]} could not reach "
                f"{fabric.node_name[dst]}), and the simulator does not revive a flow that "
                "lost every path"
            )


def _names(fabric: Fabric, nodes) -> str:
    return ", ".join(fabric.node_name[s] for s in nodes)
