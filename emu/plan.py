"""The emulated fabric as data: names, addresses and the kernel configuration of every node.

Nothing here touches the kernel. `plan(scenario, ...)` returns a `Plan`: a short
Linux name for every node and port (a table back to the fabric's names), MAC
and IPv4 addresses, and per node the sysctls, `ip -batch` lines and `tc -batch`
lines that build it. `aifabric.emu.net` applies a plan in one place.

Names: NIC n (its ordinal among NICs) is host `afh{n}`, switch s (its ordinal
among switches) is `afs{s}`, and the port with local number k of a node is
interface `{node}p{k}` (`afs12p15`: at most 15 characters up to 10**5 nodes).
The `af` prefix is how `aifabric clean` recognises what is ours.

Addresses: NIC ports carry the NIC's `10.zone.rack.slot` (aifabric.fabric.addressing);
every switch port p carries `100.64.0.0 + p` on the /31 of its link, so both
ends of link l share `100.64.0.0 + 2l` / 31. MAC of port p: `02:af` and p in
four bytes. Neighbours are static (no ARP on the wire), so a paused egress
never holds back address resolution.

Rates are divided by `scale` (HTB cannot run 400 Gb/s on veth); time
stretches by the same factor, so buffers and thresholds keep their bytes and
a link's propagation delay becomes `delay * scale`. Where the kernel has
netem (`delay="netem"`), every egress holds its packets that long before
they join the queue; without netem (`delay="none"`) links have no delay.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import numpy as np

from aifabric.fabric.addressing import ROCE_UDP_PORT, format_ipv4, nic_ipv4
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.faults import fault_ports, restored_ports, routing_after, routing_at_start
from aifabric.fabric.frames import DSCP_CNP
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import Routing, switch_seeds

PREFIX = "af"
P2P_BASE = int(ipaddress.IPv4Address("100.64.0.0"))
MTU_BYTES = 9000
HOST_BUFFER_BYTES = 64 * 2**20  # a sender's NIC queue: large, senders block on their socket
MAX_PACKET_BYTES = 9100  # the pause burst: at most one frame leaves after PAUSE
HASH_POLICY = {
    "5tuple": 1,
    "eecmp": 1,
    "pinned": 0,
    "spray": 1,
    "adaptive": 1,
    "linux": 1,
    "ovs": 1,
}
ECN_MECHANISMS = ("red", "ebpf", "none")
DELAY_MECHANISMS = ("netem", "none")
NETEM_LIMIT_PACKETS = 10_000  # frames on the wire at once: far above rate * delay / MTU
DEFAULT_TARGET_BPS = 20_000_000  # the fastest link after scaling
# What one replay process sends, with room, on a 2-core machine: 20,000 packets/s of 4 KiB
# (it measured 26,400 through lab-small's routers; benchmarks/bench_emu.py).
REPLAY_BUDGET_BPS = 20_000 * 4096 * 8


@dataclass(frozen=True)
class NodeConfig:
    name: str  # short Linux name
    fabric_name: str
    node: int
    sysctl: tuple[tuple[str, str], ...]
    ip: tuple[str, ...]  # `ip -batch` lines
    tc: tuple[str, ...]  # `tc -batch` lines
    ecn_ifaces: tuple[tuple[str, int], ...] = ()  # (interface, port) with an eBPF marker


@dataclass(frozen=True)
class Plan:
    scale: int
    ecn: str  # red | ebpf | none
    delay: str  # netem | none
    hash_policy: int
    nodes: tuple[NodeConfig, ...]
    port_iface: tuple[str, ...]  # interface name of every fabric port
    port_mac: tuple[str, ...]
    port_rate_bps: np.ndarray  # scaled
    node_short: tuple[str, ...]
    hash_seed: np.ndarray  # uint32 per node (switches)
    nic_ip: np.ndarray  # uint32 per node
    notes: dict = field(default_factory=dict)
    routing: Routing | None = None  # what the routes were made from (faults at time 0 applied)

    def table(self) -> dict[str, str]:
        """Short Linux name -> fabric name, for nodes and interfaces alike."""
        return {c.name: c.fabric_name for c in self.nodes}


def short_names(fabric: Fabric) -> tuple[str, ...]:
    out = []
    nic_ord = np.cumsum(fabric.node_role == Role.NIC) - 1
    sw_ord = np.cumsum(fabric.node_role != Role.NIC) - 1
    for i in range(fabric.n_nodes):
        if fabric.node_role[i] == Role.NIC:
            out.append(f"{PREFIX}h{int(nic_ord[i])}")
        else:
            out.append(f"{PREFIX}s{int(sw_ord[i])}")
    return tuple(out)


def port_mac(port: int) -> str:
    b = int(port).to_bytes(4, "big")
    return "02:af:" + ":".join(f"{x:02x}" for x in b)


def p2p_ip(port: int) -> int:
    return P2P_BASE + int(port)


def choose_scale(
    fabric: Fabric,
    target_bps: int = DEFAULT_TARGET_BPS,
    senders=None,
    replay_bps: int = REPLAY_BUDGET_BPS,
) -> int:
    """The rate divisor that brings the fastest link down to about `target_bps`.

    With `senders` (NIC ids), also far enough that all of them at line rate
    stay within what one replay process sends (`replay_bps`): past that the
    replay, not the fabric, sets the pace, and collectives come out slower
    than the fabric would run them (the demo's ring AllReduce took 2.2 times
    the simulator's time at the link target alone, and the same time here).
    """
    top = int(fabric.link_rate_bps.max()) if fabric.n_links else 1
    scale = max(1, -(-top // target_bps))
    if senders is not None and len(senders):
        offered = int(fabric.port_rate_bps[fabric.nic_port[np.asarray(senders)]].sum())
        scale = max(scale, -(-offered // replay_bps))
    return scale


@dataclass(frozen=True)
class Estimate:
    """How long the replay of a flow table should take, in wall seconds, before anything runs.

    `fabric_ns` is a lower bound of the fabric time: the busiest port's bytes
    at its rate (NICs, and switch ports on the flows' paths as the emulator's
    switches hash them, so that ECMP collisions count), or the longest chain
    of dependent flows (each at its sender's line rate, not before its
    `start_ns`), whichever is longer. At
    `scale` that is `fabric_ns * scale` of wall time; the replay cannot be
    faster than its packets at the rate it sends them (`replay_pps`) either.
    """

    scale: int
    packets: int
    fabric_ns: int
    replay_pps: float
    fabric_wall_s: float
    replay_wall_s: float
    overrun: int = 0  # > 1: senders that overrun a receiver's port with nothing to stop them

    @property
    def wall_s(self) -> float:
        bound = max(self.fabric_wall_s, self.replay_wall_s)
        return bound * LOSSY_INCAST_FACTOR if self.overrun > 1 else bound

    def timeout_s(self) -> float:
        """How long the replay may run: the estimate with a generous margin."""
        return TIMEOUT_FACTOR * self.wall_s + TIMEOUT_SLACK_S


# The estimate is a lower bound: ECMP collisions, DCQCN, PFC and drops add to it (the simulator
# puts ecmp-permutation at 9 times it, incast-lossy at 14; the emulator takes longer on a busy
# machine). A replay that stops delivering gives up long before this (`Replay.stall_s`).
TIMEOUT_FACTOR = 60
TIMEOUT_SLACK_S = 300.0  # Open vSwitch's ecmp-permutation took 137 s for an estimate of 2 s
# Senders that together overrun a receiver's port of a lossy fabric (PFC off, no congestion
# control) drop and resend go-back-N, everything after each drop: incast-lossy's 15 senders
# delivered 35 of their 60 MB in 32 times the bound (13 minutes) on a busy 2-core machine.
LOSSY_INCAST_FACTOR = 50


def estimate(
    scenario, scale: int, replay_pps: float, mtu: int = 4096, policy: str = "linux"
) -> Estimate:
    """The wall time of replaying `scenario`'s flow table at `scale` (see `Estimate`); the
    switches hash by `policy` (`linux` for routers, `ovs` for Open vSwitch bridges)."""
    f: Fabric = scenario.fabric
    ft = scenario.flows
    nbytes = ft.bytes.astype(np.int64)
    packets = int((-(-nbytes // mtu)).sum())
    src_bps = f.port_rate_bps[f.nic_port[ft.src]].astype(np.float64)
    dst_bps = f.port_rate_bps[f.nic_port[ft.dst]].astype(np.float64)
    line_ns = nbytes * 8e9 / np.minimum(src_bps, dst_bps)
    load_ns = 0.0
    for ends, bps in ((ft.src, src_bps), (ft.dst, dst_bps)):
        if len(ends):
            busy = np.bincount(ends, weights=nbytes * 8e9 / bps, minlength=f.n_nodes)
            load_ns = max(load_ns, float(busy.max()))
    if len(ft):
        routing = routing_at_start(
            f, scenario.faults, policy, scenario.hash_seed, same_seed=scenario.same_seed
        )
        carried = routing.paths(ft.src, ft.dst, ft.sport).port_counts(f.n_ports, nbytes)
        load_ns = max(load_ns, float((carried * 8e9 / f.port_rate_bps).max()))
    finish = np.zeros(len(ft))
    ptr, dep, start = ft.dep_ptr, ft.dep, ft.start_ns.astype(np.float64)
    for i in range(len(ft)):  # dependencies are earlier rows
        ready = finish[dep[ptr[i] : ptr[i + 1]]].max() if ptr[i + 1] > ptr[i] else 0.0
        finish[i] = max(ready, start[i]) + line_ns[i]
    fabric_ns = int(max(load_ns, float(finish.max()) if len(ft) else 0.0))
    return Estimate(
        overrun=_lossy_overrun(scenario, src_bps, dst_bps),
        scale=int(scale),
        packets=packets,
        fabric_ns=fabric_ns,
        replay_pps=float(replay_pps),
        fabric_wall_s=fabric_ns * scale / 1e9,
        replay_wall_s=packets / replay_pps if replay_pps > 0 else float("inf"),
    )


def _lossy_overrun(scenario, src_bps, dst_bps) -> int:
    """The most senders that start together, with no dependencies, towards one receiver
    whose port they overrun, where the fabric has no PFC and no congestion control (else 0)."""
    f: Fabric = scenario.fabric
    ft = scenario.flows
    lossless = all(
        f.queue(Role(int(r))).pfc.enabled for r in set(f.node_role.tolist()) if r != Role.NIC
    )
    if lossless or scenario.cc != "none" or not len(ft):
        return 0
    free = np.diff(ft.dep_ptr) == 0
    worst = 0
    for key in {(int(d), int(t)) for d, t in zip(ft.dst[free], ft.start_ns[free], strict=True)}:
        group = free & (ft.dst == key[0]) & (ft.start_ns == key[1])
        senders = np.unique(ft.src[group])
        if src_bps[group].sum() > dst_bps[group][0] and len(senders) > 1:
            worst = max(worst, len(senders))
    return worst


def _rate(bps: int) -> str:
    return f"{max(int(bps), 8)}bit"


def port_tc(
    iface: str,
    rate_bps: int,
    buffer_bytes: int,
    *,
    ecn: str,
    kmin_bytes: int = 0,
    kmax_bytes: int = 0,
    pmax: float = 0.0,
    delay_ns: int = 0,
) -> list[str]:
    """`tc -batch` lines for one egress: HTB at the link rate, two classes, pausable TBF, FIFO.

    Class 1:10 (DSCP 48: CNPs) is served first and never paused; class 1:30
    carries the lossless priority through TBF 30: (transparent until a PAUSE
    turns its rate to nothing) into a byte-limited FIFO 31:, or RED with ECN
    when `ecn == "red"`. With `delay_ns` (already scaled) a netem delay line
    sits in front of each class's queue (10: for CNPs, 33: above 31:): a
    frame waits out the link's propagation delay, then queues for the link.
    The queue the monitor reads stays 31:, so frames still "on the wire" are
    not counted as backlog.
    """
    r = _rate(rate_bps)
    lines = [
        f"qdisc replace dev {iface} root handle 1: htb default 30",
        f"class add dev {iface} parent 1: classid 1:1 htb rate {r} ceil {r} "
        f"burst {MAX_PACKET_BYTES * 2} cburst {MAX_PACKET_BYTES * 2} quantum {MAX_PACKET_BYTES}",
        f"class add dev {iface} parent 1:1 classid 1:10 htb rate {_rate(rate_bps // 10)} "
        f"ceil {r} prio 0 quantum {MAX_PACKET_BYTES}",
        f"class add dev {iface} parent 1:1 classid 1:30 htb rate {_rate(rate_bps - rate_bps // 10)}"
        f" ceil {r} prio 1 quantum {MAX_PACKET_BYTES}",
    ]
    if delay_ns > 0:
        lines.append(f"qdisc add dev {iface} parent 1:10 handle 10: {_netem(delay_ns)}")
    else:
        lines.append(f"qdisc add dev {iface} parent 1:10 handle 10: pfifo limit 1000")
    lines.append(
        tbf_line(iface, paused=False, rate_bps=rate_bps, buffer_bytes=buffer_bytes, verb="add")
    )
    parent = "30:1"
    if delay_ns > 0:
        lines.append(f"qdisc add dev {iface} parent 30:1 handle 33: {_netem(delay_ns)}")
        parent = "33:1"
    if ecn == "red":
        avpkt = 4200
        burst = max(1, (2 * kmin_bytes + kmax_bytes) // (3 * avpkt))
        lines.append(
            f"qdisc add dev {iface} parent {parent} handle 31: red limit {buffer_bytes} "
            f"min {kmin_bytes} max {kmax_bytes} avpkt {avpkt} burst {burst} "
            f"probability {pmax:g} bandwidth {r} ecn"
        )
    else:
        lines.append(f"qdisc add dev {iface} parent {parent} handle 31: bfifo limit {buffer_bytes}")
    lines.append(
        f"filter add dev {iface} parent 1: protocol ip prio 1 u32 "
        f"match ip dsfield {DSCP_CNP << 2:#x} 0xfc flowid 1:10"
    )
    return lines


def _netem(delay_ns: int) -> str:
    """A netem delay line of `delay_ns` (whole microseconds, at least one)."""
    return f"netem delay {max(1, round(delay_ns / 1000))}us limit {NETEM_LIMIT_PACKETS}"


def tbf_line(
    iface: str, *, paused: bool, rate_bps: int, buffer_bytes: int, verb: str = "change"
) -> str:
    """The TBF that PFC turns off (PAUSE) and on (resume); its child keeps the queue."""
    rate = "8bit" if paused else _rate(4 * rate_bps)
    burst = MAX_PACKET_BYTES if paused else 8 * MAX_PACKET_BYTES
    return (
        f"qdisc {verb} dev {iface} parent 1:30 handle 30: tbf rate {rate} "
        f"burst {burst} limit {buffer_bytes}"
    )


def ecn_tc(iface: str, obj: str) -> list[str]:
    """The eBPF marker on clsact egress (direct action: it only marks, never drops)."""
    return [
        f"qdisc add dev {iface} clsact",
        f"filter add dev {iface} egress prio 1 bpf da obj {obj} sec tc",
    ]


def ecn_object_key(rate_bps: int, kmin: int, kmax: int, pmax: float) -> str:
    return f"ecn_{rate_bps}_{kmin}_{kmax}_{round(pmax * 65536)}"


def plan(
    scenario,
    *,
    ecn: str,
    delay: str = "none",
    scale: int | None = None,
    ecn_objects: dict[str, str] | None = None,
) -> Plan:
    """The whole emulated fabric of `scenario` as data (see the module docstring)."""
    fabric: Fabric = scenario.fabric
    if ecn not in ECN_MECHANISMS:
        raise AifabricError(f"ECN mechanism {ecn!r} is not one of {', '.join(ECN_MECHANISMS)}")
    if delay not in DELAY_MECHANISMS:
        raise AifabricError(
            f"link delay mechanism {delay!r} is not one of {', '.join(DELAY_MECHANISMS)}"
        )
    if scale is None:
        scale = choose_scale(fabric, senders=np.unique(scenario.flows.src))
    scale = int(scale)
    if scale < 1:
        raise AifabricError(f"the emulation scale must be a positive whole number, not {scale}")
    names = short_names(fabric)
    ips = nic_ipv4(fabric)
    n_ports = fabric.n_ports
    pnum = fabric.port_number
    iface = tuple(f"{names[fabric.port_node[p]]}p{int(pnum[p])}" for p in range(n_ports))
    if max((len(x) for x in iface), default=0) > 15:
        raise AifabricError(f"fabric {fabric.name} is too large for 15-character interface names")
    macs = tuple(port_mac(p) for p in range(n_ports))
    rates = np.maximum(fabric.port_rate_bps // scale, 8).astype(np.int64)
    delays = fabric.port_delay_ns * scale if delay == "netem" else np.zeros(n_ports, np.int64)
    seeds = switch_seeds(fabric.n_nodes, scenario.hash_seed, scenario.same_seed)
    policy = HASH_POLICY[scenario.ecmp]
    notes = {}
    if scenario.ecmp in ("spray", "adaptive"):
        notes["ecmp"] = (
            f"Linux multipath routing cannot do {scenario.ecmp}; "
            "the emulator hashes the 5-tuple instead"
        )
    elif scenario.ecmp == "eecmp":
        notes["ecmp"] = "Linux hashes the 5-tuple; the QPN-derived UDP source port carries the QP"
    elif scenario.ecmp == "pinned":
        notes["ecmp"] = "Linux hashes source and destination address (L3) for pinned"
    routing = routing_at_start(fabric, scenario.faults, seed=scenario.hash_seed)

    configs = []
    for v in range(fabric.n_nodes):
        ports = [int(p) for p in fabric.ports_of(v)]
        role = Role(int(fabric.node_role[v]))
        ip_lines: list[str] = []
        tc_lines: list[str] = []
        ecn_ifaces: list[tuple[str, int]] = []
        common = [
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
        ]
        if role == Role.NIC:
            p = ports[0]
            peer_p = p ^ 1
            dev = iface[p]
            gw = format_ipv4(p2p_ip(peer_p))
            ip_lines += [
                f"link set dev {dev} mtu {MTU_BYTES} up",
                f"addr add {format_ipv4(ips[v])}/32 dev {dev}",
                f"neigh replace {gw} lladdr {macs[peer_p]} dev {dev} nud permanent",
                f"route add {gw}/32 dev {dev} scope link",
                f"route add default via {gw} dev {dev} onlink",
            ]
            tc_lines += port_tc(
                dev, int(rates[p]), HOST_BUFFER_BYTES, ecn="none", delay_ns=int(delays[p])
            )
            sysctl = tuple(common)
        else:
            q = fabric.queue(role)
            sysctl = (
                ("net.ipv4.ip_forward", "1"),
                ("net.ipv4.fib_multipath_hash_policy", str(policy)),
                ("net.ipv4.fib_multipath_hash_seed", str(int(seeds[v]))),
                *common,
            )
            for p in ports:
                dev = iface[p]
                peer_p = p ^ 1
                peer = int(fabric.port_peer[p])
                ip_lines.append(f"link set dev {dev} mtu {MTU_BYTES} up")
                ip_lines.append(f"addr add {format_ipv4(p2p_ip(p))}/31 dev {dev}")
                if fabric.node_role[peer] == Role.NIC:
                    nip = format_ipv4(ips[peer])
                    ip_lines.append(
                        f"neigh replace {nip} lladdr {macs[peer_p]} dev {dev} nud permanent"
                    )
                else:
                    ip_lines.append(
                        f"neigh replace {format_ipv4(p2p_ip(peer_p))} lladdr {macs[peer_p]} "
                        f"dev {dev} nud permanent"
                    )
                e = q.ecn if q.ecn.enabled else None
                tc_lines += port_tc(
                    dev,
                    int(rates[p]),
                    q.buffer_bytes,
                    ecn=ecn if e else "none",
                    kmin_bytes=e.kmin_bytes if e else 0,
                    kmax_bytes=e.kmax_bytes if e else 0,
                    pmax=e.pmax if e else 0.0,
                    delay_ns=int(delays[p]),
                )
                if ecn == "ebpf" and e is not None:
                    key = ecn_object_key(int(rates[p]), e.kmin_bytes, e.kmax_bytes, e.pmax)
                    obj = (ecn_objects or {}).get(key, f"{key}.o")
                    tc_lines += ecn_tc(dev, obj)
                    ecn_ifaces.append((dev, p))
            ip_lines += [f"route add {r}" for r in switch_routes(fabric, routing, v, ips, iface)]
        configs.append(
            NodeConfig(
                name=names[v],
                fabric_name=fabric.node_name[v],
                node=v,
                sysctl=sysctl,
                ip=tuple(ip_lines),
                tc=tuple(tc_lines),
                ecn_ifaces=tuple(ecn_ifaces),
            )
        )
    return Plan(
        scale=scale,
        ecn=ecn,
        delay=delay,
        hash_policy=policy,
        nodes=tuple(configs),
        port_iface=iface,
        port_mac=macs,
        port_rate_bps=rates,
        node_short=names,
        hash_seed=seeds,
        nic_ip=ips,
        notes=notes,
        routing=routing,
    )


def switch_routes(fabric: Fabric, routing: Routing, switch: int, ips, iface) -> list[str]:
    """The routes of `switch`, one per NIC it can reach, as `ip route` arguments.

    `unreachable` for a NIC that `routing` cannot reach from here, so that
    replacing one switch's routes after a fault never needs a delete.
    """
    out = []
    for dst in fabric.nic_ids:
        hops = routing.next_hops(switch, int(dst))
        target = f"{format_ipv4(ips[dst])}/32"
        if len(hops) == 0:
            out.append(f"unreachable {target}")
        elif fabric.port_peer[hops[0]] == dst:
            out.append(f"{target} dev {iface[hops[0]]} scope link")
        elif len(hops) == 1:
            h = int(hops[0])
            out.append(f"{target} via {format_ipv4(p2p_ip(h ^ 1))} dev {iface[h]}")
        else:
            nh = " ".join(
                f"nexthop via {format_ipv4(p2p_ip(int(h) ^ 1))} dev {iface[int(h)]}" for h in hops
            )
            out.append(f"{target} {nh}")
    return out


def link_lines(pl: Plan, fabric: Fabric, fault, earlier=()) -> dict[int, list[str]]:
    """node -> `ip -batch` lines that take a `down` fault's interfaces down on both ends, or
    bring back up those an `up` fault restores after the faults `earlier` (not the ones
    another fault still holds down).

    What is queued or on the wire is lost when they go down, as in the simulator; a
    `drain` (and its restore) changes no interface.
    """
    if fault.action == "down":
        ports, state = fault_ports(fabric, fault), "down"
    elif fault.action == "up":
        ports, state = restored_ports(fabric, fault, earlier), "up"
    else:
        return {}
    out: dict[int, list[str]] = {}
    for p in ports:
        out.setdefault(int(fabric.port_node[p]), []).append(
            f"link set dev {pl.port_iface[p]} {state}"
        )
    return out


def fault_lines(
    pl: Plan, fabric: Fabric, fault, before: Routing, earlier=()
) -> tuple[Routing, dict]:
    """What a fault during the run changes on routers: (routing after it, node -> ip lines).

    The interfaces go down (or come back up) first (`link_lines`); then every switch
    whose routes change gets them replaced by the routing over what is there. A switch
    brought back gets all its routes: those it kept from before it went down are stale.
    """
    after = routing_after(fault, before)
    out = link_lines(pl, fabric, fault, earlier)
    for v in fabric.switch_ids:
        v = int(v)
        if v in after.failed_nodes:
            continue
        new = switch_routes(fabric, after, v, pl.nic_ip, pl.port_iface)
        if v in before.failed_nodes:
            changed = [f"route replace {r}" for r in new]
        else:
            old = switch_routes(fabric, before, v, pl.nic_ip, pl.port_iface)
            changed = [f"route replace {r}" for r, o in zip(new, old, strict=True) if r != o]
        if changed:
            out.setdefault(v, []).extend(changed)
    return after, out


def route_get_line(dst_ip: int, src_ip: int, iif: str, sport: int) -> str:
    """The `ip route get` that asks a switch where it forwards a flow arriving on `iif`."""
    return (
        f"ip route get {format_ipv4(dst_ip)} from {format_ipv4(src_ip)} iif {iif} "
        f"ipproto udp sport {sport} dport {ROCE_UDP_PORT}"
    )
