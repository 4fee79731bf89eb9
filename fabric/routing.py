"""ECMP routing: next-hop sets, hash-based selection, and the path of every flow.

Next hops come from hop distances. For every switch and every *leaf* (a
switch that NICs are cabled to) `dist` holds the number of switch-to-switch
hops between them; a switch's next hops towards a destination NIC are its
live ports whose peer is one hop closer to the NIC's leaf. On a Clos that is
exactly the set of equal-cost uplinks going up, and the one downlink coming
down.

Selection is a pure function of the packet's fields and a per-switch seed:
a CRC-32 (the IEEE polynomial that switch ASICs offer alongside CRC-16 and
XOR folding) over the fields the policy names, then the switch's seed mixed
in with a non-linear finalizer, taken modulo the number of next hops. A CRC
is affine in its initial value, so a seed fed only as the CRC's start would
XOR every switch's hash with a constant: the low bits of one tier would still
decide the next tier's choice, which is hash polarization whatever the
seeds. With the same seed on every switch (`same_seed`) the hashes are equal
at every hop and polarization is what you get. Policies:

- `5tuple`: source and destination IP, protocol, UDP ports.
- `eecmp`: the 5-tuple plus the destination QPN (Meta's enhanced ECMP, a
  user-defined field over the BTH).
- `pinned`: static by destination, the NIC's ordinal (Meta's path pinning).
- `spray`: the 5-tuple plus the packet sequence number: every packet anew.
- `linux`: what the emulator's routers do (`aifabric.fabric.emuhash`): the Linux
  kernel's L4 multipath hash (siphash of the 5-tuple keyed by the switch's
  `fib_multipath_hash_seed`) and hash-threshold selection over the live next
  hops in order. Not resilient: a failure moves some flows that did not use it.
- `ovs`: what the emulator's Open vSwitch bridges do: a select group hashing
  the 5-tuple with the switch's seed as basis, each live bucket scored by a
  hash of its id (highest score wins).
- `adaptive`: adaptive routing as switches do it: every switch sends each data
  packet out of the next hop with the fewest bytes queued at that moment (the
  simulator's forwarding decides, `aifabric.sim.kernel.adapt_route`); the route
  computed here, the least-loaded next hop given the flows routed before it
  (ties broken by the 5-tuple hash), is where a packet goes while queues tie,
  and the path of the flow's ACKs and CNPs.

Failures keep hashing resilient, as switch ECMP groups with resilient
hashing do: a flow keeps its next hop unless that next hop went away; only
the flows of a lost member are re-spread over what is left.
"""

from __future__ import annotations

import zlib
from collections import namedtuple
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numba import njit

from aifabric.fabric._numba_cache import lean_loads
from aifabric.fabric.addressing import ROCE_UDP_PORT, nic_ipv4
from aifabric.fabric.emuhash import linux_hash, linux_pick, ovs_basis, ovs_pick
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Fabric, Role

lean_loads()  # cached kernels load without numba's typing and lowering tables

POLICIES = ("5tuple", "eecmp", "pinned", "spray", "adaptive", "linux", "ovs")
_MODE = {name: i for i, name in enumerate(POLICIES)}
MODE_5TUPLE, MODE_EECMP, MODE_PINNED, MODE_SPRAY, MODE_ADAPTIVE, MODE_LINUX, MODE_OVS = (
    _MODE[p] for p in POLICIES
)
EMULATOR_POLICY = {"router": "linux", "ovs": "ovs"}
"""The policy that predicts the emulator's paths, per kind of emulated switch."""
MODE_RANDOM = len(POLICIES)  # uniform random choice per hop: the balls-into-bins reference


def hashed_fields(policy: str) -> tuple[str, ...]:
    """The flow fields whose values a policy's hash can tell QPs apart by, for the uniform
    reference: the 5-tuple's (src, dst, UDP source port; protocol and destination port are
    RoCEv2's), and the destination QPN for `eecmp`. QPs equal in these take one path under
    any hash of them; `pinned`, `spray` and `adaptive` are compared with a 5-tuple hash."""
    return ("src", "dst", "sport", "dqpn") if policy == "eecmp" else ("src", "dst", "sport")


def hash_units(columns) -> np.ndarray:
    """int64 unit per row: rows equal in every column (equal length arrays) share one unit;
    units numbered 0, 1, ... in order of first appearance (all distinct: 0..n-1)."""
    keys = np.stack([np.asarray(c, dtype=np.int64) for c in columns], axis=1)
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    _, first, unit = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[unit.ravel()]


UNREACHABLE = np.int16(32767)
MAX_HOPS = 8
"""The most links a route may cross, NIC to NIC (a 3-tier Clos needs 6). Routes are
computed into buffers of this size, and the simulator's packets carry routes of at most
this many ports; a fabric whose shortest routes are longer is refused by the simulator."""

Net = namedtuple("Net", "nic_port nic_switch port_peer adj_ptr adj_port sw_ord leaf_ord")
"""The fabric as `route_packet` reads it (arrays of `fabric.model.Fabric` and `Routing`)."""
Live = namedtuple("Live", "port_alive dist dist0 seeds crc_table")
"""The routing state `route_packet` reads: live ports, hop distances (now and intact),
per-switch hash seeds and the CRC table."""


def _crc_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table[i] = c
    return table


CRC_TABLE = _crc_table()


@njit(cache=True)
def _crc_byte(crc, byte, table):
    return table[(crc ^ byte) & 0xFF] ^ (crc >> np.uint32(8))


@njit(cache=True)
def _crc_word(crc, value, nbytes, table):
    """Feed the low `nbytes` of `value`, most significant byte first (network order)."""
    for i in range(nbytes - 1, -1, -1):
        crc = _crc_byte(crc, np.uint32((value >> (8 * i)) & 0xFF), table)
    return crc


@njit(cache=True)
def crc32_bytes(data, seed, table):
    """CRC-32 of a uint8 array, continuing from `seed` exactly as zlib.crc32(data, seed)."""
    crc = np.uint32(seed) ^ np.uint32(0xFFFFFFFF)
    for b in data:
        crc = _crc_byte(crc, np.uint32(b), table)
    return crc ^ np.uint32(0xFFFFFFFF)


@njit(cache=True)
def mix32(x):
    """A bijective 32-bit finalizer (MurmurHash3's fmix32): every output bit depends on all."""
    x = np.uint32(x)
    x ^= x >> np.uint32(16)
    x = np.uint32(np.uint64(x) * np.uint64(0x85EBCA6B) & np.uint64(0xFFFFFFFF))
    x ^= x >> np.uint32(13)
    x = np.uint32(np.uint64(x) * np.uint64(0xC2B2AE35) & np.uint64(0xFFFFFFFF))
    x ^= x >> np.uint32(16)
    return x


@njit(cache=True)
def flow_hash(sip, dip, sport, dport, dqpn, psn, mode, seed, table):
    """The ECMP hash of one packet at a switch with `seed`.

    CRC-32 (as zlib computes it) over, in order: source IP (4 bytes),
    destination IP (4), protocol (1, UDP), source port (2), destination port
    (2); then the destination QPN (3) for `eecmp` or the PSN (3) for
    `spray`; all in network byte order. Then `mix32(crc ^ seed)`.
    """
    crc = np.uint32(0xFFFFFFFF)
    crc = _crc_word(crc, np.uint32(sip), 4, table)
    crc = _crc_word(crc, np.uint32(dip), 4, table)
    crc = _crc_byte(crc, np.uint32(17), table)
    crc = _crc_word(crc, np.uint32(sport), 2, table)
    crc = _crc_word(crc, np.uint32(dport), 2, table)
    if mode == MODE_EECMP:
        crc = _crc_word(crc, np.uint32(dqpn), 3, table)
    elif mode == MODE_SPRAY:
        crc = _crc_word(crc, np.uint32(psn), 3, table)
    return mix32((crc ^ np.uint32(0xFFFFFFFF)) ^ np.uint32(seed))


@njit(cache=True)
def _bfs_distances(n_switch, ptr, nbr, leaves, dist):
    """dist[s, j]: switch hops from switch s to leaf j, over the live switch graph."""
    queue = np.empty(n_switch, dtype=np.int32)
    for j in range(leaves.shape[0]):
        head = 0
        tail = 1
        queue[0] = leaves[j]
        dist[leaves[j], j] = 0
        while head < tail:
            s = queue[head]
            head += 1
            d = dist[s, j] + 1
            for k in range(ptr[s], ptr[s + 1]):
                t = nbr[k]
                if dist[t, j] > d:
                    dist[t, j] = d
                    queue[tail] = t
                    tail += 1


@njit(cache=True)
def is_next_hop(q, lj, d, net, live):
    """Is port q a live next hop one step closer to leaf lj than distance d?"""
    port_peer, sw_ord = net.port_peer, net.sw_ord
    port_alive, dist = live.port_alive, live.dist
    ti = sw_ord[port_peer[q]]
    return ti >= 0 and port_alive[q] and dist[ti, lj] == d - 1


@njit(cache=True)
def _choose(s, lj, h, mode, net, live, load):
    """The port switch s forwards on towards leaf lj for hash h; -1 if there is none.

    Resilient selection: h picks a member of the intact group (the next hops
    before any failure); if that member is still a live next hop it is taken,
    otherwise h picks again among the live next hops. Under `linux` and `ovs` the
    emulator's switches choose among the live next hops, in port order, as their
    routes and groups list them.
    """
    port_peer, adj_ptr, adj_port, sw_ord = net.port_peer, net.adj_ptr, net.adj_port, net.sw_ord
    dist, dist0 = live.dist, live.dist0
    si = sw_ord[s]
    d = dist[si, lj]
    d0 = dist0[si, lj]
    if d >= 32767:
        return -1
    ncand = 0
    nbase = 0
    for k in range(adj_ptr[s], adj_ptr[s + 1]):
        q = adj_port[k]
        ti = sw_ord[port_peer[q]]
        if ti >= 0 and dist0[ti, lj] == d0 - 1:
            nbase += 1
        if is_next_hop(q, lj, d, net, live):
            ncand += 1
    if ncand == 0:
        return -1
    if mode in (MODE_LINUX, MODE_OVS):  # over the live next hops in port order
        want = linux_pick(h, ncand) if mode == MODE_LINUX else ovs_pick(h, ncand)
        return _live_hop(s, lj, d, want, net, live)
    if mode == MODE_ADAPTIVE:  # least load; among equals, the hashed one
        chosen = -1
        best = np.inf
        pick = h % np.uint32(ncand)
        i = 0
        for k in range(adj_ptr[s], adj_ptr[s + 1]):
            q = adj_port[k]
            if is_next_hop(q, lj, d, net, live):
                key = load[q] - (1e-9 if i == pick else 0.0)
                if key < best:
                    best = key
                    chosen = q
                i += 1
        return chosen
    want = h % np.uint32(nbase)
    i = 0
    for k in range(adj_ptr[s], adj_ptr[s + 1]):
        q = adj_port[k]
        ti = sw_ord[port_peer[q]]
        if ti >= 0 and dist0[ti, lj] == d0 - 1:
            if i == want:
                if is_next_hop(q, lj, d, net, live):
                    return q
                break
            i += 1
    return _live_hop(s, lj, d, (h // np.uint32(nbase)) % np.uint32(ncand), net, live)


@njit(cache=True)
def _live_hop(s, lj, d, want, net, live):
    """The `want`-th (from 0) live next hop of switch s towards leaf lj, in port order."""
    i = 0
    for k in range(net.adj_ptr[s], net.adj_ptr[s + 1]):
        q = net.adj_port[k]
        if is_next_hop(q, lj, d, net, live):
            if i == want:
                return q
            i += 1
    return -1


@njit(cache=True)
def route_packet(src, dst, sip, dip, sport, dqpn, psn, rnd, mode, net, live, load, weight, out):
    """Route one packet from NIC src to NIC dst; write its ports to out, return the count.

    `net` is the fabric (`Net`), `live` the routing state (`Live`), `mode` a
    policy's MODE_* (or MODE_RANDOM, which takes hop n's hash from rnd[n]),
    `load` the per-port load `adaptive` balances. Returns -1 when dst cannot be
    reached over live links or the route would not fit in `out`.
    """
    nic_port, nic_sw, port_peer = net.nic_port, net.nic_switch, net.port_peer
    leaf_ord = net.leaf_ord
    port_alive, seeds, table = live.port_alive, live.seeds, live.crc_table
    p = nic_port[src]
    if p < 0 or not port_alive[p]:
        return -1
    out[0] = p
    n = 1
    s = port_peer[p]
    last = nic_sw[dst]
    lj = leaf_ord[last]
    while s != last:
        if n >= out.shape[0] - 1:
            return -1
        if mode == MODE_PINNED:
            h = np.uint32(dst)
        elif mode == MODE_RANDOM:
            h = np.uint32(rnd[n])
        elif mode == MODE_LINUX:
            h = linux_hash(sip, dip, sport, ROCE_UDP_PORT, seeds[s])
        elif mode == MODE_OVS:
            h = ovs_basis(sip, dip, sport, ROCE_UDP_PORT, seeds[s])
        else:
            h = flow_hash(sip, dip, sport, ROCE_UDP_PORT, dqpn, psn, mode, seeds[s], table)
        q = _choose(s, lj, h, mode, net, live, load)
        if q < 0:
            return -1
        load[q] += weight
        out[n] = q
        n += 1
        s = port_peer[q]
    q = nic_port[dst] ^ 1  # the leaf's port towards dst
    if not port_alive[q]:
        return -1
    out[n] = q
    return n + 1


@njit(cache=True)
def _walk_many(src, dst, ip, sport, dqpn, psn, weight, rnd, mode, net, live, load, out):
    """Route every flow; out = (ptr, ports, reachable). Returns the ports written."""
    ptr, ports, reach = out
    buf = np.empty(MAX_HOPS, dtype=np.int32)
    total = 0
    for f in range(src.shape[0]):
        n = route_packet(
            src[f], dst[f], ip[src[f]], ip[dst[f]], sport[f], dqpn[f], psn[f], rnd[f],
            mode, net, live, load, weight[f], buf,
        )  # fmt: skip
        reach[f] = n >= 0
        if n > 0:
            ports[total : total + n] = buf[:n]
            total += n
        ptr[f + 1] = total
    return total


@dataclass(frozen=True)
class Paths:
    """Ports (directed links) per flow, CSR: flow f used `ports[ptr[f]:ptr[f + 1]]`.

    `reachable[f]` is False where the flow's destination was cut off; its
    slice is then empty.
    """

    ptr: np.ndarray
    ports: np.ndarray
    reachable: np.ndarray

    def __len__(self) -> int:
        return len(self.ptr) - 1

    def of(self, f: int) -> np.ndarray:
        return self.ports[self.ptr[f] : self.ptr[f + 1]]

    def links(self, f: int) -> np.ndarray:
        return self.of(f) // 2

    def port_counts(self, n_ports: int, weight: np.ndarray | None = None) -> np.ndarray:
        """How many flows (or how much weight) each port carries."""
        flow_of = np.repeat(np.arange(len(self)), np.diff(self.ptr))
        w = None if weight is None else np.asarray(weight, dtype=np.float64)[flow_of]
        return np.bincount(self.ports, weights=w, minlength=n_ports)


def routing_seeds(n_nodes: int, seed: int, same_seed: bool = False) -> np.ndarray:
    """Every node's ECMP hash seed, derived from the run's seed: the one place seeds come
    from (the simulator's hash and the emulator's switches alike)."""
    if same_seed:
        return np.full(n_nodes, seed & 0xFFFFFFFF, dtype=np.uint32)
    return np.array(
        [zlib.crc32(v.to_bytes(4, "big"), seed & 0xFFFFFFFF) for v in range(n_nodes)],
        dtype=np.uint32,
    )


def switch_seeds(n_nodes: int, seed: int, same_seed: bool = False) -> np.ndarray:
    """The seeds the emulator gives its switches (`fib_multipath_hash_seed`, the select
    groups' basis) and the `linux` and `ovs` policies hash with: `routing_seeds`, never 0
    (to Linux a seed of 0 means one drawn at random)."""
    seeds = routing_seeds(n_nodes, seed, same_seed)
    seeds[seeds == 0] = 1
    return seeds


class Routing:
    """ECMP next hops of a fabric under a policy, a seed and a set of failures."""

    def __init__(
        self,
        fabric: Fabric,
        policy: str = "5tuple",
        seed: int = 0,
        *,
        same_seed: bool = False,
        failed_links: Iterable[int] = (),
        failed_nodes: Iterable[int] = (),
        _intact: np.ndarray | None = None,
    ):
        if policy not in POLICIES:
            raise AifabricError(
                f"unknown ECMP policy {policy!r}; choose one of {', '.join(POLICIES)}"
            )
        self.fabric = fabric
        self.policy = policy
        self.seed = int(seed)
        self.same_seed = same_seed
        self.failed_links = frozenset(int(x) for x in failed_links)
        self.failed_nodes = frozenset(int(x) for x in failed_nodes)
        for link in self.failed_links:
            if not 0 <= link < fabric.n_links:
                raise AifabricError(f"fabric {fabric.name} has no link {link}")
        for node in self.failed_nodes:
            if not 0 <= node < fabric.n_nodes:
                raise AifabricError(f"fabric {fabric.name} has no node {node}")

        f = fabric
        self.ip = nic_ipv4(f)
        self.seeds = self._seeds()
        alive = np.ones(f.n_links, dtype=np.bool_)
        alive[list(self.failed_links)] = False
        if self.failed_nodes:
            dead = np.zeros(f.n_nodes, dtype=np.bool_)
            dead[list(self.failed_nodes)] = True
            alive &= ~(dead[f.link_a] | dead[f.link_b])
        self.port_alive = np.repeat(alive, 2)

        self.sw_ord = np.full(f.n_nodes, -1, dtype=np.int32)
        self.sw_ord[f.switch_ids] = np.arange(len(f.switch_ids), dtype=np.int32)
        leaves = np.unique(f.nic_switch[f.nic_ids])
        self.leaf_ord = np.full(f.n_nodes, -1, dtype=np.int32)
        self.leaf_ord[leaves] = np.arange(len(leaves), dtype=np.int32)
        self._leaves = leaves
        self.dist = self._distances(self.port_alive)
        self.dist0 = self.dist if _intact is None else _intact
        if _intact is None and (self.failed_links or self.failed_nodes):
            self.dist0 = self._distances(np.ones(f.n_ports, dtype=np.bool_))

    def _seeds(self) -> np.ndarray:
        seeds = switch_seeds if self.policy in EMULATOR_POLICY.values() else routing_seeds
        return seeds(self.fabric.n_nodes, self.seed, self.same_seed)

    def _distances(self, port_alive: np.ndarray) -> np.ndarray:
        f = self.fabric
        a = f.port_node
        b = f.port_peer
        keep = port_alive & (self.sw_ord[a] >= 0) & (self.sw_ord[b] >= 0)
        src = self.sw_ord[a[keep]]
        dst = self.sw_ord[b[keep]]
        order = np.argsort(src, kind="stable")
        n_sw = len(f.switch_ids)
        ptr = np.zeros(n_sw + 1, dtype=np.int32)
        np.cumsum(np.bincount(src, minlength=n_sw), out=ptr[1:])
        nbr = dst[order].astype(np.int32)
        dist = np.full((n_sw, len(self._leaves)), UNREACHABLE, dtype=np.int16)
        _bfs_distances(n_sw, ptr, nbr, self.sw_ord[self._leaves].astype(np.int32), dist)
        return dist

    def without(self, links: Iterable[int] = (), nodes: Iterable[int] = ()) -> Routing:
        """The same routing with more links or switches down (or drained)."""
        return self._failing(self.failed_links | set(links), self.failed_nodes | set(nodes))

    def restored(self, links: Iterable[int] = (), nodes: Iterable[int] = ()) -> Routing:
        """The same routing with links or switches back (restored after a fault)."""
        return self._failing(self.failed_links - set(links), self.failed_nodes - set(nodes))

    def _failing(self, links: Iterable[int], nodes: Iterable[int]) -> Routing:
        return Routing(
            self.fabric,
            self.policy,
            self.seed,
            same_seed=self.same_seed,
            failed_links=links,
            failed_nodes=nodes,
            _intact=self.dist0,
        )

    def net(self) -> Net:
        f = self.fabric
        return Net(
            f.nic_port, f.nic_switch, f.port_peer, f.adj_ptr, f.adj_port, self.sw_ord, self.leaf_ord
        )

    def live(self) -> Live:
        return Live(self.port_alive, self.dist, self.dist0, self.seeds, CRC_TABLE)

    def next_hops(self, switch: int, dst: int) -> np.ndarray:
        """The live ports of `switch` on a shortest path to NIC `dst`."""
        f = self.fabric
        if f.node_role[switch] == Role.NIC:
            raise AifabricError(f"{f.node_name[switch]} is a NIC, not a switch")
        last = f.nic_switch[dst]
        if switch == last:
            q = f.nic_port[dst] ^ 1
            return np.array([q] if self.port_alive[q] else [], dtype=np.int32)
        d = self.dist[self.sw_ord[switch], self.leaf_ord[last]]
        ports = f.ports_of(switch)
        peers = self.sw_ord[f.port_peer[ports]]
        ok = (peers >= 0) & self.port_alive[ports]
        ok[ok] &= self.dist[peers[ok], self.leaf_ord[last]] == d - 1
        return ports[ok].astype(np.int32)

    def paths(
        self,
        src,
        dst,
        sport=None,
        dqpn=None,
        psn=None,
        weight=None,
        *,
        rng: np.random.Generator | None = None,
        units=None,
    ) -> Paths:
        """Route many flows (or packets) at once; see `Paths`.

        `src`, `dst` are NIC node ids; `sport` the RoCEv2 UDP source port,
        `dqpn` the destination QPN, `psn` the packet sequence number (spray);
        `weight` the load each flow adds (adaptive). With `rng`, every hop is
        a uniform random choice instead: the balls-into-bins reference; flows of
        one of `units` (`hash_units`) then draw together, as a hash sees them.
        """
        f = self.fabric
        src = np.asarray(src, dtype=np.int32)
        dst = np.asarray(dst, dtype=np.int32)
        n = len(src)
        if len(dst) != n:
            raise ValueError("src and dst differ in length")
        roles = f.node_role
        if n and (roles[src] != Role.NIC).any() | (roles[dst] != Role.NIC).any():
            raise AifabricError("flows must start and end at NICs")

        def col(x, default):
            if x is None:
                return np.full(n, default, dtype=np.int64)
            return np.broadcast_to(np.asarray(x, dtype=np.int64), (n,)).copy()

        if n == 0:  # nothing to route (and no kernel to compile for it)
            empty = np.zeros(0, dtype=np.int32)
            return Paths(ptr=np.zeros(1, dtype=np.int64), ports=empty, reachable=empty.astype(bool))
        mode = _MODE[self.policy]
        rnd = np.zeros((n, MAX_HOPS), dtype=np.uint32)
        if rng is not None:
            mode = MODE_RANDOM
            if units is None:
                rnd = rng.integers(0, 2**32, size=(n, MAX_HOPS), dtype=np.uint32)
            else:
                units = np.asarray(units, dtype=np.int64)
                k = int(units.max()) + 1 if n else 0
                rnd = rng.integers(0, 2**32, size=(k, MAX_HOPS), dtype=np.uint32)[units]
        load = np.zeros(f.n_ports, dtype=np.float64)
        ptr = np.zeros(n + 1, dtype=np.int64)
        ports = np.empty(n * MAX_HOPS, dtype=np.int32)
        reachable = np.zeros(n, dtype=np.bool_)
        net, live = self.net(), self.live()
        total = _walk_many(
            src, dst, self.ip, col(sport, 0xC000), col(dqpn, 0), col(psn, 0),
            col(weight, 1).astype(np.float64), rnd, mode, net, live, load,
            (ptr, ports, reachable),
        )  # fmt: skip
        return Paths(ptr=ptr, ports=ports[:total].copy(), reachable=reachable)

    def path(self, src: int, dst: int, sport: int = 0xC000, dqpn: int = 0, psn: int = 0):
        """The links one flow (or, under `spray`, one packet) takes, in order."""
        p = self.paths([src], [dst], [sport], [dqpn], [psn])
        if not p.reachable[0]:
            f = self.fabric
            raise AifabricError(
                f"{f.node_name[dst]} cannot be reached from {f.node_name[src]} over the live links"
            )
        return [int(x) for x in p.links(0)]

    def hop_diameter(self) -> int:
        """The most links on any NIC-to-NIC shortest path (over the live fabric)."""
        leaf_rows = self.dist[self.sw_ord[self._leaves]]
        finite = leaf_rows[leaf_rows < UNREACHABLE]
        return int(finite.max()) + 2 if finite.size else 0
