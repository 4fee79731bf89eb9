"""Mininet engine figures (root): build and teardown time, replay packet rate, sim vs emu.

    sudo .venv/bin/python benchmarks/bench_emu.py [--skip-medium] [--replay-only] [--repeat N]
                                                  [--scale N|auto ...]

Prints: build (Mininet + plan applied) and teardown seconds for lab-small
and lab-medium, medians of --repeat runs, with the switches as routers and,
where Open vSwitch is installed, as OVS bridges; the machine's veth ceiling
(one sendmmsg sender, no shaping); the start-up probe's replay capacity;
then, for each --scale (default 50 and auto, the engine's own choice),
--repeat rounds of: the replay's packets per second for a permutation (no
dependencies) and a ring AllReduce (steps wait for each other), for each
kind of switch, and two cross-rack ceilings of one sendmmsg process, one
unshaped (NIC to NIC, rates unscaled) and one through the fabric the
engine builds at the replay's scale (every HTB and queue, every NIC
sending to another rack); medians of the rates, of the CPU per packet (a
figure a loaded machine moves less than the rates) and of the replay's
fraction of each ceiling of its round, with the load averages; the same
small ring AllReduce in the simulator and the emulator (completion time in
fabric time, bytes per leaf uplink).
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
    from aifabric.scenarios import scenario_from_dict

    raw = {"scenario": {"topology": topology}, "workload": workload,
           "congestion_control": {"kind": cc}}  # fmt: skip
    return scenario_from_dict(raw, "bench")


def build_teardown(topology, switch="router"):
    from aifabric.emu import linux
    from aifabric.emu.net import make_network
    from aifabric.emu.plan import plan

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


def flood_rate(across: bool, seconds=1.0, scale: int | None = None):
    """Packets/s one sendmmsg sender pushes (4 KiB payloads), counted where they arrive, and
    the sender's CPU seconds per packet (the forwarding done in its context included).

    `across=False`: through one unshaped veth pair (NIC to its leaf), the
    machine's veth ceiling. `across=True`: from a NIC to a NIC of another
    rack through the built fabric (leaf, spine, leaf: four veths, three
    routers, their HTB/TBF/FIFO queues and ECN markers, rates unscaled, the
    sender's own HTB removed), the ceiling a replay's cross-rack packets meet.
    With `scale`: the fabric the engine builds at that scale, every queue kept,
    the host HTBs included; the one process sends from every NIC in turn, each
    to a NIC of another rack (a permutation, as the replay's), so that no one
    link's rate but the machine bounds it while the scaled links allow.
    """
    from aifabric.emu import linux
    from aifabric.emu.linux import netns_of
    from aifabric.emu.net import Network
    from aifabric.emu.packets import Batch, fill_writes
    from aifabric.emu.plan import plan
    from aifabric.fabric.addressing import format_ipv4

    sc = scenario("lab-small", {"pattern": "permutation", "gpus": 16})
    mech = linux.ecn_mechanism() if across else "none"
    pl = plan(sc, ecn=mech, scale=scale or 1)
    net = Network(sc.fabric, pl)
    try:
        net.build()
        if mech == "ebpf":
            net.plan = pl = plan(sc, ecn=mech, scale=scale or 1, ecn_objects=net.compile_markers())
        net.apply()
        f = sc.fabric
        nics = [int(n) for n in f.nic_ids]
        pairs = []  # (sender NIC, destination address, node and device that count arrivals)
        if scale is not None:
            for i, nic in enumerate(nics):
                far = nics[(i + len(nics) // 2) % len(nics)]
                if f.node_rack[far] == f.node_rack[nic]:
                    raise SystemExit("lab-small's NICs no longer pair across racks by halves")
                pairs.append((nic, format_ipv4(pl.nic_ip[far]), far, far))
        else:
            nic = nics[0]
            net.run(nic, ["tc", "qdisc", "del", "dev", pl.port_iface[f.nic_port[nic]], "root"])
            if across:
                far = next(n for n in nics if f.node_rack[n] != f.node_rack[nic])
                pairs.append((nic, format_ipv4(pl.nic_ip[far]), far, far))
            else:
                pairs.append((nic, "100.64.0.1", int(f.port_peer[f.nic_port[nic]]), None))

        def rx_dev(far):
            if far is None:
                return pl.port_iface[int(f.nic_port[nics[0]]) ^ 1]
            return pl.port_iface[f.nic_port[far]]

        socks = []
        for nic, to, _, _ in pairs:
            with netns_of(net.pid[nic]):
                socks.append((socket.socket(socket.AF_INET, socket.SOCK_DGRAM),
                              (int(ipaddress.IPv4Address(to)), 9)))  # fmt: skip
        batch = Batch(64, 4200)
        k = fill_writes(batch.buf, batch.lens, 0, 1, 0, 0, 64 * 4096, 4096)

        def rx():
            total = 0
            for _, _, where, far in pairs:
                cmd = ["ip", "-s", "-j", "link", "show", "dev", rx_dev(far)]
                out = net.run(where, cmd)
                total += int(json.loads(out.stdout)[0]["stats64"]["rx"]["packets"])
            return total

        r0 = rx()
        t0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            for s, dest in socks:
                batch.send(s, k, dest)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        for s, _ in socks:
            s.close()
        got = rx() - r0
        return got / dt, cpu / max(got, 1)
    finally:
        net.close()


def run_emu(sc, scale=None, switch="router"):
    from aifabric.engines import run_scenario
    from aifabric.fabric.rundir import Run

    d = Path(tempfile.mkdtemp(prefix="bench-emu-run-"))
    options = {"scale": scale, "switch": switch}
    summary = run_scenario("mininet", sc, d / "run", options=options)
    return summary, Run(d / "run")


def run_sim(sc):
    from aifabric.engines import run_scenario
    from aifabric.fabric.rundir import Run

    d = Path(tempfile.mkdtemp(prefix="bench-sim-run-"))
    summary = run_scenario("sim", sc, d / "run")
    return summary, Run(d / "run")


def uplink_bytes(run, fabric):
    from aifabric.fabric.model import Role

    p = run.ports()
    total = p.total("tx_bytes")
    out = {}
    for col, port in enumerate(p["port"]):
        node, peer = fabric.port_node[port], fabric.port_peer[port]
        if fabric.node_role[node] == Role.RTSW and fabric.node_role[peer] == Role.CTSW:
            out[int(port)] = int(total[col])
    return out


def replay_round(wanted, switches, perm, ring):
    """One round at scale `wanted` (None: the engine's choice): the replays, then the
    cross-rack ceilings unshaped and shaped at the scale the replays ran at, then the load."""
    out = {"replay": {}}
    for label, workload in (("perm", perm), ("ring", ring)):
        sc = scenario("lab-small", workload)
        for switch in switches:
            s, run = run_emu(sc, scale=wanted, switch=switch)
            out["scale"] = run.meta["results"]["emulation"]["scale"]
            out["processes"] = s["replay_processes"]
            out["replay"][label, switch] = (
                s["packets_sent"] / s["replay_wall_s"],
                s["replay_cpu_s"] / max(s["packets_sent"], 1),
            )
    out["unshaped"] = flood_rate(across=True)
    out["shaped"] = flood_rate(across=True, scale=out["scale"])
    out["load"] = os.getloadavg()[0]
    return out


def report_rounds(rounds):
    """Medians over rounds of the ceilings, the replay rates and their fractions of the
    ceilings measured in the same round."""

    def med(values):
        return statistics.median(values)

    from aifabric.emu.replay import PAYLOAD_MTU

    sc = scenario("lab-small", {"pattern": "permutation", "gpus": 16})
    scale = rounds[0]["scale"]
    link_bps = int(sc.fabric.link_rate_bps.max()) // scale
    f = sc.fabric
    cap = int(f.port_rate_bps[f.nic_port[f.nic_ids]].sum()) // scale / (PAYLOAD_MTU * 8)
    loads = [r["load"] for r in rounds]
    print(
        f"scale {scale:,} ({link_bps / 1e9:g} Gb/s fastest link; median of {len(rounds)} "
        f"rounds; load {min(loads):.1f}-{max(loads):.1f})"
    )
    for key, what in (("unshaped", "NIC to NIC, no shaping"), ("shaped", "every NIC, shaped")):
        each = [r[key][0] for r in rounds]
        pps, cpu = med(each), med(r[key][1] for r in rounds)
        print(
            f"  cross-rack ceiling {key:<8} {pps:10,.0f} packets/s ({min(each):,.0f}-"
            f"{max(each):,.0f}; {what}; "
            f"{cpu * 1e6:.1f} us of CPU a packet)"
        )
    print(f"  (the NICs' scaled line rates allow about {cap:,.0f} packets/s in all)")
    for label, switch in rounds[0]["replay"]:
        each = [r["replay"][label, switch][0] for r in rounds]
        pps = med(each)
        cpu = med(r["replay"][label, switch][1] for r in rounds)
        of = {
            key: med(r["replay"][label, switch][0] / r[key][0] for r in rounds)
            for key in ("unshaped", "shaped")
        }
        print(
            f"  replay {label} {switch:<6} {pps:10,.0f} packets/s ({min(each):,.0f}-"
            f"{max(each):,.0f}; {of['unshaped']:.0%} of the "
            f"unshaped ceiling, {of['shaped']:.0%} of the shaped one; {cpu * 1e6:.1f} us of CPU "
            f"a packet; {rounds[0]['processes']} processes)"
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-medium", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="builds per figure (the median)")
    ap.add_argument(
        "--scale",
        action="append",
        type=lambda v: None if v == "auto" else int(v),
        help="a scale to replay at, or auto (the engine's choice); repeatable "
        "(default: 50 and auto)",
    )
    ap.add_argument(
        "--replay-only",
        action="store_true",
        help="only the ceilings and the replay rates, with routers",
    )
    args = ap.parse_args()
    args.scale = args.scale or [50, None]
    from aifabric.emu import available

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
    from aifabric.emu.replay import capacity_pps

    print(f"replay capacity     {capacity_pps():10,.0f} packets/s (the start-up probe's figure)")
    ring = {"collective": "allreduce", "algorithm": "ring", "size": "4MiB", "gpus": 16}
    perm = {"pattern": "permutation", "size": "8MB", "gpus": 16}
    for wanted in args.scale:
        rounds = [replay_round(wanted, switches, perm, ring) for _ in range(args.repeat)]
        report_rounds(rounds)
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
