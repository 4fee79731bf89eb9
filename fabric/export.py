"""A fabric written out: topology JSON (the run directory's topology.json), GraphML, DOT;
and read back from topology JSON (`fabric_from_topology`)."""

from __future__ import annotations

import io
from dataclasses import asdict

import numpy as np

from aifabric.fabric.addressing import format_ipv4, nic_ipv4
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import ROLES, Fabric, Role

TOPOLOGY_SCHEMA = "aifabric.topology/1"
FORMATS = ("json", "graphml", "dot")


def topology_dict(fabric: Fabric) -> dict:
    ips = nic_ipv4(fabric)
    nodes = []
    for node in fabric.nodes:
        d = asdict(node)
        d["role"] = node.role.label
        if node.role == Role.NIC:
            d["ipv4"] = format_ipv4(ips[node.id])
        nodes.append(d)
    queues = {}
    for role in Role:
        q = fabric.queue(role)
        queues[role.label] = asdict(q)
    return {
        "schema": TOPOLOGY_SCHEMA,
        "name": fabric.name,
        "kind": fabric.kind,
        "nodes": nodes,
        "links": [asdict(link) for link in fabric.links],
        "queues": queues,
    }


def fabric_from_topology(topo: dict) -> Fabric:
    """The fabric a run was made on, from the topology it recorded (`topology_dict`'s
    nodes and links; the reader beside the writer, for the analyzer and the cross-check)."""
    try:
        nodes = sorted(topo["nodes"], key=lambda n: n["id"])
        links = sorted(topo["links"], key=lambda link: link["id"])
        if [n["id"] for n in nodes] != list(range(len(nodes))):
            raise ValueError("node ids are not 0..n-1")
        if [link["id"] for link in links] != list(range(len(links))):
            raise ValueError("link ids are not 0..n-1")
        if not all(isinstance(n["name"], str) for n in nodes):
            raise ValueError("a node's name is not text")

        def col(key, rows, dtype):
            return np.array([r[key] for r in rows], dtype=dtype)

        for key, low in (("rate_bps", 1), ("delay_ns", 0), ("mtu_bytes", 1)):
            if any(not isinstance(r[key], int) or r[key] < low for r in links):
                raise ValueError(f"a link's {key} is not a whole number of at least {low}")
        fabric = Fabric(
            name=topo.get("name", "fabric"),
            kind=topo.get("kind", ""),
            node_name=tuple(n["name"] for n in nodes),
            node_role=np.array([ROLES.index(n["role"]) for n in nodes], dtype=np.int8),
            node_zone=col("zone", nodes, np.int32),
            node_rack=col("rack", nodes, np.int32),
            node_server=col("server", nodes, np.int32),
            node_rail=col("rail", nodes, np.int32),
            node_plane=col("plane", nodes, np.int32),
            node_index=col("index", nodes, np.int32),
            link_a=col("a", links, np.int32),
            link_b=col("b", links, np.int32),
            link_rate_bps=col("rate_bps", links, np.int64),
            link_delay_ns=col("delay_ns", links, np.int64),
            link_mtu_bytes=col("mtu_bytes", links, np.int32),
        )
        _check_nics(fabric)
        nic_ipv4(fabric)  # aifabric writes only fabrics whose NICs have 10.zone.rack.slot addresses
        return fabric
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError, IndexError) as e:
        raise AifabricError(f"the run's topology.json cannot be read as a fabric: {e}") from None


def _check_nics(fabric: Fabric) -> None:
    """Every NIC has exactly one link, to a switch: the engines and the analyzer take a NIC's
    one port as where its flows start and end (`Fabric.nic_port`)."""
    ends = np.concatenate([fabric.link_a, fabric.link_b])
    if len(ends) and (ends.min() < 0 or ends.max() >= len(fabric.node_name)):
        raise ValueError("a link names a node that is not there")
    degree = np.bincount(ends, minlength=len(fabric.node_name))
    nic = fabric.node_role == Role.NIC
    bad = np.flatnonzero(nic & (degree != 1))
    if len(bad):
        name = fabric.node_name[int(bad[0])]
        raise ValueError(f"NIC {name} has {int(degree[bad[0]])} links, not one")
    if np.any(nic[fabric.link_a] & nic[fabric.link_b]):
        raise ValueError("a link joins two NICs")


def to_graphml(fabric: Fabric) -> str:
    import networkx as nx

    g = fabric.graph()
    names = {i: fabric.node_name[i] for i in g.nodes}
    g = nx.relabel_nodes(g, names)
    buf = io.BytesIO()
    nx.write_graphml(g, buf)
    return buf.getvalue().decode()


def to_dot(fabric: Fabric) -> str:
    from aifabric.fabric.units import format_rate

    lines = [f'graph "{fabric.name}" {{', "  node [shape=box];"]
    for node in fabric.nodes:
        lines.append(f'  "{node.name}" [role={node.role.label}];')
    names = fabric.node_name
    for link in fabric.links:
        lines.append(
            f'  "{names[link.a]}" -- "{names[link.b]}" '
            f'[label="{format_rate(link.rate_bps)}", delay_ns={link.delay_ns}];'
        )
    lines.append("}")
    return "\n".join(lines) + "\n"
