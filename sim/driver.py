"""The Python layer of the simulator: validate, allocate, run in chunks, interpret.

`Simulation(fabric, flows, ...)` routes every flow (aifabric.fabric.routing), lays the
state out in flat arrays (`layout`), and `run()` calls the numba kernel in
slices of events, so that it can report progress, grow buffers, drain
captures and samples, apply faults at their times, and stop cleanly on
Ctrl-C with everything up to that point readable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numba
import numpy as np

from aifabric.fabric.cc import cc_parameters, check_kind
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.faults import (
    at_start,
    check_faults,
    during_run,
    fault_ports,
    restored_ports,
    routing_after,
    routing_at_start,
)
from aifabric.fabric.model import ALPHA_SCALE, Fabric, Role
from aifabric.fabric.portseries import PortSamples, concatenate, narrow, stacked
from aifabric.fabric.routing import EMULATOR_POLICY, Routing
from aifabric.fabric.scenario import Fault
from aifabric.sim import kernel
from aifabric.sim import layout as L
from aifabric.sim.ecn import rng_state
from aifabric.sim.heap import BUCKETS, CHUNK, HEAPS
from aifabric.traffic.flows import FlowTable
from aifabric.traffic.steps import first_latency_ns, stream_windows

PS = L.PS_PER_NS
CACHE_LINE = 64


def packet_rows(n: int) -> np.ndarray:
    """A pool of n free packets, rows 0..n-1 in one free list, and a last, scratch row."""
    pk = zeros_aligned((n + 1, L.PK_N), np.int32)
    pk[:, L.PK_NEXT] = np.arange(1, n + 2)
    pk[n - 1 :, L.PK_NEXT] = -1
    pk[:, L.PK_KIND] = -1
    return pk


def zeros_aligned(shape, dtype) -> np.ndarray:
    """`np.zeros` whose first byte starts a cache line, so that a row laid out to fit
    one line (the hot columns of `layout`) is read with one memory access."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = np.zeros(n * dtype.itemsize + CACHE_LINE, dtype=np.uint8)
    skip = -raw.ctypes.data % CACHE_LINE
    return raw[skip : skip + n * dtype.itemsize].view(dtype).reshape(shape)


class Stalled(AifabricError):
    """The run cannot finish: flows are underway but nothing more will deliver their data."""


@dataclass
class Progress:
    now_ns: int
    flows_done: int
    flows: int
    events: int
    wall_s: float


def adaptive_loss_recovery(cc_params: dict | None) -> str:
    """Loss recovery under `adaptive` routing: selective. Adaptive routing sends a flow's
    packets over paths of different delay, so they arrive out of order; NICs deployed with
    adaptive-routing switches place such packets in memory where they belong, and a
    go-back-N receiver would take every reordering for a loss."""
    if (cc_params or {}).get("loss_recovery", "selective") != "selective":
        raise AifabricError(
            "adaptive routing reorders packets, which a go-back-N receiver takes for losses: "
            'leave loss_recovery out (adaptive places out of order, "selective") or choose '
            "another ECMP policy"
        )
    return "selective"


class Simulation:
    """One simulated run of a flow table on a fabric."""

    def __init__(
        self,
        fabric: Fabric,
        flows: FlowTable,
        *,
        ecmp: str = "5tuple",
        same_seed: bool = False,
        seed: int = 0,
        cc: str = "none",
        cc_params: dict | None = None,
        faults: Iterable[Fault] = (),
        sample_interval_ns: int = 10_000,
        capture_ports: Iterable[int] = (),
        partitions: int | str = 1,
    ):
        check_kind(cc)
        if sample_interval_ns <= 0:
            raise AifabricError(f"the sample interval must be positive, got {sample_interval_ns}")
        self.fabric = fabric
        self.flows = flows
        self.cc = cc
        self.params = cc_parameters(cc_params, rate_bps=fabric.nic_rate_bps)
        if ecmp == "adaptive":
            self.params["loss_recovery"] = adaptive_loss_recovery(cc_params)
        self.seed = int(seed)
        if partitions != "auto" and (not isinstance(partitions, int) or partitions < 1):
            raise AifabricError(f'partitions must be "auto" or at least 1, got {partitions!r}')
        self.partitions = partitions  # asked for (aifabric.sim.partition)
        self.partitioned: dict = {"partitions": 1}  # what ran (`run`)
        self.closed = False
        self.sample_interval_ns = int(sample_interval_ns)
        self._validate_flows()
        self.capture_ports = np.array(sorted(set(int(p) for p in capture_ports)), dtype=np.int64)
        if len(self.capture_ports) and (
            self.capture_ports.min() < 0 or self.capture_ports.max() >= fabric.n_ports
        ):
            raise AifabricError(f"fabric {fabric.name} has no port {self.capture_ports.max()}")
        faults = list(faults)
        check_faults(fabric, faults)
        now_faults = at_start(faults)
        self.pending_faults = during_run(faults)
        self.applied_faults: list[Fault] = list(now_faults)
        self.routing = routing_at_start(fabric, faults, ecmp, seed, same_seed=same_seed)
        self._allocate()
        for fault in now_faults:
            if fault.action == "down":
                for p in fault_ports(fabric, fault):
                    self.pt[p, L.PT_ALIVE] = 0
        self.capture_chunks: list[np.ndarray] = []
        self.sample_chunks: list[dict[str, np.ndarray]] = []  # entries, block by block
        self.sample_rows = 0  # the samples drained into them
        self.sample_lock = threading.Lock()  # held while they grow (a live view reads them)
        self.running = None  # the partitioned run holding the state while it runs
        self.wall_s = 0.0

    def __getstate__(self) -> dict:
        """As copied for a partition (aifabric.sim.partition) or pickled for another MPI
        rank (aifabric.sim.mpi): without its lock or a run; `__setstate__` gives it a lock."""
        state = dict(self.__dict__)
        state["sample_lock"], state["running"] = None, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.sample_lock = threading.Lock()

    # set-up -----------------------------------------------------------------------------
    def _validate_flows(self) -> None:
        f, t = self.fabric, self.flows
        n = len(t)
        if n == 0:
            return
        for col in ("src", "dst"):
            x = getattr(t, col)
            if x.min() < 0 or x.max() >= f.n_nodes or (f.node_role[x] != Role.NIC).any():
                raise AifabricError(f"every flow's {col} must be a NIC of fabric {f.name}")
        if (t.src == t.dst).any():
            raise AifabricError("a flow goes from a NIC to itself")
        if (t.bytes < 0).any() or (t.start_ns < 0).any():
            raise AifabricError("flow sizes and start times must not be negative")
        if len(t.dep) and (t.dep.min() < 0 or t.dep.max() >= n):
            raise AifabricError("a flow depends on a flow that does not exist")
        _check_streams(t)

    def _route(self, routing: Routing, which: np.ndarray):
        t = self.flows
        paths = routing.paths(
            t.src[which], t.dst[which], t.sport[which], t.dqpn[which], 0, t.bytes[which]
        )
        if hasattr(self, "fl"):  # a new route mid-run: the flow may overtake itself
            self.fl[which, L.FL_MAY_REORDER] = 1
        longest = routing.hop_diameter()
        if longest > L.MAX_HOPS:
            raise AifabricError(
                f"a route on fabric {self.fabric.name} crosses {longest} links; "
                f"the simulator carries routes of at most {L.MAX_HOPS}"
            )
        return paths

    def _allocate(self) -> None:
        f, t = self.fabric, self.flows
        n = len(t)
        paths = self._route(self.routing, np.arange(n))
        self.path_ptr = paths.ptr.astype(np.int64)
        self.path_port = paths.ports.astype(np.int64)
        # which routing chose each flow's route: 0 at the start, k after the k-th fault
        self.route_epoch = np.zeros(n, dtype=np.int16)

        mtu = int(f.link_mtu_bytes.min()) if f.n_links else 4096
        prm = np.zeros(L.P_NPRM, dtype=np.int64)
        p = self.params
        prm[L.P_CC] = L.CC_KINDS[self.cc]
        prm[L.P_SPRAY] = int(self.routing.policy == "spray")
        prm[L.P_MTU_BYTES] = mtu
        prm[L.P_SAMPLE_PS] = self.sample_interval_ns * PS
        prm[L.P_RTO_PS] = max(p["rto"], 1) * PS
        prm[L.P_CNP_INTERVAL_PS] = p["cnp_interval"] * PS
        prm[L.P_ALPHA_TIMER_PS] = max(p["alpha_timer"], 1) * PS
        prm[L.P_RATE_TIMER_PS] = max(p["rate_timer"], 1) * PS
        prm[L.P_BYTE_COUNTER_BYTES] = p["byte_counter"]
        prm[L.P_FAST_STEPS] = p["fast_recovery_steps"]
        prm[L.P_AI_BPS] = p["additive_increase"]
        prm[L.P_HAI_BPS] = p["hyper_increase"]
        prm[L.P_MIN_RATE_BPS] = p["min_rate"]
        prm[L.P_CTS_CHUNK_BYTES] = p["cts_chunk"]
        prm[L.P_CTS_WINDOW] = p["cts_window"]
        prm[L.P_GO_BACK_N] = int(p["loss_recovery"] == "go-back-n")
        prm[L.P_CLAMP_TARGET] = int(p["clamp_target"])
        prm[L.P_ADAPTIVE] = int(self.routing.policy == "adaptive")
        prm[L.P_ACK_EVERY] = 0 if p["ack_every"] == "flow" else p["ack_every"]
        prm[L.P_FINISH_AT_SENDER] = int(p["finish"] == "sender")
        prm[L.P_OVERHEAD_BYTES] = p["header_overhead"]
        prm[L.P_QUOTA] = n  # done when every flow is (a partition's quota: sim/partition.py)
        fprm = np.zeros(L.FP_NFPRM, dtype=np.float64)
        fprm[L.FP_G] = p["g"]
        self.mtu = mtu

        pt = zeros_aligned((f.n_ports, L.PT_N), np.int64)
        pmax = np.zeros(f.n_ports, dtype=np.float64)
        minus_one = (L.PT_HEAD0, L.PT_TAIL0, L.PT_HEAD1, L.PT_TAIL1, L.PT_TXEV_PS, L.PT_PFC_PENDING)
        for col in (*minus_one, L.PT_WAKE_PS):
            pt[:, col] = -1
        pt[:, L.PT_ALIVE] = 1
        pt[:, L.PT_RATE_BPS] = f.port_rate_bps
        pt[:, L.PT_DELAY_PS] = f.port_delay_ns * PS
        pt[:, L.PT_NODE] = f.port_node
        pt[:, L.PT_PEER] = f.port_peer
        pt[:, L.PT_RNG] = rng_state(self.seed, f.n_ports)  # a stream per port
        role = f.node_role[f.port_node]
        pt[:, L.PT_IS_NIC] = role == Role.NIC
        for r in Role:
            sel = role == r
            q = f.queue(r)
            pt[sel, L.PT_BUF_BYTES] = q.buffer_bytes
            is_switch = r != Role.NIC
            pt[sel, L.PT_ECN_ON] = int(q.ecn.enabled and is_switch)
            pt[sel, L.PT_KMIN_BYTES] = q.ecn.kmin_bytes
            pt[sel, L.PT_KMAX_BYTES] = q.ecn.kmax_bytes
            pmax[sel] = q.ecn.pmax
            pt[sel, L.PT_PFC_ON] = int(q.pfc.enabled and is_switch)
            pt[sel, L.PT_XOFF_BYTES] = q.pfc.xoff_bytes
            pt[sel, L.PT_XON_BYTES] = q.pfc.xon_bytes
            pt[sel, L.PT_HEADROOM_BYTES] = q.pfc.headroom_bytes
            pt[sel, L.PT_QUANTA] = q.pfc.pause_quanta
            pt[sel, L.PT_SHARED] = int(is_switch and q.model == "shared")
            pt[sel, L.PT_RESERVED_BYTES] = q.reserved_bytes
            pt[sel, L.PT_XON_OFFSET_BYTES] = q.pfc.xon_offset_bytes
        pt[self.capture_ports, L.PT_CAPTURE] = 1

        fl = zeros_aligned((n, L.FL_N), np.int64)
        fl[:, L.FL_SRC] = t.src
        fl[:, L.FL_DST] = t.dst
        fl[:, L.FL_BYTES] = t.bytes
        fl[:, L.FL_DEPS] = np.diff(t.dep_ptr)
        fl[:, L.FL_EARLIEST_PS] = t.start_ns * PS
        fl[:, L.FL_T_START_PS] = -1
        fl[:, L.FL_T_END_PS] = -1
        fl[:, L.FL_T_RECEIVED_PS] = -1
        fl[:, L.FL_REWIND_PS] = -1
        fl[:, L.FL_LAST_CNP_PS] = -1
        fl[:, L.FL_SLOT] = -1
        fl[:, L.FL_SPORT] = t.sport
        fl[:, L.FL_DQPN] = t.dqpn
        fl[:, L.FL_SQPN] = t.sqpn
        fl[:, L.FL_PRIO] = t.priority
        fl[:, L.FL_CHUNK_BYTES], fl[:, L.FL_WINDOW] = self._cts_grants()
        self._streams(fl)
        fr = np.zeros((n, L.FR_N), dtype=np.float64)
        fr[:, L.FR_LINE_BPS] = f.port_rate_bps[f.nic_port[t.src]] if n else 0
        if n:  # a protocol's rate cap (op_rate_factor) on the op's flows from a NIC together
            cap = np.clip(self.flows.op_column("op_rate_factor", 1.0), 1e-6, 1.0)
            capped = cap < 1.0
            fr[:, L.FR_LINE_BPS] *= cap
            if capped.any():  # one pacer per (op, NIC): its first flow's row holds it
                key = t.op.astype(np.int64) * f.n_nodes + t.src
                _, first, inv = np.unique(key, return_index=True, return_inverse=True)
                fl[capped, L.FL_PACER] = first[inv][capped] + 1
                fr[:, L.FR_PACE_BPS] = fr[:, L.FR_LINE_BPS]
        fr[:, L.FR_RC_BPS] = fr[:, L.FR_LINE_BPS]
        fr[:, L.FR_RT_BPS] = fr[:, L.FR_LINE_BPS]
        fr[:, L.FR_ALPHA] = 1.0

        nd = np.zeros((f.n_nodes, L.ND_N), dtype=np.int64)
        counts = np.bincount(t.src, minlength=f.n_nodes) if n else np.zeros(f.n_nodes, int)
        nd[1:, L.ND_OFF] = np.cumsum(counts)[:-1]
        act = np.zeros(max(n, 1), dtype=np.int64)
        self._pools(nd)

        # the flows waiting on each flow
        dep_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(t.dep_ptr))
        order = np.argsort(t.dep, kind="stable")
        rdep = dep_of[order]
        rdep_ptr = np.zeros(n + 1, dtype=np.int64)
        if n:
            np.cumsum(np.bincount(t.dep, minlength=n), out=rdep_ptr[1:])

        n_pk = 4096
        pk = packet_rows(n_pk)
        pc = np.zeros((n_pk + 1, L.PC_N), dtype=np.int64)
        # a chunk of the wheel's pool for every bucket (BUCKETS * CHUNK rows): fewer, and
        # events that find no chunk go through the far heap
        ev = zeros_aligned((HEAPS, max(BUCKETS * CHUNK, 4 * n + 64), L.E_N), np.int64)
        g = np.zeros(L.G_NG, dtype=np.int64)
        g[L.G_FREE] = 0
        g[L.G_NFREE] = n_pk
        g[L.G_KEY_STOP] = kernel.NEVER  # the loop stops by time alone
        rows = int(max(4, min(256, 16_000_000 // (L.SM_N * 8 * max(f.n_ports, 1)))))
        smp = np.zeros((L.SM_N, rows, f.n_ports), dtype=np.int64)
        cap = np.zeros((65536 if len(self.capture_ports) else 32, L.CP_N), dtype=np.int64)

        self.g, self.prm, self.fprm, self.pt, self.pmax = g, prm, fprm, pt, pmax
        self.fl, self.fr, self.nd, self.act, self.pk, self.pc = fl, fr, nd, act, pk, pc
        self.ev, self.dep_ptr, self.dep, self.smp, self.cap = ev, rdep_ptr, rdep, smp, cap
        prm[L.P_EVENT_RESERVE], prm[L.P_PACKET_RESERVE] = self._reserves()
        # a completing flow tells each flow waiting on it; a release each input with a
        # window and, on a stream with steps of no bytes, its receiver
        fanout = int(np.diff(rdep_ptr).max()) if n else 0
        sends = max(fanout, int(self.gr[:, L.GR_IN_N].max()) + 1 if len(self.gr) else 0)
        prm[L.P_OUT_RESERVE] = L.OUT_RESERVE + sends
        self.out = np.zeros((sends + L.OUT_RESERVE, L.O_N), dtype=np.int64)  # a partition's: larger
        if len(self.gr):  # a step's arrival releases its outputs, a release its inputs
            prm[L.P_EVENT_RESERVE] += int((self.gr[:, L.GR_OUT_N] + self.gr[:, L.GR_IN_N]).max())
            prm[L.P_EVENT_RESERVE] += 1
        prm[L.P_STALL_PS] = self._stall_ns() * PS
        self._load = np.zeros(f.n_ports, dtype=np.float64)
        self._rnd = np.zeros(L.MAX_HOPS, dtype=np.uint32)

        from aifabric.sim.heap import schedule

        # an op starts its base latency after the later of its start time (the compute it
        # waits for) and the end of the op before it: a transfer's earliest start holds it
        fl[:, L.FL_EARLIEST_PS] += fl[:, L.FL_BASE_PS]
        for i in np.flatnonzero(fl[:, L.FL_DEPS] == 0):
            schedule(ev, g, int(fl[i, L.FL_EARLIEST_PS]), L.EV_FLOW_START, int(i), 0)
        schedule(ev, g, int(prm[L.P_SAMPLE_PS]), L.EV_SAMPLE, 0, 0)

    def _streams(self, fl: np.ndarray) -> None:
        """The flows' op, latencies and stream columns, and the stream table (gr, gio)."""
        t = self.flows
        n = len(t)
        lat = self.flows.op_column("op_step_latency_ns", 0).astype(np.int64) * PS
        base = self.flows.op_column("op_base_latency_ns", 0).astype(np.int64) * PS
        fl[:, L.FL_OP] = t.op
        fl[:, L.FL_GROUP] = t.group
        fl[:, L.FL_WATCH_BYTES] = 2**62  # kernel.NEVER: no step to watch
        fl[t.group >= 0, L.FL_WATCH_BYTES] = 0  # a QP's first bytes: see what steps are there
        fl[:, L.FL_READY_PS] = 0
        plain = t.group < 0
        fl[:, L.FL_LAT_PS] = np.where(plain, lat, 0)
        # a stream's QP starts when its first step is released (its recorded start: the op's)
        fl[:, L.FL_BASE_PS] = np.where(plain, base, first_latency_ns(t) * PS)
        ng = t.n_groups
        gr = np.zeros((ng, L.GR_N), dtype=np.int64)
        if ng:
            member = np.flatnonzero(~plain)
            s = t.group[member]
            first = np.full(ng, n, dtype=np.int64)
            np.minimum.at(first, s, member)
            nqp = np.bincount(s, minlength=ng)
            fl[member, L.FL_QP] = member - first[s]
            f0 = np.minimum(first, max(n - 1, 0))
            gr[:, L.GR_STEPS] = np.maximum(t.group_steps, 1)
            gr[:, L.GR_BYTES] = t.group_bytes
            gr[:, L.GR_FLOW0] = first
            gr[:, L.GR_NQP] = nqp
            gr[:, L.GR_LAT_PS] = lat[f0]
            gr[:, L.GR_OFFSET] = t.group_offset
            gr[:, L.GR_LOOP] = t.group_loop
            gr[:, L.GR_WINDOW] = stream_windows(t)
            mode = self.flows.op_column("op_qp_mode", "split")
            gr[:, L.GR_RR] = mode[f0] == "round-robin"
            gr[:, L.GR_CHUNK] = np.maximum(self.flows.op_column("op_chunk_bytes", 1)[f0], 1)
            ins = np.diff(t.group_in_ptr)
            gr[:, L.GR_IN_OFF] = t.group_in_ptr[:-1]
            gr[:, L.GR_IN_N] = ins
            # outputs: the transpose of the inputs
            of = np.repeat(np.arange(ng, dtype=np.int64), ins)
            order = np.argsort(t.group_in, kind="stable")
            outs = np.bincount(t.group_in, minlength=ng)
            gr[:, L.GR_OUT_OFF] = len(t.group_in) + np.concatenate([[0], np.cumsum(outs)[:-1]])
            gr[:, L.GR_OUT_N] = outs
            gio = np.concatenate([t.group_in, of[order]]).astype(np.int64)
            # an input's place -> that pair's place among the input's outputs (its credit's)
            gx = np.zeros(len(gio), dtype=np.int64)
            gx[order] = len(t.group_in) + np.arange(len(t.group_in))
            gr[:, L.GR_EMPTY] = gr[:, L.GR_BYTES] < gr[:, L.GR_STEPS]
            gr[:, L.GR_PROP_PS] = self._propagation(member, s, ng)
            self._check_streams(gr)
        else:
            gio = np.zeros(1, dtype=np.int64)
            gx = np.zeros(1, dtype=np.int64)
        self.gr, self.gio, self.gx = gr, gio, gx

    def _propagation(self, member: np.ndarray, s: np.ndarray, ng: int) -> np.ndarray:
        """Each stream's propagation from sender to receiver: the shortest of its QPs'
        paths (a flow with no path counts 0), how long a message between its ends takes."""
        delay = (self.fabric.port_delay_ns * PS).astype(np.int64)  # as PT_DELAY_PS
        c = np.concatenate([[0], np.cumsum(delay[self.path_port])])
        per_flow = c[self.path_ptr[1:]] - c[self.path_ptr[:-1]]
        prop = np.full(ng, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(prop, s, per_flow[member])
        return np.where(prop == np.iinfo(np.int64).max, 0, prop)

    @staticmethod
    def _check_streams(gr: np.ndarray) -> None:
        """What the event keys and credits have room for (aifabric.sim.heap.tie_key)."""
        if len(gr) >= 1 << 28 or int(gr[:, L.GR_STEPS].max()) >= 1 << 24:
            raise AifabricError(
                f"the workload's collectives have {len(gr):,} streams of up to "
                f"{int(gr[:, L.GR_STEPS].max()):,} steps; the simulator takes fewer than "
                f"{1 << 28:,} streams of fewer than {1 << 24:,} steps each"
            )
        if int(gr[:, L.GR_OUT_N].max()) > L.CREDIT_SLOTS:
            raise AifabricError(
                f"a collective's stream feeds {int(gr[:, L.GR_OUT_N].max())} others; the "
                f"simulator takes at most {L.CREDIT_SLOTS}"
            )

    def _pools(self, nd: np.ndarray) -> None:
        """Each shared-buffer switch's pool (sim/buffer.py): its buffer less the
        reserved minimums of its ports (two priorities each), and its alpha."""
        f = self.fabric
        ports = np.bincount(f.port_node, minlength=f.n_nodes)
        for r in Role:
            q = f.queue(r)
            if r == Role.NIC or q.model != "shared":
                continue
            sel = f.node_role == r
            nd[sel, L.ND_SB_SIZE] = q.buffer_bytes - 2 * q.reserved_bytes * ports[sel]
            nd[sel, L.ND_SB_ALPHA] = round(q.alpha * ALPHA_SCALE)
        if (nd[:, L.ND_SB_SIZE] < 0).any():  # Fabric checks this; a hand-built one may not
            v = int(np.argmin(nd[:, L.ND_SB_SIZE]))
            raise AifabricError(
                f"switch {f.node_name[v]}'s buffer cannot hold the reserved minimums of its "
                f"{ports[v]} ports"
            )

    def _reserves(self) -> tuple[int, int]:
        """Free event rows and packets the loop keeps before each event: more than one
        event can schedule and allocate. A clear-to-send receiver may send a window of
        grants at once (each one packet, at most two events); a completing flow starts
        every flow waiting on it; the rest is a handful."""
        window = int(self.fl[:, L.FL_WINDOW].max()) if self.cc == "cts" and len(self.fl) else 0
        fanout = int(np.diff(self.dep_ptr).max()) if len(self.dep_ptr) > 1 else 0
        return 64 + 2 * window + fanout, 16 + window

    def _stall_ns(self) -> int:
        """How long no data may arrive while flows are underway before the run is
        stalled: 100 times the longest time any port's buffer takes to drain, and at
        least 10 retransmission timeouts and 10 sample intervals."""
        f = self.fabric
        drain = 0
        if f.n_ports:
            pt = self.pt
            buffer_bytes = np.maximum(
                pt[:, L.PT_BUF_BYTES], pt[:, L.PT_XOFF_BYTES] + pt[:, L.PT_HEADROOM_BYTES]
            )
            drain = int((buffer_bytes * 8 * 10**9 // f.port_rate_bps).max())
        return max(100 * drain, 10 * self.params["rto"], 10 * self.sample_interval_ns)

    def _cts_grants(self) -> tuple[np.ndarray, np.ndarray]:
        """Clear-to-send chunk and window per flow: its operation's (the workload's
        `chunk` and `window`) where it sets a window, else the scenario's."""
        t = self.flows
        chunk = np.full(len(t), self.params["cts_chunk"], dtype=np.int64)
        window = np.full(len(t), self.params["cts_window"], dtype=np.int64)
        op_window = getattr(t, "op_window", None)
        op_chunk = getattr(t, "op_chunk_bytes", None)
        if op_window is None or op_chunk is None or len(t.op_id) == 0:
            return chunk, window
        order = np.argsort(t.op_id)
        row = order[np.clip(np.searchsorted(t.op_id, t.op, sorter=order), 0, len(order) - 1)]
        known = t.op_id[row] == t.op
        w = np.where(known, op_window[row], 0)
        c = np.where(known, op_chunk[row], 0)
        own = (w > 0) & (c > 0)
        chunk[own] = c[own]
        window[own] = w[own]
        return chunk, window

    def _state(self) -> L.State:
        r = self.routing
        return L.State(
            g=self.g, prm=self.prm, fprm=self.fprm, pt=self.pt, pmax=self.pmax, fl=self.fl,
            fr=self.fr, nd=self.nd, act=self.act, pk=self.pk, pc=self.pc, ev=self.ev,
            path_ptr=self.path_ptr, path_port=self.path_port, dep_ptr=self.dep_ptr,
            dep=self.dep, smp=self.smp, cap=self.cap, net=r.net(), live=r.live(), nic_ip=r.ip,
            load=self._load, rnd=self._rnd, gr=self.gr, gio=self.gio, gx=self.gx,
            out=self.out,
        )  # fmt: skip

    # buffers ----------------------------------------------------------------------------
    def _grow_packets(self) -> None:
        """Double the packet pool until the loop's reserve is free. The last row is
        scratch (see kernel.alloc), never in the free list."""
        old = len(self.pk) - 1
        new = old
        while self.g[L.G_NFREE] + new - old < self.prm[L.P_PACKET_RESERVE]:
            new *= 2
        new = max(new, 2 * old)
        pk = packet_rows(new)
        pk[:old] = self.pk[:old]
        pk[new - 1, L.PK_NEXT] = self.g[L.G_FREE]
        pc = np.zeros((new + 1, L.PC_N), dtype=np.int64)
        pc[:old] = self.pc[:old]
        self.g[L.G_FREE] = old
        self.g[L.G_NFREE] += new - old
        self.pk, self.pc = pk, pc

    def _grow_events(self) -> None:
        """Double the event list until the loop's reserve (or a purge's) fits."""
        old = self.ev.shape[1]
        rows = 2 * old
        need = int(self.g[L.G_HEAP] + self.prm[L.P_EVENT_RESERVE])
        if self.g[L.G_PURGING]:
            need += kernel.PURGE_ROOM * (len(self.pk) - int(self.g[L.G_NFREE]))
        while rows < need:
            rows *= 2
        ev = zeros_aligned((HEAPS, rows, L.E_N), np.int64)
        ev[:, :old] = self.ev
        self.ev = ev

    def make_room(self, code: int) -> bool:
        """Do what the loop's `code` asks of the Python layer when it needs room: grow the
        event list or the packet pool, drain the captures or the samples (True). False for
        any other code; R_OVERFLOW (a bug in the kernel's reserves) raises."""
        if code == L.R_GROW_EVENTS:
            self._grow_events()
        elif code == L.R_GROW_PACKETS:
            self._grow_packets()
        elif code == L.R_DRAIN_CAPTURE:
            self._drain_captures()
        elif code == L.R_DRAIN_SAMPLES:
            self._drain_samples()
        elif code == L.R_OVERFLOW:
            raise RuntimeError(
                "the simulator's event list or packet pool ran out of room; "
                "the run cannot go on (a bug in the kernel's reserves)"
            )
        else:
            return False
        return True

    def _drain_captures(self) -> None:
        n = int(self.g[L.G_CAPS])
        if n:
            self.capture_chunks.append(self.cap[:n].copy())
        self.g[L.G_CAPS] = 0

    def _drain_samples(self) -> None:
        """The sample buffer's rows as entries (aifabric.fabric.portseries): only the
        cells where a port carried something are kept, each array in the narrowest
        integer type that holds it (a long run keeps millions)."""
        n = int(self.g[L.G_SAMPLES])
        if not n:
            return
        chunk = stacked(self.smp[:, :n], L.SERIES, self.sample_rows)
        chunk = {k: narrow(v) for k, v in chunk.items()}
        with self.sample_lock:  # the rows move from the buffer to the chunks at once
            self.sample_chunks.append(chunk)
            self.g[L.G_SAMPLES] = 0
        self.sample_rows += n

    # faults ------------------------------------------------------------------------------
    def _apply(
        self, fault: Fault, which: np.ndarray | None = None, routing: Routing | None = None
    ) -> None:
        """Take a link or switch down (or drain it, or bring it back) at its time, which the
        run's clock moves to (what a down purges is lost then), and re-route what it
        concerns (`moved_by`), or `which` flows if given, with the routing after it
        (`routing`, if already made). A partitioned run finds `which` with its partitions
        (each knows the flows it sends: `aifabric.sim.partition`)."""
        earlier = list(self.applied_faults)
        self.routing = routing_after(fault, self.routing) if routing is None else routing
        self.applied_faults.append(fault)
        now = fault.at_ns * PS
        self.g[L.G_NOW_PS] = now
        if fault.action == "down":
            ports = fault_ports(self.fabric, fault)
            for p in ports:
                self.pt[p, L.PT_ALIVE] = 0
            S = self._state()
            for p in ports:
                kernel.purge_port(S, p, now)
        elif fault.action == "up":
            # the purge as it went down emptied its queues and cleared its PFC state
            for p in restored_ports(self.fabric, fault, earlier):
                self.pt[p, L.PT_ALIVE] = 1
        if which is None:
            which = self.moved_by(fault, self.routing)
        if len(which) == 0:
            return
        new = self._route(self.routing, which)
        self.route_epoch[which] = len(self.applied_faults) - len(at_start(self.applied_faults))
        n = len(self.flows)
        lengths = np.diff(self.path_ptr)
        lengths[which] = np.diff(new.ptr)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        # every port of the new lists: its flow, its place in the flow's route, and
        # where it comes from (the old route, or the new one of a re-routed flow)
        flow = np.repeat(np.arange(n), lengths)
        offset = np.arange(int(ptr[-1])) - ptr[flow]
        row = np.full(n, -1, dtype=np.int64)
        row[which] = np.arange(len(which))
        new_route = row[flow] >= 0
        ports_out = np.empty(int(ptr[-1]), dtype=np.int64)
        kept = ~new_route
        ports_out[kept] = self.path_port[self.path_ptr[flow[kept]] + offset[kept]]
        ports_out[new_route] = new.ports[new.ptr[row[flow[new_route]]] + offset[new_route]]
        self.path_ptr, self.path_port = ptr, ports_out

    def moved_by(
        self, fault: Fault, routing: Routing, senders: np.ndarray | None = None
    ) -> np.ndarray:
        """The flows `fault` re-routes (of those `senders` marks, if given), `routing` being
        the routing after it: under `down`, those underway over it and those not started;
        under `drain`, those not started; under `up`, those whose route it gives back."""
        state = self.fl[:, L.FL_STATE]
        mine = np.ones(len(state), dtype=bool) if senders is None else senders
        if routing.policy in EMULATOR_POLICY.values():
            return self._moved(np.flatnonzero(mine & (state != L.ST_DONE)), routing)
        if fault.action == "down":
            ports = fault_ports(self.fabric, fault)
            uses = np.zeros(len(self.flows), dtype=bool)
            flow_of = np.repeat(np.arange(len(self.flows)), np.diff(self.path_ptr))
            uses[flow_of[np.isin(self.path_port, ports)]] = True
            return np.flatnonzero(mine & ((uses & (state != L.ST_DONE)) | (state == L.ST_WAIT)))
        if fault.action == "up":
            # resilient hashing gives a flow its first next hop back where it is there
            # again: the flows moved off (or never routed) take their routes back; a flow
            # that lost every path is not revived (`lose_path`)
            alive = mine & (state != L.ST_DONE) & (state != L.ST_NOPATH)
            return self._moved(np.flatnonzero(alive), routing)
        return np.flatnonzero(mine & (state == L.ST_WAIT))

    def _moved(self, which: np.ndarray, routing: Routing) -> np.ndarray:
        """The flows of `which` whose route `routing` changes. Under `linux` a failure
        moves flows that never used it (hash-threshold is not resilient), as it does in
        the emulator's routers."""
        t = self.flows
        fresh = routing.paths(t.src[which], t.dst[which], t.sport[which], t.dqpn[which])
        moved = [
            i
            for k, i in enumerate(which)
            if not np.array_equal(
                fresh.of(k), self.path_port[self.path_ptr[i] : self.path_ptr[i + 1]]
            )
        ]
        return np.array(moved, dtype=np.int64)

    # running -----------------------------------------------------------------------------
    @property
    def now_ns(self) -> int:
        return int(self.g[L.G_NOW_PS]) // PS

    @property
    def flows_done(self) -> int:
        return int(self.g[L.G_DONE])

    def run(
        self,
        *,
        until_ns: int | None = None,
        progress: Callable[[Progress], None] | None = None,
        slice_events: int = 400_000,
    ) -> bool:
        """Run until every flow is done (True) or until `until_ns` (False)."""
        stop_ps = (2**62) if until_ns is None else int(until_ns) * PS
        args = (self._state(), stop_ps, slice_events)
        if not kernel.run.signatures:  # load its machine code now, outside the timer
            kernel.run.compile(tuple(numba.typeof(a) for a in args))
        if self.partitions != 1 and self._run_partitioned(until_ns, progress):
            return True
        started = time.perf_counter()
        try:
            while True:
                t_stop = stop_ps
                if self.pending_faults:
                    t_stop = min(t_stop, self.pending_faults[0].at_ns * PS - 1)
                code = kernel.run(self._state(), t_stop, slice_events)
                if code == L.R_DONE:
                    return True
                if self.make_room(code):
                    pass
                elif code == L.R_STALLED:
                    raise Stalled(self.stall_report())
                elif code == L.R_STOP:
                    if self.pending_faults and self.pending_faults[0].at_ns * PS - 1 < stop_ps:
                        self._apply(self.pending_faults.pop(0))
                    else:
                        self.g[L.G_NOW_PS] = stop_ps
                        return False
                if progress is not None:
                    self.wall_s += time.perf_counter() - started
                    started = time.perf_counter()
                    progress(self.progress())
        finally:
            self.wall_s += time.perf_counter() - started

    def _run_partitioned(self, until_ns, progress) -> bool:
        """Run on `self.partitions` partitions (aifabric.sim.partition) if this run can be:
        True once done; False (why in `self.partitioned`) to run on one."""
        from aifabric.sim import mpi, partition

        world = mpi.world()  # under mpirun: the partitions on the job's ranks (sim/mpi.py)
        ranks = {} if world is None else {"mpi_ranks": world.size}
        if world is None:
            parts, why = partition.wanted(self, until_ns)
        else:
            parts = mpi.partitions(self.partitions, world.size)
            why = partition.why_not(self, until_ns)
        if why is None:
            try:
                run = mpi.start(self, parts) if world else partition.PartitionedRun(self, parts)
            except partition.Fallback as e:
                why = str(e)
        if why is None:
            self.running = run  # the state is the partitions' until they merge
            try:
                run.run(progress)
            except partition.Fallback as e:
                why = str(e)
            except BaseException:  # stopped (Ctrl-C, SIGTERM): keep what was simulated
                run.merge(stopped=True)
                self.partitioned = {"partitions": run.n, **ranks, "stopped": True}
                raise
            else:
                run.merge()
                self.wall_s += run.wall_s
                self.partitioned = {
                    "partitions": run.n,
                    **ranks,
                    "lookahead_ns": run.lookahead / PS,
                    **({"lookahead_by": run.shortened_by} if run.shortened_by else {}),
                    "windows": run.windows,
                    "outboxes_filled": run.spills,
                    "wall_s": round(run.wall_s, 3),
                    # more partitions than cores: threads that met from Python (slow)
                    **({"too_few_cores": run.too_few_cores} if run.too_few_cores else {}),
                }
                return True
            finally:
                self.running = None
        self.partitioned = {"partitions": 1, **ranks, "asked": self.partitions, "why": why}
        return False

    def stall_report(self) -> str:
        """One sentence: when the run stalled, which flows were stuck, where their packets were."""
        f, fl = self.fabric, self.fl
        state = fl[:, L.FL_STATE]
        underway = (state == L.ST_ACTIVE) | (state == L.ST_SENT)
        stuck = np.flatnonzero(underway & (fl[:, L.FL_T_END_PS] < 0))
        live = self.pk[:-1, L.PK_KIND] >= 0
        rows = np.flatnonzero(live)
        port = self.pk[rows, L.PK_ROUTE + self.pk[rows, L.PK_HOP]]
        owner = self.pk[rows, L.PK_FLOW]
        shown = []
        for i in stuck[:3]:
            mine = port[owner == i]
            at, count = np.unique(mine, return_counts=True)
            where = ", ".join(
                f"{n} at {f.port_name(int(q))}" for q, n in zip(at, count, strict=True)
            )
            shown.append(
                f"flow {i} ({f.node_name[fl[i, L.FL_SRC]]} to {f.node_name[fl[i, L.FL_DST]]}, "
                f"{fl[i, L.FL_DELIV_BYTES]:,} of {fl[i, L.FL_BYTES]:,} bytes delivered, "
                + (f"packets: {where}" if len(mine) else "no packets in the fabric")
                + ")"
            )
        since = int(self.g[L.G_PROGRESS_T_PS]) // PS
        more = f" and {len(stuck) - 3} more" if len(stuck) > 3 else ""
        return (
            f"the simulation stalled at {self.now_ns / 1000:,.1f} us: no data delivered since "
            f"{since / 1000:,.1f} us while {len(stuck)} flows were unfinished: "
            f"{'; '.join(shown)}{more}"
        )

    def progress(self) -> Progress:
        return Progress(
            now_ns=self.now_ns,
            flows_done=self.flows_done,
            flows=len(self.flows),
            events=int(self.g[L.G_EVENTS]),
            wall_s=self.wall_s,
        )

    # results -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the open sample interval and collect the buffers (call once, at the end)."""
        if self.closed:
            return
        self.closed = True
        if int(self.g[L.G_SAMPLES]) >= self.smp.shape[1]:
            self._drain_samples()
        now = int(self.g[L.G_NOW_PS])
        if now > int(self.g[L.G_SAMPLE_T_PS]) or not self.sample_rows:
            kernel.sample(self._state(), now)
        self._drain_samples()
        self._drain_captures()

    def counters(self) -> dict:
        g = self.g
        return {
            "events": int(g[L.G_EVENTS]),
            "packet_hops": int(g[L.G_HOPS]),
            "flows_done": int(g[L.G_DONE]),
            "flows_without_path": int(g[L.G_STUCK]),
            "ecn_marked": int(g[L.G_ECN]),
            "cnp_sent": int(g[L.G_CNP]),
            "pfc_frames": int(g[L.G_PFC]),
            "drops": int(g[L.G_DROPS]),
            "retransmitted_bytes": int(g[L.G_RETX_BYTES]),
            "loss_recovery": self.params["loss_recovery"],
            "simulated_ns": self.now_ns,
        }

    def transport(self) -> dict:
        """The loss recovery and measurement conventions the run used (run.json's summary)."""
        p = self.params
        return {
            "loss_recovery": p["loss_recovery"],
            "ack_every": p["ack_every"],
            "finish": p["finish"],
            "header_overhead_bytes": p["header_overhead"],
        }

    def flow_records(self) -> dict[str, np.ndarray]:
        t, fl = self.flows, self.fl
        start = np.where(fl[:, L.FL_T_START_PS] >= 0, fl[:, L.FL_T_START_PS] // PS, -1)
        end = np.where(fl[:, L.FL_T_END_PS] >= 0, fl[:, L.FL_T_END_PS] // PS, -1)
        ptr, links = self.links_used()
        return {
            "flow_id": t.flow_id, "job": t.job, "op": t.op, "step": t.step,
            "channel": t.channel, "src": t.src, "dst": t.dst, "sqpn": t.sqpn,
            "dqpn": t.dqpn, "sport": t.sport, "bytes": t.bytes,
            "start_ns": start.astype(np.int64), "end_ns": end.astype(np.int64),
            "delivered_bytes": fl[:, L.FL_DELIV_BYTES].copy(),
            "path_ptr": ptr, "path_link": links, "route_epoch": self.route_epoch.copy(),
        }  # fmt: skip

    def links_used(self) -> tuple[np.ndarray, np.ndarray]:
        """Links per flow: its route; under `spray`, every link its first 64 packets took."""
        if self.routing.policy != "spray":
            return self.path_ptr.copy(), (self.path_port // 2).astype(np.int32)
        t = self.flows
        k = 64
        n = len(t)
        rep = np.repeat(np.arange(n), k)
        psn = np.tile(np.arange(k), n)
        paths = self.routing.paths(t.src[rep], t.dst[rep], t.sport[rep], t.dqpn[rep], psn)
        out, ptr = [], [0]
        for i in range(n):
            seen = dict.fromkeys(int(x) for j in range(i * k, (i + 1) * k) for x in paths.links(j))
            out.extend(seen)
            ptr.append(len(out))
        return np.array(ptr, dtype=np.int64), np.array(out, dtype=np.int32)

    def port_series(self) -> dict[str, np.ndarray]:
        """The port series as entries (sample_index, port_index, each series' values, in
        narrow integer types: `portseries.narrow`) with interval_ns, t_ns and port: what
        RunWriter.ports writes."""
        out = concatenate(self.sample_chunks, L.SERIES)
        out["t_ns"] = np.arange(self.sample_rows, dtype=np.int64) * self.sample_interval_ns
        out["port"] = np.arange(self.fabric.n_ports, dtype=np.int64)
        out["interval_ns"] = self.sample_interval_ns
        return out

    def port_samples(self) -> PortSamples:
        """The port series as Run.ports() reads them back (dense series on demand)."""
        return PortSamples.from_arrays(self.port_series())

    def captures(self) -> np.ndarray:
        if not self.capture_chunks:
            return np.zeros((0, L.CP_N), dtype=np.int64)
        return np.concatenate(self.capture_chunks)


def _check_streams(t) -> None:
    """The stream columns of a flow table are what the kernel can run (one sentence if not)."""
    ng = t.n_groups
    g = t.group
    if ((g < -1) | (g >= ng)).any():
        raise AifabricError("a flow names a stream that does not exist")
    if len(t.group_in) and (t.group_in.min() < 0 or t.group_in.max() >= ng):
        raise AifabricError("a stream is released by a stream that does not exist")
    if not ng:
        return
    if (t.group_steps < 1).any() or (t.group_bytes < 0).any() or (t.group_offset < 0).any():
        raise AifabricError("a stream has no steps, negative bytes or a negative offset")
    member = np.flatnonzero(g >= 0)
    s = g[member]
    count = np.bincount(s, minlength=ng)
    first = np.full(ng, len(g), dtype=np.int64)
    np.minimum.at(first, s, member)
    if (count == 0).any() or ((member - first[s]) >= count[s]).any():
        raise AifabricError("a stream's flows are not consecutive rows of the flow table")
    total = np.bincount(s, weights=t.bytes[member], minlength=ng)
    if (np.abs(total - t.group_bytes) > 0.5).any():
        raise AifabricError("a stream's bytes are not the sum of its flows' bytes")
