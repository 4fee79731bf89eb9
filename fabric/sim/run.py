"""Run a `Scenario` on the simulator into a run directory (fabric.rundir)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fabric.rundir import RunWriter
from fabric.scenario import Scenario
from fabric.sim.engine import Progress, Simulation
from fabric.sim.pcap import FrameBuilder, write_captures
from fabric.sim.scenario_spec import resolve_port

CAPTURE_SNAPLEN = 256


def simulation_for(scenario: Scenario, capture_ports=()) -> Simulation:
    return Simulation(
        scenario.fabric,
        scenario.flows,
        ecmp=scenario.ecmp,
        same_seed=scenario.same_seed,
        seed=scenario.seed,
        cc=scenario.cc,
        cc_params=scenario.cc_params,
        faults=scenario.faults,
        sample_interval_ns=scenario.sample_interval_ns,
        capture_ports=capture_ports,
    )


def run_scenario(
    scenario: Scenario,
    writer: RunWriter,
    progress: Callable[[Progress], None] | None = None,
) -> dict:
    """Simulate; write topology, flows, ports, collectives, captures and run.json.

    Ctrl-C (KeyboardInterrupt) ends the run as "partial" with everything
    simulated so far written; returns the summary also recorded in run.json.
    """
    fabric = scenario.fabric
    writer.topology(fabric)
    ports = [resolve_port(fabric, name) for name in scenario.captures]
    sim = simulation_for(scenario, ports)
    status, message = "complete", ""
    try:
        sim.run(progress=progress)
    except KeyboardInterrupt:
        status, message = "partial", "interrupted; results cover the time simulated so far"
    except BaseException as e:
        write_results(sim, writer, ports)
        writer.finish("failed", f"{type(e).__name__}: {e}")
        raise
    summary = write_results(sim, writer, ports)
    unfinished = len(scenario.flows) - summary["flows_done"]
    if status == "complete" and unfinished:
        message = f"{unfinished} flows did not complete (no path, or waiting on ones that did not)"
    writer.finish(status, message)
    summary["status"] = status
    return summary


def write_results(sim: Simulation, writer: RunWriter, ports) -> dict:
    sim.close()
    flows = sim.flow_records()
    writer.flows(**flows)
    series = sim.port_series()
    writer.ports(**series)
    coll = sim.collective_records()
    writer.collectives(**coll)
    if len(ports):
        builder = FrameBuilder(sim.fabric, sim.flows, sim.routing.ip, sim.mtu)
        write_captures(
            writer.path / "captures",
            sim.fabric,
            builder,
            sim.captures(),
            sorted(set(ports)),
            CAPTURE_SNAPLEN,
        )
    summary = summarize(sim, flows, series, coll)
    writer.note(
        engine="sim",
        counters=sim.counters(),
        summary=summary,
        faults_applied=[f.__dict__ for f in sim.applied_faults],
        simulator_wall_s=round(sim.wall_s, 3),
    )
    return summary


def summarize(sim: Simulation, flows: dict, series: dict, coll: dict) -> dict:
    """The figures `aifabric run` prints: completion, bandwidth, queues, ECN, PFC, drops."""
    c = sim.counters()
    start, end = flows["start_ns"], flows["end_ns"]
    started = start[start >= 0]
    done = end[end >= 0]
    completion = int(done.max() - started.min()) if len(done) and len(started) else None
    q = series["qdepth_max_bytes"]
    max_queue, where = 0, None
    if q.size:
        idx = np.unravel_index(int(np.argmax(q)), q.shape)
        max_queue = int(q[idx])
        if max_queue:
            from fabric.sim.pcap import port_label

            where = port_label(sim.fabric, int(series["port"][idx[1]]))
    ops = []
    for j in range(len(coll["op"])):
        ops.append(
            {
                "op": int(coll["op"][j]),
                "kind": str(coll["kind"][j]),
                "algorithm": str(coll["algorithm"][j]),
                "bytes": int(coll["bytes"][j]),
                "ranks": int(coll["ranks"][j]),
                "time_ns": int(coll["end_ns"][j] - coll["start_ns"][j])
                if coll["end_ns"][j] >= 0
                else None,
                "algbw_bps": float(coll["algbw_bps"][j]),
                "busbw_bps": float(coll["busbw_bps"][j]),
            }
        )
    return {
        "flows": len(sim.flows),
        "flows_done": c["flows_done"],
        "completion_ns": completion,
        "simulated_ns": c["simulated_ns"],
        "collectives": ops,
        "max_queue_bytes": max_queue,
        "max_queue_port": where,
        "ecn_marked": c["ecn_marked"],
        "cnp_sent": c["cnp_sent"],
        "pfc_frames": c["pfc_frames"],
        "paused_ns_total": int(series["paused_ns"].sum()),
        "drops": c["drops"],
        "events": c["events"],
        "packet_hops": c["packet_hops"],
    }
