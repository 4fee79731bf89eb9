"""What a killed run leaves behind, and removing it (`aifabric clean`).

Ours is recognised by name and mark, never by guessing: processes whose
environment carries AIFABRIC_EMU (every Mininet shell and tool the engine
starts inherits it), Mininet shells named `mininet:af...`, veth interfaces
in the root namespace named `af...` (a half-built link, a switch port or
bridge of Open vSwitch), named namespaces `af-...` (capability probes),
temporary directories `aifabric-emu-*`, bridges named `af...` in the
system's Open vSwitch, and what a killed private ovs-vswitchd leaves when
no ovs-vswitchd runs any more: a kernel datapath holding nothing but ports
of ours, the userspace datapath's tap `ovs-netdev` (see aifabric.emu.ovs).

A process the run forked without exec (a replay process, or a command caught
between fork and exec) has no mark: its environment is the run's own. A replay
process ends with its run, unless the kill came before it could arrange that;
and a fork left holding the last references to the run's raw sockets takes
seconds to end. The run's temporary
directory names the run process (`RUN_PROCESS`); once that is gone, a
process with its command line, group and session that started no earlier
is one of its forks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from aifabric.emu import linux, ovs
from aifabric.emu.linux import ENV_MARK
from aifabric.emu.net import RUN_PROCESS, TMP_PREFIX
from aifabric.emu.plan import PREFIX


def our_processes() -> list[int]:
    """Marked processes of this machine's PID namespace: a container's (a fresh-machine test
    under `unshare --pid`, say) run their own emulator, not ours."""
    me = os.getpid()
    mark = f"{ENV_MARK}=".encode()
    here = linux.pid_namespace()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me or linux.pid_namespace(d.name) != here:
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if f"mininet:{PREFIX}".encode() in cmd or any(
            e.startswith(mark) and e != mark + str(me).encode() for e in env.split(b"\0")
        ):
            out.append(int(d.name))
    return out


ENDING_S = 60.0  # how long `clean` waits for the processes it killed to end


def orphaned_forks() -> list[int]:
    """Processes a run that is gone forked and left running: see the module's docstring."""
    out: set[int] = set()
    for d in our_tempdirs():
        try:
            who = json.loads((d / RUN_PROCESS).read_text())
        except (OSError, ValueError):
            continue  # a run killed before it wrote it had forked nothing yet
        if isinstance(who, dict):
            out.update(linux.forks_of(who))
    return sorted(out - {os.getpid()})


def _every_process() -> list[int]:
    """Our marked processes and the forks of runs that are gone."""
    return sorted(set(our_processes()) | set(orphaned_forks()))


def our_links() -> list[str]:
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    names = []
    for line in r.stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX) and name[len(PREFIX) : len(PREFIX) + 1] in ("h", "s", "p"):
                names.append(name)
    return names


def our_namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [w.split()[0] for w in r.stdout.splitlines() if w.startswith(f"{PREFIX}-")]


def our_tempdirs() -> list[Path]:
    return sorted(Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"))


def leftovers() -> dict[str, list]:
    """Everything of ours still present, by kind; empty lists when clean."""
    tap = ovs.stale_netdev_tap()
    return {
        "processes": _every_process(),
        "links": our_links() + ([tap] if tap else []),
        "namespaces": our_namespaces(),
        "tempdirs": [str(p) for p in our_tempdirs()],
        "bridges": ovs.our_bridges(),
    }


def clean() -> dict[str, int]:
    """Kill our processes, delete our links, namespaces and temporary directories."""
    procs = _every_process()
    for pid in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # A killed process ends when its system call returns, and a fork of a killed run may be
    # in a long one: it holds the last reference to the run's raw sockets (one per port),
    # and each takes about 12 ms to close here. A process that waits for init to reap it
    # (state Z) is gone all the same.
    deadline = time.monotonic() + ENDING_S
    while time.monotonic() < deadline and any(
        linux.process_state(p) not in (None, "Z") for p in procs
    ):
        time.sleep(0.05)
    bridges = ovs.our_bridges()
    ovs.remove_bridges(bridges)
    datapath = ovs.stale_datapath()
    if datapath is not None:
        subprocess.run(["ovs-dpctl", "del-dp", datapath], capture_output=True)
    links = our_links()
    tap = ovs.stale_netdev_tap()
    links += [tap] if tap else []
    for name in links:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
    spaces = our_namespaces()
    for name in spaces:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    dirs = our_tempdirs()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return {
        "processes": len(procs),
        "links": len(links),
        "namespaces": len(spaces),
        "tempdirs": len(dirs),
        "bridges": len(bridges),
    }
