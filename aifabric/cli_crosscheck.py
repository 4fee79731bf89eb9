"""`aifabric crosscheck SCENARIO`: the scenario in both engines, side by side (registered on
import by aifabric.cli; the work is fabric.crosscheck's)."""

from __future__ import annotations

import time

import click

from aifabric.cli import emit_json, json_option, main


@main.command("crosscheck")
@click.argument("scenario")
@click.option(
    "-o", "--output", "output", type=click.Path(file_okay=False),
    help="Folder for the two run directories (sim/, mininet/) and crosscheck.json.",
)  # fmt: skip
@click.option(
    "--switch",
    type=click.Choice(["router", "ovs"]),
    default="router",
    show_default=True,
    help="The emulator's switches; the simulator hashes as they do (policy linux or ovs).",
)
@click.option(
    "--scale", type=click.IntRange(min=1), default=None, metavar="N",
    help="The emulator's rate divisor (default: the emulator's choice).",
)  # fmt: skip
@click.option(
    "--tolerance", type=click.FloatRange(0, 1, min_open=True), default=0.15, show_default=True,
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

    from aifabric.warmup import ensure_warm
    from fabric.crosscheck import crosscheck as run_both
    from fabric.files import write_atomic
    from fabric.overrides import parse_assignment
    from fabric.rundir import remove_run_dir
    from fabric.scenarios import load_scenario

    overrides = [parse_assignment(text) for text in assignments]
    sc = load_scenario(scenario, seed=seed, overrides=overrides)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(output or f"runs/crosscheck-{sc.name}-{stamp}")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise click.ClickException(
                f"{out} is not empty; give another -o or --force to replace its crosscheck"
            )
        unknown = {p.name for p in out.iterdir()} - {"sim", "mininet", "crosscheck.json"}
        if unknown:
            raise click.ClickException(
                f"{out} holds more than a crosscheck ({sorted(unknown)[0]}); not replacing it"
            )
        for name in ("sim", "mininet"):
            remove_run_dir(out / name)
        (out / "crosscheck.json").unlink(missing_ok=True)
    ensure_warm()
    report = run_both(sc, out, switch=switch, scale=scale, tolerance=tolerance)
    import json

    write_atomic(out / "crosscheck.json", json.dumps(report, indent=1) + "\n")
    if as_json:
        emit_json(report)
    else:
        _print(sc, switch, report)
    if report["verdict"] != "agree":
        raise SystemExit(1)  # as diff does: a script can test the verdict


def _print(sc, switch: str, r: dict) -> None:
    from fabric.routing import EMULATOR_POLICY
    from fabric.units import format_rate, format_time

    def t(ns):
        return "-" if ns is None else format_time(ns)

    def x(ratio):
        return "-" if ratio is None else f"x{ratio:.2f}"

    def bw(bps):
        return f"{format_rate(int(bps))}bps" if bps > 0 else "-"

    kind = "Linux routers" if switch == "router" else "Open vSwitch bridges"
    click.echo(
        f"{sc.name}: {sc.fabric.name}, {r['paths']['flows']:,} flows; simulator with policy "
        f"{EMULATOR_POLICY[switch]} against the emulator's {kind}"
    )
    p = r["paths"]
    click.echo(f"paths             {p['equal']:,} of {p['flows']:,} flows equal")
    for d in p["differences"]:
        click.echo(f"  flow {d['flow']}: sim {' '.join(d['sim'])}")
        click.echo(f"  {'':>{len(str(d['flow'])) + 5}} mininet {' '.join(d['mininet'])}")
    for c in r["collectives"]:
        label = c["kind"] if c["algorithm"] in ("", "-") else f"{c['kind']} {c['algorithm']}"
        b = c["busbw_bps"]
        click.echo(
            f"{label:<17} sim {t(c['time_ns']['sim'])}  mininet {t(c['time_ns']['mininet'])}"
            f"  ({x(c['ratio'])})  busbw {bw(b['sim'])} / {bw(b['mininet'])}"
            f"  {'ok' if c['within'] else 'OUTSIDE'}"
        )
    ups = [u for u in r["uplinks"] if u["judged"]]
    if ups:
        worst = max(ups, key=lambda u: abs((u["ratio"] or 0) - 1))
        off = sum(not u["within"] for u in ups)
        click.echo(
            f"uplink bytes      {len(ups)} uplinks carried data, {off} outside; furthest "
            f"{worst['port']} {worst['bytes']['sim']:,} / {worst['bytes']['mininet']:,} "
            f"({x(worst['ratio'])})"
        )
    tot = r["totals"]
    click.echo(f"completion        sim {t(tot['completion_ns']['sim'])}  "
               f"mininet {t(tot['completion_ns']['mininet'])}")  # fmt: skip
    click.echo(f"ECN marks         sim {tot['ecn_marked']['sim'] or 0:,}  "
               f"mininet {tot['ecn_marked']['mininet'] or 0:,}")  # fmt: skip
    click.echo(f"PFC paused        sim {t(tot['paused_ns_total']['sim'] or 0)}  "
               f"mininet {t(tot['paused_ns_total']['mininet'] or 0)}")  # fmt: skip
    click.echo(f"drops             sim {tot['drops']['sim'] or 0:,}  "
               f"mininet {tot['drops']['mininet'] or 0:,}")  # fmt: skip
    why = f": {'; '.join(r['reasons'])}" if r["reasons"] else ""
    click.echo(f"verdict           {r['verdict']} (tolerance {r['tolerance']:.0%}){why}")
    click.echo(f"run directories   {r['sim']}  {r['mininet']}")
