"""The command line's startup: the library, numpy and numba load only for commands that use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = (
    "numpy", "numba", "plotly", "scapy", "networkx", "pandas", "dask", "aifabric.fabric.routing",
    "aifabric.traffic", "pyarrow",
)  # fmt: skip
ONE_FLOW = ROOT / "benchmarks" / "one-flow.toml"  # one 4 KiB flow


def probe(code: str) -> str:
    """The standard error of a Python running `code` in the checkout."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stderr


def loaded_after(code: str) -> set[str]:
    last = probe(
        f"import sys\n{code}\n"
        f"print('loaded:', *(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    ).splitlines()[-1]
    return set(last.split()[1:])


def command(*args: str) -> str:
    """Code that runs `aifabric ARGS` as the command does (`aifabric.main`)."""
    return (
        f"sys.argv = ['aifabric', *{list(args)!r}]\n"
        "import aifabric\n"
        "try:\n    aifabric.main()\nexcept SystemExit as e:\n    assert not e.code, e.code"
    )


def test_version_and_help_load_no_library():
    cli = "from aifabric.cli import main\ntry:\n    main([{!r}])\nexcept SystemExit:\n    pass"
    assert loaded_after(cli.format("--version")) == set()
    assert loaded_after(cli.format("--help")) == set()


def test_a_choice_reads_its_table_when_a_command_line_is_parsed():
    code = (
        "from aifabric.cli import main\n"
        "policy = next(p for p in main.commands['ecmp'].params if p.name == 'policy')\n"
        "assert 'aifabric.fabric.routing' not in sys.modules\n"
        "assert policy.type.choices[0] == '5tuple'"
    )
    assert "aifabric.fabric.routing" in loaded_after(code)


def test_a_run_loads_no_plotting_capture_graph_or_table_library(tmp_path):
    loaded = loaded_after(command("run", str(ONE_FLOW), "-o", str(tmp_path / "run")))
    assert {"numba", "aifabric.traffic"} <= loaded  # it did run
    assert "pyarrow" in loaded  # it wrote the Parquet tables, without pandas
    assert loaded.isdisjoint({"plotly", "scapy", "networkx", "pandas", "dask"})


def test_a_warm_run_loads_its_kernels_without_numbas_compiler_tables(tmp_path):
    """numba refreshes its compiler's typing and lowering tables before it loads a cached
    kernel (about 0.06 of a one-flow run's 0.42 CPU s); aifabric.fabric._numba_cache.lean_loads
    skips that, and the run's cached machine code needs none of them."""
    tables = ("numba.np.linalg", "numba.typed.typeddict", "numba.np.polynomial")
    warm = command("run", str(ONE_FLOW), "-o", str(tmp_path / "first"))
    probe(f"import sys\n{warm}")  # compiles on a cold cache (and so refreshes): warm now
    code = (
        f"{command('run', str(ONE_FLOW), '-o', str(tmp_path / 'run'))}\n"
        f"print('loaded:', *(m for m in {tables!r} if m in sys.modules), file=sys.stderr)"
    )
    last = probe(f"import sys\n{code}").splitlines()[-1]
    assert last == "loaded:", last
    first, second = (json.loads((tmp_path / d / "run.json").read_text()) for d in ("first", "run"))
    assert second["status"] == "complete"
    assert (
        second["results"]["summary"]["completion_ns"]
        == first["results"]["summary"]["completion_ns"]
    )


def test_commands_work_with_the_garbage_collector_on(tmp_path):
    """`aifabric.main` stops the collector while the command line loads: a command turns it
    back on before its work, the run once its scenario is loaded."""
    seen = (
        "import gc, sys\n"
        "import aifabric.engines\n"
        "from aifabric.cli import main\n"
        "def run_scenario(*args, **kwargs):\n"
        "    print('run:', gc.isenabled(), file=sys.stderr)\n"
        "    raise SystemExit(0)\n"
        "aifabric.engines.run_scenario = run_scenario\n"
        "@main.command('probe')\n"
        "def probe():\n"
        "    print('probe:', gc.isenabled(), file=sys.stderr)\n"
    )
    run = probe(seen + command("run", str(ONE_FLOW), "-o", str(tmp_path / "run")))
    assert run.splitlines()[-1] == "run: True"
    assert probe(seen + command("probe")).splitlines()[-1] == "probe: True"


# `aifabric ARGS` as the program runs it (`python -m aifabric`), saying on stderr when its
# exit handlers run, which modules were loaded by then, and whether Python tore itself down
PROGRAM = (
    "import atexit, os, runpy, sys\n"
    "def finalizing(event, args, write=os.write):  # Python's teardown (documented events)\n"
    "    if event in ('cpython.PyInterpreterState_Clear', 'cpython._PySys_ClearAuditHooks'):\n"
    "        write(2, b'torn down\\n')\n"
    "sys.addaudithook(finalizing)\n"
    "def exiting():\n"
    "    seen = [m for m in ('scipy', 'yaml', 'numba') if m in sys.modules]\n"
    "    sys.stderr.write(f'exit handlers ran, loaded: {seen}\\n')\n"
    "atexit.register(exiting)\n"
    "sys.argv = ['aifabric', *sys.argv[1:]]\n"
    "runpy.run_module('aifabric', run_name='__main__')\n"
)


def program(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *args], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_a_finished_run_ends_without_pythons_teardown_after_its_exit_handlers(tmp_path):
    """`aifabric run` on the simulator, done, ends the process at once: the exit handlers
    run and the summary is all there, but Python does not tear itself down; a command that
    did not say so, or failed, exits as usual."""
    done = program("run", str(ONE_FLOW), "-o", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("run directory")
    assert "exit handlers ran" in done.stderr and "torn down" not in done.stderr
    version = program("--version")
    assert version.returncode == 0 and version.stdout.strip()
    assert "exit handlers ran" in version.stderr and "torn down" in version.stderr
    refused = program("run", str(ONE_FLOW), "-o", str(tmp_path / "run"))  # exists: refused
    assert refused.returncode != 0 and "torn down" in refused.stderr


def test_the_program_loads_numba_without_scipy_or_yaml_unless_numba_has_a_config_file(tmp_path):
    run = program("run", str(ONE_FLOW), "-o", str(tmp_path / "run"))
    assert "loaded: ['numba']" in run.stderr, run.stderr
    (tmp_path / ".numba_config.yaml").write_text("{}\n")
    run = program("run", str(ONE_FLOW), "-o", str(tmp_path / "again"), cwd=tmp_path)
    assert "loaded: ['yaml', 'numba']" in run.stderr, run.stderr
