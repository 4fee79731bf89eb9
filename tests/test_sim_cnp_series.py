"""The simulator's per-port CNP series (ports.npz `cnp_sent`): where and when CNPs go out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.analysis.metrics import run_metrics
from aifabric.cli import main
from aifabric.fabric.export import fabric_from_topology
from aifabric.fabric.rundir import OPTIONAL_PORT_SERIES, PORT_SERIES, Run, RunWriter
from aifabric.sim.layout import SM_N

# incast-pfc with DCQCN, smaller: 7 NICs of one rack send 512 KB each to the 8th
INCAST_DCQCN = """
[scenario]
topology = "lab-medium"
seed = 1
sample_interval = "5us"

[workload]
pattern = "incast"
senders = 7
size = "512KB"
gpus = 8

[congestion_control]
kind = "dcqcn"
"""


@pytest.fixture(scope="module")
def incast(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("cnp")
    (folder / "incast.toml").write_text(INCAST_DCQCN)
    r = CliRunner().invoke(main, ["run", str(folder / "incast.toml"), "-o", str(folder / "run")])
    assert r.exit_code == 0, r.output
    return Run(folder / "run")


def test_cnp_series_sums_to_the_run_total(incast):
    ports = incast.ports()
    total = incast.meta["results"]["counters"]["cnp_sent"]
    assert total > 0  # the incast congests the receiver's port: ECN marks, so CNPs
    assert ports["cnp_sent"].shape == ports["tx_bytes"].shape
    assert int(ports["cnp_sent"].sum()) == total
    assert (ports["cnp_sent"] >= 0).all()
    assert ports["cnp_sent"].sum(axis=1).astype(bool).sum() > 1  # spread over time


def test_cnps_go_out_on_the_receiving_nic_port_only(incast):
    fabric = fabric_from_topology(incast.topology())
    ports, flows = incast.ports(), incast.flows()
    receivers = np.unique(flows["dst"])
    assert len(receivers) == 1
    (column,) = np.nonzero(ports["cnp_sent"].sum(axis=0))[0]
    assert int(ports["port"][column]) == int(fabric.nic_port[receivers[0]])
    # the CNPs are on the wire of that port: its bytes sent include them
    sent = ports["tx_bytes"][:, column]
    assert (sent[ports["cnp_sent"][:, column] > 0] > 0).all()


def test_the_analysis_cnp_trace_is_the_series(incast):
    m = run_metrics(incast, series=True).to_dict()
    per_sample = incast.ports()["cnp_sent"].sum(axis=1)
    assert m["series"]["cnp_sent"] == per_sample.tolist()
    assert m["cnp_sent"] == int(per_sample.sum())
    assert m["congestion"]["cnp_sent"] == m["cnp_sent"]


def test_the_sample_memory_estimate_counts_every_series_written(incast):
    ports = incast.ports()
    written = [k for k in PORT_SERIES + OPTIONAL_PORT_SERIES if k in ports]
    assert written == list(PORT_SERIES + OPTIONAL_PORT_SERIES)
    rows, n_ports = ports["tx_bytes"].shape
    # aifabric.sim.engine.sample_memory_problem counts SM_N series of 8 bytes a port and sample
    assert sum(ports[k].nbytes for k in written) == rows * n_ports * SM_N * 8


def test_port_series_outside_the_run_format_are_refused(tmp_path: Path):
    writer = RunWriter(tmp_path / "r", "sim", {})
    shape = (2, 3)
    known = {k: np.zeros(shape, dtype=np.int64) for k in PORT_SERIES + OPTIONAL_PORT_SERIES}
    common = {"interval_ns": 1000, "t_ns": np.array([0, 1000]), "port": np.arange(3)}
    with pytest.raises(ValueError, match="cnp_received are not in the run format"):
        writer.ports(**common, **known, cnp_received=np.zeros(shape, dtype=np.int64))
    writer.ports(**common, **known)
    assert set(np.load(tmp_path / "r" / "ports.npz")) >= set(known)
    writer.finish("complete")
