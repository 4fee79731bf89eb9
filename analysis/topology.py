"""A `Fabric` rebuilt from a run directory's topology.json (fabric.export.topology_dict)."""

from __future__ import annotations

import numpy as np

from fabric.errors import AifabricError
from fabric.model import ROLES, Fabric


def fabric_from_topology(topo: dict) -> Fabric:
    """The fabric a run was made on, from the topology it recorded."""
    try:
        nodes = sorted(topo["nodes"], key=lambda n: n["id"])
        links = sorted(topo["links"], key=lambda link: link["id"])
        if [n["id"] for n in nodes] != list(range(len(nodes))):
            raise ValueError("node ids are not 0..n-1")

        def col(key, rows, dtype):
            return np.array([r[key] for r in rows], dtype=dtype)

        return Fabric(
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
    except (KeyError, TypeError, ValueError) as e:
        raise AifabricError(f"the run's topology.json cannot be read as a fabric: {e}") from None
