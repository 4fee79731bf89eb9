"""The run directory's Parquet tables: the npz arrays column for column, names beside ids,
nulls for "never", long-form port series, and one sentence for a broken file."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.fabric.export import fabric_from_topology
from aifabric.fabric.rundir import PORT_SERIES, Run, RunWriter
from tests.test_sweep_overrides import TWO_JOBS

TWO_JOBS_2US = TWO_JOBS.replace("[scenario]", '[scenario]\nsample_interval = "2us"')


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    """A ring AllReduce named "ring" beside an incast named "incast" on lab-small."""
    tmp = tmp_path_factory.mktemp("two-jobs")
    (tmp / "two.toml").write_text(TWO_JOBS_2US)
    r = CliRunner().invoke(main, ["run", str(tmp / "two.toml"), "-o", str(tmp / "run")])
    assert r.exit_code == 0, r.output
    return Run(tmp / "run")


def test_flows_parquet_holds_the_npz_arrays_with_names_and_nulls(two_jobs):
    run = two_jobs
    npz = dict(np.load(run.path / "flows.npz"))
    table = pq.read_table(run.path / "flows.parquet")
    fabric = fabric_from_topology(run.topology())
    n = len(npz["src"])
    assert table.num_rows == n > 0
    for name, values in npz.items():
        if name in ("path_ptr", "path_link"):
            continue
        col = table.column(name)
        assert col.type.to_pandas_dtype() == values.dtype, name
        if name in ("start_ns", "end_ns"):
            assert col.null_count == int((values < 0).sum())
            assert col.fill_null(-1).to_numpy().tolist() == values.tolist()
        else:
            assert col.null_count == 0
            assert col.to_numpy().tolist() == values.tolist(), name
    paths = table.column("path_link").combine_chunks()
    assert paths.offsets.to_numpy().tolist() == npz["path_ptr"].tolist()
    assert paths.values.to_numpy().tolist() == npz["path_link"].tolist()
    src_name = table.column("src_name").to_pylist()
    assert src_name == [fabric.node_name[i] for i in npz["src"]]
    assert table.column("dst_name").to_pylist() == [fabric.node_name[i] for i in npz["dst"]]
    jobs = dict(zip(npz["job"].tolist(), table.column("job_name").to_pylist(), strict=True))
    assert jobs == {0: "ring", 1: "incast"}
    done = npz["end_ns"] >= 0
    fct = table.column("fct_ns").to_numpy(zero_copy_only=False)
    assert np.array_equal(fct[done], (npz["end_ns"] - npz["start_ns"])[done])
    assert table.schema.field("src_name").type.value_type == "string"  # dictionary of names


def test_ports_parquet_is_one_row_per_port_and_sample_where_it_carried_something(two_jobs):
    run = two_jobs
    npz = dict(np.load(run.path / "ports.npz"))
    table = pq.read_table(run.path / "ports.parquet")
    fabric = fabric_from_topology(run.topology())
    ps = run.ports()
    dense = {name: ps[name] for name in ps.names}
    assert set(ps.names) == {*PORT_SERIES, "cnp_sent"}
    samples, ports = dense["tx_bytes"].shape
    assert samples > 2 and ports == len(npz["port"])
    carried = np.zeros((samples, ports), dtype=bool)
    for name in ps.names:
        carried |= dense[name] != 0
    # one row per (sample, port) that sent, queued, marked, paused or dropped something
    assert table.num_rows == len(npz["sample_index"]) == carried.sum() < samples * ports
    frame = table.to_pandas()
    col = {int(p): j for j, p in enumerate(npz["port"])}
    s = frame["t_ns"].to_numpy() // int(npz["interval_ns"])
    j = np.array([col[int(p)] for p in frame["port"]])
    assert carried[s, j].all() and len(set(zip(s, j, strict=True))) == len(frame)
    for name in PORT_SERIES:
        assert np.array_equal(frame[name].to_numpy(), dense[name][s, j]), name
        assert table.column(name).type.to_pandas_dtype() == ps.entries[name].dtype == np.int64
        assert table.column(name).to_numpy().sum() == dense[name].sum()
    # each port's rows together, in time order
    key = j.astype(np.int64) * samples + s
    assert (np.diff(key) > 0).all()
    for row in frame.sample(20, random_state=1).itertuples():
        port = int(row.port)
        assert row.port_name == fabric.port_names[port]
        assert row.node_name == fabric.node_name[fabric.port_node[port]]
        assert row.peer_name == fabric.node_name[fabric.port_peer[port]]
        assert row.interval_ns == npz["interval_ns"]
    # the rack switches' uplinks are named by their roles, without a topology lookup
    up = frame[(frame["node_role"] == "rtsw") & (frame["peer_role"] == "ctsw")]
    is_up = [
        fabric.node_role[fabric.port_node[p]] == 1 and fabric.node_role[fabric.port_peer[p]] == 2
        for p in frame["port"]
    ]
    assert len(up) == sum(is_up) > 0
    meta = json.loads(table.schema.metadata[b"aifabric"])
    assert meta["interval_ns"] == 2000 and meta["port"] == npz["port"].tolist()
    assert meta["t_ns"] == npz["t_ns"].tolist()


def test_ports_npz_keeps_entries_narrow_and_deflated_and_reads_them_back_wide(two_jobs):
    """Entries are mostly zeros and small counts: ports.npz keeps each in the narrowest
    integer type that holds it, deflated; Run.ports() gives them back as int64, equal to
    the Parquet table's values."""
    import zipfile

    path = two_jobs.path / "ports.npz"
    with zipfile.ZipFile(path) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}
    npz = dict(np.load(path))
    ps = two_jobs.ports()
    table = pq.read_table(two_jobs.path / "ports.parquet")
    for name in ("sample_index", "port_index", *PORT_SERIES):
        stored = npz[name]
        hi = int(stored.max())
        assert stored.dtype == (np.uint8 if hi < 2**8 else np.uint16 if hi < 2**16 else np.uint32)
    assert npz["ecn_marked"].dtype == np.uint8 and npz["tx_bytes"].dtype != np.uint8
    for name in PORT_SERIES:
        assert ps.entries[name].dtype == np.int64
        got = ps.entries[name][np.lexsort((ps.sample_index, ps.port_index))]  # by port, time
        assert np.array_equal(got, table.column(name).to_numpy()), name
    assert ps.sample_index.dtype == ps.port_index.dtype == np.int64
    # a difference of two narrow unsigned entries would wrap; read back, it does not
    assert (np.diff(ps.entries["tx_bytes"]) < 0).any()


def test_ports_npz_is_what_numpy_writes_but_for_the_zlib_level(monkeypatch):
    """savez_deflated at zlib's default level writes np.savez_compressed's bytes; at
    NPZ_LEVEL, members np.load reads back equal."""
    import io

    from aifabric.fabric import rundir

    rng = np.random.default_rng(1)
    tx = rng.poisson(0.5, 50_000) * rng.integers(0, 9000, 50_000)  # mostly zeros
    arrays = {"interval_ns": 10_000, "tx_bytes": tx.astype(np.uint16)}
    numpy_wrote, ours = io.BytesIO(), io.BytesIO()
    np.savez_compressed(numpy_wrote, **arrays)
    monkeypatch.setattr(rundir, "NPZ_LEVEL", 6)
    rundir.savez_deflated(ours, **arrays)
    assert ours.getvalue() == numpy_wrote.getvalue()
    monkeypatch.undo()
    ours = io.BytesIO()
    rundir.savez_deflated(ours, **arrays)
    assert ours.getvalue() != numpy_wrote.getvalue()
    ours.seek(0)
    back = np.load(ours)
    assert back["tx_bytes"].dtype == np.uint16
    assert np.array_equal(back["tx_bytes"], arrays["tx_bytes"]) and back["interval_ns"] == 10_000


def test_collectives_parquet_has_nulls_where_an_op_has_no_time(tmp_path):
    w = RunWriter(
        tmp_path / "r", "test", {"workload": {"jobs": [{"name": "a"}, {"pattern": "incast"}]}}
    )
    w.collectives(
        op=np.array([0, 1]), job=np.array([0, 1]), kind=np.array(["allreduce", "incast"]),
        algorithm=np.array(["ring", "-"]), bytes=np.array([1 << 20, 4000]),
        ranks=np.array([8, 4]), start_ns=np.array([0, 10]), end_ns=np.array([900, -1]),
        algbw_bps=np.array([9.3e9, 0.0]), busbw_bps=np.array([16.3e9, 0.0]),
        busbw_factor=np.array([1.75, 1.0]),
    )  # fmt: skip
    w.finish("complete")
    t = pq.read_table(tmp_path / "r" / "collectives.parquet").to_pydict()
    assert t["end_ns"] == [900, None] and t["algbw_bps"] == [9.3e9, None]
    assert t["busbw_bps"] == [16.3e9, None] and t["kind"] == ["allreduce", "incast"]
    assert t["job_name"] == ["a", "incast"]
    (tmp_path / "r" / "collectives.npz").rename(tmp_path / "npz")
    back, npz = Run(tmp_path / "r").collectives(), dict(np.load(tmp_path / "npz"))
    assert set(back) == set(npz)
    for name in npz:
        assert back[name].dtype == npz[name].dtype and back[name].tolist() == npz[name].tolist()


def test_a_run_without_its_npz_files_reads_the_same_from_its_parquet(two_jobs, tmp_path):
    from aifabric.analysis.metrics import run_metrics

    copy = tmp_path / "run"
    shutil.copytree(two_jobs.path, copy)
    for name in ("flows", "ports", "collectives"):
        (copy / f"{name}.npz").unlink()
    for name in ("flows", "ports", "collectives"):
        a, b = getattr(two_jobs, name)(), getattr(Run(copy), name)()
        assert set(a) == set(b), name
        for key in a:
            assert b[key].dtype == a[key].dtype, (name, key)
            assert b[key].shape == a[key].shape, (name, key)
            assert np.array_equal(a[key], b[key]), (name, key)
    first, second = run_metrics(two_jobs).to_dict(), run_metrics(Run(copy)).to_dict()
    first.pop("path"), second.pop("path")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_a_truncated_parquet_is_one_sentence_where_the_analyzer_reads_it(two_jobs, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(two_jobs.path, copy)
    (copy / "flows.npz").unlink()
    data = (copy / "flows.parquet").read_bytes()
    (copy / "flows.parquet").write_bytes(data[: len(data) // 2])
    r = CliRunner().invoke(main, ["analyze", str(copy)])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    (line,) = r.output.strip().splitlines()
    assert line.startswith(f"Error: {copy / 'flows.parquet'} cannot be read as Parquet (")
    table = Run(two_jobs.path).table("ports", ["port_name", "tx_bytes"])
    assert table.column_names == ["port_name", "tx_bytes"]


def test_a_port_series_run_without_samples_keeps_its_ports(tmp_path):
    w = RunWriter(tmp_path / "r", "test", {})
    empty = np.zeros((0, 3), dtype=np.int64)
    w.ports(interval_ns=1000, t_ns=np.zeros(0, dtype=np.int64), port=np.array([4, 5, 9]),
            **{k: empty for k in PORT_SERIES})  # fmt: skip
    w.finish("complete")
    (tmp_path / "r" / "ports.npz").unlink()
    ports = Run(tmp_path / "r").ports()
    assert ports["port"].tolist() == [4, 5, 9] and ports["tx_bytes"].shape == (0, 3)
    assert int(ports["interval_ns"]) == 1000 and float(ports["scale"]) == 1.0


def test_port_series_are_written_in_row_groups_of_whole_ports(tmp_path, monkeypatch, get_fabric):
    """Blocks of ports keep a large run's copies small; the file reads back as one table,
    ports one after another, and as the same arrays."""
    from aifabric.fabric import columnar

    fabric = get_fabric("lab-small")
    samples, port = 5, np.arange(0, fabric.n_ports, 3)
    monkeypatch.setattr(columnar, "ROW_GROUP", 4 * samples + 1)  # four ports a group
    rng = np.random.default_rng(7)
    series = {k: rng.integers(0, 1000, (samples, len(port))) for k in PORT_SERIES}
    w = RunWriter(tmp_path / "r", "test", {})
    w.topology(fabric)
    w.ports(interval_ns=500, t_ns=np.arange(samples) * 500, port=port, **series)
    w.finish("complete")
    f = pq.ParquetFile(tmp_path / "r" / "ports.parquet")
    assert f.metadata.num_row_groups == -(-len(port) // 4) > 1
    t = f.read()
    assert t.column("port").to_numpy().tolist() == np.repeat(port, samples).tolist()
    assert (
        t.column("t_ns").to_numpy().tolist()
        == np.tile(np.arange(samples) * 500, len(port)).tolist()
    )
    names = t.column("port_name").to_pylist()
    assert names == [fabric.port_names[p] for p in np.repeat(port, samples)]
    assert t.column("drops").to_numpy().tolist() == series["drops"].T.reshape(-1).tolist()
    (tmp_path / "r" / "ports.npz").unlink()
    back = Run(tmp_path / "r").ports()
    for k, v in series.items():
        assert np.array_equal(back[k], v), k
