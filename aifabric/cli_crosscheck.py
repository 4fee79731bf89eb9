"""`aifabric crosscheck SCENARIO`: the scenario in both engines, side by side (registered on
import by aifabric.cli; the work is aifabric.experiments.crosscheck's)."""

from __future__ import annotations

import time

import click

from aifabric.cli import emit_json, emulated_switches, json_option, main
from aifabric.params import Fraction, choice


@main.command("crosscheck")
@click.argument("scenario")
@click.option(
    "-o", "--output", "output", type=click.Path(file_okay=False),
    help="Folder for the two run directories (sim/, mininet/) and crosscheck.json.",
)  # fmt: skip
@click.option(
    "--switch",
    type=choice(emulated_switches),
    default="router",
    show_default=True,
    help="The emulator's switches; the simulator hashes as they do (policy linux or ovs).",
)
@click.option(
    "--scale", type=click.IntRange(min=1), default=None, metavar="N",
    help="The emulator's rate divisor (default: the emulator's choice).",
)  # fmt: skip
@click.option(
    "--tolerance", type=Fraction(), default=0.15, show_default=True,
    help="How far (a fraction) the emulator's completion times and uplink bytes may be from "
    "the simulator's.",
)  # fmt: skip
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Override the seed.")
@click.option(
    "--set", "assignments", multiple=True, metavar="KEY=VALUE",
    help="Override a key of the scenario's tables (repeatable).",
)  # fmt: skip
@click.option("--force", is_flag=True, help="Replace the output folder's earlier crosscheck.")
@json_option
def crosscheck(scenario, output, switch, scale, tolerance, seed, assignments, force, as_json):
    """Run SCENARIO in the simulator and the emulator with matching hash policies and
    compare them: every flow's path, each collective's completion and busbw, bytes per
    uplink, ECN marks, PFC pause time, drops; a verdict (exit 1 when they differ)."""
    from pathlib import Path

    from aifabric.experiments.crosscheck import clear_output
    from aifabric.experiments.crosscheck import crosscheck as run_both
    from aifabric.fabric.files import write_atomic
    from aifabric.scenarios import load_scenario
    from aifabric.scenarios.overrides import parse_assignment
    from aifabric.warmup import ensure_warm

    overrides = [parse_assignment(text) for text in assignments]
    sc = load_scenario(scenario, seed=seed, overrides=overrides)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(output or f"runs/crosscheck-{sc.name}-{stamp}")
    clear_output(out, force=force)
    ensure_warm()
    report = run_both(sc, out, switch=switch, scale=scale, tolerance=tolerance)
    import json

    write_atomic(out / "crosscheck.json", json.dumps(report, indent=1) + "\n")
    if as_json:
        emit_json(report)
    else:
        from aifabric.analysis.render import crosscheck_text

        click.echo(crosscheck_text(report, sc.name, sc.fabric.name, switch))
    if report["verdict"] != "agree":
        raise SystemExit(1)  # as diff does: a script can test the verdict
