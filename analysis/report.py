"""The HTML report of a run: one self-contained file (plotly.js inlined) that opens offline.

Sections, top to bottom: a summary table; the fabric with links coloured by
utilization; load per uplink for each switch tier; a queue-depth heat map
(ports x time); ECN and PFC timelines; the flow completion-time distribution;
a collective timeline. A capture's report has the summary, throughput per
interface, ECN / CNP / PFC timelines, load per interface and flow durations.
A small script records script errors and, once the page has loaded, writes
into `#aifabric-check` how many plots exist and how many rendered (the
browser test reads it).
"""

from __future__ import annotations

import html
import json

import numpy as np

from analysis.metrics import run_metrics, summary
from fabric.model import Role
from fabric.units import format_rate, format_size, format_time

MAX_HEATMAP_PORTS = 64
MAX_UPLINK_SWITCHES = 32  # per tier: the most unbalanced switches are drawn
MAX_LINK_HOVER = 5000  # links with hover text; bigger fabrics are drawn without it
CDF_POINTS = 200

_HOOK_HEAD = """<script>
window.__aifabric = {errors: []};
window.addEventListener("error", function (e) {
  window.__aifabric.errors.push(String(e.message || e));
});
</script>"""

_HOOK_TAIL = """<script>
window.addEventListener("load", function () {
  var plots = document.querySelectorAll(".js-plotly-plot");
  var rendered = 0;
  plots.forEach(function (p) { if (p.querySelector(".main-svg")) { rendered += 1; } });
  document.getElementById("aifabric-check").textContent = JSON.stringify({
    errors: window.__aifabric.errors,
    plots: plots.length,
    rendered: rendered,
    expected: Number(document.body.dataset.plots)
  });
});
</script>"""

_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table.summary { border-collapse: collapse; }
table.summary td, table.summary th { padding: 0.2em 0.9em; border-bottom: 1px solid #ddd;
  text-align: left; }
table.summary td.num { text-align: right; font-variant-numeric: tabular-nums; }
p.note { color: #666; font-size: 0.9em; }
#aifabric-check { display: none; }
</style>"""


def _fmt(value, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "rate":
        return format_rate(int(value)) + "bps"
    if kind == "time":
        return format_time(int(round(value)))
    if kind == "size":
        return format_size(int(value))
    if kind == "ratio":
        return f"{value:.3f}"
    if kind == "pct":
        return f"{100 * value:.2f}%"
    return f"{int(value):,}"


SUMMARY_ROWS = (
    ("busbw_bps", "mean busbw (nccl-tests)", "rate"),
    ("collective_time_ns", "mean collective time", "time"),
    ("up_max_mean", "worst uplink tier max/mean (bytes)", "ratio"),
    ("up_jain", "that tier's Jain index", "ratio"),
    ("ecn_marked", "ECN-marked packets", "int"),
    ("ecn_fraction", "ECN-marked fraction", "pct"),
    ("cnp", "CNPs", "int"),
    ("pfc_frames", "PFC frames", "int"),
    ("paused_ns", "time paused by PFC (all ports)", "time"),
    ("drops", "drops", "int"),
    ("fct_p50_ns", "flow completion p50", "time"),
    ("fct_p99_ns", "flow completion p99", "time"),
)


def _summary_table(m: dict) -> str:
    s = summary(m)
    rows = [
        f'<tr><th>{html.escape(label)}</th><td class="num">{_fmt(s[key], kind)}</td></tr>'
        for key, label, kind in SUMMARY_ROWS
    ]
    return '<table class="summary">' + "".join(rows) + "</table>"


def _layout(fig, title: str, height: int = 420):
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        template="plotly_white",
    )
    return fig


def _fabric_figure(fabric, series: dict | None):
    import plotly.graph_objects as go

    roles = fabric.node_role.astype(int)
    x = np.zeros(fabric.n_nodes)
    y = roles.astype(float)
    for r in np.unique(roles):
        ids = np.flatnonzero(roles == r)
        x[ids] = (np.arange(len(ids)) + 0.5) / len(ids)
    util = np.zeros(fabric.n_links)
    if series is not None:
        u = np.asarray(series["utilization"], dtype=float)
        mean = u.mean(axis=1) if u.size else np.zeros(len(series["port_ids"]))
        for p, val in zip(series["port_ids"], mean, strict=True):
            util[p // 2] = max(util[p // 2], val)
    fig = go.Figure()
    edges = np.linspace(0, max(1.0, float(util.max()) if util.size else 1.0), 11)
    import plotly.colors as pc

    colors = pc.sample_colorscale("Viridis", list(np.linspace(0, 1, 10)))
    which = np.clip(np.searchsorted(edges, util, side="right") - 1, 0, 9)
    for k in range(10):
        links = np.flatnonzero(which == k)
        if not links.size:
            continue
        xs, ys, text = [], [], []
        for link in links:
            a, b = fabric.link_a[link], fabric.link_b[link]
            xs += [x[a], x[b], None]
            ys += [y[a], y[b], None]
            if fabric.n_links <= MAX_LINK_HOVER:
                name = f"{fabric.node_name[a]} - {fabric.node_name[b]}"
                text += [f"{name}: {100 * util[link]:.1f}%"] * 3
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={"color": colors[k], "width": 2 if fabric.n_links <= MAX_LINK_HOVER else 0.5},
                hoverinfo="text" if text else "skip",
                text=text or None,
                name=f"{100 * edges[k]:.0f}-{100 * edges[k + 1]:.0f}%",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=y,
            mode="markers",
            marker={"size": 7, "color": "#444"},
            text=list(fabric.node_name),
            hoverinfo="text",
            name="nodes",
        )
    )
    fig.update_yaxes(
        tickvals=[int(r) for r in np.unique(roles)],
        ticktext=[Role(int(r)).label for r in np.unique(roles)],
    )
    fig.update_xaxes(showticklabels=False, showgrid=False)
    return _layout(fig, "Fabric: links coloured by mean utilization (busier direction)", 480)


def _uplink_figures(ecmp: dict) -> list:
    import plotly.graph_objects as go

    figs = []
    for tier in ecmp["tiers"]:
        fig = go.Figure()
        rows = [r for r in ecmp["switches"] if r["tier"] == tier["tier"]]
        shown = ""
        if len(rows) > MAX_UPLINK_SWITCHES:
            shown = f" ({MAX_UPLINK_SWITCHES} most unbalanced of {len(rows)} switches)"
            rows = sorted(rows, key=lambda r: -r["bytes"]["max_mean"])[:MAX_UPLINK_SWITCHES]
        for r in rows:
            fig.add_trace(
                go.Bar(
                    x=[f"{r['switch']}:{i}" for i in range(len(r["bytes_per_uplink"]))],
                    y=r["bytes_per_uplink"],
                    name=r["switch"],
                    customdata=r["flows_per_uplink"],
                    hovertemplate="%{x}: %{y} bytes, %{customdata} flows<extra></extra>",
                )
            )
        b = tier["bytes"]
        fig.update_layout(showlegend=False, yaxis_title="bytes")
        figs.append(
            _layout(
                fig,
                f"Uplink load, {tier['tier']}: max/mean {b['max_mean']:.2f}, CV {b['cv']:.3f}, "
                f"Jain {b['jain']:.3f}; collisions {tier['collisions']} "
                f"(uniform hashing {tier['collisions_expected']:.1f}){shown}",
            )
        )
    return figs


def _time_axis(series: dict) -> list[float]:
    t = np.asarray(series["t_ns"], dtype=np.int64)
    return ((t - (t[0] if t.size else 0)) / 1e3).tolist()


def _heatmap(series: dict):
    import plotly.graph_objects as go

    q = np.asarray(series["qdepth_max_bytes"], dtype=float)
    names = series["ports"]
    if q.size:
        keep = np.argsort(-q.max(axis=1), kind="stable")[:MAX_HEATMAP_PORTS]
        keep = keep[q[keep].max(axis=1) > 0] if (q.max(axis=1) > 0).any() else keep[:16]
        keep = np.sort(keep)
    else:
        keep = np.array([], dtype=int)
    fig = go.Figure(
        go.Heatmap(
            z=q[keep].tolist() if keep.size else [[0]],
            x=_time_axis(series),
            y=[names[i] for i in keep] if keep.size else ["-"],
            colorscale="Inferno",
            colorbar={"title": "bytes"},
        )
    )
    fig.update_xaxes(title="time (us)")
    return _layout(
        fig, "Queue depth (max per interval) of the ports that queued", max(360, 14 * len(keep))
    )


def _ecn_pfc_figure(series: dict):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    t = _time_axis(series)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=t, y=series["ecn_marked"], name="ECN-marked packets"))
    fig.add_trace(go.Scatter(x=t, y=series["pfc_sent"], name="PFC frames sent"))
    fig.add_trace(
        go.Scatter(
            x=t,
            y=(np.asarray(series["paused_ns"], dtype=float) / 1e3).tolist(),
            name="time paused, all ports (us)",
            line={"dash": "dot"},
        ),
        secondary_y=True,
    )
    fig.update_xaxes(title="time (us)")
    fig.update_yaxes(title="per interval", secondary_y=False)
    fig.update_yaxes(title="us paused", secondary_y=True)
    return _layout(fig, "ECN marks and PFC over time")


def _fct_figure(fct_ns: np.ndarray, d: dict):
    import plotly.graph_objects as go

    # binned here, so the page stays small however many flows there are
    us = np.sort(fct_ns.astype(float) / 1e3)
    fig = go.Figure()
    if us.size:
        counts, edges = np.histogram(us, bins=50 if us[-1] > us[0] else 1)
        fig.add_trace(
            go.Bar(
                x=((edges[:-1] + edges[1:]) / 2).tolist(),
                y=counts.tolist(),
                width=float(edges[1] - edges[0]) or None,
                name="flows",
            )
        )
        q = np.linspace(0, 1, min(len(us), CDF_POINTS))
        fig.add_trace(
            go.Scatter(x=np.quantile(us, q).tolist(), y=q.tolist(), name="CDF", yaxis="y2")
        )
    fig.update_layout(
        xaxis_title="flow completion time (us)",
        yaxis_title="flows",
        yaxis2={"overlaying": "y", "side": "right", "range": [0, 1], "title": "CDF"},
    )
    p = (
        f"p50 {format_time(int(d['p50']))}, p99 {format_time(int(d['p99']))}"
        if d["count"]
        else "no finished flows"
    )
    return _layout(fig, f"Flow completion times ({d['count']:,} flows; {p})")


def _collective_figure(coll: dict):
    import plotly.graph_objects as go

    ops = [o for o in coll["ops"] if o["time_ns"] is not None]
    fig = go.Figure()
    if ops:
        t0 = min(o["start_ns"] for o in ops)
        fig.add_trace(
            go.Bar(
                base=[(o["start_ns"] - t0) / 1e3 for o in ops],
                x=[o["time_ns"] / 1e3 for o in ops],
                y=[f"job {o['job']} op {o['op']} {o['kind']}" for o in ops],
                orientation="h",
                customdata=[
                    [format_size(o["bytes"]), format_rate(int(o["busbw_bps"]))] for o in ops
                ],
                hovertemplate="%{y}: %{x:.1f} us, %{customdata[0]}, busbw "
                "%{customdata[1]}bps<extra></extra>",
            )
        )
    fig.update_layout(xaxis_title="time (us)", yaxis={"autorange": "reversed"})
    return _layout(fig, "Collectives: start to end", max(300, 22 * len(ops) + 120))


def build_report(run) -> str:
    """The report of a run directory as one HTML string."""
    from analysis.topology import fabric_from_topology

    m = run_metrics(run, series=True)
    fabric = fabric_from_topology(run.topology())
    series = m.get("series")
    sections: list[tuple[str, list]] = [("Fabric", [_fabric_figure(fabric, series)])]
    if m["ecmp"]["tiers"]:
        sections.append(("ECMP: load per uplink", _uplink_figures(m["ecmp"])))
    if series is not None:
        sections.append(("Queues", [_heatmap(series)]))
        sections.append(("ECN and PFC", [_ecn_pfc_figure(series)]))
    flows = run.flows()
    if flows is not None and len(flows["src"]):
        done = flows["end_ns"] >= 0
        sections.append(
            (
                "Completion times",
                [_fct_figure((flows["end_ns"] - flows["start_ns"])[done], m["fct_ns"])],
            )
        )
    if m["collectives"]["count"]:
        sections.append(("Collectives", [_collective_figure(m["collectives"])]))

    spread = [r for r in m["pause_spread"] if r["cause"] == "pause"]
    notes = []
    if m["pause_spread"]:
        roots = [r for r in m["pause_spread"] if r["cause"] == "congestion"]
        notes.append(
            f"{len(m['pause_spread'])} ports were paused: {len(roots)} by congestion at the "
            f"next switch, {len(spread)} by pauses spreading upstream."
        )
    title = f"aifabric run {run.path.name}: {m['fabric']} ({m['engine']}, {m['status']})"
    return _page(title, m, sections, notes)


def _page(title: str, m: dict, sections: list[tuple[str, list]], notes: list[str]) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    body = []
    n_plots = 0
    for heading, figs in sections:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        for fig in figs:
            n_plots += 1
            body.append(
                pio.to_html(
                    fig,
                    full_html=False,
                    include_plotlyjs=False,
                    div_id=f"plot{n_plots}",
                    config={"displaylogo": False},
                )
            )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            _STYLE,
            _HOOK_HEAD,
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            f'</head><body data-plots="{n_plots}">',
            f"<h1>{html.escape(title)}</h1>",
            _summary_table(m),
            "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes),
            *body,
            '<pre id="aifabric-check"></pre>',
            f'<script type="application/json" id="aifabric-summary">'
            f"{html.escape(json.dumps(summary(m)))}</script>",
            _HOOK_TAIL,
            "</body></html>",
        ]
    )


def _capture_figures(m: dict) -> list[tuple[str, list]]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sections: list[tuple[str, list]] = []
    series = m.get("series")
    if series:
        t = _time_axis(series)
        fig = go.Figure()
        for k, row in enumerate(series["throughput_bps"]):
            fig.add_trace(
                go.Scatter(x=t, y=(np.asarray(row) / 1e9).tolist(), name=f"interface {k}")
            )
        fig.update_layout(xaxis_title="time (us)", yaxis_title="Gb/s")
        sections.append(
            (
                "Throughput",
                [_layout(fig, f"Throughput per interface ({format_time(series['bin_ns'])} bins)")],
            )
        )
        fig = make_subplots(specs=[[{"secondary_y": True}]])
        fig.add_trace(go.Scatter(x=t, y=series["ce"], name="CE-marked packets"))
        fig.add_trace(go.Scatter(x=t, y=series["cnp"], name="CNPs"))
        fig.add_trace(go.Scatter(x=t, y=series["pfc"], name="PFC frames"), secondary_y=True)
        fig.update_xaxes(title="time (us)")
        fig.update_yaxes(title="packets per bin", secondary_y=False)
        fig.update_yaxes(title="PFC frames per bin", secondary_y=True)
        sections.append(("ECN, CNP and PFC", [_layout(fig, "ECN marks, CNPs and PFC over time")]))
    if m["per_interface"]["imbalance"]:
        fig = go.Figure(
            go.Bar(
                x=[f"interface {k}" for k in range(len(m["per_interface"]["bytes"]))],
                y=m["per_interface"]["bytes"],
            )
        )
        b = m["per_interface"]["imbalance"]
        fig.update_layout(yaxis_title="bytes")
        sections.append(
            (
                "Load per interface",
                [
                    _layout(
                        fig,
                        f"Bytes per interface: max/mean {b['max_mean']:.2f}, CV {b['cv']:.3f}, "
                        f"Jain {b['jain']:.3f}",
                    )
                ],
            )
        )
    return sections


def build_capture_report(path) -> str:
    """The report of one capture file as one HTML string."""
    from analysis.capture import read_capture
    from analysis.metrics import capture_metrics, flow_durations

    cap = read_capture(path)
    m = capture_metrics(cap, series=True)
    sections = _capture_figures(m)
    fct = flow_durations(cap)
    if fct.size:
        sections.append(("Flow durations", [_fct_figure(fct, m["fct_ns"])]))
    notes = [f"Warning: {m['problem']}; the report covers what was read."] if m["problem"] else []
    title = f"aifabric capture {m['file']}: {m['packets']:,} packets"
    return _page(title, m, sections, notes)
