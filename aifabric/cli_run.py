"""`aifabric run ...`: a scenario on an engine (registered on import by aifabric.cli).

The command knows no engine: it loads the scenario, hands it to
`aifabric.engines.run_scenario` with the engine's name and the engine options
given, and prints the summary.
"""

from __future__ import annotations

import sys
import time

import click

from aifabric.cli import (
    emit_json,
    emulated_switches,
    json_option,
    loaded,
    main,
    nothing_to_tear_down,
    notice_compiles,
)
from aifabric.params import choice


def _engine_names():
    from aifabric.engines import ENGINES

    return ENGINES


class RunCommand(click.Command):
    """`--capture A B C`: every value up to the next option (click takes one per option).
    Not `aifabric.cli.Command`: the run collects garbage once its scenario is loaded."""

    def parse_args(self, ctx, args):
        out: list[str] = []
        rest = list(args)
        while rest:
            arg = rest.pop(0)
            out.append(arg)
            if arg == "--":
                out.extend(rest)
                break
            if arg == "--capture":
                if rest:
                    out.append(rest.pop(0))
                while rest and not rest[0].startswith("-"):
                    out.extend(["--capture", rest.pop(0)])
        return super().parse_args(ctx, out)


class _ProgressPrinter:
    """The run's progress on stderr, redrawn at most 5 times a second; the last one is final.
    On a terminal a rich progress bar of the flows done, with the simulated time and the
    events so far; otherwise one line per update (a log keeps each)."""

    def __init__(self):
        self.last = 0.0
        self.bar = None
        self.task = None

    def __call__(self, p, final: bool = False) -> None:
        from aifabric.fabric.units import format_time

        t = time.monotonic()
        if not final and t - self.last < 0.2:
            return
        self.last = t
        so_far = f"simulated {format_time(p.now_ns):>9}  events {p.events:,}"
        if not sys.stderr.isatty():
            sys.stderr.write(f"  {so_far}  flows {p.flows_done:,}/{p.flows:,}\n")
            sys.stderr.flush()
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("  flows"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[so_far]}"), console=Console(stderr=True),
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task("flows", total=p.flows, so_far=so_far)
        self.bar.update(self.task, completed=p.flows_done, so_far=so_far)
        if final:
            self.close()

    def close(self) -> None:
        """Give the terminal back (also when the run stops early)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


FLAGS = {"max_wall_s": "--max-wall"}  # engine option -> its flag, where the names differ


def _engine_options(name: str, given: dict) -> dict:
    """The engine options given, checked against what engine `name` takes (usage error)."""
    from aifabric.engines import engine, takers

    takes = engine(name).options
    for key, value in given.items():
        if value is not None and key not in takes:
            flag = FLAGS.get(key, f"--{key}")
            raise click.UsageError(f"{flag} applies to --engine {' or '.join(takers(key))} only")
    return {k: v for k, v in given.items() if v is not None}


@main.command("run", cls=RunCommand)
@click.argument("scenario")
@click.option(
    "-o", "--output", "output", type=click.Path(file_okay=False), help="Run directory to write."
)
@click.option(
    "--engine",
    "engine_name",
    type=choice(_engine_names),
    default="sim",
    show_default=True,
    help="The packet simulator, or the Mininet emulator (root).",
)
@click.option(
    "--capture",
    "captures",
    multiple=True,
    metavar="PORT...",
    help="Capture ports to captures/PORT.pcap: every name up to the next option (or "
    "comma-separated), each a port name node--peer or a NIC.",
)
@click.option(
    "--switch",
    type=choice(emulated_switches),
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
@click.option(
    "--max-wall",
    "max_wall",
    type=click.IntRange(min=1),
    default=None,
    metavar="SECONDS",
    help="Mininet engine: refuse a scenario whose replay is estimated to take longer than "
    "this (default 600).",
)
@click.option("--seed", type=click.IntRange(min=0), default=None, help="Override the seed.")
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a key of the scenario's tables, e.g. ecmp.policy=eecmp (repeatable).",
)
@click.option("--force", is_flag=True, help="Replace the output directory if it is a run's.")
@json_option
@click.pass_context
def run(
    ctx,
    scenario,
    output,
    engine_name,
    captures,
    switch,
    scale,
    max_wall,
    seed,
    assignments,
    force,
    as_json,
):
    """Run SCENARIO (a scenario preset or a TOML file) and write a run directory."""
    from pathlib import Path

    from aifabric.api import default_output, scenario_of
    from aifabric.engines import EXIT_INTERRUPTED, Interrupted, Stop, run_scenario
    from aifabric.fabric.rundir import check_run_dir, remove_run_dir
    from aifabric.scenarios.overrides import parse_assignment
    from aifabric.warmup import ensure_warm

    options = _engine_options(
        engine_name, {"switch": switch, "scale": scale, "max_wall_s": max_wall}
    )
    if output is not None and not output.strip():
        raise click.UsageError("-o '' names no run directory")
    if any(not c.strip() for item in captures for c in item.split(",")):
        raise click.UsageError("--capture: an empty name names no port")
    if output:
        check_run_dir(output, replace=force)
    stop = Stop()
    with stop.handling():
        try:
            stop.enter("load", "abortable")
            overrides = [parse_assignment(text) for text in assignments]
            sc = scenario_of(scenario, seed=seed, overrides=overrides, captures=captures)
            loaded()
            stop.enter("compile", "compiling")
            ensure_warm(should_stop=stop.is_set)  # an empty kernel cache: compile it all now
            stop.enter("load", "abortable")  # raises if a signal came while compiling
            notice_compiles()  # and any compile after
            path = Path(output) if output else default_output(sc)
            if force:
                stop.enter("replace", "shielded")
                remove_run_dir(path)  # only now: a mistake above keeps the old run
                stop.enter("load", "abortable")
            printer = _ProgressPrinter()
            try:
                summary = run_scenario(
                    engine_name,
                    sc,
                    path,
                    options=options,
                    progress=printer,
                    stop=stop,
                    notify=lambda line: click.echo(line, err=True),
                )
            finally:
                printer.close()
        except Interrupted:
            click.echo("interrupted before the run started; nothing was written", err=True)
            ctx.exit(EXIT_INTERRUPTED)
        if as_json:
            emit_json(summary)
        else:
            _print_summary(sc, summary)
    if summary["status"] != "complete" and summary.get("interrupted"):
        ctx.exit(EXIT_INTERRUPTED)
    if engine_name == "sim":  # the run is written, and the simulator keeps nothing running
        nothing_to_tear_down()


def partitions_line(part: dict) -> str:
    """run.json's summary.partitions, for the terminal."""
    if part["partitions"] > 1:
        ranks = f" on {part['mpi_ranks']} MPI ranks" if "mpi_ranks" in part else ""
        if part.get("stopped"):
            return f"{part['partitions']}{ranks}, stopped before the end"
        by = part.get("lookahead_by")
        by = f", shorter than a link's delay: {by}" if by else ""
        line = (
            f"{part['partitions']}{ranks}, windows of {part['lookahead_ns']:,.0f} ns "
            f"({part['windows']:,} windows{by})"
        )
        cores = part.get("too_few_cores")  # more partitions than cores
        if cores:
            each = part["wall_s"] / max(part["windows"], 1) * 1e3
            line += (
                f"; only {cores} core{'' if cores == 1 else 's'}, so they met from Python "
                f'after each window ({each:.2f} ms a window; "auto" takes one per core)'
            )
        return line
    if "mpi_ranks" in part:
        return f"1, on MPI rank 0 alone ({part['mpi_ranks']} ranks): {part['why']}"
    return f"1 ({part['asked']} asked): {part['why']}"


def _per_s(rate: float) -> str:
    """A rate for the summary: 12.34 M, 56.7 k or 89."""
    if rate >= 1e6:
        return f"{rate / 1e6:.2f} M"
    if rate >= 1e3:
        return f"{rate / 1e3:.1f} k"
    return f"{rate:.0f}"


def _print_summary(sc, s: dict) -> None:
    from aifabric.fabric.rundir import SIZE_IN_ALL
    from aifabric.fabric.scenario import job_names
    from aifabric.fabric.units import format_rate, format_size, format_time

    status = s.get("status", "complete")
    cc = sc.cc_recorded()
    cc = f"{sc.cc} ({cc['preset']} preset)" if "preset" in cc else sc.cc
    click.echo(f"{sc.name}: {sc.fabric.name}, {s.get('flows', 0):,} flows, {cc}, {sc.ecmp} ECMP")
    if status != "complete":
        click.echo(f"status            {status}: {s.get('message', '')}")
    if s.get("completion_ns") is not None:
        which = "" if status == "complete" else " (of the flows that finished)"
        click.echo(f"completion time   {format_time(s['completion_ns'])}{which}")
    if "flows_done" in s:
        click.echo(f"flows done        {s['flows_done']:,} of {s.get('flows', 0):,}")
    for op in s.get("collectives", []):
        if op["time_ns"] is None:
            continue
        label = op["kind"] if op["algorithm"] in ("", "-") else f"{op['kind']} {op['algorithm']}"
        pattern = op["kind"] in SIZE_IN_ALL  # its bytes are all its flows'; no nccl-tests busbw
        size = f"{format_size(op['bytes'])} {'in all,' if pattern else 'x'} {op['ranks']} ranks"
        figure = ("goodput", op["algbw_bps"]) if pattern else ("busbw", op["busbw_bps"])
        rate = f"{figure[0]} {format_rate(int(figure[1]))}"
        click.echo(f"{label:<17} {size}  {format_time(op['time_ns'])}  {rate}bps")
    names = job_names(sc.workload) if s.get("iterations") else []
    for it in s.get("iterations", []):
        if it["iteration_ns"] is not None:
            click.echo(
                f"iteration         {names[it['job']]}: {format_time(it['iteration_ns'])} = "
                f"{format_time(it['compute_ns'])} compute + "
                f"{format_time(it['exposed_ns'])} exposed communication"
            )
    if "max_queue_bytes" in s:
        where = f" at {s['max_queue_port']}" if s.get("max_queue_port") else ""
        click.echo(f"max queue         {format_size(s['max_queue_bytes'])}{where}")
        click.echo(f"ECN marks         {s.get('ecn_marked', 0):,} ({s.get('cnp_sent', 0):,} CNPs)")
        click.echo(
            f"PFC pauses        {s.get('pfc_frames', 0):,} frames, "
            f"{format_time(s.get('paused_ns_total', 0))} paused"
        )
        click.echo(f"drops             {s.get('drops', 0):,}")
    if s.get("events_per_s") is not None:
        click.echo(
            f"simulator speed   {_per_s(s['events_per_s'])} events/s, "
            f"{_per_s(s['packet_hops_per_s'])} packet-hops/s "
            f"({s['events']:,} events in {s['simulator_wall_s']:.2f} s)"
        )
    part = s.get("partitions")
    asked = part.get("asked", 1) if part else 1
    if part and (part["partitions"] > 1 or (asked != "auto" and asked > 1) or "mpi_ranks" in part):
        click.echo(f"partitions        {partitions_line(part)}")
    for f in s.get("faults", []):
        when = format_time(f["at_ns"])
        if (f["applied_ns"], f["settled_ns"]) != (f["at_ns"], f["at_ns"]):
            when += (
                f" (applied at {format_time(f['applied_ns'])}, routes settled at "
                f"{format_time(f['settled_ns'])})"
            )
        click.echo(f"fault applied     {f['target']} {f['action']} at {when}")
    for f in s.get("faults_not_reached", []):
        click.echo(
            f"fault not reached {f['target']} {f['action']} at {format_time(f['at_ns'])}: "
            "the run ended before it"
        )
    for name, packets in s.get("captures", {}).items():
        idle = "  (the port sent nothing while it was captured)" if not packets else ""
        click.echo(f"captured          {name}: {packets:,} frames{idle}")
    click.echo(f"run directory     {s['run_dir']}")
