"""What this machine's kernel and tools offer, and running commands inside a node's namespace."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from aifabric.fabric.errors import AifabricError

CLONE_NEWNET = 0x40000000
ENV_MARK = "AIFABRIC_EMU"  # set in every process the engine starts; `aifabric clean` looks for it
TOOLS = ("ip", "tc", "nsenter", "mnexec")
_libc = ctypes.CDLL(None, use_errno=True)


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def mininet_importable() -> bool:
    try:
        import mininet.net  # noqa: F401
    except ImportError:
        return False
    return True


def in_netns(pid: int, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run a command in the network namespace of process `pid`."""
    return subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", *argv], capture_output=True, text=True, **kw
    )


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 5) -> None:
    """Terminate every process still running, then wait for each; kill what does not end."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def process_state(pid: int) -> str | None:
    """The state letter of process `pid` (`Z`: dead, not yet reaped), None where there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2]


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def pid_namespace(pid: int | str = "self") -> int | None:
    """The inode of the PID namespace process `pid` lives in (None where it cannot be read)."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def identity(pid: int | str = "self") -> dict | None:
    """What tells process `pid` and the processes it forks (without exec) from all others:
    its pid and start time, process group, session and command line (a forked child has
    the same command line, group and session, and a later start). None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return {
        "pid": os.getpid() if pid == "self" else int(pid),
        "start": int(fields[19]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
        "cmdline": cmdline.hex(),
    }


def forks_of(who: dict) -> list[int]:
    """The processes of this PID namespace that process `who` (an `identity`) forked and
    that outlive it: once `who` is gone, every process with its command line, group and
    session that started no earlier; while it lives, none (they end with it)."""
    alive = identity(who["pid"])
    if alive is not None and alive["start"] == who["start"]:
        return []
    here = pid_namespace()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or pid_namespace(d.name) != here:
            continue
        other = identity(d.name)
        if (
            other is not None
            and other["cmdline"] == who["cmdline"]
            and (other["pgid"], other["sid"]) == (who["pgid"], who["sid"])
            and other["start"] >= who["start"]
            and process_state(d.name) not in (None, "Z")
        ):
            out.append(other["pid"])
    return out


def close_all(sockets: list, threads: int = 32) -> None:
    """Close `sockets` from up to `threads` threads at once: a packet socket's close waits
    for the kernel's RCU grace period, and closes side by side share their waits."""
    if not sockets:
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(threads, len(sockets))) as pool:
        list(pool.map(lambda s: s.close(), sockets))


def live_processes() -> list[int]:
    """Every process that runs, zombies left out."""
    pids = (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
    return [pid for pid in pids if process_state(pid) not in (None, "Z")]


def netns_id(pid: int) -> int:
    """The inode that identifies the network namespace of process `pid`."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def popen_in_netns(pid: int, argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(["nsenter", f"--net=/proc/{pid}/ns/net", *argv], **kw)


class BatchShell:
    """One long-lived `tc` (or `ip`) `-s -j -force -batch -` in a namespace.

    A command costs tens of microseconds instead of a process (nsenter, tc)
    of tens of milliseconds, which is what PFC's reaction time and the
    monitor's poll interval are made of. `query` returns the one JSON line a
    `show` prints; `sync` (tc only) returns once every command sent before
    it has run.
    """

    def __init__(self, pid: int, tool: str = "tc"):
        self.proc = popen_in_netns(
            pid,
            [tool, "-s", "-j", "-force", "-batch", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.lock = threading.Lock()

    def send(self, lines: list[str]) -> None:
        with self.lock:
            self.proc.stdin.write("".join(line + "\n" for line in lines))
            self.proc.stdin.flush()

    def query(self, line: str) -> str:
        with self.lock:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            out = self.proc.stdout.readline()
        if not out:
            raise AifabricError(f"a batch shell in a node's namespace ended ({self.proc.args[-6]})")
        return out

    def sync(self) -> None:
        # tc keeps a `show`'s device as the filter of every later `qdisc show` in the
        # batch: a shell that syncs must not also be used to read all qdiscs.
        self.query("qdisc show dev lo")

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


def netns_of(pid: int):
    """Enter the network namespace of `pid` in this thread; sockets made inside stay there."""
    return netns_at(f"/proc/{pid}/ns/net")


def marker_source() -> str:
    return resources.files("aifabric.emu").joinpath("ecn_marker.c").read_text()


def compile_marker(
    out_dir: Path, key: str, rate_bps: int, kmin: int, kmax: int, pmax: float
) -> Path:
    """Compile the eBPF ECN marker for one (rate, Kmin, Kmax, Pmax) into `out_dir`."""
    src = out_dir / "ecn_marker.c"
    if not src.exists():
        src.write_text(marker_source())
    obj = out_dir / f"{key}.o"
    arch = os.uname().machine
    cmd = [
        "clang", "-O2", "-g", "-target", "bpf", f"-I/usr/include/{arch}-linux-gnu",
        f"-DRATE_BPS={int(rate_bps)}ULL", f"-DKMIN_BYTES={int(kmin)}ULL",
        f"-DKMAX_BYTES={int(kmax)}ULL", f"-DPMAX_Q16={round(pmax * 65536)}ULL",
        "-c", str(src), "-o", str(obj),
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        first = (r.stderr.strip().splitlines() or ["clang failed"])[0]
        raise AifabricError(f"the eBPF ECN marker does not compile: {first}")
    return obj


def _probe_ns(name: str, script: str) -> bool:
    """Run `script` (sh) in a scratch namespace with veths afpa/afpb; True on success."""
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode != 0:
        return False
    try:
        setup = (
            "ip link add afpa type veth peer name afpb && ip link set afpa up && "
            "ip link set afpb up && "
        )
        r = subprocess.run(
            ["ip", "netns", "exec", name, "sh", "-c", setup + script], capture_output=True
        )
        return r.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def has_red() -> bool:
    return _probe_ns(
        f"af-probe-{os.getpid()}",
        "tc qdisc add dev afpa root red limit 400000 min 30000 max 90000 avpkt 1000 "
        "burst 55 probability 0.1 bandwidth 10mbit ecn",
    )


def has_netem() -> bool:
    """netem under the engine's own queue tree (HTB, TBF, netem, bfifo) on a veth."""
    from aifabric.emu.plan import port_tc

    lines = port_tc("afpa", 10_000_000, 100_000, ecn="none", delay_ns=1_000_000)
    script = "tc -batch - <<'EOF'\n" + "\n".join(lines) + "\nEOF\n"
    return _probe_ns(f"af-probe-{os.getpid()}", script)


def delay_mechanism() -> str:
    """How links get their propagation delay here: netem where the kernel has it, else none."""
    return "netem" if has_netem() else "none"


def has_bpf_marker() -> bool:
    if shutil.which("clang") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="aifabric-emu-probe-") as d:
        try:
            obj = compile_marker(Path(d), "probe", 10_000_000, 1000, 2000, 0.5)
        except AifabricError:
            return False
        return _probe_ns(
            f"af-probe-{os.getpid()}",
            f"tc qdisc add dev afpa clsact && tc filter add dev afpa egress prio 1 bpf da "
            f"obj {obj} sec tc",
        )


def ecn_mechanism(prefer: str | None = None) -> str:
    """red where the kernel has it, else the eBPF marker, else none (or `prefer` if it works)."""
    if prefer == "none":
        return "none"
    if prefer in (None, "red") and has_red():
        return "red"
    if prefer in (None, "red", "ebpf") and has_bpf_marker():
        return "ebpf"
    return "none"


@contextmanager
def netns_at(path: str):
    """Enter the network namespace at `path` (`/proc/PID/ns/net`, `/run/netns/NAME`) in this
    thread; sockets made inside stay there."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back failed")
    finally:
        os.close(own)
        os.close(target)
