"""`aifabric analyze | report | compare | pcap ...` (registered on import by aifabric.cli)."""

from __future__ import annotations

from pathlib import Path

import click

from aifabric.cli import Group, emit_json, json_option, main, notice_compiles
from aifabric.table import render
from fabric.errors import AifabricError


def _rate(ctx, param, value):
    from fabric.units import parse_rate

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


def _load(target: str, rate_bps, top: int, series: bool = False) -> dict:
    """Metrics of a run directory or a capture file, with the capture's warning on stderr."""
    from analysis.capture import sniff

    path = Path(target)
    if path.is_dir():
        from analysis.metrics import run_metrics
        from fabric.rundir import Run

        run = Run(path)
        m = run_metrics(run, top=top, series=series, rate_bps=rate_bps)
        if run.status != "complete":
            why = f" ({run.meta['message']})" if run.meta.get("message") else ""
            click.echo(
                f"Warning: run {path.name} is {run.status}{why}; the analysis covers what it "
                "wrote.",
                err=True,
            )
        for c in m["captures"]:
            _warn(c)
        return m
    if not path.exists():
        raise AifabricError(f"{target} does not exist")
    if sniff(path) is None:
        raise AifabricError(f"{target} is neither a run directory nor a pcap or pcapng capture")
    from analysis.capture import read_capture
    from analysis.metrics import DEFAULT_RATE_BPS, capture_metrics

    m = capture_metrics(
        read_capture(path), rate_bps=rate_bps or DEFAULT_RATE_BPS, top=top, series=series
    )
    _warn(m)
    return m


def _warn(m: dict) -> None:
    if m["problem"]:
        click.echo(f"Warning: {m['problem']}; the analysis covers what was read.", err=True)


def _t(ns) -> str:
    from fabric.units import format_time

    return "-" if ns is None else format_time(int(round(ns)))


def _r(bps) -> str:
    from fabric.units import format_rate

    return "-" if bps is None else format_rate(int(bps)) + "bps"


def _dist_row(label: str, d: dict) -> list:
    return [label, f"{d['count']:,}"] + [_t(d[k]) for k in ("mean", "p50", "p90", "p99", "max")]


DIST_HEAD = ["", "count", "mean", "p50", "p90", "p99", "max"]


def _print_capture(m: dict) -> None:
    click.echo(
        f"{m['file']} ({m['format']}): {m['packets']:,} packets, {m['bytes']:,} bytes on the wire "
        f"({m['captured_bytes']:,} captured), {_t(m['duration_ns'])}, "
        f"{m['interfaces']} interface(s)"
    )
    if m["cut_headers"]:
        click.echo(f"{m['cut_headers']:,} packets had headers cut by the snap length")
    if not m["packets"]:
        return
    click.echo()
    click.echo(render(["kind", "packets"], [[k, f"{v:,}"] for k, v in m["kinds"].items() if v]))
    e = m["ecn"]
    click.echo()
    click.echo(
        render(
            ["IP packets", "not-ECT", "ECT(0)", "ECT(1)", "CE", "CE share", "CE of ECT"],
            [
                [
                    f"{e['ip_packets']:,}",
                    f"{e['not_ect']:,}",
                    f"{e['ect0']:,}",
                    f"{e['ect1']:,}",
                    f"{e['ce']:,}",
                    f"{100 * e['ce_fraction']:.2f}%",
                    f"{100 * e['ce_fraction_of_ect']:.2f}%",
                ]
            ],
        )
    )
    c, p, pa = m["cnp"], m["pfc"], m["pause"]
    click.echo()
    click.echo(
        f"RoCEv2 {m['roce']['packets']:,} packets (FECN {m['roce']['fecn']:,}, "
        f"BECN {m['roce']['becn']:,}); CNP {c['count']:,} ({c['rate_per_s']:,.0f}/s, "
        f"{c['qps']} QPs)"
    )
    click.echo(
        f"802.3x PAUSE {pa['frames']:,} frames, {pa['quanta']:,} quanta, "
        f"{_t(pa['paused_ns'])} paused (not counted as PFC)"
    )
    if p["frames"]:
        click.echo()
        rows = [
            [
                str(k),
                f"{p['frames_per_priority'][k]:,}",
                f"{p['xoff_per_priority'][k]:,}",
                f"{p['xon_per_priority'][k]:,}",
                f"{p['quanta_per_priority'][k]:,}",
                _t(p["paused_ns_per_priority"][k]),
            ]
            for k in range(8)
            if p["frames_per_priority"][k]
        ]
        click.echo(
            render(
                ["priority", "PFC frames", "XOFF", "XON", "quanta", "paused"],
                rows,
                title=f"802.1Qbb PFC: {p['frames']:,} frames (time at {_r(p['rate_bps'])})",
            )
        )
    f = m["flows"]
    if f["count"]:
        click.echo()
        click.echo(
            render(
                ["src", "dst", "sport", "dQPN", "packets", "bytes", "CE", "duration"],
                [
                    [
                        r["src"],
                        r["dst"],
                        r["sport"],
                        f"0x{r['dqpn']:06x}",
                        f"{r['packets']:,}",
                        f"{r['bytes']:,}",
                        f"{r['ce']:,}",
                        _t(r["duration_ns"]),
                    ]
                    for r in f["top"]
                ],
                title=f"{f['count']:,} flows, the largest:",
            )
        )
        click.echo()
        click.echo(render(DIST_HEAD, [_dist_row("flow duration", m["fct_ns"])]))
    pi = m["per_interface"]
    imb = pi["imbalance"]
    if imb:
        click.echo()
        click.echo(
            f"bytes per interface {pi['bytes']}: max/mean {imb['max_mean']:.2f}, "
            f"CV {imb['cv']:.3f}, Jain {imb['jain']:.3f}"
        )
        click.echo(
            f"flows per interface {pi['flows']}: {pi['collisions']} collisions "
            f"(uniform hashing {pi['collisions_expected']:.1f})"
        )


def _print_run(m: dict, top: int) -> None:
    click.echo(
        f"run {m['path']}: {m['fabric']}, engine {m['engine']}, status {m['status']}; "
        f"{m['flows']['count']:,} flows ({m['flows']['finished']:,} finished)"
    )
    scale = m.get("emulation_scale", 1.0)
    if scale > 1:
        click.echo(
            f"emulated with link rates divided by {scale:,.0f} and time stretched by it; "
            "figures are in fabric time and rates (busbw also as the emulated links carried it)"
        )
    tiers = m["ecmp"]["tiers"]
    if tiers:
        click.echo()
        click.echo(
            render(
                ["tier", "switches", "uplinks", "flows", "max/mean", "CV", "Jain",
                 "collisions", "uniform"],
                [
                    [
                        t["tier"],
                        t["switches"],
                        t["uplinks"],
                        f"{t['flows']:,}",
                        f"{t['bytes']['max_mean']:.2f}",
                        f"{t['bytes']['cv']:.3f}",
                        f"{t['bytes']['jain']:.3f}",
                        t["collisions"],
                        f"{t['collisions_expected']:.1f}",
                    ]
                    for t in tiers
                ],
                title="ECMP: bytes per uplink",
            )
        )  # fmt: skip
    cong = m["congestion"]
    if cong:
        click.echo()
        click.echo(
            f"congestion: {cong['ecn_marked']:,} ECN marks (~{100 * cong['ecn_fraction_est']:.2f}%"
            f" of packets), {cong['pfc_frames']:,} PFC frames, {_t(cong['paused_ns'])} paused on "
            f"{cong['paused_ports']} ports, {cong['drops']:,} drops, deepest queue "
            f"{cong['qdepth_max_bytes']:,} B"
        )
    if m["hotspots"]:
        click.echo()
        click.echo(
            render(
                ["#", "port", "paused", "max queue", "ECN marks", "utilization"],
                [
                    [
                        h["rank"],
                        h["port"],
                        _t(h["paused_ns"]),
                        f"{h['qdepth_max_bytes']:,}",
                        f"{h['ecn_marked']:,}",
                        f"{100 * h['utilization']:.1f}%",
                    ]
                    for h in m["hotspots"]
                ],
                title="hot spots",
            )
        )
    spread = m["pause_spread"]
    if spread:
        # the ports furthest upstream from where their pause began, then in time order
        shown = sorted(spread, key=lambda r: (-r["hops_from_root"], r["first_pause_ns"]))
        shown = sorted(shown[:top], key=lambda r: (r["first_pause_ns"], r["port"]))
        more = len(spread) - len(shown)
        click.echo()
        click.echo(
            render(
                ["port", "first pause", "paused", "cause", "because of", "hops"],
                [
                    [
                        r["port"],
                        _t(r["first_pause_ns"]),
                        _t(r["paused_ns"]),
                        r["cause"],
                        r["because_of"] or "-",
                        r["hops_from_root"],
                    ]
                    for r in shown
                ],
                title=f"how PFC pauses spread: {len(spread):,} paused ports, "
                f"{sum(r['cause'] == 'congestion' for r in spread):,} roots, longest chain "
                f"{max(r['hops_from_root'] for r in spread)} hops",
            )
        )
        if more:
            click.echo(f"... {more:,} more paused ports (--top, or --json for all)")
    if m["flows"]["count"]:
        click.echo()
        click.echo(render(DIST_HEAD, [_dist_row("flow completion", m["fct_ns"])]))
    coll = m["collectives"]
    if coll["count"]:
        click.echo()
        click.echo(
            render(
                ["op", "kind", "ranks", "bytes", "time", "algbw", "busbw"]
                + (["busbw emulated"] if scale > 1 else []),
                [
                    [
                        o["op"],
                        o["kind"],
                        o["ranks"],
                        f"{o['bytes']:,}",
                        _t(o["time_ns"]),
                        _r(o["algbw_bps"]),
                        _r(o["busbw_bps"]),
                    ]
                    + ([_r(o["busbw_emulated_bps"])] if scale > 1 else [])
                    for o in coll["ops"]
                ],
                title="collectives (nccl-tests algbw and busbw)",
            )
        )
    for c in m["captures"]:
        click.echo()
        _print_capture(c)


@main.command("analyze")
@click.argument("target")
@rate_option
@top_option
@click.option(
    "--series", is_flag=True, help="With --json: add the time series (throughput per link, ...)."
)
@json_option
def analyze(target, rate, top, series, as_json):
    """Congestion, ECMP imbalance and completion times of a run directory or a capture."""
    notice_compiles()
    m = _load(target, rate, top, series and as_json)
    if as_json:
        emit_json(m)
    elif m["source"] == "capture":
        _print_capture(m)
    else:
        _print_run(m, top)


@main.command("report")
@click.argument("run")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default="report.html",
    show_default=True,
)
def report(run, output):
    """Write RUN's report (a run directory or a capture): one self-contained HTML file."""
    from analysis.capture import sniff
    from analysis.report import build_capture_report, build_report
    from fabric.files import write_atomic
    from fabric.rundir import Run

    notice_compiles()

    path = Path(run)
    if path.is_dir():
        html = build_report(Run(path))
    elif not path.exists():
        raise AifabricError(f"{run} does not exist")
    elif sniff(path) is None:
        raise AifabricError(f"{run} is neither a run directory nor a pcap or pcapng capture")
    else:
        from analysis.capture import read_capture

        problem = read_capture(path).problem
        if problem:
            click.echo(f"Warning: {problem}; the report covers what was read.", err=True)
        html = build_capture_report(path)
    write_atomic(output, html)
    click.echo(f"wrote {output}", err=True)


@main.command("compare")
@click.argument("targets", nargs=-1, required=True)
@rate_option
@json_option
def compare(targets, rate, as_json):
    """Run directories (or captures) side by side: busbw, imbalance, ECN, pauses, completion."""
    from analysis.metrics import summary
    from analysis.report import SUMMARY_ROWS, _fmt

    notice_compiles()

    rows = [summary(_load(t, rate, 10)) for t in targets]
    if as_json:
        emit_json(rows)
        return
    click.echo(
        render(
            [""] + [r["name"] for r in rows],
            [[label] + [_fmt(r[key], kind) for r in rows] for key, label, kind in SUMMARY_ROWS],
        )
    )


@main.group("pcap", cls=Group)
def pcap():
    """Look inside packet captures."""


@pcap.command("show")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--index", type=click.IntRange(0), default=0, show_default=True)
@click.option("--count", type=click.IntRange(1), default=1, show_default=True)
def pcap_show(file, index, count):
    """Dissect packets of FILE with scapy (RoCEv2 BTH, CNP, PFC, PAUSE layers)."""
    from analysis.capture import read_capture
    from analysis.dissect import show

    notice_compiles()

    if not Path(file).exists():
        raise AifabricError(f"{file} does not exist")
    cap = read_capture(file)
    if cap.problem:
        click.echo(f"Warning: {cap.problem}.", err=True)
    if len(cap) and index >= len(cap):
        raise AifabricError(f"{file} has {len(cap):,} packets; --index must be below that")
    click.echo(show(cap, index, count))
