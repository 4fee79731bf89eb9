"""Collective replay: the flow table as RoCEv2-like packets, from one process driving every host.

Sockets are made inside each host's namespace (setns) and used from here:
per host one UDP socket on port 4791 receives data and CNPs; per connection
(source, source port, destination) one connected UDP socket sends with DSCP
26 and ECT(0). A flow starts when its dependencies have completed and its
`start_ns` (scaled) has passed; it is done when its receiver has counted all
its bytes, which releases the flows waiting for it, so collectives advance
step by step. Receivers answer CE-marked packets with a CNP (at most one per
flow per `cnp_interval`); with `cc == "dcqcn"` senders pace each flow and cut
its rate on CNPs (DCQCN's rate decrease, alpha update, fast recovery and
additive increase on the rate timer), otherwise they send as fast as the
host's NIC queue takes packets.

Delivery is RoCE's go-back-N, by the rules of `fabric.emu.gbn` (the
simulator's): a receiver counts a packet only when it carries the PSN it
expects; past a gap (a drop: a full buffer without PFC, a link that failed
mid-run) it drops what follows and sends one NAK with the expected PSN, and
the sender resends from there. A flow with data outstanding whose receiver
has taken nothing for the retransmission timeout (the scenario's `rto`,
scaled) resends from the receiver's expected PSN, which stands in for the
ACKs this replay does not send. So "delivered" means every byte arrived in
order.

Times in the results are fabric time: wall-clock nanoseconds divided by the
scale, so they compare with the simulator's.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from fabric.addressing import ROCE_UDP_PORT, format_ipv4
from fabric.cc import HEADER_OVERHEAD_BYTES
from fabric.emu import gbn, linux
from fabric.emu.packets import (
    OP_ACK,
    OP_WRITE_ONLY,
    Batch,
    cnp,
    fill_writes,
    nak,
    parse_nak,
    parse_write,
)
from fabric.frames import CNP_OPCODE as OP_CNP
from fabric.frames import TOS_CNP, TOS_DATA_ECT0
from fabric.model import Role

IP_RECVTOS = 13
IP_TOS = 1
BATCH = 16
PAYLOAD_MTU = 4096


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
    wall_s: float
    complete: bool


class Replay:
    def __init__(self, scenario, network, *, mtu: int = PAYLOAD_MTU, cc_params=None):
        self.sc = scenario
        self.net = network
        self.flows = scenario.flows
        self.scale = network.plan.scale
        self.mtu = mtu
        self.cc = scenario.cc == "dcqcn"
        self.ccp = cc_params or {}
        self._recv: dict[int, socket.socket] = {}
        self._send: dict[tuple[int, int, int], socket.socket] = {}
        self.batch = Batch(BATCH, mtu + 64)
        self.last_result: ReplayResult | None = None
        self.started = threading.Event()  # set once run() has fixed its time zero, self.t0
        self.t0 = 0.0

    # sockets ---------------------------------------------------------------------------
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

    def close(self) -> None:
        for s in [*self._recv.values(), *self._send.values()]:
            s.close()
        self._recv.clear()
        self._send.clear()

    # run --------------------------------------------------------------------------------
    def run(self, timeout_s: float = 60.0, stop=None) -> ReplayResult:
        ft = self.flows
        n = len(ft)
        ips = self.net.plan.nic_ip
        scale = self.scale
        nbytes = ft.bytes.astype(np.int64)
        pending = np.diff(ft.dep_ptr).astype(np.int64)
        # who waits for whom: the reverse of dep
        order = np.argsort(ft.dep, kind="stable")
        waiter = np.repeat(np.arange(n), np.diff(ft.dep_ptr))[order]
        rptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ft.dep, minlength=n), out=rptr[1:])
        sent_off = np.zeros(n, dtype=np.int64)
        psn = np.zeros(n, dtype=np.int64)
        received = np.zeros(n, dtype=np.int64)  # in order, so exactly what was delivered
        expect = np.zeros(n, dtype=np.int64)  # the receiver's next PSN (not wrapped)
        nak_for = np.full(n, -1, dtype=np.int64)  # the PSN last NAKed: one NAK per gap
        progress = np.zeros(n)  # when the flow last delivered a packet (or was resent)
        retx = np.zeros(n, dtype=np.int64)
        high = np.zeros(n, dtype=np.int64)  # one past the highest PSN sent
        sending = np.zeros(n, dtype=bool)  # in `active`
        ce = np.zeros(n, dtype=np.int64)
        cnps = np.zeros(n, dtype=np.int64)
        start = np.full(n, -1, dtype=np.int64)
        end = np.full(n, -1, dtype=np.int64)
        released_at = np.full(n, -1.0)
        last_cnp = np.full(n, -1e18)
        line = self.net.plan.port_rate_bps[self.net.fabric.nic_port[ft.src]].astype(float)
        rate = line.copy()
        target = line.copy()
        alpha = np.ones(n)
        next_tx = np.zeros(n)
        last_timer = np.zeros(n)
        recov = np.zeros(n, dtype=np.int64)
        qp_flow: dict[tuple[int, int], int] = {}  # (src ip, sqpn) -> sending flow, for CNPs
        flow_of_src = {int(ips[h]): h for h in self._recv}
        g = float(self.ccp.get("g", 1 / 256))
        t_cnp = self.ccp.get("cnp_interval", 50_000) * scale / 1e9
        t_timer = self.ccp.get("rate_timer", 55_000) * scale / 1e9
        ai = float(self.ccp.get("additive_increase", 40e6)) / scale
        min_rate = float(self.ccp.get("min_rate", 100e6)) / scale
        fast_steps = int(self.ccp.get("fast_recovery_steps", 5))
        overhead = int(self.ccp.get("header_overhead", HEADER_OVERHEAD_BYTES))
        # A quiet flow may only be queued: wait at least as long as three full buffers drain.
        t_rto = max(0.05, self.ccp.get("rto", 100_000) * scale / 1e9, 3 * _drain_s(self.net))
        n_naks = n_timeouts = 0

        t0 = self.t0 = time.monotonic()
        self.started.set()
        sent_pkts = 0
        for f in np.flatnonzero(pending == 0):
            released_at[f] = 0.0
        active: list[int] = []
        waiting = set(np.flatnonzero(pending == 0).tolist())
        done = 0
        zero = np.flatnonzero(nbytes == 0)

        def fabric_ns(t):
            return int((t - t0) * 1e9 / scale)

        def finish(f, now):
            nonlocal done
            end[f] = fabric_ns(now)
            done += 1
            for k in range(rptr[f], rptr[f + 1]):
                w = int(waiter[k])
                pending[w] -= 1
                if pending[w] == 0:
                    released_at[w] = now - t0
                    waiting.add(w)

        def go_back(f, psn24, now):
            """Send flow f on from the PSN the receiver expects (`psn24`, its low 24 bits),
            if that lies behind where it is (`gbn.go_back_to`); True if it went back."""
            full = gbn.go_back_to(int(psn[f]), int(high[f]), psn24)
            if full is None:
                return False
            psn[f] = full
            sent_off[f] = full * self.mtu
            progress[f] = now
            if not sending[f]:
                sending[f] = True
                active.append(f)
            return True

        zero_set = set(zero.tolist())
        last_rto_check = t0
        recv_socks = list(self._recv.items())
        sock_host = {s.fileno(): h for h, s in recv_socks}
        # poll, not select: a fabric of a hundred hosts has descriptors past select's 1024.
        poller = select.poll()
        for _, s in recv_socks:
            poller.register(s, select.POLLIN)
        try:
            while done < n:
                now = time.monotonic()
                if now - t0 > timeout_s or (stop is not None and stop.is_set()):
                    break
                for f in list(waiting):
                    if now - t0 >= ft.start_ns[f] * scale / 1e9:
                        waiting.discard(f)
                        start[f] = fabric_ns(now)
                        if f in zero_set:
                            finish(f, now)
                        else:
                            active.append(f)
                            sending[f] = True
                            qp_flow[(int(ips[ft.src[f]]), int(ft.sqpn[f]))] = f
                            next_tx[f] = now
                            last_timer[f] = now
                            progress[f] = now
                blocked = []
                still = []
                for f in active:
                    if sent_off[f] >= nbytes[f]:
                        sending[f] = False
                        continue
                    still.append(f)
                    if self.cc:
                        while now - last_timer[f] >= t_timer:
                            last_timer[f] += t_timer
                            alpha[f] *= 1 - g
                            recov[f] += 1
                            if recov[f] > fast_steps:
                                target[f] = min(line[f], target[f] + ai)
                            rate[f] = min(line[f], (rate[f] + target[f]) / 2)
                        if now < next_tx[f]:
                            continue
                    key = (int(ft.src[f]), int(ft.sport[f]), int(ft.dst[f]))
                    sock = self._send[key]
                    k = fill_writes(
                        self.batch.buf, self.batch.lens, f, int(ft.dqpn[f]), int(psn[f]),
                        int(sent_off[f]), int(nbytes[f] - sent_off[f]), self.mtu,
                    )  # fmt: skip
                    m = self.batch.send(sock, k, (int(ips[ft.dst[f]]), ROCE_UDP_PORT))
                    if m < k:
                        blocked.append(sock)
                    if m:
                        sent_pkts += m
                        payload = int(self.batch.lens[:m].sum()) - m * 32
                        sent_off[f] += payload
                        retx[f] += max(0, min(int(psn[f]) + m, int(high[f])) - int(psn[f]))
                        psn[f] += m
                        high[f] = max(high[f], psn[f])
                        if self.cc:
                            wire = payload + m * overhead
                            next_tx[f] = max(next_tx[f], now) + wire * 8 / rate[f]
                active = still
                if now - last_rto_check >= t_rto / 4:
                    last_rto_check = now
                    for f in np.flatnonzero((start >= 0) & (end < 0)):
                        due = gbn.timed_out(now, progress[f], t_rto, high[f], expect[f])
                        if due and go_back(int(f), int(expect[f]) & gbn.PSN_MASK, now):
                            n_timeouts += 1
                wait = 0.0 if (waiting or any(sent_off[f] < nbytes[f] for f in active)) else 0.002
                if self.cc and active:
                    wait = max(0.0, min(0.002, min(next_tx[f] for f in active) - now))
                waking = {s.fileno() for s in blocked} - sock_host.keys()
                for fd in waking:
                    poller.register(fd, select.POLLOUT)
                events = poller.poll(wait * 1000)
                for fd in waking:
                    poller.unregister(fd)
                for fd, event in events:
                    if fd not in sock_host or not event & select.POLLIN:
                        continue
                    h = sock_host[fd]
                    s = self._recv[h]
                    while True:
                        try:
                            data, anc, _, addr = s.recvmsg(self.mtu + 64, 64)
                        except BlockingIOError:
                            break
                        op, dqpn, psn_in, f, pay = parse_write(data)
                        now = time.monotonic()
                        if op == OP_WRITE_ONLY and 0 <= f < n:
                            tos = anc[0][2][0] if anc else 0
                            taken, naks = gbn.receive(int(expect[f]), int(nak_for[f]), psn_in)
                            if taken:
                                received[f] += pay
                                expect[f] += 1
                                progress[f] = now
                            elif naks >= 0:
                                nak_for[f] = naks  # a gap: one NAK, then wait for it
                                n_naks += 1
                                s.sendto(
                                    nak(int(ft.sqpn[f]), int(expect[f]), f),
                                    (addr[0], ROCE_UDP_PORT),
                                )
                            if tos & 3 == 3:
                                ce[f] += 1
                                if now - last_cnp[f] >= t_cnp:
                                    last_cnp[f] = now
                                    self._recv[h].sendto(
                                        cnp(int(ft.sqpn[f])), (addr[0], ROCE_UDP_PORT)
                                    )
                            if received[f] >= nbytes[f] and end[f] < 0:
                                finish(f, now)
                        elif op == OP_ACK:
                            got = parse_nak(data)
                            g_f = got[2] if got is not None else -1
                            if 0 <= g_f < n and ft.src[g_f] == h and end[g_f] < 0:
                                go_back(g_f, psn_in, now)
                        elif op == OP_CNP:
                            src_ip = flow_of_src.get(
                                int.from_bytes(socket.inet_aton(addr[0]), "big")
                            )
                            if src_ip is None:
                                continue
                            me = int(ips[h])
                            g_f = qp_flow.get((me, dqpn))
                            if g_f is None:
                                continue
                            cnps[g_f] += 1
                            if self.cc:
                                target[g_f] = rate[g_f]
                                rate[g_f] = max(min_rate, rate[g_f] * (1 - alpha[g_f] / 2))
                                alpha[g_f] = (1 - g) * alpha[g_f] + g
                                recov[g_f] = 0
                                last_timer[g_f] = now
        finally:
            self.last_result = ReplayResult(
                start_ns=start,
                end_ns=end,
                received=received,
                ce=ce,
                cnps=cnps,
                packets_sent=sent_pkts,
                retx_packets=retx,
                naks=n_naks,
                timeouts=n_timeouts,
                wall_s=time.monotonic() - t0,
                complete=done == n,
            )
        return self.last_result
