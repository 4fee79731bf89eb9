"""Metrics of congestion, ECMP imbalance and completion, from captures and run directories.

Both entry points return typed results (`aifabric.analysis.results`: `RunMetrics`,
`CaptureMetrics`), whose `to_dict()` is what `analyze --json` prints; `summary()`
reduces either to the few numbers `compare` puts side by side (`Summary`), per job
where a run has jobs (jobs are never averaged together).

Conventions:

- Pause time of a PFC frame: quanta x 512 bit times at the link rate; a later
  frame for the same priority on the same interface replaces the running
  pause (quanta 0 is XON and ends it).
- ECMP: see `aifabric.analysis.ecmp` (only hops where a flow had a choice count, each
  figure beside its expectation under uniform hashing).
- algbw = bytes / time; busbw = algbw x the nccl-tests factor the run recorded
  (AllReduce 2(n-1)/n; AllGather, ReduceScatter, AllToAll (n-1)/n; Broadcast,
  send/recv, patterns 1), computed here from each op's start and end: the one
  figure users read. Rates are in bit/s (x 8 of nccl-tests' bytes/s). An op's
  ideal time is its busiest NIC's bytes at line rate; efficiency = ideal / time.
- A run's ECN-marked fraction divides marked packets by the packets a port
  sent, estimated as tx_bytes / (MTU + 58 header bytes).
- Port names are the fabric's (`Fabric.port_names`: `node--peer`, `node--peer#k`).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
from numba import njit

from aifabric.analysis import capture as C
from aifabric.analysis import results as R
from aifabric.analysis.ecmp import expected_collisions
from aifabric.fabric._numba_cache import lean_loads
from aifabric.fabric.completion import SIZE_IN_ALL, algbw_bps
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.portseries import PortSamples

lean_loads()  # cached kernels load without numba's typing and lowering tables

ROCE_OVERHEAD_BYTES = 58  # Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4
QUANTUM_BITS = 512
DEFAULT_RATE_BPS = 100 * 10**9


# --- small pure functions ---------------------------------------------------------------


def distribution(values) -> R.Distribution:
    """count, mean, p50, p90, p99 and max of a sample (linear-interpolated percentiles)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return R.Distribution(count=0, mean=None, p50=None, p90=None, p99=None, max=None)
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return R.Distribution(
        count=int(x.size),
        mean=float(x.mean()),
        p50=float(p50),
        p90=float(p90),
        p99=float(p99),
        max=float(x.max()),
    )


def pause_ns(time_ns, iface, enable, quanta, rate_bps: int) -> np.ndarray:
    """Total paused time per priority [8], frames in time order (see the module docstring)."""
    out = np.zeros(8, dtype=np.int64)
    t = np.asarray(time_ns, dtype=np.int64)
    if t.size == 0:
        return out
    order = np.lexsort((t, iface))
    t, iface, enable, quanta = t[order], iface[order], enable[order], quanta[order]
    for k in range(8):
        sel = ((enable >> k) & 1).astype(bool)
        if not sel.any():
            continue
        tk, ik = t[sel], iface[sel]
        dur = quanta[sel, k].astype(np.int64) * QUANTUM_BITS * 10**9 // int(rate_bps)
        end = tk + dur
        nxt = np.empty_like(tk)
        nxt[:-1] = np.where(ik[1:] == ik[:-1], tk[1:], np.iinfo(np.int64).max)
        nxt[-1] = np.iinfo(np.int64).max
        out[k] = int((np.minimum(end, nxt) - tk).sum())
    return out


@njit(cache=True)
def _group_rows(keys, time_ns, inv, rep, t_first, t_last):
    """Number equal rows of `keys` [n, w] in order of first appearance (an open hash table).

    Writes inv[i] (the group of row i), rep[g] (its first row) and the first and
    last time of each group, ignoring negative (unknown) times (-1 when a group has
    none); returns the number of groups.
    """
    n, w = keys.shape
    size = 16
    while size < 2 * n:
        size *= 2
    mask = size - 1
    table = np.full(size, -1, dtype=np.int64)
    groups = 0
    for i in range(n):
        h = np.uint64(0x9E3779B97F4A7C15)
        for k in range(w):
            h = (h ^ keys[i, k]) * np.uint64(0x100000001B3)
            h ^= h >> np.uint64(29)
        slot = np.int64(h & np.uint64(mask))
        while True:
            g = table[slot]
            if g < 0:
                g = groups
                table[slot] = g
                rep[g] = i
                t_first[g] = np.iinfo(np.int64).max
                t_last[g] = -1
                groups += 1
                break
            r = rep[g]
            same = True
            for k in range(w):
                if keys[r, k] != keys[i, k]:
                    same = False
                    break
            if same:
                break
            slot = (slot + 1) & mask
        inv[i] = g
        t = time_ns[i]
        if t >= 0:
            if t < t_first[g]:
                t_first[g] = t
            if t > t_last[g]:
                t_last[g] = t
    for g in range(groups):
        if t_last[g] < 0:
            t_first[g] = -1
    return groups


def group_rows(keys: np.ndarray, time_ns: np.ndarray):
    """(inv, rep, t_first, t_last): see `_group_rows`."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    t = np.ascontiguousarray(time_ns, dtype=np.int64)
    n = len(keys)
    inv = np.empty(n, dtype=np.int64)
    rep = np.empty(n, dtype=np.int64)
    t_first = np.empty(n, dtype=np.int64)
    t_last = np.empty(n, dtype=np.int64)
    g = _group_rows(keys, t, inv, rep, t_first, t_last)
    return inv, rep[:g].copy(), t_first[:g].copy(), t_last[:g].copy()


def _ip_text(hi: int, lo: int) -> str:
    import ipaddress

    if hi == 0 and (lo >> 32) == 0xFFFF:
        return str(ipaddress.IPv4Address(lo & 0xFFFFFFFF))
    return str(ipaddress.IPv6Address((hi << 64) | lo))


def _nice_bin(duration_ns: int, bins: int = 100) -> int:
    raw = max(duration_ns // bins, 1)
    step = 10 ** (len(str(raw)) - 1)
    for m in (1, 2, 5, 10):
        if m * step >= raw:
            return m * step
    return 10 * step


# --- captures ---------------------------------------------------------------------------


def capture_metrics(
    cap: C.Capture,
    *,
    rate_bps: int = DEFAULT_RATE_BPS,
    bin_ns: int | None = None,
    top: int = 10,
    nic_names: dict[int, str] | None = None,
    series: bool = False,
) -> R.CaptureMetrics:
    """Metrics of one capture. `nic_names` maps IPv4 addresses to NIC names (a run's fabric)."""
    n = len(cap)
    kind = cap.kind
    length = cap.length.astype(np.int64)
    counts = np.bincount(kind, minlength=len(C.KIND_NAMES))
    t = cap.time_ns
    timed = t >= 0
    t0 = int(t[timed].min()) if timed.any() else 0
    t1 = int(t[timed].max()) if timed.any() else 0
    duration = t1 - t0
    # ECN over IP packets; CE-marked fraction among all IP packets and among ECN-capable ones
    ip = cap.ipver != 0
    ecn = np.bincount(cap.ecn[ip], minlength=4)
    n_ip = int(ip.sum())
    capable = int(ecn[1] + ecn[2] + ecn[3])
    ecn_figures = R.CaptureEcn(
        ip_packets=n_ip,
        not_ect=int(ecn[0]),
        ect1=int(ecn[1]),
        ect0=int(ecn[2]),
        ce=int(ecn[3]),
        ce_fraction=float(ecn[3] / n_ip) if n_ip else 0.0,
        ce_fraction_of_ect=float(ecn[3] / capable) if capable else 0.0,
    )

    roce = kind == C.KIND_ROCE
    cnp = kind == C.KIND_CNP
    roce_figures = R.CaptureRoce(
        packets=int(roce.sum()),
        bytes=int(length[roce].sum()),
        fecn=int(cap.fecn[roce].sum()),
        becn=int(cap.becn[roce | cnp].sum()),
    )
    n_cnp = int(cnp.sum())
    cnp_figures = R.CaptureCnp(
        count=n_cnp,
        rate_per_s=float(n_cnp * 1e9 / duration) if duration > 0 else 0.0,
        per_roce_packet=float(n_cnp / roce.sum()) if roce.any() else 0.0,
        qps=int(len(np.unique(cap.dqpn[cnp]))) if n_cnp else 0,
    )

    pfc = kind == C.KIND_PFC
    en = cap.pfc_enable[pfc]
    q = cap.quanta[pfc]
    per_prio = [int(((en >> k) & 1).sum()) for k in range(8)]
    xoff = [int((((en >> k) & 1) & (q[:, k] > 0)).sum()) for k in range(8)]
    paused = pause_ns(t[pfc], cap.iface[pfc], en, q, rate_bps)
    pfc_figures = R.CapturePfc(
        frames=int(pfc.sum()),
        frames_per_priority=tuple(per_prio),
        xoff_per_priority=tuple(xoff),
        xon_per_priority=tuple(a - b for a, b in zip(per_prio, xoff, strict=True)),
        quanta_per_priority=tuple(int(q[:, k].astype(np.int64).sum()) for k in range(8)),
        paused_ns_per_priority=tuple(int(x) for x in paused),
        rate_bps=int(rate_bps),
    )
    pause = kind == C.KIND_PAUSE
    pq = cap.quanta[pause]
    pause_figures = R.CapturePause(
        frames=int(pause.sum()),
        quanta=int(pq[:, 0].astype(np.int64).sum()),
        paused_ns=int(
            pause_ns(t[pause], cap.iface[pause], np.ones(int(pause.sum()), np.uint8), pq, rate_bps)[
                0
            ]
        ),
    )

    flows, fct, flows_if = _capture_flows(cap, top, nic_names)

    # per interface: bytes and flows (the uplinks when each interface is one)
    ifc = cap.iface.astype(np.int64)
    k_if = max(cap.n_ifaces, 1)
    by_if = np.bincount(ifc, weights=length, minlength=k_if)
    per_interface = R.PerInterface(
        bytes=tuple(int(x) for x in by_if),
        packets=tuple(int(x) for x in np.bincount(ifc, minlength=k_if)),
        imbalance=R.Imbalance.of(by_if) if k_if > 1 else None,
    )
    if k_if > 1:
        # each interface an uplink: flows are the balls ECMP threw (see the module docstring)
        balls = int(flows_if.sum())
        per_interface = replace(
            per_interface,
            flows=tuple(int(x) for x in flows_if),
            flows_imbalance=R.Imbalance.of(flows_if),
            collisions=balls - int(np.count_nonzero(flows_if)),
            collisions_expected=expected_collisions(balls, k_if),
        )

    timeline = None
    if series and duration > 0:
        b = bin_ns or _nice_bin(duration)
        slot = np.where(timed, (t - t0) // b, 0)
        nb = int(slot.max()) + 1
        thr = np.zeros((k_if, nb))
        np.add.at(thr, (ifc, slot), length * 8 * 1e9 / b)
        ce = np.zeros(nb, dtype=np.int64)
        np.add.at(ce, slot[ip & (cap.ecn == 3)], 1)
        cn = np.bincount(slot[cnp], minlength=nb)
        pf = np.bincount(slot[pfc], minlength=nb)
        timeline = R.CaptureSeries(
            bin_ns=int(b),
            t_ns=tuple(int(t0 + i * b) for i in range(nb)),
            throughput_bps=tuple(tuple(row) for row in thr.tolist()),
            ce=tuple(ce.tolist()),
            cnp=tuple(cn.tolist()),
            pfc=tuple(pf.tolist()),
        )
    return R.CaptureMetrics(
        source="capture",
        file=cap.path.name,
        format=cap.format,
        problem=cap.problem,
        packets=n,
        bytes=int(length.sum()),
        captured_bytes=int(cap.caplen.astype(np.int64).sum()),
        cut_headers=int(np.count_nonzero(cap.flags & C.FLAG_CUT)),
        interfaces=cap.n_ifaces,
        start_ns=t0,
        duration_ns=duration,
        kinds={name: int(counts[i]) for i, name in enumerate(C.KIND_NAMES)},
        ecn=ecn_figures,
        roce=roce_figures,
        cnp=cnp_figures,
        pfc=pfc_figures,
        pause=pause_figures,
        flows=flows,
        fct_ns=fct,
        per_interface=per_interface,
        series=timeline,
    )


def flow_durations(cap: C.Capture) -> np.ndarray:
    """Last minus first packet time of every flow (see `_capture_flows`)."""
    return _capture_flows(cap, 0, None, durations=True)


def _capture_flows(cap: C.Capture, top: int, nic_names, durations: bool = False):
    """Flows: UDP and RoCE data packets grouped by (src, dst, sport, dport, dQPN)."""
    sel = np.flatnonzero((cap.kind == C.KIND_ROCE) | (cap.kind == C.KIND_UDP))
    k_if = max(cap.n_ifaces, 1)
    if sel.size == 0:
        if durations:
            return np.zeros(0, np.int64)
        return R.CaptureFlows(count=0, top=()), distribution([]), np.zeros(k_if, np.int64)
    src_lo, dst_lo = cap.src_lo[sel], cap.dst_lo[sel]
    src_hi, dst_hi = cap.src_hi[sel], cap.dst_hi[sel]
    ports = (cap.sport[sel].astype(np.uint64) << np.uint64(16)) | cap.dport[sel].astype(np.uint64)
    qpn = cap.dqpn[sel].astype(np.uint64)
    if not (src_hi.any() or dst_hi.any()):
        a = (src_lo << np.uint64(32)) | (dst_lo & np.uint64(0xFFFFFFFF))
        b = (ports << np.uint64(24)) | qpn
        keys = np.stack([a, b], axis=1)
    else:
        keys = np.stack([src_hi, src_lo, dst_hi, dst_lo, ports, qpn], axis=1)
    t = cap.time_ns[sel]
    inv, first, t_first, t_last = group_rows(keys, t)
    nf = len(first)
    length = cap.length[sel].astype(np.int64)
    pk = np.bincount(inv, minlength=nf)
    by = np.bincount(inv, weights=length, minlength=nf)
    fct = t_last - t_first
    if durations:
        return fct
    ce = np.bincount(inv, weights=(cap.ecn[sel] == 3), minlength=nf)
    rows = []
    for f in np.argsort(-by, kind="stable")[:top]:
        i = sel[first[f]]
        src = _ip_text(int(cap.src_hi[i]), int(cap.src_lo[i]))
        dst = _ip_text(int(cap.dst_hi[i]), int(cap.dst_lo[i]))
        if nic_names:
            src = nic_names.get(src, src)
            dst = nic_names.get(dst, dst)
        rows.append(
            R.CaptureFlow(
                src=src,
                dst=dst,
                sport=int(cap.sport[i]),
                dport=int(cap.dport[i]),
                dqpn=int(cap.dqpn[i]),
                packets=int(pk[f]),
                bytes=int(by[f]),
                ce=int(ce[f]),
                first_ns=int(t_first[f]),
                duration_ns=int(fct[f]),
            )
        )
    pairs = np.unique(inv * k_if + cap.iface[sel].astype(np.int64))
    flows_if = np.bincount(pairs % k_if, minlength=k_if)
    return R.CaptureFlows(count=int(nf), top=tuple(rows)), distribution(fct), flows_if


# --- run directories ---------------------------------------------------------------------


@njit(cache=True)
def _flow_ports(src, path_ptr, path_link, link_a, link_b, out):
    for f in range(len(src)):
        node = src[f]
        for j in range(path_ptr[f], path_ptr[f + 1]):
            link = path_link[j]
            if link_a[link] == node:
                out[j] = 2 * link
                node = link_b[link]
            else:
                out[j] = 2 * link + 1
                node = link_a[link]


def flow_ports(fabric, src, path_ptr, path_link) -> np.ndarray:
    """The ports (directions) of each flow's links, walking each path from its source."""
    out = np.empty(len(path_link), dtype=np.int64)
    _flow_ports(
        np.asarray(src, dtype=np.int64),
        np.asarray(path_ptr, dtype=np.int64),
        np.asarray(path_link, dtype=np.int64),
        fabric.link_a.astype(np.int64),
        fabric.link_b.astype(np.int64),
        out,
    )
    return out


def pause_spread(fabric, ports: PortSamples) -> list[R.PausedPort]:
    """Which paused port was paused because of which (see `_cause`), in time order.

    Port P (node X towards Y) is paused by PFC frames Y sends when its ingress
    from X fills, which happens when Y cannot drain: one of Y's other ports was
    paused first (the pause spread upstream), or none was and Y's egress was
    congested (P is a root of the tree, caused by Y's deepest queue). `root` is
    the congested port at the end of P's chain: the cause, P a victim.
    """
    names = fabric.port_names
    port = ports["port"].astype(np.int64)
    t_ns = ports["t_ns"].astype(np.int64)
    col = {int(p): j for j, p in enumerate(port)}
    total = ports.total("paused_ns")
    first_sample = ports.first("paused_ns")  # -1 for a port never paused
    first = np.full(len(port), -1, dtype=np.int64)
    first[first_sample >= 0] = t_ns[first_sample[first_sample >= 0]]
    qmax = ports.peak("qdepth_max_bytes")
    pfc_sent = ports.total("pfc_sent")
    rows = []
    for j in sorted(np.flatnonzero(total > 0), key=lambda j: (first[j], port[j])):
        p = int(port[j])
        peer = int(fabric.port_peer[p])
        cands = [int(q) for q in fabric.ports_of(peer) if int(q) != (p ^ 1) and int(q) in col]
        earlier = [q for q in cands if total[col[q]] > 0 and first[col[q]] <= first[j] and q != p]
        if earlier:
            q = min(earlier, key=lambda q: (first[col[q]], -total[col[q]], q))
            cause, by = "pause", q
        else:
            deep = [q for q in cands if qmax[col[q]] > 0]
            by = max(deep, key=lambda q: (qmax[col[q]], -q)) if deep else None
            cause = "congestion"
        rows.append(
            {
                "port": names[p],
                "first_pause_ns": int(first[j]),
                "paused_ns": int(total[j]),
                "pfc_received": int(pfc_sent[col[p ^ 1]]) if (p ^ 1) in col else None,
                "cause": cause,
                "because_of": names[by] if by is not None else None,
            }
        )
    _chains(rows)
    return [R.PausedPort(**r) for r in rows]


def _chains(rows: list[dict]) -> None:
    """Each row's `hops_from_root` and `root`, following `because_of` up its chain. Ports
    first paused in the same interval may name one later in the list, or each other (a
    loop within one interval): a loop's last port counts as its root."""
    by_port = {r["port"]: r for r in rows}
    for r in rows:
        path, on_path, cur = [], set(), r
        while cur is not None and "hops_from_root" not in cur and cur["port"] not in on_path:
            path.append(cur)
            on_path.add(cur["port"])
            cur = by_port.get(cur["because_of"]) if cur["cause"] == "pause" else None
        if cur is not None and "hops_from_root" in cur:
            hops, root = cur["hops_from_root"], cur["root"]
        else:
            last = path.pop()
            last["hops_from_root"], last["root"] = 0, last["because_of"]
            hops, root = 0, last["because_of"]
        for row in reversed(path):
            hops += 1
            row["hops_from_root"], row["root"] = hops, root


def senders_paused(fabric, ports: PortSamples, flows: dict, jobs: list[R.Job]) -> list[R.Job]:
    """The jobs with their `senders_paused_ns`: PFC pause time on the ports of the NICs each
    sends from, summed over them. A job's NICs are its own (jobs share none), so a
    bystander's above zero means pauses that began elsewhere reached it."""
    col = {int(p): j for j, p in enumerate(ports["port"].astype(np.int64))}
    total = ports.total("paused_ns")
    out = []
    for job in jobs:
        src = np.unique(flows["src"][flows["job"] == job.job])
        cols = [col[int(fabric.nic_port[s])] for s in src if int(fabric.nic_port[s]) in col]
        out.append(replace(job, senders_paused_ns=int(total[cols].sum()) if cols else None))
    return out


def recorded(run, key: str):
    """A figure the engine recorded in run.json's results (its summary or counters)."""
    results = run.meta.get("results") or {}
    for where in (results.get("summary") or {}, results.get("counters") or {}, results):
        if isinstance(where, dict) and where.get(key) is not None:
            return where[key]
    return None


def job_names(run, jobs) -> dict[int, str]:
    """Each job's name from the scenario's workload (`job N` where it has none)."""
    workload = run.meta.get("scenario", {}).get("workload")
    listed = workload.get("jobs", []) if isinstance(workload, dict) else []
    out = {}
    for j in sorted({int(x) for x in jobs}):
        name = listed[j].get("name") if j < len(listed) and isinstance(listed[j], dict) else None
        out[j] = str(name) if name else f"job {j}"
    return out


def _scenario_faults(run) -> tuple[list, dict]:
    """The scenario's faults as the engines read them, and its routing's policy and seeds
    (`Routing`'s keywords); no faults where run.json's are not faults."""
    from aifabric.fabric.scenario import Fault

    scenario = run.meta.get("scenario", {})
    ecmp = scenario.get("ecmp") if isinstance(scenario.get("ecmp"), dict) else {}
    seed = scenario.get("hash_seed", scenario.get("seed", 0))
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise AifabricError(f"{run.path / 'run.json'}: its scenario's seed is not a whole number")
    how = {
        "policy": ecmp.get("policy", "5tuple"),
        "seed": seed,
        "same_seed": bool(ecmp.get("same_seed", False)),
    }
    try:
        return [Fault(**f) for f in scenario.get("faults") or []], how
    except TypeError:
        return [], how


def _routings(run, fabric, flows: dict) -> tuple[list, np.ndarray]:
    """The routings of the run (at the start, then after each fault during it) and, per
    flow, the one that chose its route (`ecmp_metrics`)."""
    from aifabric.fabric.faults import during_run, routing_after, routing_at_start
    from aifabric.fabric.routing import Routing

    faults, how = _scenario_faults(run)
    try:
        routings = [routing_at_start(fabric, faults, **how)]
        later = during_run(faults)
        for fault in later:
            routings.append(routing_after(fault, routings[-1]))
    except (AifabricError, TypeError, ValueError):
        routings, later = [Routing(fabric)], []
    if "route_epoch" in flows:
        epoch = flows["route_epoch"].astype(np.int64)
    else:  # routed when it started; one not started, by the routing at the end
        start = np.where(flows["start_ns"] >= 0, flows["start_ns"], np.iinfo(np.int64).max)
        at = np.array([f.at_ns for f in later], dtype=np.int64)
        epoch = np.searchsorted(at, start, side="right")
    return routings, epoch


def fault_metrics(run, fabric, flows: dict | None) -> tuple[R.Fault, ...] | None:
    """Each fault the engine applied (run.json's summary), in the order they happened: the
    switches it re-routed, the flows underway it moved (their route before and after it
    differ), and the capacity out per tier once it happened. None: the run has no faults."""
    from aifabric.fabric.faults import (
        describe,
        in_order,
        record_key,
        rerouted_switches,
        routing_after,
    )
    from aifabric.fabric.routing import Routing

    faults, how = _scenario_faults(run)
    if not faults:
        return None
    records = {record_key(r): r for r in recorded(run, "faults") or [] if isinstance(r, dict)}
    out = []
    with contextlib.suppress(AifabricError, TypeError, ValueError):  # run.json's, not ours
        routing = Routing(fabric, **how)
        for fault in in_order(faults):
            after = routing_after(fault, routing)
            d = {**describe(fabric, fault), "at_ns": int(fault.at_ns)}
            rec = records.get(record_key(d))
            if rec is not None:
                applied_ns = int(rec.get("applied_ns", fault.at_ns))
                out.append(
                    R.Fault(
                        **d,
                        applied_ns=applied_ns,
                        settled_ns=int(rec.get("settled_ns", fault.at_ns)),
                        switches_rerouted=len(rerouted_switches(routing, after)),
                        flows_moved=_flows_moved(flows, applied_ns, routing, after),
                        capacity_out=_capacity_out(fabric, after),
                    )
                )
            routing = after
    return tuple(out)


def _flows_moved(flows: dict | None, at_ns: int, before, after) -> int | None:
    """The flows underway at `at_ns` (started, not ended) whose route `after` changes: when
    the engine applied the fault (the emulator's clock runs a little behind the scenario's)."""
    if flows is None:
        return None
    start, end = flows["start_ns"], flows["end_ns"]
    under = np.flatnonzero((start >= 0) & (start < at_ns) & ((end < 0) | (end > at_ns)))
    if not len(under):
        return 0
    cols = [flows[k][under] for k in ("src", "dst", "sport", "dqpn")]
    a, b = before.paths(*cols), after.paths(*cols)
    la, lb = np.diff(a.ptr), np.diff(b.ptr)
    differ = la != lb
    same = np.flatnonzero(~differ & (la > 0))
    n = la[same]
    owner = np.repeat(np.arange(len(same)), n)
    offset = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    ne = a.ports[a.ptr[same][owner] + offset] != b.ports[b.ptr[same][owner] + offset]
    differ[same[np.unique(owner[ne])]] = True
    return int(differ.sum())


def _capacity_out(fabric, routing) -> tuple[R.CapacityOut, ...]:
    """Per tier (a link's upward direction), the links `routing` leaves out and their rates."""
    from aifabric.fabric.spread import tier_name

    a = fabric.node_role[fabric.link_a].astype(np.int64)
    b = fabric.node_role[fabric.link_b].astype(np.int64)
    label = 4 * np.minimum(a, b) + np.maximum(a, b)
    out_links = ~routing.port_alive[0::2]
    rate = fabric.link_rate_bps.astype(np.int64)
    rows = []
    for lab in np.unique(label[out_links]):
        tier = label == lab
        lost, total = int(rate[tier & out_links].sum()), int(rate[tier].sum())
        rows.append(
            R.CapacityOut(
                tier=tier_name(int(lab)),
                links_out=int(np.count_nonzero(tier & out_links)),
                links=int(np.count_nonzero(tier)),
                capacity_out_bps=lost,
                capacity_bps=total,
                fraction=lost / total,
            )
        )
    return tuple(rows)


def wave_metrics(
    run, fabric, ports, flows: dict | None, jobs, ops, faults: tuple[R.Fault, ...] | None
) -> tuple[R.Wave, ...] | None:
    """Each wave of the run's drain plan (run.json's `scenario.maintenance.waves`): per job its
    receive rate per receiver over the whole port samples inside the wave's window (drain to
    restore) and the mean busbw of its ops inside it, and per tier the capacity kept once the
    wave was drained (the faults' `capacity_out` at that time). None: the run had no plan."""
    plan = run.meta.get("scenario", {}).get("maintenance")
    waves = plan.get("waves") if isinstance(plan, dict) else None
    if not isinstance(waves, list) or not waves:
        return None
    has_ports = ports is not None and ports["port"].size > 0 and flows is not None
    if has_ports:
        col = {int(p): j for j, p in enumerate(ports["port"].astype(np.int64))}
        interval = int(ports["interval_ns"])
        t_ns = ports["t_ns"].astype(np.int64)
    out = []
    with contextlib.suppress(KeyError, TypeError, ValueError):  # run.json's, not ours
        for w in waves:
            drain, restore = int(w["drain_ns"]), int(w["restore_ns"])
            before = [f for f in faults or () if f.at_ns <= drain]
            reached = any(f.action == "drain" and f.at_ns == drain for f in before)
            kept = tuple(
                R.CapacityKept(
                    tier=c.tier,
                    links_kept=c.links - c.links_out,
                    links=c.links,
                    capacity_kept_bps=c.capacity_bps - c.capacity_out_bps,
                    capacity_bps=c.capacity_bps,
                    fraction=1 - c.fraction,
                )
                for c in (before[-1].capacity_out if reached else ())
            )
            inside = (t_ns >= drain) & (t_ns + interval <= restore) if has_ports else None
            n = int(inside.sum()) if has_ports else 0
            rows = []
            for job in jobs:
                cols = _receiver_columns(fabric, flows, job.job, col) if has_ports else []
                rx = None
                if cols and n:
                    got = ports.per_sample("tx_bytes", cols)[inside].sum()
                    rx = float(got) * 8e9 / (n * interval) / len(cols)
                done = [
                    o.busbw_bps
                    for o in ops
                    if o.job == job.job and o.busbw_bps is not None
                    and drain <= o.start_ns and 0 <= o.end_ns <= restore
                ]  # fmt: skip
                rows.append(
                    R.WaveJob(
                        job=job.job,
                        name=job.name,
                        rx_bps=rx,
                        ops=len(done),
                        busbw_bps=float(np.mean(done)) if done else None,
                    )
                )
            out.append(
                R.Wave(
                    wave=int(w["wave"]),
                    switches=tuple(str(x) for x in w["switches"]),
                    domain=int(w["domain"]),
                    drain_ns=drain,
                    restore_ns=restore,
                    reached=reached,
                    samples=n,
                    capacity_kept=kept,
                    jobs=tuple(rows),
                )
            )
    return tuple(out)


def atsw_crossings(fabric, path_ptr, path_link) -> np.ndarray:
    """Per flow: the ATSW switches its path passes through (each is two of its links)."""
    from aifabric.fabric.model import Role

    role = fabric.node_role
    touches = (role[fabric.link_a] == Role.ATSW) | (role[fabric.link_b] == Role.ATSW)
    hits = touches[np.asarray(path_link, dtype=np.int64)].astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(hits)])
    ptr = np.asarray(path_ptr, dtype=np.int64)
    return (cum[ptr[1:]] - cum[ptr[:-1]]) // 2


def schedule_metrics(run, fabric, flows: dict | None) -> R.Schedule | None:
    """A scheduled workload's jobs (run.json's `scenario.schedule`): each job's wait, from its
    arrival to the moment the last of its GPUs began sending or receiving for it (the first
    flow from or to each of its NICs; a GPU another job held is free once that job's last
    flows there are done), and the payload bytes through the ATSW layer, per job and in all.
    None: the workload had no scheduler."""
    plan = run.meta.get("scenario", {}).get("schedule")
    rows = plan.get("jobs") if isinstance(plan, dict) else None
    if not isinstance(rows, list) or not rows:
        return None
    if flows is None:
        flows = {k: np.zeros(0, np.int64) for k in ("job", "src", "dst", "start_ns", "bytes")}
        flows["path_ptr"], flows["path_link"] = np.zeros(1, np.int64), np.zeros(0, np.int64)
    job, nbytes = flows["job"].astype(np.int64), flows["bytes"].astype(np.int64)
    through = nbytes * atsw_crossings(fabric, flows["path_ptr"], flows["path_link"])
    begun = flows["start_ns"].astype(np.int64)
    out = []
    with contextlib.suppress(KeyError, TypeError, ValueError):  # run.json's, not ours
        for r in rows:
            j = int(r["job"])
            mine = (job == j) & (begun >= 0)
            ends = np.concatenate([flows["src"][mine], flows["dst"][mine]]).astype(np.int64)
            first = np.full(fabric.n_nodes, np.iinfo(np.int64).max)
            np.minimum.at(first, ends, np.tile(begun[mine], 2))
            start = int(first[np.unique(ends)].max()) if len(ends) else None
            arrival = int(r["arrival_ns"])
            out.append(
                R.ScheduledJob(
                    job=j,
                    name=str(r["name"]),
                    gpus=int(r["gpus"]),
                    zones=int(r["zones"]),
                    racks=int(r["racks"]),
                    arrival_ns=arrival,
                    planned_start_ns=int(r["start_ns"]),
                    start_ns=start,
                    wait_ns=None if start is None else start - arrival,
                    atsw_bytes=int(through[job == j].sum()),
                )
            )
        return R.Schedule(
            scheduler=str(plan["scheduler"]),
            bytes=int(nbytes.sum()),
            atsw_bytes=int(through.sum()),
            jobs=tuple(out),
        )
    return None


def run_metrics(
    run, *, top: int = 10, series: bool = False, rate_bps: int | None = None,
    per_port: bool = True,
) -> R.RunMetrics:  # fmt: skip
    """Metrics of a run directory (any engine); `rate_bps` times its captures' PFC quanta
    (default: the fabric's slowest link); with `series`, the time series, where `per_port`
    False leaves the [port][sample] ones empty (the report reads those from the port
    samples' entries: at thousands of ports they are gigabytes as nested tuples)."""
    from aifabric.analysis.ecmp import ecmp_metrics
    from aifabric.fabric.export import fabric_from_topology

    fabric = fabric_from_topology(run.topology())
    flows = run.flows()
    has_flows = flows is not None and len(flows["src"]) > 0
    if has_flows:
        done = flows["end_ns"] >= 0
        fct = (flows["end_ns"] - flows["start_ns"])[done]
        totals = R.FlowTotals(
            count=int(len(done)), finished=int(done.sum()), bytes=int(flows["bytes"].sum())
        )
        fct_ns = distribution(fct)
        ports_used = flow_ports(fabric, flows["src"], flows["path_ptr"], flows["path_link"])
        routings, epoch = _routings(run, fabric, flows)
        ecmp = ecmp_metrics(fabric, flows, routings, ports_used, epoch)
    else:
        totals = R.FlowTotals(count=0, finished=0, bytes=0)
        fct_ns = distribution([])
        ecmp = R.Ecmp()

    ports = run.ports()
    # An emulated run divides every rate by `scale` and stretches time by it; it records
    # fabric time and bytes, so every figure here is the fabric's, and `scale` converts.
    scale = float(ports["scale"]) if ports is not None and "scale" in ports else 1.0
    cnp = recorded(run, "cnp_sent")
    has_ports = ports is not None and ports["port"].size > 0
    if cnp is None and has_ports and "cnp_sent" in ports:
        cnp = int(ports.total("cnp_sent").sum())
    cnp = None if cnp is None else int(cnp)
    spread = pause_spread(fabric, ports) if has_ports else []
    if has_ports:
        congestion, hotspots = _port_metrics(fabric, ports, spread, top, cnp)
    else:
        congestion, hotspots = None, []

    col = run.collectives()
    jobs_seen = list(flows["job"]) if has_flows else []
    if col is not None:
        jobs_seen += list(col["job"])
    names = job_names(run, jobs_seen)
    collectives = _collectives(col, flows if has_flows else None, fabric, names, scale)
    jobs = _jobs(collectives.ops, flows if has_flows else None, names)
    if col is not None:
        jobs = _iterations(col, jobs)
    if has_ports and has_flows:
        jobs = senders_paused(fabric, ports, flows, jobs)
        throughput = _throughput(fabric, ports, flows, jobs, top, series)
    else:
        throughput = R.Throughput(low_utilization=LOW_UTILIZATION)

    faults = fault_metrics(run, fabric, flows if has_flows else None)
    caps = []
    for path in run.captures():
        cap = C.read_capture(path)
        from aifabric.fabric.addressing import format_ipv4, nic_ipv4

        ips = nic_ipv4(fabric)
        nic_names = {format_ipv4(ips[v]): fabric.node_name[v] for v in fabric.nic_ids}
        rate = rate_bps or (int(fabric.link_rate_bps.min()) if fabric.n_links else DEFAULT_RATE_BPS)
        caps.append(
            capture_metrics(cap, rate_bps=rate, top=top, nic_names=nic_names, series=series)
        )
    return R.RunMetrics(
        source="run",
        path=str(run.path),
        engine=run.engine,
        status=run.status,
        fabric=fabric.name,
        scenario={
            k: v
            for k, v in run.meta.get("scenario", {}).items()
            if isinstance(v, str | int | float)
        },
        flows=totals,
        fct_ns=fct_ns,
        ecmp=ecmp,
        emulation_scale=scale,
        pause_spread=tuple(spread),
        congestion=congestion,
        hotspots=tuple(hotspots),
        cnp_sent=cnp,
        collectives=collectives,
        jobs=tuple(jobs),
        throughput=throughput,
        series=_port_series(fabric, ports, per_port) if series and has_ports else None,
        captures=tuple(caps),
        faults=faults,
        waves=wave_metrics(
            run, fabric, ports if has_ports else None, flows if has_flows else None, jobs,
            collectives.ops, faults,
        ),
        schedule=schedule_metrics(run, fabric, flows if has_flows else None),
    )  # fmt: skip


MIN_QUEUE_DELAY_NS = 1000  # a shorter queue (~50 KB at 400G) costs no one anything worth a row


def _port_metrics(
    fabric, ports: PortSamples, spread: list[R.PausedPort], top: int, cnp: int | None
):
    """Per port figures, totals, and the hot spots: the ports that caused what the run lost.

    A hot spot's cost is the pause time it caused (every port paused in chains
    rooted at it) plus its deepest queue as delay (bytes at its line rate); a
    port is one when it caused pauses, marked or dropped packets, or queued at
    least `MIN_QUEUE_DELAY_NS`. Ports paused only because of others are victims
    (see `pause_spread`), not hot spots.
    """
    names = fabric.port_names
    port = ports["port"].astype(np.int64)
    interval = int(ports["interval_ns"])
    nsamp = len(ports["t_ns"])
    span_ns = max(interval * nsamp, 1)
    rate = fabric.port_rate_bps[port].astype(np.float64)  # bytes and times are fabric's
    tx_total = ports.total("tx_bytes")
    util = tx_total * 8 * 1e9 / span_ns / rate
    peak_util = ports.peak("tx_bytes") * 8 * 1e9 / interval / rate
    mtu = fabric.link_mtu_bytes[port // 2].astype(np.int64)
    est_packets = tx_total / (mtu + ROCE_OVERHEAD_BYTES)
    marked = ports.total("ecn_marked")
    paused = ports.total("paused_ns")
    pfc = ports.total("pfc_sent")
    drops = ports.total("drops")
    qpeak = ports.peak("qdepth_max_bytes")
    # a port's queue over every sample, those without an entry as 0: the distribution of
    # one that never queued is the same for all, and the rows are built one port at a time
    quiet = distribution(np.zeros(nsamp))
    qmax_rows = ports.each_row("qdepth_max_bytes")
    qmean_rows = ports.each_row("qdepth_mean_bytes")
    caused: dict[str, int] = {}
    for r in spread:
        if r.root is not None:
            caused[r.root] = caused.get(r.root, 0) + r.paused_ns
    victims = {r.port for r in spread}
    rows = []
    for j, p in enumerate(port):
        qmax, qmean = next(qmax_rows), next(qmean_rows).astype(np.float64)
        dq = distribution(qmax) if qpeak[j] else quiet
        delay = 8e9 / rate[j]
        rows.append(
            R.PortFigures(
                port=names[p],
                port_id=int(p),
                tx_bytes=int(tx_total[j]),
                utilization=float(util[j]),
                peak_utilization=float(peak_util[j]),
                qdepth_bytes=dq,
                queue_delay_max_ns=float(dq.max * delay) if nsamp else 0.0,
                queue_delay_mean_ns=float(qmean.mean() * delay) if nsamp else 0.0,
                ecn_marked=int(marked[j]),
                ecn_fraction_est=float(marked[j] / est_packets[j]) if est_packets[j] else 0.0,
                paused_ns=int(paused[j]),
                paused_fraction=float(paused[j] / span_ns),
                pause_caused_ns=int(caused.get(names[p], 0)),
                pfc_sent=int(pfc[j]),
                drops=int(drops[j]),
            )
        )
    congestion = R.Congestion(
        interval_ns=interval,
        samples=nsamp,
        ports=len(port),
        ecn_marked=int(marked.sum()),
        ecn_fraction_est=float(marked.sum() / est_packets.sum()) if est_packets.sum() else 0.0,
        paused_ns=int(paused.sum()),
        paused_ports=int(np.count_nonzero(paused)),
        pfc_frames=int(pfc.sum()),
        drops=int(drops.sum()),
        qdepth_max_bytes=int(qpeak.max()) if nsamp and len(port) else 0,
        per_port=tuple(rows),
        cnp_sent=cnp,
    )

    def hot(r):
        queued = r.queue_delay_max_ns >= MIN_QUEUE_DELAY_NS
        trouble = queued or r.ecn_marked or r.drops
        return r.pause_caused_ns or (r.port not in victims and trouble)

    def cost(r):
        return r.pause_caused_ns + r.queue_delay_max_ns

    busy = sorted(
        (r for r in rows if hot(r)), key=lambda r: (-cost(r), -r.ecn_marked, -r.drops, r.port_id)
    )
    ranked = [
        R.Hotspot(
            rank=i + 1,
            port=r.port,
            cost_ns=cost(r),
            pause_caused_ns=r.pause_caused_ns,
            queue_delay_max_ns=r.queue_delay_max_ns,
            queue_delay_mean_ns=r.queue_delay_mean_ns,
            qdepth_max_bytes=int(r.qdepth_bytes.max),
            ecn_marked=r.ecn_marked,
            drops=r.drops,
            paused_ns=r.paused_ns,
            utilization=r.utilization,
        )
        for i, r in enumerate(busy[:top])
    ]
    return congestion, ranked


def _port_series(fabric, ports: PortSamples, per_port: bool = True) -> R.PortSeries:
    port = ports["port"].astype(np.int64)
    interval = int(ports["interval_ns"])
    rate = fabric.port_rate_bps[port].astype(np.float64)

    def rows(name, of=lambda j, row: row):  # [port][sample], built one port at a time
        if not per_port:
            return ()
        return tuple(tuple(of(j, r).tolist()) for j, r in enumerate(ports.each_row(name)))

    return R.PortSeries(
        t_ns=tuple(ports["t_ns"].astype(np.int64).tolist()),
        interval_ns=interval,
        ports=tuple(fabric.port_name(p) for p in port),
        port_ids=tuple(port.tolist()),
        utilization=rows("tx_bytes", lambda j, tx: tx * 8 * 1e9 / interval / rate[j]),
        qdepth_max_bytes=rows("qdepth_max_bytes"),
        ecn_marked=tuple(ports.per_sample("ecn_marked").tolist()),
        paused_ns=tuple(ports.per_sample("paused_ns").tolist()),
        paused_ports=tuple(ports.nonzero_per_sample("paused_ns").tolist()),
        pfc_sent=tuple(ports.per_sample("pfc_sent").tolist()),
        # engines that sample CNPs per port
        cnp_sent=tuple(ports.per_sample("cnp_sent").tolist()) if "cnp_sent" in ports else None,
    )


def _ideal_ns(fabric, flows: dict | None, op: int) -> int | None:
    """The op's time at line rate: its busiest NIC's bytes (sent or received) at the NIC's
    rate, as if the fabric never congested and steps overlapped (`traffic show`'s ideal)."""
    if flows is None:
        return None
    sel = flows["op"] == op
    if not sel.any():
        return None
    b = flows["bytes"][sel].astype(np.float64)
    sent = np.bincount(flows["src"][sel], weights=b, minlength=fabric.n_nodes)
    recv = np.bincount(flows["dst"][sel], weights=b, minlength=fabric.n_nodes)
    nics = fabric.nic_ids
    rate = fabric.port_rate_bps[fabric.nic_port[nics]].astype(np.float64)
    busy = np.maximum(sent[nics], recv[nics])
    return int(np.ceil((busy * 8e9 / rate).max()))


def _busbw_factor(col: dict, i: int) -> float | None:
    """The nccl-tests factor the run recorded: its own column, or (a run written before
    that column) busbw / algbw as written, None for an op that did not finish there."""
    if "busbw_factor" in col:
        return float(col["busbw_factor"][i])
    algbw, busbw = float(col["algbw_bps"][i]), float(col["busbw_bps"][i])
    return busbw / algbw if algbw > 0 else None


def _collectives(col, flows, fabric, names: dict[int, str], scale: float = 1.0) -> R.Collectives:
    """Per op: time, algbw and busbw (nccl-tests, computed here from start and end), its
    ideal time at line rate and the efficiency ideal / actual."""
    if col is None or not len(col["op"]):
        return R.Collectives()
    ops = []
    for i in range(len(col["op"])):
        start, end = int(col["start_ns"][i]), int(col["end_ns"][i])
        nbytes = int(col["bytes"][i])
        dur = end - start if end >= 0 and start >= 0 and end > start else None
        algbw = algbw_bps(nbytes, dur) if dur else None
        factor = _busbw_factor(col, i)
        ideal = _ideal_ns(fabric, flows, int(col["op"][i]))
        job = int(col["job"][i])
        ops.append(
            R.Collective(
                op=int(col["op"][i]),
                job=job,
                job_name=names.get(job, f"job {job}"),
                kind=str(col["kind"][i]),
                algorithm=str(col["algorithm"][i]),
                bytes=nbytes,
                ranks=int(col["ranks"][i]),
                start_ns=start,
                end_ns=end,
                time_ns=dur,
                ideal_ns=ideal,
                efficiency=ideal / dur if dur and ideal is not None else None,
                algbw_bps=algbw,
                busbw_factor=factor,
                busbw_bps=algbw * factor if algbw is not None and factor is not None else None,
                # what the emulated links carried (rates divided by the scale)
                busbw_emulated_bps=(
                    algbw * factor / scale if algbw is not None and factor is not None else None
                ),
                protocol=str(col["protocol"][i]) or None if "protocol" in col else None,
                predicted_ns=(
                    int(col["predicted_ns"][i]) or None if "predicted_ns" in col else None
                ),
            )
        )
    return R.Collectives(
        count=len(ops), finished=sum(o.time_ns is not None for o in ops), ops=tuple(ops)
    )


def _jobs(ops, flows: dict | None, names: dict[int, str]) -> list[R.Job]:
    """Per job: its ops one after another (time, ideal, efficiency, busbw of its collective
    ops), a pattern's goodput (the bytes of its flows that finished over its time) and its
    flows' completion times. Jobs are never averaged together."""
    jobs = sorted(set(names) | {o.job for o in ops})
    out = []
    for j in jobs:
        mine = [o for o in ops if o.job == j]
        done = [o for o in mine if o.time_ns is not None]
        collective = [o for o in done if o.kind not in SIZE_IN_ALL]
        pattern = bool(mine) and all(o.kind in SIZE_IN_ALL for o in mine)
        fin = len(done) == len(mine) and mine
        start = min((o.start_ns for o in mine if o.start_ns >= 0), default=None)
        end = max((o.end_ns for o in mine), default=None) if fin else None
        ideal = sum(o.ideal_ns or 0 for o in mine) if mine else None
        time = end - start if end is not None and start is not None else None
        fct = receivers = None
        delivered = sum(o.bytes for o in done)
        if flows is not None:
            sel = (flows["job"] == j) & (flows["end_ns"] >= 0)
            fct = distribution((flows["end_ns"] - flows["start_ns"])[sel])
            receivers = int(len(np.unique(flows["dst"][flows["job"] == j])))
            delivered = int(flows["bytes"][sel].sum())
        out.append(
            R.Job(
                job=j,
                name=names.get(j, f"job {j}"),
                kinds=tuple(sorted({o.kind for o in mine})),
                ops=len(mine),
                ops_finished=len(done),
                bytes=sum(o.bytes for o in mine),
                start_ns=start,
                end_ns=end,
                time_ns=time,
                ideal_ns=ideal,
                efficiency=ideal / time if time and ideal else None,
                algbw_bps=distribution([o.algbw_bps for o in done]),
                busbw_bps=distribution([o.busbw_bps for o in collective]),
                busbw_emulated_bps=distribution([o.busbw_emulated_bps for o in collective]),
                goodput_bps=delivered * 8e9 / time if pattern and time else None,
                fct_ns=fct,
                receivers=receivers,
            )
        )
    return out


def _iterations(col: dict, jobs: list[R.Job]) -> list[R.Job]:
    """The jobs with compute given their iteration time, compute-only lower bound and
    exposed communication (`aifabric.fabric.completion.iterations`)."""
    from dataclasses import replace

    from aifabric.fabric.completion import iterations

    per_job = {it["job"]: it for it in iterations(col)}
    return [
        replace(
            j,
            compute_ns=per_job[j.job]["compute_ns"],
            iteration_ns=per_job[j.job]["iteration_ns"],
            exposed_ns=per_job[j.job]["exposed_ns"],
        )
        if j.job in per_job
        else j
        for j in jobs
    ]


LOW_UTILIZATION = 0.5  # a job's receivers below half their line rate: a worst interval


def _receiver_columns(fabric, flows: dict, job: int, col: dict[int, int]) -> list[int]:
    """The port-series columns of a job's receivers' downlinks (which carry only its flows:
    jobs share no NIC); `col` maps a port to its column."""
    dst = np.unique(flows["dst"][flows["job"] == job])
    downs = [int(fabric.nic_port[d]) ^ 1 for d in dst]
    return [col[p] for p in downs if p in col]


def _throughput(fabric, ports: PortSamples, flows: dict, jobs: list[R.Job], top: int, series: bool):
    """Receive throughput of every job (its receivers' downlinks, which carry only its
    flows: jobs share no NIC), the busiest links, and each job's stretches of intervals
    below `LOW_UTILIZATION` of its receivers' line rate while it ran (the `top` longest;
    with `series`, all of them in time order as well)."""
    port = ports["port"].astype(np.int64)
    col = {int(p): j for j, p in enumerate(port)}
    interval = int(ports["interval_ns"])
    t_ns = ports["t_ns"].astype(np.int64)
    out_jobs, worst = [], []
    for job in jobs:
        cols = _receiver_columns(fabric, flows, job.job, col)
        if not cols:
            continue
        rx = ports.per_sample("tx_bytes", cols).astype(np.int64)
        cap_bps = float(fabric.port_rate_bps[[port[c] for c in cols]].sum())
        util = rx * 8e9 / interval / cap_bps
        out_jobs.append(
            R.JobThroughput(
                job=job.job,
                name=job.name,
                receivers=len(cols),
                line_rate_bps=cap_bps,
                rx_bytes=int(rx.sum()),
                rx_bytes_per_interval=tuple(rx.tolist()) if series else None,
                utilization=tuple(util.tolist()) if series else None,
            )
        )
        start = job.start_ns if job.start_ns is not None else 0
        end = job.end_ns if job.end_ns is not None else int(t_ns[-1]) + interval
        inside = (t_ns >= start) & (t_ns + interval <= end)
        low = inside & (util < LOW_UTILIZATION)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], low.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2], strict=True):
            worst.append(
                R.LowInterval(
                    job=job.job,
                    name=job.name,
                    start_ns=int(t_ns[a]),
                    end_ns=int(t_ns[b - 1]) + interval,
                    intervals=int(b - a),
                    utilization=float(util[a:b].mean()),
                    rx_bps=float(rx[a:b].sum() * 8e9 / ((b - a) * interval)),
                )
            )
    worst.sort(key=lambda w: (-w.intervals, w.utilization, w.start_ns))
    total = ports.total("tx_bytes").astype(np.int64)
    ranked = np.argsort(-total, kind="stable")[:top]
    ranked = ranked[: np.count_nonzero(total[ranked])]  # those that carried something
    tx = ports.rows("tx_bytes", ranked).astype(np.int64) if series else None
    busiest = []
    for k, j in enumerate(ranked):
        link = R.BusyLink(port=fabric.port_name(int(port[j])), tx_bytes=int(total[j]))
        if series:
            rate = float(fabric.port_rate_bps[port[j]])
            link = replace(
                link,
                tx_bytes_per_interval=tuple(tx[k].tolist()),
                utilization=tuple((tx[k] * 8e9 / interval / rate).tolist()),
            )
        busiest.append(link)
    return R.Throughput(
        low_utilization=LOW_UTILIZATION,
        worst_intervals=tuple(worst[:top]),
        jobs=tuple(out_jobs),
        busiest=tuple(busiest),
        # every stretch, for a chart that shades them all
        low_intervals=tuple(sorted(worst, key=lambda w: (w.start_ns, w.job))) if series else None,
    )


# --- the few numbers compare shows ---------------------------------------------------------


def summary(m: R.RunMetrics | R.CaptureMetrics) -> R.Summary:
    """Headline numbers of a run's or a capture's metrics (None where not measured); a run's
    collective figures per job, under `jobs`."""
    if m.source == "capture":
        imb = m.per_interface.imbalance
        return R.Summary(
            name=m.file,
            jobs=(),
            ecmp_tier="interfaces" if imb else None,
            ecmp_max_mean=imb.max_mean if imb else None,
            ecmp_max_mean_expected=None,
            ecmp_collisions=m.per_interface.collisions,
            ecmp_collisions_expected=m.per_interface.collisions_expected,
            ecn_marked=m.ecn.ce,
            ecn_fraction=m.ecn.ce_fraction,
            cnp=m.cnp.count,
            pfc_frames=m.pfc.frames,
            paused_ns=int(sum(m.pfc.paused_ns_per_priority)),
            drops=None,
            max_queue_bytes=None,
            fct_p50_ns=m.fct_ns.p50,
            fct_p99_ns=m.fct_ns.p99,
        )
    tiers = m.ecmp.tiers
    # the tier furthest above what uniform hashing gives the same QPs on the same links
    worst = max(tiers, key=lambda t: t.bytes.max_mean / t.bytes_expected.max_mean, default=None)
    cong = m.congestion
    return R.Summary(
        name=m.path.rstrip("/").split("/")[-1],
        jobs=tuple(
            R.JobSummary(
                job=j.job,
                name=j.name,
                kind="+".join(j.kinds) or "-",
                busbw_bps=j.busbw_bps.mean,
                goodput_bps=j.goodput_bps,
                time_ns=j.time_ns,
                ideal_ns=j.ideal_ns,
                efficiency=j.efficiency,
                fct_p99_ns=j.fct_ns.p99 if j.fct_ns is not None else None,
            )
            for j in m.jobs
        ),
        ecmp_tier=worst.tier if worst else None,
        ecmp_max_mean=worst.bytes.max_mean if worst else None,
        ecmp_max_mean_expected=worst.bytes_expected.max_mean if worst else None,
        ecmp_collisions=worst.collisions if worst else None,
        ecmp_collisions_expected=worst.collisions_expected if worst else None,
        ecn_marked=cong.ecn_marked if cong else None,
        ecn_fraction=cong.ecn_fraction_est if cong else None,
        cnp=m.cnp_sent,
        pfc_frames=cong.pfc_frames if cong else None,
        paused_ns=cong.paused_ns if cong else None,
        drops=cong.drops if cong else None,
        max_queue_bytes=cong.qdepth_max_bytes if cong else None,
        fct_p50_ns=m.fct_ns.p50,
        fct_p99_ns=m.fct_ns.p99,
    )
