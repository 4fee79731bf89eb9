"""Builders: a checked `Spec` in, a `Fabric` value out.

Naming scheme, stated once: NICs are `z{zone}-r{rack}-h{server}-nic{gpu}`,
rack switches `z{zone}-r{rack}-rtsw` (rail switches `z{zone}-r{group}-rtsw{rail}`),
spine switches `z{zone}-ctsw{plane}` and aggregation switches
`p{plane}-atsw{i}`. A k-ary fat tree uses the same scheme with a pod as the
zone and an edge switch as the rack.

Links are added NIC links first, then tier by tier upward, so a switch's
downlinks have the lower local port numbers.
"""

from __future__ import annotations

import math

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric, FabricBuilder, Role
from aifabric.topologies.spec import Spec

# What one machine builds and the flow tables address: node ids fit 21 bits
# (aifabric.traffic.generate), and a link costs about 250 bytes while it is built.
MAX_NODES = (1 << 21) - 1
MAX_LINKS = 8_000_000
BUILD_BYTES = 250  # per node and per link, measured on fat trees


def build(spec: Spec) -> Fabric:
    """Build the fabric a checked spec describes."""
    return _BUILDERS[spec.kind](spec)


class _Plan:
    """Shared helpers: link parameters and the error sentences."""

    def __init__(self, spec: Spec):
        self.spec = spec
        links = spec["links"]
        self.nic_rate = links["rate"]
        self.fabric_rate = links["fabric_rate"] or links["rate"]
        self.nic_delay = links["delay"]
        self.fabric_delay = links["fabric_delay"]
        self.mtu = links["mtu"]
        self.b = FabricBuilder(spec.name, spec.kind)

    def fail(self, message: str):
        raise SpecError(f"topology {self.spec.name}: {message}")

    def whole(self, value: float, key: str, shown, what: str) -> int:
        """`value` must be a positive whole number, or the spec's `key` is at fault."""
        n = round(value)
        if abs(value - n) > 1e-9:
            self.fail(f"{key} = {shown!r} does not divide evenly: {what} comes to {value:g}")
        if n < 1:
            self.fail(f"{key} = {shown!r} leaves zero {what}")
        return n

    def fits(self, nodes: int, links: int, what: str):
        """Refuse, before building anything, a fabric beyond MAX_NODES or MAX_LINKS."""
        if nodes > MAX_NODES or links > MAX_LINKS:
            need = (nodes + links) * BUILD_BYTES
            self.fail(
                f"{what} makes {nodes:,} nodes and {links:,} links (about {need / 1e9:,.1f} GB "
                f"to build); aifabric builds at most {MAX_NODES:,} nodes and {MAX_LINKS:,} links"
            )

    def radix(self, role: str, ports: int, what: str):
        limit = self.spec["radix"][role]
        if ports > limit:
            self.fail(
                f"radix.{role} = {limit} is too small: "
                f"each {role.upper()} needs {ports} ports ({what})"
            )

    def nic_link(self, nic: int, switch: int):
        self.b.link(nic, switch, self.nic_rate, self.nic_delay, self.mtu)

    def fabric_link(self, low: int, high: int):
        self.b.link(low, high, self.fabric_rate, self.fabric_delay, self.mtu)

    def done(self) -> Fabric:
        return self.b.build(queues=self.spec.queues, spec=self.spec.raw)


def _racks(p: _Plan, zone: int, racks: int) -> list[int]:
    """Racks of servers, one RTSW each; returns the RTSW ids."""
    s = p.spec["servers"]
    rtsws = []
    for r in range(racks):
        nics = [
            p.b.node(f"z{zone}-r{r}-h{h}-nic{g}", Role.NIC, zone=zone, rack=r, server=h, rail=g)
            for h in range(s["servers_per_rack"])
            for g in range(s["gpus_per_server"])
        ]
        rtsw = p.b.node(f"z{zone}-r{r}-rtsw", Role.RTSW, zone=zone, rack=r)
        for nic in nics:
            p.nic_link(nic, rtsw)
        rtsws.append(rtsw)
    return rtsws


def _zone_shape(p: _Plan) -> tuple[int, int]:
    """(CTSWs per zone, links from each RTSW to each CTSW)."""
    s, z = p.spec["servers"], p.spec["zone"]
    nics_per_rack = s["gpus_per_server"] * s["servers_per_rack"]
    ctsw = p.whole(
        z["ctsw_planes"] * z["spine_redundancy"],
        "zone.spine_redundancy",
        z["spine_redundancy"],
        f"CTSWs ({z['ctsw_planes']} planes x {z['spine_redundancy']:g})",
    )
    per_ctsw = p.whole(
        nics_per_rack * p.nic_rate * z["rtsw_up_down"] / (z["ctsw_planes"] * p.fabric_rate),
        "zone.rtsw_up_down",
        z["rtsw_up_down"],
        f"uplinks from each RTSW to each of {z['ctsw_planes']} CTSW planes",
    )
    p.radix(
        "rtsw", nics_per_rack + ctsw * per_ctsw, f"{nics_per_rack} NICs, {ctsw * per_ctsw} uplinks"
    )
    return ctsw, per_ctsw


def _zone(p: _Plan, zone: int, ctsw: int, per_ctsw: int) -> list[int]:
    """One AI Zone: racks with RTSWs, and CTSWs joined to every RTSW; returns the CTSW ids."""
    rtsws = _racks(p, zone, p.spec["zone"]["racks"])
    ctsws = [p.b.node(f"z{zone}-ctsw{c}", Role.CTSW, zone=zone, plane=c) for c in range(ctsw)]
    for rtsw in rtsws:
        for c in ctsws:
            for _ in range(per_ctsw):
                p.fabric_link(rtsw, c)
    return ctsws


def _zone_size(p: _Plan, ctsw: int, per_ctsw: int) -> tuple[int, int]:
    """(nodes, links) of one AI Zone."""
    s, racks = p.spec["servers"], p.spec["zone"]["racks"]
    nics = s["gpus_per_server"] * s["servers_per_rack"]
    return racks * (nics + 1) + ctsw, racks * (nics + ctsw * per_ctsw)


def _two_tier(spec: Spec) -> Fabric:
    p = _Plan(spec)
    ctsw, per_ctsw = _zone_shape(p)
    racks = spec["zone"]["racks"]
    p.fits(*_zone_size(p, ctsw, per_ctsw), f"zone.racks = {racks:,}")
    p.radix("ctsw", racks * per_ctsw, f"{racks * per_ctsw} downlinks")
    _zone(p, 0, ctsw, per_ctsw)
    return p.done()


def _three_tier(spec: Spec) -> Fabric:
    p = _Plan(spec)
    ctsw, per_ctsw = _zone_shape(p)
    agg = spec["aggregation"]
    racks = spec["zone"]["racks"]
    down = racks * per_ctsw
    per_atsw_group = agg["atsw_per_plane"]
    # Uplinks per CTSW: enough to keep downlink:uplink capacity at or under the
    # oversubscription, spread evenly over the ATSWs of the CTSW's plane.
    needed = math.ceil(down / agg["oversubscription"] - 1e-9)
    up = per_atsw_group * math.ceil(needed / per_atsw_group)
    nodes, links = _zone_size(p, ctsw, per_ctsw)
    n_zones = agg["zones"]
    p.fits(
        n_zones * nodes + ctsw * per_atsw_group,
        n_zones * (links + ctsw * up),
        f"aggregation.zones = {n_zones:,} of zone.racks = {racks:,}",
    )
    p.radix("ctsw", down + up, f"{down} downlinks, {up} uplinks")
    p.radix(
        "atsw",
        agg["zones"] * up // per_atsw_group,
        f"{agg['zones'] * up // per_atsw_group} downlinks",
    )
    zones = [_zone(p, z, ctsw, per_ctsw) for z in range(agg["zones"])]
    atsws = [
        [p.b.node(f"p{plane}-atsw{i}", Role.ATSW, plane=plane) for i in range(per_atsw_group)]
        for plane in range(ctsw)
    ]
    for ctsws in zones:
        for plane, c in enumerate(ctsws):
            for a in atsws[plane]:
                for _ in range(up // per_atsw_group):
                    p.fabric_link(c, a)
    return p.done()


def _rail(spec: Spec) -> Fabric:
    p = _Plan(spec)
    s, r = spec["servers"], spec["rail"]
    rails, servers = s["gpus_per_server"], r["servers_per_group"]
    per_spine = p.whole(
        servers * p.nic_rate * r["rail_up_down"] / (r["spines"] * p.fabric_rate),
        "rail.rail_up_down",
        r["rail_up_down"],
        f"uplinks from each rail switch to each of {r['spines']} spines",
    )
    p.radix(
        "rtsw",
        servers + r["spines"] * per_spine,
        f"{servers} NICs, {r['spines'] * per_spine} uplinks",
    )
    p.fits(
        r["groups"] * rails * (servers + 1) + r["spines"],
        r["groups"] * rails * (servers + r["spines"] * per_spine),
        f"rail.groups = {r['groups']:,} of rail.servers_per_group = {servers:,}",
    )
    p.radix("ctsw", r["groups"] * rails * per_spine, f"{r['groups'] * rails * per_spine} downlinks")
    rail_switches = []
    for g in range(r["groups"]):
        nics = [
            [
                p.b.node(f"z0-r{g}-h{h}-nic{k}", Role.NIC, zone=0, rack=g, server=h, rail=k)
                for k in range(rails)
            ]
            for h in range(servers)
        ]
        switches = [
            p.b.node(f"z0-r{g}-rtsw{k}", Role.RTSW, zone=0, rack=g, rail=k) for k in range(rails)
        ]
        for h in range(servers):
            for k in range(rails):
                p.nic_link(nics[h][k], switches[k])
        rail_switches.extend(switches)
    spines = [p.b.node(f"z0-ctsw{c}", Role.CTSW, zone=0, plane=c) for c in range(r["spines"])]
    for sw in rail_switches:
        for c in spines:
            for _ in range(per_spine):
                p.fabric_link(sw, c)
    return p.done()


def _fat_tree(spec: Spec) -> Fabric:
    p = _Plan(spec)
    k = spec["fat_tree"]["k"]
    if k % 2:
        p.fail(f"fat_tree.k = {k} must be even")
    p.fits(k**3 // 4 + 5 * k * k // 4, 3 * k**3 // 4, f"fat_tree.k = {k:,}")
    half = k // 2
    b = p.b
    pods = []
    for pod in range(k):
        edges = []
        for e in range(half):
            hosts = [
                b.node(f"z{pod}-r{e}-h{h}-nic0", Role.NIC, zone=pod, rack=e, server=h, rail=0)
                for h in range(half)
            ]
            edge = b.node(f"z{pod}-r{e}-rtsw", Role.RTSW, zone=pod, rack=e)
            for host in hosts:
                p.nic_link(host, edge)
            edges.append(edge)
        pods.append(edges)
    aggs = []
    for pod in range(k):
        row = [b.node(f"z{pod}-ctsw{a}", Role.CTSW, zone=pod, plane=a) for a in range(half)]
        for edge in pods[pod]:
            for agg in row:
                p.fabric_link(edge, agg)
        aggs.append(row)
    cores = [
        [b.node(f"p{a}-atsw{j}", Role.ATSW, plane=a) for j in range(half)] for a in range(half)
    ]
    for row in aggs:
        for a, agg in enumerate(row):
            for core in cores[a]:
                p.fabric_link(agg, core)
    return p.done()


_BUILDERS = {
    "two-tier": _two_tier,
    "leaf-spine": _two_tier,
    "three-tier": _three_tier,
    "rail": _rail,
    "fat-tree": _fat_tree,
}
