"""`aifabric crosscheck`: the comparison of two run directories, and (root) a scenario with PFC
and ECN at work run in both engines, which must agree path for path and within 15%."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from aifabric.analysis.render import crosscheck_text
from aifabric.cli import main
from aifabric.engines import run_scenario
from aifabric.experiments.crosscheck import clear_output, compare, with_policy
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.rundir import Run
from aifabric.scenarios import scenario_from_dict

# a ring AllReduce on racks 0 and 1 beside a 7-to-1 incast on racks 2 and 3: the incast fills
# its receiver's leaf port, which marks ECN and pauses the uplinks and NICs that feed it.
# One channel: with two, each NIC carries two streams of the ring, and in the emulator they
# drift out of phase (its host queue is a FIFO), so one channel's step latency hides behind
# the other's transfer: 2 MiB took 0.74x the simulator's time, whose channels share the NIC
# fairly and stay in step, as NCCL's cost model assumes (alone, one channel: 0.96x).
SCENARIO = """\
[scenario]
description = "ring AllReduce beside a 7-to-1 incast on lab-small, PFC and ECN at work"
topology = "lab-small"
seed = 5

[[workload.jobs]]
name = "ring"
collective = "allreduce"
algorithm = "ring"
size = "2MiB"
gpus = 8
channels = 1

[[workload.jobs]]
name = "incast"
pattern = "incast"
senders = 7
size = "1MiB"

[congestion_control]
kind = "none"
"""


def _scenario():
    import tomllib

    return scenario_from_dict(tomllib.loads(SCENARIO), "crosscheck")


def test_compare_finds_every_flow_whose_path_differs(tmp_path):
    """Two simulator runs hashing differently (linux, ovs) stand in for two engines: the
    flows whose paths differ are exactly those the two policies route differently."""
    from aifabric.fabric.routing import Routing

    sc = _scenario()
    for switch in ("router", "ovs"):
        run_scenario("sim", with_policy(sc, switch), tmp_path / switch)
    report = compare(Run(tmp_path / "router"), Run(tmp_path / "ovs"))
    ft, f = sc.flows, sc.fabric
    a = Routing(f, "linux", sc.hash_seed).paths(ft.src, ft.dst, ft.sport)
    b = Routing(f, "ovs", sc.hash_seed).paths(ft.src, ft.dst, ft.sport)
    differ = [i for i in range(len(ft)) if a.links(i).tolist() != b.links(i).tolist()]
    assert differ, "the two policies route every flow alike: the test shows nothing"
    p = report["paths"]
    assert p["differ"] == len(differ) and p["equal"] == len(ft) - len(differ)
    assert [d["flow"] for d in p["differences"]] == differ[: len(p["differences"])]
    first = p["differences"][0]
    assert first["sim"][0] == f.port_name(int(f.nic_port[ft.src[differ[0]]]))
    assert report["verdict"] == "differ"
    assert f"{len(differ)} flows took different paths" in report["reasons"]
    same = compare(Run(tmp_path / "router"), Run(tmp_path / "router"))
    assert same["verdict"] == "agree" and same["paths"]["differ"] == 0
    assert all(c["ratio"] == 1 for c in same["collectives"])
    text = crosscheck_text(report, sc.name, sc.fabric.name, "router").splitlines()
    assert text[0] == (
        f"crosscheck: lab-small, {len(ft):,} flows; simulator with policy linux against the "
        "emulator's Linux routers"
    )
    assert text[1] == f"paths             {len(ft) - len(differ):,} of {len(ft):,} flows equal"
    assert text[2] == f"  flow {differ[0]}: sim {' '.join(first['sim'])}"
    assert text[-2].startswith("verdict           differ (tolerance 15%): ")
    assert crosscheck_text(same, sc.name, sc.fabric.name, "ovs").splitlines()[1] == (
        f"paths             {len(ft):,} of {len(ft):,} flows equal"
    )


def test_compare_refuses_runs_of_different_scenarios(tmp_path):
    sc = _scenario()
    run_scenario("sim", with_policy(sc, "router"), tmp_path / "a")
    other = scenario_from_dict(
        {"scenario": {"topology": "lab-small"}, "workload": {"pattern": "permutation"}}, "other"
    )
    run_scenario("sim", other, tmp_path / "b")
    with pytest.raises(AifabricError, match="same flows"):
        compare(Run(tmp_path / "a"), Run(tmp_path / "b"))


def test_an_earlier_crosscheck_is_replaced_only_when_forced(tmp_path):
    out = tmp_path / "x"
    clear_output(out)  # missing: nothing to do
    run_scenario("sim", with_policy(_scenario(), "router"), out / "sim")
    (out / "crosscheck.json").write_text("{}")
    with pytest.raises(AifabricError, match="is not empty; give another -o or --force"):
        clear_output(out)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(AifabricError, match=r"holds more than a crosscheck \(notes.txt\)"):
        clear_output(out, force=True)
    assert (out / "sim" / "run.json").is_file()
    (out / "notes.txt").unlink()
    clear_output(out, force=True)
    assert list(out.iterdir()) == []
    (tmp_path / "a-file").write_text("")
    with pytest.raises(AifabricError, match="a-file is not a directory"):
        clear_output(tmp_path / "a-file", force=True)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the Mininet engine needs root")
@pytest.mark.parametrize("cc", ["none", "dcqcn"])
def test_crosscheck_with_pfc_and_ecn_agrees_path_for_path_and_within_tolerance(tmp_path, cc):
    """Also with DCQCN (ConnectX's parameters): the replay's reaction point follows the
    simulator's rules, so the incast's senders slow down and recover alike."""
    from aifabric.emu import available

    if available() is not None:
        pytest.skip(str(available()))
    spec = tmp_path / "crosscheck.toml"
    text = SCENARIO
    if cc == "dcqcn":
        text = text.replace('kind = "none"', 'kind = "dcqcn"\npreset = "cx-100g"')
    spec.write_text(text)
    out = tmp_path / "x"
    # a fixed, generous scale: the replay keeps pace even on a loaded machine (the default
    # follows a start-up probe of the replay rate, which a busy machine reads high or low).
    # With PFC alone the incast's pauses govern, and the emulator's PFC is a monitor that
    # polls egress queues where the simulator counts bytes per ingress: it paused 2.8 ms in
    # all against the simulator's 0.6, all on the incast's own links (the ring 0.94x, the
    # incast 0.99x), so that case is judged at 30%; with DCQCN, at 15% (0.94x and 0.91x).
    # Before the pauses followed the flows' paths the ring's uplinks were paused for the
    # incast too, and the ring took 1.55x.
    tolerance = "0.3" if cc == "none" else "0.15"
    args = ["crosscheck", str(spec), "-o", str(out), "--scale", "50000", "--json"]
    args += ["--tolerance", tolerance]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report == json.loads((out / "crosscheck.json").read_text())
    assert report["status"] == {"sim": "complete", "mininet": "complete"}
    assert report["paths"]["differ"] == 0, report["paths"]["differences"]
    assert report["paths"]["equal"] == len(_scenario().flows)
    assert len(report["collectives"]) == 2
    for c in report["collectives"]:
        assert abs(c["ratio"] - 1) <= float(tolerance), c
    tot = report["totals"]
    for engine in ("sim", "mininet"):  # PFC and ECN were at work in both
        assert tot["ecn_marked"][engine] > 0 and tot["paused_ns_total"][engine] > 0
    judged = [u for u in report["uplinks"] if u["judged"]]
    assert judged and all(u["within"] for u in judged)
    assert report["verdict"] == "agree", report["reasons"]
    assert Run(out / "mininet").meta["scenario"]["ecmp"]["policy"] == "linux"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the Mininet engine needs root")
def test_link_failure_paths_agree_in_both_engines_after_the_failure(tmp_path):
    """The `link-failure` preset (lab-medium, an uplink down at 50 us) run in full: every flow's
    recorded path is equal in both engines, and the failure moved flows that never crossed
    the failed uplink (Linux's hash-threshold), which the simulator moved too. The uplink
    that fails is one that Linux's hash gives flows to (5 of the 11 it moves), so flows
    crossing it move as well (the preset's own, z0-r0-rtsw--z0-ctsw0, carries none of them
    under `linux`)."""
    from aifabric.emu import available
    from aifabric.fabric.faults import routing_after, routing_at_start
    from aifabric.scenarios import load_scenario

    if available() is not None:
        pytest.skip(str(available()))
    failed = {"faults.0.link": "z0-r0-rtsw--z0-ctsw7#2"}
    args = ["crosscheck", "link-failure", "-o", str(tmp_path), "--json"]
    r = CliRunner().invoke(main, [*args, "--set", "faults.0.link=z0-r0-rtsw--z0-ctsw7#2"])
    report = json.loads(r.output)
    assert r.exit_code == (0 if report["verdict"] == "agree" else 1), r.output
    assert report["paths"]["differ"] == 0, report["paths"]["differences"]
    sc = load_scenario("link-failure", overrides=failed)
    ft, fault = sc.flows, sc.faults[0]
    before = routing_at_start(sc.fabric, [], "linux", sc.hash_seed)
    old = before.paths(ft.src, ft.dst, ft.sport)
    new = routing_after(fault, before).paths(ft.src, ft.dst, ft.sport)
    moved = [i for i in range(len(ft)) if old.links(i).tolist() != new.links(i).tolist()]
    crossed = [i for i in moved if fault.target in old.links(i).tolist()]
    assert len(moved) > len(crossed) > 0
    emu = Run(tmp_path / "mininet").flows()
    assert (emu["end_ns"] > fault.at_ns).all()  # every flow was recorded on its final path
    for i in moved:
        got = emu["path_link"][emu["path_ptr"][i] : emu["path_ptr"][i + 1]].tolist()
        assert got == new.links(i).tolist(), i
