"""How evenly ECMP spread a run's flows, over the links they could have used.

A *choice* is a hop where a flow's switch had more than one equal-cost next
hop toward its destination (`Routing.next_hops`): leaving a rack switch for
the spines, or a spine's parallel links down to a rack. Only choices count:
a ring that crosses 7 rack boundaries can load at most the uplinks of those
7 racks, and those are the bins its imbalance is measured over.

Per switch and tier, the QPs are the distinct (src, dst, UDP source port,
dQPN) that made a choice there (a QP's flows over many steps take one path),
the bins the union of their next-hop sets. The balls are their hashing units:
QPs equal in every field the policy hashes (`routing.hashed_fields`: the
5-tuple, and the dQPN under eecmp) are one unit, since no hash can split
them (the QPs of a connection whose NICs gave them one UDP source port).
Beside every observed figure stands its expectation under uniform hashing:
each unit at each of its choices picks one of its next hops uniformly at
random (its QPs with it), averaged over `TRIALS` draws (fixed seed), and for
collisions (units landing on an occupied link) the closed form
m - n (1 - (1 - 1/n)^m) of m units on n links. So "beyond uniform" is what
the hash did, not the ports the QPs were given.

A run with faults had fewer next hops after each: a flow's sets are those of
the routing that chose its route (`route_epoch` in flows.npz, as the simulator
records it: the routing at the start, or the one after the fault that re-routed
the flow). For a run without that column (the emulator's), a flow counts under
the routing in force when it started.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aifabric.analysis import results as R

QP_KEY = ("src", "dst", "sport", "dqpn")
TRIALS = 256


def expected_collisions(balls: int, bins: int) -> float:
    """Expected flows landing on an occupied bin when `balls` go uniformly into `bins`."""
    if balls <= 0 or bins <= 0:
        return 0.0
    return float(balls - bins * (1.0 - (1.0 - 1.0 / bins) ** balls))


def _choices(fabric, routings: Sequence, epoch: np.ndarray, flows: dict, ports: np.ndarray):
    """One row per (QP, hop with a choice): QP, chosen port, the candidate ports (CSR),
    bytes per QP, and per QP its hashing unit under the routing's policy."""
    from aifabric.analysis.metrics import group_rows
    from aifabric.fabric.routing import hash_units, hashed_fields

    n = len(flows["src"])
    ptr = flows["path_ptr"].astype(np.int64)
    keys = np.stack([flows[k].astype(np.int64).view(np.uint64) for k in QP_KEY], axis=1)
    qp, rep, _, _ = group_rows(keys, np.zeros(n, dtype=np.int64))
    qp_unit = hash_units([flows[k][rep] for k in hashed_fields(routings[0].policy)])
    qp_bytes = np.bincount(qp, weights=flows["bytes"].astype(np.float64), minlength=len(rep))
    cache: dict[tuple[int, int, int], np.ndarray] = {}
    row_qp, row_port, cand = [], [], []
    for q, f in enumerate(rep.tolist()):
        dst = int(flows["dst"][f])
        e = int(epoch[f])
        for j in range(ptr[f], ptr[f + 1]):
            p = int(ports[j])
            node = int(fabric.port_node[p])
            if node == int(flows["src"][f]):
                continue
            key = (e, node, dst)
            hops = cache.get(key)
            if hops is None:
                hops = cache[key] = routings[e].next_hops(node, dst)
            if len(hops) > 1:
                row_qp.append(q)
                row_port.append(p)
                cand.append(hops)
    cand_ptr = np.zeros(len(cand) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in cand], out=cand_ptr[1:])
    flat = np.concatenate(cand).astype(np.int64) if cand else np.zeros(0, np.int64)
    return (
        np.asarray(row_qp, dtype=np.int64),
        np.asarray(row_port, dtype=np.int64),
        cand_ptr,
        flat,
        qp_bytes,
        qp_unit,
    )


def _uniform_draws(cand_ptr, flat, weight, group, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ports, their loads [TRIALS, ports] in weight and in QPs) of uniform choices, over
    the candidate ports only; the rows of one `group` (a hashing unit at one switch, see
    `hash_units`) share their draw."""
    ports, slot = np.unique(flat, return_inverse=True)
    size = np.diff(cand_ptr)
    groups = int(group.max()) + 1 if len(group) else 0
    by = np.zeros((TRIALS, len(ports)))
    count = np.zeros((TRIALS, len(ports)))
    for t in range(TRIALS):
        u = rng.random(groups)[group]
        pick = slot[cand_ptr[:-1] + (u * size).astype(np.int64)]
        by[t] = np.bincount(pick, weights=weight, minlength=len(ports))
        count[t] = np.bincount(pick, minlength=len(ports))
    return ports, by, count


def _expected(draws: np.ndarray, ports: np.ndarray, bins: np.ndarray) -> R.UniformReference:
    """The mean over the draws of `imbalance`'s max/mean, CV and Jain of loads on `bins`."""
    x = draws[:, np.searchsorted(ports, bins)]
    mean = x.mean(axis=1)
    ok = mean > 0  # an empty draw is perfectly balanced, as `imbalance` has it
    safe = np.where(ok, mean, 1.0)
    sq = (x**2).sum(axis=1)
    return R.UniformReference(
        max_mean=float(np.where(ok, x.max(axis=1) / safe, 1.0).mean()),
        cv=float(np.where(ok, x.std(axis=1) / safe, 0.0).mean()),
        jain=float(
            np.where(ok, x.sum(axis=1) ** 2 / (x.shape[1] * np.where(ok, sq, 1.0)), 1.0).mean()
        ),
    )


def ecmp_metrics(
    fabric, flows: dict, routing, ports: np.ndarray, epoch: np.ndarray | None = None
) -> R.Ecmp:
    """Per tier (up and down) and per switch: the spread of the QPs that had a choice.
    `routing` is one Routing, or one per epoch of a run with faults, `epoch` (per flow)
    saying which chose each flow's route."""
    from aifabric.fabric.spread import tier_name, tier_of_ports

    routings = list(routing) if isinstance(routing, Sequence) else [routing]
    if epoch is None:
        epoch = np.zeros(len(flows["src"]), dtype=np.int64)
    epoch = np.clip(np.asarray(epoch, dtype=np.int64), 0, len(routings) - 1)
    from aifabric.fabric.routing import hash_units

    qp, chosen, cand_ptr, flat, qp_bytes, qp_unit = _choices(fabric, routings, epoch, flows, ports)
    if not len(qp):
        return R.Ecmp()
    unit = qp_unit[qp]
    labels = tier_of_ports(fabric)
    weight = qp_bytes[qp]
    n_ports = fabric.n_ports
    by = np.bincount(chosen, weights=weight, minlength=n_ports)
    count = np.bincount(chosen, minlength=n_ports)
    rng = np.random.default_rng(0)
    node = fabric.port_node[chosen]
    cands, u_by, u_count = _uniform_draws(cand_ptr, flat, weight, hash_units([unit, node]), rng)
    tier = labels[chosen]
    switches, tiers = [], []
    for label in sorted(np.unique(tier), key=lambda x: (x % 4 < x // 4, x // 4, x % 4)):
        in_tier = np.flatnonzero(tier == label)
        rows, tier_bins = [], []
        for s in np.unique(node[in_tier]):
            mine = in_tier[node[in_tier] == s]
            bins = np.unique(np.concatenate([flat[cand_ptr[i] : cand_ptr[i + 1]] for i in mine]))
            m = len(np.unique(unit[mine]))
            occupied = int(np.count_nonzero(count[bins]))
            tier_bins.append(bins)
            rows.append(
                R.EcmpSwitch(
                    switch=fabric.node_name[s],
                    tier=tier_name(int(label)),
                    links=len(bins),
                    ports=tuple(fabric.port_name(p) for p in bins),
                    qps=len(np.unique(qp[mine])),
                    hash_units=m,
                    bytes_per_link=tuple(int(x) for x in by[bins]),
                    qps_per_link=tuple(int(x) for x in count[bins]),
                    bytes=R.Imbalance.of(by[bins]),
                    bytes_expected=_expected(u_by, cands, bins),
                    qps_imbalance=R.Imbalance.of(count[bins]),
                    qps_expected=_expected(u_count, cands, bins),
                    collisions=m - occupied,
                    collisions_expected=expected_collisions(m, len(bins)),
                )
            )
        bins = np.unique(np.concatenate(tier_bins))
        switches += rows
        tiers.append(
            R.EcmpTier(
                tier=tier_name(int(label)),
                switches=len(rows),
                links=len(bins),
                links_in_tier=int(np.count_nonzero(labels == label)),
                links_used=int(np.count_nonzero(count[bins])),
                qps=int(sum(r.qps for r in rows)),
                hash_units=int(sum(r.hash_units for r in rows)),
                bytes=R.Imbalance.of(by[bins]),
                bytes_expected=_expected(u_by, cands, bins),
                qps_imbalance=R.Imbalance.of(count[bins]),
                qps_expected=_expected(u_count, cands, bins),
                switch_max_mean=float(np.mean([r.bytes.max_mean for r in rows])),
                switch_max_mean_expected=float(np.mean([r.bytes_expected.max_mean for r in rows])),
                collisions=int(sum(r.collisions for r in rows)),
                collisions_expected=float(sum(r.collisions_expected for r in rows)),
            )
        )
    return R.Ecmp(tiers=tuple(tiers), switches=tuple(switches), choices=int(len(qp)))
