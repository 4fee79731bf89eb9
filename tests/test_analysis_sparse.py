"""The analysis reads a run's port series from their entries alone (issue 27): every figure
it computes from them equals the same figure computed here, independently, from the dense
[samples, ports] arrays, on every scenario preset (the demo among them) and on a run with a
drain plan; and `analyze --series`, `compare`, the report and the ports table run without
`PortSamples.dense` on the multi-job demo."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import aifabric
from aifabric.analysis import frames
from aifabric.analysis import report as report_module
from aifabric.analysis.metrics import run_metrics
from aifabric.cli import main
from aifabric.fabric.export import fabric_from_topology
from aifabric.fabric.portseries import PortSamples
from aifabric.fabric.rundir import Run
from tests import analyze_outputs as A
from tests.conftest import run_scenario
from tests.test_maintenance import SMALL as WAVES


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse")
    out = {}
    for preset in A.presets():
        A.simulate(preset, root / preset)
        out[preset] = Run(root / preset)
    (root / "waves").mkdir()
    out["waves"] = Run(run_scenario(root / "waves", WAVES))
    return out


NAMES = [*A.presets(), "waves"]


def dense(ps: PortSamples) -> dict[str, np.ndarray]:
    """Every series of `ps` as [samples, ports], 0 in the cells without an entry."""
    out = {}
    for name, values in ps.entries.items():
        a = np.zeros((len(ps.t_ns), len(ps.port)), dtype=values.dtype)
        a[ps.sample_index, ps.port_index] = values
        out[name] = a
    return out


def close(got, want) -> bool:
    """Equal but for rounding (figures, lists of them, or lists of rows)."""
    a, b = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-12, atol=1e-9)


def _receivers(fabric, flows, job, port) -> list[int]:
    col = {int(p): j for j, p in enumerate(port)}
    dst = np.unique(flows["dst"][flows["job"] == job])
    return [col[int(fabric.nic_port[d]) ^ 1] for d in dst if int(fabric.nic_port[d]) ^ 1 in col]


def _read(run: Run):
    """The run, its fabric, its port series and their dense arrays."""
    ps = run.ports()
    return run, fabric_from_topology(run.topology()), ps, dense(ps)


@pytest.mark.parametrize("name", NAMES)
def test_every_port_figure_is_the_dense_arrays_figure(runs, name):
    run, fabric, ps, d = _read(runs[name])
    m = run_metrics(run, series=True)
    port = ps.port.astype(np.int64)
    samples, interval = len(ps.t_ns), ps.interval_ns
    rate = fabric.port_rate_bps[port].astype(np.float64)
    tx, qmax = d["tx_bytes"].astype(np.int64), d["qdepth_max_bytes"].astype(np.float64)
    # a port that queued in some samples and not in others: leaving out the samples
    # without an entry would change its distribution
    assert ((qmax > 0).any(axis=0) & (qmax == 0).any(axis=0)).any()

    rows = m.congestion.per_port
    assert [r.port_id for r in rows] == port.tolist()
    for j, r in enumerate(rows):
        q = qmax[:, j]
        p50, p90, p99 = np.percentile(q, [50, 90, 99])
        assert r.tx_bytes == tx[:, j].sum(), r.port
        assert close(r.utilization, tx[:, j].sum() * 8e9 / (samples * interval) / rate[j])
        assert close(r.peak_utilization, tx[:, j].max() * 8e9 / interval / rate[j])
        got = r.qdepth_bytes
        assert got.count == samples, r.port
        assert close([got.mean, got.p50, got.p90, got.p99, got.max],
                     [q.mean(), p50, p90, p99, q.max()]), r.port  # fmt: skip
        assert close(r.queue_delay_max_ns, q.max() * 8e9 / rate[j])
        mean = d["qdepth_mean_bytes"][:, j].astype(np.float64).mean()
        assert close(r.queue_delay_mean_ns, mean * 8e9 / rate[j]), r.port
        assert r.ecn_marked == d["ecn_marked"][:, j].sum()
        assert r.paused_ns == d["paused_ns"][:, j].sum()
        assert close(r.paused_fraction, d["paused_ns"][:, j].sum() / (samples * interval))
        assert r.pfc_sent == d["pfc_sent"][:, j].sum() and r.drops == d["drops"][:, j].sum()
    c = m.congestion
    assert (c.samples, c.ports) == (samples, len(port))
    assert c.qdepth_max_bytes == qmax.max()
    assert c.paused_ports == np.count_nonzero(d["paused_ns"].sum(axis=0))
    assert (c.ecn_marked, c.paused_ns) == (d["ecn_marked"].sum(), d["paused_ns"].sum())
    assert (c.pfc_frames, c.drops) == (d["pfc_sent"].sum(), d["drops"].sum())

    s = m.series
    assert close(s.utilization, (tx * 8e9 / interval / rate).T.tolist())
    assert s.qdepth_max_bytes == tuple(tuple(r) for r in d["qdepth_max_bytes"].T.tolist())
    for key in ("ecn_marked", "paused_ns", "pfc_sent", "cnp_sent"):
        if key in d:
            assert list(getattr(s, key)) == d[key].sum(axis=1).tolist(), key
    assert list(s.paused_ports) == np.count_nonzero(d["paused_ns"], axis=1).tolist()


@pytest.mark.parametrize("name", NAMES)
def test_throughput_and_waves_are_the_dense_arrays_figures(runs, name):
    run, fabric, ps, d = _read(runs[name])
    flows = run.flows()
    tx = d["tx_bytes"].astype(np.int64)
    m = run_metrics(run, series=True)
    port = ps.port.astype(np.int64)
    interval = ps.interval_ns
    t_ns = ps.t_ns.astype(np.int64)
    th = m.throughput
    assert th.jobs
    for job in th.jobs:
        cols = _receivers(fabric, flows, job.job, port)
        rx = tx[:, cols].sum(axis=1)
        cap = fabric.port_rate_bps[port[cols]].astype(np.float64).sum()
        assert job.receivers == len(cols) and job.rx_bytes == rx.sum()
        assert list(job.rx_bytes_per_interval) == rx.tolist(), job.name
        assert close(job.utilization, (rx * 8e9 / interval / cap).tolist())
        for w in (w for w in th.low_intervals if w.job == job.job):
            a = int(np.flatnonzero(t_ns == w.start_ns)[0])
            want = rx[a : a + w.intervals].sum() * 8e9 / (w.intervals * interval)
            assert close(w.rx_bps, want), w
    total = tx.sum(axis=0)
    order = [j for j in np.argsort(-total, kind="stable")[: len(th.busiest)]]
    assert [b.port for b in th.busiest] == [fabric.port_name(int(port[j])) for j in order]
    for b, j in zip(th.busiest, order, strict=True):
        assert b.tx_bytes == total[j] and list(b.tx_bytes_per_interval) == tx[:, j].tolist()
        assert close(b.utilization, (tx[:, j] * 8e9 / interval / fabric.port_rate_bps[port[j]]))
    assert len(th.busiest) == min(10, np.count_nonzero(total))
    for w in m.waves or ():
        inside = (t_ns >= w.drain_ns) & (t_ns + interval <= w.restore_ns)
        for job in w.jobs:
            cols = _receivers(fabric, flows, job.job, port)
            want = tx[inside][:, cols].sum() * 8e9 / (inside.sum() * interval) / len(cols)
            assert close(job.rx_bps, want), (w.wave, job.name)
    assert (m.waves is not None) == (name == "waves")


@pytest.mark.parametrize("name", NAMES)
def test_the_reports_queue_rows_are_the_dense_arrays_rows(runs, name):
    run = runs[name]
    ps = run.ports()
    qmax = dense(ps)["qdepth_max_bytes"]
    m = run_metrics(run, series=True, per_port=False)
    fig = report_module._heatmap(m.series, m, ps)
    column = {n: j for j, n in enumerate(m.series.ports)}
    if not fig.data:
        assert not qmax.any()
        return
    (heat,) = fig.data
    for label, row in zip(heat.y, heat.customdata, strict=True):
        assert list(row) == qmax[:, column[label]].tolist(), label


@pytest.mark.parametrize("name", NAMES)
def test_the_ports_table_is_the_entries_and_every_cell_on_request(runs, name):
    run, fabric, ps, d = _read(runs[name])
    cells = frames.ports(run, fabric, every_cell=True)
    samples, n = len(ps.t_ns), len(ps.port)
    assert len(cells) == samples * n
    assert cells["t_ns"].tolist() == np.repeat(ps.t_ns, n).tolist()
    assert cells["port"].tolist() == [fabric.port_name(int(p)) for p in np.tile(ps.port, samples)]
    for key, a in d.items():
        assert cells[key].tolist() == a.reshape(-1).tolist(), key
    rate = fabric.port_rate_bps[np.tile(ps.port, samples)]
    want = d["tx_bytes"].reshape(-1) * 8e9 / ps.interval_ns / rate
    assert np.allclose(cells["utilization"], want, rtol=1e-12, atol=0)
    # the default: those rows in which anything is not 0, in the same order
    active = np.zeros(samples * n, dtype=bool)
    for a in d.values():
        active |= a.reshape(-1) != 0
    entries = frames.ports(run, fabric)
    assert len(entries) == active.sum() == ps.n_entries < len(cells)
    pd.testing.assert_frame_equal(entries, cells[active].reset_index(drop=True))
    assert entries.attrs == {"samples": samples, "interval_ns": ps.interval_ns}
    mean = entries.groupby("port", observed=False)["utilization"].sum() / samples
    want = cells.groupby("port", observed=False)["utilization"].mean()
    assert np.allclose(mean[want.notna()], want.dropna(), rtol=1e-12, atol=0)


def test_the_analysis_never_builds_a_dense_series(runs, tmp_path, monkeypatch):
    """`analyze` (text, --json --series), `compare`, the report, `aifabric.Run`'s metrics and
    its ports table on the two-job demo and on the run with waves, with `dense` refused."""

    def refuse(self, name):
        raise AssertionError(f"the dense {name} was built")

    monkeypatch.setattr(PortSamples, "dense", refuse)
    demo, waves = runs["demo"], runs["waves"]
    with pytest.raises(AssertionError):
        demo.ports()["tx_bytes"]
    assert len(demo.meta["scenario"]["workload"]["jobs"]) == 2
    for run in (demo, waves):
        path, html = str(run.path), str(tmp_path / f"{run.path.parent.name}.html")
        for args in (["analyze", path], ["analyze", path, "--json", "--series"],
                     ["report", path, "-o", html]):  # fmt: skip
            r = CliRunner().invoke(main, args)
            assert r.exit_code == 0, (args, r.output, r.exception)
        api = aifabric.Run(path)
        assert api.metrics(series=True).series.utilization
        assert len(api.ports) == run.ports().n_entries
    r = CliRunner().invoke(main, ["compare", str(demo.path), str(waves.path)])
    assert r.exit_code == 0, (r.output, r.exception)
