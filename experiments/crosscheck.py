"""One scenario in both engines, side by side (`aifabric crosscheck`).

`crosscheck(sc, out, switch=...)` runs the scenario in the simulator and in the
emulator, each with the hash policy of the emulator's kind of switch (`linux` for
routers, `ovs` for Open vSwitch; `aifabric.fabric.routing.EMULATOR_POLICY`), into `out/sim` and
`out/mininet`, and `compare` reads the two run directories back:

- paths: every flow's links, equal or listed where they differ (these must agree: the
  policies reproduce the switches' hashes);
- per collective: completion time and busbw in both, and their ratio;
- per uplink (a switch port towards a switch): bytes sent in both;
- totals: ECN marks, PFC pause time, drops.

The verdict holds when every path is equal and every collective's completion time, and
every uplink's bytes (those that carried data), are within the tolerance of the
simulator's. ECN marks, pause time
and drops are shown, not judged: the emulator's marking (RED or the eBPF marker on a
polled queue) and its PFC (a monitor that polls queues every few milliseconds of wall
time) count differently from the simulator's per-packet model; docs/emulator.md says why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Role
from aifabric.fabric.routing import EMULATOR_POLICY
from aifabric.fabric.rundir import Run, remove_run_dir

DEFAULT_TOLERANCE = 0.15
SHOWN_DIFFERENCES = 20
CONTROL_SHARE = 0.01
"""An uplink that carried less than this share of the busiest uplink's bytes in both runs
carried only control packets (ACKs, NAKs, CNPs), which the engines send differently (the
simulator acknowledges every packet): its bytes are shown, not judged."""


def with_policy(sc, switch: str):
    """`sc` with the hash policy that predicts the emulator's `switch` kind."""
    from dataclasses import replace

    if switch not in EMULATOR_POLICY:
        raise AifabricError(f"switch {switch!r} is not one of {', '.join(EMULATOR_POLICY)}")
    return replace(sc, ecmp=EMULATOR_POLICY[switch])


def crosscheck(
    sc,
    out: str | Path,
    *,
    switch: str = "router",
    scale: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    stop=None,
    progress=None,
) -> dict:
    """Run `sc` in both engines under `out` and compare them (see the module)."""
    from aifabric.engines import engine, run_scenario

    reason = engine("mininet").unavailable(switch=switch)
    if reason:
        raise AifabricError(reason)
    sc = with_policy(sc, switch)
    out = Path(out)
    options = {"switch": switch} | ({"scale": scale} if scale is not None else {})
    run_scenario("sim", sc, out / "sim", stop=stop, progress=progress)
    run_scenario("mininet", sc, out / "mininet", options=options, stop=stop)
    return compare(Run(out / "sim"), Run(out / "mininet"), tolerance=tolerance)


def clear_output(out: Path, *, force: bool = False) -> None:
    """Make `out` ready for a crosscheck: an empty or missing folder is; one holding an
    earlier crosscheck (its two run directories and crosscheck.json) is emptied when
    `force`; anything else is one sentence and left alone."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AifabricError(f"{out} is not a directory")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise AifabricError(
            f"{out} is not empty; give another -o or --force to replace its crosscheck"
        )
    unknown = {p.name for p in out.iterdir()} - {"sim", "mininet", "crosscheck.json"}
    if unknown:
        raise AifabricError(
            f"{out} holds more than a crosscheck ({sorted(unknown)[0]}); not replacing it"
        )
    for name in ("sim", "mininet"):
        remove_run_dir(out / name)
    (out / "crosscheck.json").unlink(missing_ok=True)


def _ratio(emu: float | None, sim: float | None) -> float | None:
    if emu is None or sim is None or sim <= 0:
        return None
    return emu / sim


def _within(ratio: float | None, tolerance: float) -> bool:
    return ratio is not None and abs(ratio - 1) <= tolerance


def compare(sim: Run, emu: Run, *, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """The side-by-side report of two run directories of one scenario (see the module)."""
    from aifabric.fabric.export import fabric_from_topology

    if sim.topology() != emu.topology():
        raise AifabricError("the two runs are not of the same topology")
    fabric = fabric_from_topology(sim.topology())
    report = {
        "sim": str(sim.path),
        "mininet": str(emu.path),
        "status": {"sim": sim.status, "mininet": emu.status},
        "tolerance": tolerance,
        "paths": _paths(sim, emu, fabric),
        "collectives": _collectives(sim, emu, tolerance),
        "uplinks": _uplinks(sim, emu, fabric, tolerance),
        "totals": _totals(sim, emu),
    }
    reasons = []
    if report["status"]["sim"] != "complete" or report["status"]["mininet"] != "complete":
        reasons.append("a run did not complete")
    if report["paths"]["differ"]:
        reasons.append(f"{report['paths']['differ']} flows took different paths")
    late = [c for c in report["collectives"] if not c["within"]]
    if late:
        reasons.append(f"{len(late)} collectives' completion outside the tolerance")
    off = [u for u in report["uplinks"] if not u["within"]]
    if off:
        reasons.append(f"{len(off)} uplinks' bytes outside the tolerance")
    report["verdict"] = "agree" if not reasons else "differ"
    report["reasons"] = reasons
    return report


def _paths(sim: Run, emu: Run, fabric) -> dict:
    a, b = sim.flows(), emu.flows()
    if a is None or b is None or not np.array_equal(a["flow_id"], b["flow_id"]):
        raise AifabricError("the two runs do not hold the same flows")
    n = len(a["flow_id"])
    differ = []
    for i in range(n):
        x = a["path_link"][a["path_ptr"][i] : a["path_ptr"][i + 1]].tolist()
        y = b["path_link"][b["path_ptr"][i] : b["path_ptr"][i + 1]].tolist()
        if x != y:
            differ.append((i, int(a["src"][i]), x, y))
    return {
        "flows": n,
        "equal": n - len(differ),
        "differ": len(differ),
        "differences": [
            {"flow": i, "sim": _port_names(fabric, src, x), "mininet": _port_names(fabric, src, y)}
            for i, src, x, y in differ[:SHOWN_DIFFERENCES]
        ],
    }


def _port_names(fabric, src: int, links: list[int]) -> list[str]:
    """A flow's links as the ports it leaves by (`node--peer`), from its source NIC on."""
    out, node = [], src
    for link in links:
        port = 2 * link if int(fabric.link_a[link]) == node else 2 * link + 1
        out.append(fabric.port_name(port))
        node = int(fabric.port_peer[port])
    return out


def _collectives(sim: Run, emu: Run, tolerance: float) -> list[dict]:
    a, b = sim.collectives(), emu.collectives()
    rows = []
    if a is None or b is None:
        return rows
    for j in range(len(a["op"])):
        t_sim = int(a["end_ns"][j] - a["start_ns"][j]) if a["end_ns"][j] >= 0 else None
        t_emu = int(b["end_ns"][j] - b["start_ns"][j]) if b["end_ns"][j] >= 0 else None
        ratio = _ratio(t_emu, t_sim)
        rows.append(
            {
                "op": int(a["op"][j]),
                "kind": str(a["kind"][j]),
                "algorithm": str(a["algorithm"][j]),
                "time_ns": {"sim": t_sim, "mininet": t_emu},
                "busbw_bps": {"sim": float(a["busbw_bps"][j]), "mininet": float(b["busbw_bps"][j])},
                "ratio": ratio,
                "within": _within(ratio, tolerance),
            }
        )
    return rows


def _uplinks(sim: Run, emu: Run, fabric, tolerance: float) -> list[dict]:
    """Bytes each switch-to-switch port sent, in both runs (ports that carried nothing in
    either are left out)."""
    a, b = sim.ports(), emu.ports()
    if a is None or b is None:
        return []
    sent_a, sent_b = _sent(a), _sent(b)
    role = fabric.node_role
    totals = []
    for port in range(fabric.n_ports):
        if role[fabric.port_node[port]] == Role.NIC or role[fabric.port_peer[port]] == Role.NIC:
            continue
        s, e = sent_a.get(port, 0), sent_b.get(port, 0)
        if s or e:
            totals.append((port, s, e))
    biggest = max((max(s, e) for _, s, e in totals), default=0)
    rows = []
    for port, s, e in totals:
        ratio = _ratio(e, s)
        judged = max(s, e) >= CONTROL_SHARE * biggest
        rows.append(
            {
                "port": fabric.port_name(port),
                "bytes": {"sim": s, "mininet": e},
                "ratio": ratio,
                "judged": judged,
                "within": _within(ratio, tolerance) or not judged,
            }
        )
    return rows


def _sent(series) -> dict[int, int]:
    """Bytes each recorded port sent over the run."""
    return dict(zip(series["port"].tolist(), series.total("tx_bytes").tolist(), strict=True))


def _totals(sim: Run, emu: Run) -> dict:
    out = {}
    sa = sim.meta.get("results", {}).get("summary", {})
    sb = emu.meta.get("results", {}).get("summary", {})
    for key in ("completion_ns", "ecn_marked", "paused_ns_total", "pfc_frames", "drops"):
        out[key] = {"sim": sa.get(key), "mininet": sb.get(key)}
    return out
