"""Traffic matrices from files: CSV, htsim connection matrices and saved flow tables."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric import traffic
from aifabric.cli import main
from aifabric.fabric.errors import SpecError
from aifabric.traffic import FlowTable, import_flows, read_matrix
from tests.conftest import fabric as preset

MiB = 2**20


@pytest.fixture
def small():
    return preset("lab-small")


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_csv_with_names_indices_units_and_start_times(tmp_path, small):
    nics = small.nic_ids
    path = write(tmp_path, "m.csv", (
        "# an incast and one more flow\n"
        "src,dst,bytes,start\n"
        f"{small.node_name[nics[3]]},0,4MiB,0\n"
        "5,0,1000000,2us\n"
        f"7,{small.node_name[nics[9]]},4096,1500\n"
    ))  # fmt: skip
    t = import_flows(path, small, seed=3)
    assert t.src.tolist() == [nics[3], nics[5], nics[7]]
    assert t.dst.tolist() == [nics[0], nics[0], nics[9]]
    assert t.bytes.tolist() == [4 * MiB, 10**6, 4096]
    assert t.start_ns.tolist() == [0, 2000, 1500]
    assert len(t.dep) == 0 and t.op_kind.tolist() == ["matrix"]
    assert (t.sqpn > 0).all() and len(set(zip(t.src.tolist(), t.sqpn.tolist(), strict=True))) == 3
    assert t.op_busbw_factor.tolist() == [1.0]


def test_csv_without_header_and_columns_in_any_order(tmp_path, small):
    plain = import_flows(write(tmp_path, "a.csv", "1,2,100\n2,1,200\n"), small)
    named = import_flows(write(tmp_path, "b.csv", "bytes,dst,src\n100,2,1\n200,1,2\n"), small)
    for t in (plain, named):
        assert t.src.tolist() == [small.nic_ids[1], small.nic_ids[2]]
        assert t.bytes.tolist() == [100, 200] and t.start_ns.tolist() == [0, 0]


HTSIM = """Nodes 16
Connections 5
Triggers 2
0->1 id 1 start 0 size 2000000 send_done_trigger 1
1->2 id 2 trigger 1 size 1000
3->4 id 3 start 1.5 size 500 send_done_trigger 2
2->4 id 4 start 0 size 700 recv_done_trigger 2
5->6 id 5 trigger 2 size 300
trigger id 1 oneshot
trigger id 2 barrier count 2
"""


def test_htsim_connection_matrix_with_triggers(tmp_path, small):
    path = write(tmp_path, "perm.cm", HTSIM)
    m = read_matrix(path)
    assert m.src == ["0", "1", "3", "2", "5"] and m.bytes.tolist() == [2000000, 1000, 500, 700, 300]
    assert m.start_ns.tolist() == [0, 0, 1500, 0, 0]  # htsim's start is in microseconds
    t = import_flows(path, small)
    nics = small.nic_ids
    # 5->6 waits for both flows that fire the barrier; 1->2 for the flow that fires trigger 1
    assert sorted(t.deps_of(1).tolist()) == [0]
    assert sorted(t.deps_of(4).tolist()) == [2, 3]
    assert t.src.tolist() == [nics[i] for i in (0, 1, 3, 2, 5)]


def test_a_dependency_on_a_later_row_is_ordered_first(tmp_path, small):
    path = write(tmp_path, "late.cm", (
        "Nodes 4\nConnections 2\n"
        "0->1 id 1 trigger 7 size 100\n"
        "2->3 id 2 start 0 size 200 send_done_trigger 7\n"
        "trigger id 7 oneshot\n"
    ))  # fmt: skip
    t = import_flows(path, small)
    assert t.bytes.tolist() == [200, 100] and t.deps_of(1).tolist() == [0]


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("a.csv", "0,1,100\nz9-nic,1,100\n", ["a.csv:2", "'z9-nic' is not a NIC"]),
        ("a.csv", "0,999,100\n", ["NIC index 999", "0..15"]),
        ("a.csv", "3,3,100\n", ["a.csv:1", "to itself"]),
        ("a.csv", "0,1,12Q\n", ["a.csv:1", "bytes", "12Q"]),
        ("a.csv", "src,dst,bytes,qos\n0,1,5\n", ["qos", "src, dst, bytes, start"]),
        ("a.csv", "0,1\n", ["2 fields"]),
        ("a.cm", "0->1 id 1 start 0 size 0\n", ["a.cm:1", "endless"]),
        ("a.cm", "0->1 id 1 start 0 size 9 prio 3\n", ["'prio'"]),
        ("a.cm", "Nodes 4\nConnections 3\n0->1 id 1 start 0 size 9\n", ["Connections 3", "1"]),
        ("a.cm", "0->1 id 1 size 9\n", ["either start"]),
        ("a.cm", "hello world\n", ["a.cm:1", "not an htsim connection"]),
        ("a.cm", "0->1 id 1 trigger 4 size 9\n", ["trigger 4 is never declared"]),
        ("a.cm", "0->1 id 1 trigger 1 size 9 send_done_trigger 2\n"
                 "1->2 id 2 trigger 2 size 9 send_done_trigger 1\n"
                 "trigger id 1 oneshot\ntrigger id 2 oneshot\n", ["cycle"]),
        ("a.cm", "0->1 id 1 trigger 1 size 9\n1->2 id 2 start 0 size 9 send_done_trigger 1\n"
                 "2->3 id 3 start 0 size 9 send_done_trigger 1\ntrigger id 1 oneshot\n",
         ["fired by 2"]),
    ],
)  # fmt: skip
def test_bad_matrices_are_one_sentence(tmp_path, small, name, text, words):
    with pytest.raises(SpecError) as e:
        import_flows(write(tmp_path, name, text), small)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_a_saved_flow_table_is_used_as_it_is(tmp_path, small):
    w = traffic.workload_from_dict({"collective": "allreduce", "gpus": 8, "qps": 2}, "ar")
    table = traffic.generate(small, w, seed=2)
    path = tmp_path / "ar.npz"
    table.save(path)
    again = import_flows(path, small)
    for name, value in table.arrays().items():
        assert np.array_equal(value, getattr(again, name)), name
    with pytest.raises(SpecError, match="qps"):
        import_flows(path, small, qps=4)
    switch = int(small.switch_ids[0])
    odd = FlowTable.build({"src": [switch], "dst": [small.nic_ids[0]], "bytes": [5]}, [[]], {})
    odd.save(tmp_path / "odd.npz")
    with pytest.raises(SpecError, match=f"not made for fabric lab-small: node {switch}"):
        import_flows(tmp_path / "odd.npz", small)


def test_a_matrix_job_beside_a_collective(tmp_path, small):
    nics = small.nic_ids
    path = write(tmp_path, "m.csv", "0,1,100\n1,0,100\n")
    w = traffic.workload_from_dict(
        {"jobs": [{"matrix": str(path), "priority": 5, "qps": 2},
                  {"collective": "allreduce", "gpus": 8, "size": "1MiB"}]}, "mixed",
    )  # fmt: skip
    t = traffic.generate(small, w, seed=1)
    mine = t.job == 0
    assert set(t.src[mine].tolist()) == {nics[0], nics[1]} and (t.priority[mine] == 5).all()
    assert int(t.bytes[mine].sum()) == 200 and mine.sum() == 4  # two QPs per flow
    ring = set(t.src[~mine].tolist())
    assert len(ring) == 8 and not ring & {nics[0], nics[1]}  # placed around the matrix


def test_matrix_job_keys_and_relative_paths(tmp_path, small):
    write(tmp_path, "m.csv", "0,1,100\n")
    toml = write(tmp_path, "w.toml", 'matrix = "m.csv"\nstart = "5us"\n')
    t = traffic.generate(small, traffic.load_workload(toml))
    assert t.start_ns.tolist() == [5000]
    with pytest.raises(SpecError, match="gpus = 4 does not apply to a matrix job"):
        traffic.workload_from_dict({"matrix": str(tmp_path / "m.csv"), "gpus": 4}, "x")
    with pytest.raises(SpecError, match="no such file"):
        traffic.workload_from_dict({"matrix": "nowhere.csv"}, "x")
    with pytest.raises(SpecError, match="workload file nowhere.npz does not exist"):
        traffic.load_workload("nowhere.npz")


def test_a_matrix_not_beside_its_workload_is_found_from_the_working_directory(
    tmp_path, small, monkeypatch
):
    write(tmp_path, "m.csv", "0,1,100\n")
    (tmp_path / "jobs").mkdir()
    toml = write(tmp_path / "jobs", "w.toml", 'matrix = "m.csv"\n')
    with pytest.raises(SpecError, match="no such file"):
        traffic.load_workload(toml)  # neither beside w.toml nor in the working directory
    monkeypatch.chdir(tmp_path)
    assert traffic.generate(small, traffic.load_workload(toml)).bytes.tolist() == [100]


def test_two_matrix_jobs_may_not_share_a_nic(tmp_path, small):
    a = write(tmp_path, "a.csv", "0,1,100\n")
    b = write(tmp_path, "b.csv", "1,2,100\n")
    w = traffic.workload_from_dict({"jobs": [{"matrix": str(a)}, {"matrix": str(b)}]}, "two")
    with pytest.raises(SpecError, match="never share a NIC"):
        traffic.generate(small, w)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_import_and_show_commands(tmp_path):
    src = write(tmp_path, "perm.cm", "Nodes 4\nConnections 2\n0->1 id 1 start 0 size 2000000\n"
                "1->0 id 2 start 0 size 2000000\n")  # fmt: skip
    out = tmp_path / "perm.npz"
    r = run("traffic", "import", src, "--fabric", "lab-small", "-o", out)
    assert r.exit_code == 0, r.output
    t = FlowTable.load(out)
    assert len(t) == 2 and t.bytes.tolist() == [2000000, 2000000]
    for source in (src, out):
        r = run("traffic", "show", source, "--fabric", "lab-small", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["bytes"] == 4000000
    r = run("traffic", "import", write(tmp_path, "bad.csv", "0,0,5\n"), "--fabric", "lab-small",
            "-o", tmp_path / "bad.npz")  # fmt: skip
    assert r.exit_code == 1 and "to itself" in r.output and "Traceback" not in r.output


def test_a_scenario_runs_a_matrix_file(tmp_path):
    from aifabric.scenarios import load_scenario

    small = preset("lab-small")
    write(tmp_path, "m.csv", "src,dst,bytes\n0,9,64KiB\n3,9,64KiB\n")
    table = traffic.generate(small, traffic.load_workload(tmp_path / "m.csv"), seed=4)
    table.save(tmp_path / "m.npz")
    for workload in ("./m.csv", "./m.npz"):  # relative to the scenario file
        scenario = write(tmp_path, "s.toml", (
            f'[scenario]\ntopology = "lab-small"\nworkload = "{workload}"\nseed = 4\n'
        ))  # fmt: skip
        sc = load_scenario(scenario)
        assert np.array_equal(sc.flows.sqpn, table.sqpn) and np.array_equal(sc.flows.dst, table.dst)
