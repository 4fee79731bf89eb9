"""A job scheduler: jobs arrive over time and are placed on the GPUs free at that moment.

Jobs queue in order of arrival (first come, first served, no backfill: a job that
does not fit waits for running jobs to end, and the jobs behind it wait with it).
A job holds its GPUs from its start for its planned time (`hold`) and frees them
when it ends, so which GPUs are free, and how scattered they are, follows from the
arrivals and departures, not from a placement flag. Two policies:

- `first-fit`: topology-blind; the lowest-numbered free GPUs (topology order:
  zone, rack, server, rail), wherever they lie.
- `topology-aware`: as Meta's scheduler keeps jobs off the oversubscribed ATSW
  layer (Gangidi et al., SIGCOMM 2024; Meta Engineering, 2024-08-05): the
  smallest unit (server, rack, AI Zone) with room for the job, best fit first;
  a job no zone has room for spans the fewest zones (most free GPUs first).
  Inside, racks with the most free GPUs first (rack-aligned: whole free racks
  before partial ones), so the job covers as few racks as it can.

Ranks are in topology order, as `aifabric.traffic.placement` numbers them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric
from aifabric.traffic.placement import server_keys

POLICIES = ("first-fit", "topology-aware")


@dataclass(frozen=True)
class Placed:
    """One job in the schedule: when it arrived, started and (as planned) ends, and where."""

    job: int
    arrival_ns: int
    start_ns: int
    end_ns: int
    nics: np.ndarray  # NIC node ids, in rank order

    @property
    def wait_ns(self) -> int:
        return self.start_ns - self.arrival_ns

    def to_dict(self, fabric: Fabric, name: str) -> dict:
        """The job's row of run.json's `scenario.schedule.jobs`."""
        return {
            "job": self.job,
            "name": name,
            "gpus": len(self.nics),
            "zones": int(len(np.unique(fabric.node_zone[self.nics]))),
            "racks": int(len(np.unique(server_keys(fabric, self.nics)[1]))),
            "arrival_ns": self.arrival_ns,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
        }


def schedule(
    fabric: Fabric,
    sizes: Sequence[int],
    arrivals: Sequence[int],
    policy: str,
    hold: Callable[[int, np.ndarray], int],
    names: Sequence[str] | None = None,
) -> list[Placed]:
    """Each job (GPUs `sizes[j]`, arriving at `arrivals[j]`) placed by `policy` once enough
    GPUs are free, in order of arrival; `hold(j, nics)` is how long job j keeps the GPUs it
    was given. Jobs are returned in the order they start."""
    if policy not in POLICIES:
        raise SpecError(f"scheduler {policy!r} is not one of {', '.join(POLICIES)}")
    nics = fabric.nic_ids
    total = len(nics)
    names = names or [f"job {j}" for j in range(len(sizes))]
    for j, gpus in enumerate(sizes):
        if gpus > total:
            raise SpecError(
                f"the scheduler cannot place {names[j]}: it needs {gpus} GPUs and fabric "
                f"{fabric.name} has {total}"
            )
    levels = server_keys(fabric, nics)
    free = np.ones(total, dtype=bool)
    index = np.full(fabric.n_nodes, -1, dtype=np.int64)
    index[nics] = np.arange(total)
    running: list[tuple[int, int]] = []  # (planned end, job)
    held: dict[int, np.ndarray] = {}
    out = []
    now = 0
    for j in sorted(range(len(sizes)), key=lambda k: (arrivals[k], k)):
        now = max(now, arrivals[j])  # first come, first served: never before the job ahead
        while running and (running[0][0] <= now or int(free.sum()) < sizes[j]):
            end, done = heapq.heappop(running)
            now = max(now, end)
            free[index[held.pop(done)]] = True
        chosen = nics[_choose(policy, sizes[j], free, levels)]
        free[index[chosen]] = False
        end = now + max(int(hold(j, chosen)), 1)
        heapq.heappush(running, (end, j))
        held[j] = chosen
        out.append(Placed(j, int(arrivals[j]), now, end, chosen.astype(np.int32)))
    return out


def _choose(policy: str, gpus: int, free: np.ndarray, levels) -> np.ndarray:
    """Indices into the NIC list of `gpus` free NICs, in topology order."""
    if policy == "first-fit":
        return np.flatnonzero(free)[:gpus]
    server, rack, zone = levels
    for unit in levels:
        counts = np.bincount(unit[free], minlength=int(unit.max()) + 1)
        fits = np.flatnonzero(counts >= gpus)
        if len(fits):
            best = fits[np.argmin(counts[fits])]  # least room left over; lowest id on ties
            return _fill(gpus, free & (unit == best), rack)
    return _fill(gpus, free, rack, zone)


def _fill(gpus: int, free: np.ndarray, rack: np.ndarray, zone: np.ndarray | None = None):
    """`gpus` of the `free` NICs: zones with the most free first (when `zone` is given),
    inside them racks with the most free first, then topology order."""
    members = np.flatnonzero(free)
    rack_free = np.bincount(rack[members], minlength=int(rack.max()) + 1)
    keys = [members, -rack_free[rack[members]]]
    if zone is not None:
        zone_free = np.bincount(zone[members], minlength=int(zone.max()) + 1)
        keys += [zone[members], -zone_free[zone[members]]]
    chosen = members[np.lexsort(keys)][:gpus]
    return np.sort(chosen)
