"""ARCHITECTURE.md's recipes hold: a new topology kind is two files, a new collective one.

Each test makes the change the recipe describes, and nothing else, and then uses the new
kind where a user would: a topology kind through a scenario run on the simulator and
analysed; a collective through `aifabric traffic show`, the flow generator and the
busbw an engine records.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aifabric.analysis.metrics import run_metrics
from aifabric.engines import run_scenario
from aifabric.fabric.checkout import FOLDERS
from aifabric.fabric.model import Role
from aifabric.fabric.rundir import Run
from aifabric.scenarios import scenario_from_dict
from aifabric.topologies import builders, load_fabric
from aifabric.topologies import spec as topo_spec

ROOT = Path(__file__).resolve().parent.parent

SINGLE_SWITCH = """\
[fabric]
kind = "single-switch"

[servers]
gpus_per_server = 2
servers_per_rack = 3

[links]
rate = "100G"
"""


def _single_switch(spec):
    """Every NIC on one switch: what topologies/builders.py would hold for the new kind."""
    p = builders._Plan(spec)
    builders._racks(p, 0, 1)
    return p.done()


def test_a_new_topology_kind_is_two_files(monkeypatch, tmp_path):
    # topologies/spec.py: the kind and the tables it takes
    monkeypatch.setitem(topo_spec.KINDS, "single-switch", ("servers",))
    # topologies/builders.py: the builder and its line in _BUILDERS
    monkeypatch.setitem(builders._BUILDERS, "single-switch", _single_switch)
    path = tmp_path / "single.toml"
    path.write_text(SINGLE_SWITCH)
    fabric = load_fabric(path)
    assert fabric.kind == "single-switch" and len(fabric.nic_ids) == 6
    assert [Role(int(r)) for r in fabric.node_role].count(Role.RTSW) == 1
    raw = {
        "scenario": {"topology": str(path), "seed": 1},
        "workload": {"collective": "allreduce", "size": "1MiB"},
        "congestion_control": {"kind": "none"},
    }
    sc = scenario_from_dict(raw, "single")
    out = tmp_path / "run"
    summary = run_scenario("sim", sc, out)
    assert summary["status"] == Run(out).status == "complete"
    assert summary["flows_done"] == summary["flows"] == len(sc.flows) > 0
    metrics = run_metrics(Run(out)).to_dict()
    [op] = metrics["collectives"]["ops"]
    assert op["kind"] == "allreduce" and op["ranks"] == 6 and op["busbw_bps"] > 0
    assert summary["max_queue_port"] in fabric.port_names


GATHER = '''

class Gather(Collective):
    """Every rank but the root sends its `size` bytes to rank 0 in one step."""

    name = "gather"
    algorithms = ("direct",)
    rails_split = False

    def busbw_factor(self, n):
        return (n - 1) / n

    def transfers(self, algorithm, n, size, shape):
        m = n - 1
        z32 = np.zeros(m, dtype=_I32)
        return Transfers(
            np.arange(1, n, dtype=_I32), z32, z32, z32, np.full(m, size, dtype=_I64),
            np.zeros(m + 1, dtype=_I64), np.zeros(0, dtype=_I64), 1,
        )

    def channel_count(self, algorithm, n, size, shape):
        return n - 1

    def channel_bytes(self, algorithm, n, size, shape, sent, recv):
        sent[1:] += size
        recv[0] += (n - 1) * size

    def steps(self, algorithm, n, size, shape):
        return 1

'''

USE_GATHER = """
import json
import numpy as np
from aifabric.fabric.completion import collective_records
from aifabric.topologies import load_fabric
from aifabric.traffic import generate, workload_from_dict

fabric = load_fabric("lab-small")
flows = generate(fabric, workload_from_dict({"collective": "gather", "gpus": 5, "size": "1MiB"},
                                            "g"))
ends = np.arange(1, len(flows) + 1) * 1000
coll = collective_records(flows, np.zeros(len(flows), dtype=np.int64), ends)
print(json.dumps({
    "kinds": [str(k) for k in flows.op_kind], "flows": len(flows),
    "bytes": int(flows.bytes.sum()), "factor": float(flows.op_busbw_factor[0]),
    "algbw": float(coll["algbw_bps"][0]), "busbw": float(coll["busbw_bps"][0]),
}))
"""


def test_a_new_collective_is_one_file(tmp_path):
    """In a copy of the sources whose only change is a Collective subclass and its line in
    `KINDS` (traffic/collectives.py), the command line, the workload keys, the closed forms,
    the generator and the engines' busbw all know the new kind."""
    for folder in FOLDERS.values():
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__py*"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    source = tmp_path / "traffic" / "collectives.py"
    text = source.read_text()
    table = "\nKINDS: dict[str, Collective] = {"
    registered = "Broadcast(), SendRecv())"
    assert text.count(table) == 1 and text.count(registered) == 1
    text = text.replace(table, GATHER + table).replace(
        registered, "Broadcast(), SendRecv(), Gather())"
    )
    source.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "nb")}

    def python(*args):
        r = subprocess.run(
            [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    shown = python(
        "-m", "aifabric", "traffic", "show", "gather", "--algorithm", "direct",
        "--gpus", "5", "--size", "1MiB", "--fabric", "lab-small",
    )  # fmt: skip
    assert "gather" in shown and "0.800" in shown  # busbw factor (n - 1) / n
    used = json.loads(python("-c", USE_GATHER))
    assert set(used["kinds"]) == {"gather"}
    assert used["flows"] == 4 and used["bytes"] == 4 * 2**20
    assert used["factor"] == pytest.approx(0.8)
    assert used["busbw"] == pytest.approx(used["algbw"] * 0.8) and used["algbw"] > 0
