"""Telemetry and PFC: one thread that samples every switch's egress queues from the kernel.

Every poll it reads `tc -s -j qdisc show` in each switch's namespace (bytes
sent, drops, the lossless queue's backlog and RED's marks) and the eBPF
markers' counters,
and folds them into per-port samples at the run's (scaled) interval.

PFC is per ingress port, as a switch accounts it: ingress port q of switch
s is paused when a lossless egress queue of s that q's traffic goes to
passes XOFF and q has received data since the last poll (an idle ingress
holds no buffer, so a switch would not pause it), and resumed when all of
them are back under XON. Pausing sends
an 802.1Qbb frame (priority 3, quanta 0xFFFF) out of q and stops the
upstream egress of that link (its TBF set to no rate; its FIFO keeps the
packets); resuming sends quanta 0 and restores it. Which egresses an
ingress feeds comes from the flows' paths where the engine gives them
(`pfc_feeds` with `paths`: the hops a flow takes, predicted by the switches'
own hash), else from the routes (every egress towards a NIC the neighbour
sends through q). Paths keep one job's full queue from pausing another
job's ingress whose bytes never wait in it, as a switch's per-ingress
accounting would not; by routes alone, a spine paused a ring's uplinks for
a neighbouring incast's full downlink, 0.3 ms in a 0.6 ms run that the
simulator never paused. Either way, in a Clos a packet that came down from
a spine never goes back up, so an up-queue never waits for a down-queue
that waits for it, and PFC cannot deadlock. (Pausing every ingress of a
switch whenever any of its queues is full would: a full down-queue at the
spine and a full up-queue at the leaf pause each other.)
The reaction time recorded is from the poll that saw a crossing to the
upstream qdiscs changed (the poll interval bounds the detection delay on top).
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from aifabric.emu import bpfmap, linux
from aifabric.emu.packets import kick_frame
from aifabric.emu.plan import HOST_BUFFER_BYTES, tbf_line
from aifabric.emu.worker import Worker
from aifabric.fabric.frames import pfc_frame
from aifabric.fabric.model import Role

ACTIVE_BYTES = 4096  # received since the last poll: data, not just PFC or kick frames


def read_qdiscs(items: list[dict], iface_col: dict, tx, backlog, drops, ecn) -> None:
    """Fill the columns of the ports in `iface_col` from one `tc -s -j qdisc show`.

    The HTB root (1:) counts bytes sent and drops (its children's too, so they
    are counted once); the lossless queue (31:) holds the backlog, and where it
    is RED it counts the packets it marked CE (`marked`; eBPF markers count
    theirs in their maps).
    """
    for q in items:
        i = iface_col.get(q.get("dev"))
        if i is None:
            continue
        h = q.get("handle")
        if h == "1:":
            tx[i] = q.get("bytes", 0)
            drops[i] = q.get("drops", 0)
        elif h == "31:":
            backlog[i] = q.get("backlog", 0)
            if q.get("kind") == "red":
                ecn[i] = q.get("marked", 0)


class Monitor(Worker):
    def __init__(
        self, network, interval_ns: int, *, pfc: bool = True, poll_s: float = 0.005,
        flow_paths: Callable[[object], object] | None = None,
    ):  # fmt: skip
        """`flow_paths(routing)`: the flows' `Paths` under `routing` (where PFC's ingresses
        feed; see the module's note), or None to judge by the routes alone."""
        super().__init__("aifabric-monitor")
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
        # one tc shell per namespace: Open vSwitch's switches share the root one
        self._ns = {v: linux.netns_id(network.pid[v]) for v in range(f.n_nodes)}
        self._readers = list({self._ns[s]: s for s in self.switches}.values())
        # Two kinds of shell: one per namespace to pause with (its `sync` names a device,
        # which tc then keeps as the filter of every later `qdisc show`: so never to read
        # with), and one per switch namespace to read the queues with.
        self._shells: dict[int, linux.BatchShell] = {}
        self._reader_shells: dict[int, linux.BatchShell] = {}
        self._link_shells: dict[int, linux.BatchShell] = {}  # `ip link show`: bytes received
        # Every switch port, then every NIC's port: the NIC side is what PFC pauses at the
        # edge. A NIC port's bytes are what its leaf received; its queue is not sampled
        # (the replay's socket buffers stand in for a NIC's queues).
        sw_ports = [int(p) for s in self.switches for p in f.ports_of(s)]
        self.nic_ports = np.array([int(f.nic_port[n]) for n in f.nic_ids], dtype=np.int64)
        self.ports = np.array(sw_ports + self.nic_ports.tolist(), dtype=np.int64)
        self.col = {int(p): i for i, p in enumerate(self.ports)}
        self.iface_col = {self.plan.port_iface[p]: self.col[p] for p in sw_ports}
        self._nic_cols = np.array([self.col[int(p)] for p in self.nic_ports], dtype=np.int64)
        self._nic_peer_cols = np.array(
            [self.col[int(p) ^ 1] for p in self.nic_ports], dtype=np.int64
        )
        self.samples: dict[str, list] = {k: [] for k in ("t", "tx", "qmax", "qsum", "n", "ecn")}
        self.paused_ns = []
        self.pfc_sent = []
        self.drops = []
        self._cur = None
        self._paused_since: dict[int, float] = {}  # upstream port -> wall time
        self.paused = {int(q): False for s in self.switches for q in f.ports_of(s)}
        self.flow_paths = flow_paths
        self.set_routing(self.plan.routing)
        self.reactions_s: list[float] = []
        self.pfc_frames = 0
        self.max_backlog = np.zeros(len(self.ports), dtype=np.int64)
        self._raw: dict[int, socket.socket] = {}
        self._maps: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=8)
        # called with the monitor after every poll, in its thread (the live file's figures)
        self.on_poll: Callable[[Monitor], None] | None = None
        self._now = None  # the last poll since the baseline: tx, drops, ECN marks, backlog

    def set_routing(self, routing) -> None:
        """Which egress queues (columns) each switch ingress feeds, for routes old and new."""
        paths = None if self.flow_paths is None else self.flow_paths(routing)
        feeds = pfc_feeds(self.fabric, routing, paths)
        old = getattr(self, "_feeds", {})
        self._feeds = {q: sorted(set(e) | set(old.get(q, ()))) for q, e in feeds.items()}
        self._feed_cols = {q: np.array([self.col[e] for e in es], dtype=np.int64)
                           for q, es in self._feeds.items()}  # fmt: skip

    # setup ---------------------------------------------------------------------------
    def open(self) -> None:
        f, p = self.fabric, self.plan
        for v, ns in self._ns.items():
            if ns not in self._shells:
                self._shells[ns] = linux.BatchShell(self.net.pid[v])
        for s in self._readers:
            self._reader_shells[s] = linux.BatchShell(self.net.pid[s])
            self._link_shells[s] = linux.BatchShell(self.net.pid[s], "ip")
        for port in range(f.n_ports):
            node = int(f.port_node[port])
            with linux.netns_of(self.net.pid[node]):
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
        # closing a raw socket waits for an RCU grace period (about 12 ms here): one at a
        # time, lab-medium's 512 took 6 s; side by side the waits overlap
        linux.close_all(list(self._raw.values()))
        self._raw.clear()
        import os

        for fd in self._maps.values():
            os.close(fd)
        self._maps.clear()
        self._pool.shutdown(wait=True)
        shells = [self._shells, self._reader_shells, self._link_shells]
        for shell in [x for group in shells for x in group.values()]:
            shell.close()
        for group in shells:
            group.clear()

    # polling --------------------------------------------------------------------------
    def _read_switch(self, s: int):
        qdiscs = json.loads(self._reader_shells[s].query("qdisc show") or "[]")
        links = json.loads(self._link_shells[s].query("link show") or "[]")
        return qdiscs, links

    def poll(self):
        """tx bytes, lossless backlog, drops and ECN marks per recorded port, now."""
        tx = np.zeros(len(self.ports), dtype=np.int64)
        backlog = np.zeros(len(self.ports), dtype=np.int64)
        drops = np.zeros(len(self.ports), dtype=np.int64)
        rx = np.zeros(len(self.ports), dtype=np.int64)
        ecn = np.zeros(len(self.ports), dtype=np.int64)
        for items, links in self._pool.map(self._read_switch, self._readers):
            for link in links:
                i = self.iface_col.get(link.get("ifname"))
                if i is not None:
                    rx[i] = link.get("stats64", {}).get("rx", {}).get("bytes", 0)
            read_qdiscs(items, self.iface_col, tx, backlog, drops, ecn)
        for port, fd in self._maps.items():
            ecn[self.col[port]] = bpfmap.read_vqueue(fd)[2]
        tx[self._nic_cols] = rx[self._nic_peer_cols]
        self.rx_bytes = rx  # what each port received: which ingresses carry traffic now
        return tx, backlog, drops, ecn

    def _set_pause(self, changes: list[tuple[int, bool]]) -> None:
        """PAUSE (or resume) the links into switch ingress ports q, with a PFC frame on each."""
        f, p = self.fabric, self.plan
        t0 = time.monotonic()
        jobs = []
        for q, pause in changes:
            s = int(f.port_node[q])
            up = q ^ 1
            u = int(f.port_node[up])
            profile = f.queue(Role(int(f.node_role[s])))
            quanta = profile.pfc.pause_quanta if pause else 0
            if _send(self._raw[q], pfc_frame(p.port_mac[q], profile.lossless_priority, quanta)):
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
            jobs.append((u, up, line, pause))
        by_ns: dict[int, list[str]] = {}
        for u, _, line, _ in jobs:
            by_ns.setdefault(self._ns[u], []).append(line)
        for ns, lines in by_ns.items():
            self._shells[ns].send(lines)
        for ns in by_ns:
            self._shells[ns].sync()  # every upstream qdisc has changed
        now = time.monotonic()
        for _, up, _, pause in jobs:
            if up in self._maps:  # the port's ECN marker: its queue drains no more (or again)
                bpfmap.set_paused(self._maps[up], pause)
            if not pause:  # a packet through the qdisc restarts its dequeue
                _send(self._raw[up], kick_frame(p.port_mac[up], p.port_mac[up ^ 1]))
            if pause:
                self._paused_since[up] = now
            else:
                since = self._paused_since.pop(up, None)
                if since is not None and up in self.col:
                    self._paused_acc[self.col[up]] += now - since
            self.paused[up ^ 1] = pause
        if any(pause for _, pause in changes):
            self.reactions_s.append(time.monotonic() - t0)

    def work(self) -> None:
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
        last_rx = self.rx_bytes
        while True:
            stopping = self.stop_event.is_set()
            tx, backlog, drops, ecn = self.poll()
            active = self.rx_bytes - last_rx >= ACTIVE_BYTES
            last_rx = self.rx_bytes
            now = time.monotonic()
            np.maximum(qmax, backlog, out=qmax)
            np.maximum(self.max_backlog, backlog, out=self.max_backlog)
            qsum += backlog
            polls += 1
            if self.pfc and not stopping:
                changes = []
                for q, cols in self._feed_cols.items():
                    pfc = f.queue(Role(int(f.node_role[f.port_node[q]]))).pfc
                    if not pfc.enabled:
                        continue
                    b = backlog[cols].max() if len(cols) else 0
                    if not self.paused[q] and b >= pfc.xoff_bytes and active[self.col[q]]:
                        changes.append((q, True))
                    elif self.paused[q] and b <= pfc.xon_bytes:
                        changes.append((q, False))
                if changes:
                    self._set_pause(changes)
            if now - start >= self.interval_s or stopping:
                for up, since in self._paused_since.items():
                    if up in self.col:
                        # a pause set after `now` was read (by `_set_pause` above) begins in
                        # the next interval: this one gets none of it, never a negative time
                        self._paused_acc[self.col[up]] += max(0.0, now - max(since, start))
                        self._paused_since[up] = max(now, since)
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
            self._now = (tx - tx0, drops - drops0, ecn - ecn0, backlog)
            if self.on_poll is not None:
                self.on_poll(self)
            if stopping:
                held = [(q, False) for q, paused in self.paused.items() if paused]
                if held:
                    self._set_pause(held)
                return
            time.sleep(self.poll_s)

    def so_far(self) -> dict:
        """Per recorded port, as of the last poll: the series added up since the baseline
        (those of the open interval included), and the backlog (`queue_bytes`)."""
        k = len(self.ports)
        if self._now is None:
            zero = np.zeros(k, dtype=np.int64)
            return {"tx_bytes": zero, "ecn_marked": zero, "paused_ns": zero, "pfc_sent": zero,
                    "drops": zero, "queue_bytes": zero}  # fmt: skip
        tx, drops, ecn, backlog = self._now
        paused = sum(self.paused_ns, np.zeros(k, dtype=np.int64))
        if hasattr(self, "_paused_acc"):
            paused = paused + (self._paused_acc * 1e9 / self.scale).astype(np.int64)
        pfc = sum(self.pfc_sent, np.zeros(k, dtype=np.int64)) + getattr(self, "_pfc_count", 0)
        return {"tx_bytes": tx, "ecn_marked": ecn, "paused_ns": paused, "pfc_sent": pfc,
                "drops": drops, "queue_bytes": backlog}  # fmt: skip

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


def _send(sock, frame: bytes) -> bool:
    """Send a raw frame; False where its interface is down (a fault took it down mid-run)."""
    try:
        sock.send(frame)
    except OSError as e:
        if e.errno in (errno.ENETDOWN, errno.ENXIO):
            return False
        raise
    return True


def pfc_feeds(fabric, routing, paths=None) -> dict[int, list[int]]:
    """For every switch port q: the ports of the same switch its arriving traffic can leave by.

    With `paths` (the flows' `Paths`), the egresses that follow q on some
    flow's path. Without, by the routes: traffic from neighbour u arrives on q
    for every NIC d that u sends through this switch (u is a NIC sending to any
    other NIC, or a switch whose next hops to d include the link to q); it
    leaves by this switch's next hops to d.
    """
    if paths is not None:
        out = {int(q): set() for s in fabric.switch_ids for q in fabric.ports_of(s)}
        flow_of = np.repeat(np.arange(len(paths)), np.diff(paths.ptr))
        same = flow_of[:-1] == flow_of[1:]
        for came, left in zip(paths.ports[:-1][same] ^ 1, paths.ports[1:][same], strict=True):
            out[int(came)].add(int(left))
        return {q: sorted(e) for q, e in out.items()}
    nics = [int(d) for d in fabric.nic_ids]
    hops: dict[tuple[int, int], frozenset] = {}

    def next_hops(v: int, d: int) -> frozenset:
        key = (v, d)
        if key not in hops:
            hops[key] = frozenset(int(h) for h in routing.next_hops(v, d))
        return hops[key]

    out: dict[int, list[int]] = {}
    for s in fabric.switch_ids:
        s = int(s)
        if s in routing.failed_nodes:
            out.update({int(q): [] for q in fabric.ports_of(s)})
            continue
        for q in fabric.ports_of(s):
            q = int(q)
            u = int(fabric.port_peer[q])
            from_nic = fabric.node_role[u] == Role.NIC
            reach: set[int] = set()
            for d in nics:
                if d == u or not (from_nic or (q ^ 1) in next_hops(u, d)):
                    continue
                reach |= next_hops(s, d)
            reach.discard(q)
            out[q] = sorted(reach)
    return out
