"""benchmarks/bench_htsim.py: both simulators are given the same work, aifabric under the
reference's conventions, and the script says so in one line when the reference is absent."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aifabric.fabric.model import Role
from aifabric.scenarios import load_scenario
from aifabric.traffic.matrix import read_htsim

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_htsim.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_htsim", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_htsim"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["bench_htsim"]


@pytest.mark.parametrize("seed", [1, 2, 7])
def test_a_permutation_sends_once_and_receives_once_never_to_itself(bench, seed):
    pairs = bench.permutation(128, seed)
    src, dst = np.array(pairs).T
    assert sorted(src) == sorted(dst) == list(range(128))
    assert not (src == dst).any()


@pytest.mark.parametrize("name", ["k8", "incast"])
def test_the_matrix_both_read_is_the_case(bench, tmp_path, name):
    case = bench.cases(1)[name]
    path = tmp_path / f"{name}.cm"
    bench.write_matrix(case, path)
    m = read_htsim(path)
    assert [(int(s), int(d)) for s, d in zip(m.src, m.dst, strict=True)] == list(case.pairs)
    assert (m.bytes == case.size).all() and (m.start_ns == 0).all()


def test_the_scenario_runs_the_matrix_under_the_references_conventions(bench, tmp_path):
    case = bench.cases(1)["k16"]
    matrix, scenario = tmp_path / "k16.cm", tmp_path / "k16.toml"
    bench.write_matrix(case, matrix)
    bench.write_scenario(case, matrix, scenario)
    sc = load_scenario(scenario)
    assert sc.fabric.name == "fat-tree-k16" and len(sc.fabric.nic_ids) == case.hosts
    assert len(sc.flows) == len(case.pairs) and (sc.flows.bytes == case.size).all()
    cc = sc.cc_parameters()
    assert sc.cc == "none" and cc["ack_every"] == 1 and cc["header_overhead"] == 64
    for role in (Role.RTSW, Role.CTSW, Role.ATSW):  # a fat tree's edge, aggregation, core
        q = sc.fabric.queue(role)
        assert q.model == "static" and q.pfc.enabled
        assert (q.pfc.xoff_bytes, q.pfc.xon_bytes) == (15 * bench.MTU, 12 * bench.MTU)
    link = sc.fabric
    assert set(link.link_rate_bps) == {100 * 10**9} and set(link.link_delay_ns) == {500}
    assert set(link.link_mtu_bytes) == {bench.MTU}


def test_without_the_reference_it_says_so_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HTSIM_ROCE"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--htsim", str(tmp_path / "absent")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "no htsim_roce binary" in proc.stdout
