"""`aifabric traffic show | export | presets` through click's CliRunner."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.traffic import FlowTable


def run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    "workload, options",
    [
        ("allreduce", ["--algorithm", "ring", "--size", "64MiB", "--gpus", "128"]),
        ("allreduce", ["--algorithm", "tree", "--channels", "2"]),
        ("allreduce", ["--algorithm", "halving-doubling", "--gpus", "96"]),
        ("allgather", ["--qps", "4", "--qp-mode", "round-robin"]),
        ("reducescatter", ["--hierarchical"]),
        ("alltoall", ["--gpus", "64", "--placement", "fragmented"]),
        ("broadcast", ["--root", "5"]),
        ("sendrecv", ["--stages", "4"]),
        ("incast", ["--senders", "16"]),
        ("permutation", []),
        ("uniform", ["--distribution", "pareto", "--load", "0.4", "--flows", "500"]),
        ("dense", []),
        ("moe", []),
    ],
)
def test_show(workload, options):
    r = run("traffic", "show", workload, "--fabric", "lab-medium", *options)
    assert r.exit_code == 0, r.output
    assert "busbw" in r.output
    r = run("traffic", "show", workload, "--fabric", "lab-medium", "--json", *options)
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["flows"] == sum(op["flows"] for op in data["ops"])
    assert all(op["ideal_ns"] > 0 for op in data["ops"])


def test_show_json_figures():
    r = run("traffic", "show", "allreduce", "--size", "64MiB", "--gpus", "16",
            "--fabric", "lab-medium", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    op = json.loads(r.output)["ops"][0]
    assert op["max_rank_bytes"] == 2 * 15 * 64 * 2**20 // 16
    assert op["ideal_ns"] == -(-op["max_rank_bytes"] * 8 // 400)
    assert op["busbw_factor"] == pytest.approx(2 * 15 / 16)


def test_export(tmp_path):
    out = tmp_path / "f.npz"
    r = run("traffic", "export", "moe", "--fabric", "lab-medium", "-o", str(out))
    assert r.exit_code == 0, r.output
    table = FlowTable.load(out)
    with np.load(out) as z:
        assert str(z["schema"]) == "aifabric.flows/1"
    assert len(table) > 0 and set(table.op_kind) >= {"alltoall", "allreduce", "sendrecv"}


def test_show_too_big_for_a_table_is_closed_form():
    r = run("traffic", "show", "alltoall", "--fabric", "cluster-24k")
    assert r.exit_code == 0, r.output
    assert "closed form" in r.output and "603,955,200" in r.output


def test_presets_command():
    r = run("traffic", "presets")
    assert r.exit_code == 0, r.output
    assert "dense" in r.output and "moe" in r.output


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["show", "nonsense", "--fabric", "lab-medium"], 1, ["nonsense"]),
        (["show", "allreduce", "--size", "12Q", "--fabric", "lab-medium"], 2, ["size", "12Q"]),
        (["show", "allreduce", "--gpus", "500", "--fabric", "lab-medium"], 1, ["500"]),
        (["show", "allreduce", "--fabric", "no-fabric"], 1, ["no-fabric"]),
        (["show", "dense", "--size", "1MiB", "--fabric", "lab-medium"], 2, ["--size"]),
        (["export", "alltoall", "--fabric", "cluster-24k", "-o", "a.npz"], 1, ["flows"]),
        (["export", "dense", "--fabric", "lab-medium", "-o", "x.txt"], 2, [".npz"]),
        (["export", "dense", "--fabric", "lab-medium", "-o", "/no/such/x.npz"], 1, ["folder"]),
    ],
)
def test_errors_are_one_sentence(args, code, words):
    r = run("traffic", *args)
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in r.output, r.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload",
    [
        "allreduce",
        "allgather",
        "reducescatter",
        "alltoall",
        "broadcast",
        "sendrecv",
        "dense",
        "moe",
    ],
)
def test_show_on_cluster_24k(workload):
    extra = ["--algorithm", "tree"] if workload == "allreduce" else []
    r = run("traffic", "show", workload, "--fabric", "cluster-24k", "--json", *extra)
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert all(op["ranks"] * op["groups"] <= 24576 for op in data["ops"])
    assert sum(op["bytes"] for op in data["ops"]) == data["bytes"]
