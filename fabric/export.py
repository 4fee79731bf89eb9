"""A fabric written out: topology JSON (the run directory's topology.json), GraphML, DOT."""

from __future__ import annotations

import io
from dataclasses import asdict

from fabric.addressing import format_ipv4, nic_ipv4
from fabric.model import Fabric, Role

TOPOLOGY_SCHEMA = "aifabric.topology/1"


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


def to_graphml(fabric: Fabric) -> str:
    import networkx as nx

    g = fabric.graph()
    names = {i: fabric.node_name[i] for i in g.nodes}
    g = nx.relabel_nodes(g, names)
    buf = io.BytesIO()
    nx.write_graphml(g, buf)
    return buf.getvalue().decode()


def to_dot(fabric: Fabric) -> str:
    from fabric.units import format_rate

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
