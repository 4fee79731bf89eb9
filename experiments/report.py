"""A sweep's HTML report: one self-contained page (plotly.js inlined) that opens offline.

Top to bottom: what the sweep tested and, for an experiment, the verdict (the
headline: the measured effect's interval against the published band), the
hypothesis, the measured effect with its 95% interval beside the published figure,
the DCQCN preset the runs ran and how the intervals are taken; the effects against
the baseline; then per metric a table per configuration (mean, std, min/max,
interval; one row per job when there are several), the metric per configuration
with error bars, and every seed's value as a scatter; busbw against message size
on a log axis when the size is swept.

A verdict is one of `VERDICTS`, judged on a headline effect's 95% interval (a
relative change of the report's metric) against the contrast's `published_band`:
inconclusive when the interval holds zero; not reproduced when it lies on the other
side of zero from the band; reproduced when it overlaps the band; else the same
direction, larger or smaller than published.
"""

from __future__ import annotations

import html
import math

from aifabric.experiments.sweepdir import SweepResults, open_sweep
from aifabric.fabric.errors import AifabricError

SIZE_KEYS = ("workload.size",)

_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { padding: 0.2em 0.8em; border-bottom: 1px solid #ddd; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
p.finding { font-size: 1.05em; } p.note { color: #666; font-size: 0.9em; }
p.verdict { font-size: 1.25em; margin: 0.3em 0; }
</style>"""


def _label(config: dict) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in config.items()) or "all runs"


def gain(effect: dict, higher_is_better: bool) -> float | None:
    """The effect's change turned so that positive is better."""
    if effect["change"] is None:
        return None
    return effect["change"] if higher_is_better else -effect["change"]


def headline_effects(res: SweepResults, contrast: dict) -> list[dict]:
    """The effects a contrast leads with: those matching its headline, else the best."""
    effects = res.effects(contrast)
    better = bool(res.report.get("higher_is_better", True))
    wanted = contrast.get("headline")
    if wanted:
        return [
            e
            for e in effects
            if all(str(e["configuration"].get(k)) == str(v) for k, v in wanted.items())
        ]
    scored = [e for e in effects if e["change"] is not None]
    return [max(scored, key=lambda e: gain(e, better))] if scored else []


def percent(x) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _effect_text(e: dict, better: bool) -> str:
    """`+45.2% (better), 95% interval +30.1% to +60.3%`: the change of the metric."""
    g = gain(e, better)
    word = "" if not g else (" (better)" if g > 0 else " (worse)")
    text = f"{percent(e['change'])}{word}"
    if e["change_low"] is not None:
        text += f", 95% interval {percent(e['change_low'])} to {percent(e['change_high'])}"
    return text


VERDICTS = (
    "reproduced",
    "same direction, larger than published",
    "same direction, smaller than published",
    "inconclusive",
    "not reproduced",
)


def verdict(low: float, high: float, band) -> str:
    """One of `VERDICTS`: an effect's interval [low, high] against a published band
    [lo, hi] (relative changes; None: an open end), which lies on one side of zero."""
    lo = -math.inf if band[0] is None else band[0]
    hi = math.inf if band[1] is None else band[1]
    if low <= 0 <= high:
        return "inconclusive"
    up = low > 0
    if up != (lo >= 0):
        return "not reproduced"
    if low <= hi and high >= lo:
        return "reproduced"
    beyond = (low > hi) == up  # further from zero than the band
    return f"same direction, {'larger' if beyond else 'smaller'} than published"


def band_text(band) -> str:
    """A published band as people read it: `0.0% to +40.0%`, `+30.0% or more`, `a decrease`."""
    lo, hi = band
    if hi is None:
        return "an increase" if lo == 0 else f"{percent(lo)} or more"
    if lo is None:
        return "a decrease" if hi == 0 else f"{percent(hi)} or less"
    return f"{percent(lo)} to {percent(hi)}"


def headline_verdicts(res: SweepResults) -> list[str]:
    """The page's headline: per contrast with a published band, the verdict of each
    headline effect (its configuration, change and interval, the band)."""
    lines = []
    for contrast in res.contrasts():
        band = contrast.get("published_band")
        if band is None:
            continue
        what = f"{contrast['label']}: " if contrast.get("label") else ""
        heads = headline_effects(res, contrast)
        if not heads:
            lines.append(f"{what}no run measured the headline; no verdict")
        for e in heads:
            config = _label(e["configuration"])
            if e["change_low"] is None:
                lines.append(f"{what}too few seeds for an interval; no verdict ({config})")
                continue
            lines.append(
                f"{what}{verdict(e['change_low'], e['change_high'], band)} "
                f"({percent(e['change'])}, 95% interval {percent(e['change_low'])} to "
                f"{percent(e['change_high'])}, published {band_text(band)}; {config})"
            )
    return lines


def finding_lines(res: SweepResults) -> list[str]:
    """The verdicts first, then the hypothesis, the measured effects with intervals, the
    published figures with their bands, the DCQCN preset that ran, and how the intervals
    are taken, as text."""
    from aifabric.experiments.stats import INTERVAL_NOTE

    report = res.report
    better = bool(report.get("higher_is_better", True))
    metric = report.get("metric")
    lines = [f"verdict:    {line}" for line in headline_verdicts(res)]
    for contrast in res.contrasts():
        if contrast.get("published_band") is None:
            said = _measured_only(headline_effects(res, contrast), better)
            if said:
                what = f"{contrast['label']}: " if contrast.get("label") else ""
                lines.append(f"verdict:    {what}{said}")
    if report.get("finding"):
        lines.append(f"hypothesis: {report['finding']}")
    seeds = len(res.spec.get("seeds", []))
    for contrast in res.contrasts():
        what = f"{contrast['label']}: " if contrast.get("label") else ""
        for e in headline_effects(res, contrast):
            lines.append(
                f"measured:   {what}{metric} {_effect_text(e, better)} with "
                f"{_label(e['configuration'])} against {_label(contrast['baseline'])} "
                f"({e['pairs']} of {seeds} seeds paired)"
            )
    contrasts = res.contrasts()
    if not contrasts and report.get("published"):
        lines.append(f"published:  {report['published']}")
    for contrast in contrasts:
        what = f"{contrast['label']}: " if contrast.get("label") else ""
        texts = [contrast.get("published")]
        if contrast.get("published_band") is not None:
            texts.append(f"as a band, {metric} {band_text(contrast['published_band'])}")
        if any(texts):
            lines.append(f"published:  {what}{'; '.join(t for t in texts if t)}")
    presets = res.dcqcn_presets()
    if presets:
        ran = ", ".join(f"{name} in {n}" for name, n in presets.items())
        others = " (the others without DCQCN)" if sum(presets.values()) < len(res.frame) else ""
        lines.append(f"DCQCN:      preset {ran} of {len(res.frame)} runs{others}")
    lines.append(f"intervals:  {INTERVAL_NOTE}")
    return lines


def _measured_only(heads: list[dict], better: bool) -> str:
    """Without a published figure: whether the headline effects are better, worse or
    inconclusive, so that a finding the simulator does not reproduce is said so."""
    if not heads:
        return ""
    n = len(heads)
    sign = 1 if better else -1
    up = sum(1 for e in heads if sign * e["change_low"] > 0 and sign * e["change_high"] > 0)
    down = sum(1 for e in heads if sign * e["change_low"] < 0 and sign * e["change_high"] < 0)
    if up == n or down == n:
        return f"no published figure; {'better' if up else 'worse'} in every interval"
    if not up and not down:
        return "no published figure; inconclusive (every interval spans zero)"
    parts = [f"{k} {word}" for k, word in ((up, "better"), (down, "worse")) if k]
    parts.append(f"{n - up - down} inconclusive (the interval spans zero)")
    return f"no published figure; of {n}: " + ", ".join(parts)


def format_value(value, column: str = "") -> str:
    """A figure as people read it: times and sizes with units, other numbers to 4 digits."""
    from aifabric.experiments.stats import split_metric
    from aifabric.fabric.units import format_size, format_time

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    metric = split_metric(column)[0].split(".")[0]
    if metric.endswith("_ns") and isinstance(value, int | float):
        return format_time(int(round(value)))
    if metric.endswith("_bytes") and isinstance(value, int | float):
        return format_size(int(round(value)))
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _table(headers: list[str], rows: list[list], words: int) -> str:
    """An HTML table; the first `words` columns left-aligned, the rest figures."""

    def cell(i, v):
        css = "" if i < words else ' class="num"'
        return f"<td{css}>{html.escape(str(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _short(values) -> str:
    return " / ".join(str(v) for v in values) or "all runs"


def _axis(res: SweepResults, column: str) -> tuple[str, float]:
    """The y-axis title of a metric and the factor its values are divided by."""
    metric = column.split("@")[0]
    if metric.split(".")[0].endswith("_ns"):
        return f"{column.replace('_ns', '')} (us)", 1e3
    return column, 1.0


def _error_bars(rows: list[dict], scale: float = 1.0) -> dict:
    """Plotly error bars from each row's mean to its 95% interval's ends, which need not be
    symmetric (a log-scale interval: stats.describe)."""

    def ends(r):
        if r["ci_high"] is None:
            return 0.0, 0.0
        return (r["ci_high"] - r["mean"]) / scale, (r["mean"] - r["ci_low"]) / scale

    up, down = zip(*(ends(r) for r in rows), strict=True) if rows else ((), ())
    return {"type": "data", "visible": True, "symmetric": False, "array": list(up),
            "arrayminus": list(down)}  # fmt: skip


def config_colours(res: SweepResults) -> dict[str, str]:
    """One colour per configuration, keyed by its label on the x axes (`_short` of its
    values), in the order the sweep ran them: the same on every chart of the page."""
    from aifabric.analysis.report import PALETTE
    from aifabric.experiments.stats import configurations

    configs = configurations(res.frame, res.keys)
    return {_short(c): PALETTE[i % len(PALETTE)] for i, c in enumerate(configs)}


def value_range(values) -> list[float]:
    """A metric's y axis: from 0 (or its lowest value where that is below 0) to 5% past its
    highest value or interval end, so that a spread over seeds is seen against the whole
    value (a 0.1% spread stays a thin band), never zoomed until it fills the axis."""
    x = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    lo, hi = min([0.0, *x]), max([0.0, *x])
    pad = 0.05 * (hi - lo) or 1.0
    return [lo - pad if lo < 0 else 0.0, hi + pad]


def _strip(fig, res: SweepResults, rows: list[dict], colours: dict, scale: float, col: int,
           legend: bool) -> list[float]:  # fmt: skip
    """Per configuration (`rows`: `aggregate`'s, one metric column), in its colour: every
    seed's value as a dot and the mean with its 95% interval as a bar across; the values
    drawn (for the axis' range)."""
    import plotly.graph_objects as go

    from aifabric.experiments.stats import select_rows

    keys = res.keys
    frame = res.frame[res.frame["status"] == "complete"]
    drawn = []
    for r in rows:
        label = _short(r[k] for k in keys)
        mine = select_rows(frame, keys, tuple(r[k] for k in keys))
        values = mine[r["column"]]
        keep = values.notna().to_numpy()
        y = (values[keep] / scale).tolist()
        fig.add_trace(
            go.Scatter(
                x=[label] * len(y), y=y, mode="markers", name=label, legendgroup=label,
                text=[f"seed {s}" for s in mine["seed"][keep]], showlegend=legend,
                marker={"size": 9, "opacity": 0.75, "color": colours[label]},
            ),
            row=1, col=col,
        )  # fmt: skip
        if r["mean"] is not None:
            fig.add_trace(
                go.Scatter(
                    x=[label], y=[r["mean"] / scale], mode="markers",
                    name=f"{label}: mean, 95% interval", legendgroup=label, showlegend=False,
                    error_y={**_error_bars([r], scale), "color": colours[label], "width": 12},
                    marker={"symbol": "line-ew-open", "size": 26, "color": colours[label],
                            "line": {"width": 3}},
                ),
                row=1, col=col,
            )  # fmt: skip
        drawn += y + [x / scale for x in (r["ci_low"], r["ci_high"]) if x is not None]
    return drawn


MAX_JOB_PANELS = 6  # a metric of more jobs shows the first six


def _metric_figure(res: SweepResults, metric: str, rows: list[dict], colours: dict):
    """The metric per configuration, one panel per job: every seed, and the mean with its
    95% interval, in the configuration's colour; each panel's y axis by `value_range`."""
    from plotly.subplots import make_subplots

    title, scale = _axis(res, metric)
    jobs = list(dict.fromkeys(r["job"] for r in rows))
    shown = jobs[:MAX_JOB_PANELS]
    more = f" (the first {len(shown)} of {len(jobs)} jobs)" if len(jobs) > len(shown) else ""
    fig = make_subplots(rows=1, cols=len(shown), subplot_titles=[j or "fabric" for j in shown])
    for i, job in enumerate(shown, start=1):
        drawn = _strip(fig, res, [r for r in rows if r["job"] == job], colours, scale, i, i == 1)
        fig.update_yaxes(range=value_range(drawn), row=1, col=i)
        fig.update_xaxes(type="category", row=1, col=i)
    fig.update_yaxes(title=title.split("@")[0], row=1, col=1)
    fig.update_layout(
        title=f"{metric}: every seed, and the mean with its 95% interval{more}",
        height=440, xaxis_title=_short(k.rsplit(".", 1)[-1] for k in res.keys),
    )  # fmt: skip
    return fig


def mechanism_column(res: SweepResults) -> str | None:
    """The results column of the mechanism behind the report's metric: [report] mechanism,
    else the ECMP imbalance of the rack switches' uplinks (`ecmp_max_mean.rtsw>ctsw`, or
    the first tier measured), else the time paused by PFC; None when the results have none."""
    have = list(res.frame.columns)
    named = res.report.get("mechanism")
    if named:
        if named not in have:
            raise AifabricError(
                f"report.mechanism = {named!r}: the results have no such column; they have "
                + ", ".join(c for c in have if res.frame[c].dtype.kind in "fiu")
            )
        return named
    ecmp = [c for c in have if c.startswith("ecmp_max_mean.")]
    if ecmp:
        return "ecmp_max_mean.rtsw>ctsw" if "ecmp_max_mean.rtsw>ctsw" in ecmp else ecmp[0]
    return "paused_ns" if "paused_ns" in have else None


def _mechanism_figure(res: SweepResults, colours: dict):
    """The mechanism beside the outcome: each per configuration (every seed, the mean with
    its interval), and the outcome against the mechanism, one dot per run; None without a
    metric or a mechanism in the results."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from aifabric.experiments.stats import select_rows

    outcome = res.report.get("metric")
    mechanism = mechanism_column(res)
    if outcome not in res.frame.columns or mechanism is None:
        return None
    (m_title, m_scale), (o_title, o_scale) = _axis(res, mechanism), _axis(res, outcome)
    fig = make_subplots(rows=1, cols=3, subplot_titles=[
        f"mechanism: {mechanism}", f"outcome: {outcome}", "outcome against mechanism, per run",
    ])  # fmt: skip
    for col, (column, scale) in enumerate(((mechanism, m_scale), (outcome, o_scale)), start=1):
        drawn = _strip(fig, res, res.aggregate([column]), colours, scale, col, col == 1)
        fig.update_yaxes(range=value_range(drawn), row=1, col=col)
        fig.update_xaxes(type="category", row=1, col=col)
    frame = res.frame[res.frame["status"] == "complete"]
    keys = res.keys
    from aifabric.experiments.stats import configurations

    xs, ys = [], []
    for config in configurations(frame, keys):
        label = _short(config)
        mine = select_rows(frame, keys, config)[["seed", mechanism, outcome]].dropna()
        x, y = (mine[mechanism] / m_scale).tolist(), (mine[outcome] / o_scale).tolist()
        xs += x
        ys += y
        fig.add_trace(
            go.Scatter(
                x=x, y=y, mode="markers", name=f"{label} runs", legendgroup=label,
                showlegend=False, text=[f"{label}, seed {s}" for s in mine["seed"]],
                marker={"size": 9, "opacity": 0.75, "color": colours[label]},
            ),
            row=1, col=3,
        )  # fmt: skip
    fig.update_xaxes(title=m_title, range=value_range(xs), row=1, col=3)
    fig.update_yaxes(title=o_title, range=value_range(ys), row=1, col=3)
    fig.update_yaxes(title=m_title, row=1, col=1)
    fig.update_yaxes(title=o_title, row=1, col=2)
    fig.update_layout(title=f"{outcome} beside its mechanism, {mechanism}", height=460)
    return fig


def _size_figure(res: SweepResults, rows: list[dict]):
    """busbw against message size (nccl-tests style), one line per other configuration."""
    import plotly.graph_objects as go

    from aifabric.fabric.units import parse_size

    size_key = next(k for k in SIZE_KEYS if k in res.keys)
    others = [k for k in res.keys if k != size_key]
    fig = go.Figure()
    lines: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["metric"] != "busbw_gbps":
            continue
        lines.setdefault((r["job"], *(r[k] for k in others)), []).append(r)
    jobs = {key[0] for key in lines}
    for key, pts in lines.items():
        pts.sort(key=lambda r: parse_size(r[size_key]))
        fig.add_trace(
            go.Scatter(
                x=[parse_size(r[size_key]) for r in pts],
                y=[r["mean"] for r in pts],
                error_y=_error_bars(pts),
                mode="lines+markers",
                name=_label(
                    {**({"job": key[0]} if len(jobs) > 1 else {}),
                     **dict(zip(others, key[1:], strict=True))}
                ),
            )
        )  # fmt: skip
    fig.update_layout(
        title="busbw against message size", height=460,
        xaxis={"type": "log", "title": "message size (bytes)"}, yaxis_title="busbw (Gb/s)",
    )  # fmt: skip
    return fig


def build_report(directory, metrics: list[str] | None = None) -> str:
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    res = open_sweep(directory)
    spec, report = res.spec, res.report
    frame = res.frame
    rows = res.aggregate(metrics or None)
    keys = res.keys
    colours = config_colours(res)
    parts = [f"<h1>{html.escape(spec.get('name', 'sweep'))}</h1>"]
    if spec.get("description"):
        parts.append(f"<p>{html.escape(spec['description'])}</p>")
    complete = int((frame["status"] == "complete").sum()) if len(frame) else 0
    parts.append(
        f'<p class="note">{len(frame)} runs ({complete} complete) of '
        f"{html.escape(str(spec.get('scenario')))}; varied: {html.escape(', '.join(keys))}; "
        f"seeds {html.escape(str(spec.get('seeds')))}.</p>"
    )
    for line in finding_lines(res):
        head, _, text = line.partition(":")
        css = "verdict" if head == "verdict" else "finding"
        parts.append(
            f'<p class="{css}"><b>{html.escape(head)}</b>: {html.escape(text.strip())}</p>'
        )
    better = bool(report.get("higher_is_better", True))
    for contrast in res.contrasts():
        effects = res.effects(contrast)
        if not effects:
            continue
        title = contrast.get("label") or f"against {_label(contrast['baseline'])}"
        parts.append(f"<h2>{html.escape(title)}: {html.escape(str(report.get('metric')))}</h2>")
        parts.append(
            _table(
                ["configuration", "seeds paired", "mean", "baseline mean", "change"],
                [[_label(e["configuration"]), e["pairs"], format_value(e["mean"], e["column"]),
                  format_value(e["baseline_mean"], e["column"]), _effect_text(e, better)]
                 for e in effects],
                1,
            )
        )  # fmt: skip
    mechanism = _mechanism_figure(res, colours)
    if mechanism is not None:
        parts.append("<h2>The mechanism beside the outcome</h2>")
        parts.append(pio.to_html(mechanism, full_html=False, include_plotlyjs=False))
    if any(k in keys for k in SIZE_KEYS) and any(r["metric"] == "busbw_gbps" for r in rows):
        parts.append("<h2>busbw against message size</h2>")
        parts.append(pio.to_html(_size_figure(res, rows), full_html=False, include_plotlyjs=False))
    for metric in dict.fromkeys(r["metric"] for r in rows):
        mine = [r for r in rows if r["metric"] == metric]
        parts.append(f"<h2>{html.escape(metric)}</h2>")
        parts.append(
            _table(
                [*keys, "job", "n", "mean", "std", "min", "max", "95% low", "95% high"],
                [[*(r[k] for k in keys), r["job"] or "-", r["n"],
                  *(format_value(r[s], metric)
                    for s in ("mean", "std", "min", "max", "ci_low", "ci_high"))]
                 for r in mine],
                len(keys) + 1,
            )
        )  # fmt: skip
        parts.append(
            pio.to_html(_metric_figure(res, metric, mine, colours), full_html=False,
                        include_plotlyjs=False)
        )  # fmt: skip
    failed = frame[frame["status"] != "complete"] if len(frame) else frame
    if len(failed):
        parts.append("<h2>Runs that did not complete</h2>")
        parts.append(
            _table(
                ["run", "status", "error"],
                [[r.run_dir, r.status, "" if isinstance(r.error, float) else r.error]
                 for r in failed.itertuples()],
                3,
            )
        )  # fmt: skip
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(spec.get('name', 'sweep'))}</title>",
            _STYLE,
            f'<script type="text/javascript">{get_plotlyjs()}</script>',
            "</head><body>",
            *parts,
            "</body></html>",
        ]
    )
