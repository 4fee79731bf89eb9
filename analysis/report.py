"""The HTML report of a run: one self-contained file (plotly.js inlined) that opens offline.

Sections, top to bottom: per job and run-wide figures (every job with a throughput
figure: busbw for a collective, goodput for a pattern); throughput over time of
every job's receivers, each job's run shaded in its colour and darker where its
receivers took under half their line rate, and of the busiest links; the fabric,
links coloured by utilization, hot and paused ports marked (above `MAX_DRAWN_NODES`
nodes, by rack and zone instead: each rack's links per tier, each zone's to the
ATSW layer); load per link for each ECMP tier beside uniform hashing (above
`MAX_UPLINK_SWITCHES` switches, each switch's max/mean first); a queue-depth heat
map of the ports that queued most; ECN, CNP and PFC on one timeline;
completion-time CDFs per job; a collective timeline, one lane per job, with each
op's ideal time. A job has one colour on every chart. Every chart over time marks
each applied fault at its time (a dotted line named `fault: TARGET ACTION`) and shades each
maintenance wave from its drain to its restore (named `wave N: SWITCHES`). A capture's report
has the summary, throughput per interface, ECN / CNP / PFC timelines, load
per interface and flow durations.

A small script records script errors and, once the page has loaded, writes
into `#aifabric-check` how many plots exist and rendered, every plot's data as
Plotly holds it, and the tick labels it drew on each axis (the browser test reads
the figures back from there).
"""

from __future__ import annotations

import html
import json
from dataclasses import replace

import numpy as np

from aifabric.analysis import results as R
from aifabric.analysis.metrics import run_metrics, summary
from aifabric.analysis.render import SUMMARY_ROWS, bytes_are, fmt, predicted_by_job
from aifabric.fabric.model import Role
from aifabric.fabric.spread import tier_name
from aifabric.fabric.units import format_rate, format_size, format_time

HEATMAP_PORTS = 20  # the ports with the deepest queues; the rest are summed up in a note
BUSIEST_LINKS = 8
MAX_UPLINK_SWITCHES = 32  # per tier: more switches are drawn one bar each, and the
DETAIL_SWITCHES = 4  # most unbalanced of them link by link
MAX_DRAWN_NODES = 1000  # a bigger fabric is drawn by rack and zone
LABEL_LINES = 8  # jobs named on the throughput chart, one line each, before the lines repeat
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
  var figures = [];
  plots.forEach(function (p) {
    if (p.querySelector(".main-svg")) { rendered += 1; }
    var title = p.layout && p.layout.title;
    figures.push({
      id: p.id,
      title: title && title.text !== undefined ? title.text : title,
      yaxis_type: p.layout && p.layout.yaxis ? p.layout.yaxis.type : null,
      annotations: ((p.layout && p.layout.annotations) || []).map(function (a) {
        return a.text;
      }),
      xaxis_type: p.layout && p.layout.xaxis ? p.layout.xaxis.type : null,
      shapes: ((p.layout && p.layout.shapes) || []).map(function (s) {
        return {x0: s.x0, x1: s.x1, y0: s.y0, y1: s.y1, yref: s.yref, name: s.name,
                fillcolor: s.fillcolor};
      }),
      axes: Object.keys(p._fullLayout || {}).filter(function (k) {
        return /^[xy]axis[0-9]*$/.test(k);
      }).map(function (k) {
        var a = p._fullLayout[k];
        return {name: k, type: a.type, ticks: (a._vals || []).map(function (v) {
          return v.text;
        })};
      }),
      data: (p.data || []).map(function (t) {
        return {type: t.type, name: t.name, x: t.x, y: t.y, z: t.z, base: t.base,
                customdata: t.customdata, text: t.text, mode: t.mode, textfont: t.textfont,
                line_color: t.line ? t.line.color : null,
                marker_color: t.marker ? t.marker.color : null};
      })
    });
  });
  document.getElementById("aifabric-check").textContent = JSON.stringify({
    errors: window.__aifabric.errors,
    plots: plots.length,
    rendered: rendered,
    expected: Number(document.body.dataset.plots),
    figures: figures
  });
});
</script>"""

_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table.summary { border-collapse: collapse; margin-bottom: 1em; }
table.summary td, table.summary th { padding: 0.2em 0.9em; border-bottom: 1px solid #ddd;
  text-align: left; }
table.summary td.num { text-align: right; font-variant-numeric: tabular-nums; }
p.note { color: #666; font-size: 0.9em; }
#aifabric-check { display: none; }
</style>"""

JOB_COLUMNS = (
    ("kind", "kind", None),
    ("time_ns", "time", "time"),
    ("ideal_ns", "ideal (line rate)", "time"),
    ("efficiency", "efficiency", "pct"),
    ("busbw_bps", "busbw (nccl-tests, collectives)", "rate"),
    ("goodput_bps", "goodput (patterns: bytes delivered / time)", "rate"),
    ("fct_p99_ns", "flow completion p99", "time"),
)


def _summary_tables(s: R.Summary) -> str:
    out = []
    if s.jobs:
        head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in JOB_COLUMNS)
        rows = []
        for j in s.jobs:
            cells = "".join(
                f'<td class="num">{fmt(getattr(j, key), kind)}</td>'
                if kind
                else f"<td>{html.escape(str(getattr(j, key)))}</td>"
                for key, _, kind in JOB_COLUMNS
            )
            rows.append(f"<tr><th>{html.escape(j.name)}</th>{cells}</tr>")
        out.append(
            f'<table class="summary" id="jobs"><tr><th>job</th>{head}</tr>{"".join(rows)}</table>'
        )
    rows = [
        f'<tr><th>{html.escape(label)}</th><td class="num">{fmt(getattr(s, key), kind)}</td></tr>'
        for key, label, kind in SUMMARY_ROWS
    ]
    if s.ecmp_tier:
        rows.insert(
            0,
            f"<tr><th>ECMP tier furthest from uniform hashing: {html.escape(s.ecmp_tier)}"
            f'</th><td class="num">max/mean {fmt(s.ecmp_max_mean, "ratio")} (uniform '
            f"{fmt(s.ecmp_max_mean_expected, 'ratio')})</td></tr>",
        )
    out.append('<table class="summary" id="run">' + "".join(rows) + "</table>")
    return "".join(out)


def _layout(fig, title: str, height: int = 420):
    fig.update_layout(
        title={"text": title},
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        template="plotly_white",
    )
    return fig


def _start_ns(series: R.PortSeries | R.CaptureSeries) -> int:
    """Where a series' time axis starts: its first sample."""
    return int(series.t_ns[0]) if len(series.t_ns) else 0


def _time_axis(series: R.PortSeries | R.CaptureSeries) -> list[float]:
    t = np.asarray(series.t_ns, dtype=np.int64)
    return ((t - _start_ns(series)) / 1e3).tolist()


FAULT_COLOURS = {"down": "#b2182b", "drain": "#e08214", "up": "#1b7837"}


def _fault_markers(fig, m: R.RunMetrics, t0_ns: int, **where) -> None:
    """A dotted line at each applied fault's time (when the engine applied it), and each
    maintenance wave's window (drain to restore) shaded, on a chart whose x axis is
    microseconds from `t0_ns`; `where` picks subplots (`row="all"`)."""
    for w in m.waves or ():
        if w.reached:
            fig.add_vrect(
                x0=(w.drain_ns - t0_ns) / 1e3,
                x1=(w.restore_ns - t0_ns) / 1e3,
                fillcolor=FAULT_COLOURS["drain"],
                opacity=0.07,
                line_width=0,
                name=f"wave {w.wave}: {', '.join(w.switches)}",
                annotation={"text": f"wave {w.wave}", "font_size": 10},
                annotation_position="bottom left",
                **where,
            )
    for f in m.faults or ():
        fig.add_vline(
            x=(f.applied_ns - t0_ns) / 1e3,
            line={"dash": "dot", "width": 1.5, "color": FAULT_COLOURS.get(f.action, "#444")},
            name=f"fault: {f.target} {f.action}",
            annotation={"text": f"{f.target} {f.action}", "textangle": -90, "font_size": 10},
            annotation_position="top left",
            **where,
        )


PALETTE = (  # plotly's qualitative "Plotly": a job (a sweep's configuration) keeps its colour
    "#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a",
    "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52",
)  # fmt: skip


def job_colour(m: R.RunMetrics, job: int) -> str:
    """The colour of job number `job` on every chart of the report (by its place in the run's
    jobs, the palette repeating after ten)."""
    place = next((i for i, j in enumerate(m.jobs) if j.job == job), job)
    return PALETTE[place % len(PALETTE)]


def _span_label(j: R.Job, predicted_ns: int | None) -> str:
    """A job's name on its shaded run, with its time beside what it would take on an idle
    fabric (NCCL's cost model for collectives, else its ops at line rate): a collective
    slow by its own nature reads as such, not as a victim of the fabric."""
    if j.time_ns is None:
        return f"{j.name}: did not finish"
    if predicted_ns:
        return f"{j.name}: {fmt(j.time_ns, 'time')} (NCCL model {fmt(predicted_ns, 'time')})"
    return f"{j.name}: {fmt(j.time_ns, 'time')} (line rate {fmt(j.ideal_ns, 'time')})"


def _job_spans(fig, m: R.RunMetrics, series: R.PortSeries) -> None:
    """Per job, in its colour: its run (first op's start to last op's end, or to the end of
    the samples for a job that did not finish, as the analyzer judges it) shaded lightly and
    named at the top, and its stretches below the low mark of its receivers' line rate as a
    darker band from 0 up to that mark (the analyzer's `low_intervals`)."""
    t0_ns = _start_ns(series)
    last_ns = int(series.t_ns[-1]) + series.interval_ns if series.t_ns else t0_ns
    low = m.throughput.low_utilization
    predicted = predicted_by_job(m)
    for place, j in enumerate(m.jobs):
        if j.start_ns is None:
            continue
        end = j.end_ns if j.end_ns is not None else last_ns
        fig.add_vrect(
            x0=(j.start_ns - t0_ns) / 1e3,
            x1=(end - t0_ns) / 1e3,
            fillcolor=job_colour(m, j.job),
            opacity=0.06,
            line_width=0,
            layer="below",
            name=f"{j.name}: runs",
            # a line per job (repeating after LABEL_LINES), so that jobs starting together
            # keep their names apart
            annotation={
                "text": _span_label(j, predicted.get(j.name)),
                "font_size": 10,
                "font_color": job_colour(m, j.job),
                "yshift": -13 * (place % LABEL_LINES),
            },
            annotation_position="top left",
        )
    for w in m.throughput.low_intervals or ():
        fig.add_shape(
            type="rect",
            x0=(w.start_ns - t0_ns) / 1e3,
            x1=(w.end_ns - t0_ns) / 1e3,
            y0=0,
            y1=100 * low,
            fillcolor=job_colour(m, w.job),
            opacity=0.22,
            line_width=0,
            layer="below",
            name=f"{w.name}: below {100 * low:.0f}%",
        )


def _throughput_figures(m: R.RunMetrics, series: R.PortSeries) -> list:
    import plotly.graph_objects as go

    t = _time_axis(series)
    th = m.throughput
    figs = []
    fig = go.Figure()
    for j in th.jobs:
        fig.add_trace(
            go.Scatter(
                x=t,
                y=(100 * np.asarray(j.utilization)).tolist(),
                name=f"{j.name} ({j.receivers} receivers)",
                line={"color": job_colour(m, j.job)},
                customdata=j.rx_bytes_per_interval,
                hovertemplate="%{x:.0f} us: %{y:.1f}% of line rate, %{customdata:,} bytes"
                "<extra>%{fullData.name}</extra>",
            )
        )
    _job_spans(fig, m, series)
    fig.add_hline(y=100 * th.low_utilization, line={"dash": "dash", "width": 1, "color": "#888"})
    _fault_markers(fig, m, _start_ns(series))
    fig.update_xaxes(title="time (us)")
    fig.update_yaxes(title="% of the receivers' line rate", range=[0, 105])
    figs.append(
        _layout(
            fig,
            "Throughput into each job's receivers (each job's run shaded in its colour, darker "
            f"where its receivers took under {100 * th.low_utilization:.0f}% of their line rate)",
        )
    )
    fig = go.Figure()
    for b in th.busiest[:BUSIEST_LINKS]:
        fig.add_trace(
            go.Scatter(
                x=t,
                y=(100 * np.asarray(b.utilization)).tolist(),
                name=b.port,
                customdata=b.tx_bytes_per_interval,
                hovertemplate="%{x:.0f} us: %{y:.1f}%, %{customdata:,} bytes"
                "<extra>%{fullData.name}</extra>",
            )
        )
    _fault_markers(fig, m, _start_ns(series))
    fig.update_xaxes(title="time (us)")
    fig.update_yaxes(title="% of line rate", range=[0, 105])
    figs.append(_layout(fig, f"The {min(len(th.busiest), BUSIEST_LINKS)} busiest links"))
    return figs


def _fabric_figure(fabric, m: R.RunMetrics, ports):
    import plotly.colors as pc
    import plotly.graph_objects as go

    roles = fabric.node_role.astype(int)
    x = np.zeros(fabric.n_nodes)
    y = roles.astype(float)
    for r in np.unique(roles):
        ids = np.flatnonzero(roles == r)
        x[ids] = (np.arange(len(ids)) + 0.5) / len(ids)
    util = np.zeros(fabric.n_links)
    if ports is not None and len(ports["t_ns"]):
        port = np.asarray(ports["port"], dtype=np.int64)
        span_ns = int(ports["interval_ns"]) * len(ports["t_ns"])
        mean = ports.total("tx_bytes") * 8e9 / span_ns / fabric.port_rate_bps[port]
        np.maximum.at(util, port // 2, mean)
    fig = go.Figure()
    edges = np.linspace(0, max(1.0, float(util.max()) if util.size else 1.0), 11)
    colors = pc.sample_colorscale("Viridis", list(np.linspace(0, 1, 10)))
    which = np.clip(np.searchsorted(edges, util, side="right") - 1, 0, 9)
    hover = fabric.n_links <= MAX_LINK_HOVER
    for k in range(10):
        links = np.flatnonzero(which == k)
        if not links.size:
            continue
        xs, ys, text = [], [], []
        for link in links:
            a, b = fabric.link_a[link], fabric.link_b[link]
            xs += [x[a], x[b], None]
            ys += [y[a], y[b], None]
            if hover:
                text += [f"{fabric.port_name(2 * link)}: {100 * util[link]:.1f}%"] * 3
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={"color": colors[k], "width": 2 if hover else 0.5},
                hoverinfo="text" if text else "skip",
                text=text or None,
                name=f"{100 * edges[k]:.0f}-{100 * edges[k + 1]:.0f}%",
            )
        )
    hot = {h.port for h in m.hotspots[:5]}
    paused = {r.port for r in m.pause_spread}
    labelled = set()
    for ports, name, color, symbol in (
        (hot, "hot spot (queue, pauses caused)", "#d62728", "x"),
        (paused - hot, "paused by PFC", "#ff7f0e", "triangle-up"),
    ):
        px, py, pt = [], [], []
        for port_name in sorted(ports):
            p = fabric.port_id(port_name)
            a, b = fabric.port_node[p], fabric.port_peer[p]
            px.append(x[a] + 0.25 * (x[b] - x[a]))
            py.append(y[a] + 0.25 * (y[b] - y[a]))
            pt.append(port_name)
            if color == "#d62728":
                labelled.add(int(a))
        if px:
            fig.add_trace(
                go.Scatter(
                    x=px,
                    y=py,
                    mode="markers",
                    marker={"size": 13, "color": color, "symbol": symbol},
                    text=pt,
                    hoverinfo="text",
                    name=name,
                )
            )
    fig.add_trace(
        go.Scatter(
            x=x.tolist(),
            y=y.tolist(),
            mode="markers",
            marker={"size": 7, "color": "#444"},
            text=list(fabric.node_name),
            hoverinfo="text",
            name="nodes (name on hover)",
        )
    )
    if labelled:
        ids = sorted(labelled)
        fig.add_trace(
            go.Scatter(
                x=[float(x[i]) for i in ids],
                y=[float(y[i]) for i in ids],
                mode="text",
                text=[fabric.node_name[i] for i in ids],
                textposition="bottom center",
                # a halo in the page's colour: the label stays legible across the links
                textfont={"shadow": "auto", "size": 13},
                hoverinfo="skip",
                name="nodes with hot spots",
            )
        )
    fig.update_yaxes(
        tickvals=[int(r) for r in np.unique(roles)],
        ticktext=[Role(int(r)).label for r in np.unique(roles)],
    )
    fig.update_xaxes(showticklabels=False, showgrid=False)
    return _layout(fig, "Fabric: links coloured by mean utilization (busier direction)", 520)


def rack_zone_load(fabric, ports) -> list[dict]:
    """The sampled ports' bytes summed by tier (`nic>rtsw`: the egress of a NIC toward its
    rack switch) and by the rack (a port between a NIC and an RTSW, or an RTSW and a CTSW)
    or the zone (between a CTSW and an ATSW; rack -1) of its lower end, from the port
    series' entries alone: per group its tier, zone, rack, ports, bytes and capacity (the
    ports' rates, bit/s), in tier, zone, rack order."""
    port = np.asarray(ports["port"], dtype=np.int64)
    tx = ports.total("tx_bytes").astype(np.int64)
    a, b = fabric.port_node[port], fabric.port_peer[port]
    ra = fabric.node_role[a].astype(np.int64)
    rb = fabric.node_role[b].astype(np.int64)
    lower = np.where(ra <= rb, a, b)
    in_rack = fabric.node_role[lower] <= Role.RTSW
    key = np.stack(
        [
            4 * ra + rb,
            fabric.node_zone[lower].astype(np.int64),
            np.where(in_rack, fabric.node_rack[lower], -1).astype(np.int64),
        ],
        axis=1,
    )
    groups, which = np.unique(key, axis=0, return_inverse=True)
    which = which.reshape(-1)
    n = len(groups)
    rate = fabric.port_rate_bps[port].astype(np.int64)
    return [
        {
            "tier": tier_name(int(g[0])),
            "zone": int(g[1]),
            "rack": int(g[2]),
            "ports": int(c),
            "bytes": int(x),
            "capacity_bps": int(r),
        }
        for g, c, x, r in zip(
            groups,
            np.bincount(which, minlength=n),
            np.bincount(which, weights=tx, minlength=n),
            np.bincount(which, weights=rate, minlength=n),
            strict=True,
        )
    ]


def _rack_zone_figures(fabric, ports, m: R.RunMetrics) -> list:
    """A fabric too big to draw node by node, by rack and zone: a heat map of each rack's
    links per tier (a row per zone and tier, a column per rack), coloured by their mean
    utilization over the run, and the zones' links to the ATSW layer as bars; the racks
    and zones holding the hot spots marked."""
    import plotly.graph_objects as go

    rows = rack_zone_load(fabric, ports)
    span_ns = max(int(ports["interval_ns"]) * len(ports["t_ns"]), 1)

    def util(r):
        return 100 * r["bytes"] * 8e9 / span_ns / r["capacity_bps"] if r["capacity_bps"] else 0.0

    racks = [r for r in rows if r["rack"] >= 0]
    zones = [r for r in rows if r["rack"] < 0]
    lanes = list(dict.fromkeys((r["zone"], r["tier"]) for r in racks))
    cols = sorted({r["rack"] for r in racks})
    where = {lane: i for i, lane in enumerate(lanes)}
    at = {rack: i for i, rack in enumerate(cols)}
    z = [[None] * len(cols) for _ in lanes]
    data = [[None] * len(cols) for _ in lanes]
    for r in racks:
        i, k = where[(r["zone"], r["tier"])], at[r["rack"]]
        z[i][k] = util(r)
        data[i][k] = [r["bytes"], r["ports"]]
    labels = [f"z{zone} {tier}" for zone, tier in lanes]
    # the colour scale reaches the busiest cell (a nice number at least 1%), so that racks
    # apart from each other stand out in a run that loads the fabric lightly on average
    busiest = max((util(r) for r in racks), default=0.0)
    top = next(m * 10**k for k in range(3) for m in (1, 2, 5) if busiest <= m * 10**k)
    figs = []
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=cols,
            y=labels,
            customdata=data,
            colorscale="Viridis",
            zmin=0,
            zmax=min(top, 100),
            colorbar={"title": {"text": "% of capacity"}},
            hovertemplate="%{y}, rack %{x}: %{z:.1f}% of its %{customdata[1]} links' "
            "capacity, %{customdata[0]:,} bytes<extra></extra>",
            name="racks",
        )
    )
    hot = [fabric.port_id(h.port) for h in m.hotspots[:5]]
    hx, hy, ht = [], [], []
    for p in hot:
        a, b = int(fabric.port_node[p]), int(fabric.port_peer[p])
        low = a if fabric.node_role[a] <= fabric.node_role[b] else b
        tier = tier_name(4 * int(fabric.node_role[a]) + int(fabric.node_role[b]))
        lane = (int(fabric.node_zone[low]), tier)
        if fabric.node_role[low] <= Role.RTSW and lane in where:
            hx.append(int(fabric.node_rack[low]))
            hy.append(labels[where[lane]])
            ht.append(fabric.port_name(p))
    if hx:
        fig.add_trace(
            go.Scatter(
                x=hx, y=hy, text=ht, mode="markers", hoverinfo="text",
                marker={"symbol": "x", "size": 12, "color": "#d62728"},
                name="hot spot (queue, pauses caused)",
            )
        )  # fmt: skip
    fig.update_xaxes(title="rack", type="category" if len(cols) <= 64 else "linear")
    fig.update_yaxes(autorange="reversed", type="category", automargin=True)
    figs.append(
        _layout(
            fig,
            f"Fabric by rack: {len(cols)} racks in {len({r['zone'] for r in racks})} zone(s), "
            "each rack's links per tier<br>coloured by their mean utilization "
            f"({fabric.n_nodes:,} nodes: too many to draw one by one)",
            max(320, 26 * len(lanes) + 160),
        )
    )
    if zones:
        fig = go.Figure()
        for tier in dict.fromkeys(r["tier"] for r in zones):
            mine = [r for r in zones if r["tier"] == tier]
            fig.add_trace(
                go.Bar(
                    x=[f"z{r['zone']}" for r in mine],
                    y=[util(r) for r in mine],
                    customdata=[[r["bytes"], r["ports"]] for r in mine],
                    name=tier,
                    hovertemplate="%{x}: %{y:.1f}% of its %{customdata[1]} links' capacity, "
                    "%{customdata[0]:,} bytes<extra>%{fullData.name}</extra>",
                )
            )
        fig.update_yaxes(title="% of capacity", rangemode="tozero")
        figs.append(
            _layout(fig, "Fabric by zone: each zone's links to the ATSW layer, mean utilization")
        )
    return figs


def _tier_title(tier: R.EcmpTier) -> str:
    b, e = tier.bytes, tier.bytes_expected
    return (
        f"{tier.tier}: {tier.qps} QPs had a choice of {tier.links} links;<br>"
        f"max/mean {b.max_mean:.2f} (uniform {e.max_mean:.2f}), per switch "
        f"{tier.switch_max_mean:.2f} ({tier.switch_max_mean_expected:.2f}), "
        f"collisions {tier.collisions} ({tier.collisions_expected:.1f})"
    )


def _switches_figure(tier: R.EcmpTier, rows: list[R.EcmpSwitch]):
    """A tier of many switches: each switch's max/mean of bytes over its links, most
    unbalanced first, beside what uniform hashing of its QPs gives (one bar per switch, so
    it stays readable at hundreds of switches)."""
    import plotly.graph_objects as go

    rows = sorted(rows, key=lambda r: (-r.bytes.max_mean, r.switch))
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=[r.switch for r in rows],
            y=[r.bytes.max_mean for r in rows],
            customdata=[[r.qps, r.links, r.collisions] for r in rows],
            name="observed",
            marker={"color": "#636efa"},
            hovertemplate="%{x}: max/mean %{y:.2f}, %{customdata[0]} QPs on %{customdata[1]} "
            "links, %{customdata[2]} collisions<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[r.switch for r in rows],
            y=[r.bytes_expected.max_mean for r in rows],
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 10, "color": "#222"},
            name="uniform hashing",
            hovertemplate="%{x}: uniform %{y:.2f}<extra></extra>",
        )
    )
    fig.update_xaxes(showticklabels=len(rows) <= 64, title=f"{len(rows)} switches")
    fig.update_yaxes(title="max/mean of bytes over its links", rangemode="tozero")
    return _layout(
        fig, f"{_tier_title(tier)} (per switch, most unbalanced first)", 460
    )  # fmt: skip


def _uplink_figures(ecmp: R.Ecmp) -> list:
    import plotly.graph_objects as go

    figs = []
    for tier in ecmp.tiers:
        fig = go.Figure()
        rows = [r for r in ecmp.switches if r.tier == tier.tier]
        shown = ""
        if len(rows) > MAX_UPLINK_SWITCHES:
            figs.append(_switches_figure(tier, rows))
            shown = f" ({DETAIL_SWITCHES} most unbalanced of {len(rows)} switches)"
            rows = sorted(rows, key=lambda r: (-r.bytes.max_mean, r.switch))[:DETAIL_SWITCHES]
        for r in rows:
            fig.add_trace(
                go.Bar(
                    x=r.ports,
                    y=r.bytes_per_link,
                    name=r.switch,
                    customdata=r.qps_per_link,
                    hovertemplate="%{x}: %{y:,} bytes, %{customdata} QPs<extra></extra>",
                )
            )
        fig.update_layout(showlegend=False, yaxis_title="bytes")
        # a link's name is on hover; past 64 bars the names would overlap
        fig.update_xaxes(showticklabels=sum(len(r.ports) for r in rows) <= 64)
        figs.append(_layout(fig, f"{_tier_title(tier)}{shown}", 460))
    return figs


def _heatmap(series: R.PortSeries, m: R.RunMetrics, ports):
    """The deepest queues over time, their rows built from the port samples' entries (only
    those ports' rows: a dense [port][sample] array is gigabytes at thousands of ports)."""
    import plotly.graph_objects as go

    names = series.ports
    peak = ports.peak("qdepth_max_bytes").astype(float)
    order = np.argsort(-peak, kind="stable")
    keep = order[:HEATMAP_PORTS]
    keep = keep[peak[keep] > 0]
    rest = order[HEATMAP_PORTS:]
    rest = rest[peak[rest] > 0]
    fig = go.Figure()
    if keep.size:
        q = ports.rows("qdepth_max_bytes", keep).astype(np.float64)
        z = np.log10(np.maximum(q, 1.0))
        top = max(1, int(np.ceil(z.max())))
        ticks = list(range(0, top + 1))
        fig.add_trace(
            go.Heatmap(
                z=z.tolist(),
                x=_time_axis(series),
                y=[names[i] for i in keep],
                customdata=q.astype(np.int64).tolist(),
                hovertemplate="%{y} at %{x:.0f} us: %{customdata:,} bytes<extra></extra>",
                colorscale="Inferno",
                zmin=0,
                zmax=top,
                colorbar={
                    "title": {"text": "max queue"},
                    "tickvals": ticks,
                    "ticktext": [format_size(10**k) for k in ticks],
                },
            )
        )
    _fault_markers(fig, m, _start_ns(series))
    fig.update_xaxes(title="time (us)")
    fig.update_yaxes(autorange="reversed", dtick=1, automargin=True, type="category")
    note = (
        f"; {len(rest)} more ports queued, none past {format_size(int(peak[rest].max()))}"
        if rest.size
        else ""
    )
    return _layout(
        fig,
        f"Queue depth (max per interval, log scale) of the {len(keep)} ports with the deepest "
        f"queues{note}",
        max(320, 24 * len(keep) + 140),
    )


def _count_ticks(fig, counts, row: int) -> None:
    """Whole-number ticks from 0 on subplot `row`'s y axis, which plots `counts`: a step of
    1, 2 or 5 times a power of ten, at most 5 steps to the largest count (plotly's own
    step on a small range is 0.5 or 0.2, which a whole-number format shows as 0, 1, 1)."""
    top = max((max(c, default=0) for c in counts), default=0)
    step = next(m * 10**k for k in range(19) for m in (1, 2, 5) if top <= 5 * m * 10**k)
    fig.update_yaxes(rangemode="tozero", tickformat=",d", tick0=0, dtick=step, row=row, col=1)


def _ecn_pfc_figure(series: R.PortSeries, cnp_sent, m: R.RunMetrics):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    t = _time_axis(series)
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=(
            "ECN-marked packets"
            + (" and CNPs" if series.cnp_sent is not None else "")
            + " per interval",
            "PFC frames sent per interval",
            "ports paused (any time in the interval)",
        ),
    )
    fig.add_trace(go.Scatter(x=t, y=series.ecn_marked, name="ECN-marked packets"), 1, 1)
    if series.cnp_sent is not None:
        fig.add_trace(go.Scatter(x=t, y=series.cnp_sent, name="CNPs"), 1, 1)
    fig.add_trace(go.Bar(x=t, y=series.pfc_sent, name="PFC frames sent"), 2, 1)
    fig.add_trace(
        go.Scatter(
            x=t,
            y=series.paused_ports,
            customdata=series.paused_ns,
            name="ports paused",
            line={"shape": "hv"},
            hovertemplate="%{x:.0f} us: %{y} ports, %{customdata:,} ns paused in all"
            "<extra></extra>",
        ),
        3,
        1,
    )
    _count_ticks(fig, [series.ecn_marked, series.cnp_sent or []], 1)
    _count_ticks(fig, [series.pfc_sent], 2)
    _count_ticks(fig, [series.paused_ports], 3)
    _fault_markers(fig, m, _start_ns(series), row="all", col=1)
    fig.update_xaxes(title="time (us)", row=3, col=1)
    cnp = "CNPs not recorded" if cnp_sent is None else f"{cnp_sent:,} CNPs sent"
    counted = series.cnp_sent is not None or cnp_sent is None
    when = "" if counted else " (the run records their total)"
    return _layout(fig, f"ECN, CNPs and PFC over time: {cnp}{when}", 640)


def _fct_figure(groups: list[tuple[str, np.ndarray, str | None]], d: R.Distribution):
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, fct_ns, colour in groups:
        us = np.sort(np.maximum(fct_ns.astype(float), 1.0) / 1e3)
        if not us.size:
            continue
        q = np.linspace(0, 1, min(len(us), CDF_POINTS))
        fig.add_trace(
            go.Scatter(
                x=np.quantile(us, q).tolist(),
                y=q.tolist(),
                name=f"{name} ({len(us):,} flows)",
                line={"shape": "hv", "color": colour},
            )
        )
    fig.update_xaxes(type="log", title="flow completion time (us, log scale)")
    fig.update_yaxes(range=[0, 1.02], tickvals=[0, 0.25, 0.5, 0.75, 0.9, 1], title="CDF")
    p = (
        f"p50 {format_time(int(d.p50))}, p99 {format_time(int(d.p99))}"
        if d.count
        else "no finished flows"
    )
    return _layout(fig, f"Flow completion times, CDF per job ({d.count:,} flows; {p})")


def _collective_figure(coll: R.Collectives, m: R.RunMetrics):
    import plotly.graph_objects as go

    ops = [o for o in coll.ops if o.start_ns >= 0]
    fig = go.Figure()
    if ops:
        t0 = min(o.start_ns for o in ops)
        lanes = [f"{o.job_name}" for o in ops]
        fig.add_trace(
            go.Bar(
                base=[(o.start_ns - t0) / 1e3 for o in ops],
                x=[(o.time_ns or 0) / 1e3 for o in ops],
                y=lanes,
                orientation="h",
                name="actual",
                width=0.6,
                marker={"color": [job_colour(m, o.job) for o in ops]},
                customdata=[
                    [
                        o.op,
                        o.kind,
                        f"{format_size(o.bytes)} {bytes_are(o)}",
                        o.busbw_bps,
                        o.efficiency,
                    ]
                    for o in ops
                ],
                hovertemplate="%{y}, op %{customdata[0]} %{customdata[1]}: %{x:.1f} us, "
                "%{customdata[2]}, busbw %{customdata[3]:.4s}bps, efficiency "
                "%{customdata[4]:.0%}<extra></extra>",
            )
        )
        ideal = [o for o in ops if o.ideal_ns]
        fig.add_trace(
            go.Bar(
                base=[(o.start_ns - t0) / 1e3 for o in ideal],
                x=[o.ideal_ns / 1e3 for o in ideal],
                y=[o.job_name for o in ideal],
                orientation="h",
                name="ideal at line rate",
                width=0.2,
                marker={"color": "#222"},
                hovertemplate="%{y}: ideal %{x:.1f} us<extra></extra>",
            )
        )
        _fault_markers(fig, m, t0)
    fig.update_layout(barmode="overlay", xaxis_title="time (us)", yaxis={"autorange": "reversed"})
    lanes = len({o.job for o in ops})
    return _layout(
        fig, "Collectives: one lane per job, each op start to end, its ideal time inside",
        max(300, 60 * lanes + 140),
    )  # fmt: skip


def build_report(run) -> str:
    """The report of a run directory as one HTML string."""
    from aifabric.fabric.export import fabric_from_topology

    m = run_metrics(run, series=True, per_port=False)
    fabric = fabric_from_topology(run.topology())
    series = m.series
    ports = run.ports() if series is not None else None
    sections: list[tuple[str, list]] = []
    if series is not None and m.throughput.jobs:
        sections.append(("Throughput", _throughput_figures(m, series)))
    if ports is not None and fabric.n_nodes > MAX_DRAWN_NODES:
        sections.append(("Fabric", _rack_zone_figures(fabric, ports, m)))
    else:
        sections.append(("Fabric", [_fabric_figure(fabric, m, ports)]))
    if m.ecmp.tiers:
        sections.append(("ECMP: load per link, beside uniform hashing", _uplink_figures(m.ecmp)))
    if series is not None:
        sections.append(("Queues", [_heatmap(series, m, ports)]))
        sections.append(("ECN, CNPs and PFC", [_ecn_pfc_figure(series, m.cnp_sent, m)]))
    flows = run.flows()
    if flows is not None and len(flows["src"]):
        done = flows["end_ns"] >= 0
        fct = flows["end_ns"] - flows["start_ns"]
        groups = [
            (j.name, fct[done & (flows["job"] == j.job)], job_colour(m, j.job)) for j in m.jobs
        ]
        sections.append(("Completion times", [_fct_figure(groups, m.fct_ns)]))
    if m.collectives.count:
        sections.append(("Collectives", [_collective_figure(m.collectives, m)]))

    notes = []
    if m.pause_spread:
        roots = {r.root for r in m.pause_spread if r.root}
        spread = [r for r in m.pause_spread if r.cause == "pause"]
        notes.append(
            f"{len(m.pause_spread)} ports were paused by PFC, victims of {len(roots)} "
            f"congested port(s) ({', '.join(sorted(roots))}); {len(spread)} of them by pauses "
            "spreading upstream."
        )
    for f in m.faults or ():
        moved = "" if f.flows_moved is None else f", {f.flows_moved:,} flows underway moved"
        notes.append(
            f"fault: {f.target} {f.action} at {format_time(f.applied_ns)} "
            f"({f.switches_rerouted:,} switches re-routed{moved}; the dotted lines)."
        )
    for w in (w for w in m.waves or () if w.reached):
        kept = ", ".join(
            f"{c.tier} {c.links_kept}/{c.links} ({100 * c.fraction:.0f}%)" for c in w.capacity_kept
        )
        rates = ", ".join(
            f"{j.name} {format_rate(int(j.rx_bps))}bps per receiver"
            for j in w.jobs
            if j.rx_bps is not None
        )
        notes.append(
            f"wave {w.wave} ({', '.join(w.switches)}) from {format_time(w.drain_ns)} to "
            f"{format_time(w.restore_ns)}: capacity kept {kept or 'all'}"
            + (f"; {rates}" if rates else "")
            + "; shaded."
        )
    for w in m.throughput.worst_intervals[:3]:
        notes.append(
            f"{w.name}: from {format_time(w.start_ns)} to {format_time(w.end_ns)} its "
            f"receivers took {100 * w.utilization:.0f}% of their line rate "
            f"({format_rate(int(w.rx_bps))}bps)."
        )
    title = f"aifabric run {run.path.name}: {m.fabric} ({m.engine}, {m.status})"
    return _page(title, summary(m), sections, notes)


def _page(title: str, s: R.Summary, sections: list[tuple[str, list]], notes: list[str]) -> str:
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
            _summary_tables(s),
            "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes),
            *body,
            '<pre id="aifabric-check"></pre>',
            f'<script type="application/json" id="aifabric-summary">'
            f"{html.escape(json.dumps(s.to_dict()))}</script>",
            _HOOK_TAIL,
            "</body></html>",
        ]
    )


def _capture_figures(m: R.CaptureMetrics) -> list[tuple[str, list]]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sections: list[tuple[str, list]] = []
    series = m.series
    if series:
        t = _time_axis(series)
        fig = go.Figure()
        for k, row in enumerate(series.throughput_bps):
            fig.add_trace(
                go.Scatter(x=t, y=(np.asarray(row) / 1e9).tolist(), name=f"interface {k}")
            )
        fig.update_layout(xaxis_title="time (us)", yaxis_title="Gb/s")
        sections.append(
            (
                "Throughput",
                [_layout(fig, f"Throughput per interface ({format_time(series.bin_ns)} bins)")],
            )
        )
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
        fig.add_trace(go.Scatter(x=t, y=series.ce, name="CE-marked packets"), 1, 1)
        fig.add_trace(go.Scatter(x=t, y=series.cnp, name="CNPs"), 1, 1)
        fig.add_trace(go.Bar(x=t, y=series.pfc, name="PFC frames"), 2, 1)
        _count_ticks(fig, [series.ce, series.cnp], 1)
        _count_ticks(fig, [series.pfc], 2)
        fig.update_yaxes(title="packets per bin", row=1, col=1)
        fig.update_yaxes(title="PFC frames per bin", row=2, col=1)
        fig.update_xaxes(title="time (us)", row=2, col=1)
        sections.append(
            (
                "ECN, CNP and PFC",
                [_layout(fig, f"ECN marks, CNPs ({m.cnp.count:,}) and PFC over time", 520)],
            )
        )
    if m.per_interface.imbalance:
        fig = go.Figure(
            go.Bar(
                x=[f"interface {k}" for k in range(len(m.per_interface.bytes))],
                y=m.per_interface.bytes,
            )
        )
        b = m.per_interface.imbalance
        fig.update_layout(yaxis_title="bytes")
        sections.append(
            (
                "Load per interface",
                [
                    _layout(
                        fig,
                        f"Bytes per interface: max/mean {b.max_mean:.2f}, CV {b.cv:.3f}, "
                        f"Jain {b.jain:.3f}",
                    )
                ],
            )
        )
    return sections


def build_capture_report(path, name: str | None = None) -> tuple[str, dict]:
    """The report of one capture file as one HTML string, and the capture's metrics; `name`
    is what the report calls it (default: the file's name)."""
    from aifabric.analysis.capture import read_capture
    from aifabric.analysis.metrics import capture_metrics, flow_durations

    cap = read_capture(path)
    m = capture_metrics(cap, series=True)
    if name:
        m = replace(m, file=name)
    sections = _capture_figures(m)
    fct = flow_durations(cap)
    if fct.size:
        sections.append(("Flow durations", [_fct_figure([("all flows", fct, None)], m.fct_ns)]))
    notes = [f"Warning: {m.problem}; the report covers what was read."] if m.problem else []
    title = f"aifabric capture {m.file}: {m.packets:,} packets"
    return _page(title, summary(m), sections, notes), m
