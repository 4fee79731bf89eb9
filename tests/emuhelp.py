"""Helpers for the emulator's root tests: paths checked against packet counters; a killed run."""

from __future__ import annotations

import subprocess
import sys


def killed_then_cleaned(code: str) -> tuple[list[str], dict]:
    """Run `code` until it prints a line, SIGKILL it and run `aifabric clean`.

    Returns the words of that line and what was left behind before the clean.
    """
    from click.testing import CliRunner

    from aifabric.cli import main
    from fabric.emu.clean import leftovers

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

    from fabric.addressing import format_ipv4
    from fabric.emu.linux import netns_of

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
