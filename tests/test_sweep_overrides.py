"""Key overrides (`run --set`, sweep points): parsing, laying over a scenario, refusing typos."""

from __future__ import annotations

import pytest

from aifabric.fabric.errors import SpecError
from aifabric.scenarios import load_scenario
from aifabric.scenarios.overrides import apply_overrides, parse_assignment, parse_value

TINY = """
[scenario]
topology = "lab-small"
seed = 1
[workload]
collective = "allreduce"
algorithm = "ring"
size = "1MiB"
gpus = 8
[ecmp]
policy = "5tuple"
"""

TWO_JOBS = """
[scenario]
topology = "lab-small"
[[workload.jobs]]
name = "ring"
collective = "allreduce"
size = "1MiB"
gpus = 8
[[workload.jobs]]
name = "incast"
pattern = "incast"
senders = 3
size = "1MB"
"""


def test_values_parse_as_toml_and_bare_words_stay_strings():
    assert parse_value("4") == 4
    assert parse_value("0.5") == 0.5
    assert parse_value("true") is True
    assert parse_value("[1, 2]") == [1, 2]
    assert parse_value('"x y"') == "x y"
    assert parse_value("50KiB") == "50KiB"
    assert parse_value("eecmp") == "eecmp"
    assert parse_value("5tuple") == "5tuple"
    assert parse_assignment("queue.rtsw.pfc_xoff = 1MiB") == ("queue.rtsw.pfc_xoff", "1MiB")
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_assignment("ecmp.policy")


def test_overrides_are_laid_over_a_copy():
    raw = {"scenario": {"topology": "lab-small"}, "workload": {"collective": "allreduce"}}
    out = apply_overrides(
        raw,
        {"ecmp.policy": "eecmp", "queue.ecn_kmin": "50KiB", "queue.rtsw.pfc_xoff": "2MiB",
         "workload.qps": 4, "congestion_control.kind": "none"},
    )  # fmt: skip
    assert out["ecmp"] == {"policy": "eecmp"}
    assert out["queue"] == {"ecn_kmin": "50KiB", "rtsw": {"pfc_xoff": "2MiB"}}
    assert out["workload"] == {"collective": "allreduce", "qps": 4}
    assert out["congestion_control"] == {"kind": "none"}
    assert raw == {"scenario": {"topology": "lab-small"}, "workload": {"collective": "allreduce"}}


@pytest.mark.parametrize(
    "key, says",
    [
        ("ecmp.polcy", "unknown key ecmp.polcy: [ecmp] takes policy, same_seed"),
        ("workload.qpz", "unknown key workload.qpz: [workload] takes"),
        ("queu.ecn_kmin", "unknown key queu.ecn_kmin: a scenario's tables are"),
        ("queue.spine.ecn_kmin", "unknown key queue.spine.ecn_kmin"),
        ("faults.0.when", "unknown key faults.0.when: write faults.N.KEY"),
    ],
)
def test_unknown_keys_are_refused_in_one_sentence(key, says):
    with pytest.raises(SpecError) as e:
        apply_overrides({"scenario": {}}, {key: 1})
    assert str(e.value).startswith(says)
    assert "\n" not in str(e.value)
    named = str(e.value).partition(" takes ")[2].split(", ")
    assert len(named) == len(set(named)), "each key the table takes is named once"


def test_loader_applies_overrides(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    sc = load_scenario(
        path,
        overrides=[("ecmp.policy", "eecmp"), ("workload.qps", 4), ("queue.ecn_kmin", "50KiB")],
    )
    assert sc.ecmp == "eecmp"
    assert set(sc.flows.op_qps.tolist()) == {4}
    from aifabric.fabric.model import Role

    assert sc.fabric.queue(Role.RTSW).ecn.kmin_bytes == 50 * 1024
    base = load_scenario(path)
    assert base.ecmp == "5tuple" and set(base.flows.op_qps.tolist()) == {1}
    with pytest.raises(SpecError, match="ecmp.policy = 'ecmpp' is not one of"):
        load_scenario(path, overrides={"ecmp.policy": "ecmpp"})


def test_a_workload_given_by_preset_name_takes_overrides(tmp_path):
    path = tmp_path / "dense.toml"
    path.write_text('[scenario]\ntopology = "lab-medium"\nworkload = "dense"\n')
    base = load_scenario(path)
    sc = load_scenario(path, overrides={"workload.qps": 4, "workload.bucket": "256MiB"})
    assert set(base.flows.op_qps.tolist()) == {2}  # the preset's qps
    assert set(sc.flows.op_qps.tolist()) == {4}
    assert sc.workload["bucket"] == "256MiB" and sc.workload["model"] == "dense-70b"
    assert len(sc.flows.op_id) > len(base.flows.op_id)  # smaller buckets: more AllReduces


def test_a_workload_file_beside_the_scenario_takes_overrides(tmp_path):
    (tmp_path / "job.toml").write_text('collective = "allgather"\nsize = "1MiB"\ngpus = 8\n')
    path = tmp_path / "s.toml"
    path.write_text('[scenario]\ntopology = "lab-small"\nworkload = "job.toml"\n')
    sc = load_scenario(path, overrides={"workload.gpus": 4})
    assert sc.flows.op_ranks.tolist() == [4]
    assert sc.flows.op_kind.tolist() == ["allgather"]


def test_job_keys_reach_every_job_or_the_named_one(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(TWO_JOBS)
    every = load_scenario(path, overrides={"workload.qps": 2})
    assert [j["qps"] for j in every.workload["jobs"]] == [2, 2]
    one = load_scenario(path, overrides={"workload.jobs.incast.size": "2MB"})
    assert [j["size"] for j in one.workload["jobs"]] == ["1MiB", "2MB"]
    by_index = apply_overrides({"workload": {"jobs": [{}, {}]}}, {"workload.jobs.1.qps": 8})
    assert by_index["workload"]["jobs"] == [{}, {"qps": 8}]
    with pytest.raises(SpecError, match="no job of that name; the jobs are ring, incast"):
        load_scenario(path, overrides={"workload.jobs.bystander.qps": 2})


def test_faults_are_replaced_or_changed():
    raw = {"faults": [{"link": "a--b", "at": "50us"}]}
    assert apply_overrides(raw, {"faults.0.at": "10us"})["faults"] == [
        {"link": "a--b", "at": "10us"}
    ]
    assert apply_overrides(raw, {"faults": []})["faults"] == []
    with pytest.raises(SpecError, match="the scenario has 1 faults"):
        apply_overrides(raw, {"faults.3.at": "1us"})


def test_run_set_and_force(tmp_path):
    import json

    from click.testing import CliRunner

    from aifabric.cli import main

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    out = tmp_path / "run"

    def run(*extra):
        args = ["run", str(path), "-o", str(out), "--json", *extra]
        return CliRunner().invoke(main, args)

    first = run("--set", "ecmp.policy=eecmp", "--set", "workload.qps=2")
    assert first.exit_code == 0, first.output
    meta = json.loads((out / "run.json").read_text())
    assert meta["scenario"]["ecmp"]["policy"] == "eecmp"
    assert meta["scenario"]["workload"]["qps"] == 2
    again = run()
    assert again.exit_code == 1 and "already exists" in again.output
    forced = run("--force", "--set", "workload.size=2MiB")
    assert forced.exit_code == 0, forced.output
    meta = json.loads((out / "run.json").read_text())
    assert meta["scenario"]["ecmp"]["policy"] == "5tuple"
    assert meta["scenario"]["workload"]["size"] == "2MiB"
    typo = run("--force", "--set", "ecmp.polcy=eecmp")
    assert typo.exit_code == 1
    assert typo.output.strip() == ("Error: unknown key ecmp.polcy: [ecmp] takes policy, same_seed")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    refused = CliRunner().invoke(main, ["run", str(path), "-o", str(other), "--force"])
    assert refused.exit_code == 1 and "not a run directory" in refused.output
    assert (other / "keep.txt").read_text() == "mine"
