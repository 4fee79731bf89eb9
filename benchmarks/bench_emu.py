"""Mininet engine figures (root): build and teardown time, replay packet rate, sim vs emu.

    sudo .venv/bin/python benchmarks/bench_emu.py [--skip-medium] [--replay-only] [--repeat N]

Prints: build (Mininet + plan applied) and teardown seconds for lab-small
and lab-medium, medians of --repeat runs, with the switches as routers and,
where Open vSwitch is installed, as OVS bridges; the machine's veth ceiling
(one sendmmsg sender, no shaping) and cross-rack ceiling; the start-up
probe's replay capacity; the replay's packets per second (medians of
--repeat) for a ring AllReduce (steps wait for each other) and a
permutation (no dependencies), for each kind of switch, with the replay's CPU
per packet beside the ceiling's (a figure a loaded machine moves less than
the rates); the same small ring
AllReduce in the simulator and the emulator (completion time in fabric
time, bytes per leaf uplink).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path


def scenario(topology, workload, cc="none"):
    from fabric.scenarios import scenario_from_dict

    raw = {"scenario": {"topology": topology}, "workload": workload,
           "congestion_control": {"kind": cc}}  # fmt: skip
    return scenario_from_dict(raw, "bench")


def build_teardown(topology, switch="router"):
    from fabric.emu import linux
    from fabric.emu.net import make_network
    from fabric.emu.plan import plan

    sc = scenario(topology, {"pattern": "permutation", "gpus": 16})
    mech = linux.ecn_mechanism()
    t0 = time.perf_counter()
    pl = plan(sc, ecn=mech)
    net = make_network(sc, pl, switch)
    try:
        net.build()
        if mech == "ebpf":
            net.plan = plan(sc, ecn=mech, scale=pl.scale, ecn_objects=net.compile_markers())
        net.apply()
        built = time.perf_counter() - t0
    finally:
        net.close()
    return built, net.timings["teardown_s"], mech


def flood_rate(across: bool, seconds=1.0):
    """Packets/s one sendmmsg sender pushes (4 KiB payloads), counted where they arrive, and
    the sender's CPU seconds per packet (the forwarding done in its context included).

    `across=False`: through one unshaped veth pair (NIC to its leaf), the
    machine's veth ceiling. `across=True`: from a NIC to a NIC of another
    rack through the built fabric (leaf, spine, leaf: four veths, three
    routers, their HTB/TBF/FIFO queues and ECN markers, rates unscaled), the
    ceiling a replay's cross-rack packets meet.
    """
    from fabric.addressing import format_ipv4
    from fabric.emu import linux
    from fabric.emu.linux import netns_of
    from fabric.emu.net import Network
    from fabric.emu.packets import Batch, fill_writes
    from fabric.emu.plan import plan

    sc = scenario("lab-small", {"pattern": "permutation", "gpus": 16})
    mech = linux.ecn_mechanism() if across else "none"
    pl = plan(sc, ecn=mech, scale=1)
    net = Network(sc.fabric, pl)
    try:
        net.build()
        if mech == "ebpf":
            net.plan = pl = plan(sc, ecn=mech, scale=1, ecn_objects=net.compile_markers())
        net.apply()
        f = sc.fabric
        nic = int(f.nic_ids[0])
        dev = pl.port_iface[int(f.nic_port[nic])]
        net.run(nic, ["tc", "qdisc", "del", "dev", dev, "root"])
        if across:
            far = next(int(n) for n in f.nic_ids if f.node_rack[n] != f.node_rack[nic])
            to, where, rx_dev = format_ipv4(pl.nic_ip[far]), far, pl.port_iface[f.nic_port[far]]
        else:
            to, where = "100.64.0.1", int(f.port_peer[int(f.nic_port[nic])])
            rx_dev = pl.port_iface[int(f.nic_port[nic]) ^ 1]
        with netns_of(net.pid[nic]):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        dest = (int(ipaddress.IPv4Address(to)), 9)
        batch = Batch(64, 4200)
        k = fill_writes(batch.buf, batch.lens, 0, 1, 0, 0, 64 * 4096, 4096)

        def rx():
            out = net.run(where, ["ip", "-s", "-j", "link", "show", "dev", rx_dev])
            return int(json.loads(out.stdout)[0]["stats64"]["rx"]["packets"])

        r0 = rx()
        t0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            batch.send(s, k, dest)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        s.close()
        got = rx() - r0
        return got / dt, cpu / max(got, 1)
    finally:
        net.close()


def run_emu(sc, scale=None, switch="router"):
    from fabric.engines import run_scenario
    from fabric.rundir import Run

    d = Path(tempfile.mkdtemp(prefix="bench-emu-run-"))
    options = {"scale": scale, "switch": switch}
    summary = run_scenario("mininet", sc, d / "run", options=options)
    return summary, Run(d / "run")


def run_sim(sc):
    from fabric.engines import run_scenario
    from fabric.rundir import Run

    d = Path(tempfile.mkdtemp(prefix="bench-sim-run-"))
    summary = run_scenario("sim", sc, d / "run")
    return summary, Run(d / "run")


def uplink_bytes(run, fabric):
    from fabric.model import Role

    p = run.ports()
    total = p["tx_bytes"].sum(axis=0)
    out = {}
    for col, port in enumerate(p["port"]):
        node, peer = fabric.port_node[port], fabric.port_peer[port]
        if fabric.node_role[node] == Role.RTSW and fabric.node_role[peer] == Role.CTSW:
            out[int(port)] = int(total[col])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-medium", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="builds per figure (the median)")
    ap.add_argument(
        "--replay-only",
        action="store_true",
        help="only the cross-rack ceiling and the replay rates, with routers",
    )
    args = ap.parse_args()
    from fabric.emu import available

    reason = available()
    if reason:
        print(f"skipped: {reason}")
        return 0
    switches = ["router"]
    if args.replay_only:
        pass
    elif available("ovs") is None:
        switches.append("ovs")
    else:
        print(f"router only: {available('ovs')}")
    topos = () if args.replay_only else ("lab-small",)
    for topo in topos + (() if args.skip_medium or args.replay_only else ("lab-medium",)):
        for switch in switches:
            runs = [build_teardown(topo, switch) for _ in range(args.repeat)]
            b = statistics.median(r[0] for r in runs)
            t = statistics.median(r[1] for r in runs)
            print(
                f"{topo:<11} {switch:<6} build {b:6.2f} s  teardown {t:5.2f} s  "
                f"(ECN: {runs[0][2]}; median of {len(runs)})"
            )
    ceiling, _ = flood_rate(across=False)
    print(f"veth ceiling        {ceiling:10,.0f} packets/s (4 KiB payload, one sender)")
    path, path_cpu = flood_rate(across=True)
    print(
        f"cross-rack ceiling  {path:10,.0f} packets/s (NIC to NIC over leaf, spine, leaf; "
        f"{path_cpu * 1e6:.1f} us of CPU a packet)"
    )
    from fabric.emu.replay import capacity_pps

    print(f"replay capacity     {capacity_pps():10,.0f} packets/s (the start-up probe's figure)")
    ring = {"collective": "allreduce", "algorithm": "ring", "size": "4MiB", "gpus": 16}
    perm = {"pattern": "permutation", "size": "8MB", "gpus": 16}
    for label, workload in (("ring", ring), ("perm", perm)):
        sc = scenario("lab-small", workload)
        for switch in switches:
            rates, cpus = [], []
            for _ in range(args.repeat):
                s, _ = run_emu(sc, scale=50, switch=switch)
                rates.append(s["packets_sent"] / s["replay_wall_s"])
                cpus.append(s["replay_cpu_s"] / max(s["packets_sent"], 1))
            pps = statistics.median(rates)
            print(
                f"replay {label} {switch:<6} (scale 50) {pps:10,.0f} packets/s  "
                f"({pps / ceiling:.0%} of the veth ceiling, {pps / path:.0%} of the cross-rack "
                f"one; {statistics.median(cpus) * 1e6:.1f} us of CPU a packet; "
                f"{s['replay_processes']} processes; median of {len(rates)}; "
                f"load {os.getloadavg()[0]:.1f})"
            )
    if args.replay_only:
        return 0
    sc = scenario("lab-small", {**ring, "size": "1MiB"})
    es, erun = run_emu(sc)
    ss, srun = run_sim(sc)
    print(f"{'lab-small ring AllReduce 1 MiB':<32}{'sim':>14}{'mininet':>14}")
    print(
        f"{'completion (fabric time)':<32}{ss['completion_ns']:>12,}ns{es['completion_ns']:>12,}ns"
    )
    su, eu = uplink_bytes(srun, sc.fabric), uplink_bytes(erun, sc.fabric)
    for port in sorted(su):
        name = (
            f"{sc.fabric.node_name[sc.fabric.port_node[port]]}->"
            + sc.fabric.node_name[sc.fabric.port_peer[port]]
        )
        print(f"  {name:<30}{su[port]:>14,}{eu.get(port, 0):>14,}")
    print(f"emu scale {erun.meta['results']['emulation']['scale']}; sim link rates as specified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
