"""Separate seeds for placement, QP numbering and hashing, each defaulting to the scenario's."""

from __future__ import annotations

import numpy as np
import pytest

from aifabric.emu import plan as P
from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Role
from aifabric.fabric.routing import routing_seeds
from aifabric.scenarios import scenario_from_dict
from aifabric.sim.engine import simulation_for

QPN_SPAN = (1 << 24) - 0x100


def scenario(seed=5, **seeds):
    """Two fragmented jobs on lab-medium (a ring AllReduce and a permutation), 5-tuple ECMP."""
    raw = {
        "scenario": {"topology": "lab-medium", "seed": seed, **seeds},
        "workload": {
            "jobs": [
                {
                    "collective": "allreduce",
                    "algorithm": "ring",
                    "size": "1MiB",
                    "gpus": 32,
                    "placement": "fragmented",
                },
                {"pattern": "permutation", "size": "1MB", "gpus": 32, "placement": "fragmented"},
            ]
        },
        "ecmp": {"policy": "5tuple"},
    }
    return scenario_from_dict(raw, "seeds")


def paths(sc) -> list[tuple[int, ...]]:
    """The ports every flow takes, under the scenario's own routing (the simulator's)."""
    f = sc.flows
    p = simulation_for(sc).routing.paths(f.src, f.dst, f.sport, f.dqpn)
    return [tuple(p.ports[p.ptr[i] : p.ptr[i + 1]].tolist()) for i in range(len(f))]


def nics(sc) -> np.ndarray:
    return np.unique(np.concatenate([sc.flows.src, sc.flows.dst]))


def same_flows(a, b, columns=("src", "dst", "bytes", "start_ns", "sqpn", "dqpn", "sport")):
    return all(np.array_equal(getattr(a.flows, c), getattr(b.flows, c)) for c in columns)


def engine_hash_seeds(sc) -> tuple[np.ndarray, np.ndarray]:
    """The switches' hash seeds as the simulator and the emulator use them."""
    switches = sc.fabric.node_role != Role.NIC
    sim = simulation_for(sc).routing.seeds[switches]
    emu = P.plan(sc, ecn="none").hash_seed[switches]
    return sim, emu


def test_each_seed_defaults_to_the_scenario_seed():
    base = scenario(seed=5)
    explicit = scenario(seed=5, placement_seed=5, hash_seed=5)
    assert (base.placement_seed, base.qpn_seed, base.hash_seed) == (5, None, 5)
    assert same_flows(base, explicit)
    assert np.array_equal(engine_hash_seeds(base)[0], engine_hash_seeds(explicit)[0])
    record = base.to_dict()
    assert {k: record[k] for k in ("seed", "placement_seed", "qpn_seed", "hash_seed")} == {
        "seed": 5,
        "placement_seed": 5,
        "qpn_seed": None,
        "hash_seed": 5,
    }


def test_hash_seed_moves_paths_not_placement_or_qpns():
    a = scenario(seed=5, hash_seed=1)
    b = scenario(seed=5, hash_seed=2)
    assert same_flows(a, b)
    sim_a, emu_a = engine_hash_seeds(a)
    sim_b, emu_b = engine_hash_seeds(b)
    assert not np.array_equal(sim_a, sim_b)
    pa, pb = paths(a), paths(b)
    assert sum(x != y for x, y in zip(pa, pb, strict=True)) > len(pa) // 10
    assert {len(x) for x in pa + pb} > {2}  # cross-rack flows: there were choices to make


def test_placement_seed_moves_placement_not_hashing():
    a = scenario(seed=5, placement_seed=1)
    b = scenario(seed=5, placement_seed=2)
    assert not np.array_equal(nics(a), nics(b))
    for x, y in zip(engine_hash_seeds(a), engine_hash_seeds(b), strict=True):
        assert np.array_equal(x, y)
    assert a.hash_seed == b.hash_seed == 5


def test_qpn_seed_moves_qpns_only():
    a = scenario(seed=5, qpn_seed=1)
    b = scenario(seed=5, qpn_seed=2)
    assert same_flows(a, b, ("src", "dst", "bytes", "start_ns"))
    assert not np.array_equal(a.flows.sqpn, b.flows.sqpn)
    assert not np.array_equal(a.flows.sport, b.flows.sport)
    assert np.array_equal(engine_hash_seeds(a)[0], engine_hash_seeds(b)[0])


def test_a_given_qpn_seed_numbers_each_nic_from_its_own_base_wherever_jobs_land():
    """With qpn_seed given, a NIC's QPNs count up from its base drawn from that seed alone
    (0, 1, 2, ... per connection): the placement draws no longer shift them."""
    bases = np.random.default_rng(9).integers(0x100, 1 << 24, size=144, dtype=np.int64)
    for placement_seed in (1, 2):
        f = scenario(seed=5, placement_seed=placement_seed, qpn_seed=9).flows
        end = np.concatenate([f.src, f.dst])
        offset = (np.concatenate([f.sqpn, f.dqpn]).astype(np.int64) - bases[end]) % QPN_SPAN
        for nic in np.unique(end):
            used = np.unique(offset[end == nic])
            assert np.array_equal(used, np.arange(len(used)))


def test_without_qpn_seed_qpns_follow_placement():
    a = scenario(seed=5, placement_seed=1)
    b = scenario(seed=5, placement_seed=2)
    shared = np.intersect1d(a.flows.src, b.flows.src)
    first_a = {int(n): int(a.flows.sqpn[a.flows.src == n].min()) for n in shared}
    first_b = {int(n): int(b.flows.sqpn[b.flows.src == n].min()) for n in shared}
    assert len(shared) and all(first_a[n] != first_b[n] for n in first_a)


def test_both_engines_hash_with_the_hash_seed():
    sc = scenario(seed=5, hash_seed=11)
    sim, emu = engine_hash_seeds(sc)
    want = routing_seeds(sc.fabric.n_nodes, 11)[sc.fabric.node_role != Role.NIC]
    assert np.array_equal(sim, want)
    assert np.array_equal(emu, np.where(want == 0, 1, want))
    assert simulation_for(sc).seed == 11


def test_the_run_seed_sets_the_base_seed_only():
    raw = {
        "scenario": {"topology": "lab-small", "seed": 1, "placement_seed": 4},
        "workload": {"pattern": "permutation", "size": "1MB"},
    }
    sc = scenario_from_dict(raw, "cli", seed=8)
    assert (sc.seed, sc.placement_seed, sc.qpn_seed, sc.hash_seed) == (8, 4, None, 8)


@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
@pytest.mark.parametrize("key", ["seed", "placement_seed", "qpn_seed", "hash_seed"])
def test_a_seed_must_be_a_whole_number(key, value):
    with pytest.raises(SpecError, match=rf"scenario seeds: scenario\.{key} = .* whole number"):
        scenario(**{"seed": 5, key: value})


def test_analysis_rebuilds_routes_with_the_recorded_hash_seed(get_fabric):
    from types import SimpleNamespace

    from aifabric.analysis.metrics import _routings

    fabric = get_fabric("lab-small")
    flows = {"start_ns": np.zeros(1, dtype=np.int64)}
    recorded = {"seed": 5, "hash_seed": 11, "ecmp": {"policy": "5tuple", "same_seed": False}}
    (routing,), _ = _routings(SimpleNamespace(meta={"scenario": recorded}), fabric, flows)
    assert np.array_equal(routing.seeds, routing_seeds(fabric.n_nodes, 11))
    del recorded["hash_seed"]  # a run from before the seeds were separated
    (routing,), _ = _routings(SimpleNamespace(meta={"scenario": recorded}), fabric, flows)
    assert np.array_equal(routing.seeds, routing_seeds(fabric.n_nodes, 5))
