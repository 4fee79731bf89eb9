"""Open vSwitch as the fabric's switches (`--switch ovs`): one OpenFlow bridge per switch.

Each switch is a bridge named like its router would be (`afs3`), fail mode
secure, no controller, OpenFlow 1.5; its ports are the switch's veths, left
in the root namespace (ofport = local port number + 1). Hosts are unchanged.
Forwarding is layer 3 by rules installed with ovs-ofctl: per destination
NIC a /32 flow into a select group whose buckets are the routing's next hops
(Ethernet source and destination set to the link's two port MACs, which is
what the hosts' static gateway neighbours already name; TTL decremented;
output). The group hashes the 5-tuple (source and destination address for
`pinned`, as the routers' hash policy does) with the switch's seed as the
basis, so seeds play the part of the routers' `fib_multipath_hash_seed`;
each bucket watches its port, so a port that goes down leaves the group.
Anything else (PFC frames, kicks) misses the table and is dropped. Queues
are the plan's tc lines, on the same interfaces as the routers'.

Datapath: the kernel module ("system") where a probe bridge opens, else the
userspace datapath ("netdev", slower). The userspace datapath needs two
things the kernel one does not. Hosts compute UDP checksums themselves: it
forwards checksum-offloaded packets from a veth with the checksum
unfinished and receivers drop them. And it sends every packet through one
AF_PACKET socket, to which the kernel charges each packet until it leaves
the egress qdisc; at the default send buffer (~200 KiB for all queues of all
switches together) a send that does not fit is dropped unseen, so the run
widens that socket's send buffer (`widen_send_buffer`) to leave the limit
to the qdiscs, and says in run.json what it got.

Daemons: where ovsdb-server and ovs-vswitchd already answer (the system's
service), a run uses them and leaves them running, deleting only its own
bridges. Otherwise it starts a private pair whose database, sockets and
logs live in the run's temporary directory and stops them at the end; they
carry the engine's environment mark, so `aifabric clean` ends them after a
killed run, and their bridges die with them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

from aifabric.emu import linux
from aifabric.emu.net import Network
from aifabric.emu.plan import MTU_BYTES, PREFIX, NodeConfig, Plan, link_lines
from aifabric.fabric.addressing import ROCE_UDP_PORT, format_ipv4
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.faults import routing_after, routing_at_start
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import Routing

TOOLS = ("ovs-vsctl", "ovs-ofctl", "ovs-appctl", "ovsdb-tool", "ovsdb-server", "ovs-vswitchd")
OPENFLOW = "OpenFlow15"
OFPP_LOCAL = 65534  # the bridge's own port
PROBE_BRIDGE = f"{PREFIX}povs"  # `af` + `p`: `aifabric clean` removes it like a probe veth
HASH_FIELDS = {1: "ip_src,ip_dst,nw_proto,udp_src,udp_dst", 0: "ip_src,ip_dst"}
DATAPATHS = {
    "system": "the Open vSwitch kernel module",
    "netdev": "Open vSwitch's userspace datapath (no kernel module here; slower)",
}
_TRACE_OUTPUT = re.compile(r"^\s+output:(\d+)\s*$", re.MULTILINE)
NETDEV_TAP = "ovs-netdev"  # the userspace datapath's own port: a persistent tap it leaves behind
SEND_BUFFER_BYTES = 2**30  # the kernel doubles it; queues are bounded by their qdiscs instead
SO_SNDBUFFORCE = 32
SYS_PIDFD_GETFD = 438  # the same number on every architecture
PROBE_TIMEOUT_S = 120  # ovs-vsctl's limit for the datapath probe (see probe_datapath)


def missing() -> str | None:
    """None when Open vSwitch's programs are installed, else one sentence saying what to install."""
    gone = [t for t in (*TOOLS, "ethtool") if shutil.which(t) is None]
    if gone:
        return (
            f"--switch ovs needs Open vSwitch (Debian package openvswitch-switch) and ethtool; "
            f"{', '.join(gone)} not found on the PATH"
        )
    return None


# rules as data --------------------------------------------------------------------------
def ofport(fabric: Fabric, port: int) -> int:
    return int(fabric.port_number[port]) + 1


def initial_routing(scenario) -> Routing:
    """The routing the fabric is built with: the plan's, faults at time 0 applied."""
    return routing_at_start(scenario.fabric, scenario.faults, seed=scenario.hash_seed)


def bridge_rules(plan: Plan, fabric: Fabric, routing: Routing, switch: int):
    """(`ovs-ofctl add-groups` lines, `add-flows` lines) that route `switch` as its router would.

    Group g + 1 leads to NIC g (its ordinal among NICs); a NIC it cannot
    reach gets no flow, so its packets miss the table and are dropped.
    """
    fields = HASH_FIELDS[plan.hash_policy]
    seed = int(plan.hash_seed[switch])
    groups, flows = [], []
    for g, dst in enumerate(fabric.nic_ids, start=1):
        hops = [int(h) for h in routing.next_hops(switch, int(dst))]
        if not hops:
            continue
        buckets = ",".join(
            f"bucket=bucket_id:{i},watch_port:{ofport(fabric, h)},"
            f"actions=set_field:{plan.port_mac[h]}->eth_src,"
            f"set_field:{plan.port_mac[h ^ 1]}->eth_dst,dec_ttl,output:{ofport(fabric, h)}"
            for i, h in enumerate(hops)
        )
        groups.append(
            f"group_id={g},type=select,selection_method=hash,fields({fields}),"
            f"selection_method_param={seed},{buckets}"
        )
        flows.append(f"priority=10,ip,nw_dst={format_ipv4(plan.nic_ip[dst])},actions=group:{g}")
    flows.append("priority=0,actions=drop")
    return groups, flows


def group_changes(
    plan: Plan, fabric: Fabric, before: Routing, after: Routing, switch: int
) -> list[str]:
    """`mod-group` specs for the groups of `switch` that a fault changes.

    A NIC no longer reachable from here keeps its flow and gets an empty
    group, which drops, as a router's `unreachable` route does. A switch brought
    back gets every group: those it kept while it was down are stale.
    """
    new = {g.split(",", 1)[0]: g for g in bridge_rules(plan, fabric, after, switch)[0]}
    if switch in before.failed_nodes:
        return list(new.values())
    old = {g.split(",", 1)[0]: g for g in bridge_rules(plan, fabric, before, switch)[0]}
    out = []
    for key, spec in old.items():
        if new.get(key) != spec:
            out.append(new.get(key, f"{key},type=select"))
    return out


def bridge_args(plan: Plan, fabric: Fabric, datapath: str) -> list[str]:
    """One `ovs-vsctl` transaction that makes every switch's bridge with its ports.

    Every port's QoS is `linux-noop`, so Open vSwitch never replaces the
    qdiscs the plan puts on it.
    """
    args = ["--", "--id=@noop", "create", "qos", "type=linux-noop"]
    for s in fabric.switch_ids:
        br = plan.node_short[int(s)]
        args += ["--", "add-br", br, "--", "set", "bridge", br, f"datapath_type={datapath}",
                 "fail_mode=secure", f"protocols={OPENFLOW}"]  # fmt: skip
        for q in fabric.ports_of(int(s)):
            iface, number = plan.port_iface[int(q)], ofport(fabric, int(q))
            args += ["--", "add-port", br, iface, "qos=@noop",
                     "--", "set", "interface", iface, f"ofport_request={number}"]  # fmt: skip
    return args


def switch_link_lines(plan: Plan, fabric: Fabric, switch: int) -> tuple[str, ...]:
    ifaces = [plan.port_iface[int(q)] for q in fabric.ports_of(switch)]
    return tuple(f"link set dev {iface} mtu {MTU_BYTES} up" for iface in ifaces)


def trace_flow(in_port: int, dst_ip: int, src_ip: int, sport: int) -> str:
    """The `ofproto/trace` flow of one RoCEv2 packet arriving on `in_port`."""
    return (
        f"in_port={in_port},udp,nw_src={format_ipv4(src_ip)},nw_dst={format_ipv4(dst_ip)},"
        f"udp_src={sport},udp_dst={ROCE_UDP_PORT},nw_ttl=64"
    )


def traced_port(trace: str) -> int | None:
    """The OpenFlow port a trace ends by sending the packet out of, None if it drops it."""
    found = _TRACE_OUTPUT.findall(trace)
    return int(found[-1]) if found else None


# daemons ------------------------------------------------------------------------------------
class Daemons:
    """ovsdb-server and ovs-vswitchd: the system's where they answer, else a private pair."""

    def __init__(self):
        self.env = dict(os.environ)
        self.owned = False
        self.rundir: Path | None = None
        self.procs: list[subprocess.Popen] = []

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, **kw)

    def vsctl(self, *args: str, timeout: int = 30) -> subprocess.CompletedProcess:
        return self.run(["ovs-vsctl", f"--timeout={timeout}", *args])

    def appctl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """`ovs-appctl` to ovs-vswitchd (ours by its control socket, else the system's)."""
        target = ["-t", str(self.rundir / "ovs-vswitchd.ctl")] if self.owned else []
        return self.run(["ovs-appctl", *target, *args], **kw)

    def start(self, rundir: Path) -> None:
        self.env = dict(os.environ)  # now with the engine's mark, which the daemons inherit
        # absent daemons fail at once; running ones may answer slowly (software emulation)
        if self.vsctl("show", timeout=30).returncode == 0:
            return
        rundir.mkdir(parents=True, exist_ok=True)
        self.rundir, self.owned = rundir, True
        self.env.update(OVS_RUNDIR=str(rundir), OVS_DBDIR=str(rundir), OVS_LOGDIR=str(rundir))
        db = rundir / "conf.db"
        r = self.run(["ovsdb-tool", "create", str(db)])
        if r.returncode != 0:
            raise AifabricError(f"Open vSwitch's database could not be made: {_last(r)}")
        self._spawn("ovsdb-server", str(db), f"--remote=punix:{rundir / 'db.sock'}")
        r = self.vsctl("--retry", "--no-wait", "init", timeout=10)
        if r.returncode != 0:
            raise AifabricError(f"ovsdb-server did not start: {self._log('ovsdb-server', r)}")
        vswitchd = self._spawn("ovs-vswitchd", f"unix:{rundir / 'db.sock'}")
        ctl = rundir / "ovs-vswitchd.ctl"
        deadline = time.monotonic() + 10
        while not ctl.exists():
            if vswitchd.poll() is not None or time.monotonic() > deadline:
                raise AifabricError(f"ovs-vswitchd did not start: {self._log('ovs-vswitchd')}")
            time.sleep(0.02)

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        d = self.rundir
        argv = [name, *args, f"--pidfile={d / name}.pid", f"--unixctl={d / name}.ctl",
                f"--log-file={d / name}.log", "-vconsole:off"]  # fmt: skip
        proc = subprocess.Popen(
            argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, cwd=d,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def _log(self, name: str, r: subprocess.CompletedProcess | None = None) -> str:
        path = self.rundir / f"{name}.log"
        lines = path.read_text().strip().splitlines() if path.exists() else []
        err = [ln for ln in lines if "|ERR|" in ln or "|EMER|" in ln]
        return (err or lines or [_last(r) if r is not None else "no log"])[-1]

    def stop(self, cleanup: bool = True) -> None:
        """Stop what `start` started (system daemons are left alone); safe to call twice.

        `cleanup` has ovs-vswitchd delete its datapaths first, which a kernel
        datapath needs (its bridges outlive the daemon). A userspace datapath
        holds nothing outside the process but its bridges' taps (which
        `OvsNetwork.close` deletes), so it is killed outright: on SIGTERM it
        takes tens of milliseconds per port to close what the exit closes anyway.
        """
        running = bool(self.procs) and self.procs[-1].poll() is None
        if running and cleanup:
            self.appctl("exit", "--cleanup", timeout=10)
        elif running:
            self.procs[-1].kill()
        linux.stop_processes(self.procs[::-1])
        self.procs.clear()

    def vswitchd_pid(self) -> int | None:
        if self.owned:
            return self.procs[-1].pid
        pids = _vswitchd_pids()
        return pids[0] if len(pids) == 1 else None

    def describe(self) -> str:
        if self.owned:
            return "private ovsdb-server and ovs-vswitchd, started for this run and stopped after"
        return "the system's ovsdb-server and ovs-vswitchd (already running; left running)"

    def version(self) -> str:
        r = self.run(["ovs-vswitchd", "--version"])
        words = (r.stdout.splitlines() or [""])[0].split()
        return words[-1] if words else ""


def timed_out(r: subprocess.CompletedProcess) -> bool:
    """Whether ovs-vsctl gave up waiting for an answer (its --timeout ends it with SIGALRM)."""
    return r.returncode == -signal.SIGALRM


def probe_datapath(daemons: Daemons) -> str:
    """The kernel datapath ("system") where a probe bridge opens on it, else "netdev".

    A daemon that does not answer in time is an error, not a missing kernel
    module: under software emulation (scripts/vm-lab) ovs-vswitchd took 11 s
    to open the probe bridge on the kernel datapath, and a 10 s limit sent
    that run to the userspace datapath. Where the module is missing the
    bridge fails at once, so the long limit costs nothing there.
    """
    r = daemons.vsctl(
        "--may-exist", "add-br", PROBE_BRIDGE, "--", "set", "bridge", PROBE_BRIDGE,
        "datapath_type=system", timeout=PROBE_TIMEOUT_S,
    )  # fmt: skip
    # a bridge that opened has its local port numbered; ovs-vsctl does not always say it failed
    port = daemons.vsctl("get", "interface", PROBE_BRIDGE, "ofport", timeout=PROBE_TIMEOUT_S)
    daemons.vsctl("--if-exists", "del-br", PROBE_BRIDGE, timeout=PROBE_TIMEOUT_S)
    if timed_out(r) or timed_out(port):
        raise AifabricError(
            f"Open vSwitch did not answer the kernel datapath probe within {PROBE_TIMEOUT_S} s"
        )
    opened = r.returncode == 0 and port.stdout.strip() == str(OFPP_LOCAL)
    return "system" if opened else "netdev"


def packet_socket_inodes(pid: int) -> list[int]:
    """Inodes of the unbound raw AF_PACKET sockets process `pid` holds (its send socket)."""
    unbound = set()
    for line in Path("/proc/net/packet").read_text().splitlines()[1:]:
        words = line.split()  # sk RefCnt Type Proto Iface R Rmem User Inode
        if len(words) >= 9 and words[2] == "3" and words[4] == "0":
            unbound.add(int(words[8]))
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:[") and int(target[8:-1]) in unbound:
                held.append(int(fd.name))
    return held


def widen_send_buffer(pid: int, nbytes: int = SEND_BUFFER_BYTES) -> int:
    """Set the send buffer of the packet socket ovs-vswitchd sends with; returns its new size.

    The socket belongs to `pid`: a duplicate of its descriptor is taken with
    pidfd_getfd(2) and given SO_SNDBUFFORCE, which needs root.
    """
    fds = packet_socket_inodes(pid)
    if len(fds) != 1:
        raise OSError(f"ovs-vswitchd holds {len(fds)} unbound packet sockets, not 1")
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, fds[0], 0)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd failed")
    finally:
        os.close(pidfd)
    with socket.socket(fileno=fd) as sock:
        sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, nbytes)
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)


def _last(r: subprocess.CompletedProcess) -> str:
    return (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["failed"])[-1]


# the network ----------------------------------------------------------------------------------
class OvsNetwork(Network):
    """A Network whose switches are Open vSwitch bridges in the root namespace."""

    def __init__(self, fabric: Fabric, plan: Plan, routing: Routing, workdir: Path | None = None):
        super().__init__(fabric, plan, workdir)
        self.routing = routing
        self.daemons = Daemons()
        self.datapath: str | None = None
        self.bridges: list[str] = []
        self.send_buffer: int | None = None
        self.send_buffer_note = ""

    @classmethod
    def for_scenario(cls, scenario, plan: Plan) -> OvsNetwork:
        return cls(scenario.fabric, plan, initial_routing(scenario))

    def fault_actions(self, fault, before, earlier=()):
        """As the routers', with `mod-group` for every select group the fault changes."""
        f, p = self.fabric, self.plan
        after = routing_after(fault, before)
        lines = link_lines(p, f, fault, earlier)
        actions = [(n, partial(self.ip_batch, n, b)) for n, b in lines.items()]
        rerouted = 0
        for s in (int(x) for x in f.switch_ids):
            if s in after.failed_nodes:
                continue
            specs = group_changes(p, f, before, after, s)
            if specs:
                rerouted += 1
                actions.append((s, partial(self._mod_groups, s, specs)))
        return after, actions, rerouted

    def _mod_groups(self, switch: int, specs: list[str]) -> str | None:
        br = self.plan.node_short[switch]
        for spec in specs:
            r = self.daemons.run(["ovs-ofctl", "-O", OPENFLOW, "mod-group", br, spec])
            if r.returncode != 0:
                return f"{br}: {_last(r)}"
        return None

    def in_namespace(self, node: int) -> bool:
        return self.fabric.node_role[node] == Role.NIC

    def build(self) -> None:
        super().build()
        t0 = time.perf_counter()
        f, p = self.fabric, self.plan
        switches = [int(s) for s in f.switch_ids]
        links = [line for s in switches for line in switch_link_lines(p, f, s)]
        r = subprocess.run(
            ["ip", "-batch", "-"], input="\n".join(links) + "\n", capture_output=True, text=True
        )
        if r.returncode != 0:
            raise AifabricError(f"bringing up the switch ports failed: {_last(r)}")
        self.check()
        self.daemons.start(self.workdir / "ovs")
        self.datapath = probe_datapath(self.daemons)
        self.check()
        self.bridges = [p.node_short[s] for s in switches]
        r = self.daemons.vsctl(*bridge_args(p, f, self.datapath), timeout=60)
        if r.returncode != 0:
            raise AifabricError(
                f"Open vSwitch could not make the bridges ({self.datapath} datapath): {_last(r)}"
            )

        def install(s: int):
            groups, flows = bridge_rules(p, f, self.routing, s)
            br = p.node_short[s]
            for what, lines in (("add-groups", groups), ("add-flows", flows)):
                path = self.workdir / f"{br}.{what}"
                path.write_text("\n".join(lines) + "\n")
                r = self.daemons.run(["ovs-ofctl", "-O", OPENFLOW, what, br, str(path)])
                if r.returncode != 0:
                    return f"{f.node_name[s]} ({br}): {_last(r)}"
            return None

        self.check()
        with ThreadPoolExecutor(max_workers=8) as pool:
            errors = [e for e in pool.map(install, switches) if e]
        self.check()
        if errors:
            raise AifabricError(f"installing the OpenFlow rules failed on {errors[0]}")
        if self.datapath == "netdev":
            self._widen_send_buffer()
        self.timings["ovs_s"] = time.perf_counter() - t0

    def _widen_send_buffer(self) -> None:
        """See the module docstring; the socket exists once ovs-vswitchd has sent a packet."""
        f, p = self.fabric, self.plan
        q = int(f.ports_of(int(f.switch_ids[0]))[0])
        frame = bytes.fromhex(p.port_mac[q ^ 1].replace(":", "") + p.port_mac[q].replace(":", ""))
        frame += bytes.fromhex("88b5") + bytes(46)  # local experimental type: the peer drops it
        self.daemons.run(
            ["ovs-ofctl", "-O", OPENFLOW, "packet-out", p.node_short[int(f.port_node[q])],
             f"in_port=controller,packet={frame.hex()},actions=output:{ofport(f, q)}"]
        )  # fmt: skip
        pid = self.daemons.vswitchd_pid()
        try:
            if pid is None:
                raise OSError("ovs-vswitchd's process is not known")
            self.send_buffer = widen_send_buffer(pid)
        except OSError as e:
            self.send_buffer = None
            self.send_buffer_note = (
                f"ovs-vswitchd's send buffer stays at the default ({e}): packets that do not "
                "fit are dropped where no qdisc counts them"
            )

    def script(self, cfg: NodeConfig) -> str:
        f = self.fabric
        if f.node_role[cfg.node] != Role.NIC:
            # no addresses, routes or sysctls: the bridge forwards; only links and queues
            return super().script(
                replace(cfg, sysctl=(), ip=switch_link_lines(self.plan, f, cfg.node))
            )
        line = super().script(cfg)
        if self.datapath == "netdev":
            dev = self.plan.port_iface[int(f.nic_port[cfg.node])]
            line += f" && ethtool -K {dev} tx off"
        return line

    def egress(self, switch: int, queries: list[tuple[int, int, str, int]]) -> list[str | None]:
        """Where the bridge sends each query, as `ovs-appctl ofproto/trace` works it out."""
        f, p = self.fabric, self.plan
        br = p.node_short[switch]
        ports = [int(q) for q in f.ports_of(switch)]
        iface_of = {ofport(f, q): p.port_iface[q] for q in ports}
        in_port = {p.port_iface[q]: ofport(f, q) for q in ports}
        out: list[str | None] = []
        for dst, src, iif, sport in queries:
            r = self.daemons.appctl("ofproto/trace", br, trace_flow(in_port[iif], dst, src, sport))
            out.append(iface_of.get(traced_port(r.stdout)) if r.returncode == 0 else None)
        return out

    def describe(self) -> dict:
        return {
            "kind": "ovs",
            "forwarding": "Open vSwitch bridges, OpenFlow select groups hashing "
            f"({HASH_FIELDS[self.plan.hash_policy]}) with the switch's seed",
            "datapath": self.datapath,
            "datapath_meaning": DATAPATHS.get(self.datapath or "", ""),
            "daemons": self.daemons.describe(),
            "version": self.daemons.version(),
            "send_buffer_bytes": self.send_buffer,
            **({"send_buffer_note": self.send_buffer_note} if self.send_buffer_note else {}),
        }

    def close(self) -> None:
        t0 = time.perf_counter()
        bridges, self.bridges = self.bridges, []
        if bridges and not self.daemons.owned:  # a private ovs-vswitchd takes its bridges along
            self.daemons.vsctl(*[w for br in bridges for w in ("--", "del-br", br)], timeout=10)
        self.daemons.stop(cleanup=self.datapath != "netdev")
        super().close()
        # veths between two bridges live in the root namespace, which does not die with a
        # shell; so do the userspace datapath's taps (its bridges' and its own), which it
        # leaves persistent
        f, p = self.fabric, self.plan
        gone = [f"link del dev {p.port_iface[int(q)]}" for s in f.switch_ids for q in f.ports_of(s)]
        gone += [f"link del dev {br}" for br in bridges]
        if self.daemons.owned and self.datapath == "netdev":
            gone.append(f"link del dev {NETDEV_TAP}")
        subprocess.run(
            ["ip", "-force", "-batch", "-"],
            input="\n".join(gone) + "\n",
            capture_output=True,
            text=True,
        )
        self.timings["teardown_s"] = time.perf_counter() - t0


# cleanup of a killed run ---------------------------------------------------------------------
def our_bridges() -> list[str]:
    """Bridges named like ours in the system's Open vSwitch (private daemons die with theirs)."""
    if shutil.which("ovs-vsctl") is None:
        return []
    r = subprocess.run(["ovs-vsctl", "--timeout=2", "list-br"], capture_output=True, text=True)
    if r.returncode != 0:
        return []
    return [b for b in r.stdout.split() if b.startswith(PREFIX)]


def stale_datapath() -> str | None:
    """The kernel datapath a killed private ovs-vswitchd left behind, if every port on it is ours.

    Bridges of the kernel datapath outlive their daemon; with no ovs-vswitchd
    running at all and nothing but our ports on it, nobody else can be using it.
    """
    if shutil.which("ovs-dpctl") is None or _vswitchd_pids():
        return None
    r = subprocess.run(["ovs-dpctl", "show"], capture_output=True, text=True)
    dps = re.findall(r"^(\S+@\S+):", r.stdout, re.MULTILINE) if r.returncode == 0 else []
    ports = re.findall(r"port \d+: (\S+)", r.stdout)
    if dps == ["system@ovs-system"] and all(
        q == "ovs-system" or q.startswith(PREFIX) for q in ports
    ):
        return dps[0]
    return None


def stale_netdev_tap() -> str | None:
    """The userspace datapath's tap a stopped or killed ovs-vswitchd left behind, if any.

    With no ovs-vswitchd running nobody has it open, and an ovs-vswitchd that
    starts makes it again.
    """
    if not Path(f"/sys/class/net/{NETDEV_TAP}").exists() or _vswitchd_pids():
        return None
    return NETDEV_TAP


def _vswitchd_pids() -> list[int]:
    """Live ovs-vswitchd processes (a killed one waiting to be reaped is no longer one)."""
    return [pid for pid in linux.live_processes() if linux.process_name(pid) == "ovs-vswitchd"]


def remove_bridges(names: list[str]) -> None:
    if names:
        args = [w for br in names for w in ("--", "--if-exists", "del-br", br)]
        subprocess.run(["ovs-vsctl", "--timeout=10", *args], capture_output=True)
