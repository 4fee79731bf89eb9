"""How ECMP spreads a set of flows over a fabric's uplinks, next to uniform hashing.

A *tier* is a direction between two switch roles (`rtsw>ctsw` up,
`ctsw>rtsw` down, ...). Its bins are the ports of that tier on the switches
that carried at least one flow across it. Each flow may be split over K QPs
(QP scaling): each QP carries 1/K of the flow's load, and is its own
5-tuple only if its UDP source port differs from its siblings' (the NICs'
rule, `aifabric.fabric.addressing.SPORT_RULES`, decides).

The reference ("balls into bins") routes the same QPs with a uniform random
choice at every hop, averaged over several draws: what a perfect hash would
give on this fabric with these endpoints. A perfect hash still sends QPs
that share every hashed field (`routing.hashed_fields`: the same 5-tuple)
one way, so the reference draws once per such unit, not once per QP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aifabric.fabric.addressing import DEFAULT_SPORT, allocate_qpns, udp_sports
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.imbalance import imbalance
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import Paths, Routing, hash_units, hashed_fields


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


def expand_qps(
    src, dst, qps: int, rng: np.random.Generator, sport: str = DEFAULT_SPORT, n_nodes=None
) -> QpFlows:
    """Split every flow over `qps` queue pairs, numbered as NICs number them
    (`allocate_qpns`: per NIC from a base drawn from `rng`, in flow order, so a flow's QPs
    are consecutive at each end), each with its UDP source port by the rule `sport`.
    `n_nodes` (default: past the largest NIC id) sizes the bases."""
    if qps < 1:
        raise AifabricError(f"--qps must be at least 1, got {qps}")
    n = len(src)
    src_qp = np.repeat(np.asarray(src, dtype=np.int32), qps)
    dst_qp = np.repeat(np.asarray(dst, dtype=np.int32), qps)
    if n_nodes is None:
        n_nodes = int(max(src_qp.max(initial=-1), dst_qp.max(initial=-1))) + 1
    sqpn, dqpn = allocate_qpns(src_qp, dst_qp, n_nodes, rng)
    return QpFlows(
        src=src_qp,
        dst=dst_qp,
        sqpn=sqpn,
        dqpn=dqpn,
        sport=udp_sports(sqpn, dqpn, sport, rng),
        weight=np.full(n * qps, 1.0 / qps),
        flow=np.repeat(np.arange(n), qps),
    )


def reference_units(policy: str, qp: QpFlows) -> np.ndarray:
    """The hashing unit of every QP under `policy` (`hash_units` of its hashed fields)."""
    return hash_units([getattr(qp, name) for name in hashed_fields(policy)])


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
    """Per tier: the observed spread of `qp` under `routing`, and the uniform reference
    (one draw per hashing unit, `reference_units`)."""
    fabric = routing.fabric
    rng = rng or np.random.default_rng(0)
    paths = routing.paths(qp.src, qp.dst, qp.sport, qp.dqpn, weight=qp.weight)
    observed = _tier_loads(fabric, paths, qp.weight)
    units = reference_units(routing.policy, qp)
    reference: dict[int, list[dict]] = {}
    for _ in range(trials):
        ideal = routing.paths(qp.src, qp.dst, qp.sport, qp.dqpn, rng=rng, units=units)
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
        "hash_units": int(units.max()) + 1 if len(units) else 0,
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
    sport: str = DEFAULT_SPORT,
) -> dict:
    """`ecmp_spread` of `flows` random cross-rack flows of `qps` QPs each (what `aifabric
    ecmp` shows), their UDP source ports by the rule `sport`: one generator seeded by
    `seed` draws the flows, QPNs (and random ports) and reference."""
    rng = np.random.default_rng(seed)
    src, dst = random_flows(fabric, flows, rng)
    qp = expand_qps(src, dst, qps, rng, sport, fabric.n_nodes)
    routing = Routing(fabric, policy, seed, same_seed=same_seed)
    spread = ecmp_spread(routing, qp, trials=trials, rng=rng)
    return {"fabric": fabric.name, "sport": sport, **spread, **port_counts(qp)}


def port_counts(qp: QpFlows) -> dict:
    """How many distinct UDP source ports the flows' QPs have: the mean per flow and the
    share of flows whose every QP has a port of its own."""
    if not len(qp.flow):
        return {"ports_per_flow": 0.0, "flows_all_ports_distinct": 0.0}
    n = int(qp.flow.max()) + 1
    pairs = np.unique(np.stack([qp.flow, qp.sport.astype(np.int64)], axis=1), axis=0)
    distinct = np.bincount(pairs[:, 0], minlength=n)
    qps = np.bincount(qp.flow, minlength=n)
    return {
        "ports_per_flow": float(distinct.mean()),
        "flows_all_ports_distinct": float(np.mean(distinct == qps)),
    }
