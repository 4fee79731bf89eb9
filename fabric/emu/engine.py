"""One scenario on the emulated fabric, from plan to run directory, torn down on every exit path."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fabric.emu import kernel
from fabric.emu.faults import FaultInjector
from fabric.emu.monitor import Monitor
from fabric.emu.net import SWITCHES, make_network
from fabric.emu.plan import plan
from fabric.emu.replay import Replay
from fabric.errors import AifabricError


class Terminated(Exception):
    """SIGTERM arrived: end the run as partial and clean up."""


def observed_paths(network, scenario) -> tuple[np.ndarray, np.ndarray]:
    """Each flow's links as the switches forward it, asked hop by hop (`Network.egress`)."""
    f, p = network.fabric, network.plan
    ft = scenario.flows
    iface_port = {name: i for i, name in enumerate(p.port_iface)}
    keys = sorted(
        {(int(a), int(b), int(c)) for a, b, c in zip(ft.src, ft.dst, ft.sport, strict=True)}
    )
    paths = {k: [int(f.nic_port[k[0]])] for k in keys}
    live = [k for k in keys if k[0] != k[1]]
    for _ in range(16):
        if not live:
            break
        by_switch = defaultdict(list)
        for k in live:
            last = paths[k][-1]
            by_switch[int(f.port_peer[last])].append(k)

        def ask(item):
            s, ks = item
            queries = [
                (int(p.nic_ip[k[1]]), int(p.nic_ip[k[0]]), p.port_iface[paths[k][-1] ^ 1], k[2])
                for k in ks
            ]
            return s, ks, network.egress(s, queries)

        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(ask, by_switch.items()))
        nxt = []
        for _, ks, out in answers:
            for k, dev in zip(ks, out, strict=True):
                port = iface_port.get(dev)
                if port is None:
                    continue
                paths[k].append(port)
                if int(f.port_peer[port]) != k[1]:
                    nxt.append(k)
        live = nxt
    ptr = np.zeros(len(ft) + 1, dtype=np.int64)
    links = []
    for i in range(len(ft)):
        k = (int(ft.src[i]), int(ft.dst[i]), int(ft.sport[i]))
        ls = [q // 2 for q in paths[k]] if int(f.port_peer[paths[k][-1]]) == k[1] else []
        links.extend(ls)
        ptr[i + 1] = len(links)
    return ptr, np.array(links, dtype=np.int64)


def _default_captures(scenario) -> list[int]:
    """Where nothing is asked for: the leaf port towards the NIC that receives the most bytes."""
    f, ft = scenario.fabric, scenario.flows
    if not len(ft):
        return []
    dst = int(np.bincount(ft.dst, weights=ft.bytes, minlength=f.n_nodes).argmax())
    return [int(f.nic_port[dst]) ^ 1]


def run_scenario(
    scenario,
    writer,
    *,
    scale: int | None = None,
    ecn: str | None = None,
    pfc: bool = True,
    capture_ports=None,
    timeout_s: float = 300.0,
    switch: str = "router",
) -> dict:
    """Build, replay, record, tear down. Returns the summary also noted in run.json."""
    from fabric.emu import available

    if switch not in SWITCHES:
        raise AifabricError(f"switch {switch!r} is not one of {', '.join(SWITCHES)}")
    reason = available(switch)
    if reason:
        raise AifabricError(reason)
    fabric = scenario.fabric
    writer.topology(fabric)
    mechanism = kernel.ecn_mechanism(ecn)
    delay = kernel.delay_mechanism()
    pl = plan(scenario, ecn=mechanism, delay=delay, scale=scale)
    net = make_network(scenario, pl, switch)
    replay = monitor = injector = None
    stop = threading.Event()
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    status, message = "complete", ""
    captures: list[tuple[subprocess.Popen, str]] = []
    try:
        t0 = time.perf_counter()
        net.build()
        if mechanism == "ebpf":
            net.plan = pl = plan(
                scenario,
                ecn=mechanism,
                delay=delay,
                scale=pl.scale,
                ecn_objects=net.compile_markers(),
            )
        net.apply()
        build_s = time.perf_counter() - t0
        writer.note(
            emulation={
                "scale": pl.scale,
                "scale_meaning": "link rates divided by scale; time stretched by it; "
                "buffers and thresholds unchanged in bytes; times reported in fabric time",
                "ecn": mechanism,
                "ecn_fallbacks": "red, else eBPF marker on clsact egress, else none",
                "pfc": "per-switch backpressure: TBF pause of upstream egress + 802.1Qbb frames"
                if pfc
                else "off",
                "hash_policy": pl.hash_policy,
                "port_series": "switch ports: bytes, queue depth, ECN marks, drops, pauses; "
                "NIC ports: bytes (as their leaf received them) and pauses, queues not sampled",
                "link_delays": "netem: each link's delay times the scale, on both egresses"
                if delay == "netem"
                else "not emulated: this kernel has no netem qdisc (sch_netem)",
                "notes": pl.notes,
                "switch": net.describe(),
                "names": pl.table(),
                "build_s": round(build_s, 3),
            }
        )
        path_ptr, path_link = observed_paths(net, scenario)
        ports = list(capture_ports) if capture_ports is not None else None
        if ports is None:
            from fabric.sim.scenario_spec import resolve_port

            ports = [resolve_port(fabric, c) for c in scenario.captures] or _default_captures(
                scenario
            )
        for port in ports:
            node = int(fabric.port_node[port])
            name = f"{fabric.node_name[node]}--{fabric.node_name[int(fabric.port_peer[port])]}"
            out = writer.path / "captures" / f"{name}.pcap"
            proc = net.popen(
                node,
                ["tcpdump", "-i", pl.port_iface[port], "-s", "128", "-U", "-w", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            captures.append((proc, str(out)))
        monitor = Monitor(net, scenario.sample_interval_ns, pfc=pfc)
        monitor.open()
        replay = Replay(scenario, net, cc_params=_cc(scenario))
        replay.open()
        time.sleep(0.3 if captures else 0)  # tcpdump attaches
        injector = FaultInjector(net, scenario.faults, replay, stop, on_routing=monitor.set_routing)
        injector.start()
        monitor.start()
        try:
            result = replay.run(timeout_s=timeout_s, stop=stop)
        except (KeyboardInterrupt, Terminated):
            status, message = "partial", "interrupted; results cover what was replayed"
            result = replay.last_result
        stop.set()
        injector.join(timeout=30)
        if injector.error is not None:
            raise injector.error
        if injector.applied and result is not None:
            path_ptr, path_link = _paths_after_faults(
                net, scenario, injector.applied, result, path_ptr, path_link
            )
        if result is not None and not result.complete and status == "complete":
            status = "partial"
            message = "the replay timed out before every flow completed"
        time.sleep(0.05)
        monitor.stop_event.set()
        monitor.join(timeout=10)
        if monitor.error is not None:
            raise monitor.error
        summary = _write(writer, scenario, pl, monitor, result, path_ptr, path_link)
        summary["faults"] = injector.applied
        summary["build_s"] = round(build_s, 3)
    except (KeyboardInterrupt, Terminated):
        writer.finish("partial", "interrupted while building the emulated fabric")
        raise
    except BaseException as e:
        writer.finish("failed", f"{type(e).__name__}: {e}")
        raise
    finally:
        stop.set()
        if injector is not None and injector.is_alive():
            injector.join(timeout=30)
        if monitor is not None and monitor.is_alive():
            monitor.stop_event.set()
            monitor.join(timeout=10)
        if replay is not None:
            replay.close()
        if monitor is not None:
            monitor.close()
        net.close()
        signal.signal(signal.SIGTERM, old_term)
    summary["teardown_s"] = round(net.timings.get("teardown_s", 0.0), 3)
    writer.note(summary=summary)
    writer.finish(status, message)
    summary["status"] = status
    return summary


def _paths_after_faults(net, scenario, applied, result, ptr0, links0):
    """Each flow's links: as routed at its end for flows that ended after the first fault.

    Linux's hash-threshold multipath moves some flows that did not use the
    failed element as well, so every such flow is asked again, not only those
    that crossed it.
    """
    first = min(a["applied_ns"] for a in applied)
    ptr1, links1 = observed_paths(net, scenario)
    late = (result.end_ns < 0) | (result.end_ns >= first)
    ptr = np.zeros(len(late) + 1, dtype=np.int64)
    out = []
    for i, moved in enumerate(late):
        src_ptr, src = (ptr1, links1) if moved else (ptr0, links0)
        out.extend(src[src_ptr[i] : src_ptr[i + 1]].tolist())
        ptr[i + 1] = len(out)
    return ptr, np.array(out, dtype=np.int64)


def _cc(scenario) -> dict:
    from fabric.cc import cc_parameters

    return cc_parameters(dict(scenario.cc_params))


def _write(writer, scenario, pl, monitor, result, path_ptr, path_link) -> dict:
    ft = scenario.flows
    f = scenario.fabric
    n = len(ft)
    start = result.start_ns if result is not None else np.full(n, -1, dtype=np.int64)
    end = result.end_ns if result is not None else np.full(n, -1, dtype=np.int64)
    writer.flows(
        flow_id=ft.flow_id, job=ft.job, op=ft.op, step=ft.step, channel=ft.channel,
        src=ft.src, dst=ft.dst, sqpn=ft.sqpn, dqpn=ft.dqpn, sport=ft.sport, bytes=ft.bytes,
        start_ns=start, end_ns=end, path_ptr=path_ptr, path_link=path_link,
    )  # fmt: skip
    series = monitor.series()
    writer.ports(**series)
    ops = []
    cols = {k: [] for k in ("op", "job", "kind", "algorithm", "bytes", "ranks")}
    cols.update(start_ns=[], end_ns=[], algbw_bps=[], busbw_bps=[])
    for i in range(len(ft.op_id)):
        mine = ft.op == ft.op_id[i]
        s = start[mine]
        e = end[mine]
        t0 = int(s[s >= 0].min()) if (s >= 0).any() else -1
        t1 = int(e.max()) if mine.any() and (e >= 0).all() else -1
        dur = t1 - t0 if t0 >= 0 and t1 >= 0 else 0
        algbw = ft.op_bytes[i] * 8e9 / dur if dur > 0 else 0.0
        busbw = algbw * float(ft.op_busbw_factor[i])
        for k, v in (
            ("op", int(ft.op_id[i])), ("job", int(ft.op_job[i])), ("kind", str(ft.op_kind[i])),
            ("algorithm", str(ft.op_algorithm[i])), ("bytes", int(ft.op_bytes[i])),
            ("ranks", int(ft.op_ranks[i])), ("start_ns", t0), ("end_ns", t1),
            ("algbw_bps", algbw), ("busbw_bps", busbw),
        ):  # fmt: skip
            cols[k].append(v)
        ops.append(
            {
                "kind": str(ft.op_kind[i]),
                "algorithm": str(ft.op_algorithm[i]),
                "bytes": int(ft.op_bytes[i]),
                "ranks": int(ft.op_ranks[i]),
                "time_ns": dur if dur > 0 else None,
                "busbw_bps": busbw,
            }
        )
    writer.collectives(
        op=np.array(cols["op"], dtype=np.int32),
        job=np.array(cols["job"], dtype=np.int32),
        kind=np.array(cols["kind"], dtype=np.str_),
        algorithm=np.array(cols["algorithm"], dtype=np.str_),
        bytes=np.array(cols["bytes"], dtype=np.int64),
        ranks=np.array(cols["ranks"], dtype=np.int32),
        start_ns=np.array(cols["start_ns"], dtype=np.int64),
        end_ns=np.array(cols["end_ns"], dtype=np.int64),
        algbw_bps=np.array(cols["algbw_bps"], dtype=np.float64),
        busbw_bps=np.array(cols["busbw_bps"], dtype=np.float64),
    )
    qmax = monitor.max_backlog
    worst = int(qmax.argmax()) if len(qmax) else -1
    done = int((end >= 0).sum())
    port_name = ""
    if worst >= 0:
        p = int(monitor.ports[worst])
        port_name = f"{f.node_name[f.port_node[p]]}:{f.node_name[f.port_peer[p]]}"
    react = monitor.reactions_s
    return {
        "flows": n,
        "flows_done": done,
        "completion_ns": int(end.max()) if n and done == n else None,
        "collectives": ops,
        "bytes_received": int(result.received.sum()) if result is not None else 0,
        "packets_sent": int(result.packets_sent) if result is not None else 0,
        "packets_resent": int(result.retx_packets.sum()) if result is not None else 0,
        "naks": int(result.naks) if result is not None else 0,
        "retransmission_timeouts": int(result.timeouts) if result is not None else 0,
        "replay_wall_s": round(result.wall_s, 3) if result is not None else None,
        "max_queue_bytes": int(qmax.max()) if len(qmax) else 0,
        "max_queue_port": port_name,
        "ecn_marked": int(series["ecn_marked"].sum()),
        "ce_received": int(result.ce.sum()) if result is not None else 0,
        "cnp_sent": int(result.cnps.sum()) if result is not None else 0,
        "pfc_frames": int(monitor.pfc_frames),
        "pfc_pauses": len(react),
        "pfc_reaction_s": {
            "poll_interval": monitor.poll_s,
            "apply_mean": round(float(np.mean(react)), 6) if react else None,
            "apply_max": round(float(np.max(react)), 6) if react else None,
        },
        "paused_ns_total": int(series["paused_ns"].sum()),
        "drops": int(series["drops"].sum()),
    }
