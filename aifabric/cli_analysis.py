"""`aifabric analyze | report | compare | pcap ...` (registered on import by aifabric.cli).

Each command parses, calls one function of `aifabric.analysis.targets` and prints what
`aifabric.analysis.render` makes of it.
"""

from __future__ import annotations

import click

from aifabric.cli import (
    Group,
    emit_json,
    force_option,
    json_option,
    main,
    notice_compiles,
    output_file,
)
from aifabric.fabric.errors import AifabricError


def _rate(ctx, param, value):
    from aifabric.fabric.units import parse_rate

    if value is None:
        return None
    try:
        return parse_rate(value)
    except AifabricError as e:
        raise click.BadParameter(str(e)) from None


rate_option = click.option(
    "--rate",
    callback=_rate,
    help="Link rate that converts PFC quanta of captures to time [default: 100G, or a "
    "run's slowest link].",
)
top_option = click.option(
    "--top", type=click.IntRange(1, 10_000), default=10, show_default=True, help="Rows per ranking."
)


def _warn(warnings: list[str]) -> None:
    for w in warnings:
        click.echo(f"Warning: {w}", err=True)


@main.command("analyze")
@click.argument("target")
@rate_option
@top_option
@click.option(
    "--series", is_flag=True, help="With --json: add the time series (throughput per link, ...)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "nccl-tests"]),
    default="text",
    show_default=True,
    help="nccl-tests: a run's collective ops as all_reduce_perf (all_gather_perf, ...) "
    "prints them, a block per job.",
)
@json_option
def analyze(target, rate, top, series, fmt, as_json):
    """Congestion, ECMP imbalance and completion times of a run directory or a capture."""
    notice_compiles()
    from aifabric.analysis import render, targets

    if as_json and fmt not in ("text", "json"):
        raise click.UsageError(f"--json and --format {fmt} are two formats; give one")
    as_json = as_json or fmt == "json"
    if fmt == "nccl-tests":
        text, warnings = targets.nccl_tests(target)
        _warn(warnings)
        click.echo(text)
        return
    m, warnings = targets.analyze(target, rate_bps=rate, top=top, series=series and as_json)
    _warn(warnings)
    if as_json:
        emit_json(m.to_dict())
    elif m.source == "capture":
        click.echo(render.capture_text(m))
    else:
        click.echo(render.run_text(m, top))


@main.command("report")
@click.argument("run")
@click.option("-o", "--output", default="report.html", show_default=True)
@force_option
def report(run, output, force):
    """Write RUN's report (a run directory or a capture): one self-contained HTML file."""
    from aifabric.analysis import targets
    from aifabric.fabric.files import write_atomic

    output_file(output, force)
    notice_compiles()
    html, warnings = targets.report(run)
    _warn(warnings)
    write_atomic(output, html)
    click.echo(f"wrote {output}", err=True)


@main.command("compare")
@click.argument("targets", nargs=-1, required=True)
@click.option(
    "--by",
    "by",
    multiple=True,
    metavar="KEY",
    help="A sweep's runs grouped by these of its varied keys [default: all of them].",
)
@rate_option
@json_option
def compare(targets, by, rate, as_json):
    """Runs (or captures) side by side: per job busbw, time and efficiency; ECMP against
    uniform hashing; ECN, CNPs, pauses, completion. A sweep directory is one column per
    configuration: the mean over its seeds, with the 95% interval's half-width."""
    from aifabric.analysis import render
    from aifabric.analysis import targets as lib
    from aifabric.experiments.groups import group_summary, is_sweep_dir, sweep_groups

    notice_compiles()
    sweeps = [t for t in targets if is_sweep_dir(t)]
    if by and not sweeps:
        raise click.UsageError("--by groups a sweep's runs; give a sweep directory")
    rows, warnings = [], []
    for target in targets:
        if target not in sweeps:
            more, w = lib.compare([target], rate_bps=rate)
            rows += more
            warnings += w
            continue
        for label, runs in sweep_groups(target, list(by)):
            summaries, w = lib.compare([str(r) for r in runs], rate_bps=rate)
            warnings += w
            name = f"{label} ({len(runs)} run{'s' if len(runs) > 1 else ''})"
            if len(targets) > 1:
                name = f"{target.rstrip('/').rsplit('/', 1)[-1]}: {name}"
            rows.append(group_summary(name, summaries))
    _warn(warnings)
    if as_json:
        emit_json([r.to_dict() for r in rows])
    else:
        click.echo(render.compare_text(rows))


@main.group("pcap", cls=Group)
def pcap():
    """Look inside packet captures."""


@pcap.command("show")
@click.argument("file")
@click.option("--index", type=click.IntRange(0), default=0, show_default=True)
@click.option("--count", type=click.IntRange(1), default=1, show_default=True)
@json_option
def pcap_show(file, index, count, as_json):
    """Dissect packets of FILE with scapy (RoCEv2 BTH, CNP, PFC, PAUSE layers)."""
    from aifabric.analysis import targets

    notice_compiles()
    rows, text, warnings = targets.packets(file, index, count)
    _warn(warnings)
    if as_json:
        emit_json(rows)
    else:
        click.echo(text)
