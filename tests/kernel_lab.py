"""The Mininet engine's red and netem branches on Debian's full kernel, booted in QEMU.

The kernel that runs the tests here may lack sch_red and sch_netem; the users'
Debian 12 VM has them. `scripts/kernel-lab` boots that kernel in QEMU with a
tiny initramfs; this module writes what it runs there: the exact `tc -batch`
lines that `aifabric.emu.plan` makes (port_tc with red and with a FIFO, with and
without netem delay; tbf_line for PAUSE and resume), the commands that
`aifabric.emu.linux.has_red` and `has_netem` run, and `kernel_lab.sh`, the
checks. It returns the VM's `AIFLAB` lines as a dict.

    python -m tests.kernel_lab     # boot once, print the results and the wall time
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from aifabric.emu import linux
from aifabric.emu import plan as P
from aifabric.fabric.model import DEFAULT_QUEUE

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "scripts" / "kernel-lab"
CHECKS = Path(__file__).resolve().parent / "kernel_lab.sh"
HOST_TOOLS = ("qemu-system-x86_64", "busybox", "dash", "apt-get", "dpkg-deb", "depmod", "cpio")
RATE_BPS = P.DEFAULT_TARGET_BPS  # the fastest link after scaling
DELAY_NS = 25_000_000  # one way: long against the emulator's own latency (about 1 ms)
MARK_RATE_BPS = 2_000_000  # slow enough that a 200-packet burst queues up past Kmax
MARK_KMIN_BYTES, MARK_KMAX_BYTES, MARK_BUFFER_BYTES = 20_000, 60_000, 1_000_000


@dataclass(frozen=True)
class Pair:
    """A veth pair whose A end gets port_tc(**tc); B gets the same on its own name."""

    name: str
    index: int
    tc: dict

    @property
    def iface_a(self) -> str:
        return f"af{self.name}a"

    @property
    def iface_b(self) -> str:
        return f"af{self.name}b"


def pairs() -> tuple[Pair, ...]:
    """The queue trees under test: the DCQCN switch profile with red and with a FIFO."""
    e = DEFAULT_QUEUE.ecn
    red = dict(
        ecn="red", kmin_bytes=e.kmin_bytes, kmax_bytes=e.kmax_bytes, pmax=e.pmax, delay_ns=DELAY_NS
    )
    return (
        Pair("red", 1, dict(rate_bps=RATE_BPS, buffer_bytes=DEFAULT_QUEUE.buffer_bytes, **red)),
        Pair("fifo", 2, dict(rate_bps=RATE_BPS, buffer_bytes=DEFAULT_QUEUE.buffer_bytes,
                             ecn="none", delay_ns=DELAY_NS)),
        Pair("base", 3, dict(rate_bps=RATE_BPS, buffer_bytes=DEFAULT_QUEUE.buffer_bytes,
                             ecn="none")),
        Pair("mark", 4, dict(rate_bps=MARK_RATE_BPS, buffer_bytes=MARK_BUFFER_BYTES, ecn="red",
                             kmin_bytes=MARK_KMIN_BYTES, kmax_bytes=MARK_KMAX_BYTES, pmax=0.1,
                             delay_ns=DELAY_NS // 5)),
    )  # fmt: skip


def probe_commands(probe) -> list[list[str]]:
    """The commands a kernel probe (has_red, has_netem) runs, recorded instead of run."""
    calls: list[list[str]] = []

    def record(argv, **kw):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    with mock.patch.object(linux, "subprocess", SimpleNamespace(run=record)):
        probe()
    return calls


def probe_script(name: str, calls: list[list[str]]) -> str:
    """The probe's commands in order; the verdict is the exit status of its `ip netns exec`."""
    lines = []
    for argv in calls:
        cmd = shlex.join(argv)
        if argv[:3] == ["ip", "netns", "exec"]:
            lines.append(f'{cmd}; echo "AIFLAB probe.{name} $?"')
        else:
            lines.append(f"{cmd} >/dev/null 2>&1")
    return "\n".join(lines) + "\n"


def write_payload(out: Path) -> tuple[Pair, ...]:
    """Everything lab.sh reads, into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(CHECKS, out / "lab.sh")
    ps = pairs()
    rows = []
    for p in ps:
        for end, iface in (("a", p.iface_a), ("b", p.iface_b)):
            (out / f"{p.name}.{end}.tc").write_text("\n".join(P.port_tc(iface, **p.tc)) + "\n")
        for state, paused in (("pause", True), ("resume", False)):
            line = P.tbf_line(
                p.iface_a,
                paused=paused,
                rate_bps=p.tc["rate_bps"],
                buffer_bytes=p.tc["buffer_bytes"],
            )
            (out / f"{p.name}.{state}.tc").write_text(line + "\n")
        rows.append(f"{p.name} {p.iface_a} {p.iface_b} {p.index}")
    (out / "pairs").write_text("\n".join(rows) + "\n")
    mark = next(p for p in ps if p.name == "mark")
    (out / "mark").write_text(f"{mark.name} {mark.iface_a} {mark.iface_b} {mark.index}\n")
    for name, probe in (("red", linux.has_red), ("netem", linux.has_netem)):
        (out / f"probe_{name}.sh").write_text(probe_script(name, probe_commands(probe)))
    return ps


def parse(console: str) -> dict[str, list[str]]:
    """`AIFLAB KEY VALUE...` lines as {KEY: [VALUE, ...]} (a repeated key keeps its last)."""
    out = {}
    for line in console.splitlines():
        line = line.strip().replace("\r", "")
        i = line.find("AIFLAB ")
        if i >= 0:
            words = line[i:].split()
            if len(words) >= 2:
                out[words[1]] = words[2:]
    return out


def missing_tools() -> list[str]:
    return [t for t in HOST_TOOLS if shutil.which(t) is None and not Path("/sbin", t).exists()]


def host_distribution(os_release: Path = Path("/etc/os-release")) -> str:
    """The host's distribution ID ("debian", "ubuntu", ...), "" when it does not say."""
    try:
        for line in os_release.read_text().splitlines():
            if line.startswith("ID="):
                return line[3:].strip().strip('"')
    except OSError:
        pass
    return ""


def unavailable() -> str | None:
    """Why the lab cannot boot here, or None: it needs its host tools, and Debian's
    kernel from a Debian host's apt (Ubuntu's archive has no linux-image-amd64)."""
    missing = missing_tools()
    if missing:
        return (
            f"the kernel lab needs {', '.join(missing)} "
            "(scripts/install --test installs them as root)"
        )
    distribution = host_distribution()
    if distribution != "debian":
        return (
            "the kernel lab boots Debian 12's kernel from a Debian host's apt; "
            f"this host runs {distribution or 'an unknown distribution'}"
        )
    return None


def run(timeout_s: int = 600) -> tuple[dict[str, list[str]], str, float]:
    """Boot the lab once: (results, console, wall seconds)."""
    with tempfile.TemporaryDirectory(prefix="aifabric-kernel-lab-") as d:
        write_payload(Path(d))
        t0 = time.monotonic()
        r = subprocess.run([str(HARNESS), d], capture_output=True, text=True, timeout=timeout_s)
        wall = time.monotonic() - t0
    console = r.stdout + r.stderr
    if r.returncode != 0:
        raise RuntimeError(f"kernel-lab exited {r.returncode}:\n{console[-4000:]}")
    return parse(console), console, wall


def main() -> int:
    results, _, wall = run()
    for key, values in results.items():
        print(key, " ".join(values))
    print(f"wall {wall:.1f} s")
    return 0 if results.get("exit") == ["0"] else 1


if __name__ == "__main__":
    sys.exit(main())
