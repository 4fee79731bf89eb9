"""`aifabric run ...`: scenarios on an engine (registered on import by aifabric.cli)."""

from __future__ import annotations

import signal
import sys
import time

import click

from aifabric.cli import emit_json, json_option, main


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _progress_printer():
    """A one-line progress indication on stderr, redrawn at most 5 times a second."""
    last = [0.0]

    def show(p) -> None:
        from fabric.units import format_time

        t = time.monotonic()
        if t - last[0] < 0.2:
            return
        last[0] = t
        sys.stderr.write(
            f"\r  simulated {format_time(p.now_ns):>9}  flows {p.flows_done:,}/{p.flows:,}"
            f"  events {p.events:,}   "
        )
        sys.stderr.flush()

    return show


@main.command("run")
@click.argument("scenario")
@click.option(
    "-o", "--output", "output", type=click.Path(file_okay=False), help="Run directory to write."
)
@click.option(
    "--engine",
    type=click.Choice(["sim", "mininet"]),
    default="sim",
    show_default=True,
    help="The packet simulator, or the Mininet emulator (root).",
)
@click.option(
    "--capture",
    "captures",
    multiple=True,
    metavar="PORT",
    help="Capture a port to captures/*.pcap: node:peer, node:N or a NIC (repeatable).",
)
@click.option(
    "--switch",
    type=click.Choice(["router", "ovs"]),
    default=None,
    help="Mininet engine: switches as Linux routers (default) or Open vSwitch bridges.",
)
@click.option(
    "--scale",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Mininet engine: divide link rates by N (time stretches by N). Default: the fastest "
    "link at 20 Mb/s, slower if the replay could not keep up with every sender.",
)
@click.option("--seed", type=int, default=None, help="Override the scenario's seed.")
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a key of the scenario's tables, e.g. ecmp.policy=eecmp (repeatable).",
)
@click.option("--force", is_flag=True, help="Replace the output directory if it exists.")
@json_option
def run(scenario, output, engine, captures, switch, scale, seed, assignments, force, as_json):
    """Run SCENARIO (a scenario preset or a TOML file) and write a run directory."""
    from dataclasses import replace
    from pathlib import Path

    from fabric.overrides import parse_assignment
    from fabric.rundir import RunWriter, remove_run_dir
    from fabric.sim.scenario_spec import load_scenario, resolve_port

    if switch is not None and engine != "mininet":
        raise click.UsageError("--switch applies to --engine mininet only")
    if scale is not None and engine != "mininet":
        raise click.UsageError("--scale applies to --engine mininet only")
    if engine == "mininet":
        try:
            from fabric.emu import run_scenario as run_engine
        except ImportError:
            raise click.ClickException(
                "The Mininet engine is not available in this installation."
            ) from None
    else:
        from fabric.sim.run import run_scenario as run_engine

    overrides = [parse_assignment(text) for text in assignments]
    sc = load_scenario(scenario, seed=seed, overrides=overrides)
    names = [c for item in captures for c in item.split(",") if c]
    if names:
        sc = replace(sc, captures=tuple(dict.fromkeys((*sc.captures, *names))))
    for name in sc.captures:
        resolve_port(sc.fabric, name)
    path = Path(output or f"runs/{sc.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    if force:
        remove_run_dir(path)
    writer = RunWriter(path, engine, sc.to_dict())
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `kill` ends the run like Ctrl-C
    try:
        if engine == "mininet":
            summary = run_engine(sc, writer, switch=switch or "router", scale=scale)
        else:
            summary = run_engine(sc, writer, progress=_progress_printer())
            sys.stderr.write("\n")
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = dict(summary or {})
    summary["run_dir"] = str(path)
    if as_json:
        emit_json(summary)
        return
    _print_summary(sc, summary)


def _print_summary(sc, s: dict) -> None:
    from fabric.units import format_rate, format_size, format_time

    status = s.get("status", "complete")
    click.echo(f"{sc.name}: {sc.fabric.name}, {s.get('flows', 0):,} flows, {sc.cc}, {sc.ecmp} ECMP")
    if status != "complete":
        click.echo(f"status            {status}")
    if s.get("completion_ns") is not None:
        click.echo(f"completion time   {format_time(s['completion_ns'])}")
    click.echo(f"flows done        {s.get('flows_done', 0):,} of {s.get('flows', 0):,}")
    for op in s.get("collectives", []):
        if op["time_ns"] is None:
            continue
        label = op["kind"] if op["algorithm"] in ("", "-") else f"{op['kind']} {op['algorithm']}"
        click.echo(
            f"{label:<17} {format_size(op['bytes'])} x {op['ranks']} ranks"
            f"  {format_time(op['time_ns'])}  busbw {format_rate(int(op['busbw_bps']))}bps"
        )
    where = f" at {s['max_queue_port']}" if s.get("max_queue_port") else ""
    click.echo(f"max queue         {format_size(s.get('max_queue_bytes', 0))}{where}")
    click.echo(f"ECN marks         {s.get('ecn_marked', 0):,} ({s.get('cnp_sent', 0):,} CNPs)")
    click.echo(
        f"PFC pauses        {s.get('pfc_frames', 0):,} frames, "
        f"{format_time(s.get('paused_ns_total', 0))} paused"
    )
    click.echo(f"drops             {s.get('drops', 0):,}")
    click.echo(f"run directory     {s['run_dir']}")
