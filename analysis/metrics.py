"""Metrics of congestion, ECMP imbalance and completion, from captures and run directories.

Both entry points return plain dicts of JSON-able values (what `analyze --json`
prints); `summary()` reduces either to the few numbers `compare` puts side by side.

Conventions:

- Pause time of a PFC frame: quanta x 512 bit times at the link rate; a later
  frame for the same priority on the same interface replaces the running
  pause (quanta 0 is XON and ends it).
- ECMP collisions: m distinct QPs (src, dst, UDP source port, dQPN: what
  the hash sees; a QP's flows over many steps take one path) leave a switch
  over n equal uplinks; a collision is a QP that lands on an uplink already
  carrying one (m minus occupied uplinks). The balls-into-bins expectation
  is m - n (1 - (1 - 1/n)^m). Only up tiers count: going down is not a choice.
- algbw = bytes / time; busbw = algbw x factor (nccl-tests: AllReduce
  2(n-1)/n; AllGather, ReduceScatter, AllToAll (n-1)/n; Broadcast, Reduce,
  send/recv 1). Rates are in bit/s here (x 8 of nccl-tests' bytes/s).
- A run's ECN-marked fraction divides marked packets by the packets a port
  sent, estimated as tx_bytes / (MTU + 58 header bytes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from analysis import capture as C
from fabric.stats import imbalance

QP_KEY = ("src", "dst", "sport", "dqpn")
ROCE_OVERHEAD_BYTES = 58  # Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4
QUANTUM_BITS = 512
DEFAULT_RATE_BPS = 100 * 10**9


# --- small pure functions ---------------------------------------------------------------


def busbw_factor(kind: str, ranks: int) -> float:
    """The nccl-tests bus bandwidth factor of a collective on `ranks` ranks."""
    k = kind.lower().replace("_", "").replace("-", "").replace(" ", "")
    n = max(int(ranks), 1)
    if k == "allreduce":
        return 2.0 * (n - 1) / n
    if k in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def expected_collisions(balls: int, bins: int) -> float:
    """Expected flows landing on an occupied bin when `balls` go uniformly into `bins`."""
    if balls <= 0 or bins <= 0:
        return 0.0
    return float(balls - bins * (1.0 - (1.0 - 1.0 / bins) ** balls))


def distribution(values) -> dict:
    """count, mean, p50, p90, p99 and max of a sample (linear-interpolated percentiles)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {
        "count": int(x.size),
        "mean": float(x.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(x.max()),
    }


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
) -> dict:
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
    out: dict = {
        "source": "capture",
        "file": cap.path.name,
        "format": cap.format,
        "problem": cap.problem,
        "packets": n,
        "bytes": int(length.sum()),
        "captured_bytes": int(cap.caplen.astype(np.int64).sum()),
        "cut_headers": int(np.count_nonzero(cap.flags & C.FLAG_CUT)),
        "interfaces": cap.n_ifaces,
        "start_ns": t0,
        "duration_ns": duration,
        "kinds": {name: int(counts[i]) for i, name in enumerate(C.KIND_NAMES)},
    }

    # ECN over IP packets; CE-marked fraction among all IP packets and among ECN-capable ones
    ip = cap.ipver != 0
    ecn = np.bincount(cap.ecn[ip], minlength=4)
    n_ip = int(ip.sum())
    capable = int(ecn[1] + ecn[2] + ecn[3])
    out["ecn"] = {
        "ip_packets": n_ip,
        "not_ect": int(ecn[0]),
        "ect1": int(ecn[1]),
        "ect0": int(ecn[2]),
        "ce": int(ecn[3]),
        "ce_fraction": float(ecn[3] / n_ip) if n_ip else 0.0,
        "ce_fraction_of_ect": float(ecn[3] / capable) if capable else 0.0,
    }

    roce = kind == C.KIND_ROCE
    cnp = kind == C.KIND_CNP
    out["roce"] = {
        "packets": int(roce.sum()),
        "bytes": int(length[roce].sum()),
        "fecn": int(cap.fecn[roce].sum()),
        "becn": int(cap.becn[roce | cnp].sum()),
    }
    n_cnp = int(cnp.sum())
    out["cnp"] = {
        "count": n_cnp,
        "rate_per_s": float(n_cnp * 1e9 / duration) if duration > 0 else 0.0,
        "per_roce_packet": float(n_cnp / roce.sum()) if roce.any() else 0.0,
        "qps": int(len(np.unique(cap.dqpn[cnp]))) if n_cnp else 0,
    }

    pfc = kind == C.KIND_PFC
    en = cap.pfc_enable[pfc]
    q = cap.quanta[pfc]
    per_prio = [int(((en >> k) & 1).sum()) for k in range(8)]
    xoff = [int((((en >> k) & 1) & (q[:, k] > 0)).sum()) for k in range(8)]
    paused = pause_ns(t[pfc], cap.iface[pfc], en, q, rate_bps)
    out["pfc"] = {
        "frames": int(pfc.sum()),
        "frames_per_priority": per_prio,
        "xoff_per_priority": xoff,
        "xon_per_priority": [a - b for a, b in zip(per_prio, xoff, strict=True)],
        "quanta_per_priority": [int(q[:, k].astype(np.int64).sum()) for k in range(8)],
        "paused_ns_per_priority": [int(x) for x in paused],
        "rate_bps": int(rate_bps),
    }
    pause = kind == C.KIND_PAUSE
    pq = cap.quanta[pause]
    out["pause"] = {
        "frames": int(pause.sum()),
        "quanta": int(pq[:, 0].astype(np.int64).sum()),
        "paused_ns": int(
            pause_ns(t[pause], cap.iface[pause], np.ones(int(pause.sum()), np.uint8), pq, rate_bps)[
                0
            ]
        ),
    }

    out["flows"], out["fct_ns"], flows_if = _capture_flows(cap, top, nic_names)

    # per interface: bytes and flows (the uplinks when each interface is one)
    ifc = cap.iface.astype(np.int64)
    k_if = max(cap.n_ifaces, 1)
    by_if = np.bincount(ifc, weights=length, minlength=k_if)
    out["per_interface"] = {
        "bytes": [int(x) for x in by_if],
        "packets": [int(x) for x in np.bincount(ifc, minlength=k_if)],
        "imbalance": imbalance(by_if) if k_if > 1 else None,
    }
    if k_if > 1:
        # each interface an uplink: flows are the balls ECMP threw (see the module docstring)
        balls = int(flows_if.sum())
        out["per_interface"].update(
            flows=[int(x) for x in flows_if],
            flows_imbalance=imbalance(flows_if),
            collisions=balls - int(np.count_nonzero(flows_if)),
            collisions_expected=expected_collisions(balls, k_if),
        )

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
        out["series"] = {
            "bin_ns": int(b),
            "t_ns": [int(t0 + i * b) for i in range(nb)],
            "throughput_bps": thr.tolist(),
            "ce": ce.tolist(),
            "cnp": cn.tolist(),
            "pfc": pf.tolist(),
        }
    return out


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
        return {"count": 0, "top": []}, distribution([]), np.zeros(k_if, np.int64)
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
            {
                "src": src,
                "dst": dst,
                "sport": int(cap.sport[i]),
                "dport": int(cap.dport[i]),
                "dqpn": int(cap.dqpn[i]),
                "packets": int(pk[f]),
                "bytes": int(by[f]),
                "ce": int(ce[f]),
                "first_ns": int(t_first[f]),
                "duration_ns": int(fct[f]),
            }
        )
    pairs = np.unique(inv * k_if + cap.iface[sel].astype(np.int64))
    flows_if = np.bincount(pairs % k_if, minlength=k_if)
    return {"count": int(nf), "top": rows}, distribution(fct), flows_if


# --- run directories ---------------------------------------------------------------------


def port_names(fabric) -> list[str]:
    return [
        f"{fabric.node_name[fabric.port_node[p]]}:{int(fabric.port_number[p])}"
        f">{fabric.node_name[fabric.port_peer[p]]}"
        for p in range(fabric.n_ports)
    ]


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


def ecmp_metrics(fabric, flows: dict) -> dict:
    """Bytes and flows per uplink of every switch, per up tier, with collisions."""
    from fabric.spread import tier_name, tier_of_ports

    n = len(flows["src"])
    ptr = flows["path_ptr"].astype(np.int64)
    ports = flow_ports(fabric, flows["src"], ptr, flows["path_link"])
    flow_of = np.repeat(np.arange(n), np.diff(ptr))
    nbytes = flows["bytes"].astype(np.float64)
    by_port = np.bincount(ports, weights=nbytes[flow_of], minlength=fabric.n_ports)
    fl_port = np.bincount(ports, minlength=fabric.n_ports)
    # distinct QPs (src, dst, UDP sport, dQPN) per port: the balls ECMP throws
    keys = np.stack([flows[k].astype(np.int64).view(np.uint64) for k in QP_KEY], axis=1)
    qp = group_rows(keys, np.zeros(n, dtype=np.int64))[0] if n else np.zeros(0, np.int64)
    pairs = np.unique(ports * max(n, 1) + qp[flow_of])
    qp_port = np.bincount(pairs // max(n, 1), minlength=fabric.n_ports)
    labels = tier_of_ports(fabric)
    up = (labels >= 0) & ((labels % 4) > (labels // 4))
    switches = []
    tiers: dict[int, dict] = {}
    for node in np.unique(fabric.port_node[up]):
        mine = fabric.ports_of(int(node))
        for label in np.unique(labels[mine][up[mine]]):
            bins = mine[labels[mine] == label]
            if not fl_port[bins].any():
                continue
            m = int(qp_port[bins].sum())
            occupied = int(np.count_nonzero(qp_port[bins]))
            row = {
                "switch": fabric.node_name[node],
                "tier": tier_name(int(label)),
                "uplinks": len(bins),
                "bytes_per_uplink": [int(x) for x in by_port[bins]],
                "flows_per_uplink": [int(x) for x in fl_port[bins]],
                "qps_per_uplink": [int(x) for x in qp_port[bins]],
                "bytes": imbalance(by_port[bins]),
                "flows": imbalance(fl_port[bins]),
                "collisions": m - occupied,
                "collisions_expected": expected_collisions(m, len(bins)),
            }
            switches.append(row)
            t = tiers.setdefault(int(label), {"rows": [], "bytes": [], "flows": []})
            t["rows"].append(row)
            t["bytes"].extend(by_port[bins])
            t["flows"].extend(fl_port[bins])
    tier_rows = []
    for label in sorted(tiers):
        t = tiers[label]
        rows = t["rows"]
        tier_rows.append(
            {
                "tier": tier_name(label),
                "switches": len(rows),
                "uplinks": len(t["bytes"]),
                "flows": int(sum(t["flows"])),
                "bytes": imbalance(t["bytes"]),
                "flows_imbalance": imbalance(t["flows"]),
                "switch_max_mean": float(np.mean([r["bytes"]["max_mean"] for r in rows])),
                "collisions": int(sum(r["collisions"] for r in rows)),
                "collisions_expected": float(sum(r["collisions_expected"] for r in rows)),
            }
        )
    return {"tiers": tier_rows, "switches": switches, "port_bytes": by_port}


def pause_spread(fabric, ports: dict, names: list[str]) -> list[dict]:
    """Which paused port was paused because of which (see `_cause`), in time order.

    Port P (node X towards Y) is paused by PFC frames Y sends when its ingress
    from X fills, which happens when Y cannot drain: one of Y's other ports was
    paused first (the pause spread upstream), or none was and Y's egress was
    congested (P is a root of the tree, caused by Y's deepest queue).
    """
    port = ports["port"].astype(np.int64)
    paused = ports["paused_ns"]
    t_ns = ports["t_ns"].astype(np.int64)
    col = {int(p): j for j, p in enumerate(port)}
    total = paused.sum(axis=0)
    first = np.full(len(port), -1, dtype=np.int64)
    for j in np.flatnonzero(total > 0):
        first[j] = t_ns[np.argmax(paused[:, j] > 0)]
    qmax = ports["qdepth_max_bytes"].max(axis=0) if len(t_ns) else np.zeros(len(port))
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
                "pfc_received": int(ports["pfc_sent"][:, col[p ^ 1]].sum())
                if (p ^ 1) in col
                else None,
                "cause": cause,
                "because_of": names[by] if by is not None else None,
            }
        )
    depth: dict[str, int] = {}
    for r in rows:
        parent = r["because_of"] if r["cause"] == "pause" else None
        r["hops_from_root"] = depth[r["port"]] = (depth.get(parent, 0) + 1) if parent else 0
    return rows


def run_metrics(run, *, top: int = 10, series: bool = False, rate_bps: int | None = None) -> dict:
    """Metrics of a run directory (any engine); `rate_bps` times its captures' PFC quanta
    (default: the fabric's slowest link)."""
    from analysis.topology import fabric_from_topology

    fabric = fabric_from_topology(run.topology())
    names = port_names(fabric)
    out: dict = {
        "source": "run",
        "path": str(run.path),
        "engine": run.engine,
        "status": run.status,
        "fabric": fabric.name,
        "scenario": {
            k: v
            for k, v in run.meta.get("scenario", {}).items()
            if isinstance(v, str | int | float)
        },
    }
    flows = run.flows()
    if flows is not None and len(flows["src"]):
        done = flows["end_ns"] >= 0
        fct = (flows["end_ns"] - flows["start_ns"])[done]
        out["flows"] = {
            "count": int(len(done)),
            "finished": int(done.sum()),
            "bytes": int(flows["bytes"].sum()),
        }
        out["fct_ns"] = distribution(fct)
        ecmp = ecmp_metrics(fabric, flows)
        port_bytes = ecmp.pop("port_bytes")
        out["ecmp"] = ecmp
    else:
        out["flows"] = {"count": 0, "finished": 0, "bytes": 0}
        out["fct_ns"] = distribution([])
        out["ecmp"] = {"tiers": [], "switches": []}
        port_bytes = None

    ports = run.ports()
    # An emulated run divides every rate by `scale` and stretches time by it; it records
    # fabric time and bytes, so every figure here is the fabric's, and `scale` converts.
    scale = float(ports["scale"]) if ports is not None and "scale" in ports else 1.0
    out["emulation_scale"] = scale
    if ports is not None and ports["port"].size:
        out["congestion"], out["hotspots"] = _port_metrics(fabric, ports, names, top)
        out["pause_spread"] = pause_spread(fabric, ports, names)
        if series:
            out["series"] = _port_series(fabric, ports, names)
    else:
        out["congestion"] = None
        out["hotspots"] = []
        out["pause_spread"] = []
    if series and port_bytes is not None:
        out["port_flow_bytes"] = port_bytes.tolist()

    out["collectives"] = _collectives(run.collectives(), scale)
    caps = []
    for path in run.captures():
        cap = C.read_capture(path)
        from fabric.addressing import format_ipv4, nic_ipv4

        ips = nic_ipv4(fabric)
        nic_names = {format_ipv4(ips[v]): fabric.node_name[v] for v in fabric.nic_ids}
        rate = rate_bps or (int(fabric.link_rate_bps.min()) if fabric.n_links else DEFAULT_RATE_BPS)
        caps.append(capture_metrics(cap, rate_bps=rate, top=top, nic_names=nic_names))
    out["captures"] = caps
    return out


def _port_metrics(fabric, ports: dict, names: list[str], top: int):
    port = ports["port"].astype(np.int64)
    interval = int(ports["interval_ns"])
    nsamp = len(ports["t_ns"])
    span_ns = max(interval * nsamp, 1)
    tx = ports["tx_bytes"].astype(np.int64)
    rate = fabric.port_rate_bps[port].astype(np.float64)  # bytes and times are fabric's
    util = tx.sum(axis=0) * 8 * 1e9 / span_ns / rate
    peak_util = (tx.max(axis=0) * 8 * 1e9 / interval / rate) if nsamp else np.zeros(len(port))
    mtu = fabric.link_mtu_bytes[port // 2].astype(np.int64)
    est_packets = tx.sum(axis=0) / (mtu + ROCE_OVERHEAD_BYTES)
    marked = ports["ecn_marked"].sum(axis=0)
    paused = ports["paused_ns"].sum(axis=0)
    pfc = ports["pfc_sent"].sum(axis=0)
    drops = ports["drops"].sum(axis=0)
    qmax = ports["qdepth_max_bytes"]
    rows = []
    for j, p in enumerate(port):
        dq = distribution(qmax[:, j])
        rows.append(
            {
                "port": names[p],
                "port_id": int(p),
                "tx_bytes": int(tx[:, j].sum()),
                "utilization": float(util[j]),
                "peak_utilization": float(peak_util[j]),
                "qdepth_bytes": dq,
                "ecn_marked": int(marked[j]),
                "ecn_fraction_est": float(marked[j] / est_packets[j]) if est_packets[j] else 0.0,
                "paused_ns": int(paused[j]),
                "paused_fraction": float(paused[j] / span_ns),
                "pfc_sent": int(pfc[j]),
                "drops": int(drops[j]),
            }
        )
    congestion = {
        "interval_ns": interval,
        "samples": nsamp,
        "ports": len(port),
        "ecn_marked": int(marked.sum()),
        "ecn_fraction_est": float(marked.sum() / est_packets.sum()) if est_packets.sum() else 0.0,
        "paused_ns": int(paused.sum()),
        "paused_ports": int(np.count_nonzero(paused)),
        "pfc_frames": int(pfc.sum()),
        "drops": int(drops.sum()),
        "qdepth_max_bytes": int(qmax.max()) if qmax.size else 0,
        "per_port": rows,
    }
    # hot spots: ports ranked by time paused, then peak queue, then ECN marks, then utilization
    busy = [r for r in rows if r["paused_ns"] or r["qdepth_bytes"]["max"] or r["ecn_marked"]]
    busy.sort(
        key=lambda r: (-r["paused_ns"], -r["qdepth_bytes"]["max"], -r["ecn_marked"],
                       -r["utilization"], r["port_id"])
    )  # fmt: skip
    hot = [
        {
            "rank": i + 1,
            "port": r["port"],
            "paused_ns": r["paused_ns"],
            "qdepth_max_bytes": int(r["qdepth_bytes"]["max"]),
            "ecn_marked": r["ecn_marked"],
            "utilization": r["utilization"],
        }
        for i, r in enumerate(busy[:top])
    ]
    return congestion, hot


def _port_series(fabric, ports: dict, names: list[str]) -> dict:
    port = ports["port"].astype(np.int64)
    interval = int(ports["interval_ns"])
    rate = fabric.port_rate_bps[port].astype(np.float64)
    return {
        "t_ns": ports["t_ns"].astype(np.int64).tolist(),
        "interval_ns": interval,
        "ports": [names[p] for p in port],
        "port_ids": port.tolist(),
        "utilization": (ports["tx_bytes"] * 8 * 1e9 / interval / rate).T.tolist(),
        "qdepth_max_bytes": ports["qdepth_max_bytes"].T.tolist(),
        "ecn_marked": ports["ecn_marked"].sum(axis=1).tolist(),
        "paused_ns": ports["paused_ns"].sum(axis=1).tolist(),
        "pfc_sent": ports["pfc_sent"].sum(axis=1).tolist(),
    }


def _collectives(col: dict | None, scale: float = 1.0) -> dict:
    if col is None or not len(col["op"]):
        return {"count": 0, "ops": [], "busbw_bps": distribution([])}
    ops = []
    for i in range(len(col["op"])):
        start, end = int(col["start_ns"][i]), int(col["end_ns"][i])
        kind = str(col["kind"][i])
        ranks = int(col["ranks"][i])
        nbytes = int(col["bytes"][i])
        dur = end - start if end >= 0 else None
        algbw = nbytes * 8 * 1e9 / dur if dur else None
        factor = busbw_factor(kind, ranks)
        ops.append(
            {
                "op": int(col["op"][i]),
                "job": int(col["job"][i]),
                "kind": kind,
                "algorithm": str(col["algorithm"][i]),
                "bytes": nbytes,
                "ranks": ranks,
                "start_ns": start,
                "end_ns": end,
                "time_ns": dur,
                "algbw_bps": algbw,
                "busbw_factor": factor,
                "busbw_bps": algbw * factor if algbw is not None else None,
                # what the emulated links carried (rates divided by the scale)
                "busbw_emulated_bps": algbw * factor / scale if algbw is not None else None,
            }
        )
    done = [o for o in ops if o["busbw_bps"] is not None]
    return {
        "count": len(ops),
        "finished": len(done),
        "ops": ops,
        "time_ns": distribution([o["time_ns"] for o in done]),
        "busbw_bps": distribution([o["busbw_bps"] for o in done]),
    }


# --- the few numbers compare shows ---------------------------------------------------------


def summary(m: dict) -> dict:
    """Headline numbers of a run's or a capture's metrics (None where not measured)."""
    if m["source"] == "capture":
        return {
            "name": m["file"],
            "busbw_bps": None,
            "collective_time_ns": None,
            "up_max_mean": (m["per_interface"]["imbalance"] or {}).get("max_mean"),
            "up_jain": (m["per_interface"]["imbalance"] or {}).get("jain"),
            "ecn_marked": m["ecn"]["ce"],
            "ecn_fraction": m["ecn"]["ce_fraction"],
            "cnp": m["cnp"]["count"],
            "pfc_frames": m["pfc"]["frames"],
            "paused_ns": int(sum(m["pfc"]["paused_ns_per_priority"])),
            "drops": None,
            "fct_p50_ns": m["fct_ns"]["p50"],
            "fct_p99_ns": m["fct_ns"]["p99"],
        }
    tiers = m["ecmp"]["tiers"]
    worst = max(tiers, key=lambda t: t["bytes"]["max_mean"]) if tiers else None
    cong = m["congestion"] or {}
    coll = m["collectives"]
    return {
        "name": m["path"].rstrip("/").split("/")[-1],
        "busbw_bps": coll["busbw_bps"]["mean"],
        "collective_time_ns": coll["time_ns"]["mean"] if coll["count"] else None,
        "up_max_mean": worst["bytes"]["max_mean"] if worst else None,
        "up_jain": worst["bytes"]["jain"] if worst else None,
        "ecn_marked": cong.get("ecn_marked"),
        "ecn_fraction": cong.get("ecn_fraction_est"),
        "cnp": None,
        "pfc_frames": cong.get("pfc_frames"),
        "paused_ns": cong.get("paused_ns"),
        "drops": cong.get("drops"),
        "fct_p50_ns": m["fct_ns"]["p50"],
        "fct_p99_ns": m["fct_ns"]["p99"],
    }
