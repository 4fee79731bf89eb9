"""The emulator as an engine (`aifabric.engines`): plan, build, replay, record, tear down.

`ENGINE` is what `aifabric.engines` registers as "mininet". Its session probes
what this kernel offers (ECN, link delay) before anything runs, so that each
scenario feature is implemented, approximated or refused up front; builds
the emulated fabric (abortable: `close` tears down whatever was built);
replays the flow table until done, timed out or asked to stop; writes the
run directory; and tears everything down.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from aifabric.emu import linux
from aifabric.emu.faults import FaultInjector
from aifabric.emu.monitor import Monitor
from aifabric.emu.net import SWITCHES, make_network
from aifabric.emu.packets import WIRE_OVERHEAD_BYTES
from aifabric.emu.plan import Estimate, choose_scale, estimate, plan
from aifabric.emu.replay import PAYLOAD_MTU, Replay, capacity_pps
from aifabric.engines import Support, approximated, implemented, refused, scenario_features
from aifabric.fabric.completion import (
    collective_records,
    collective_rows,
    completion_ns,
    iterations,
)
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.faults import applied, at_start
from aifabric.fabric.live import LiveStream
from aifabric.fabric.model import Role
from aifabric.fabric.routing import EMULATOR_POLICY, Routing
from aifabric.fabric.units import format_time

CAPTURE_SNAPLEN = 128
MAX_WALL_S = 600.0  # a scenario estimated to run longer is refused before anything is built
# What the replay sends through Open vSwitch bridges of what it sends through routers (the
# probe's figure): about half (13,400 against 26,400 packets/s on the userspace datapath).
OVS_SHARE = 0.5


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


def features(scenario, *, switch: str, ecn: str, delay: str, pfc: bool) -> dict[str, Support]:
    """What the emulator does with each feature `scenario` uses, on this kernel."""
    f = scenario.fabric
    out: dict[str, Support] = {
        "links.rate": approximated(
            "rates divided by the scale (HTB on veth links), time stretched by it; "
            "results in fabric time"
        ),
        "links.delay": implemented("netem holds each frame for the link's delay times the scale")
        if delay == "netem"
        else approximated("this kernel has no netem qdisc (sch_netem): links have no delay"),
        "queues.buffer": shared_buffer_support(f),
        "sample_interval": approximated(
            "the monitor polls the kernel's queues every few milliseconds of wall time and "
            "folds the polls into samples of the interval"
        ),
        "ecmp.same_seed": implemented("one multipath hash seed on every switch"),
        "faults.at_start": implemented("the fabric is built without them"),
        "faults.mid_run": implemented(
            "applied when the replay's clock reaches them; run.json records when routes settled"
        ),
        "faults.restore": implemented(
            "interfaces brought back up and routes (or groups) given back when the replay's "
            "clock reaches them"
        ),
        "faults.drain": approximated(
            "a drained link or switch gets new routes for every flow, flows in flight too"
        ),
        "captures": implemented(f"tcpdump on the port, {CAPTURE_SNAPLEN} bytes per packet"),
    }
    mtu = int(f.link_mtu_bytes.min()) if f.n_links else PAYLOAD_MTU
    out["links.mtu"] = (
        implemented()
        if mtu == PAYLOAD_MTU
        else approximated(f"the replay's packets carry {PAYLOAD_MTU}-byte payloads, not {mtu}")
    )
    hashing = "Open vSwitch select groups" if switch == "ovs" else "Linux multipath routes"
    out["ecmp.policy"] = {
        "5tuple": implemented(f"{hashing} hash the 5-tuple with each switch's seed"),
        "eecmp": approximated(
            f"{hashing} hash the 5-tuple; the QPN-derived UDP source port carries the QP"
        ),
        "pinned": approximated(f"{hashing} hash source and destination address"),
        "spray": approximated(f"{hashing} cannot spray packets; they hash the 5-tuple"),
        "adaptive": approximated(f"{hashing} cannot route adaptively; they hash the 5-tuple"),
        "linux": implemented("the routers' own hash, which the policy reproduces")
        if switch == "router"
        else approximated("Open vSwitch's select groups hash as policy ovs does, not as Linux"),
        "ovs": implemented("the bridges' own select-group hash, which the policy reproduces")
        if switch == "ovs"
        else approximated("Linux's multipath routes hash as policy linux does, not as OVS"),
    }[scenario.ecmp]
    out["queues.ecn"] = {
        "red": implemented("the kernel's RED qdisc marks ECT packets on the lossless queue"),
        "ebpf": approximated(
            "an eBPF marker on each egress marks as RED would, from its estimate of the queue"
        ),
        "none": refused(
            "this kernel has neither the RED qdisc (sch_red) nor a working eBPF marker (clang)"
        ),
    }[ecn]
    out["queues.pfc"] = (
        approximated(
            "a monitor polls the queues, pauses the upstream egress and sends 802.1Qbb frames: "
            "it reacts within a poll, not within a frame"
        )
        if pfc
        else refused("PFC is turned off for this run (pfc=False)")
    )
    out["loss_recovery"] = (
        implemented(
            "receivers NAK the first gap (RC ACKNOWLEDGE, PSN sequence error); senders "
            "go back to the PSN it names; a quiet flow resends after the scaled RTO"
        )
        if scenario_features(scenario)["loss_recovery"] == "go-back-n"
        else refused(
            "the emulator's replay recovers losses with go-back-N only; "
            "run selective repeat on the simulator"
        )
    )
    transport = scenario_features(scenario)
    out["acks"] = approximated(
        "receivers send no ACKs, only a NAK per gap; a sender's timeout stands in for a missing ACK"
    )
    out["finish"] = (
        implemented("a flow ends when its receiver has counted its last byte")
        if transport["finish"] == "receiver"
        else approximated(
            "a flow ends when its receiver has counted its last byte: the replay sends no ACK "
            "to time at the sender"
        )
    )
    out["header_overhead"] = approximated(
        f"frames carry real RoCEv2 headers (RETH included: {WIRE_OVERHEAD_BYTES} wire bytes "
        f"per packet); DCQCN pacing counts {transport['header_overhead']} per packet"
    )
    out["congestion_control.kind"] = {
        "none": implemented("senders send as fast as their NIC queue takes packets"),
        "dcqcn": implemented(
            "the replay's senders pace each flow and cut and recover its rate on CNPs, "
            "timers and a byte counter by the simulator's DCQCN rules"
        ),
    }.get(
        scenario.cc,
        refused(
            f"the emulator's replay has no {scenario.cc} senders or receivers "
            "(it implements none and dcqcn); run it on the simulator"
        ),
    )
    return {k: out[k] for k in scenario_features(scenario)}


class EmuSession:
    build_abortable = True  # close() tears down whatever was built

    def __init__(
        self,
        scenario,
        *,
        switch: str = "router",
        scale: int | None = None,
        ecn: str | None = None,
        pfc: bool = True,
        capture_ports=None,
        timeout_s: float | None = None,
        max_wall_s: float = MAX_WALL_S,
    ):
        if switch not in SWITCHES:
            raise AifabricError(f"switch {switch!r} is not one of {', '.join(SWITCHES)}")
        self.streams = scenario.flows  # what the run directory records (the simulator's flows)
        scenario, self.origin = _steps_as_flows(scenario)
        self.sc = scenario
        self.switch, self.pfc = switch, pfc
        replay_pps = capacity_pps() * (OVS_SHARE if switch == "ovs" else 1.0)
        if scale is None:
            scale = choose_scale(
                scenario.fabric,
                senders=np.unique(scenario.flows.src),
                replay_bps=int(replay_pps * PAYLOAD_MTU * 8),
            )
        self.scale = int(scale)
        if self.scale < 1:
            raise AifabricError(
                f"the emulation scale must be a positive whole number, not {self.scale}"
            )
        self.estimate = estimate(scenario, self.scale, replay_pps, policy=EMULATOR_POLICY[switch])
        _refuse_long(scenario, self.estimate, max_wall_s)
        self.timeout_s = self.estimate.timeout_s() if timeout_s is None else float(timeout_s)
        self.notice = (
            f"mininet engine: the replay sends about {replay_pps:,.0f} packets/s here; scale "
            f"{self.scale:,}, at least {_duration(self.estimate.wall_s)} of wall time (it may take "
            f"{_duration(self.timeout_s)})"
        )
        self.capture_ports = capture_ports
        self.ecn = linux.ecn_mechanism(ecn)
        self.delay = linux.delay_mechanism()
        self.features = features(scenario, switch=switch, ecn=self.ecn, delay=self.delay, pfc=pfc)
        self.net = self.replay = self.monitor = self.injector = self.result = None
        self.live: LiveStream | None = None
        self.halt = threading.Event()  # ends the fault injector
        n = len(scenario.flows)
        self.paths = (np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.captures: list[subprocess.Popen] = []
        self.capture_files: list = []
        self.timings: dict[str, float] = {}

    def build(self, writer, stop) -> None:
        sc, fabric = self.sc, self.sc.fabric
        t0 = time.perf_counter()
        pl = plan(sc, ecn=self.ecn, delay=self.delay, scale=self.scale)
        self.net = net = make_network(sc, pl, self.switch)
        # between the steps too: a signal's Interrupted raised inside a finalizer is lost
        net.check = stop.check
        net.build()
        if self.ecn == "ebpf":
            net.plan = pl = plan(
                sc, ecn=self.ecn, delay=self.delay, scale=pl.scale,
                ecn_objects=net.compile_markers(),
            )  # fmt: skip
        stop.check()
        net.apply()
        self.monitor = Monitor(
            net, sc.sample_interval_ns, pfc=self.pfc, flow_paths=self._flow_paths
        )
        self.monitor.open()
        self.live = LiveStream(
            writer.path, "mininet", fabric, sc.flows.job, sc.flows.bytes, ports=self.monitor.ports
        )
        self.monitor.on_poll = self._live
        stop.check()
        stop.enter("build")  # from here on, what is built can be written: stop between steps
        self.timings["build_s"] = time.perf_counter() - t0
        writer.note(
            emulation={
                "scale": pl.scale,
                "scale_meaning": "link rates divided by scale; time stretched by it; "
                "buffers and thresholds unchanged in bytes; times reported in fabric time",
                "ecn": self.ecn,
                "ecn_fallbacks": "red, else eBPF marker on clsact egress",
                "pfc": "per-switch backpressure: TBF pause of upstream egress + 802.1Qbb frames"
                if self.pfc
                else "off",
                "hash_policy": pl.hash_policy,
                "port_series": "switch ports: bytes, queue depth, ECN marks, drops, pauses; "
                "NIC ports: bytes (as their leaf received them) and pauses, queues not sampled",
                "link_delays": "netem: each link's delay times the scale, on both egresses"
                if self.delay == "netem"
                else "not emulated: this kernel has no netem qdisc (sch_netem)",
                "notes": pl.notes,
                "paths": "flows.npz's paths are asked of the switches, hop by hop ("
                + ("`ovs-appctl ofproto/trace`" if self.switch == "ovs" else "`ip route get`")
                + "), once built and again after the faults for flows that ended after one; "
                "the replay sends from unconnected sockets, so packets follow them",
                "switch": net.describe(),
                "names": pl.table(),
                "build_s": round(self.timings["build_s"], 3),
                "estimate": {
                    "wall_s": round(self.estimate.wall_s, 3),
                    "fabric_ns": self.estimate.fabric_ns,
                    "packets": self.estimate.packets,
                    "replay_pps": round(self.estimate.replay_pps),
                    "timeout_s": round(self.timeout_s, 3),
                },
            }
        )
        self.paths = observed_paths(net, sc)
        ports = self.capture_ports
        if ports is None:
            ports = sc.capture_ports() or _default_captures(sc)
        for port in ports:
            out = writer.capture_path(fabric.port_name(port))
            self.capture_files.append(out)
            self.captures.append(
                net.popen(
                    int(fabric.port_node[port]),
                    ["tcpdump", "-i", pl.port_iface[port], "-s", str(CAPTURE_SNAPLEN), "-U",
                     "-w", str(out)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        from aifabric.traffic.steps import is_marker, steps_first_latency_ns

        first = markers = None
        if self.origin is not None:
            first = steps_first_latency_ns(self.streams, self.origin)
            markers = is_marker(self.origin)
        self.replay = Replay(sc, net, cc_params=_cc(sc), first_latency_ns=first, markers=markers)
        self.replay.open()
        if self.captures:
            stop.wait(0.3)  # tcpdump attaches

    def _flow_paths(self, routing):
        """The flows' paths over what `routing` has left, as the switches' hash sends them
        (the simulator's prediction, which the crosscheck holds equal to the switches')."""
        sc, ft = self.sc, self.sc.flows
        predict = Routing(
            sc.fabric, EMULATOR_POLICY[self.switch], sc.hash_seed, same_seed=sc.same_seed,
            failed_links=routing.failed_links, failed_nodes=routing.failed_nodes,
        )  # fmt: skip
        return predict.paths(ft.src, ft.dst, ft.sport)

    def run(self, stop, progress) -> bool:
        net, sc = self.net, self.sc
        self.injector = FaultInjector(
            net, sc.faults, self.replay, self.halt, on_routing=self.monitor.set_routing
        )
        self.injector.start()
        self.monitor.start()
        try:
            self.result = self.replay.run(timeout_s=self.timeout_s, stop=stop)
        finally:
            self.halt.set()
            self.injector.join(timeout=30)
        if self.injector.error is not None:
            raise self.injector.error
        if self.injector.applied and self.result is not None:
            self.paths = _paths_after_faults(
                net, sc, self.injector.applied, self.result, *self.paths
            )
        time.sleep(0.05)
        self.monitor.stop_event.set()
        self.monitor.join(timeout=10)
        if self.monitor.error is not None:
            raise self.monitor.error
        return self.result is not None and self.result.complete

    def _live(self, monitor: Monitor) -> None:
        """In the monitor's thread, after a poll: a live record when one is due."""
        replay = self.replay
        if not self.live.due() or replay is None or replay.shared is None:
            return
        sh = replay.shared
        started = replay.started.is_set()
        wall = time.monotonic() - replay.t0 if started else 0.0
        self._live_record(monitor, int(wall * 1e9 / self.scale), sh.received, sh.end >= 0)

    def _live_record(self, monitor, now_ns: int, delivered, done, final: bool = False) -> None:
        counters = monitor.so_far()
        queue = counters.pop("queue_bytes")
        self.live.write(
            final=final, now_ns=now_ns, events=None, flows_done=int(np.count_nonzero(done)),
            delivered=delivered, done=done, totals=counters, queue_bytes=queue,
        )  # fmt: skip

    def write(self, writer) -> dict:
        result = self.result
        if result is None and self.replay is not None:
            result = self.replay.last_result
        summary = _write(
            writer, self.sc, self.monitor, result, *self.paths, streams=self.streams,
            origin=self.origin,
        )  # fmt: skip
        summary["faults"] = [applied(self.sc.fabric, x) for x in at_start(self.sc.faults)] + (
            self.injector.applied if self.injector is not None else []
        )
        summary["captures"] = self._captured(writer)
        summary["build_s"] = round(self.timings.get("build_s", 0.0), 3)
        summary["replay_processes"] = self.replay.n_procs if self.replay is not None else 0
        if result is not None and not result.complete:
            if result.lost:
                summary["incomplete"] = (
                    f"{result.lost} {result.wall_s:.0f} s into the replay, which stopped there"
                )
            elif result.stalled_s:
                summary["incomplete"] = (
                    f"the replay delivered nothing for {result.stalled_s:.0f} s and gave up"
                )
            else:
                summary["incomplete"] = (
                    f"the replay timed out after {result.wall_s:.0f} s before every flow "
                    "completed (`timeout_s` gives it longer)"
                )
        writer.note(summary={k: v for k, v in summary.items() if k != "incomplete"})
        if self.live is not None and result is not None:  # the results are in: the last record
            now_ns = int(result.wall_s * 1e9 / self.scale)
            self._live_record(self.monitor, now_ns, result.received, result.end_ns >= 0, final=True)
            if self.live.error:
                writer.note(live=f"not streamed: {self.live.error}")
        return summary

    def _captured(self, writer) -> dict[str, int]:
        """Packets in each capture, once tcpdump has written them out."""
        linux.stop_processes(self.captures)
        return {path.stem: pcap_packets(path) for path in sorted(self.capture_files)}

    def close(self) -> None:
        self.halt.set()
        if self.injector is not None and self.injector.is_alive():
            self.injector.join(timeout=30)
        if self.monitor is not None and self.monitor.is_alive():
            self.monitor.stop_event.set()
            self.monitor.join(timeout=10)
        if self.replay is not None:
            self.replay.close()
        if self.monitor is not None:
            self.monitor.close()
        if self.net is not None:
            self.net.close()
            self.timings["teardown_s"] = self.net.timings.get("teardown_s", 0.0)


class EmuEngine:
    name = "mininet"
    options = {
        "switch": "switches as Linux routers (router, the default) or Open vSwitch bridges (ovs)",
        "scale": "divide link rates by N (time stretches by N)",
        "ecn": "the ECN mechanism to prefer: red, ebpf or none",
        "pfc": "False turns PFC off",
        "capture_ports": "port ids to capture instead of the scenario's",
        "timeout_s": "wall seconds the replay may take (default: from the estimate, with room)",
        "max_wall_s": "refuse a scenario whose replay is estimated to take longer "
        f"(wall seconds, default {MAX_WALL_S:g})",
    }

    def unavailable(self, switch: str = "router", **options) -> str | None:
        from aifabric.emu import available

        return available(switch)

    def session(self, scenario, **options) -> EmuSession:
        return EmuSession(scenario, **options)


ENGINE = EmuEngine()


def pcap_packets(path) -> int:
    """Records in a classic pcap file (0 for one that is missing or has only its header)."""
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    if len(data) < 24:
        return 0
    order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    n, at = 0, 24
    while at + 16 <= len(data):
        at += 16 + int.from_bytes(data[at + 8 : at + 12], "little" if order == "<" else "big")
        n += at <= len(data)
    return n


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


def _duration(seconds: float) -> str:
    """Wall seconds for a person: 45 s, 3.2 min, 1.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


MAX_STEP_FLOWS = 5_000_000


def _steps_as_flows(scenario):
    """The scenario with its collectives' streams written out one flow per step (the replay
    starts a flow once the flows it waits for have arrived, which is then the causality the
    simulator's streams run: `aifabric.traffic.steps`), and for each of its flows the flow of
    `scenario` it is a step of (None: nothing was cut)."""
    from dataclasses import replace

    from aifabric.traffic.steps import expand_steps_with_origin, expanded_size

    ft = scenario.flows
    if not ft.n_groups:
        return scenario, None
    size = expanded_size(ft)
    if size > MAX_STEP_FLOWS:
        raise AifabricError(
            f"the mininet engine replays one flow per collective step, and this workload has "
            f"{size:,} (at most {MAX_STEP_FLOWS:,}); use fewer GPUs or a smaller size"
        )
    steps, origin = expand_steps_with_origin(ft)
    return replace(scenario, flows=steps), origin


def _refuse_long(scenario, est: Estimate, max_wall_s: float) -> None:
    """One sentence when the replay is estimated to take longer than `max_wall_s`."""
    if est.wall_s <= max_wall_s:
        return
    why = (
        f"{est.packets:,} packets at the replay's {est.replay_pps:,.0f} packets/s"
        if est.replay_wall_s >= est.fabric_wall_s
        else f"{format_time(est.fabric_ns)} of fabric time stretched {est.scale:,} times"
    )
    change = "give a smaller --scale, a smaller topology or workload, or a larger --max-wall"
    if est.overrun > 1:
        why += (
            f", and {est.overrun} senders overrun one receiver without PFC or congestion "
            "control: every drop makes go-back-N resend the rest"
        )
        change = "turn PFC on, add congestion control, run it on the simulator, " + change
    raise AifabricError(
        f"scenario {scenario.name} would take at least {_duration(est.wall_s)} of wall time on the "
        f"mininet engine ({why}), more than the limit of {_duration(max_wall_s)}: {change}"
    )


def _cc(scenario) -> dict:
    return scenario.cc_parameters()


def _write(
    writer, scenario, monitor, result, path_ptr, path_link, *, streams=None, origin=None
) -> dict:
    """The run directory's files and the summary. The replay ran `scenario`'s flows; where
    they are the steps of `streams`' flows (`origin`: the stream flow of each), the run
    records `streams`, as the simulator does: a flow starts with its first step and ends with
    its last, and takes its steps' path (they share its 5-tuple)."""
    ft = scenario.flows
    f = scenario.fabric
    n = len(ft)
    start = result.start_ns if result is not None else np.full(n, -1, dtype=np.int64)
    end = result.end_ns if result is not None else np.full(n, -1, dtype=np.int64)
    if origin is not None:
        from aifabric.traffic.steps import first_latency_ns, fold_paths, fold_steps

        ft, n = streams, len(streams)
        start, end = fold_steps(origin, n, start, end, first_latency_ns(streams))
        path_ptr, path_link = fold_paths(origin, n, path_ptr, path_link)
    writer.flows(
        flow_id=ft.flow_id, job=ft.job, op=ft.op, step=ft.step, channel=ft.channel,
        src=ft.src, dst=ft.dst, sqpn=ft.sqpn, dqpn=ft.dqpn, sport=ft.sport, bytes=ft.bytes,
        start_ns=start, end_ns=end, path_ptr=path_ptr, path_link=path_link,
    )  # fmt: skip
    series = monitor.series()
    writer.ports(**series)
    coll = collective_records(ft, start, end)
    writer.collectives(**coll)
    qmax = monitor.max_backlog
    worst = int(qmax.argmax()) if len(qmax) else -1
    done = int((end >= 0).sum())
    port_name = f.port_name(int(monitor.ports[worst])) if worst >= 0 else None
    react = monitor.reactions_s
    return {
        "flows": n,
        "flows_done": done,
        "completion_ns": completion_ns(start, end),
        "collectives": collective_rows(coll),
        "iterations": iterations(coll),
        "bytes_received": int(result.received.sum()) if result is not None else 0,
        "packets_sent": int(result.packets_sent) if result is not None else 0,
        "packets_resent": int(result.retx_packets.sum()) if result is not None else 0,
        "naks": int(result.naks) if result is not None else 0,
        "retransmission_timeouts": int(result.timeouts) if result is not None else 0,
        "replay_wall_s": round(result.wall_s, 3) if result is not None else None,
        "replay_cpu_s": round(result.cpu_s, 3) if result is not None else None,
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


def shared_buffer_support(f) -> Support:
    """The emulator gives each switch egress a byte-limited queue of `buffer` bytes: the
    static model; a shared pool per switch it cannot make from Linux qdiscs."""
    roles = sorted(set(int(r) for r in f.node_role) - {int(Role.NIC)})
    shared = [Role(r).label for r in roles if f.queue(Role(r)).model == "shared"]
    if not shared:
        return implemented("a byte-limited queue per switch egress")
    return approximated(
        f"a byte-limited queue of `buffer` bytes per switch egress, not one pool per switch "
        f"shared by its ports ({', '.join(shared)})"
    )
