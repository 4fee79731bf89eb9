"""The simulator as an engine (`aifabric.engines`): a `Scenario` into a run directory.

`ENGINE` is what `aifabric.engines` registers as "sim". Its session builds a
`Simulation` (routes, state, the faults at time 0), runs it in slices of
events (stopping between two slices when asked), then writes topology,
flows, ports, collectives, captures and the summary into the run directory.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from aifabric.engines import Support, approximated, implemented, refused, scenario_features
from aifabric.fabric.completion import (
    collective_records,
    collective_rows,
    completion_ns,
    iterations,
)
from aifabric.fabric.faults import applied
from aifabric.fabric.files import replace_atomic
from aifabric.fabric.live import TOTALS, LiveStream
from aifabric.fabric.model import Role
from aifabric.fabric.scenario import Scenario
from aifabric.fabric.units import format_size, format_time
from aifabric.sim import layout as L
from aifabric.sim.driver import Progress, Simulation
from aifabric.sim.layout import ACK_EXTRA_BYTES, CP_PORT, CP_TIME, PS_PER_NS, SM_N
from aifabric.sim.pcap import FrameBuilder, write_pcap

CAPTURE_SNAPLEN = 256


def simulation_for(scenario: Scenario) -> Simulation:
    return Simulation(
        scenario.fabric,
        scenario.flows,
        ecmp=scenario.ecmp,
        same_seed=scenario.same_seed,
        seed=scenario.hash_seed,
        cc=scenario.cc,
        cc_params=scenario.cc_params,
        faults=scenario.faults,
        sample_interval_ns=scenario.sample_interval_ns,
        capture_ports=scenario.capture_ports(),
        partitions=scenario.partitions,
    )


def features(scenario: Scenario) -> dict[str, Support]:
    """What the simulator does with each feature `scenario` uses: all of them."""
    out = {k: implemented() for k in scenario_features(scenario)}
    out["queues.buffer"] = buffer_support(scenario)
    p = scenario.cc_parameters()
    overhead = p["header_overhead"]
    out["links.rate"] = implemented(
        f"serialization at each link's rate, {overhead} bytes of overhead per packet"
    )
    out["header_overhead"] = implemented(
        f"{overhead} wire bytes per packet besides its payload; ACKs {overhead + ACK_EXTRA_BYTES}"
    )
    every = p["ack_every"]
    out["acks"] = implemented(
        "one ACK per flow, when its last byte arrives"
        if every == "flow"
        else f"the receiver ACKs every {every} in-order data packets and the last one"
    )
    out["finish"] = implemented(
        {
            "sender": "a flow ends when the ACK of its last byte reaches the sender",
            "receiver": "a flow ends when its last byte reaches the receiver",
        }[p["finish"]]
    )
    out["ecmp.policy"] = implemented("the hash of aifabric.fabric.routing at every switch")
    recovery = scenario_features(scenario)["loss_recovery"]
    out["loss_recovery"] = implemented(
        {
            "go-back-n": "the receiver NAKs the first gap, the sender resends from there; "
            "a lost tail is resent after the RTO",
            "selective": "only lost packets are resent (IRN-style selective repeat)",
        }[recovery]
    )
    if scenario.ecmp == "adaptive":
        out["ecmp.policy"] = implemented(
            "every switch forwards each data packet on the next hop with the shortest queue"
        )
        if "loss_recovery" in scenario.cc_params and recovery == "go-back-n":
            out["loss_recovery"] = refused(
                "adaptive routing reorders packets, which a go-back-N receiver takes for "
                "losses (leave loss_recovery out: adaptive places out of order)"
            )
        elif recovery == "go-back-n":
            out["loss_recovery"] = approximated(
                "selective: adaptive routing reorders packets, which the receiver places out "
                "of order, as NICs deployed with adaptive-routing switches do"
            )
    if "captures" in out:
        out["captures"] = implemented(
            f"frames rebuilt from the simulated packets, cut at {CAPTURE_SNAPLEN} bytes"
        )
    too_fine = sample_memory_problem(scenario)
    if too_fine:
        out["sample_interval"] = refused(too_fine)
    return out


def buffer_support(scenario: Scenario) -> Support:
    """Which buffer model each switch tier ran (sim/buffer.py, sim/pfc.py)."""
    f = scenario.fabric
    roles = [Role(int(r)) for r in sorted(set(f.node_role.tolist())) if r != Role.NIC]
    parts, loose = [], False
    for r in roles:
        q = f.queue(r)
        named = f" ({q.profile})" if q.profile else ""
        if q.model == "shared":
            parts.append(
                f"{r.label}{named}: shared, one {format_size(q.buffer_bytes)} pool per switch, "
                f"dynamic thresholds alpha = {q.alpha:g} x the free pool"
                + (", PFC from the ingress accounting, headroom apart" if q.pfc.enabled else "")
            )
        else:
            parts.append(f"{r.label}{named}: static, {format_size(q.buffer_bytes)} per port")
            loose |= q.pfc.enabled
    how = "; ".join(parts)
    if loose:  # the static model with PFC: lossless bytes are bounded per ingress port only
        return approximated(
            f"{how}; with PFC on, the static model bounds the lossless class per ingress port "
            "(XOFF plus headroom), not by the buffer"
        )
    return implemented(how)


MAX_SAMPLE_BYTES = 8 * 10**9  # the port series a run may keep in memory


def sample_memory_problem(scenario: Scenario) -> str | None:
    """Why the port series at the scenario's interval cannot fit in memory, or None.

    The run lasts at least as long as its busiest NIC needs to send or receive its bytes
    at line rate; every interval of that keeps a row of every series for every port."""
    f, t = scenario.fabric, scenario.flows
    if not len(t) or not f.n_ports:
        return None
    rate = f.port_rate_bps[f.nic_port[f.nic_ids]].astype(np.float64)
    load = np.zeros(f.n_nodes, dtype=np.float64)
    np.add.at(load, t.src, t.bytes)
    sent = load[f.nic_ids].copy()
    load[:] = 0
    np.add.at(load, t.dst, t.bytes)
    least_ns = float((np.maximum(sent, load[f.nic_ids]) * 8e9 / rate).max())
    rows = least_ns / scenario.sample_interval_ns
    need = rows * f.n_ports * SM_N * 8
    if need <= MAX_SAMPLE_BYTES:
        return None
    coarsest = least_ns * f.n_ports * SM_N * 8 / MAX_SAMPLE_BYTES
    return (
        f"{format_time(scenario.sample_interval_ns)} samples of {f.n_ports:,} ports over at "
        f"least {format_time(int(least_ns))} would keep at least {need / 1e9:,.0f} GB of port "
        f"series; the simulator keeps at most {MAX_SAMPLE_BYTES / 1e9:.0f} GB: use an interval "
        f"of at least {format_time(int(coarsest) + 1)}"
    )


class _Stopped(Exception):
    """Asked to stop: raised from the progress hook, between two slices of events."""


# the port series live.json adds up, as rows of the sample buffer (layout.SERIES), and the
# columns of the open sample interval that hold them until it closes (kernel.close_sample)
_LIVE_NAMES = (*TOTALS, "cnp_sent")
_LIVE_SERIES = [L.SERIES.index(name) for name in _LIVE_NAMES]
_OPEN_COLUMNS = [L.PT_S_TX_BYTES, L.PT_S_ECN, L.PT_S_PAUSED_PS, L.PT_S_PFC, L.PT_S_DROPS,
                 L.PT_S_CNP]  # fmt: skip


class LiveCounters:
    """A simulation's counters so far, as live.json records them, read from its state
    arrays between two slices of events: per port, the samples drained (added up once
    each), the rows in the sample buffer and the open interval; per flow, the bytes its
    receiver has and whether it finished.

    A partitioned run's state is its partitions' until they merge (`sim.running`): each
    port's figures come from the partition that owns it, each flow's from where its
    receiver is (the bytes) and where it ends (done), and the clock, events and flows
    done from the progress the run reports. The other partitions run on meanwhile, so
    the port totals there are the closed sample intervals only (an interval closing
    while it is read would be counted twice or not at all). Under MPI rank 0 sees only
    the partitions it holds: the record says which (`covers`)."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self._drained: dict[int, int] = {}  # sample chunks added up, by partition (-1: one)
        self._base = np.zeros((len(_LIVE_SERIES), sim.fabric.n_ports), dtype=np.int64)
        self._source = None  # the partitioned run they came from (None: the simulation)
        self._where: dict = {}  # by partition of `_source`: what it holds (`_partitioned`)

    def _add_drained(self, k: int, c, owned=None) -> None:
        """Add the sample chunks `c` drained since the last call into `_base` (only the
        entries of the ports `owned`, a mask over every port, if given)."""
        start = self._drained.get(k, 0)
        chunks = c.sample_chunks[start:]
        for chunk in chunks:
            # at the types of the sums: np.add.at on the chunks' narrow types takes 5 times as long
            ports = chunk["port_index"].astype(np.intp)
            keep = slice(None) if owned is None else owned[ports]
            for row, name in enumerate(_LIVE_NAMES):
                np.add.at(self._base[row], ports[keep], chunk[name][keep].astype(np.int64))
        self._drained[k] = start + len(chunks)

    def __call__(self, progress: Progress | None = None) -> dict:
        sim = self.sim
        run = sim.running if progress is not None else None
        if run is not self._source:  # merged (or fallen back): the chunks are new ones
            self._source = run
            self._drained.clear()
            self._base[:] = 0
            self._where = {}
        if run is not None:
            return self._partitioned(run, progress)
        self._add_drained(-1, sim)
        sums = self._base + _closed_sums(sim)
        open_ = sim.pt[:, _OPEN_COLUMNS].T.copy()
        open_[2] //= PS_PER_NS  # paused ps -> ns, as close_sample rounds each interval
        sums += open_
        fl = sim.fl
        return {
            "now_ns": sim.now_ns,
            "events": int(sim.g[L.G_EVENTS]),
            "flows_done": sim.flows_done,
            "delivered": fl[:, L.FL_DELIV_BYTES],
            "done": fl[:, L.FL_T_END_PS] >= 0,
            "totals": dict(zip(_LIVE_NAMES, sums, strict=True)),
            "queue_bytes": sim.pt[:, L.PT_Q0_BYTES] + sim.pt[:, L.PT_Q1_BYTES],
        }

    def _partitioned(self, run, progress: Progress) -> dict:
        sim = self.sim
        if not self._where:  # each partition's ports, and the flows it receives and ends
            port_part = run.part[sim.fabric.port_node]
            dst_part = run.part[sim.flows.dst]
            self._where = {
                k: (port_part == k, np.flatnonzero(port_part == k),
                    np.flatnonzero(dst_part == k), np.flatnonzero(run.ends == k))
                for k in range(run.n)
            }  # fmt: skip
        sums = self._base.copy()
        queue = np.zeros(sim.fabric.n_ports, dtype=np.int64)
        delivered = np.zeros(len(sim.flows), dtype=np.int64)
        done = np.zeros(len(sim.flows), dtype=bool)
        held = [k for k in run.local if run.parts[k] is not None]
        for k in held:
            c = run.parts[k]
            owned, ports, receives, ends = self._where[k]
            with c.sample_lock:  # not while its thread drains the buffer into a chunk
                self._add_drained(k, c, owned)
                closed = _closed_sums(c)
            sums[:, ports] = self._base[:, ports] + closed[:, ports]
            queue[ports] = c.pt[ports, L.PT_Q0_BYTES] + c.pt[ports, L.PT_Q1_BYTES]
            delivered[receives] = c.fl[receives, L.FL_DELIV_BYTES]
            done[ends] = c.fl[ends, L.FL_T_END_PS] >= 0
        out = {
            "now_ns": progress.now_ns,
            "events": progress.events,
            "flows_done": progress.flows_done,
            "delivered": delivered,
            "done": done,
            "totals": dict(zip(_LIVE_NAMES, sums, strict=True)),
            "queue_bytes": queue,
        }
        if len(held) < run.n:
            out["covers"] = f"{len(held)} of {run.n} partitions (this MPI rank's)"
        return out


def _closed_sums(sim) -> np.ndarray:
    """The live series' sums over the rows in `sim`'s sample buffer, per port (summing the
    buffer's rows in place, then picking the series: a copy of the series first takes
    several times as long on a large fabric)."""
    return sim.smp[:, : int(sim.g[L.G_SAMPLES])].sum(axis=1)[_LIVE_SERIES]


class SimSession:
    build_abortable = False  # routing compiles with numba: let it finish

    def __init__(self, scenario: Scenario):
        self.sc = scenario
        self.features = features(scenario)
        self.sim: Simulation | None = None
        self.ran = False
        self.live: LiveStream | None = None

    def build(self, writer, stop) -> None:
        self.sim = simulation_for(self.sc)
        self.counters = LiveCounters(self.sim)
        t = self.sc.flows
        self.live = LiveStream(writer.path, "sim", self.sc.fabric, t.job, t.bytes)

    def run(self, stop, progress: Callable[..., None] | None) -> bool:
        sim = self.sim
        self.ran = True
        live = self.live

        def hook(p: Progress) -> None:
            if live.due():
                live.write(**self.counters(p))
            if progress is not None:
                progress(p)
            if stop.is_set():
                raise _Stopped

        try:
            done = sim.run(progress=hook)
        except _Stopped:
            done = False
        if progress is not None:
            progress(sim.progress(), final=True)
        return done

    def write(self, writer) -> dict:
        summary = write_results(self.sim, writer, self.sc.capture_ports(), ran=self.ran)
        if self.live is not None:  # the results are in: the last record, from the same state
            self.live.write(final=True, **self.counters())
            if self.live.error:
                writer.note(live=f"not streamed: {self.live.error}")
        return summary

    def close(self) -> None:
        pass


class SimEngine:
    name = "sim"
    options: dict[str, str] = {}

    def unavailable(self) -> str | None:
        return None

    def session(self, scenario: Scenario) -> SimSession:
        return SimSession(scenario)


ENGINE = SimEngine()


def write_results(sim: Simulation, writer, ports, *, ran: bool = True) -> dict:
    """Flows, ports, collectives, captures and the summary (of a simulation that never ran:
    every flow unstarted, no samples)."""
    if ran:
        sim.close()
    flows = sim.flow_records()
    writer.flows(**flows)
    series = sim.port_series()
    writer.ports(**series)
    coll = collective_records(sim.flows, flows["start_ns"], flows["end_ns"])
    writer.collectives(**coll)
    captured = write_captures(sim, writer, ports) if len(ports) else {}
    summary = run_summary(sim, flows, series, coll)
    summary["captures"] = captured
    summary["faults"] = [applied(sim.fabric, f) for f in sim.applied_faults]
    summary["transport"] = sim.transport()
    summary["partitions"] = sim.partitioned
    writer.note(
        engine="sim",
        counters=sim.counters(),
        summary=summary,
    )
    return summary


def write_captures(sim: Simulation, writer, ports) -> dict[str, int]:
    """captures/<port name>.pcap for every captured port, each written whole or not at all;
    returns the frames each holds."""
    builder = FrameBuilder(sim.fabric, sim.flows, sim.routing.ip, sim.mtu)
    records = sim.captures()
    out = {}
    for port in sorted(set(int(p) for p in ports)):
        sel = records[records[:, CP_PORT] == port]
        frames = ((int(r[CP_TIME]) // PS_PER_NS, builder.frame(r)) for r in sel)
        name = sim.fabric.port_name(port)
        replace_atomic(
            writer.capture_path(name),
            lambda tmp, frames=frames: write_pcap(tmp, frames, CAPTURE_SNAPLEN),
        )
        out[name] = len(sel)
    return out


def run_summary(sim: Simulation, flows: dict, series: dict, coll: dict) -> dict:
    """The figures `aifabric run` prints: completion, bandwidth, queues, ECN, PFC, drops,
    and the simulator's speed (events and packet-hops per second of the run's wall time)."""
    c = sim.counters()
    wall_s = sim.wall_s
    q = series["qdepth_max_bytes"]  # entries, in (sample, port) order
    max_queue, where = 0, None
    if q.size:
        idx = int(np.argmax(q))
        max_queue = int(q[idx])
        if max_queue:
            where = sim.fabric.port_name(int(series["port"][series["port_index"][idx]]))
    return {
        "flows": len(sim.flows),
        "flows_done": c["flows_done"],
        "completion_ns": completion_ns(flows["start_ns"], flows["end_ns"]),
        "simulated_ns": c["simulated_ns"],
        "collectives": collective_rows(coll),
        "iterations": iterations(coll),
        "max_queue_bytes": max_queue,
        "max_queue_port": where,
        "ecn_marked": c["ecn_marked"],
        "cnp_sent": c["cnp_sent"],
        "pfc_frames": c["pfc_frames"],
        "paused_ns_total": int(series["paused_ns"].sum()),
        "drops": c["drops"],
        "events": c["events"],
        "packet_hops": c["packet_hops"],
        "simulator_wall_s": round(wall_s, 3),
        "events_per_s": round(c["events"] / wall_s) if wall_s > 0 else None,
        "packet_hops_per_s": round(c["packet_hops"] / wall_s) if wall_s > 0 else None,
    }
