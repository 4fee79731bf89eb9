"""A plan made real: Mininet hosts for every node, veth links, then the plan applied in one place.

Mininet gives each node (NIC or switch) its own network namespace and a
shell, and each fabric link a veth pair named after the plan. Switches are
routers: Linux hosts with IP forwarding and multipath routes (or, with
`make_network(..., "ovs")`, Open vSwitch bridges: see aifabric.emu.ovs). Everything
else (addresses, routes, neighbours, sysctls, qdiscs, eBPF markers) comes
from the plan's `ip -batch`, `tc -batch` and sysctl lines, run in each
node's namespace by `apply()`. `close()` undoes it all and is safe to call
twice and on a half-built network.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from aifabric.emu import linux
from aifabric.emu.plan import NodeConfig, Plan, ecn_object_key, fault_lines, route_get_line
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import EMULATOR_POLICY

TMP_PREFIX = "aifabric-emu-"
# in the run's temporary directory: the run process's `linux.identity`, by which `aifabric
# clean` finds what it forked without exec, should a kill leave one behind
RUN_PROCESS = "run-process.json"
SWITCHES = tuple(EMULATOR_POLICY)  # the kinds of emulated switch, each with its hash policy


class Network:
    def __init__(self, fabric: Fabric, plan: Plan, workdir: Path | None = None):
        self.fabric = fabric
        self.plan = plan
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=TMP_PREFIX))
        if self._own_dir:
            (self.workdir / RUN_PROCESS).write_text(json.dumps(linux.identity()))
        self.net = None
        self.pid: dict[int, int] = {}  # node id -> pid of its shell (its namespace)
        self.processes: list[subprocess.Popen] = []
        self.timings: dict[str, float] = {}
        # raises if the run was asked to stop (the engine's Stop.check). A signal's
        # Interrupted can be lost, raised in a finalizer that runs at that moment, so
        # the build asks between its steps as well
        self.check: Callable[[], None] = lambda: None

    # build ---------------------------------------------------------------------------
    def build(self) -> None:
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import Host

        from aifabric.emu.clean import our_links

        left = sorted(our_links())
        if left:
            shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
            raise AifabricError(
                f"interfaces named like this engine's are in the way ({shown}): another run "
                "is going on, or a killed one left them (`sudo aifabric clean` removes them)"
            )
        setLogLevel("error")
        os.environ[linux.ENV_MARK] = str(os.getpid())
        t0 = time.perf_counter()
        net = Mininet(
            topo=None, build=False, controller=None, host=Host, link=Link, waitConnected=False
        )
        self.net = net
        f, p = self.fabric, self.plan
        for v in range(f.n_nodes):
            self.check()
            net.addHost(p.node_short[v], ip=None, inNamespace=self.in_namespace(v))
        for link in range(f.n_links):
            self.check()
            a, b = 2 * link, 2 * link + 1
            net.addLink(
                p.node_short[int(f.link_a[link])],
                p.node_short[int(f.link_b[link])],
                intfName1=p.port_iface[a],
                intfName2=p.port_iface[b],
                addr1=p.port_mac[a],
                addr2=p.port_mac[b],
            )
        for v in range(f.n_nodes):
            self.pid[v] = net[p.node_short[v]].pid
        self.timings["mininet_s"] = time.perf_counter() - t0

    def compile_markers(self) -> dict[str, str]:
        """Compile one eBPF marker per distinct (rate, Kmin, Kmax, Pmax) on switch ports."""
        f, p = self.fabric, self.plan
        out: dict[str, str] = {}
        for port in range(f.n_ports):
            role = Role(int(f.node_role[f.port_node[port]]))
            if role == Role.NIC:
                continue
            e = f.queue(role).ecn
            if not e.enabled:
                continue
            rate = int(p.port_rate_bps[port])
            key = ecn_object_key(rate, e.kmin_bytes, e.kmax_bytes, e.pmax)
            if key not in out:
                obj = linux.compile_marker(
                    self.workdir, key, rate, e.kmin_bytes, e.kmax_bytes, e.pmax
                )
                out[key] = str(obj)
        return out

    def in_namespace(self, node: int) -> bool:
        """Whether `node` gets a namespace of its own (routers do; Open vSwitch bridges do not)."""
        return True

    def script(self, cfg: NodeConfig) -> str:
        """The shell line that configures one node: its sysctls, `ip -batch` and `tc -batch`."""
        ip_file = self.workdir / f"{cfg.name}.ip"
        tc_file = self.workdir / f"{cfg.name}.tc"
        ip_file.write_text("\n".join(cfg.ip) + "\n")
        tc_file.write_text("\n".join(cfg.tc) + "\n")
        steps = [f"ip -batch {ip_file}", f"tc -batch {tc_file}"]
        if cfg.sysctl:
            steps.insert(0, "sysctl -q -w " + " ".join(f"{k}={v}" for k, v in cfg.sysctl))
        return " && ".join(steps)

    def apply(self) -> None:
        """Run every node's configuration (see `script`) in its namespace."""
        t0 = time.perf_counter()
        scripts = [(cfg, self.script(cfg)) for cfg in self.plan.nodes]

        def run(item):
            cfg, script = item
            r = linux.in_netns(self.pid[cfg.node], ["sh", "-c", script])
            return cfg, r

        with ThreadPoolExecutor(max_workers=8) as pool:
            for cfg, r in pool.map(run, scripts):
                self.check()
                if r.returncode != 0:
                    err = (r.stderr.strip().splitlines() or ["failed"])[-1]
                    raise AifabricError(f"configuring {cfg.fabric_name} ({cfg.name}) failed: {err}")
        self.timings["apply_s"] = time.perf_counter() - t0

    # use --------------------------------------------------------------------------------
    def run(self, node: int, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return linux.in_netns(self.pid[node], argv, **kw)

    def popen(self, node: int, argv: list[str], **kw) -> subprocess.Popen:
        proc = linux.popen_in_netns(self.pid[node], argv, **kw)
        self.processes.append(proc)
        return proc

    def egress(self, switch: int, queries: list[tuple[int, int, str, int]]) -> list[str | None]:
        """The interface `switch` sends each (dst ip, src ip, in interface, UDP sport) out of.

        Asked of the router's kernel with `ip route get`, one batch per switch;
        None where it has no route.
        """
        lines = [route_get_line(d, s, iif, sport)[3:] for d, s, iif, sport in queries]
        r = self.run(switch, ["ip", "-o", "-batch", "-"], input="\n".join(lines) + "\n")
        out: list[str | None] = []
        for line in r.stdout.splitlines()[: len(queries)]:
            words = line.split()
            out.append(words[words.index("dev") + 1] if "dev" in words else None)
        return out + [None] * (len(queries) - len(out))

    def describe(self) -> dict:
        """What the switches are, for run.json."""
        return {"kind": "router", "forwarding": "Linux IP forwarding, multipath routes"}

    def fault_actions(self, fault, before, earlier=()):
        """(routing after `fault`, [(node, apply)], switches re-routed) for a fault mid-run
        after the faults `earlier`.

        Worked out ahead of time; each `apply()` makes one node's change and
        returns an error sentence or None.
        """
        after, lines = fault_lines(self.plan, self.fabric, fault, before, earlier)
        rerouted = sum(1 for b in lines.values() if any(x.startswith("route") for x in b))
        return after, [(n, partial(self.ip_batch, n, b)) for n, b in lines.items()], rerouted

    def ip_batch(self, node: int, lines: list[str]) -> str | None:
        r = self.run(node, ["ip", "-batch", "-"], input="\n".join(lines) + "\n")
        if r.returncode != 0:
            return (r.stderr.strip().splitlines() or ["failed"])[-1]
        return None

    # teardown -------------------------------------------------------------------------------
    def close(self) -> None:
        t0 = time.perf_counter()
        linux.stop_processes(self.processes)
        self.processes.clear()
        if self.net is not None:
            from mininet.log import setLogLevel

            setLogLevel("critical")
            net, self.net = self.net, None
            for host in net.hosts:
                host.terminate()
            for link in net.links:
                with contextlib.suppress(Exception):  # its namespace may be gone already
                    link.delete()
            for host in net.hosts:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(host.pid, os.WNOHANG)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        os.environ.pop(linux.ENV_MARK, None)
        self.timings["teardown_s"] = time.perf_counter() - t0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_network(scenario, plan: Plan, switch: str = "router") -> Network:
    """The network of `scenario` with its switches as Linux routers or Open vSwitch bridges."""
    if switch == "router":
        return Network(scenario.fabric, plan)
    if switch == "ovs":
        from aifabric.emu.ovs import OvsNetwork

        return OvsNetwork.for_scenario(scenario, plan)
    raise AifabricError(f"switch {switch!r} is not one of {', '.join(SWITCHES)}")
