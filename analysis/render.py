"""The analyses as text for the terminal: `analyze` of a run or a capture, `compare`,
and `crosscheck`'s report.

Every function takes the results of `aifabric.analysis.metrics` (`aifabric.analysis.results`)
and returns a string; the
CLI only prints it. `fmt` is the one formatter of a figure by its kind (the
report's summary uses it too).
"""

from __future__ import annotations

from aifabric.analysis import results as R
from aifabric.analysis.table import render
from aifabric.fabric.rundir import SIZE_IN_ALL
from aifabric.fabric.units import format_rate, format_size, format_time


def fmt(value, kind: str) -> str:
    """A figure as text: kind is rate (bit/s), time (ns), size (bytes), ratio, pct or int."""
    if value is None:
        return "-"
    if kind == "rate":
        text = format_rate(int(value))  # '400G', but '0bps' below a kilobit
        return text if text.endswith("bps") else text + "bps"
    if kind == "time":
        return format_time(int(round(value)))
    if kind == "size":
        return format_size(int(value))
    if kind == "ratio":
        return f"{value:.2f}"
    if kind == "pct":
        return f"{100 * value:.2f}%" if abs(value) < 0.1 else f"{100 * value:.1f}%"
    return f"{round(value):,}"


def _cell(value, kind: str, half=None) -> str:
    """A figure, and for a group of runs the half-width of its 95% interval: `1.2ms ±40us`."""
    text = fmt(value, kind)
    return text if half is None or value is None else f"{text} ±{fmt(half, kind)}"


def _vs(observed, expected, kind: str = "ratio") -> str:
    """An observed figure with its uniform-hashing expectation beside it."""
    if observed is None:
        return "-"
    if expected is None:
        return fmt(observed, kind)
    return f"{fmt(observed, kind)} ({fmt(expected, kind)})"


DIST_HEAD = ["", "count", "mean", "p50", "p90", "p99", "max"]


def _dist_row(label: str, d: R.Distribution, kind: str = "time") -> list:
    return (
        [label, f"{d.count:,}"]
        + [fmt(getattr(d, k), kind) for k in ("mean", "p50", "p90", "p99")]
        + [fmt(d.max, kind)]
    )


def capture_text(m: R.CaptureMetrics) -> str:
    out = [
        f"{m.file} ({m.format}): {m.packets:,} packets, {m.bytes:,} bytes on the wire "
        f"({m.captured_bytes:,} captured), {fmt(m.duration_ns, 'time')}, "
        f"{m.interfaces} interface(s)"
    ]
    if m.cut_headers:
        out.append(f"{m.cut_headers:,} packets had headers cut by the snap length")
    if not m.packets:
        return "\n".join(out)
    out += ["", render(["kind", "packets"], [[k, f"{v:,}"] for k, v in m.kinds.items() if v])]
    e = m.ecn
    out += [
        "",
        render(
            ["IP packets", "not-ECT", "ECT(0)", "ECT(1)", "CE", "CE share", "CE of ECT"],
            [
                [
                    f"{e.ip_packets:,}",
                    f"{e.not_ect:,}",
                    f"{e.ect0:,}",
                    f"{e.ect1:,}",
                    f"{e.ce:,}",
                    f"{100 * e.ce_fraction:.2f}%",
                    f"{100 * e.ce_fraction_of_ect:.2f}%",
                ]
            ],
        ),
    ]
    c, p, pa = m.cnp, m.pfc, m.pause
    out += [
        "",
        f"RoCEv2 {m.roce.packets:,} packets (FECN {m.roce.fecn:,}, "
        f"BECN {m.roce.becn:,}); CNP {c.count:,} ({c.rate_per_s:,.0f}/s, "
        f"{c.qps} QPs)",
        f"802.3x PAUSE {pa.frames:,} frames, {pa.quanta:,} quanta, "
        f"{fmt(pa.paused_ns, 'time')} paused (not counted as PFC)",
    ]
    if p.frames:
        rows = [
            [
                str(k),
                f"{p.frames_per_priority[k]:,}",
                f"{p.xoff_per_priority[k]:,}",
                f"{p.xon_per_priority[k]:,}",
                f"{p.quanta_per_priority[k]:,}",
                fmt(p.paused_ns_per_priority[k], "time"),
            ]
            for k in range(8)
            if p.frames_per_priority[k]
        ]
        out += [
            "",
            render(
                ["priority", "PFC frames", "XOFF", "XON", "quanta", "paused"],
                rows,
                title=f"802.1Qbb PFC: {p.frames:,} frames (time at {fmt(p.rate_bps, 'rate')})",
            ),
        ]
    f = m.flows
    if f.count:
        out += [
            "",
            render(
                ["src", "dst", "sport", "dQPN", "packets", "bytes", "CE", "duration"],
                [
                    [
                        r.src,
                        r.dst,
                        r.sport,
                        f"0x{r.dqpn:06x}",
                        f"{r.packets:,}",
                        f"{r.bytes:,}",
                        f"{r.ce:,}",
                        fmt(r.duration_ns, "time"),
                    ]
                    for r in f.top
                ],
                title=f"{f.count:,} flows, the largest:",
            ),
            "",
            render(DIST_HEAD, [_dist_row("flow duration", m.fct_ns)]),
        ]
    pi = m.per_interface
    imb = pi.imbalance
    if imb:
        out += [
            "",
            f"bytes per interface {list(pi.bytes)}: max/mean {imb.max_mean:.2f}, "
            f"CV {imb.cv:.3f}, Jain {imb.jain:.3f}",
            f"flows per interface {list(pi.flows)}: {pi.collisions} collisions "
            f"(uniform hashing {pi.collisions_expected:.1f})",
        ]
    return "\n".join(out)


# what an op's bytes are, for the jobs' and the ops' tables (algbw is bytes / time)
BYTES_ARE = "a collective's bytes are its message per rank, a pattern's or matrix's all its flows'"


def bytes_are(op: R.Collective) -> str:
    """Whether an op's bytes are all its flows' or each rank's (BYTES_ARE)."""
    return "in all" if op.kind in SIZE_IN_ALL else "per rank"


def predicted_by_job(m: R.RunMetrics) -> dict[str, int | None]:
    """NCCL's cost-model time of each job's ops, summed (None when an op has none)."""
    out: dict[str, int | None] = {}
    for o in m.collectives.ops:
        have = out.get(o.job_name, 0)
        out[o.job_name] = None if have is None or not o.predicted_ns else have + o.predicted_ns
    return out


def _jobs_table(m: R.RunMetrics, scale: float) -> str:
    emulated = scale > 1
    predicted = predicted_by_job(m)
    return render(
        ["job", "kind", "ops", "time", "NCCL model", "ideal", "efficiency", "algbw", "busbw"]
        + (["busbw emulated"] if emulated else [])
        + ["goodput", "flow p99"],
        [
            [
                j.name,
                "+".join(j.kinds) or "-",
                f"{j.ops_finished}/{j.ops}",
                fmt(j.time_ns, "time"),
                fmt(predicted.get(j.name), "time"),
                fmt(j.ideal_ns, "time"),
                fmt(j.efficiency, "pct"),
                fmt(j.algbw_bps.mean, "rate"),
                fmt(j.busbw_bps.mean, "rate"),
            ]
            + ([fmt(j.busbw_emulated_bps.mean, "rate")] if emulated else [])
            + [
                fmt(j.goodput_bps, "rate"),
                fmt(j.fct_ns.p99 if j.fct_ns is not None else None, "time"),
            ]
            for j in m.jobs
        ],
        title="jobs (NCCL model: NCCL's cost-model time of the job's ops on an idle fabric; "
        "ideal: the busiest NIC's bytes at line rate; efficiency ideal / time; "
        "nccl-tests algbw, mean over the job's ops, and busbw, over its collectives; "
        f"goodput: a pattern's bytes delivered over its time; {BYTES_ARE})",
    )


def _iterations_table(m: R.RunMetrics) -> str:
    return render(
        ["job", "iteration", "compute", "exposed", "exposed share"],
        [
            [
                j.name,
                fmt(j.iteration_ns, "time"),
                fmt(j.compute_ns, "time"),
                fmt(j.exposed_ns, "time"),
                fmt(j.exposed_ns / j.iteration_ns if j.iteration_ns else None, "pct"),
            ]
            for j in m.jobs
            if j.compute_ns is not None
        ],
        title="training iterations (compute: the compute-only iteration, the lower bound; "
        "iteration: to the later of the compute's end and the last op's end; exposed: the "
        "communication the compute did not hide, iteration - compute)",
    )


def _ops_table(m: R.RunMetrics, scale: float) -> str:
    emulated = scale > 1
    head = ["op", "job", "kind", "algorithm", "ranks", "bytes", "time", "NCCL model", "ideal",
            "efficiency", "algbw", "busbw"]  # fmt: skip
    return render(
        head + (["busbw emulated"] if emulated else []),
        [
            [
                o.op,
                o.job_name,
                o.kind,
                "/".join(x for x in (o.algorithm, o.protocol) if x and x != "-") or "-",
                o.ranks,
                f"{o.bytes:,} {bytes_are(o)}",
                fmt(o.time_ns, "time"),
                fmt(o.predicted_ns, "time"),
                fmt(o.ideal_ns, "time"),
                fmt(o.efficiency, "pct"),
                fmt(o.algbw_bps, "rate"),
                fmt(o.busbw_bps, "rate"),
            ]
            + ([fmt(o.busbw_emulated_bps, "rate")] if emulated else [])
            for o in m.collectives.ops
        ],
        title=f"collectives, per op (algorithm/protocol; NCCL model: NCCL's cost-model time; "
        f"nccl-tests algbw and busbw; {BYTES_ARE})",
    )


def _ecmp_table(m: R.RunMetrics) -> str:
    return render(
        ["tier", "switches", "links", "used", "QPs", "collisions", "max/mean",
         "per switch max/mean", "Jain"],
        [
            [
                t.tier,
                t.switches,
                f"{t.links}/{t.links_in_tier}",
                t.links_used,
                f"{t.qps:,}",
                _vs(t.collisions, t.collisions_expected).replace(".00 (", " ("),
                _vs(t.bytes.max_mean, t.bytes_expected.max_mean),
                _vs(t.switch_max_mean, t.switch_max_mean_expected),
                _vs(t.bytes.jain, t.bytes_expected.jain),
            ]
            for t in m.ecmp.tiers
        ],
        title="ECMP: bytes over the links each tier's QPs could take, observed (uniform "
        "hashing of the same QPs on the same next hops)",
    )  # fmt: skip


def _switch_table(m: R.RunMetrics, top: int) -> str:
    rows = sorted(
        m.ecmp.switches,
        key=lambda r: (-r.bytes.max_mean / r.bytes_expected.max_mean, r.switch),
    )[:top]
    return render(
        ["switch", "tier", "QPs", "links", "used", "collisions", "max/mean", "Jain"],
        [
            [
                r.switch,
                r.tier,
                r.qps,
                r.links,
                sum(1 for x in r.qps_per_link if x),
                _vs(r.collisions, r.collisions_expected).replace(".00 (", " ("),
                _vs(r.bytes.max_mean, r.bytes_expected.max_mean),
                _vs(r.bytes.jain, r.bytes_expected.jain),
            ]
            for r in rows
        ],
        title="the switches furthest above uniform hashing (max/mean against its expectation)",
    )


def _hotspot_table(m: R.RunMetrics) -> str:
    return render(
        ["#", "port", "cost", "pause caused", "max queue", "queue delay", "ECN marks", "drops",
         "utilization"],
        [
            [
                h.rank,
                h.port,
                fmt(h.cost_ns, "time"),
                fmt(h.pause_caused_ns, "time"),
                fmt(h.qdepth_max_bytes, "size"),
                fmt(h.queue_delay_max_ns, "time"),
                f"{h.ecn_marked:,}",
                f"{h.drops:,}",
                fmt(h.utilization, "pct"),
            ]
            for h in m.hotspots
        ],
        title="hot spots, by cost: the pause time they caused plus their deepest queue as "
        "delay (victims of PFC are listed below, not here)",
    )  # fmt: skip


def _spread_table(m: R.RunMetrics, top: int) -> list[str]:
    spread = m.pause_spread
    # the ports furthest upstream from where their pause began, then in time order
    shown = sorted(spread, key=lambda r: (-r.hops_from_root, r.first_pause_ns))
    shown = sorted(shown[:top], key=lambda r: (r.first_pause_ns, r.port))
    roots = {r.root for r in spread if r.root}
    out = [
        render(
            ["victim port", "first pause", "paused", "cause", "because of", "root cause", "hops"],
            [
                [
                    r.port,
                    fmt(r.first_pause_ns, "time"),
                    fmt(r.paused_ns, "time"),
                    r.cause,
                    r.because_of or "-",
                    r.root or "-",
                    r.hops_from_root,
                ]
                for r in shown
            ],
            title=f"victims of PFC: {len(spread):,} paused ports, {len(roots):,} root "
            f"cause(s), longest chain {max(r.hops_from_root for r in spread)} hops",
        )
    ]
    if len(spread) > len(shown):
        out.append(f"... {len(spread) - len(shown):,} more paused ports (--top, or --json for all)")
    return out


def _worst_table(m: R.RunMetrics) -> str:
    th = m.throughput
    return render(
        ["job", "from", "to", "receivers' utilization", "received, all receivers"],
        [
            [
                w.name,
                fmt(w.start_ns, "time"),
                fmt(w.end_ns, "time"),
                fmt(w.utilization, "pct"),
                fmt(w.rx_bps, "rate"),
            ]
            for w in th.worst_intervals
        ],
        title=f"worst intervals: where a running job's receivers took less than "
        f"{100 * th.low_utilization:.0f}% of their line rate",
    )


def _faults_table(m: R.RunMetrics) -> str:
    def when(f: R.Fault) -> str:
        if (f.applied_ns, f.settled_ns) == (f.at_ns, f.at_ns):
            return fmt(f.at_ns, "time")
        return f"{fmt(f.at_ns, 'time')} (settled {fmt(f.settled_ns, 'time')})"

    def out(f: R.Fault) -> str:
        tiers = [
            f"{c.tier} {c.links_out}/{c.links} ({fmt(c.fraction, 'pct')})" for c in f.capacity_out
        ]
        return ", ".join(tiers) or "none"

    return render(
        ["fault", "action", "at", "switches re-routed", "flows moved", "capacity out after it"],
        [
            [f.target, f.action, when(f), f.switches_rerouted, fmt(f.flows_moved, "int"), out(f)]
            for f in m.faults or ()
        ],
        title="faults applied: the switches whose routes changed, the flows underway whose "
        "route changed, and per tier the links out (down or drained) once it happened",
    )


def _waves_table(m: R.RunMetrics) -> str:
    def kept(w: R.Wave) -> str:
        tiers = [
            f"{c.tier} {c.links_kept}/{c.links} ({fmt(c.fraction, 'pct')})" for c in w.capacity_kept
        ]
        return ", ".join(tiers) or ("all" if w.reached else "not reached")

    rows = []
    for w in m.waves or ():
        first = [w.wave, ", ".join(w.switches), w.domain,
                 f"{fmt(w.drain_ns, 'time')}-{fmt(w.restore_ns, 'time')}", kept(w)]  # fmt: skip
        for i, j in enumerate(w.jobs or [None]):
            cells = ["-", "-", "-"] if j is None else [
                j.name, fmt(j.rx_bps, "rate"),
                "-" if j.busbw_bps is None else f"{fmt(j.busbw_bps, 'rate')} ({j.ops} ops)",
            ]  # fmt: skip
            rows.append((first if i == 0 else [""] * len(first)) + cells)
    return render(
        ["wave", "switches", "domain", "drained", "capacity kept", "job", "rx/receiver",
         "busbw inside"],
        rows,
        title="maintenance waves: per wave (drain to restore) the capacity kept per tier, and "
        "each job's receive rate per receiver and the busbw of its ops inside the window",
    )  # fmt: skip


def _schedule_table(s: R.Schedule) -> str:
    share = fmt(s.atsw_bytes / s.bytes, "pct") if s.bytes else "-"
    return render(
        ["job", "GPUs", "zones", "racks", "arrived", "planned start", "started", "waited",
         "over ATSW"],
        [
            [j.name, j.gpus, j.zones, j.racks, fmt(j.arrival_ns, "time"),
             fmt(j.planned_start_ns, "time"), fmt(j.start_ns, "time"), fmt(j.wait_ns, "time"),
             fmt(j.atsw_bytes, "size")]
            for j in s.jobs
        ],
        title=f"schedule ({s.scheduler}): {fmt(s.atsw_bytes, 'size')} of "
        f"{fmt(s.bytes, 'size')} over the ATSW layer ({share}); per job in order of start, "
        "started: when the last of its GPUs began",
    )  # fmt: skip


def run_text(m: R.RunMetrics, top: int = 10) -> str:
    out = [
        f"run {m.path}: {m.fabric}, engine {m.engine}, status {m.status}; "
        f"{m.flows.count:,} flows ({m.flows.finished:,} finished)"
    ]
    scale = m.emulation_scale
    if scale > 1:
        out.append(
            f"emulated with link rates divided by {scale:,.0f} and time stretched by it; "
            "figures are in fabric time and rates (busbw also as the emulated links carried it)"
        )
    if m.jobs:
        out += ["", _jobs_table(m, scale)]
    if any(j.compute_ns is not None for j in m.jobs):
        out += ["", _iterations_table(m)]
    if m.collectives.count > len(m.jobs):
        out += ["", _ops_table(m, scale)]
    if m.faults:
        out += ["", _faults_table(m)]
    if m.waves:
        out += ["", _waves_table(m)]
    if m.schedule:
        out += ["", _schedule_table(m.schedule)]
    if m.throughput.worst_intervals:
        out += ["", _worst_table(m)]
    if m.ecmp.tiers:
        out += ["", _ecmp_table(m), "", _switch_table(m, min(top, 5))]
    cong = m.congestion
    if cong:
        cnp = "-" if m.cnp_sent is None else f"{m.cnp_sent:,}"
        out += [
            "",
            f"congestion: {cong.ecn_marked:,} ECN marks (~{100 * cong.ecn_fraction_est:.2f}%"
            f" of packets), {cnp} CNPs, {cong.pfc_frames:,} PFC frames, "
            f"{fmt(cong.paused_ns, 'time')} paused on {cong.paused_ports} ports, "
            f"{cong.drops:,} drops, deepest queue {fmt(cong.qdepth_max_bytes, 'size')}",
        ]
    if m.hotspots:
        out += ["", _hotspot_table(m)]
    if m.pause_spread:
        out += [""] + _spread_table(m, top)
    if m.flows.count:
        rows = [_dist_row("all flows", m.fct_ns)]
        rows += [_dist_row(j.name, j.fct_ns) for j in m.jobs if j.fct_ns is not None]
        out += ["", render(["flow completion"] + DIST_HEAD[1:], rows)]
    for c in m.captures:
        out += ["", capture_text(c)]
    return "\n".join(out)


SUMMARY_ROWS = (
    ("ecn_marked", "ECN-marked packets", "int"),
    ("ecn_fraction", "ECN-marked fraction", "pct"),
    ("cnp", "CNPs", "int"),
    ("pfc_frames", "PFC frames", "int"),
    ("paused_ns", "time paused by PFC (all ports)", "time"),
    ("drops", "drops", "int"),
    ("max_queue_bytes", "deepest queue", "size"),
    ("fct_p50_ns", "flow completion p50", "time"),
    ("fct_p99_ns", "flow completion p99", "time"),
)
JOB_ROWS = (
    ("busbw_bps", "busbw", "rate"),
    ("goodput_bps", "goodput", "rate"),
    ("time_ns", "time", "time"),
    ("ideal_ns", "ideal time", "time"),
    ("efficiency", "efficiency", "pct"),
    ("fct_p99_ns", "flow completion p99", "time"),
)

THROUGHPUT = ("busbw_bps", "goodput_bps")


def _half(x, key: str):
    """The half-width of a pooled figure's 95% interval (a group of runs), else None."""
    return (x.spread or {}).get(key)


def summary_rows(s: list[R.Summary]) -> list[list[str]]:
    """Label and one cell per summary (`metrics.summary`): per job first, then the ECMP
    tier furthest above uniform hashing, then the run-wide figures."""
    jobs: list[str] = []
    for x in s:
        jobs += [j.name for j in x.jobs if j.name not in jobs]
    rows = []
    for name in jobs:
        mine = [next((j for j in x.jobs if j.name == name), None) for x in s]
        kind = next(j.kind for j in mine if j)
        for key, label, k in JOB_ROWS:
            if key in THROUGHPUT and all(j is None or getattr(j, key) is None for j in mine):
                continue  # a collective's busbw, a pattern's goodput: the other is not its
            rows.append(
                [f"job {name} ({kind}): {label}"]
                + [_cell(getattr(j, key), k, _half(j, key)) if j else "-" for j in mine]
            )
    rows.append(["ECMP tier furthest from uniform"] + [x.ecmp_tier or "-" for x in s])
    rows.append(
        ["  its max/mean (uniform)"] + [_vs(x.ecmp_max_mean, x.ecmp_max_mean_expected) for x in s]
    )
    rows.append(
        ["  its collisions (uniform)"]
        + [
            "-"
            if x.ecmp_collisions is None
            else f"{fmt(x.ecmp_collisions, 'int')} ({fmt(x.ecmp_collisions_expected, 'ratio')})"
            for x in s
        ]
    )
    rows += [
        [label] + [_cell(getattr(x, key), kind, _half(x, key)) for x in s]
        for key, label, kind in SUMMARY_ROWS
    ]
    return rows


def compare_text(s: list[R.Summary]) -> str:
    return render([""] + [x.name for x in s], summary_rows(s))


def crosscheck_text(r: dict, scenario: str, fabric: str, switch: str) -> str:
    """`experiments.crosscheck`'s report of `scenario` (on `fabric`, the emulator's switches
    `switch`) as `aifabric crosscheck` prints it."""
    from aifabric.fabric.routing import EMULATOR_POLICY

    lines = []
    echo = lines.append

    def t(ns):
        return "-" if ns is None else format_time(ns)

    def x(ratio):
        return "-" if ratio is None else f"x{ratio:.2f}"

    def bw(bps):
        return f"{format_rate(int(bps))}bps" if bps > 0 else "-"

    kind = "Linux routers" if switch == "router" else "Open vSwitch bridges"
    echo(
        f"{scenario}: {fabric}, {r['paths']['flows']:,} flows; simulator with policy "
        f"{EMULATOR_POLICY[switch]} against the emulator's {kind}"
    )
    p = r["paths"]
    echo(f"paths             {p['equal']:,} of {p['flows']:,} flows equal")
    for d in p["differences"]:
        echo(f"  flow {d['flow']}: sim {' '.join(d['sim'])}")
        echo(f"  {'':>{len(str(d['flow'])) + 5}} mininet {' '.join(d['mininet'])}")
    for c in r["collectives"]:
        label = c["kind"] if c["algorithm"] in ("", "-") else f"{c['kind']} {c['algorithm']}"
        b = c["busbw_bps"]
        echo(
            f"{label:<17} sim {t(c['time_ns']['sim'])}  mininet {t(c['time_ns']['mininet'])}"
            f"  ({x(c['ratio'])})  busbw {bw(b['sim'])} / {bw(b['mininet'])}"
            f"  {'ok' if c['within'] else 'OUTSIDE'}"
        )
    ups = [u for u in r["uplinks"] if u["judged"]]
    if ups:
        worst = max(ups, key=lambda u: abs((u["ratio"] or 0) - 1))
        off = sum(not u["within"] for u in ups)
        echo(
            f"uplink bytes      {len(ups)} uplinks carried data, {off} outside; furthest "
            f"{worst['port']} {worst['bytes']['sim']:,} / {worst['bytes']['mininet']:,} "
            f"({x(worst['ratio'])})"
        )
    tot = r["totals"]
    echo(
        f"completion        sim {t(tot['completion_ns']['sim'])}  "
        f"mininet {t(tot['completion_ns']['mininet'])}"
    )
    echo(
        f"ECN marks         sim {tot['ecn_marked']['sim'] or 0:,}  "
        f"mininet {tot['ecn_marked']['mininet'] or 0:,}"
    )
    echo(
        f"PFC paused        sim {t(tot['paused_ns_total']['sim'] or 0)}  "
        f"mininet {t(tot['paused_ns_total']['mininet'] or 0)}"
    )
    echo(
        f"drops             sim {tot['drops']['sim'] or 0:,}  "
        f"mininet {tot['drops']['mininet'] or 0:,}"
    )
    why = f": {'; '.join(r['reasons'])}" if r["reasons"] else ""
    echo(f"verdict           {r['verdict']} (tolerance {r['tolerance']:.0%}){why}")
    echo(f"run directories   {r['sim']}  {r['mininet']}")
    return "\n".join(lines)
