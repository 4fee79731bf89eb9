"""The `linux` and `ovs` hashes (fabric.emuhash) against this machine's kernel and Open vSwitch.

The root tests ask the real thing, without Mininet, in namespaces of their own (names
starting `hashx`): `ip route get` on a multipath route of n next hops, UDP packets
forwarded through such a route, and `ovs-appctl ofproto/trace` on a bridge with a select
group written as the emulator writes it. Every answer must be the one the simulator's
hash gives.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from aifabric.fabric.addressing import ROCE_UDP_PORT
from aifabric.fabric.emuhash import linux_hash, linux_pick, ovs_basis, ovs_pick, siphash24

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="asking the kernel needs root")


def test_siphash_gives_the_reference_vector():
    # SipHash-2-4 paper, appendix A: key 00..0f, message 00..0e -> a129ca6149be45e5
    k0 = int.from_bytes(bytes(range(8)), "little")
    k1 = int.from_bytes(bytes(range(8, 16)), "little")
    msg = bytes(range(15))
    words = np.array([int.from_bytes(msg[:8], "little")], dtype=np.uint64)
    final = (15 << 56) | int.from_bytes(msg[8:], "little")
    got = siphash24(np.uint64(k0), np.uint64(k1), words, np.uint64(final))
    assert int(got) == 0xA129CA6149BE45E5


def test_hash_threshold_splits_the_31_bit_range_evenly():
    for n in (1, 2, 3, 5, 8):
        picks = [linux_pick(h, n) for h in np.linspace(0, 2**31 - 1, 4001).astype(np.int64)]
        counts = np.bincount(picks, minlength=n)
        assert counts.min() > 4001 / n - 3, (n, counts)
        assert picks == sorted(picks)  # thresholds: the range is cut in order
    assert linux_pick(0, 4) == 0 and linux_pick(2**31 - 1, 4) == 3
    assert linux_pick(2**29 - 1, 4) == 0 and linux_pick(2**29, 4) == 1


def test_the_seed_and_every_field_move_the_hashes():
    base = (0x0A000001, 0x0A010002, 0xC123, ROCE_UDP_PORT, 7)
    for fn in (linux_hash, ovs_basis):
        h = fn(*base)
        for i in range(5):
            other = list(base)
            other[i] ^= 1 << 3
            assert fn(*other) != h, (fn.__name__, i)
    # Linux's keys are made symmetric: the reverse direction hashes the same
    assert linux_hash(0x0A010002, 0x0A000001, ROCE_UDP_PORT, 0xC123, 7) == linux_hash(*base)


def _tuples(rng, count):
    out = []
    for _ in range(count):
        s = rng.randrange(0x0A000000, 0x0A800000)
        d = rng.randrange(0x0A000000, 0x0A800000)
        sport = rng.randrange(0xC000, 0x10000) if rng.random() < 0.7 else rng.randrange(1, 65536)
        dport = ROCE_UDP_PORT if rng.random() < 0.7 else rng.randrange(1, 65536)
        out.append((s, d, sport, dport))
    return out


def _sh(ns, script, **kw):
    r = subprocess.run(
        ["ip", "netns", "exec", ns, "sh", "-c", script], capture_output=True, text=True, **kw
    )
    assert r.returncode == 0, (script[:200], r.stderr)
    return r


class _Namespaces:
    def __init__(self, *names):
        self.names = [f"hashx{os.getpid()}{n}" for n in names]

    def __enter__(self):
        for n in self.names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
            subprocess.run(["ip", "netns", "add", n], check=True)
        return self.names

    def __exit__(self, *exc):
        for n in self.names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def _router(ns, n, seed, peer_ns=None):
    """Make `ns` a router with a 10.0.0.0/9 route over n next hops (dev d0..d{n-1})."""
    lines = [
        "sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 "
        "net.ipv4.conf.default.rp_filter=0 net.ipv4.fib_multipath_hash_policy=1 "
        f"net.ipv4.fib_multipath_hash_seed={seed}",
    ]
    hops = []
    for k in range(n):
        where = f"netns {peer_ns}" if peer_ns else ""
        lines += [
            f"ip link add d{k} type veth peer name e{k} {where}",
            f"ip link set d{k} up",
            f"ip addr add 10.251.{k}.1/24 dev d{k}",
        ]
        if not peer_ns:
            lines.append(f"ip link set e{k} up")
        hops.append(f"nexthop via 10.251.{k}.2 dev d{k}")
    _sh(ns, " && ".join(lines))
    if peer_ns:
        _sh(peer_ns, " && ".join(f"ip link set e{k} up" for k in range(n)))
        for k in range(n):
            mac = json.loads(_sh(peer_ns, f"ip -j link show e{k}").stdout)[0]["address"]
            _sh(ns, f"ip neigh replace 10.251.{k}.2 lladdr {mac} dev d{k} nud permanent")
    _sh(ns, "ip route add 10.0.0.0/9 " + " ".join(hops))


@needs_root
@pytest.mark.root
@pytest.mark.parametrize("n, seed", [(2, 1), (3, 7), (4, 12345), (8, 2**32 - 1)])
def test_linux_hash_is_the_kernels_route_lookup(n, seed):
    queries = _tuples(random.Random(seed), 1000)
    with _Namespaces("r") as (ns,):
        _router(ns, n, seed)
        _sh(ns, "ip link add din type veth peer name dinp && ip link set din up && "
                "ip link set dinp up && ip addr add 10.250.0.1/24 dev din")  # fmt: skip
        lines = [
            f"route get {ipaddress.IPv4Address(d)} from {ipaddress.IPv4Address(s)} iif din "
            f"ipproto udp sport {sp} dport {dp}"
            for s, d, sp, dp in queries
        ]
        out = _sh(ns, "ip -o -batch -", input="\n".join(lines) + "\n").stdout.splitlines()
    assert len(out) == len(queries)
    for (s, d, sp, dp), line in zip(queries, out, strict=True):
        words = line.split()
        got = int(words[words.index("dev") + 1][1:])
        assert got == linux_pick(linux_hash(s, d, sp, dp, seed), n), line


@needs_root
@pytest.mark.root
def test_linux_hash_is_where_forwarded_packets_go():
    """UDP from unconnected sockets (as the replay sends): a connected socket's packets carry
    the socket's random flow hash, which the forwarding router then uses instead."""
    n, seed = 4, 2024
    with _Namespaces("s", "r", "t") as (sender, router, sink):
        subprocess.run(
            ["ip", "link", "add", "ha", "netns", sender, "type", "veth", "peer", "name", "hb",
             "netns", router], check=True,
        )  # fmt: skip
        _router(router, n, seed, peer_ns=sink)
        rmac = json.loads(_sh(router, "ip -j link show hb").stdout)[0]["address"]
        srcs = [f"10.200.0.{i}" for i in range(1, 9)]
        _sh(router, "ip link set hb up && ip addr add 10.200.0.254/24 dev hb")
        _sh(
            sender,
            "ip link set ha up && "
            + " && ".join(f"ip addr add {a}/{24 if i == 0 else 32} dev ha" for i, a in
                          enumerate(srcs))
            + f" && ip neigh replace 10.200.0.254 lladdr {rmac} dev ha nud permanent"
            " && ip route add 10.0.0.0/9 via 10.200.0.254 dev ha",
        )  # fmt: skip
        rng = random.Random(seed)
        sent = [
            (rng.choice(srcs), str(ipaddress.IPv4Address(rng.randrange(0x0A000001, 0x0A7FFFFF))),
             rng.randrange(0xC000, 0x10000))
            for _ in range(300)
        ]  # fmt: skip
        listen = (
            "import socket, select, sys\n"
            f"socks = [socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x800)) "
            f"for _ in range({n})]\n"
            "for k, s in enumerate(socks): s.bind((f'e{k}', 0))\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    r, _, _ = select.select(socks, [], [], 1.0)\n"
            "    if not r: break\n"
            "    for s in r:\n"
            "        d = s.recv(2048)\n"
            "        if d[23] == 17: print(socks.index(s), d[26:30].hex(), d[30:34].hex(),"
            " int.from_bytes(d[34:36], 'big'), flush=True)\n"
        )
        proc = subprocess.Popen(
            ["ip", "netns", "exec", sink, sys.executable, "-c", listen],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout.readline().strip() == "ready"
        send = (
            "import socket, json, sys\n"
            "for s, d, sp in json.loads(sys.stdin.read()):\n"
            "    k = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "    k.bind((s, sp)); k.sendto(b'x' * 64, (d, 4791)); k.close()\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", sender, sys.executable, "-c", send],
            input=json.dumps(sent), text=True, check=True,
        )  # fmt: skip
        out, _ = proc.communicate(timeout=60)
    seen = {}
    for line in out.splitlines():
        k, s, d, sp = line.split()
        seen[(int(s, 16), int(d, 16), int(sp))] = int(k)
    assert len(seen) == len(sent)
    for (s, d, sp), k in seen.items():
        assert k == linux_pick(linux_hash(s, d, sp, ROCE_UDP_PORT, seed), n)


@needs_root
@pytest.mark.skipif(shutil.which("ovs-vswitchd") is None, reason="Open vSwitch is not installed")
@pytest.mark.root
def test_ovs_hash_is_ofproto_trace_of_the_emulators_select_group(tmp_path):
    """A private ovsdb-server and ovs-vswitchd in a namespace of ours (so that the userspace
    datapath's own tap cannot meet another's); the group as aifabric.emu.ovs writes it."""
    from aifabric.emu.ovs import HASH_FIELDS, OPENFLOW, traced_port

    d = tmp_path
    env = dict(os.environ, OVS_RUNDIR=str(d), OVS_DBDIR=str(d), OVS_LOGDIR=str(d))
    procs = []
    with _Namespaces("o") as (ns,):
        try:
            subprocess.run(["ovsdb-tool", "create", str(d / "conf.db")], check=True, env=env)

            def spawn(name, *args):
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns, name, *args, f"--pidfile={d / name}.pid",
                     f"--unixctl={d / name}.ctl", f"--log-file={d / name}.log", "-vconsole:off"],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ))  # fmt: skip

            spawn("ovsdb-server", str(d / "conf.db"), f"--remote=punix:{d / 'db.sock'}")
            vsctl = ["ovs-vsctl", f"--db=unix:{d / 'db.sock'}", "--timeout=10"]
            subprocess.run([*vsctl, "--retry", "--no-wait", "init"], check=True, env=env)
            spawn("ovs-vswitchd", f"unix:{d / 'db.sock'}")
            deadline = time.monotonic() + 10
            while not (d / "ovs-vswitchd.ctl").exists():
                assert time.monotonic() < deadline, "ovs-vswitchd did not start"
                time.sleep(0.05)
            n_ports = 9
            args = ["--", "add-br", "hx0", "--", "set", "bridge", "hx0", "datapath_type=netdev",
                    "fail_mode=secure", f"protocols={OPENFLOW}"]  # fmt: skip
            for k in range(n_ports):
                _sh(ns, f"ip link add q{k} type veth peer name w{k} && ip link set q{k} up "
                        f"&& ip link set w{k} up")  # fmt: skip
                args += ["--", "add-port", "hx0", f"q{k}", "--", "set", "interface", f"q{k}",
                         f"ofport_request={k + 1}"]  # fmt: skip
            subprocess.run([*vsctl, *args], check=True, env=env, capture_output=True)
            ofctl = ["ovs-ofctl", "-O", OPENFLOW]
            mgmt = f"unix:{d / 'hx0.mgmt'}"
            cases = [(2, 1), (3, 4_000_000_000), (5, 77), (8, 12345)]
            for g, (n, seed) in enumerate(cases, start=1):
                buckets = ",".join(
                    f"bucket=bucket_id:{i},watch_port:{i + 2},actions=output:{i + 2}"
                    for i in range(n)
                )
                group = (
                    f"group_id={g},type=select,selection_method=hash,fields({HASH_FIELDS[1]}),"
                    f"selection_method_param={seed},{buckets}"
                )
                subprocess.run([*ofctl, "add-group", mgmt, group], check=True, env=env)
            for g, (n, seed) in enumerate(cases, start=1):
                subprocess.run(
                    [*ofctl, "mod-flows" if g > 1 else "add-flow", mgmt,
                     f"priority=10,ip,actions=group:{g}"], check=True, env=env,
                )  # fmt: skip
                for s, dd, sp, dp in _tuples(random.Random(seed), 150):
                    flow = (
                        f"in_port=1,udp,nw_src={ipaddress.IPv4Address(s)},"
                        f"nw_dst={ipaddress.IPv4Address(dd)},udp_src={sp},udp_dst={dp},nw_ttl=64"
                    )
                    r = subprocess.run(
                        ["ovs-appctl", "-t", str(d / "ovs-vswitchd.ctl"), "ofproto/trace",
                         "hx0", flow], capture_output=True, text=True, env=env,
                    )  # fmt: skip
                    got = traced_port(r.stdout)
                    assert got is not None, r.stdout[-500:]
                    want = ovs_pick(ovs_basis(s, dd, sp, dp, seed), n)
                    assert got - 2 == want, (n, seed, flow)
        finally:
            subprocess.run(
                ["ovs-appctl", "-t", str(d / "ovs-vswitchd.ctl"), "exit"],
                env=env, capture_output=True,
            )  # fmt: skip
            for p in procs[::-1]:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def _mininet_ready():
    from aifabric.emu import available

    return available() if os.geteuid() == 0 else "the Mininet engine needs root"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("switch", ["router", "ovs"])
@pytest.mark.parametrize("topology", ["lab-small", "lab-medium"])
def test_the_simulator_predicts_the_emulators_paths_flow_by_flow(topology, switch):
    """Every flow's path in the emulator (asked of each switch, as the run records it) is the
    path of the simulator's policy for that kind of switch, before and after an uplink of
    rack 0 fails; under Linux the failure also moves flows that never crossed that uplink."""
    if _mininet_ready() is not None:
        pytest.skip(str(_mininet_ready()))
    from aifabric.emu.engine import observed_paths
    from aifabric.emu.net import make_network
    from aifabric.emu.plan import plan
    from aifabric.fabric.faults import routing_after, routing_at_start
    from aifabric.fabric.routing import EMULATOR_POLICY
    from aifabric.scenarios import scenario_from_dict

    policy = EMULATOR_POLICY[switch]
    raw = {
        "scenario": {"topology": topology, "hash_seed": 29},
        "workload": {"pattern": "permutation", "size": "64KiB", "qps": 4},
        "ecmp": {"policy": policy},
        "faults": [{"link": "z0-r0-rtsw--z0-ctsw0", "at": "50us", "action": "down"}],
    }
    sc = scenario_from_dict(raw, "paths")
    f, ft = sc.fabric, sc.flows
    fault = sc.faults[0]
    before = routing_at_start(f, sc.faults, policy, sc.hash_seed)
    after = routing_after(fault, before)
    predicted = [r.paths(ft.src, ft.dst, ft.sport, ft.dqpn) for r in (before, after)]
    pl = plan(sc, ecn="none", scale=1000)
    net = make_network(sc, pl, switch)
    try:
        net.build()
        net.apply()
        observed = [observed_paths(net, sc)]
        _, actions, _ = net.fault_actions(fault, pl.routing)
        for node, act in actions:
            assert act() is None, f.node_name[node]
        observed.append(observed_paths(net, sc))
    finally:
        net.close()
    for (ptr, links), sim in zip(observed, predicted, strict=True):
        differ = [
            i
            for i in range(len(ft))
            if links[ptr[i] : ptr[i + 1]].tolist() != sim.links(i).tolist()
        ]
        assert not differ, f"{len(differ)} of {len(ft)} flows differ, e.g. flow {differ[0]}"
    uplink = fault.target
    moved = [
        i
        for i in range(len(ft))
        if predicted[0].links(i).tolist() != predicted[1].links(i).tolist()
    ]
    crossed = [i for i in moved if uplink in predicted[0].links(i).tolist()]
    assert crossed, "no flow crossed the failed uplink: the test shows nothing"
    if switch == "router":
        assert len(moved) > len(crossed)  # hash-threshold moves others too


def test_a_batch_goes_to_the_address_given_from_an_unconnected_socket():
    """The replay's sockets stay unconnected (a connected one's packets carry its random flow
    hash, which Linux routers forward by instead of the 5-tuple): each sendmmsg names its
    destination."""
    import socket

    from aifabric.emu.packets import Batch, fill_writes

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        tx.bind(("127.0.0.1", 0))
        batch = Batch(8, 4200)
        k = fill_writes(batch.buf, batch.lens, 3, 77, 0, 0, 3 * 1000, 1000)
        sent = batch.send(tx, k, (0x7F000001, rx.getsockname()[1]))
        assert sent == k == 3
        got = [rx.recvfrom(4200) for _ in range(k)]
        assert [len(data) for data, _ in got] == batch.lens[:k].tolist()
        assert {addr for _, addr in got} == {tx.getsockname()}
        with pytest.raises(OSError):
            tx.getpeername()  # never connected
