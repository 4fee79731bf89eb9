"""Training iterations with compute (issue 28, item 6): each op waits for the compute it
needs (`aifabric.traffic.training`), the engines start it at the later of that and the op
before it on the NIC, and a job's iteration time is its compute plus the communication the
compute did not hide (`aifabric.fabric.completion.iterations`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from aifabric import topologies, traffic
from aifabric.cli import main
from aifabric.experiments.columns import point_metrics
from aifabric.fabric.completion import collective_records, iterations
from aifabric.fabric.units import format_time
from aifabric.scenarios import load_scenario
from aifabric.sim import Simulation
from aifabric.traffic.steps import expand_steps_with_origin

US = 1000
MiB = 2**20


@pytest.fixture(scope="module")
def small():
    return topologies.load_fabric("lab-small")


def table(fabric, **spec):
    return traffic.generate(fabric, traffic.workload_from_dict(spec, "t"), seed=1)


def simulate(fabric, **spec):
    """The flow table, collectives.npz's records and the jobs' iterations of one run."""
    t = table(fabric, **spec)
    sim = Simulation(fabric, t, cc="none")
    assert sim.run()
    sim.close()
    r = sim.flow_records()
    coll = collective_records(t, r["start_ns"], r["end_ns"])
    return t, coll, iterations(coll)


# one data-parallel bucket: the last layer's gradients (the first layer has no parameters,
# so the bucket is ready when the last layer's backward is done and one layer's backward
# is left to hide it)
ONE_BUCKET = dict(
    model="m", tp=1, gpus=4, layer_sizes=[0, "8MiB"], bucket="8MiB", micro_batches=1,
    protocol="simple", channels=1, forward="10us",
)  # fmt: skip


# the compute schedule ---------------------------------------------------------------------


def test_compute_without_pipeline_is_the_sum_of_the_layers(small):
    t = table(small, model="m", tp=1, gpus=4, params=1e6, layers=4, micro_batches=3,
              forward="100us", backward="250us")  # fmt: skip
    assert set(t.op_compute_ns) == {3 * 4 * (100 + 250) * US}


def test_pipeline_compute_is_gpipes_closed_form(small):
    # p stages of equal layers, m micro-batches: (m + p - 1) x (F + B)
    p, m, f = 2, 3, 40 * US
    t = table(small, model="m", tp=1, pp=p, gpus=4, params=1e6, layers=4, micro_batches=m,
              forward=f"{f}ns", activation="64KiB")  # fmt: skip
    stage_f, stage_b = 2 * f, 4 * f
    assert set(t.op_compute_ns) == {(m + p - 1) * (stage_f + stage_b)}
    # the forward sends leave when their micro-batch's forward of stage 0 is done
    sends = np.flatnonzero(t.op_kind == "sendrecv")
    assert sorted(t.op_ready_ns[sends])[:m] == [(k + 1) * stage_f for k in range(m)]


def test_compute_from_the_gpu_throughput_is_six_params_tokens(small):
    params, tokens, tflops, eff = 1e9, 1e6, 1000.0, 0.5
    t = table(small, model="m", tp=1, gpus=4, params=params, layers=4, gpu_tflops=tflops,
              efficiency=eff, tokens=tokens)  # fmt: skip
    per_gpu_s = 6 * params * tokens / 4 / (tflops * 1e12 * eff)
    assert set(t.op_compute_ns) == {round(per_gpu_s * 1e9)}


def test_buckets_are_ready_as_the_backward_passes_their_layers(small):
    # 4 layers of 500,000 bytes, buckets of 1 MiB from the last layer: the first bucket
    # holds layers 1-3, ready after the last micro-batch's backward of layers 3..1
    t = table(small, model="m", tp=1, gpus=4, params=1e6, layers=4, bucket="1MiB",
              micro_batches=2, forward="100us")  # fmt: skip
    backward_start = 2 * 4 * 100 * US + 4 * 200 * US
    assert list(t.op_ready_ns) == [backward_start + 3 * 200 * US, backward_start + 4 * 200 * US]
    assert set(t.start_ns[t.op == 0]) == {backward_start + 3 * 200 * US}


def test_without_compute_nothing_waits(small):
    t = table(small, model="m", tp=1, gpus=4, params=1e6, layers=4, bucket="1MiB")
    assert not t.op_ready_ns.any() and not t.op_compute_ns.any() and not t.start_ns.any()


def test_the_emulators_steps_keep_the_ready_times(small):
    # the emulator replays every stream step as a flow, each starting no earlier than its
    # start_ns (its op's base latency after the later of that and the op before)
    t = table(small, **ONE_BUCKET, backward="1ms")
    steps, origin = expand_steps_with_origin(t)
    assert (steps.start_ns == t.start_ns[origin]).all()
    assert set(steps.start_ns) == {20 * US + 1000 * US}
    assert list(steps.op_ready_ns) == list(t.op_ready_ns)


# in the simulator ---------------------------------------------------------------------------


def test_a_bucket_hidden_by_a_long_backward_exposes_nothing(small):
    t, coll, its = simulate(small, **ONE_BUCKET, backward="2ms")
    (it,) = its
    compute = 2 * 10 * US + 2 * 2000 * US
    assert it["compute_ns"] == compute
    assert coll["ready_ns"][0] == 20 * US + 2000 * US  # after the last layer's backward
    assert coll["start_ns"][0] >= coll["ready_ns"][0]
    assert coll["end_ns"][0] < compute  # the AllReduce ran inside the backward pass
    assert it["iteration_ns"] == compute and it["exposed_ns"] == 0


def test_a_bucket_longer_than_the_backward_left_exposes_the_rest(small):
    _, alone, _ = simulate(small, collective="allreduce", algorithm="ring", protocol="simple",
                           size="8MiB", gpus=4, channels=1)  # fmt: skip
    took = int(alone["end_ns"][0])  # the same AllReduce on an idle fabric, from 0
    left = took // 4  # the backward left once the bucket is ready
    t, coll, its = simulate(small, **ONE_BUCKET, backward=f"{left}ns")
    (it,) = its
    ready = 20 * US + left
    assert coll["ready_ns"][0] == ready
    assert coll["end_ns"][0] == ready + took  # the fabric is idle: it takes what it took
    assert it["exposed_ns"] == took - left
    assert it["iteration_ns"] == it["compute_ns"] + took - left


def test_a_transfer_takes_its_base_latency_after_its_compute(small):
    # an MoE AllToAll (pairwise transfers) whose compute ends after the op before it
    # starts NCCL's base latency after that compute, not after the op before
    t, coll, _ = simulate(small, model="m", tp=1, gpus=4, ep=4, moe_layers=1, params=1e6,
                          layers=2, micro_batches=1, forward="500us", moe_alltoall="64KiB",
                          protocol="simple", dp=4)  # fmt: skip
    a2a = np.flatnonzero(coll["kind"] == "alltoall")
    second = a2a[2]  # the backward dispatch: ready long after the forward's AllToAlls end
    assert coll["end_ns"][a2a[1]] < coll["ready_ns"][second]
    assert coll["start_ns"][second] == coll["ready_ns"][second] + t.op_base_latency_ns[second]


@given(
    st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**9)), min_size=1, max_size=6),
    st.integers(1, 10**9),
    st.integers(0, 10**6),
)
def test_exposed_communication_is_never_negative(ops, compute, start):
    coll = {
        "job": np.zeros(len(ops), np.int32),
        "end_ns": np.array([start + a + b for a, b in ops], np.int64),
        "iteration_start_ns": np.full(len(ops), start, np.int64),
        "compute_ns": np.full(len(ops), compute, np.int64),
    }
    (it,) = iterations(coll)
    assert it["exposed_ns"] >= 0
    assert it["iteration_ns"] == max(compute, int(coll["end_ns"].max()) - start)
    assert it["iteration_ns"] - it["exposed_ns"] == compute


def test_traffic_show_says_the_compute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.toml").write_text('model = "m"\ntp = 1\nparams = 1e6\nforward = "1ms"\n')
    args = ["traffic", "show", "w.toml", "--fabric", "lab-small"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    # 32 layers, 2 micro-batches: 2 x 32 x (1 + 2) ms
    assert "job 0: compute 192ms per iteration" in r.output, r.output
    r = CliRunner().invoke(main, [*args, "--json"])
    ops = json.loads(r.output)["ops"]
    assert {op["compute_ns"] for op in ops} == {192 * 10**6}
    assert max(op["ready_ns"] for op in ops) == 192 * 10**6  # the last bucket: at the end


# bad keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, words",
    [
        ('forward = "1ms"\ngpu_tflops = 989\ntokens = 1e6\n', ["not both"]),
        ('backward = "1ms"\n', ["backward needs forward"]),
        ("gpu_tflops = 989\n", ["gpu_tflops and tokens go together"]),
        ("tokens = 1e6\n", ["gpu_tflops and tokens go together"]),
        ('forward = "-1ms"\n', ["forward"]),
        ("gpu_tflops = 989\ntokens = 1e6\nefficiency = 1.5\n", ["efficiency = 1.5", "at most 1"]),
        ('forward = "1h"\n', ["forward"]),
        ('forward = "900s"\nlayers = 10000\n', ["compute comes to up to", "give less compute"]),
        ("gpu_tflops = 1e-9\ntokens = 1e15\n", ["compute comes to up to"]),
    ],
)
def test_bad_compute_keys_are_one_sentence(body, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.toml").write_text('model = "m"\ntp = 1\nparams = 1e6\n' + body)
    r = CliRunner().invoke(main, ["traffic", "show", "w.toml", "--fabric", "lab-small"])
    message = r.output.strip()
    assert r.exit_code == 1, message
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    for word in words:
        assert word in message, message


# the run directory and analyze ----------------------------------------------------------------

SCENARIO = """
[scenario]
topology = "lab-small"
seed = 1

[workload]
model = "m"
tp = 1
gpus = 4
layer_sizes = [0, "8MiB"]
bucket = "8MiB"
micro_batches = 1
protocol = "simple"
forward = "10us"
backward = "100us"
"""


def test_analyze_shows_iteration_compute_and_exposed_per_job(tmp_path):
    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["run", str(tmp_path / "s.toml"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    coll = np.load(out / "collectives.npz")
    compute = 2 * 10 * US + 2 * 100 * US
    said = f"iteration         m: {format_time(int(coll['end_ns'][0]))} = 220us compute + "
    assert said in r.output, r.output
    assert list(coll["compute_ns"]) == [compute]
    iteration = int(coll["end_ns"][0])  # the bucket ends after the backward: exposed
    assert iteration > compute
    meta = json.loads((out / "run.json").read_text())
    assert meta["results"]["summary"]["iterations"] == [
        {"job": 0, "start_ns": 0, "compute_ns": compute, "iteration_ns": iteration,
         "exposed_ns": iteration - compute}
    ]  # fmt: skip
    r = CliRunner().invoke(main, ["analyze", str(out), "--json"])
    assert r.exit_code == 0, r.output
    (job,) = json.loads(r.output)["jobs"]
    assert (job["compute_ns"], job["iteration_ns"], job["exposed_ns"]) == (
        compute, iteration, iteration - compute,
    )  # fmt: skip
    r = CliRunner().invoke(main, ["analyze", str(out)])
    assert r.exit_code == 0, r.output
    text = r.output[r.output.index("training iterations") :]
    row = next(line for line in text.splitlines() if line.startswith("job 0 "))
    assert format_time(iteration) in row and format_time(compute) in row, row
    assert format_time(iteration - compute) in row, row
    # a sweep's results table: per job, as its METRIC@JOB columns
    row = point_metrics(out, load_scenario(str(tmp_path / "s.toml")), {"completion"})
    assert (row["iteration_ns@m"], row["compute_ns@m"], row["exposed_ns@m"]) == (
        iteration, compute, iteration - compute,
    )  # fmt: skip
