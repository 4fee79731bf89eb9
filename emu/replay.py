"""Collective replay: the flow table as RoCEv2-like packets, from one process per core.

Sockets are made inside each host's namespace (setns): per host one UDP
socket on port 4791 receives data and CNPs; per connection (source, source
port, destination) one UDP socket sends with DSCP 26 and ECT(0), unconnected
(a connected socket's packets carry a flow hash Linux routers would follow
instead of the 5-tuple's: `Batch.send`).
The hosts are shared out among replay processes, one per core (forked once
the sockets exist, before the replay starts): a process sends the flows
whose sender it holds and receives for its hosts, in batches (`sendmmsg`,
`recvmmsg`, the bookkeeping of a received batch in numba). A flow starts
when its dependencies have completed and its `start_ns` (scaled) has passed,
plus its op's NCCL latency as the simulator adds it (a collective step's
latency after the data it waits for, the base latency after the op before);
it is done when its receiver has counted all its bytes. The processes share
the flows' state in one anonymous shared mapping: each flow's fields are
written by one process (its sender's or its receiver's), and each process
appends the flows it saw complete to its own list, which the others read to
release the flows waiting for them, so collectives advance step by step
across processes. Receivers answer CE-marked packets with a CNP (at most
one per flow per `cnp_interval`); with `cc == "dcqcn"` senders pace each
flow at its DCQCN rate, by the simulator's rules (`aifabric.emu.dcqcn`: cuts,
alpha timer, rate timer and byte counter, fast, additive and hyper
increase; a rate raised while a flow waits shortens its wait); CNPs and NAKs reach the
process that holds the sender, since it holds the sender's socket too.
Otherwise senders send as fast as the host's NIC queue takes packets.

Delivery is RoCE's go-back-N: a receiver counts a packet only when it
carries the PSN it expects; past a gap (a drop: a full buffer without PFC,
a link that failed mid-run) it drops what follows and sends one NAK with the
expected PSN, and the sender resends from there (never forward). A sender with
data outstanding that the receiver has taken nothing of for the retransmission
timeout (the scenario's `rto`, scaled) resends from the receiver's expected
PSN, which stands in for the ACKs this replay does not send: the rules of
`aifabric.emu.gbn`, the simulator's (tests/test_gbn_engines.py). So "delivered"
means every byte arrived in order.

The replay processes ignore SIGINT and SIGTERM (the engine stops them
through the shared state) and die with the engine's process
(PR_SET_PDEATHSIG), so a killed run leaves none behind.

Times in the results are fabric time: wall-clock nanoseconds divided by the
scale, so they compare with the simulator's.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from aifabric.emu import gbn, linux
from aifabric.emu.dcqcn import ReactionPoint
from aifabric.emu.packets import (
    CNP_DUE,
    FINISHED,
    NAKED,
    OP_ACK,
    Batch,
    RecvBatch,
    absorb,
    cnp,
    fill_writes,
    nak,
    parse_nak,
    parse_write,
)
from aifabric.fabric.addressing import ROCE_UDP_PORT, format_ipv4
from aifabric.fabric.cc import HEADER_OVERHEAD_BYTES
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.frames import CNP_OPCODE as OP_CNP
from aifabric.fabric.frames import TOS_CNP, TOS_DATA_ECT0
from aifabric.fabric.model import Role

IP_RECVTOS = 13
IP_TOS = 1
BATCH = 16  # packets per sendmmsg: within a socket's default send buffer (about 25 of 4 KiB)
RECV_BATCH = 64  # datagrams per recvmmsg
RECV_ROW_BYTES = 64  # what recvmmsg copies of a datagram: headers; the kernel drops the payload
PAYLOAD_MTU = 4096
PR_SET_PDEATHSIG = 1
# looked up once, before any fork: a child that looked it up itself (dlopen, dlsym) could
# wait forever for the loader's lock, held at the fork by another of the run's threads
_prctl = ctypes.CDLL(None, use_errno=True).prctl
STALL_MIN_S = 60.0  # the replay gives up when nothing was delivered for this long,
STALL_RTOS = 20  # or for this many retransmission timeouts, whichever is longer
ERROR_BYTES = 1000  # a replay process's error, as text, in the shared state


def replay_processes(hosts: int) -> int:
    """How many replay processes: one per core this process may run on, at most one per host."""
    return max(1, min(len(os.sched_getaffinity(0)), hosts))


def _drain_s(network) -> float:
    """Wall seconds the slowest full switch buffer takes to drain at its scaled link rate."""
    f, rates = network.fabric, network.plan.port_rate_bps
    worst = 0.0
    for p in range(f.n_ports):
        role = Role(int(f.node_role[f.port_node[p]]))
        if role != Role.NIC:
            worst = max(worst, f.queue(role).buffer_bytes * 8 / float(rates[p]))
    return worst


@dataclass
class ReplayResult:
    start_ns: np.ndarray  # fabric time, -1 never started
    end_ns: np.ndarray  # -1 unfinished
    received: np.ndarray
    ce: np.ndarray  # CE-marked packets per flow
    cnps: np.ndarray  # CNPs received per flow (by its sender)
    packets_sent: int
    retx_packets: np.ndarray  # packets sent again per flow (after a NAK or a timeout)
    naks: int  # NAKs the receivers sent
    timeouts: int  # retransmission timeouts that fired
    cpu_s: float  # CPU seconds the replay processes used (user and system, softirqs in them)
    wall_s: float
    complete: bool
    stalled_s: float = 0.0  # > 0: stopped because nothing was delivered for that long
    lost: str = ""  # a replay process that died mid-run (killed, or exited unasked), said how


class Shared:
    """Named numpy arrays in one anonymous shared mapping: forked processes see each other's
    writes, and nothing is left on disk."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], type]]):
        sizes = {k: int(np.prod(shape)) * np.dtype(t).itemsize for k, (shape, t) in fields.items()}
        self._map = mmap.mmap(-1, max(8, sum(-(-b // 8) * 8 for b in sizes.values())))
        at = 0
        for k, (shape, dt) in fields.items():
            arr = np.frombuffer(self._map, dtype=dt, count=int(np.prod(shape)), offset=at)
            setattr(self, k, arr.reshape(shape))
            at += -(-sizes[k] // 8) * 8


class Replay:
    def __init__(
        self,
        scenario,
        network,
        *,
        mtu: int = PAYLOAD_MTU,
        cc_params=None,
        processes: int | None = None,
        first_latency_ns=None,
        markers=None,
    ):
        self.sc = scenario
        self.first_ns = first_latency_ns  # per flow, `_latencies_s`
        # per flow: a marker (`aifabric.traffic.steps`), whose end releases without latency
        self.markers = np.zeros(len(scenario.flows), dtype=bool) if markers is None else markers
        self.net = network
        self.flows = scenario.flows
        self.scale = network.plan.scale
        self.mtu = mtu
        self.cc = scenario.cc == "dcqcn"
        self.ccp = cc_params or scenario.cc_parameters()
        self.n_procs = processes
        self._recv: dict[int, socket.socket] = {}
        self._send: dict[tuple[int, int, int], socket.socket] = {}
        self.last_result: ReplayResult | None = None
        self.started = threading.Event()  # set once run() has fixed its time zero, self.t0
        self.t0 = 0.0
        self.owner = np.zeros(0, dtype=np.int64)  # host -> the replay process that holds it
        self.shared: Shared | None = None
        self._pids: list[int] = []  # the replay processes still running
        self._all_pids: list[int] = []  # all of them, in order
        self._go: list[int] = []  # write ends of the pipes that start the processes
        self._wake: list[tuple[int, int]] = []

    # sockets and processes ------------------------------------------------------------
    def open(self) -> None:
        ft = self.flows
        ips = self.net.plan.nic_ip
        hosts = sorted(set(ft.src.tolist()) | set(ft.dst.tolist()))
        for h in hosts:
            with linux.netns_of(self.net.pid[h]):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.setsockopt(socket.SOL_IP, IP_RECVTOS, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
                s.setsockopt(socket.SOL_IP, IP_TOS, TOS_CNP)
                s.bind(("0.0.0.0", ROCE_UDP_PORT))
                s.setblocking(False)
                self._recv[h] = s
        for f in range(len(ft)):
            key = (int(ft.src[f]), int(ft.sport[f]), int(ft.dst[f]))
            if key in self._send:
                continue
            src, sport, dst = key
            with linux.netns_of(self.net.pid[src]):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.setsockopt(socket.SOL_IP, IP_TOS, TOS_DATA_ECT0)
                s.bind((format_ipv4(ips[src]), sport))  # not connected: see Batch.send
                s.setblocking(False)
                self._send[key] = s
        _warm()
        self._fork(hosts)

    def _fork(self, hosts: list[int]) -> None:
        """Share the hosts out among the replay processes and start them (they wait for `run`).

        Each process gets a run of consecutive hosts with about as many bytes
        to send and receive as the others: neighbours in a ring (a rank
        receives a step, then sends the next) mostly share a process, so
        most completions release the next step without crossing processes.
        """
        ft, n = self.flows, len(self.flows)
        k = self.n_procs or replay_processes(len(hosts))
        k = max(1, min(k, len(hosts) or 1))
        self.n_procs = k
        nodes = self.net.fabric.n_nodes
        work = np.bincount(ft.src, weights=ft.bytes, minlength=nodes) + np.bincount(
            ft.dst, weights=ft.bytes, minlength=nodes
        )
        self.owner = np.full(nodes, -1, dtype=np.int64)
        ordered = np.array(sorted(hosts), dtype=np.int64)
        if len(ordered):
            cum = np.cumsum(work[ordered])
            share = np.minimum((cum - work[ordered] / 2) * k // max(cum[-1], 1), k - 1)
            self.owner[ordered] = share.astype(np.int64)
        self.shared = Shared(
            {
                "start": ((n,), np.int64),
                "end": ((n,), np.int64),
                "received": ((n,), np.int64),
                "expect": ((n,), np.int64),  # the receiver's next PSN (not wrapped)
                "progress": ((n,), np.float64),  # when the flow last delivered a packet
                "ce": ((n,), np.int64),
                "cnps": ((n,), np.int64),
                "retx": ((n,), np.int64),
                "done": ((k, max(1, n)), np.int64),  # flows each process saw complete
                "n_done": ((k,), np.int64),
                "counts": ((k, 3), np.int64),  # packets sent, NAKs, timeouts
                "clock": ((2,), np.float64),  # time zero, deadline
                "stop": ((1,), np.int64),
                "failed": ((k,), np.int64),
                "error": ((k, ERROR_BYTES), np.uint8),
                "cpu": ((k,), np.float64),  # each process's CPU seconds, written as it ends
            }
        )
        sh = self.shared
        sh.start[:] = -1
        sh.end[:] = -1
        # a byte on process i's wake pipe: a flow it waits for completed elsewhere
        self._wake = [os.pipe2(os.O_NONBLOCK) for _ in range(k)]
        keep = {s.fileno() for s in [*self._recv.values(), *self._send.values()]}
        keep |= {w for _, w in self._wake} | {r for r, _ in self._wake} | {0, 1, 2}
        self._parent = os.getpid()
        for i in range(k):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the replay process: never returns
                code = 1
                try:
                    os.close(w)
                    self._child(i, r, keep | {r})
                    code = 0
                except BaseException as e:  # noqa: BLE001 - reported through the shared state
                    text = f"{type(e).__name__}: {e}".encode()[: ERROR_BYTES - 1]
                    sh.error[i, : len(text)] = np.frombuffer(text, dtype=np.uint8)
                    sh.failed[i] = 1
                finally:
                    os._exit(code)
            self._pids.append(pid)
            self._all_pids.append(pid)
            self._go.append(w)
            os.close(r)
        for pair in self._wake:
            for fd in pair:
                os.close(fd)

    def _child(self, i: int, go: int, keep: set[int]) -> None:
        if not _forked(self._parent):
            return
        for fd in (int(x) for x in os.listdir("/proc/self/fd")):
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if os.read(go, 1) == b"g":
            self._serve(i)
            used = os.times()
            self.shared.cpu[i] = used.user + used.system

    def close(self) -> None:
        """Stop the replay processes (at once when they have not started), close the sockets."""
        if self.shared is not None:
            self.shared.stop[0] = 1
        for w in self._go:
            with contextlib.suppress(OSError):
                os.close(w)
        self._go.clear()
        self._reap(5.0)
        for s in [*self._recv.values(), *self._send.values()]:
            s.close()
        self._recv.clear()
        self._send.clear()

    def _reap(self, timeout_s: float) -> None:
        """Wait for the replay processes to end; kill those still running after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self._pids:
            for pid in list(self._pids):
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0] == 0:
                        continue
                self._pids.remove(pid)
            if not self._pids:
                break
            if time.monotonic() > deadline:
                for pid in self._pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                for pid in self._pids:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                self._pids.clear()
                break
            time.sleep(0.005)

    # run --------------------------------------------------------------------------------
    def rto_s(self) -> float:
        """The retransmission timeout in wall seconds: the scenario's, scaled, but at least
        three full buffers' drain (a quiet flow may only be queued)."""
        return max(0.05, self.ccp.get("rto", 100_000) * self.scale / 1e9, 3 * _drain_s(self.net))

    def stall_s(self) -> float:
        """How long the replay goes on with nothing delivered before it gives up."""
        return max(STALL_MIN_S, STALL_RTOS * self.rto_s())

    def run(self, timeout_s: float = 60.0, stop=None) -> ReplayResult:
        """Start the replay processes and wait until every flow is done, the time is up,
        nothing was delivered for `stall_s()` or `stop` is set; the result also when
        interrupted (`last_result`)."""
        sh, n = self.shared, len(self.flows)
        stall_s = self.stall_s()
        stalled = 0.0
        t0 = self.t0 = time.monotonic()
        sh.clock[0] = t0
        sh.clock[1] = t0 + timeout_s
        for w in self._go:
            os.write(w, b"g")
        self.started.set()
        delivered, moved = -1, t0
        lost = ""
        try:
            while self._pids:
                if int(sh.n_done.sum()) >= n or sh.failed.any():
                    break
                now = time.monotonic()
                total = int(sh.received.sum())
                if total != delivered:
                    delivered, moved = total, now
                elif now - moved > stall_s:
                    stalled = now - moved
                    break
                if stop is not None and stop.is_set():
                    break
                if time.monotonic() > sh.clock[1]:
                    break
                if stop is not None:
                    stop.wait(0.01)
                else:
                    time.sleep(0.01)
                for i, pid in enumerate(self._all_pids):
                    if pid in self._pids and (status := _wait_status(pid)) is not None:
                        self._pids.remove(pid)
                        if not lost and not sh.failed[i] and status != 0:
                            lost = f"replay process {i + 1} of {self.n_procs} {_death(status)}"
                if lost:
                    break
        finally:
            sh.stop[0] = 1
            self._reap(10.0)
            end = sh.end.copy()
            self.last_result = ReplayResult(
                start_ns=sh.start.copy(),
                end_ns=end,
                received=sh.received.copy(),
                ce=sh.ce.copy(),
                cnps=sh.cnps.copy(),
                packets_sent=int(sh.counts[:, 0].sum()),
                retx_packets=sh.retx.copy(),
                naks=int(sh.counts[:, 1].sum()),
                timeouts=int(sh.counts[:, 2].sum()),
                cpu_s=float(sh.cpu.sum()),
                wall_s=time.monotonic() - t0,
                complete=bool((end >= 0).all()),
                stalled_s=stalled,
                lost=lost,
            )
        failed = np.flatnonzero(sh.failed)
        if len(failed):
            text = bytes(sh.error[failed[0]]).rstrip(b"\0").decode(errors="replace")
            raise AifabricError(f"a replay process failed: {text}")
        return self.last_result

    def _serve(self, me: int) -> None:
        """One replay process: send the flows of its hosts, receive for its hosts."""
        sh, ft = self.shared, self.flows
        n = len(ft)
        ips = self.net.plan.nic_ip
        scale = self.scale
        t0 = float(sh.clock[0])
        deadline = float(sh.clock[1])
        nbytes = ft.bytes.astype(np.int64)
        mine = self.owner[ft.src] == me  # flows this process sends
        src_l = ft.src.tolist()
        dst_l = ft.dst.tolist()
        sqpn_l = ft.sqpn.tolist()
        dqpn_l = ft.dqpn.tolist()
        start_s = (ft.start_ns * scale / 1e9).tolist()
        step_s, first_s = _latencies_s(ft, scale, self.first_ns)
        ready_s = [a + b for a, b in zip(start_s, first_s, strict=True)]
        op_l = ft.op.tolist()
        marker_l = np.asarray(self.markers, dtype=bool).tolist()
        nbytes_l = nbytes.tolist()
        pending = np.diff(ft.dep_ptr).astype(np.int64)
        # who waits for whom: the reverse of dep
        order = np.argsort(ft.dep, kind="stable")
        waiter = np.repeat(np.arange(n), np.diff(ft.dep_ptr))[order]
        rptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ft.dep, minlength=n), out=rptr[1:])
        sent_off = np.zeros(n, dtype=np.int64)
        psn = np.zeros(n, dtype=np.int64)
        high = np.zeros(n, dtype=np.int64)  # one past the highest PSN sent
        nak_for = np.full(n, -1, dtype=np.int64)  # the PSN last NAKed: one NAK per gap
        last_cnp = np.full(n, -1e18)
        resent_at = np.zeros(n)  # when the sender last went back (a NAK or a timeout)
        sending = np.zeros(n, dtype=bool)  # in `active`
        line = self.net.plan.port_rate_bps[self.net.fabric.nic_port[ft.src]].astype(float)
        # a protocol's rate cap on an op's flows from one NIC together, as the simulator's
        # pacer: pacer p lets its next batch leave at pace_at[p] (pacer -1: not paced)
        pacer_l, cap = _pacers(ft, self.net.fabric.n_nodes)
        line = line * cap
        line_l = line.tolist()  # the flows of one pacer share its NIC and op: its rate
        pace_at = [0.0] * (max(pacer_l, default=-1) + 1)
        rp = ReactionPoint(self.ccp, line, scale) if self.cc else None
        rate = rp.rc if rp is not None else line
        # DCQCN pacing: a flow's last batch left at paced_at and may be followed once its
        # bits have drained at the flow's current rate (a rate raised by the timer after a
        # cut shortens the wait: the gap is not fixed at the rate of the cut)
        paced_at = np.zeros(n)
        paced_bits = np.zeros(n)
        qp_flow: dict[tuple[int, int], int] = {}  # (src ip, sqpn) -> sending flow, for CNPs
        t_cnp = self.ccp.get("cnp_interval", 50_000) * scale / 1e9
        # A quiet flow may only be queued: wait at least as long as three full buffers drain.
        t_rto = self.rto_s()
        overhead = int(self.ccp.get("header_overhead", HEADER_OVERHEAD_BYTES))
        counts = sh.counts[me]
        batch = Batch(BATCH, self.mtu + 64)
        rbatch = RecvBatch(RECV_BATCH, RECV_ROW_BYTES)
        todo = np.zeros((3 * RECV_BATCH, 3), dtype=np.int64)
        send_fd = {k: s.fileno() for k, s in self._send.items() if self.owner[k[0]] == me}
        flow_fd = [send_fd.get((src_l[f], int(ft.sport[f]), dst_l[f]), -1) for f in range(n)]
        recv_socks = [(h, s) for h, s in self._recv.items() if self.owner[h] == me]
        sock_host = {s.fileno(): h for h, s in recv_socks}
        recv_of = {h: s for h, s in recv_socks}
        cursor = np.zeros(len(sh.n_done), dtype=np.int64)
        waiting = {f for f in np.flatnonzero((pending == 0) & mine).tolist()}
        active: list[int] = []
        done_mine = 0

        def fabric_ns(t):
            return int((t - t0) * 1e9 / scale)

        def finish(f, now):
            """Flow f (received here, or empty) is done: others learn it from `done`, and
            those that send a flow waiting for it are woken."""
            nonlocal done_mine
            sh.end[f] = fabric_ns(now)
            sh.done[me, done_mine] = f
            done_mine += 1
            sh.n_done[me] = done_mine
            for p in {int(self.owner[src_l[int(w)]]) for w in waiter[rptr[f] : rptr[f + 1]]}:
                if p != me:
                    with contextlib.suppress(BlockingIOError):
                        os.write(self._wake[p][1], b"w")

        def release():
            """Flows of this process whose last dependency completed (in any process)."""
            for p in range(len(cursor)):
                top = int(sh.n_done[p])
                while cursor[p] < top:
                    f = int(sh.done[p, cursor[p]])
                    cursor[p] += 1
                    end_s = int(sh.end[f]) * scale / 1e9
                    for k in range(rptr[f], rptr[f + 1]):
                        w = int(waiter[k])
                        if mine[w]:
                            # the step's latency after its input arrived; an op's first
                            # latency after the op before it; none after a release (a marker)
                            if marker_l[f]:
                                after = 0.0
                            else:
                                after = step_s[w] if op_l[w] == op_l[f] else first_s[w]
                            ready_s[w] = max(ready_s[w], end_s + after)
                            pending[w] -= 1
                            if pending[w] == 0:
                                waiting.add(w)

        def go_back(f, psn24, now):
            """Send flow f on from the PSN the receiver expects (`psn24`, its low 24 bits).

            That PSN is at most one past the highest sent; it may lie ahead of
            where an earlier, staler NAK sent the flow back to.
            """
            full = gbn.go_back_to(int(psn[f]), int(high[f]), psn24)
            if full is None:
                return
            psn[f] = full
            sent_off[f] = full * self.mtu
            resent_at[f] = now
            if not sending[f]:
                sending[f] = True
                active.append(f)

        def control(data: bytes, h: int, now: float) -> None:
            """A NAK or a CNP that reached host h, the sender of the flow it names."""
            op, dqpn, psn_in, _, _ = parse_write(data)
            if op == OP_ACK:
                got = parse_nak(data)
                f = got[2] if got is not None else -1
                if 0 <= f < n and mine[f] and src_l[f] == h and sh.end[f] < 0:
                    go_back(f, psn_in, now)
            elif op == OP_CNP:
                f = qp_flow.get((int(ips[h]), dqpn))
                if f is None:
                    return
                sh.cnps[f] += 1
                if rp is not None:
                    rp.cut(f, now)

        last_rto_check = t0
        poller = select.poll()  # not select: a hundred hosts have descriptors past 1024
        for _, s in recv_socks:
            poller.register(s, select.POLLIN)
        wake_in = self._wake[me][0]
        poller.register(wake_in, select.POLLIN)
        while not sh.stop[0]:
            now = time.monotonic()
            if now > deadline or int(sh.n_done.sum()) >= n:
                break
            release()
            now = time.monotonic()  # after release: not before a dependency's end elsewhere
            for f in list(waiting):
                if now - t0 >= start_s[f] and now - t0 >= ready_s[f]:
                    waiting.discard(f)
                    sh.start[f] = fabric_ns(now)
                    if nbytes_l[f] == 0:
                        finish(f, now)
                    else:
                        active.append(f)
                        sending[f] = True
                        qp_flow[(int(ips[src_l[f]]), sqpn_l[f])] = f
                        paced_at[f] = now
                        paced_bits[f] = 0.0
                        if rp is not None:
                            rp.start(f)
                        resent_at[f] = now
            blocked = []
            still = []
            sent_now = False
            for f in active:
                if sent_off[f] >= nbytes_l[f]:
                    sending[f] = False
                    continue
                still.append(f)
                if rp is not None:
                    rp.tick(f, now)
                    if now < paced_at[f] + paced_bits[f] / rate[f]:
                        continue
                p = pacer_l[f]
                if p >= 0 and now < pace_at[p]:
                    continue
                k = fill_writes(
                    batch.buf, batch.lens, f, dqpn_l[f], int(psn[f]),
                    int(sent_off[f]), nbytes_l[f] - int(sent_off[f]), self.mtu,
                )  # fmt: skip
                m = batch.send(flow_fd[f], k, (int(ips[dst_l[f]]), ROCE_UDP_PORT))
                if m < k:
                    blocked.append(flow_fd[f])
                if m:
                    sent_now = True
                    counts[0] += m
                    payload = int(batch.lens[:m].sum()) - m * 32
                    sent_off[f] += payload
                    sh.retx[f] += max(0, min(int(psn[f]) + m, int(high[f])) - int(psn[f]))
                    psn[f] += m
                    high[f] = max(high[f], psn[f])
                    if p >= 0:
                        pace_at[p] = now + (payload + m * overhead) * 8 / line_l[f]
                    if rp is not None:
                        paced_at[f] = max(paced_at[f] + paced_bits[f] / rate[f], now)
                        paced_bits[f] = (payload + m * overhead) * 8
                        rp.sent(f, payload + m * overhead)
            active = still
            if now - last_rto_check >= t_rto / 4:
                last_rto_check = now
                live = mine & (sh.start >= 0) & (sh.end < 0)
                for f in np.flatnonzero(live).tolist():
                    since = max(sh.progress[f], resent_at[f])
                    if gbn.timed_out(now, since, t_rto, int(high[f]), int(sh.expect[f])):
                        counts[2] += 1
                        go_back(f, int(sh.expect[f]) & 0xFFFFFF, now)
            # Nothing to send: sleep until a datagram, a socket with room, a wake-up
            # (a dependency completed elsewhere), a paced flow's turn or 2 ms.
            wait = 0.0 if sent_now else (0.0005 if waiting else 0.002)
            if active and not sent_now:
                due = [pace_at[pacer_l[f]] for f in active if pacer_l[f] >= 0]
                if rp is not None:
                    due += [paced_at[f] + paced_bits[f] / rate[f] for f in active]
                if due:
                    wait = max(0.0, min(wait, min(due) - now))
            waking = set(blocked) - sock_host.keys()
            for fd in waking:
                poller.register(fd, select.POLLOUT)
            events = poller.poll(wait * 1000)
            for fd in waking:
                poller.unregister(fd)
            for fd, event in events:
                if fd == wake_in:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_in, 4096)
                    continue
                if fd not in sock_host or not event & select.POLLIN:
                    continue
                h = sock_host[fd]
                while True:
                    got = rbatch.recv(fd)
                    if not got:
                        break
                    now = time.monotonic()
                    m = absorb(
                        rbatch.buf, rbatch.lens, rbatch.control, rbatch._controllen, got,
                        nbytes, sh.expect, sh.received, sh.progress, sh.ce, nak_for, last_cnp,
                        now, t_cnp, todo,
                    )  # fmt: skip
                    for kind, f, value in todo[:m].tolist():
                        if kind == NAKED:
                            counts[1] += 1
                            to = (format_ipv4(ips[src_l[f]]), ROCE_UDP_PORT)
                            recv_of[h].sendto(nak(sqpn_l[f], value, f), to)
                        elif kind == CNP_DUE:
                            to = (format_ipv4(ips[src_l[f]]), ROCE_UDP_PORT)
                            recv_of[h].sendto(cnp(sqpn_l[f]), to)
                        elif kind == FINISHED:
                            if sh.end[f] < 0:
                                finish(f, now)
                        else:
                            control(bytes(rbatch.buf[f, : rbatch.lens[f]]), h, now)
                    if got < RECV_BATCH:
                        break


def _warm() -> None:
    """Load the numba kernels the replay processes call, once, before they are forked: else
    each process loads them again when it sends or receives its first packet."""
    batch = Batch(1, RECV_ROW_BYTES)
    fill_writes(batch.buf, batch.lens, 0, 1, 0, 0, 1, 1)
    rbatch = RecvBatch(1, RECV_ROW_BYTES)
    one = np.zeros(1, dtype=np.int64)
    absorb(rbatch.buf, rbatch.lens, rbatch.control, rbatch._controllen, 0, one, one.copy(),
           one.copy(), np.zeros(1), one.copy(), one.copy(), np.zeros(1), 0.0, 0.0,
           np.zeros((1, 3), dtype=np.int64))  # fmt: skip


def _forked(parent: int) -> bool:
    """Make this freshly forked process a replay process: deaf to SIGINT and SIGTERM, killed
    with its parent. False when the parent (`parent`, its pid) is gone already."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return os.getppid() == parent


def _wait_status(pid: int) -> int | None:
    """The wait status of child `pid` once it has ended (0 when reaped elsewhere), else None."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if got else None


def _death(status: int) -> str:
    """How a replay process ended, from its wait status, as the end of a sentence."""
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


PROBE_NET = "10.254"  # the probe's two subnets, 10.254.0.0/24 and 10.254.1.0/24
PROBE_S = 0.3
# What the replay sends of what the probe carries: its packets cross three routers and their
# queues, not one, and it keeps the flows' books (measured on lab-medium permutations).
REPLAY_SHARE = 0.5


@functools.cache
def capacity_pps() -> float:
    """The packets/s the replay can send on this machine, probed once per process."""
    return REPLAY_SHARE * probe_pps()


def probe_pps(seconds: float = PROBE_S, processes: int | None = None) -> float:
    """Packets/s (4 KiB payloads) this machine carries from senders through one router to
    receivers, one sender and receiver per replay process, each process doing both as the
    replay does (sendmmsg, then recvmmsg of what arrived).

    Three scratch namespaces `af-cap-PID-{a,r,b}` (a veth from a to the router r, one from
    r to b) exist only for the probe; `aifabric clean` removes them after a kill.
    """
    import subprocess

    k = processes or replay_processes(64)
    tag = f"af-cap-{os.getpid()}"
    a, r, b = f"{tag}-a", f"{tag}-r", f"{tag}-b"
    script = f"""
ip netns add {a} && ip netns add {r} && ip netns add {b} &&
ip link add afca netns {a} type veth peer name afcr netns {r} &&
ip link add afcb netns {b} type veth peer name afcs netns {r} &&
ip -n {a} addr add {PROBE_NET}.0.1/24 dev afca && ip -n {a} link set afca mtu 9000 up &&
ip -n {a} route add default via {PROBE_NET}.0.2 &&
ip -n {r} addr add {PROBE_NET}.0.2/24 dev afcr && ip -n {r} link set afcr mtu 9000 up &&
ip -n {r} addr add {PROBE_NET}.1.2/24 dev afcs && ip -n {r} link set afcs mtu 9000 up &&
ip netns exec {r} sysctl -q -w net.ipv4.ip_forward=1 &&
ip -n {b} addr add {PROBE_NET}.1.1/24 dev afcb && ip -n {b} link set afcb mtu 9000 up &&
ip -n {b} route add default via {PROBE_NET}.1.2
"""
    try:
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
        if done.returncode != 0:
            err = (done.stderr.strip().splitlines() or ["failed"])[-1]
            raise AifabricError(f"the replay's capacity probe could not set up: {err}")
        return _probe(a, b, k, seconds)
    finally:
        for ns in (a, r, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _probe(a: str, b: str, k: int, seconds: float) -> float:
    socks = []
    for i in range(k):
        with linux.netns_at(f"/run/netns/{b}"):
            rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 2**20)
            rx.bind((f"{PROBE_NET}.1.1", ROCE_UDP_PORT + 1 + i))
        with linux.netns_at(f"/run/netns/{a}"):
            tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            tx.connect((f"{PROBE_NET}.1.1", ROCE_UDP_PORT + 1 + i))
        socks.append((tx, rx))
    counts = Shared({"got": ((k,), np.int64), "span": ((k,), np.float64)})
    go_r, go_w = os.pipe()
    pids = []
    parent = os.getpid()
    try:
        for i in range(k):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(go_w)
                    if _forked(parent) and os.read(go_r, 1) == b"g":
                        got, span = _flood(*socks[i], seconds)
                        counts.got[i], counts.span[i] = got, span
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        os.write(go_w, b"g" * k)
    finally:
        os.close(go_w)
        os.close(go_r)
        for pid in pids:
            os.waitpid(pid, 0)
        for tx, rx in socks:
            tx.close()
            rx.close()
    return float(sum(counts.got[i] / counts.span[i] for i in range(k) if counts.span[i] > 0))


def _flood(tx: socket.socket, rx: socket.socket, seconds: float) -> tuple[int, float]:
    """Send 4 KiB datagrams in batches for `seconds`, receiving what arrives between them."""
    batch = Batch(BATCH, PAYLOAD_MTU + 64)
    rbatch = RecvBatch(RECV_BATCH, RECV_ROW_BYTES)
    k = fill_writes(batch.buf, batch.lens, 0, 1, 0, 0, BATCH * PAYLOAD_MTU, PAYLOAD_MTU)
    host, port = tx.getpeername()
    to = (int.from_bytes(socket.inet_aton(host), "big"), port)
    got = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        batch.send(tx, k, to)
        while True:
            m = rbatch.recv(rx.fileno())
            got += m
            if m < RECV_BATCH:
                break
    return got, time.monotonic() - t0


def _pacers(ft, n_nodes: int) -> tuple[list, np.ndarray]:
    """Per flow, its pacer (one per op and sending NIC whose protocol caps the rate; -1:
    none) and its rate as a fraction of its NIC's line rate (the protocol's cap, else 1), as
    the simulator sets them (`aifabric.sim.driver`: op_rate_factor, FL_PACER)."""
    n = len(ft)
    cap = np.clip(ft.op_column("op_rate_factor", 1.0).astype(float), 1e-6, 1.0)
    pacer = np.full(n, -1, dtype=np.int64)
    capped = cap < 1.0
    if capped.any():
        key = ft.op.astype(np.int64)[capped] * n_nodes + ft.src[capped]
        pacer[capped] = np.unique(key, return_inverse=True)[1].ravel()
    return pacer.tolist(), cap


def _latencies_s(ft, scale: int, first_ns=None) -> tuple[list, list]:
    """Per flow, in scaled wall seconds: the latency from the arrival of its op's data it
    waits for to its start (its op's step latency), and before its first step, from its
    op's start or the end of the op before (`first_ns`: `steps_first_latency_ns` of the
    streams its flows are the steps of; None, no streams: the base latency alone), as the
    simulator runs them (`aifabric.sim.kernel`: `release_dep`, `start_stream`)."""
    step = ft.op_column("op_step_latency_ns", 0) * scale / 1e9
    if first_ns is None:
        first_ns = ft.op_column("op_base_latency_ns", 0)
    return step.tolist(), (np.asarray(first_ns) * scale / 1e9).tolist()
