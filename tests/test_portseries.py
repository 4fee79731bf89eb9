"""Port series kept where they carry something (issue 27): entries equal the dense series
they replace, every reader gets the same figures, and the telemetry of a run grows with
what happens in it, not with its ports times its duration."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from aifabric.cli import main
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.portseries import PortSamples, sparse
from aifabric.fabric.rundir import OPTIONAL_PORT_SERIES, PORT_SERIES, Run, RunWriter

NAMES = PORT_SERIES + OPTIONAL_PORT_SERIES


@st.composite
def dense_series(draw):
    """Series of one shape, mostly zero, as a sampled fabric is."""
    samples = draw(st.integers(0, 9))
    ports = draw(st.integers(0, 7))
    cell = st.one_of(st.just(0), st.just(0), st.integers(0, 2**40))
    return {k: draw(arrays(np.int64, (samples, ports), elements=cell)) for k in NAMES}


@settings(max_examples=200, deadline=None)
@given(dense_series())
def test_entries_hold_every_cell_that_is_not_zero_and_give_back_the_dense_series(series):
    samples, ports = series["tx_bytes"].shape
    e = sparse(series)
    ps = PortSamples(interval_ns=10, t_ns=np.arange(samples) * 10, port=np.arange(ports), **e)
    carried = np.zeros((samples, ports), dtype=bool)
    for v in series.values():
        carried |= v != 0
    assert ps.n_entries == carried.sum()  # every cell that carried something, once
    cells = e["sample_index"] * max(ports, 1) + e["port_index"]
    assert (np.diff(cells) > 0).all()  # in (sample, port) order
    for k, v in series.items():
        assert np.array_equal(ps[k], v), k
        assert np.array_equal(ps.total(k), v.sum(axis=0)), k
        assert np.array_equal(ps.per_sample(k), v.sum(axis=1)), k
        peak = v.max(axis=0) if samples else np.zeros(ports, np.int64)
        assert np.array_equal(ps.peak(k), peak), k
        assert np.array_equal(ps.nonzero_per_sample(k), np.count_nonzero(v, axis=1)), k
        hit = v != 0
        first = np.where(hit.any(axis=0), hit.argmax(axis=0), -1) if samples else -np.ones(ports)
        assert np.array_equal(ps.first(k), first), k


@settings(max_examples=200, deadline=None)
@given(dense_series(), st.data())
def test_some_ports_rows_and_every_ports_row_in_turn_are_the_dense_arrays(series, data):
    samples, ports = series["tx_bytes"].shape
    ps = PortSamples(interval_ns=10, t_ns=np.arange(samples) * 10, port=np.arange(ports),
                     **sparse(series))  # fmt: skip
    some = data.draw(st.lists(st.integers(0, ports - 1), unique=True) if ports else st.just([]))
    for k, v in series.items():
        assert np.array_equal(ps.rows(k, some), v[:, some].T), k
        assert np.array_equal(ps.per_sample(k, some), v[:, some].sum(axis=1)), k
        rows = list(ps.each_row(k))
        assert len(rows) == ports and all(np.array_equal(r, v[:, j]) for j, r in enumerate(rows))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Dense series written by RunWriter (as the emulator gives them), and what it wrote."""
    rng = np.random.default_rng(7)
    samples, ports = 40, 24
    series = {}
    for k in NAMES:
        v = rng.integers(1, 5000, (samples, ports))
        v[rng.random((samples, ports)) < 0.9] = 0
        series[k] = v
    series["tx_bytes"][:, 5] = 0
    for k in NAMES:  # port 5 carries nothing at all; sample 3 nowhere
        series[k][:, 5] = 0
        series[k][3] = 0
    path = tmp_path_factory.mktemp("ps") / "run"
    w = RunWriter(path, "test", {"name": "entries"})
    t_ns = np.arange(samples, dtype=np.int64) * 1000
    w.ports(interval_ns=1000, t_ns=t_ns, port=np.arange(ports) * 2, scale=2.0, **series)
    w.finish("complete")
    return path, series


def test_a_dense_series_written_is_read_back_from_its_entries(written):
    path, series = written
    z = np.load(path / "ports.npz")
    assert z["tx_bytes"].ndim == 1 and len(z["sample_index"]) == len(z["tx_bytes"])
    ps = Run(path).ports()
    assert ps.samples == 40 and ps.scale == 2.0 and ps.interval_ns == 1000
    assert not (ps.port_index == 5).any() and not (ps.sample_index == 3).any()
    for k, v in series.items():
        assert np.array_equal(ps[k], v), k
    # the Parquet table alone holds the same entries
    (path / "ports.npz").rename(path / "aside.npz")
    again = Run(path).ports()
    (path / "aside.npz").rename(path / "ports.npz")
    for k in ("sample_index", "port_index", "t_ns", "port", *NAMES):
        assert np.array_equal(again[k], ps[k]), k


def test_a_run_directory_written_dense_before_entries_reads_the_same(written, tmp_path):
    import shutil

    path, series = written
    old = tmp_path / "old"
    shutil.copytree(path, old)
    (old / "ports.parquet").unlink()
    ps = Run(path).ports()
    np.savez(old / "ports.npz", interval_ns=1000, t_ns=ps.t_ns, port=ps.port, scale=2.0,
             **series)  # fmt: skip
    back = Run(old).ports()
    assert back.n_entries == ps.n_entries
    for k in ("sample_index", "port_index", *NAMES):
        assert np.array_equal(back[k], ps[k]), k


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda z: z.update(sample_index=z["sample_index"] + 40), "sample_index holds"),
        (lambda z: z.update(port_index=-z["port_index"].astype(np.int64) - 1), "port_index holds"),
        (lambda z: z.update(sample_index=z["sample_index"][::-1].copy()), "(sample, port) order"),
        (lambda z: z.update(tx_bytes=z["tx_bytes"][1:]), "tx_bytes has shape"),
        (lambda z: z.update(drops=-z["drops"].astype(np.int64) - 1), "drops holds a negative"),
        (lambda z: z.pop("port_index"), "has no port_index"),
    ],
)
def test_damaged_entries_are_one_sentence(written, tmp_path, edit, says):
    import shutil

    path, _ = written
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    (bad / "ports.parquet").unlink()
    z = dict(np.load(bad / "ports.npz"))
    edit(z)
    np.savez(bad / "ports.npz", **z)
    with pytest.raises(AifabricError) as e:
        Run(bad).ports()
    assert says in str(e.value) and "ports.npz" in str(e.value), e.value
    assert "\n" not in str(e.value)


INCAST = """
[scenario]
topology = "fat-tree-k8"
seed = 1

[workload]
pattern = "incast"
senders = 8
size = "256KB"
gpus = 9
"""


def test_an_incast_on_a_large_fabric_stores_the_cells_its_flows_touch(tmp_path):
    """9 of 128 NICs busy: the stored cells are those of the ports on the flows' paths (and
    their reverse, which carries ACKs, CNPs and pauses), a small part of ports x samples,
    and the analyzer's figures are those of the dense series."""
    from aifabric.analysis.metrics import run_metrics
    from aifabric.fabric.export import fabric_from_topology

    (tmp_path / "incast.toml").write_text(INCAST)
    r = CliRunner().invoke(main, ["run", str(tmp_path / "incast.toml"), "-o", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    run = Run(tmp_path / "r")
    ps, flows = run.ports(), run.flows()
    fabric = fabric_from_topology(run.topology())
    used = np.unique(flows["path_link"])
    on_paths = {int(p) for link in used for p in (2 * link, 2 * link + 1)}
    stored = {int(p) for p in ps.port[np.unique(ps.port_index)]}
    assert stored and stored <= on_paths
    cells = ps.samples * len(ps.port)
    assert len(on_paths) < fabric.n_ports / 4 and ps.n_entries < cells / 10
    dense_bytes = len(ps.names) * cells * 8
    assert (tmp_path / "r" / "ports.npz").stat().st_size < dense_bytes / 10
    # the figures of the same run with its series stored dense are the same
    dense = tmp_path / "dense"
    import shutil

    shutil.copytree(tmp_path / "r", dense)
    (dense / "ports.parquet").unlink()
    np.savez(dense / "ports.npz", interval_ns=ps.interval_ns, t_ns=ps.t_ns, port=ps.port,
             scale=ps.scale, **{k: ps[k] for k in ps.names})  # fmt: skip
    a = run_metrics(run, series=True).to_dict()
    b = run_metrics(Run(dense), series=True).to_dict()
    a.pop("path"), b.pop("path")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
