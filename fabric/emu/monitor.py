"""Telemetry and PFC: one thread that samples every switch's egress queues from the kernel.

Every poll it reads `tc -s -j qdisc show` in each switch's namespace (bytes
sent, drops, the lossless FIFO's backlog) and the eBPF markers' counters,
and folds them into per-port samples at the run's (scaled) interval.

PFC is per-switch backpressure: when any lossless queue of a switch passes
XOFF, the switch sends an 802.1Qbb frame (priority 3, quanta 0xFFFF) out of
every port and the upstream egress of each of those links is paused (its TBF
set to no rate; its FIFO keeps the packets); when every queue is back under
XON it sends quanta 0 and the upstream egresses resume. The reaction time
recorded is from the poll that saw the crossing to the upstream qdiscs
changed (the poll interval bounds the detection delay on top).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fabric.emu import bpfmap, kernel
from fabric.emu.packets import kick_frame, pfc_frame
from fabric.emu.plan import HOST_BUFFER_BYTES, tbf_line
from fabric.model import Role


class Monitor(threading.Thread):
    def __init__(self, network, interval_ns: int, *, pfc: bool = True, poll_s: float = 0.005):
        super().__init__(daemon=True)
        self.net = network
        self.fabric = network.fabric
        self.plan = network.plan
        self.scale = self.plan.scale
        self.interval_s = max(interval_ns * self.scale / 1e9, poll_s)
        self.poll_s = poll_s
        self.pfc = pfc
        self.stop_event = threading.Event()
        f = self.fabric
        self.switches = [int(s) for s in f.switch_ids]
        self.ports = np.array(
            [int(p) for s in self.switches for p in f.ports_of(s)], dtype=np.int64
        )
        self.col = {int(p): i for i, p in enumerate(self.ports)}
        self.iface_col = {self.plan.port_iface[p]: i for p, i in self.col.items()}
        self.samples: dict[str, list] = {k: [] for k in ("t", "tx", "qmax", "qsum", "n", "ecn")}
        self.paused_ns = []
        self.pfc_sent = []
        self.drops = []
        self._cur = None
        self._paused_since: dict[int, float] = {}  # upstream port -> wall time
        self.paused = {s: False for s in self.switches}
        self.reactions_s: list[float] = []
        self.pfc_frames = 0
        self.max_backlog = np.zeros(len(self.ports), dtype=np.int64)
        self._raw: dict[int, socket.socket] = {}
        self._maps: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=8)
        self.error: BaseException | None = None

    # setup ---------------------------------------------------------------------------
    def open(self) -> None:
        f, p = self.fabric, self.plan
        for port in range(f.n_ports):
            node = int(f.port_node[port])
            with kernel.netns_of(self.net.pid[node]):
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
                s.bind((p.port_iface[port], 0))
                self._raw[port] = s
        if p.ecn == "ebpf":
            for cfg in p.nodes:
                for iface, port in cfg.ecn_ifaces:
                    r = self.net.run(
                        cfg.node, ["tc", "-j", "filter", "show", "dev", iface, "egress"]
                    )
                    pid = bpfmap.prog_id_from_tc(r.stdout)
                    if pid is not None:
                        self._maps[port] = bpfmap.map_of_prog(pid)
        self._first = self.poll()  # the baseline, before any traffic

    def close(self) -> None:
        for s in self._raw.values():
            s.close()
        self._raw.clear()
        import os

        for fd in self._maps.values():
            os.close(fd)
        self._maps.clear()
        self._pool.shutdown(wait=True)

    # polling --------------------------------------------------------------------------
    def _read_switch(self, s: int):
        r = self.net.run(s, ["tc", "-s", "-j", "qdisc", "show"])
        if r.returncode != 0:
            return s, []
        return s, json.loads(r.stdout or "[]")

    def poll(self):
        """tx bytes, lossless backlog and drops per recorded port, now."""
        tx = np.zeros(len(self.ports), dtype=np.int64)
        backlog = np.zeros(len(self.ports), dtype=np.int64)
        drops = np.zeros(len(self.ports), dtype=np.int64)
        for _, items in self._pool.map(self._read_switch, self.switches):
            for q in items:
                i = self.iface_col.get(q.get("dev"))
                if i is None:
                    continue
                h = q.get("handle")
                drops[i] += q.get("drops", 0)
                if h == "1:":
                    tx[i] = q.get("bytes", 0)
                elif h == "31:":
                    backlog[i] = q.get("backlog", 0)
        ecn = np.zeros(len(self.ports), dtype=np.int64)
        for port, fd in self._maps.items():
            ecn[self.col[port]] = bpfmap.read_vqueue(fd)[2]
        return tx, backlog, drops, ecn

    def _set_pause(self, s: int, pause: bool) -> None:
        """PAUSE (or resume) every link into switch s, with a PFC frame on each."""
        f, p = self.fabric, self.plan
        t0 = time.monotonic()
        jobs = []
        for q in f.ports_of(s):
            q = int(q)
            up = q ^ 1
            u = int(f.port_node[up])
            prio = f.queue(Role(int(f.node_role[s]))).lossless_priority
            quanta = f.queue(Role(int(f.node_role[s]))).pfc.pause_quanta if pause else 0
            self._raw[q].send(pfc_frame(p.port_mac[q], prio, quanta))
            self.pfc_frames += 1
            self._pfc_count[self.col[q]] += 1
            buf = (
                HOST_BUFFER_BYTES
                if f.node_role[u] == Role.NIC
                else f.queue(Role(int(f.node_role[u]))).buffer_bytes
            )
            line = tbf_line(
                p.port_iface[up], paused=pause, rate_bps=int(p.port_rate_bps[up]), buffer_bytes=buf
            )
            jobs.append((u, up, line))

        def apply(job):
            u, up, line = job
            self.net.run(u, ["tc", *line.split()])
            if not pause:  # a packet through the qdisc restarts its dequeue
                self._raw[up].send(kick_frame(p.port_mac[up], p.port_mac[up ^ 1]))
            return up

        now = time.monotonic()
        for up in self._pool.map(apply, jobs):
            if pause:
                self._paused_since[up] = now
            else:
                since = self._paused_since.pop(up, None)
                if since is not None and up in self.col:
                    self._paused_acc[self.col[up]] += now - since
        if pause:
            self.reactions_s.append(time.monotonic() - t0)
        self.paused[s] = pause

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - reported by the engine
            self.error = e

    def _loop(self) -> None:
        f = self.fabric
        t0 = time.monotonic()
        tx0, _, drops0, ecn0 = self._first
        last_tx, last_drops, last_ecn = tx0, drops0, ecn0
        k = len(self.ports)
        start = t0
        qmax = np.zeros(k, dtype=np.int64)
        qsum = np.zeros(k, dtype=np.float64)
        polls = 0
        self._paused_acc = np.zeros(k, dtype=np.float64)
        self._pfc_count = np.zeros(k, dtype=np.int64)
        sw_ports = {s: [self.col[int(p)] for p in f.ports_of(s)] for s in self.switches}
        while True:
            stopping = self.stop_event.is_set()
            tx, backlog, drops, ecn = self.poll()
            now = time.monotonic()
            np.maximum(qmax, backlog, out=qmax)
            np.maximum(self.max_backlog, backlog, out=self.max_backlog)
            qsum += backlog
            polls += 1
            if self.pfc and not stopping:
                for s in self.switches:
                    pfc = f.queue(Role(int(f.node_role[s]))).pfc
                    if not pfc.enabled:
                        continue
                    b = backlog[sw_ports[s]].max()
                    if not self.paused[s] and b >= pfc.xoff_bytes:
                        self._set_pause(s, True)
                    elif self.paused[s] and b <= pfc.xon_bytes:
                        self._set_pause(s, False)
            if now - start >= self.interval_s or stopping:
                for up, since in self._paused_since.items():
                    if up in self.col:
                        self._paused_acc[self.col[up]] += now - max(since, start)
                        self._paused_since[up] = now
                self.samples["t"].append(int((start - t0) * 1e9 / self.scale))
                self.samples["tx"].append(tx - last_tx)
                self.samples["qmax"].append(qmax.copy())
                self.samples["qsum"].append(qsum / max(polls, 1))
                self.samples["ecn"].append(ecn - last_ecn)
                self.drops.append(drops - last_drops)
                self.paused_ns.append((self._paused_acc * 1e9 / self.scale).astype(np.int64))
                self.pfc_sent.append(self._pfc_count.copy())
                last_tx, last_drops, last_ecn = tx, drops, ecn
                qmax[:] = 0
                qsum[:] = 0
                polls = 0
                self._paused_acc[:] = 0
                self._pfc_count[:] = 0
                start = now
            if stopping:
                for s in self.switches:
                    if self.paused[s]:
                        self._set_pause(s, False)
                return
            time.sleep(self.poll_s)

    def series(self) -> dict:
        k = len(self.ports)

        def stack(rows, dtype):
            return np.array(rows, dtype=dtype).reshape(-1, k)

        return {
            "interval_ns": int(self.interval_s * 1e9 / self.scale),
            "t_ns": np.array(self.samples["t"], dtype=np.int64),
            "port": self.ports,
            "scale": float(self.scale),
            "tx_bytes": stack(self.samples["tx"], np.int64),
            "qdepth_max_bytes": stack(self.samples["qmax"], np.int64),
            "qdepth_mean_bytes": stack(self.samples["qsum"], np.float64),
            "ecn_marked": stack(self.samples["ecn"], np.int64),
            "paused_ns": stack(self.paused_ns, np.int64),
            "pfc_sent": stack(self.pfc_sent, np.int64),
            "drops": stack(self.drops, np.int64),
        }
