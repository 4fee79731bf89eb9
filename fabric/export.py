"""A fabric written out: topology JSON (the run directory's topology.json), GraphML, DOT;
and read back from topology JSON (`fabric_from_topology`)."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, fields

import numpy as np

from aifabric.fabric.addressing import format_ipv4, nic_ipv4
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import ROLES, Fabric, Link, Node, Role

TOPOLOGY_SCHEMA = "aifabric.topology/1"
FORMATS = ("json", "graphml", "dot")


def topology_dict(fabric: Fabric) -> dict:
    """The fabric as topology.json holds it: its nodes (`Node`'s fields, the role's label,
    a NIC's IPv4 address) and links (`Link`'s), and each role's queues."""
    ips = nic_ipv4(fabric)
    n, m = fabric.n_nodes, fabric.n_links
    node_cols = {
        "id": range(n),
        "name": fabric.node_name,
        "role": [ROLES[r] for r in fabric.node_role.tolist()],
        **{f.name: getattr(fabric, f"node_{f.name}").tolist() for f in fields(Node)[3:]},
    }
    link_cols = {
        "id": range(m),
        **{f.name: getattr(fabric, f"link_{f.name}").tolist() for f in fields(Link)[1:6]},
        "a_port": fabric.port_number[0::2].tolist(),
        "b_port": fabric.port_number[1::2].tolist(),
    }
    nodes = _rows(node_cols)
    for d in nodes:
        if d["role"] == Role.NIC.label:
            d["ipv4"] = format_ipv4(ips[d["id"]])
    links = _rows(link_cols)
    return {
        "schema": TOPOLOGY_SCHEMA,
        "name": fabric.name,
        "kind": fabric.kind,
        "nodes": nodes,
        "links": links,
        "queues": {role.label: asdict(fabric.queue(role)) for role in Role},
    }


def _rows(columns: dict) -> list[dict]:
    keys = list(columns)
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def topology_json(fabric: Fabric) -> str:
    """topology.json's text: a node or link per line (json's C encoder writes each; an
    indented dump of a 24,576-GPU fabric is pure Python and takes seconds)."""
    parts = []
    for key, value in topology_dict(fabric).items():
        if key in ("nodes", "links"):
            rows = ",\n".join(json.dumps(row) for row in value)
            parts.append(f"{json.dumps(key)}: [\n{rows}\n]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value, indent=1)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


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
