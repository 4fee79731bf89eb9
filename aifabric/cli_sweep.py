"""`aifabric sweep ...` and `aifabric experiment ...` (registered on import by aifabric.cli)."""

from __future__ import annotations

import click

from aifabric.analysis.table import render
from aifabric.cli import Group, emit_json, force_option, json_option, main, output_file
from aifabric.fabric.errors import AifabricError


class DefaultRun(Group):
    """A group whose first argument, when it is not a subcommand, goes to `run`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


workers_option = click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Worker processes of the local Dask cluster [default: one per core].",
)
scheduler_option = click.option(
    "--scheduler",
    metavar="tcp://HOST:PORT",
    default=None,
    help="Send the points to an existing Dask cluster instead of a local one.",
)


sweep_force_option = click.option(
    "--force", is_flag=True, help="Write the sweep into a folder that is not a sweep's."
)


wait_option = click.option(
    "--wait", is_flag=True, help="When another sweep writes OUTPUT, wait for it to finish."
)


def sweep_output(output: str, force: bool) -> None:
    """Refuse, before any work, a sweep folder that would replace a user's files: a folder
    that exists, holds files and is not a sweep's (no sweep.json), unless `force`."""
    from pathlib import Path

    path = Path(output)
    if not output:
        raise AifabricError("the sweep folder's name is empty")
    if path.exists() and not path.is_dir():
        raise AifabricError(f"cannot write the sweep into {output}: it is not a folder")
    ours = (path / "sweep.json").is_file() or (path / "sweep.lock").is_file()
    if path.is_dir() and not ours and any(path.iterdir()) and not force:
        raise AifabricError(
            f"{output} is a folder but not a sweep's (no sweep.json); give --force to write "
            "a sweep into it (its sweep.json, results.csv, report.html and runs/ are the sweep's)"
        )


@main.group(cls=DefaultRun)
def sweep():
    """Sweeps: a scenario over keys and seeds, every point a run directory.

    `aifabric sweep SPEC -o DIR` or `aifabric sweep SCENARIO --vary KEY=A,B --seeds 1-5 -o DIR`.
    """


output_option = click.option(
    "-o", "--output", required=True, type=click.Path(file_okay=False),
    help="The sweep's folder: sweep.json, results.csv, results.parquet, results_long.parquet "
    "and runs/ (created, resumed, or extended by another grid).",
)  # fmt: skip


@sweep.command("run")
@click.argument("source")
@output_option
@click.option(
    "--vary",
    multiple=True,
    metavar="KEY=A,B,...",
    help="Vary KEY over the values, in every combination with other --vary keys.",
)
@click.option(
    "--zip",
    "together",
    multiple=True,
    metavar="KEY=A,B,...",
    help="Vary KEY with the other --zip keys, position by position.",
)
@click.option(
    "--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Override KEY in every run."
)
@click.option("--seeds", default=None, help="Seeds: 1-5, 1,3,7 [default: the spec's, or 1].")
@click.option("--full", is_flag=True, help="A spec's [full] size.")
@workers_option
@scheduler_option
@sweep_force_option
@wait_option
@json_option
def sweep_run(source, output, vary, together, assignments, seeds, full, workers, scheduler,
              force, wait, as_json):  # fmt: skip
    """Run SOURCE, a sweep spec or a scenario with --vary/--zip/--set/--seeds, into OUTPUT."""
    from aifabric.experiments.spec import is_sweep_file, load_sweep, parse_seeds, sweep_from_flags

    sweep_output(output, force)
    if is_sweep_file(source):
        if vary or together or assignments:
            raise click.UsageError("--vary, --zip and --set go with a scenario, not a sweep spec")
        spec = load_sweep(source, full=full)
        if seeds is not None:
            from dataclasses import replace

            spec = replace(spec, seeds=parse_seeds(seeds))
    else:
        if full:
            raise click.UsageError("--full goes with a sweep spec that has a [full] section")
        spec = sweep_from_flags(
            source, vary=vary, together=together, assignments=assignments, seeds=seeds or "1"
        )
    _failed(_run(spec, output, workers, scheduler, as_json, wait))


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # Ctrl-C and `kill` stop a sweep cleanly, resumable


def _run(spec, output, workers, scheduler, as_json, wait=False) -> dict:
    import signal
    import sys

    if workers is not None and scheduler is not None:
        raise click.UsageError(
            "--workers sizes a local cluster; with --scheduler the cluster has its own"
        )
    from aifabric.experiments.runner import check_address, run_sweep, stderr_progress
    from aifabric.warmup import ensure_warm

    if scheduler is not None:
        check_address(scheduler)

    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if scheduler is None:
            # an empty kernel cache (a new version) is compiled once, here, and said so;
            # else every local worker compiles all of it at once, silently, on its first point
            try:
                ensure_warm()
            except KeyboardInterrupt:
                click.echo("interrupted while compiling, before any point ran", err=True)
                raise SystemExit(130) from None
        try:
            outcome = run_sweep(
                spec, output, workers=workers, scheduler=scheduler, echo=stderr_progress(),
                wait=wait,
            )  # fmt: skip
        except KeyboardInterrupt:  # one after the sweep began writing is an interrupted outcome
            click.echo("interrupted before the sweep began: run the same command again", err=True)
            raise SystemExit(130) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    sys.stderr.write("\n")
    if as_json:
        emit_json(outcome)
    else:
        click.echo(
            f"{outcome['done']} of {outcome['points']} points done ({outcome['reused']} "
            f"from before, {outcome['failed']} failed); results in {outcome['results']}"
        )
    if outcome["interrupted"]:
        click.echo("interrupted: run the same command again to resume", err=True)
        raise SystemExit(130)
    return outcome


def _failed(outcome: dict) -> None:
    """Exit 1, in one sentence, when points failed."""
    if outcome["failed"]:
        raise AifabricError(
            f"{outcome['failed']} of {outcome['points']} points failed (the error column of "
            f"{outcome['results']} says why); run the same command again to retry them"
        )


def _fmt(value, column: str = "") -> str:
    from aifabric.experiments.report import format_value

    return format_value(value, column)


@sweep.command("show")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--metric", "metrics", multiple=True, help="A results column, or a metric name "
              "for every job's column (busbw_gbps) [default: the headline ones].")  # fmt: skip
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "nccl-tests"]),
    default="text",
    show_default=True,
    help="nccl-tests: the runs' collective ops as all_reduce_perf (...) prints them, a row "
    "per size, a block per configuration of the other keys.",
)
@json_option
def sweep_show(directory, metrics, fmt, as_json):
    """Per configuration: mean, std, min/max and the 95% interval over seeds."""
    from aifabric.experiments.stats import INTERVAL_NOTE
    from aifabric.experiments.sweepdir import open_sweep

    if as_json and fmt not in ("text", "json"):
        raise click.UsageError(f"--json and --format {fmt} are two formats; give one")
    as_json = as_json or fmt == "json"
    if fmt == "nccl-tests":
        from aifabric.experiments.nccltests import nccl_tests_text

        click.echo(nccl_tests_text(directory))
        return
    res = open_sweep(directory)
    rows = res.aggregate(list(metrics))
    contrasts = [{**c, "effects": res.effects(c)} for c in res.contrasts()]
    if as_json:
        emit_json({"sweep": res.spec.get("name"), "aggregate": rows, "contrasts": contrasts})
        return
    frame = res.frame
    done = int((frame["status"] == "complete").sum()) if len(frame) else 0
    click.echo(
        f"{res.spec.get('name')}: {len(frame)} runs in the table, {done} complete, "
        f"{len(frame) - done} not"
    )
    click.echo(INTERVAL_NOTE)
    for metric in dict.fromkeys(r["metric"] for r in rows):
        mine = [r for r in rows if r["metric"] == metric]
        click.echo()
        click.echo(
            render(
                [*res.keys, "job", "n", "mean", "std", "min", "max", "95% interval"],
                [
                    [
                        *(_fmt(r[k]) for k in res.keys),
                        r["job"] or "-",
                        r["n"],
                        *(_fmt(r[s], metric) for s in ("mean", "std", "min", "max")),
                        _interval(r["ci_low"], r["ci_high"], metric),
                    ]
                    for r in mine
                ],  # fmt: skip
                title=metric,
            )
        )
    for contrast in contrasts:
        if contrast["effects"]:
            click.echo()
            click.echo(_effects_table(contrast, res.report))


def _interval(lo, hi, column: str = "") -> str:
    return "-" if lo is None else f"[{_fmt(lo, column)}, {_fmt(hi, column)}]"


def _effects_table(contrast: dict, report: dict) -> str:
    from aifabric.experiments.report import percent

    rows = [
        [
            ", ".join(f"{k}={v}" for k, v in e["configuration"].items()),
            e["pairs"],
            _fmt(e["mean"], e["column"]),
            _fmt(e["baseline_mean"], e["column"]),
            percent(e["change"]),
            "-"
            if e["change_low"] is None
            else f"[{percent(e['change_low'])}, {percent(e['change_high'])}]",
        ]
        for e in contrast["effects"]
    ]
    base = ", ".join(f"{k}={v}" for k, v in contrast["baseline"].items())
    label = f"{contrast['label']}: " if contrast.get("label") else ""
    return render(
        ["configuration", "seeds", "mean", "baseline", "change", "95% interval"],
        rows,
        title=f"{label}{report.get('metric')} against the baseline ({base}), paired by seed",
    )


@sweep.command("report")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="HTML file.")
@click.option("--metric", "metrics", multiple=True, help="Metrics to plot (as for show).")
@force_option
def sweep_report(directory, output, metrics, force):
    """One self-contained HTML page: aggregates, error bars, per-seed spread, effects."""
    from aifabric.experiments.report import build_report
    from aifabric.fabric.files import write_atomic

    output_file(output, force)
    write_atomic(output, build_report(directory, list(metrics)))
    click.echo(f"wrote {output}", err=True)


@main.group(cls=Group)
def experiment():
    """Published findings reproduced as sweeps (editable specs shipped with aifabric)."""


@experiment.command("list")
@json_option
def experiment_list(as_json):
    """The experiments, what each tests, and where its spec is."""
    from aifabric.experiments.catalog import experiments

    rows = experiments()
    if as_json:
        emit_json(rows)
        return
    click.echo(
        render(["experiment", "runs", "full", "tests"],
               [[r["name"], r["runs"], r["runs_full"], r["description"]] for r in rows])
    )  # fmt: skip
    click.echo()
    click.echo("specs: " + (rows[0]["spec"].rsplit("/", 1)[0] if rows else "-"))


@experiment.command("run")
@click.argument("name")
@output_option
@click.option("--full", is_flag=True, help="The larger size, closer to the paper's scale.")
@click.option("--seeds", default=None, help="Override the spec's seeds (1-5, 1,3,7).")
@workers_option
@scheduler_option
@sweep_force_option
@wait_option
def experiment_run(name, output, full, seeds, workers, scheduler, force, wait):
    """Run experiment NAME, write OUTPUT/report.html and print its finding."""
    from dataclasses import replace
    from pathlib import Path

    from aifabric.experiments.catalog import experiment_spec
    from aifabric.experiments.report import build_report, finding_lines
    from aifabric.experiments.spec import load_sweep, parse_seeds
    from aifabric.experiments.sweepdir import open_sweep
    from aifabric.fabric.files import write_atomic

    sweep_output(output, force)
    spec = load_sweep(experiment_spec(name), full=full)
    if seeds is not None:
        spec = replace(spec, seeds=parse_seeds(seeds))
    outcome = _run(spec, output, workers, scheduler, False, wait)
    report = Path(output) / "report.html"
    write_atomic(report, build_report(output))
    for line in finding_lines(open_sweep(output)):
        click.echo(line)
    click.echo(f"report: {report}")
    _failed(outcome)
