"""The command line's startup: the library, numpy and numba load only for commands that use them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "numba", "plotly", "scapy", "networkx", "fabric.routing", "traffic")


def loaded_after(code: str) -> set[str]:
    probe = (
        f"import sys\n{code}\n"
        f"print('loaded:', *(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(out.stderr.splitlines()[-1].split()[1:])


def test_version_and_help_load_no_library():
    cli = "from aifabric.cli import main\ntry:\n    main([{!r}])\nexcept SystemExit:\n    pass"
    assert loaded_after(cli.format("--version")) == set()
    assert loaded_after(cli.format("--help")) == set()


def test_a_choice_reads_its_table_when_a_command_line_is_parsed():
    code = (
        "from aifabric.cli import main\n"
        "policy = next(p for p in main.commands['ecmp'].params if p.name == 'policy')\n"
        "assert 'fabric.routing' not in sys.modules\n"
        "assert policy.type.choices[0] == '5tuple'"
    )
    assert "fabric.routing" in loaded_after(code)


def test_the_run_path_loads_no_plotting_capture_or_graph_library():
    code = (
        "import aifabric.cli\n"
        "import aifabric.cli_run\n"
        "from fabric.engines import engine, run_scenario\n"
        "engine('sim')\n"
        "from fabric.scenarios import load_scenario"
    )
    assert loaded_after(code).isdisjoint({"plotly", "scapy", "networkx"})
