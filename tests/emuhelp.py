"""Helpers for the emulator's root tests: paths checked against packet counters; a killed run;
the machine's state as the emulator can change it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# programs the engine runs (directly or through Mininet and Open vSwitch)
ENGINE_PROGRAMS = ("mnexec", "nsenter", "tcpdump", "ovs-vswitchd", "ovsdb-server", "tc", "ip")


def killed_then_cleaned(code: str) -> tuple[list[str], dict]:
    """Run `code` until it prints a line, SIGKILL it and run `aifabric clean`.

    Returns the words of that line and what was left behind before the clean.
    """
    from click.testing import CliRunner

    from aifabric.cli import main
    from aifabric.emu.clean import leftovers

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        words = proc.stdout.readline().split()
        left = leftovers()
    finally:
        proc.kill()
        proc.wait()
    result = CliRunner().invoke(main, ["clean"])
    assert result.exit_code == 0, result.output
    assert "removed" in result.output
    return words, left


def paths_are_where_packets_go(net, sc, ptr, links, tx_packets, n: int = 100) -> int:
    """Each inter-rack flow's packets leave by exactly the switch interfaces its path names.

    Sends `n` packets with the flow's 5-tuple from its NIC's namespace and
    compares the interfaces whose `tx_packets()` grew by `n` (in time: the
    userspace datapath forwards in its own time) with the path's switch
    ports. Returns how many flows were checked.
    """
    import socket
    import time

    from aifabric.emu.linux import netns_of
    from aifabric.fabric.addressing import format_ipv4

    f, ft, pl = sc.fabric, sc.flows, net.plan
    checked = 0
    for i in range(len(ft)):
        src, dst = int(ft.src[i]), int(ft.dst[i])
        path = links[ptr[i] : ptr[i + 1]]
        assert len(path) == (2 if f.node_rack[src] == f.node_rack[dst] else 4), i
        if len(path) == 2:
            continue
        want, node = set(), src
        for link in path:
            port = 2 * int(link) if int(f.link_a[link]) == node else 2 * int(link) + 1
            if port != int(f.nic_port[src]):
                want.add(pl.port_iface[port])
            node = int(f.port_peer[port])
        before = tx_packets()
        with netns_of(net.pid[src]):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with s:
            s.bind((format_ipv4(pl.nic_ip[src]), int(ft.sport[i])))
            for _ in range(n):
                s.sendto(b"x" * 64, (format_ipv4(pl.nic_ip[dst]), 4791))
        deadline = time.monotonic() + 10
        while True:
            after = tx_packets()
            busy = {x for x in after if x.startswith("afs") and after[x] - before.get(x, 0) >= n}
            if len(busy) >= len(want) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert busy == want, (i, busy, want)
        checked += 1
    return checked


def _lines(argv: list[str]) -> set[str] | None:
    """The output lines of a command; None where it is missing or fails (a daemon not running)."""
    if shutil.which(argv[0]) is None:
        return None
    r = subprocess.run(argv, capture_output=True, text=True)
    return set(r.stdout.splitlines()) if r.returncode == 0 else None


def _proc(pid: str, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def processes() -> dict[int, tuple[str, str, bytes]]:
    """Every live process of this PID namespace: pid -> (start time, comm, command line and
    ` MARKED` where it carries the engine's environment mark)."""
    from aifabric.emu.linux import ENV_MARK, pid_namespace

    here = pid_namespace()
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or pid_namespace(d.name) != here:
            continue  # a container's processes (another PID namespace) are its own
        stat = _proc(d.name, "stat").decode(errors="replace")
        if not stat or stat[stat.rfind(")") + 2] == "Z":
            continue  # a zombie is dead: only init's reaping is left of it
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        start = stat[stat.rfind(")") + 2 :].split()[19]
        env = _proc(d.name, "environ")
        marked = any(e.startswith(f"{ENV_MARK}=".encode()) for e in env.split(b"\0"))
        out[int(d.name)] = (start, comm, _proc(d.name, "cmdline") + (b" MARKED" * marked))
    return out


def holders(path: Path) -> list[str]:
    """The processes that have `path` open: "pid command line" each."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fds = [os.readlink(fd) for fd in (d / "fd").iterdir()]
        except OSError:
            continue
        if str(path) in fds:
            cmd = _proc(d.name, "cmdline").replace(b"\0", b" ")[:120]
            out.append(f"{d.name} {cmd.decode(errors='replace')}")
    return out


def descendants(pid: int) -> dict[int, str]:
    """The live descendants of `pid`: their pid -> start time (which tells a reused pid)."""
    parent, start = {}, {}
    for d in Path("/proc").iterdir():
        stat = _proc(d.name, "stat").decode(errors="replace") if d.name.isdigit() else ""
        if stat:
            fields = stat[stat.rfind(")") + 2 :].split()
            parent[int(d.name)], start[int(d.name)] = int(fields[1]), fields[19]
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in out:
                out[child] = start[child]
                todo.append(child)
    return out


def machine_state() -> dict:
    """What an emulated run can leave behind, as sets to compare before and after."""
    from aifabric.emu.bpfmap import program_ids
    from aifabric.emu.net import TMP_PREFIX

    links = set()
    for line in _lines(["ip", "-o", "link", "show"]) or ():
        links.add(line.split(":")[1].strip().split("@")[0])
    bpffs = Path("/sys/fs/bpf")
    return {
        "namespaces": {w.split()[0] for w in _lines(["ip", "netns", "list"]) or () if w.strip()},
        "links": links,
        "qdiscs": _lines(["tc", "qdisc", "show"]) or set(),
        "bpf_programs": set(program_ids()),
        "bpf_pinned": {str(p) for p in bpffs.rglob("*")} if bpffs.is_dir() else set(),
        "ovs_bridges": _lines(["ovs-vsctl", "--timeout=2", "list-br"]) or set(),
        "ovs_datapaths": _lines(["ovs-dpctl", "dump-dps"]) or set(),
        "tempfiles": {p.name for p in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*")},
        "processes": processes(),
        "elsewhere": emulators_elsewhere(),
    }


def emulators_elsewhere() -> bool:
    """Whether the emulator runs in a container (another PID namespace) on this machine too:
    its bpf programs are the kernel's, seen from here like ours."""
    from aifabric.emu.linux import ENV_MARK, pid_namespace

    here, mark = pid_namespace(), f"{ENV_MARK}=".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or pid_namespace(d.name) in (here, None):
            continue
        if any(e.startswith(mark) for e in _proc(d.name, "environ").split(b"\0")):
            return True
    return False


def left_behind(before: dict, after: dict, started: dict[int, str], run_dir: Path) -> dict:
    """What `after` holds that `before` did not: the run's leftovers, by kind (empty: none).

    Processes count when the run started them (`started`, from `descendants`,
    still alive with the same start time) or when they are new and look like
    the engine's: its programs, its environment mark, a Mininet shell, or a
    command line naming the run directory. Other new processes (the other
    work on this machine) do not.
    """
    out = {k: sorted(after[k] - before[k]) for k in after if k not in ("processes", "elsewhere")}
    if before["elsewhere"] or after["elsewhere"]:
        del out["bpf_programs"]  # not ours to tell apart
    procs = after["processes"]
    gone = []
    for pid, (start, comm, cmd) in procs.items():
        if before["processes"].get(pid, (None,))[0] == start or pid == os.getpid():
            continue
        ours = started.get(pid) == start or (
            comm in ENGINE_PROGRAMS
            or cmd.endswith(b" MARKED")
            or b"mininet:" in cmd
            or str(run_dir).encode() in cmd
        )
        if ours:
            gone.append(f"{pid} {comm} {cmd[:120].decode(errors='replace')}")
    out["processes"] = gone
    return {k: v for k, v in out.items() if v}
