"""The network model: nodes, ports, links and queue profiles, held by a `Fabric`.

A `Fabric` is a value. It stores its nodes and links as flat, typed numpy
columns that engines use directly (`link_a`, `link_rate_bps`, `port_node`, ...),
and hands out frozen dataclasses (`Node`, `Link`, `Port`) and a networkx view
for code that prefers objects or graph algorithms.

Every link is full duplex. Its two directions are the *ports* (egress queues)
`2 * link` (from `link_a` to `link_b`) and `2 * link + 1` (back). A node's ports
are numbered locally in the order its links were added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Any

import numpy as np

from aifabric.fabric.errors import SpecError


class Role(IntEnum):
    """What a node does: a GPU's backend NIC or a switch of one tier."""

    NIC = 0  # a backend NIC, one per GPU
    RTSW = 1  # rack training switch (leaf, ToR; a rail switch in rail designs)
    CTSW = 2  # cluster training switch (spine of an AI Zone)
    ATSW = 3  # aggregator training switch (joins AI Zones)

    @property
    def label(self) -> str:
        return self.name.lower()


ROLES = tuple(r.label for r in Role)


@dataclass(frozen=True)
class Node:
    id: int
    name: str
    role: Role
    zone: int = -1
    rack: int = -1
    server: int = -1
    rail: int = -1  # the NIC's index in its server (its rail), or a rail switch's rail
    plane: int = -1  # spine plane of a CTSW or ATSW
    index: int = -1  # ordinal among the nodes of its role


@dataclass(frozen=True)
class Link:
    id: int
    a: int
    b: int
    rate_bps: int
    delay_ns: int
    mtu_bytes: int  # RoCE path MTU: payload bytes per packet
    a_port: int  # local port number on a
    b_port: int  # local port number on b


@dataclass(frozen=True)
class Port:
    """One direction of a link: the egress queue of `node` towards `peer`."""

    id: int
    node: int
    number: int  # local port number on node
    link: int
    peer: int


@dataclass(frozen=True)
class EcnProfile:
    """RED-style ECN marking on the lossless class (the DCQCN switch profile)."""

    kmin_bytes: int
    kmax_bytes: int
    pmax: float
    enabled: bool = True

    def __post_init__(self):
        if not 0 <= self.kmin_bytes <= self.kmax_bytes:
            raise SpecError(
                f"ECN thresholds need 0 <= kmin <= kmax, got kmin={self.kmin_bytes} B "
                f"and kmax={self.kmax_bytes} B"
            )
        if not 0.0 <= self.pmax <= 1.0:
            raise SpecError(f"ECN pmax must be between 0 and 1, got {self.pmax}")

    def probability(self, depth_bytes: float) -> float:
        """The marking probability at a queue depth: 0 below Kmin, Pmax at Kmax, 1 above."""
        if not self.enabled or depth_bytes <= self.kmin_bytes:
            return 0.0
        if depth_bytes > self.kmax_bytes:
            return 1.0
        if self.kmax_bytes == self.kmin_bytes:
            return self.pmax
        return self.pmax * (depth_bytes - self.kmin_bytes) / (self.kmax_bytes - self.kmin_bytes)


@dataclass(frozen=True)
class PfcProfile:
    """802.1Qbb priority flow control, accounted per ingress port and priority."""

    xoff_bytes: int
    xon_bytes: int
    headroom_bytes: int
    pause_quanta: int = 0xFFFF  # one quantum is 512 bit times
    enabled: bool = True
    # shared model: a paused ingress resumes once its shared bytes are this far below
    # the dynamic threshold (and its headroom is empty)
    xon_offset_bytes: int = 8 * 2**10

    def __post_init__(self):
        if self.xon_offset_bytes < 0:
            raise SpecError(f"PFC xon_offset must not be negative, got {self.xon_offset_bytes} B")
        if not 0 <= self.xon_bytes < self.xoff_bytes:
            raise SpecError(
                f"PFC thresholds need 0 <= xon < xoff, got xon={self.xon_bytes} B "
                f"and xoff={self.xoff_bytes} B"
            )
        if self.headroom_bytes < 0:
            raise SpecError(f"PFC headroom must not be negative, got {self.headroom_bytes} B")
        if not 0 < self.pause_quanta <= 0xFFFF:
            raise SpecError(f"PFC pause quanta must be in 1..65535, got {self.pause_quanta}")


BUFFER_MODELS = ("shared", "static")
MAX_ALPHA = 64.0  # a dynamic threshold at most 64 x the free pool
ALPHA_SCALE = 2**16  # the kernel keeps alpha in units of 1/65536
MAX_POOL_BYTES = 2**40  # a shared pool: free bytes x alpha x ALPHA_SCALE stays below 2**63


@dataclass(frozen=True)
class QueueProfile:
    """Buffering of a switch (or NIC) with ECN and PFC settings.

    Priority `lossless_priority` carries RoCE data (ECN-marked, PFC-protected);
    `control_priority` is served strictly first and carries CNP, ACK and
    clear-to-send packets. `model` is how a switch shares its memory between ports
    (NICs always run the static model):

    - "shared": `buffer` is the switch's one pool. Each port keeps `reserved_bytes` per
      priority for itself; above that a queue (the lossy classes, at egress) or an
      ingress port's lossless bytes (PFC on) may use at most `alpha` x the pool's free
      bytes (the dynamic threshold of Choudhury and Hahne, as Broadcom's MMU applies
      it). A lossless ingress that reaches its threshold pauses its peer; what still
      arrives goes to its `pfc.headroom_bytes`, carved from a headroom pool apart from
      `buffer`, and it resumes once its headroom is empty and its shared bytes are
      `pfc.xon_offset_bytes` below the threshold. `pfc.xoff_bytes`/`xon_bytes` are
      the static model's and go unused.
    - "static": `buffer` is each port's buffer (the model sim/pfc.py runs).
    """

    buffer_bytes: int
    ecn: EcnProfile
    pfc: PfcProfile
    lossless_priority: int = 3
    control_priority: int = 6
    model: str = "shared"
    alpha: float = 1.0
    reserved_bytes: int = 0
    profile: str = ""  # the switch profile (aifabric.fabric.switch_profiles) it came from, if any

    def __post_init__(self):
        # Static model (sim/pfc.py): `buffer` is a port's buffer: it bounds the
        # control class, and the lossless class when PFC is off. With PFC on, lossless
        # bytes are counted per ingress port: past XOFF the port pauses its peer, the
        # headroom above XOFF takes what is still on the wire, and a frame past XOFF +
        # headroom is dropped. Headroom is reserved apart from the buffer, as switches
        # carve PFC headroom from a pool of its own rather than from the memory pause
        # thresholds count against: so XOFF must fit in the buffer and XOFF + headroom
        # need not (a 60,000-byte buffer with a 60,000-byte XOFF is a lossless setup
        # other simulators use). The shared model has no fixed XOFF: the pause follows
        # the dynamic threshold, which never exceeds the pool, so XOFF is not checked.
        # A threshold is checked against the buffer only while its feature is on.
        if self.model not in BUFFER_MODELS:
            raise SpecError(
                f"queue model = {self.model!r} is not one of {', '.join(BUFFER_MODELS)}"
            )
        if self.buffer_bytes <= 0:
            raise SpecError(f"queue buffer must be positive, got {self.buffer_bytes} B")
        if self.model == "shared" and self.buffer_bytes > MAX_POOL_BYTES:
            raise SpecError(
                f"a shared queue buffer holds at most {MAX_POOL_BYTES} B (1 TiB), "
                f"got {self.buffer_bytes} B"
            )
        if not 0 < self.alpha <= MAX_ALPHA or round(self.alpha * ALPHA_SCALE) < 1:
            raise SpecError(
                f"queue alpha must be above 0 (at least 1/{ALPHA_SCALE}) and at most "
                f"{MAX_ALPHA:g}, got {self.alpha}"
            )
        if not 0 <= self.reserved_bytes <= self.buffer_bytes:
            raise SpecError(
                f"queue reserved ({self.reserved_bytes} B) must be between 0 and the "
                f"buffer ({self.buffer_bytes} B)"
            )
        if self.ecn.enabled and self.ecn.kmax_bytes > self.buffer_bytes:
            raise SpecError(
                f"ECN kmax ({self.ecn.kmax_bytes} B) exceeds the buffer ({self.buffer_bytes} B)"
            )
        if self.model == "static" and self.pfc.enabled and self.pfc.xoff_bytes > self.buffer_bytes:
            raise SpecError(
                f"PFC xoff ({self.pfc.xoff_bytes} B) exceeds the buffer "
                f"({self.buffer_bytes} B); the headroom is reserved apart from it"
            )
        for name in ("lossless_priority", "control_priority"):
            value = getattr(self, name)
            if not 0 <= value <= 7:
                raise SpecError(f"queue {name} must be an 802.1p priority 0..7, got {value}")
        if self.lossless_priority == self.control_priority:
            raise SpecError(
                f"the lossless and control priorities must differ, both are {self.control_priority}"
            )


FRAME_EXTRA_BYTES = 100
"""What a frame adds to its MTU on the wire, at most: headers, FCS, preamble and gap."""


def required_headroom_bytes(rate_bps: int, delay_ns: int, mtu_bytes: int) -> int:
    """PFC headroom that keeps a port lossless: the bytes still arriving after XOFF.

    One round trip of the cable at line rate, plus a maximum frame the sender
    may have started and one the receiver may be sending its PAUSE behind.
    """
    return (2 * delay_ns * rate_bps) // (8 * 10**9) + 2 * (mtu_bytes + FRAME_EXTRA_BYTES)


DEFAULT_QUEUE = QueueProfile(
    buffer_bytes=4 * 2**20,
    ecn=EcnProfile(kmin_bytes=100 * 2**10, kmax_bytes=400 * 2**10, pmax=0.2),
    pfc=PfcProfile(xoff_bytes=1 * 2**20, xon_bytes=768 * 2**10, headroom_bytes=256 * 2**10),
)

_I32 = np.int32
_I64 = np.int64


@dataclass(frozen=True, eq=False)
class Fabric:
    """A built fabric: columns of nodes and links, queue profiles per switch role."""

    name: str
    kind: str
    node_name: tuple[str, ...]
    node_role: np.ndarray  # int8, a Role
    node_zone: np.ndarray  # int32, -1 where not applicable
    node_rack: np.ndarray
    node_server: np.ndarray
    node_rail: np.ndarray
    node_plane: np.ndarray
    node_index: np.ndarray
    link_a: np.ndarray  # int32 node ids
    link_b: np.ndarray
    link_rate_bps: np.ndarray  # int64
    link_delay_ns: np.ndarray  # int64
    link_mtu_bytes: np.ndarray  # int32
    queues: dict[Role, QueueProfile] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.node_name)
        for col in ("role", "zone", "rack", "server", "rail", "plane", "index"):
            if len(getattr(self, f"node_{col}")) != n:
                raise ValueError(f"node column {col} has the wrong length")
        m = len(self.link_a)
        for col in ("b", "rate_bps", "delay_ns", "mtu_bytes"):
            if len(getattr(self, f"link_{col}")) != m:
                raise ValueError(f"link column {col} has the wrong length")
        if m and (
            min(self.link_a.min(), self.link_b.min()) < 0
            or max(self.link_a.max(), self.link_b.max()) >= n
        ):
            raise ValueError("a link names a node that does not exist")
        if np.any(self.link_a == self.link_b):
            raise ValueError("a link connects a node to itself")
        self._check_headroom()
        self._check_reserved()
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                value.setflags(write=False)

    def _check_headroom(self) -> None:
        """With PFC on, a switch's headroom must hold one whole frame of its links: the frame
        that crosses XOFF is counted before the pause goes out, and a frame that would pass
        XOFF + headroom is dropped, so a smaller headroom drops that frame and never pauses."""
        if not len(self.link_a):
            return
        ends = self.node_role[np.concatenate([self.link_a, self.link_b])]
        mtu = np.concatenate([self.link_mtu_bytes, self.link_mtu_bytes])
        for role in sorted(set(ends.tolist()) - {Role.NIC}):
            pfc = self.queue(role).pfc
            frame = int(mtu[ends == role].max()) + FRAME_EXTRA_BYTES
            if pfc.enabled and pfc.headroom_bytes < frame:
                raise SpecError(
                    f"fabric {self.name}: the {Role(role).label} queues' PFC headroom "
                    f"({pfc.headroom_bytes} B) is less than one frame of their links "
                    f"({frame} B): the frame crossing XOFF would be dropped and no pause sent"
                )

    def _check_reserved(self) -> None:
        """A shared-buffer switch's pool must hold the reserved minimums of all its ports
        (one per port for each of the two priorities it queues)."""
        if not len(self.link_a):
            return
        ports = np.bincount(np.concatenate([self.link_a, self.link_b]), minlength=self.n_nodes)
        for role in sorted(set(self.node_role.tolist()) - {Role.NIC}):
            q = self.queue(role)
            if q.model != "shared" or q.reserved_bytes == 0:
                continue
            most = int(ports[self.node_role == role].max())
            need = 2 * most * q.reserved_bytes
            if need > q.buffer_bytes:
                raise SpecError(
                    f"fabric {self.name}: the {Role(role).label} buffer ({q.buffer_bytes} B) "
                    f"cannot hold the reserved minimums of a switch's {most} ports "
                    f"({need} B: {q.reserved_bytes} B per port and priority)"
                )

    # sizes -----------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.node_name)

    @property
    def n_links(self) -> int:
        return len(self.link_a)

    @property
    def n_ports(self) -> int:
        return 2 * self.n_links

    def count(self, role: Role) -> int:
        return int(np.count_nonzero(self.node_role == role))

    # directed ports ----------------------------------------------------------
    @cached_property
    def port_node(self) -> np.ndarray:
        """The node each port (egress queue) belongs to."""
        out = np.empty(self.n_ports, dtype=_I32)
        out[0::2] = self.link_a
        out[1::2] = self.link_b
        return out

    @cached_property
    def port_peer(self) -> np.ndarray:
        """The node at the other end of each port."""
        out = np.empty(self.n_ports, dtype=_I32)
        out[0::2] = self.link_b
        out[1::2] = self.link_a
        return out

    @cached_property
    def port_rate_bps(self) -> np.ndarray:
        return np.repeat(self.link_rate_bps, 2)

    @cached_property
    def port_delay_ns(self) -> np.ndarray:
        return np.repeat(self.link_delay_ns, 2)

    @cached_property
    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        order = np.argsort(self.port_node, kind="stable").astype(_I32)
        counts = np.bincount(self.port_node, minlength=self.n_nodes)
        ptr = np.zeros(self.n_nodes + 1, dtype=_I32)
        np.cumsum(counts, out=ptr[1:])
        number = np.empty(self.n_ports, dtype=_I32)
        number[order] = np.arange(self.n_ports, dtype=_I32) - np.repeat(ptr[:-1], counts)
        return ptr, order, number

    @property
    def adj_ptr(self) -> np.ndarray:
        """CSR row pointers: the ports of node v are `adj_port[adj_ptr[v]:adj_ptr[v + 1]]`."""
        return self._adjacency[0]

    @property
    def adj_port(self) -> np.ndarray:
        """Port ids grouped by node, each node's ports in local port-number order."""
        return self._adjacency[1]

    @property
    def port_number(self) -> np.ndarray:
        """The local port number of each port on its node."""
        return self._adjacency[2]

    def ports_of(self, node: int) -> np.ndarray:
        return self.adj_port[self.adj_ptr[node] : self.adj_ptr[node + 1]]

    def degree(self, node: int) -> int:
        return int(self.adj_ptr[node + 1] - self.adj_ptr[node])

    # nodes by role -------------------------------------------------------------
    @cached_property
    def nic_ids(self) -> np.ndarray:
        return np.flatnonzero(self.node_role == Role.NIC).astype(_I32)

    @cached_property
    def switch_ids(self) -> np.ndarray:
        return np.flatnonzero(self.node_role != Role.NIC).astype(_I32)

    @cached_property
    def nic_switch(self) -> np.ndarray:
        """For every node: the switch a NIC is cabled to, or -1 for switches."""
        out = np.full(self.n_nodes, -1, dtype=_I32)
        a_nic = self.node_role[self.link_a] == Role.NIC
        b_nic = self.node_role[self.link_b] == Role.NIC
        out[self.link_a[a_nic]] = self.link_b[a_nic]
        out[self.link_b[b_nic]] = self.link_a[b_nic]
        return out

    @cached_property
    def nic_port(self) -> np.ndarray:
        """For every node: the port a NIC sends on, or -1 for switches."""
        out = np.full(self.n_nodes, -1, dtype=_I32)
        nic = self.node_role[self.port_node] == Role.NIC
        out[self.port_node[nic]] = np.flatnonzero(nic)
        return out

    @cached_property
    def nic_rate_bps(self) -> int:
        """The fastest NIC link's rate (0 without NICs): what DCQCN's default preset follows."""
        ports = self.nic_port[self.nic_ids]
        return int(self.port_rate_bps[ports].max()) if len(ports) else 0

    # port names ------------------------------------------------------------------
    @cached_property
    def port_names(self) -> tuple[str, ...]:
        """The one printed name of every port: `node--peer`, the egress of `node` toward
        `peer`; `node--peer#k` for the k-th of parallel links between the two (k >= 2).
        A link's name is the name of its first port, so `a--b` names both a link in a
        fault and the port a sends on. Used by summaries, `analyze`, reports, capture
        file names and `--capture`."""
        seen: dict[tuple[int, int], int] = {}
        out = []
        names = self.node_name
        for node, peer in zip(self.port_node.tolist(), self.port_peer.tolist(), strict=True):
            k = seen.get((node, peer), 0) + 1
            seen[(node, peer)] = k
            base = f"{names[node]}--{names[peer]}"
            out.append(base if k == 1 else f"{base}#{k}")
        return tuple(out)

    def port_name(self, port: int) -> str:
        return self.port_names[int(port)]

    @cached_property
    def _ports_by_name(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.port_names)}

    def port_id(self, name: str) -> int:
        """A port from its name (`node--peer`, `node--peer#k`) or, for a NIC, the NIC's
        own name (its one port)."""
        if name in self._ports_by_name:
            return self._ports_by_name[name]
        if name.endswith("#1") and name[:-2] in self._ports_by_name:
            return self._ports_by_name[name[:-2]]
        node = self._ids_by_name.get(name)
        if node is not None and self.node_role[node] == Role.NIC:
            return int(self.nic_port[node])
        if node is not None:
            raise SpecError(
                f"{name!r} is a switch; name one of its ports as {name}--PEER "
                f"(e.g. {self.port_names[int(self.ports_of(node)[0])]!r})"
            )
        a, sep, b = name.partition("--")
        if not sep:
            raise SpecError(f"fabric {self.name} has no port {name!r}; write a port as node--peer")
        for end in (a, b.partition("#")[0]):
            if end not in self._ids_by_name:
                raise SpecError(f"fabric {self.name} has no node named {end!r} (port {name!r})")
        raise SpecError(f"fabric {self.name} has no port {name!r}: no such link")

    @cached_property
    def _ids_by_name(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.node_name)}

    def node_id(self, name: str) -> int:
        try:
            return self._ids_by_name[name]
        except KeyError:
            raise SpecError(f"fabric {self.name} has no node named {name!r}") from None

    # object views ----------------------------------------------------------------
    def node(self, i: int) -> Node:
        return Node(
            id=int(i),
            name=self.node_name[i],
            role=Role(int(self.node_role[i])),
            zone=int(self.node_zone[i]),
            rack=int(self.node_rack[i]),
            server=int(self.node_server[i]),
            rail=int(self.node_rail[i]),
            plane=int(self.node_plane[i]),
            index=int(self.node_index[i]),
        )

    def link(self, i: int) -> Link:
        return Link(
            id=int(i),
            a=int(self.link_a[i]),
            b=int(self.link_b[i]),
            rate_bps=int(self.link_rate_bps[i]),
            delay_ns=int(self.link_delay_ns[i]),
            mtu_bytes=int(self.link_mtu_bytes[i]),
            a_port=int(self.port_number[2 * i]),
            b_port=int(self.port_number[2 * i + 1]),
        )

    def port(self, i: int) -> Port:
        return Port(
            id=int(i),
            node=int(self.port_node[i]),
            number=int(self.port_number[i]),
            link=int(i) // 2,
            peer=int(self.port_peer[i]),
        )

    @property
    def nodes(self) -> list[Node]:
        return [self.node(i) for i in range(self.n_nodes)]

    @property
    def links(self) -> list[Link]:
        return [self.link(i) for i in range(self.n_links)]

    def queue(self, role: Role) -> QueueProfile:
        return self.queues.get(Role(role), DEFAULT_QUEUE)

    def graph(self):
        """A networkx MultiGraph: node attributes from `Node`, edges keyed by link id."""
        import networkx as nx

        g = nx.MultiGraph(name=self.name)
        for node in self.nodes:
            g.add_node(
                node.id,
                name=node.name,
                role=node.role.label,
                zone=node.zone,
                rack=node.rack,
                server=node.server,
                rail=node.rail,
                plane=node.plane,
            )
        for link in self.links:
            g.add_edge(
                link.a,
                link.b,
                key=link.id,
                rate_bps=link.rate_bps,
                delay_ns=link.delay_ns,
                mtu_bytes=link.mtu_bytes,
            )
        return g


class FabricBuilder:
    """Collects nodes and links in plain lists, then freezes them into a `Fabric`."""

    def __init__(self, name: str, kind: str):
        self.name = name
        self.kind = kind
        self._nodes: list[tuple] = []
        self._role_count = {role: 0 for role in Role}
        self._links: list[tuple[int, int, int, int, int]] = []

    def node(
        self,
        name: str,
        role: Role,
        *,
        zone: int = -1,
        rack: int = -1,
        server: int = -1,
        rail: int = -1,
        plane: int = -1,
    ) -> int:
        index = self._role_count[role]
        self._role_count[role] = index + 1
        self._nodes.append((name, int(role), zone, rack, server, rail, plane, index))
        return len(self._nodes) - 1

    def link(self, a: int, b: int, rate_bps: int, delay_ns: int, mtu_bytes: int) -> int:
        self._links.append((a, b, rate_bps, delay_ns, mtu_bytes))
        return len(self._links) - 1

    def build(
        self,
        queues: dict[Role, QueueProfile] | None = None,
        spec: dict[str, Any] | None = None,
    ) -> Fabric:
        names = tuple(n[0] for n in self._nodes)
        if len(set(names)) != len(names):
            raise SpecError(f"fabric {self.name} names two nodes alike")
        cols = np.array([n[1:] for n in self._nodes], dtype=_I32).reshape(-1, 7)
        links = np.array(self._links, dtype=_I64).reshape(-1, 5)
        return Fabric(
            name=self.name,
            kind=self.kind,
            node_name=names,
            node_role=cols[:, 0].astype(np.int8),
            node_zone=cols[:, 1].copy(),
            node_rack=cols[:, 2].copy(),
            node_server=cols[:, 3].copy(),
            node_rail=cols[:, 4].copy(),
            node_plane=cols[:, 5].copy(),
            node_index=cols[:, 6].copy(),
            link_a=links[:, 0].astype(_I32),
            link_b=links[:, 1].astype(_I32),
            link_rate_bps=links[:, 2].copy(),
            link_delay_ns=links[:, 3].copy(),
            link_mtu_bytes=links[:, 4].astype(_I32),
            queues=dict(queues or {}),
            spec=dict(spec or {}),
        )
