"""The job scheduler: jobs arriving over time placed by first-fit or topology-aware on the GPUs
free then, waiting when too few are, their flows starting when placed; the bytes a run sends
over the ATSW layer and each job's wait, as `analyze` and a sweep's table give them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from aifabric.cli import main
from aifabric.fabric.errors import SpecError
from aifabric.traffic.generate import generate_scheduled
from aifabric.traffic.scheduler import schedule
from aifabric.traffic.spec import workload_from_dict
from tests.conftest import fabric as preset
from tests.conftest import run_scenario

ZONES = preset("lab-zones")  # 3 AI Zones x 2 racks x 16 GPUs, joined by ATSWs


def zones_of(nics) -> set[int]:
    return set(ZONES.node_zone[nics].tolist())


def racks_of(nics) -> set[tuple[int, int]]:
    return set(zip(ZONES.node_zone[nics].tolist(), ZONES.node_rack[nics].tolist(), strict=True))


def placed(policy, sizes, arrivals, holds):
    out = schedule(ZONES, sizes, arrivals, policy, lambda j, nics: holds[j])
    return {p.job: p for p in out}


# A (16 GPUs) ends first; B (32) and C (16) still run when D (32) arrives.
SIZES, ARRIVALS, HOLDS = [16, 32, 16, 32], [0, 0, 0, 50], [40, 1000, 1000, 100]


def test_the_scheduler_cannot_be_a_name_it_does_not_know():
    with pytest.raises(SpecError, match="scheduler 'best' is not one of first-fit, topology-aware"):
        schedule(ZONES, [8], [0], "best", lambda j, nics: 1)


def test_first_fit_fragments_once_jobs_have_come_and_gone():
    p = placed("first-fit", SIZES, ARRIVALS, HOLDS)
    # in topology order: A on zone 0's first rack, B over zone 0's second and zone 1's first
    assert zones_of(p[0].nics) == {0} and zones_of(p[1].nics) == {0, 1}
    # D takes the first free GPUs: the rack A left in zone 0 and the first of zone 2
    assert p[3].start_ns == 50 and zones_of(p[3].nics) == {0, 2}
    assert set(p[3].nics) & set(p[0].nics) == set(p[0].nics)


def test_topology_aware_keeps_a_job_in_one_zone_when_one_has_room():
    p = placed("topology-aware", SIZES, ARRIVALS, HOLDS)
    for j in range(4):
        assert len(zones_of(p[j].nics)) == 1, j
    # each job on whole racks: 16 GPUs on one rack, 32 on the two racks of one zone
    assert [len(racks_of(p[j].nics)) for j in range(4)] == [1, 2, 1, 2]
    # D, arriving after A ended, goes to the zone with room for all of it, not to A's rack
    assert not set(p[3].nics) & set(p[0].nics)


def test_topology_aware_spans_the_fewest_zones_when_none_has_room():
    p = placed("topology-aware", [8, 56], [0, 0], [100, 100])
    assert len(zones_of(p[1].nics)) == 2  # 56 GPUs need two zones of 32; three would do too
    assert len(p[1].nics) == 56 and not set(p[1].nics) & set(p[0].nics)


@pytest.mark.parametrize("policy", ["first-fit", "topology-aware"])
def test_a_job_that_does_not_fit_now_waits_and_those_behind_it_wait_too(policy):
    # B wants every GPU: it waits for A to end; C, small, arrives after B and waits behind it
    p = placed(policy, [40, 96, 8], [0, 10, 20], [500, 300, 100])
    assert (p[1].start_ns, p[1].wait_ns) == (500, 490)
    assert (p[2].start_ns, p[2].wait_ns) == (800, 780)
    assert p[0].wait_ns == 0 and p[1].end_ns == 800


def test_a_job_larger_than_the_fabric_is_one_sentence_naming_it():
    with pytest.raises(SpecError) as e:
        schedule(ZONES, [8, 97], [0, 0], "first-fit", lambda j, nics: 1, ["small", "huge"])
    assert str(e.value) == (
        "the scheduler cannot place huge: it needs 97 GPUs and fabric lab-zones has 96"
    )


jobs = st.lists(
    st.tuples(st.integers(1, 96), st.integers(0, 500), st.integers(1, 400)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(jobs, st.sampled_from(["first-fit", "topology-aware"]))
def test_no_gpu_is_given_to_two_running_jobs_and_each_job_gets_its_size(jobs, policy):
    sizes, arrivals, holds = (list(x) for x in zip(*jobs, strict=True))
    out = schedule(ZONES, sizes, arrivals, policy, lambda j, nics: holds[j])
    assert sorted(p.job for p in out) == list(range(len(jobs)))
    for p in out:
        assert len(p.nics) == sizes[p.job] == len(set(p.nics.tolist()))
        assert set(p.nics.tolist()) <= set(ZONES.nic_ids.tolist())
        assert p.start_ns >= p.arrival_ns and p.end_ns == p.start_ns + holds[p.job]
    for a in out:
        for b in out:
            if a.job < b.job and a.start_ns < b.end_ns and b.start_ns < a.end_ns:
                assert not set(a.nics.tolist()) & set(b.nics.tolist())
    # first come, first served: jobs start in order of arrival (ties by their order)
    by_arrival = sorted(out, key=lambda p: (p.arrival_ns, p.job))
    starts = [p.start_ns for p in by_arrival]
    assert starts == sorted(starts)


def workload(policy="first-fit", **extra):
    return {
        "scheduler": policy,
        "jobs": [
            {"name": "a", "collective": "allreduce", "size": "1MiB", "gpus": 16},
            {"name": "b", "collective": "allreduce", "size": "1MiB", "gpus": 32},
            {"name": "c", "collective": "allreduce", "size": "1MiB", "gpus": 64, **extra},
        ],
    }


def test_a_job_s_flows_start_when_it_is_placed_and_wait_at_a_reused_gpu_for_its_holder():
    flows, out = generate_scheduled(ZONES, workload_from_dict(workload(), "w"), 1)
    p = {x.job: x for x in out}
    assert p[2].wait_ns > 0 and p[2].start_ns == min(p[0].end_ns, p[1].end_ns)
    for j in range(3):
        assert flows.start_ns[flows.job == j].min() == p[j].start_ns
    # c's first flows at each GPU a or b held wait for that job's flows there
    held = {int(n): j for j in (0, 1) for n in p[j].nics if n in set(p[2].nics.tolist())}
    assert held
    for f in np.flatnonzero(flows.job == 2):
        for d in flows.deps_of(f):
            assert flows.job[d] in (0, 2)
    waits = {int(flows.job[d]) for f in np.flatnonzero(flows.job == 2) for d in flows.deps_of(f)}
    assert set(held.values()) <= waits


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"scheduler": "random"}, "scheduler = 'random' is not one of first-fit, topology-aware"),
        ({"interarrival": "10us", "scheduler": None}, "beside a scheduler (the mean gap"),
        ({"interarrival": "0us"}, "must be a positive time, at most 10^6 s, beside"),
        ({"interarrival": "2000000s"}, "must be a positive time, at most 10^6 s, beside"),
        ({"jobs.0.placement": "packed"}, "jobs[0].placement = 'packed' does not apply under"),
        ({"jobs.0.start": "1us"}, "jobs[0].start = '1us' does not apply under scheduler"),
        ({"jobs.0.arrival": "1us", "interarrival": "5us"}, "interarrival draws it"),
        ({"jobs.0.duration": "1us", "scheduler": None}, "jobs[0].duration applies to a job of"),
    ],
)
def test_keys_that_do_not_go_with_the_scheduler_are_one_sentence(change, words):
    table = workload()
    for key, value in change.items():
        if key.startswith("jobs."):
            _, i, k = key.split(".")
            table["jobs"][int(i)][k] = value
        elif value is None:
            del table[key]
        else:
            table[key] = value
    with pytest.raises(SpecError, match="^workload w: ") as e:
        workload_from_dict(table, "w")
    assert words in str(e.value)


def test_a_scheduler_beside_a_lone_job_or_a_job_with_no_time_is_one_sentence():
    with pytest.raises(SpecError) as e:
        workload_from_dict({"collective": "allreduce", "scheduler": "first-fit"}, "w")
    assert str(e.value) == (
        "workload w: scheduler = 'first-fit' places the jobs of [[jobs]]; write the job as a "
        "[[jobs]] table"
    )
    jobs = [{"pattern": "permutation", "gpus": 16}, {"collective": "allreduce", "gpus": 8}]
    table = {"scheduler": "first-fit", "jobs": jobs}
    with pytest.raises(SpecError) as e:
        generate_scheduled(ZONES, workload_from_dict(table, "w"), 1)
    assert str(e.value) == (
        "workload w: permutation has no NCCL cost-model time; give it duration, how long it "
        "holds its GPUs"
    )
    jobs[0]["duration"] = "50us"
    flows, out = generate_scheduled(ZONES, workload_from_dict(table, "w"), 1)
    assert [p.end_ns - p.start_ns for p in out][0] == 50_000


def test_poisson_arrivals_follow_the_seed():
    table = {**workload(), "interarrival": "20us"}
    arrivals = [
        [p.arrival_ns for p in generate_scheduled(ZONES, workload_from_dict(table, "w"), s)[1]]
        for s in (1, 1, 2)
    ]
    assert arrivals[0] == arrivals[1] != arrivals[2]
    assert all(a > 0 for a in arrivals[0])


SCENARIO = """[scenario]
topology = "lab-zones"
sample_interval = "10us"
[workload]
scheduler = "first-fit"
jobs = [
    { name = "a", collective = "allreduce", size = "1MiB", gpus = 16 },
    { name = "b", collective = "allreduce", size = "1MiB", gpus = 32 },
    { name = "c", collective = "allreduce", size = "1MiB", gpus = 64 },
]
"""


@pytest.fixture(scope="module")
def scheduled_run(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("scheduled"), SCENARIO)


def test_atsw_bytes_are_the_bytes_of_flows_between_zones(scheduled_run):
    from aifabric.fabric.rundir import Run

    r = CliRunner().invoke(main, ["analyze", str(scheduled_run), "--json"])
    assert r.exit_code == 0, r.output
    sched = json.loads(r.output)["schedule"]
    flows = Run(scheduled_run).flows()
    zone = ZONES.node_zone
    # three tiers, shortest paths: a flow between two zones passes exactly one ATSW, a flow
    # inside a zone none, so the ATSW bytes are those of the flows between zones
    across = zone[flows["src"]] != zone[flows["dst"]]
    assert sched["atsw_bytes"] == int(flows["bytes"][across].sum()) > 0
    assert sched["bytes"] == int(flows["bytes"].sum())
    for job in sched["jobs"]:
        mine = across & (flows["job"] == job["job"])
        assert job["atsw_bytes"] == int(flows["bytes"][mine].sum())
    c = next(j for j in sched["jobs"] if j["name"] == "c")
    assert c["zones"] == 3 and c["atsw_bytes"] > 0
    r = CliRunner().invoke(main, ["analyze", str(scheduled_run)])
    assert r.exit_code == 0, r.output
    text = r.output[r.output.index("schedule (first-fit): ") :]
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:6]}
    assert rows["c"][1:4] == ["64", "3", str(c["racks"])] and rows["a"][-1] == "0B"


def test_a_job_s_wait_runs_from_its_arrival_to_when_the_last_of_its_gpus_began(scheduled_run):
    from aifabric.fabric.rundir import Run

    r = CliRunner().invoke(main, ["analyze", str(scheduled_run), "--json"])
    jobs = {j["name"]: j for j in json.loads(r.output)["schedule"]["jobs"]}
    flows = Run(scheduled_run).flows()
    c = flows["job"] == 2
    nics = np.unique(np.concatenate([flows["src"][c], flows["dst"][c]]))
    first = [flows["start_ns"][c & ((flows["src"] == n) | (flows["dst"] == n))].min() for n in nics]
    assert jobs["c"]["start_ns"] == max(first)
    assert jobs["c"]["wait_ns"] == max(first) - jobs["c"]["arrival_ns"] > 0
    assert jobs["c"]["start_ns"] >= jobs["c"]["planned_start_ns"]
    # no GPU carried two jobs' flows at once: c's flows at a GPU begin after a's and b's end
    for n in nics:
        at = (flows["src"] == n) | (flows["dst"] == n)
        before = at & (flows["job"] != 2)
        if before.any():
            assert flows["start_ns"][at & c].min() >= flows["end_ns"][before].max()
    assert jobs["a"]["wait_ns"] == jobs["b"]["wait_ns"] == 0


def test_a_job_larger_than_the_fabric_stops_the_run_in_one_sentence(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO.replace("gpus = 64", "gpus = 200"))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "s.toml"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    assert "the scheduler cannot place c: it needs 200 GPUs and fabric lab-zones has 96" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_a_sweep_point_with_a_job_too_large_fails_alone(tmp_path):
    import pandas as pd

    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "sweep"
    args = ["sweep", tmp_path / "s.toml", "--vary", "workload.jobs.c.gpus=64,200"]
    args += ["--workers", 1]
    r = CliRunner().invoke(main, [str(a) for a in [*args, "-o", out]])
    assert r.exit_code == 1 and "1 of 2 points failed" in r.output, r.output
    table = pd.read_csv(out / "results.csv")
    ok, failed = table.iloc[0], table.iloc[1]
    assert ok["status"] == "complete", ok["error"]
    assert ok["atsw_bytes"] > 0 and ok["wait_ns@c"] > 0 and ok["zones@c"] == 3
    assert failed["status"] == "failed"
    assert "the scheduler cannot place c: it needs 200 GPUs" in failed["error"]
