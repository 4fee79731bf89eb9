"""Specs drawn by hypothesis (`tests/fuzz_specs.py`) through run, topo show and traffic show:
an answer or one sentence, never a traceback (issue 26).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from aifabric.cli import main
from tests import fuzz_specs

ROOT = Path(__file__).resolve().parent.parent
# no shrinking: a failure is reported as drawn (shrinking a CLI call takes minutes)
PHASES = [Phase.explicit, Phase.generate]


def _spec_through(data, base, values, command) -> None:
    doc = fuzz_specs.spec(data, base, values)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.toml"
        path.write_text(fuzz_specs.toml(doc))
        args = {
            "topo": ["topo", "show", str(path)],
            "traffic": ["traffic", "show", str(path), "--fabric", "lab-small"],
            "run": ["run", str(path), "-o", str(Path(tmp) / "run")],
        }[command]
        result = CliRunner().invoke(main, args)
        problem = fuzz_specs.outcome(result)
        assert problem is None, f"{' '.join(args[:2])} of\n{path.read_text()}\n{problem}"


SPECS = dict(deadline=None, database=None, derandomize=True, phases=PHASES,
             suppress_health_check=[HealthCheck.too_slow])  # fmt: skip


@settings(max_examples=150, **SPECS)
@given(data=st.data())
def test_topo_show_of_a_drawn_topology_is_a_summary_or_one_sentence(data):
    _spec_through(data, fuzz_specs.TOPOLOGY, fuzz_specs.VALUES, "topo")


@settings(max_examples=150, **SPECS)
@given(data=st.data())
def test_traffic_show_of_a_drawn_workload_is_a_table_or_one_sentence(data):
    _spec_through(data, fuzz_specs.WORKLOAD, fuzz_specs.VALUES, "traffic")


@settings(max_examples=25, **SPECS)
@given(data=st.data())
def test_run_of_a_drawn_scenario_is_a_run_or_one_sentence(data):
    _spec_through(data, fuzz_specs.SCENARIO, fuzz_specs.BOUNDED, "run")


@pytest.mark.slow
@settings(max_examples=400, deadline=None, database=None, phases=PHASES)
@given(data=st.data(), command=st.sampled_from(["topo", "traffic", "run", "run"]))
def test_many_drawn_specs_are_each_an_answer_or_one_sentence(data, command):
    base = {"topo": fuzz_specs.TOPOLOGY, "traffic": fuzz_specs.WORKLOAD}.get(
        command, fuzz_specs.SCENARIO
    )
    values = fuzz_specs.BOUNDED if command == "run" else fuzz_specs.VALUES
    _spec_through(data, base, values, command)
