"""The engine contract: a third engine is one module; refusals, failures and statuses are the
runner's, the same for every engine."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric import engines
from aifabric.cli import main
from aifabric.engines import Support, check_features, implemented, refused, scenario_features
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.rundir import Run
from aifabric.scenarios import load_scenario

SMALL = """
[scenario]
topology = "lab-small"
seed = 2

[workload]
collective = "allreduce"
algorithm = "ring"
size = "1MiB"

[congestion_control]
kind = "cts"

[[faults]]
link = "z0-r0-rtsw--z0-ctsw0"
at = "30us"
"""


class LineRate:
    """An engine in a dozen lines: every flow at its NIC's line rate, one after another."""

    name = "line-rate"
    options = {
        "unfinished": "flows left unfinished",
        "fail": "raise in run",
        "omit": "a feature not answered",
        "refuse": "a feature refused",
    }

    def unavailable(self, **options):
        return None

    def session(self, scenario, **options):
        return LineRateSession(scenario, **options)


class LineRateSession:
    build_abortable = False
    closed = 0

    def __init__(self, scenario, unfinished=0, fail=False, omit=None, refuse=None):
        self.sc, self.unfinished, self.fail = scenario, unfinished, fail
        self.features = {k: implemented() for k in scenario_features(scenario)}
        self.features.pop(omit, None)
        if refuse:
            self.features[refuse] = refused("this engine has no such thing")

    def build(self, writer, stop):
        writer.note(built=True)

    def run(self, stop, progress):
        if self.fail:
            raise RuntimeError("the line-rate engine broke")
        ft, f = self.sc.flows, self.sc.fabric
        rate = f.port_rate_bps[f.nic_port[ft.src]]
        self.end = ft.start_ns + np.cumsum(ft.bytes * 8 * 10**9 // rate)
        self.end[len(ft) - self.unfinished :] = -1
        return self.unfinished == 0

    def write(self, writer):
        ft = self.sc.flows
        done = int((self.end >= 0).sum())
        return {"flows": len(ft), "flows_done": done, "completion_ns": int(self.end.max())}

    def close(self):
        LineRateSession.closed += 1


ENGINE = LineRate()


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "line-rate", __name__)
    LineRateSession.closed = 0


@pytest.fixture
def sc(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return load_scenario(path)


def test_a_new_engine_is_one_module(registered, sc, tmp_path):
    summary = engines.run_scenario("line-rate", sc, tmp_path / "r")
    run = Run(tmp_path / "r")
    assert summary["status"] == run.status == "complete"
    assert run.engine == "line-rate" and run.meta["results"]["built"] is True
    assert set(run.meta["features"]) == set(scenario_features(sc))
    assert run.meta["features"]["congestion_control.kind"] == {"support": "implemented"}
    assert json.loads((tmp_path / "r" / "topology.json").read_text())["nodes"]
    assert LineRateSession.closed == 1


def test_aifabric_run_runs_a_new_engine_by_its_name_alone(monkeypatch, tmp_path):
    """The command knows no engine: registering one makes `--engine` take it (also after
    the command line has read its choices once), and the run, its status and its summary
    go through the same code as the simulator's."""
    spec = tmp_path / "small.toml"
    spec.write_text(SMALL)
    out = tmp_path / "r"
    args = ["run", str(spec), "--engine", "line-rate", "-o", str(out)]
    before = CliRunner().invoke(main, args)
    assert before.exit_code == 2 and "'line-rate' is not one of 'sim', 'mininet'" in before.output
    monkeypatch.setitem(engines.ENGINES, "line-rate", __name__)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    run = Run(out)
    assert run.engine == "line-rate" and run.status == "complete"
    n = len(load_scenario(spec).flows)
    assert f"flows done        {n:,} of {n:,}" in result.stdout
    assert f"run directory     {out}" in result.stdout
    other = CliRunner().invoke(main, [*args[:-1], str(tmp_path / "p"), "--max-wall", "5"])
    assert other.exit_code == 2
    assert "--max-wall applies to --engine mininet only" in other.output


def test_a_refused_feature_stops_the_run_before_anything_is_written(registered, sc, tmp_path):
    with pytest.raises(AifabricError) as e:
        engines.run_scenario("line-rate", sc, tmp_path / "r", options={"refuse": "faults.mid_run"})
    assert str(e.value) == (
        "the line-rate engine cannot run scenario small: faults.mid_run = links or switches "
        "going down during the run: this engine has no such thing"
    )
    assert not (tmp_path / "r").exists()


def test_a_feature_an_engine_does_not_answer_is_refused(registered, sc, tmp_path):
    with pytest.raises(AifabricError, match="queues.ecn .the engine does not say"):
        engines.run_scenario("line-rate", sc, tmp_path / "r", options={"omit": "queues.ecn"})


def test_an_engine_error_is_recorded_as_failed_and_torn_down(registered, sc, tmp_path):
    with pytest.raises(RuntimeError, match="broke"):
        engines.run_scenario("line-rate", sc, tmp_path / "r", options={"fail": True})
    run = Run(tmp_path / "r")
    assert run.status == "failed"
    assert run.meta["message"] == "RuntimeError: the line-rate engine broke"
    assert LineRateSession.closed == 1


def test_flows_left_unfinished_make_a_partial_run(registered, sc, tmp_path):
    summary = engines.run_scenario("line-rate", sc, tmp_path / "r", options={"unfinished": 3})
    assert summary["status"] == Run(tmp_path / "r").status == "partial"
    assert "3 flows did not complete" in summary["message"]


def test_options_an_engine_does_not_take_are_one_sentence(registered, sc, tmp_path):
    with pytest.raises(AifabricError, match="option switch applies to the mininet engine"):
        engines.run_scenario("sim", sc, tmp_path / "r", options={"switch": "ovs"})
    with pytest.raises(AifabricError, match="no engine takes option speed"):
        engines.run_scenario("sim", sc, tmp_path / "r", options={"speed": 2})
    with pytest.raises(AifabricError, match="unknown engine 'gpu'; the engines are sim"):
        engines.engine("gpu")


def test_the_emulator_refuses_cts_in_one_sentence(sc):
    from aifabric.emu.engine import features

    answer = features(sc, switch="router", ecn="red", delay="netem", pfc=True)
    assert answer["congestion_control.kind"].state == "refused"
    assert answer["faults.mid_run"].state == "implemented"
    with pytest.raises(AifabricError) as e:
        check_features("mininet", sc, answer)
    assert "congestion_control.kind = cts: the emulator's replay has no cts" in str(e.value)
    assert str(e.value).count(". ") == 0


def test_the_emulator_says_what_it_approximates():
    from aifabric.emu.engine import features

    demo = load_scenario("demo")
    answer = features(demo, switch="ovs", ecn="ebpf", delay="none", pfc=True)
    assert set(answer) == set(scenario_features(demo))
    assert answer["links.delay"].state == "approximated" and "netem" in answer["links.delay"].how
    assert answer["queues.ecn"].state == "approximated"
    # one byte-limited queue per egress: the static model, not the default shared pool
    assert answer["queues.buffer"].state == "approximated"
    assert "not one pool per switch shared by its ports (rtsw, ctsw)" in answer["queues.buffer"].how
    queues = {r: replace(q, model="static") for r, q in demo.fabric.queues.items()}
    static = replace(demo, fabric=replace(demo.fabric, queues=queues))
    answer = features(static, switch="ovs", ecn="ebpf", delay="none", pfc=True)
    assert answer["queues.buffer"].state == "implemented"
    answer = features(demo, switch="ovs", ecn="ebpf", delay="none", pfc=True)
    assert answer["ecmp.policy"] == Support(
        "implemented", "Open vSwitch select groups hash the 5-tuple with each switch's seed"
    )
    assert features(demo, switch="router", ecn="none", delay="netem", pfc=True)[
        "queues.ecn"
    ].state == ("refused")


def test_the_simulator_implements_every_feature_of_every_preset():
    from aifabric.scenarios import scenario_presets
    from aifabric.sim.engine import features

    for name in scenario_presets():
        s = load_scenario(name)
        answer = features(s)
        check_features("sim", s, answer)
        assert set(answer) == set(scenario_features(s))


def test_capture_takes_several_ports_in_one_option_and_the_last_progress_line_is_final(tmp_path):
    out = tmp_path / "r"
    result = CliRunner().invoke(
        main,
        ["run", "incast-pfc", "-o", str(out), "--capture", "z0-r0-h0-nic0",
         "z0-r0-rtsw--z0-ctsw0", "--seed", "3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in Run(out).captures())
    assert names == ["z0-r0-h0-nic0--z0-r0-rtsw.pcap", "z0-r0-rtsw--z0-ctsw0.pcap"]
    from aifabric.analysis.capture import read_capture

    captured = Run(out).meta["results"]["summary"]["captures"]
    for path in Run(out).captures():
        assert captured[path.stem] == len(read_capture(path).time_ns)
    # incast-pfc stays in one rack: its uplink is idle, and the run says so
    assert captured["z0-r0-rtsw--z0-ctsw0"] == 0 and captured["z0-r0-h0-nic0--z0-r0-rtsw"] > 0
    assert "z0-r0-rtsw--z0-ctsw0: 0 frames  (the port sent nothing" in result.stdout
    last = result.stderr.strip().split("\r")[-1]
    n = Run(out).meta["results"]["summary"]["flows"]
    assert f"flows {n:,}/{n:,}" in last, last
    done_ns = Run(out).meta["results"]["summary"]["simulated_ns"]
    from aifabric.fabric.units import format_time

    assert format_time(done_ns) in last


def test_the_emulator_counts_what_a_capture_holds(tmp_path):
    from aifabric.emu.engine import pcap_packets
    from aifabric.sim.pcap import write_pcap

    path = tmp_path / "x.pcap"
    write_pcap(path, [(1, b"a" * 60), (2, b"b" * 70), (3, b"c" * 80)])
    assert pcap_packets(path) == 3
    path.write_bytes(path.read_bytes()[:-10])  # the last record cut short: not a packet
    assert pcap_packets(path) == 2
    write_pcap(path, [])
    assert pcap_packets(path) == 0
    assert pcap_packets(tmp_path / "missing.pcap") == 0


def test_collectives_and_completion_are_computed_once_from_flow_times():
    from aifabric.fabric.completion import collective_records, collective_rows, completion_ns
    from tests.conftest import fabric as preset
    from tests.simhelp import flows

    nics = preset("lab-small").nic_ids
    ops = {"op_id": [0, 1], "op_job": [0, 1], "op_kind": ["allreduce", "sendrecv"],
           "op_algorithm": ["ring", "p2p"], "op_bytes": [4_000, 1_000], "op_ranks": [4, 2],
           "op_busbw_factor": [1.5, 1.0]}  # fmt: skip
    table = flows(nics[0:3], nics[3:6], 1_000, ops=ops, op=[0, 0, 1])
    start, end = np.array([100, 150, 200]), np.array([600, 1_100, -1])
    coll = collective_records(table, start, end)
    assert coll["start_ns"].tolist() == [100, 200] and coll["end_ns"].tolist() == [1_100, -1]
    assert coll["algbw_bps"][0] == 4_000 * 8e9 / 1_000 and coll["algbw_bps"][1] == 0.0
    assert coll["busbw_bps"][0] == 1.5 * coll["algbw_bps"][0]
    rows = collective_rows(coll)
    assert [r["time_ns"] for r in rows] == [1_000, None]
    # a partial run's completion: the span of what finished
    assert completion_ns(start, end) == 1_000
    assert completion_ns(np.array([-1, 5]), np.array([-1, -1])) is None


def test_the_analyzer_and_the_engine_give_one_algbw_and_busbw(tmp_path):
    """The analyzer recomputes each op's figures from its start and end in the run
    directory: algbw and busbw equal, to the bit, what the engine recorded (one formula,
    the factor the run recorded)."""
    from aifabric.analysis.metrics import run_metrics

    sc = load_scenario("demo")
    engines.run_scenario("sim", sc, tmp_path / "r")
    run = Run(tmp_path / "r")
    coll = run.collectives()
    ops = run_metrics(run).to_dict()["collectives"]["ops"]
    assert len(ops) == len(coll["op"]) > 1
    for i, o in enumerate(ops):
        assert o["algbw_bps"] == coll["algbw_bps"][i] > 0
        assert o["busbw_bps"] == coll["busbw_bps"][i]
        assert o["busbw_factor"] == coll["busbw_factor"][i] == sc.flows.op_busbw_factor[i]


def test_every_registered_engine_module_imports():
    """A broken import inside an engine is a bug, not "engine not available"."""
    import importlib

    for name, module in engines.ENGINES.items():
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            assert e.name.partition(".")[0] != "aifabric", (name, e)
            pytest.skip(f"engine {name} needs {e.name}, which is not installed here")


def test_after_a_stop_what_finalizers_cannot_raise_is_not_printed(monkeypatch):
    """An Interrupted raised in numba's or LLVM's middle leaves objects whose __del__ then
    fails; once a stop was asked for, those are not printed as tracebacks. Before, they are."""
    import gc
    import sys

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(info.exc_type))

    class Broken:
        def __del__(self):
            raise AttributeError("half made")

    stop = engines.Stop()
    with stop.handling():
        Broken()
        gc.collect()
        assert seen == [AttributeError]  # not stopped: reported as usual
        stop.set()
        Broken()
        gc.collect()
    Broken()
    gc.collect()
    assert seen == [AttributeError]  # stopped: dropped, inside and after the context
