"""`aifabric watch RUN|SWEEP`: a terminal view of a run or a sweep, redrawn from its directory.

A run in progress streams its figures into live.json (`aifabric.fabric.live`);
a sweep's state is its directory (`aifabric.experiments.watch`). The view
follows until the run or sweep ends, then shows its last frame and exits;
`--once` prints one frame. Ctrl-C only stops the watching (exit 0).
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from aifabric.cli import main

WIDTH = 120  # columns of a frame printed to a file or pipe (a terminal gives its own)


@main.command("watch")
@click.argument("path", metavar="RUN|SWEEP")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option(
    "--every",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between two frames while following.",
)
def watch(path, once, every):
    """Show a run (simulated time, events/s, each job's throughput, the busiest ports, ECN,
    PFC and drops so far) or a sweep (points done, failed, running; the headline metric
    per configuration), redrawn until it ends."""
    from rich.console import Console

    from aifabric.fabric.errors import AifabricError

    where = Path(path)
    if not where.exists():
        raise AifabricError(f"{path} does not exist")
    if not where.is_dir():
        raise AifabricError(f"{path} is not a directory: give a run or a sweep directory")
    state = _reader(where)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=WIDTH)
    s = state()
    if once or not _going(s):
        console.print(_frame(s))
        return
    from rich.live import Live

    try:
        with Live(_frame(s), console=console, refresh_per_second=4, auto_refresh=False) as live:
            while _going(s):
                time.sleep(every)
                s = state()
                live.update(_frame(s), refresh=True)
    except KeyboardInterrupt:
        raise SystemExit(0) from None  # the run goes on; only the watching stops


def _reader(where: Path):
    """A function returning the directory's state now: a sweep's or a run's."""
    from aifabric.fabric.errors import AifabricError

    if (where / "sweep.json").is_file():
        from aifabric.experiments.watch import sweep_state

        return lambda: sweep_state(where)
    if (where / "run.json").is_file():
        from aifabric.analysis.watch import run_state

        return lambda: run_state(where)
    raise AifabricError(f"{where} is neither a run directory nor a sweep directory "
                        "(no run.json or sweep.json)")  # fmt: skip


def _going(state) -> bool:
    return state.running


def _frame(state):
    from aifabric.analysis.watch import RunState

    return _run_frame(state) if isinstance(state, RunState) else _sweep_frame(state)


# --- a run -----------------------------------------------------------------------------------


def _count(n) -> str:
    return "-" if n is None else f"{int(n):,}"


def _gbps(bps) -> str:
    return "-" if bps is None else f"{bps / 1e9:,.1f} Gb/s"


def _status_line(status: str, message: str) -> str:
    colour = {"running": "cyan", "complete": "green", "partial": "yellow"}.get(status, "red")
    text = f"[bold {colour}]{status}[/]"
    return f"{text}: {message}" if message else text


def _run_frame(s):
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    from aifabric.fabric.units import format_size, format_time

    head = (
        f"[bold]{escape(str(s.path))}[/]  scenario {escape(s.scenario)} on {s.engine}  "
        + _status_line(s.status, escape(s.message))
    )
    r = s.record
    if r is None:
        return Group(head, "no figures yet: the engine has not streamed any (live.json)")
    if s.source == "live.json":
        age = f", {s.age_s:.1f} s ago" if s.age_s is not None else ""
        seen = f"from live.json{age}"
    else:
        seen = "from the run directory"
    speed = ""
    if r.get("events") is not None:
        per_s = r.get("events_per_s")
        speed = f"  events {_count(r['events'])}" + (f" ({per_s / 1e6:,.2f} M/s)" if per_s else "")
    wall = r.get("wall_s")
    clock = (
        f"simulated {format_time(r['simulated_ns'])}"
        + (f"  wall {wall:,.1f} s" if wall is not None else "")
        + speed
        + f"  flows {_count(r['flows_done'])}/{_count(r['flows'])}  [dim]({seen})[/]"
    )

    t = r["totals"]
    totals = Table(title="so far", title_justify="left", show_header=False, box=None)
    totals.add_column("figure")
    totals.add_column("value", justify="right")
    totals.add_column("", style="dim")
    totals.add_row("bytes sent", _count(t.get("tx_bytes")), format_size(t.get("tx_bytes", 0)))
    totals.add_row("ECN marks", _count(t.get("ecn_marked")), "packets")
    totals.add_row("PFC frames", _count(t.get("pfc_sent")), "sent")
    totals.add_row("PFC paused", _count(t.get("paused_ns")), format_time(t.get("paused_ns", 0)))
    totals.add_row("drops", _count(t.get("drops")), "packets")
    if "cnp_sent" in t:
        totals.add_row("CNPs", _count(t["cnp_sent"]), "sent")

    span = format_time(r["interval_ns"]) if r.get("interval_ns") else "-"
    jobs = Table(title=f"jobs (rate: over the last {span})", title_justify="left")
    for col, just in (("job", "left"), ("flows done", "right"), ("delivered", "right"),
                      ("of", "right"), ("rate", "right"), ("mean", "right")):  # fmt: skip
        jobs.add_column(col, justify=just)
    for j in r["jobs"]:
        jobs.add_row(
            escape(s.job_names.get(j["job"], f"job {j['job']}")),
            f"{_count(j['flows_done'])}/{_count(j['flows'])}",
            format_size(j["delivered_bytes"]),
            format_size(j["bytes"]),
            _gbps(j["rate_bps"]),
            _gbps(j["mean_bps"]),
        )

    queue = "queued now" if s.source == "live.json" else "most queued"
    hot = Table(
        title=f"hottest ports (utilization over the last {span}; the rest so far)",
        title_justify="left",
    )
    for col, just in (("port", "left"), (queue, "right"), ("utilization", "right"),
                      ("sent", "right"), ("ECN", "right"), ("paused", "right"),
                      ("drops", "right")):  # fmt: skip
        hot.add_column(col, justify=just)
    for p in r["ports"]:
        hot.add_row(
            escape(p["port"]),
            format_size(p["queue_bytes"]),
            f"{p['utilization']:.0%}",
            format_size(p["tx_bytes"]),
            _count(p.get("ecn_marked")),
            format_time(p.get("paused_ns", 0)),
            _count(p.get("drops")),
        )
    parts = [head, clock]
    if r.get("covers"):  # a rank of an MPI run sees its own partitions' ports and flows
        parts.append(f"[yellow]ports and jobs of {escape(r['covers'])} only[/]")
    parts += ["", totals, "", jobs]
    if r["ports"]:
        parts += ["", hot]
    return Group(*parts)


# --- a sweep ---------------------------------------------------------------------------------


def _sweep_frame(s):
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    from aifabric.experiments.report import format_value
    from aifabric.fabric.units import format_time

    n = len(s.points)
    state = "[bold cyan]running[/]" if s.running else "[bold]not running[/]"
    waiting = s.count("waiting")
    left = waiting + s.count("killed")
    if not s.running and left:
        state += f" ({left} points not run: the same sweep command resumes it)"
    head = f"[bold]{escape(str(s.path))}[/]  sweep {escape(s.name)}  {state}"
    counts = (
        f"{n} points: {s.count('complete', 'partial')} done, {s.count('failed')} failed, "
        f"{s.count('running')} running, {waiting} waiting"
        + (f", {s.count('killed')} killed" if s.count("killed") else "")
    )
    keys = list(s.configurations[0].labels) if s.configurations else []
    table = Table(
        title=f"per configuration: {s.metric or 'no metric yet'} (mean over complete points)",
        title_justify="left",
    )
    for k in keys:
        table.add_column(escape(k))
    for col in ("points", "done", "failed", "running", s.metric or "metric"):
        table.add_column(escape(col), justify="right")
    for c in s.configurations:
        table.add_row(
            *(escape(str(c.labels[k])) for k in keys),
            str(c.points), str(c.done), str(c.failed), str(c.running),
            "-" if c.mean is None else format_value(c.mean, s.metric or ""),
        )  # fmt: skip
    parts = [head, counts, "", table]
    running = [p for p in s.points if p.status == "running"]
    if running:
        now = Table(title="running points", title_justify="left")
        for col, just in (("point", "left"), ("simulated", "right"), ("flows done", "right"),
                          ("events/s", "right")):  # fmt: skip
            now.add_column(col, justify=just)
        for p in running:
            r = p.live or {}
            per_s = r.get("events_per_s")
            now.add_row(
                escape(p.name),
                format_time(r["simulated_ns"]) if r else "-",
                f"{_count(r.get('flows_done'))}/{_count(r.get('flows'))}" if r else "-",
                f"{per_s / 1e6:,.2f} M" if per_s else "-",
            )
        parts += ["", now]
    return Group(*parts)
