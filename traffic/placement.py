"""Placing a job's GPUs on a fabric's NICs (one backend NIC per GPU).

- `packed`: topology-aware, as Meta's scheduler does: the smallest server,
  rack, zone (or the whole fabric) that still has enough free NICs, best fit
  first; a job that fits in a rack stays in one rack.
- `fragmented`: whole servers drawn at random (with the placement seed) over
  the fabric, so the job holds partial racks scattered across zones: the case
  where path pinning fails.
- `rail-aligned`: whole servers only (or the first rails of one server for a
  job smaller than a server), ranks numbered rail-major, so consecutive ranks
  share a rail and inter-server traffic stays on rails.

Ranks are returned in order: topology order (zone, rack, server, rail) for
`packed` and `fragmented`, rail-major for `rail-aligned`. `taken` marks NICs
other jobs already hold; placements never share a NIC.
"""

from __future__ import annotations

import numpy as np

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric


def server_keys(fabric: Fabric, nics: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique (zone, rack, server) -> server id, rack id, zone id of each NIC, in topology order."""
    zone = fabric.node_zone[nics].astype(np.int64)
    rack = fabric.node_rack[nics].astype(np.int64)
    server = fabric.node_server[nics].astype(np.int64)
    rack_key = (zone << 20) | rack
    server_key = (rack_key << 20) | server
    return (
        np.unique(server_key, return_inverse=True)[1],
        np.unique(rack_key, return_inverse=True)[1],
        np.unique(zone, return_inverse=True)[1],
    )


def place(
    fabric: Fabric,
    gpus: int,
    policy: str,
    rng: np.random.Generator,
    taken: np.ndarray | None = None,
) -> np.ndarray:
    """NIC node ids of a job's ranks, in rank order; `taken` (bool per node) is updated."""
    nics = fabric.nic_ids
    if taken is None:
        taken = np.zeros(fabric.n_nodes, dtype=bool)
    free = ~taken[nics]
    n_free = int(free.sum())
    if gpus == 0:
        gpus = n_free
    if gpus < 1 or gpus > n_free:
        raise SpecError(
            f"a job of {gpus} GPUs does not fit on fabric {fabric.name}: "
            f"{n_free} of its {len(nics)} GPUs are free"
        )
    server, rack, zone = server_keys(fabric, nics)
    rail = fabric.node_rail[nics]
    if policy == "packed":
        chosen = _packed(gpus, free, (server, rack, zone))
    elif policy == "fragmented":
        chosen = _fragmented(gpus, free, server, rng)
    elif policy == "rail-aligned":
        chosen = _rail_aligned(fabric, gpus, free, server, rail)
    else:
        raise SpecError(f"placement {policy!r} is not one of packed, fragmented, rail-aligned")
    taken[nics[chosen]] = True
    return nics[chosen].astype(np.int32)


def _packed(gpus: int, free: np.ndarray, levels) -> np.ndarray:
    """Best fit at the smallest level that holds the job; indices into the NIC list."""
    for unit in levels:
        counts = np.bincount(unit[free], minlength=int(unit.max()) + 1)
        fits = np.flatnonzero(counts >= gpus)
        if len(fits):
            best = fits[np.argmin(counts[fits])]  # least free space left over; lowest id on ties
            members = np.flatnonzero(free & (unit == best))
            return members[:gpus]
    return np.flatnonzero(free)[:gpus]


def _fragmented(gpus: int, free: np.ndarray, server: np.ndarray, rng) -> np.ndarray:
    """Whole free servers drawn at random, then (if the job is not whole servers) a partial one."""
    n_servers = int(server.max()) + 1
    size = np.bincount(server, minlength=n_servers)
    free_count = np.bincount(server[free], minlength=n_servers)
    whole = np.flatnonzero((free_count == size) & (size > 0))
    order = rng.permutation(whole)
    picked: list[np.ndarray] = []
    need = gpus
    for s in order:
        if need == 0:
            break
        members = np.flatnonzero(free & (server == s))
        take = members[: min(need, len(members))]
        picked.append(take)
        need -= len(take)
    if need:
        used = np.zeros(len(free), dtype=bool)
        if picked:
            used[np.concatenate(picked)] = True
        rest = np.flatnonzero(free & ~used)
        picked.append(rng.permutation(rest)[:need])
    chosen = np.concatenate(picked)
    return np.sort(chosen)  # topology order


def _rail_aligned(fabric, gpus, free, server, rail) -> np.ndarray:
    n_servers = int(server.max()) + 1
    size = np.bincount(server, minlength=n_servers)
    per_server = int(size.max())
    free_count = np.bincount(server[free], minlength=n_servers)
    whole = np.flatnonzero((free_count == size) & (size == per_server))
    if gpus < per_server:
        if not len(whole):
            raise SpecError(f"rail-aligned placement found no free server on {fabric.name}")
        members = np.flatnonzero(server == whole[0])
        return members[np.argsort(rail[members], kind="stable")][:gpus]
    if gpus % per_server:
        raise SpecError(
            f"rail-aligned placement takes whole servers of {per_server} GPUs; "
            f"{gpus} GPUs is not a multiple"
        )
    need = gpus // per_server
    if len(whole) < need:
        raise SpecError(
            f"rail-aligned placement needs {need} free servers on {fabric.name}, "
            f"only {len(whole)} are free"
        )
    servers = whole[:need]
    members = np.flatnonzero(np.isin(server, servers))
    order = np.lexsort((server[members], rail[members]))  # rail-major, then server
    return members[order]
