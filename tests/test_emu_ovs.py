"""Open vSwitch as the emulator's switches (`--switch ovs`): rules as data, then real runs (root).

Traffic stays inside namespaces the tests made; the bridges live in the root
namespace under our `af` names and are gone afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.emu import available, ovs
from aifabric.emu import plan as P
from aifabric.fabric.addressing import format_ipv4
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.model import Role
from aifabric.fabric.scenario import Fault


def _scenario(workload, **tables):
    from aifabric.scenarios import scenario_from_dict

    raw = {
        "scenario": {"topology": "lab-small"},
        "workload": workload,
        "congestion_control": {"kind": "none"},
        **tables,
    }
    return scenario_from_dict(raw, "emu-ovs-test")


PERMUTATION = {"pattern": "permutation", "gpus": 16, "size": "64KiB"}


# rules as data (no root) ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    sc = _scenario(PERMUTATION)
    return sc, P.plan(sc, ecn="none"), ovs.initial_routing(sc)


def test_groups_are_the_routing_next_hops_with_the_link_macs(small):
    sc, pl, routing = small
    f = sc.fabric
    nics = [int(n) for n in f.nic_ids]
    for s in (int(x) for x in f.switch_ids):
        groups, flows = ovs.bridge_rules(pl, f, routing, s)
        assert len(groups) == len(nics) and len(flows) == len(nics) + 1
        assert flows[-1] == "priority=0,actions=drop"
        for g, (group, flow, dst) in enumerate(zip(groups, flows, nics, strict=False), start=1):
            assert flow == f"priority=10,ip,nw_dst={format_ipv4(pl.nic_ip[dst])},actions=group:{g}"
            assert group.startswith(f"group_id={g},type=select,selection_method=hash,")
            assert f"selection_method_param={int(pl.hash_seed[s])}," in group
            buckets = group.split("bucket=")[1:]
            hops = [int(h) for h in routing.next_hops(s, dst)]
            assert len(buckets) == len(hops)
            for b, h in zip(buckets, hops, strict=True):
                out = ovs.ofport(f, h)
                assert f"watch_port:{out}," in b and b.rstrip(",").endswith(f"output:{out}")
                assert f"set_field:{pl.port_mac[h]}->eth_src" in b
                assert f"set_field:{pl.port_mac[h ^ 1]}->eth_dst" in b
                assert "dec_ttl" in b


def test_the_hash_follows_the_ecmp_policy():
    sc = _scenario(PERMUTATION)
    pinned = _scenario(PERMUTATION, ecmp={"policy": "pinned"})
    for s, want in ((sc, "fields(ip_src,ip_dst,nw_proto,udp_src,udp_dst)"),
                    (pinned, "fields(ip_src,ip_dst)")):  # fmt: skip
        pl = P.plan(s, ecn="none")
        groups, _ = ovs.bridge_rules(
            pl, s.fabric, ovs.initial_routing(s), int(s.fabric.nic_switch[0])
        )
        assert all(want + "," in g for g in groups)


def test_a_switch_down_at_time_zero_leaves_no_bucket_towards_it(small):
    sc, _, _ = small
    f = sc.fabric
    spine = int(f.switch_ids[-1])
    down = replace(sc, faults=(Fault("node", spine),))
    pl = P.plan(down, ecn="none")
    dead = {
        ovs.ofport(f, int(q)) for q in f.ports_of(int(f.switch_ids[0])) if f.port_peer[q] == spine
    }
    groups, _ = ovs.bridge_rules(pl, f, ovs.initial_routing(down), int(f.switch_ids[0]))
    assert dead and not any(
        f"output:{q}," in g or g.endswith(f"output:{q}") for g in groups for q in dead
    )


def test_bridges_keep_the_plans_qdiscs_and_number_ports_from_one(small):
    sc, pl, _ = small
    f = sc.fabric
    args = ovs.bridge_args(pl, f, "netdev")
    assert args[:5] == ["--", "--id=@noop", "create", "qos", "type=linux-noop"]
    for s in f.switch_ids:
        br = pl.node_short[int(s)]
        assert args.count(br) >= 1 + len(f.ports_of(int(s)))
        for q in f.ports_of(int(s)):
            i = args.index(pl.port_iface[int(q)])
            assert args[i - 2 : i + 2] == ["add-port", br, pl.port_iface[int(q)], "qos=@noop"]
            assert f"ofport_request={int(f.port_number[q]) + 1}" in args[i : i + 7]
    assert args.count("datapath_type=netdev") == len(f.switch_ids)


def test_a_trace_names_the_port_the_packet_leaves_by():
    trace = """Flow: udp,in_port=1,nw_src=10.0.0.1,nw_dst=10.0.3.2,tp_src=5000,tp_dst=4791

bridge("afs0")
--------------
 0. ip,nw_dst=10.0.3.2, priority 10
    group:12
     -> using bucket 2
    bucket 2
            dec_ttl
            set_field:02:af:00:00:00:24->eth_src
            output:7

Final flow: unchanged
Datapath actions: set(eth(src=02:af:00:00:00:24)),set(ipv4(ttl=63)),3
"""
    assert ovs.traced_port(trace) == 7
    assert ovs.traced_port(trace.replace("output:7", "drop")) is None
    flow = ovs.trace_flow(3, int(P.P2P_BASE), int(P.P2P_BASE) + 1, 5000)
    assert (
        flow
        == "in_port=3,udp,nw_src=100.64.0.1,nw_dst=100.64.0.0,udp_src=5000,udp_dst=4791,nw_ttl=64"
    )


def test_a_fault_mid_run_changes_exactly_the_groups_that_used_it(small):
    sc, pl, routing = small
    f = sc.fabric
    leaf, spine = int(f.switch_ids[0]), int(f.switch_ids[-1])
    link = next(int(q) // 2 for q in f.ports_of(leaf) if f.port_peer[q] == spine)
    fault = Fault("link", link, at_ns=1000)
    after = P.routing_after(fault, routing)
    dead = f"output:{ovs.ofport(f, 2 * link if f.link_a[link] == leaf else 2 * link + 1)}"
    changed = ovs.group_changes(pl, f, routing, after, leaf)
    before = ovs.bridge_rules(pl, f, routing, leaf)[0]
    # every group whose buckets led over the link, and only those, loses that bucket
    users = [g for g in before if dead + "," in g or g.endswith(dead)]
    assert len(changed) == len(users) > 0
    assert not any(dead + "," in g or g.endswith(dead) for g in changed)
    assert [g.split(",", 1)[0] for g in changed] == [g.split(",", 1)[0] for g in users]
    # the spine's side: it can still reach the leaf's NICs by its other parallel link
    assert all("bucket=" in g for g in ovs.group_changes(pl, f, routing, after, spine))
    # a switch that loses every path to a NIC gets an empty group for it, which drops
    cut = routing
    for q in f.ports_of(leaf):
        if f.node_role[f.port_peer[q]] != Role.NIC:
            cut = cut.without(links=[int(q) // 2])
    emptied = ovs.group_changes(pl, f, routing, cut, spine)
    assert emptied and all(g.endswith(",type=select") for g in emptied)


def test_switch_is_checked_and_needs_the_mininet_engine(tmp_path):
    from aifabric.emu.net import make_network

    sc = _scenario(PERMUTATION)
    with pytest.raises(AifabricError, match="router, ovs"):
        make_network(sc, P.plan(sc, ecn="none"), "bridge")
    r = CliRunner().invoke(main, ["run", "demo", "--switch", "ovs", "-o", str(tmp_path / "r")])
    assert r.exit_code == 2 and "--engine mininet" in r.output, r.output
    r = CliRunner().invoke(main, ["run", "demo", "--engine", "mininet", "--switch", "hub"])
    assert r.exit_code == 2, r.output


def test_without_open_vswitch_the_reason_is_one_sentence(monkeypatch):
    monkeypatch.setattr(ovs.shutil, "which", lambda name: None if name == "ovs-vsctl" else name)
    reason = ovs.missing()
    assert "openvswitch-switch" in reason and "ovs-vsctl" in reason and reason.count(". ") == 0


class _DaemonsAt(ovs.Daemons):
    """The system's daemons as ovs-vsctl finds them, but at database socket `db`."""

    def __init__(self, db: Path):
        super().__init__()
        self.db = db

    def vsctl(self, *args: str, timeout: int = 30):
        return self.run(["ovs-vsctl", f"--db=unix:{self.db}", f"--timeout={timeout}", *args])


@pytest.mark.skipif(shutil.which("ovs-vsctl") is None, reason="needs ovs-vsctl")
def test_a_datapath_probe_nobody_answers_is_an_error_not_the_userspace_datapath(
    tmp_path, monkeypatch
):
    """Under software emulation ovs-vswitchd took 11 s to open the probe bridge on the
    kernel datapath; a limit that ran out then picked `netdev` although `system` worked."""
    db = tmp_path / "db.sock"
    silent = socket.socket(socket.AF_UNIX)  # accepts the connection, never answers
    silent.bind(str(db))
    silent.listen(4)
    monkeypatch.setattr(ovs, "PROBE_TIMEOUT_S", 1)
    try:
        with pytest.raises(AifabricError, match="did not answer the kernel datapath probe"):
            ovs.probe_datapath(_DaemonsAt(db))
    finally:
        silent.close()


def test_the_probe_reads_the_datapath_from_the_bridges_local_port(monkeypatch):
    answers = {}

    class Fake(ovs.Daemons):
        def vsctl(self, *args, timeout=30):
            out = answers["ofport"] if args[:1] == ("get",) else ""
            return subprocess.CompletedProcess(args, answers["rc"], out, "")

    for rc, port, want in ((0, "65534\n", "system"), (0, "-1\n", "netdev"), (1, "", "netdev")):
        answers.update(rc=rc, ofport=port)
        assert ovs.probe_datapath(Fake()) == want


# real runs (root) -------------------------------------------------------------------------------
_WHY = "the Mininet engine tests need root" if os.geteuid() != 0 else available("ovs")
needs_ovs = pytest.mark.skipif(_WHY is not None, reason=str(_WHY))


def _nothing_left():
    from aifabric.emu.clean import leftovers
    from aifabric.emu.net import TMP_PREFIX

    left = leftovers()
    assert not any(left.values()), left
    # leftovers() passes over processes marked by this very process: find daemons by their path
    ours = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and d.name != str(os.getpid()):
            try:
                if f"/{TMP_PREFIX}".encode() in (d / "cmdline").read_bytes():
                    ours.append(int(d.name))
            except OSError:
                continue
    assert not ours, ours


def _tx_packets() -> dict[str, int]:
    """Packets sent by every interface of the root namespace, where the bridges' ports are."""
    r = subprocess.run(["ip", "-s", "-j", "link", "show"], capture_output=True, text=True)
    return {i["ifname"]: i["stats64"]["tx"]["packets"] for i in json.loads(r.stdout)}


@pytest.mark.root
@needs_ovs
def test_lab_small_builds_and_observed_paths_are_where_packets_go():
    """Each inter-rack flow's packets leave by exactly the bridge ports the traces name."""
    from aifabric.emu.engine import observed_paths
    from aifabric.emu.net import make_network
    from tests.emuhelp import paths_are_where_packets_go

    sc = _scenario(PERMUTATION)
    pl = P.plan(sc, ecn="none")
    net = make_network(sc, pl, "ovs")
    try:
        net.build()
        net.apply()
        about = net.describe()
        assert about["kind"] == "ovs" and about["datapath"] in ovs.DATAPATHS
        ptr, links = observed_paths(net, sc)
        checked = paths_are_where_packets_go(net, sc, ptr, links, _tx_packets)
        assert checked >= 8
    finally:
        net.close()
    _nothing_left()


def _ovs_run(tmp_path, sc):
    """Run `sc` with Open vSwitch switches; it completed, delivered every byte, left nothing."""
    from aifabric.engines import run_scenario
    from aifabric.fabric.rundir import Run

    summary = run_scenario(
        "mininet", sc, tmp_path / "run", options={"timeout_s": 120, "switch": "ovs"}
    )
    _nothing_left()
    run = Run(tmp_path / "run")
    assert run.status == "complete", run.meta["message"]
    assert summary["bytes_received"] == int(sc.flows.bytes.sum())
    return summary, run


@pytest.mark.root
@needs_ovs
def test_ring_allreduce_delivers_every_byte(tmp_path):
    sc = _scenario({"collective": "allreduce", "algorithm": "ring", "size": "512KiB", "gpus": 16})
    summary, run = _ovs_run(tmp_path, sc)
    assert summary["drops"] == 0
    flows = run.flows()
    ft = sc.flows
    for i in range(len(ft)):
        deps = ft.deps_of(i)
        if len(deps):
            assert flows["start_ns"][i] >= flows["end_ns"][deps].max()
    links = flows["path_link"]
    assert len(links) >= 2 * len(ft)  # every flow has its observed path
    switch = run.meta["results"]["emulation"]["switch"]
    assert switch["kind"] == "ovs" and switch["datapath"] in ovs.DATAPATHS
    if switch["datapath"] == "netdev":
        assert switch["send_buffer_bytes"] >= ovs.SEND_BUFFER_BYTES


@pytest.mark.root
@needs_ovs
def test_a_switch_failing_mid_run_is_routed_around_by_the_groups(tmp_path):
    import numpy as np

    sc = _scenario(
        {"pattern": "permutation", "gpus": 16, "size": "1MiB"},
        faults=[{"node": "z0-ctsw1", "at": "30us", "action": "down"}],
    )
    f = sc.fabric
    summary, run = _ovs_run(tmp_path, sc)
    (fault,) = summary["faults"]
    assert fault["switches_rerouted"] == 4 and fault["applied_ns"] >= 30_000
    ctsw1 = f.node_name.index("z0-ctsw1")
    mine = np.array([int(p) for q in f.ports_of(ctsw1) for p in (int(q), int(q) ^ 1)])
    ports = run.ports()
    cols = np.isin(ports["port"], mine)
    after = ports["t_ns"] >= fault["settled_ns"] + ports["interval_ns"]
    assert after.any() and ports["tx_bytes"][after][:, cols].sum() == 0


KILLED = """
import time
from aifabric.scenarios import scenario_from_dict
from aifabric.emu.net import make_network
from aifabric.emu.plan import plan
raw = {"scenario": {"topology": "lab-small"}, "workload": {"pattern": "permutation", "gpus": 16},
       "congestion_control": {"kind": "none"}}
sc = scenario_from_dict(raw, "killed")
net = make_network(sc, plan(sc, ecn="none"), "ovs")
net.build()
net.apply()
print("ready", net.daemons.owned, flush=True)
time.sleep(600)
"""


@pytest.mark.root
@needs_ovs
def test_sigkill_then_clean_leaves_nothing():
    from tests.emuhelp import killed_then_cleaned

    words, left = killed_then_cleaned(KILLED)
    assert words[0] == "ready"
    assert left["processes"] and left["links"]
    if words[1] == "False":  # the system's daemons hold our bridges
        assert left["bridges"]
    _nothing_left()
