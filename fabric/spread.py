"""How ECMP spreads a set of flows over a fabric's uplinks, next to uniform hashing.

A *tier* is a direction between two switch roles (`rtsw>ctsw` up,
`ctsw>rtsw` down, ...). Its bins are the ports of that tier on the switches
that carried at least one flow across it. Each flow may be split over K QPs
(QP scaling): each QP is its own 5-tuple and carries 1/K of the flow's load.

The reference ("balls into bins") routes the same QPs with a uniform random
choice at every hop, averaged over several draws: what a perfect hash would
give on this fabric with these endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aifabric.fabric.addressing import roce_udp_sport
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.imbalance import imbalance
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import Paths, Routing


@dataclass(frozen=True)
class QpFlows:
    """Flows expanded to QPs: one row per QP."""

    src: np.ndarray
    dst: np.ndarray
    sqpn: np.ndarray
    dqpn: np.ndarray
    sport: np.ndarray
    weight: np.ndarray  # share of its flow's load: 1 / qps
    flow: np.ndarray  # the flow each QP belongs to


def random_flows(fabric: Fabric, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n flows between uniformly drawn NICs in different racks (so they reach the fabric)."""
    nics = fabric.nic_ids
    leaf = fabric.nic_switch[nics]
    if len(np.unique(leaf)) < 2:
        raise AifabricError(f"fabric {fabric.name} has a single leaf switch: no flow crosses it")
    src = rng.choice(nics, n)
    dst = rng.choice(nics, n)
    same = fabric.nic_switch[src] == fabric.nic_switch[dst]
    while same.any():
        dst[same] = rng.choice(nics, int(same.sum()))
        same = fabric.nic_switch[src] == fabric.nic_switch[dst]
    return src.astype(np.int32), dst.astype(np.int32)


def expand_qps(src, dst, qps: int, rng: np.random.Generator) -> QpFlows:
    """Split every flow over `qps` queue pairs with random 24-bit QPNs at each end."""
    if qps < 1:
        raise AifabricError(f"--qps must be at least 1, got {qps}")
    n = len(src)
    sqpn = rng.integers(0x100, 1 << 24, size=n * qps)
    dqpn = rng.integers(0x100, 1 << 24, size=n * qps)
    return QpFlows(
        src=np.repeat(np.asarray(src, dtype=np.int32), qps),
        dst=np.repeat(np.asarray(dst, dtype=np.int32), qps),
        sqpn=sqpn,
        dqpn=dqpn,
        sport=roce_udp_sport(sqpn, dqpn),
        weight=np.full(n * qps, 1.0 / qps),
        flow=np.repeat(np.arange(n), qps),
    )


def tier_of_ports(fabric: Fabric) -> np.ndarray:
    """A label index per port: 4 * from-role + to-role, or -1 for NIC links."""
    a = fabric.node_role[fabric.port_node].astype(np.int32)
    b = fabric.node_role[fabric.port_peer].astype(np.int32)
    out = 4 * a + b
    out[(a == Role.NIC) | (b == Role.NIC)] = -1
    return out


def tier_name(label: int) -> str:
    return f"{Role(label // 4).label}>{Role(label % 4).label}"


def _tier_loads(fabric: Fabric, paths: Paths, weight: np.ndarray) -> dict[int, tuple]:
    labels = tier_of_ports(fabric)
    load = paths.port_counts(fabric.n_ports, weight)
    count = paths.port_counts(fabric.n_ports)
    out = {}
    for label in np.unique(labels[paths.ports]):
        if label < 0:
            continue
        ports = np.flatnonzero(labels == label)
        used_nodes = np.unique(fabric.port_node[ports[count[ports] > 0]])
        bins = ports[np.isin(fabric.port_node[ports], used_nodes)]
        out[int(label)] = (bins, load[bins], count[bins])
    return out


def _order(label: int) -> tuple[int, int]:
    a, b = label // 4, label % 4
    return (0 if b > a else 1, a if b > a else -a)


def ecmp_spread(
    routing: Routing,
    qp: QpFlows,
    *,
    trials: int = 16,
    rng: np.random.Generator | None = None,
) -> dict:
    """Per tier: the observed spread of `qp` under `routing`, and the uniform reference."""
    fabric = routing.fabric
    rng = rng or np.random.default_rng(0)
    paths = routing.paths(qp.src, qp.dst, qp.sport, qp.dqpn, weight=qp.weight)
    observed = _tier_loads(fabric, paths, qp.weight)
    reference: dict[int, list[dict]] = {}
    for _ in range(trials):
        ideal = routing.paths(qp.src, qp.dst, qp.sport, qp.dqpn, rng=rng)
        for label, (_, load, _) in _tier_loads(fabric, ideal, qp.weight).items():
            reference.setdefault(label, []).append(imbalance(load))
    tiers = []
    for label in sorted(observed, key=_order):
        bins, load, count = observed[label]
        ref = reference.get(label, [])
        hist = np.bincount(count.astype(np.int64))
        tiers.append(
            {
                "tier": tier_name(label),
                "qp_flows": int(count.sum()),
                "load": imbalance(load),
                "expected": {
                    key: float(np.mean([r[key] for r in ref])) if ref else None
                    for key in ("max_mean", "cv", "jain")
                },
                "flows_per_link": {str(i): int(c) for i, c in enumerate(hist) if c},
                "links": {fabric.port_names[p]: int(c) for p, c in zip(bins, count, strict=True)},
            }
        )
    return {
        "policy": routing.policy,
        "seed": routing.seed,
        "same_seed": routing.same_seed,
        "flows": int(qp.flow.max()) + 1 if len(qp.flow) else 0,
        "qps": int(len(qp.flow) // max(int(qp.flow.max()) + 1, 1)) if len(qp.flow) else 0,
        "unreachable": int((~paths.reachable).sum()),
        "tiers": tiers,
    }


def random_spread(
    fabric: Fabric,
    flows: int,
    policy: str = "5tuple",
    *,
    qps: int = 1,
    seed: int = 0,
    same_seed: bool = False,
    trials: int = 16,
) -> dict:
    """`ecmp_spread` of `flows` random cross-rack flows of `qps` QPs each (what `aifabric
    ecmp` shows): one generator seeded by `seed` draws the flows, QPNs and reference."""
    rng = np.random.default_rng(seed)
    src, dst = random_flows(fabric, flows, rng)
    qp = expand_qps(src, dst, qps, rng)
    routing = Routing(fabric, policy, seed, same_seed=same_seed)
    return {"fabric": fabric.name, **ecmp_spread(routing, qp, trials=trials, rng=rng)}
