"""How fast the analyzer reads captures: the numba parse kernel and `aifabric analyze`.

Generates a synthetic RoCEv2 capture (default 1,000,000 packets, 128-byte snap
length): data packets between 64 NICs of lab-medium addresses over 512 QPs,
about 10% of them CE-marked, one CNP per 40 packets, a few thousand PFC frames
and some 802.3x PAUSE frames (which must not count as PFC). Then it prints
medians over several repetitions of

- the parse kernel alone (file already in the page cache), in packets/s and MB/s;
- the whole capture analysis in-process (parse + metrics);
- the whole `aifabric analyze FILE --json` command as a new process, start-up included.

    .venv/bin/python benchmarks/bench_analysis.py [--packets N] [--repeat R] [--keep DIR]

Goals (issue 5, 2 cores): >= 20 M packets/s inside the process; the whole
command under 1.5 s for the 1 M-packet file.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SNAP = 128


def _roce_template(opcode: int, payload: int) -> bytes:
    eth = bytes.fromhex("0200000000020200000000010800")
    total = 20 + 8 + 12 + payload + 4
    ip = bytearray(20)
    ip[0] = 0x45
    ip[2:4] = total.to_bytes(2, "big")
    ip[6] = 0x40  # don't fragment
    ip[8] = 64
    ip[9] = 17
    udp = bytearray(8)
    udp[2:4] = (4791).to_bytes(2, "big")
    udp[4:6] = (8 + 12 + payload + 4).to_bytes(2, "big")
    bth = bytearray(12)
    bth[0] = opcode
    bth[2:4] = b"\xff\xff"
    return eth + bytes(ip) + bytes(udp) + bytes(bth) + bytes(payload + 4)


def _pfc_template(enable: int, quanta: int, pause: bool) -> bytes:
    eth = bytes.fromhex("0180c20000010200000000018808")
    if pause:
        body = (1).to_bytes(2, "big") + quanta.to_bytes(2, "big")
    else:
        body = (0x0101).to_bytes(2, "big") + enable.to_bytes(2, "big")
        body += b"".join((quanta if enable >> k & 1 else 0).to_bytes(2, "big") for k in range(8))
    return eth + body + bytes(60 - 14 - len(body))


def synth_capture(path: Path, n: int, seed: int = 0) -> dict:
    """Write the benchmark capture; returns the counts it contains by construction."""
    rng = np.random.default_rng(seed)
    kinds = np.zeros(n, dtype=np.int8)  # 0 data, 1 CNP, 2 PFC, 3 PAUSE
    kinds[::40] = 1
    pfc_at = rng.choice(n, size=max(n // 333, 1), replace=False)
    kinds[pfc_at] = 2
    pause_at = rng.choice(np.flatnonzero(kinds == 0), size=max(n // 5000, 1), replace=False)
    kinds[pause_at] = 3
    data_t = _roce_template(0x0A, 4096)  # RDMA WRITE ONLY
    cnp_t = _roce_template(0x81, 16)
    pfc_t = _pfc_template(1 << 3, 0xFFFF, pause=False)
    pause_t = _pfc_template(0, 0xFFFF, pause=True)
    templates = [data_t, cnp_t, pfc_t, pause_t]
    caplen = np.array([min(len(t), SNAP) for t in templates], dtype=np.int64)
    origlen = np.array([len(t) for t in templates], dtype=np.int64)
    rec = 16 + caplen[kinds]
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(rec, out=off[1:])
    buf = np.zeros(24 + int(off[-1]), dtype=np.uint8)
    buf[:24] = np.frombuffer(
        np.array([0xA1B23C4D], "<u4").tobytes()
        + np.array([2, 4], "<u2").tobytes()
        + np.array([0, 0, SNAP, 1], "<u4").tobytes(),
        dtype=np.uint8,
    )
    off = off[:-1] + 24
    t_ns = 1_700_000_000 * 10**9 + np.cumsum(rng.integers(50, 150, size=n))
    hdr = np.zeros((n, 4), dtype="<u4")
    hdr[:, 0] = t_ns // 10**9
    hdr[:, 1] = t_ns % 10**9
    hdr[:, 2] = caplen[kinds]
    hdr[:, 3] = origlen[kinds]
    idx = off[:, None] + np.arange(16)
    buf[idx] = hdr.view(np.uint8).reshape(n, 16)
    for k, t in enumerate(templates):
        rows = np.flatnonzero(kinds == k)
        body = np.frombuffer(t[: caplen[k]], dtype=np.uint8)
        buf[(off[rows] + 16)[:, None] + np.arange(len(body))] = body
    roce = np.flatnonzero(kinds <= 1)
    qp = rng.integers(0, 512, size=len(roce))
    src = (10 << 24) | (0 << 16) | ((qp % 8) << 8) | (qp // 8 % 8 + 1)
    dst = (10 << 24) | (0 << 16) | (((qp + 3) % 8) << 8) | ((qp // 64) % 8 + 1)
    p = off[roce] + 16
    for k in range(4):
        buf[p + 26 + k] = (src >> (24 - 8 * k)) & 0xFF
        buf[p + 30 + k] = (dst >> (24 - 8 * k)) & 0xFF
    sport = 0xC000 | qp
    buf[p + 34] = sport >> 8
    buf[p + 35] = sport & 0xFF
    dqpn = 0x100 + qp
    buf[p + 47] = (dqpn >> 16) & 0xFF
    buf[p + 48] = (dqpn >> 8) & 0xFF
    buf[p + 49] = dqpn & 0xFF
    psn = np.arange(len(roce)) & 0xFFFFFF
    buf[p + 51] = (psn >> 16) & 0xFF
    buf[p + 52] = (psn >> 8) & 0xFF
    buf[p + 53] = psn & 0xFF
    data = roce[kinds[roce] == 0]
    ce = data[rng.random(len(data)) < 0.10]
    buf[off[ce] + 16 + 15] |= 3
    ect = np.setdiff1d(data, ce)
    buf[off[ect] + 16 + 15] |= 2
    buf.tofile(path)
    return {
        "packets": n,
        "data": int((kinds == 0).sum()),
        "ce": len(ce),
        "cnp": int((kinds == 1).sum()),
        "pfc": int((kinds == 2).sum()),
        "pause": int((kinds == 3).sum()),
        "bytes": int(buf.size),
    }


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--keep", type=Path, help="write the capture into this directory")
    args = ap.parse_args()

    from aifabric.analysis.capture import read_capture
    from aifabric.analysis.metrics import capture_metrics

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        path = folder / "bench.pcap"
        t0 = time.perf_counter()
        truth = synth_capture(path, args.packets)
        print(
            f"generated {path.name}: {truth['packets']:,} packets, "
            f"{truth['bytes'] / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s"
        )
        print(
            f"  by construction: {truth['ce']:,} CE-marked, {truth['cnp']:,} CNP, "
            f"{truth['pfc']:,} PFC, {truth['pause']:,} 802.3x PAUSE"
        )

        cap = read_capture(path)  # compile or load the cached kernels, warm the page cache
        m = capture_metrics(cap)
        assert m.packets == truth["packets"], m.packets
        assert m.ecn.ce == truth["ce"], (m.ecn, truth)
        assert m.cnp.count == truth["cnp"]
        assert m.pfc.frames == truth["pfc"]
        assert m.pause.frames == truth["pause"]

        mb = truth["bytes"] / 1e6
        parse_s = _median_time(lambda: read_capture(path), args.repeat)
        print(
            f"parse kernel (memmap, count + decode): median {parse_s * 1e3:.1f} ms = "
            f"{truth['packets'] / parse_s / 1e6:.1f} M packets/s, {mb / parse_s:,.0f} MB/s "
            f"(goal >= 20 M packets/s)"
        )
        whole_s = _median_time(lambda: capture_metrics(read_capture(path)), args.repeat)
        print(
            f"parse + metrics in-process: median {whole_s * 1e3:.1f} ms = "
            f"{truth['packets'] / whole_s / 1e6:.1f} M packets/s"
        )
        exe = Path(sys.executable).parent / "aifabric"
        cmd = [str(exe), "analyze", str(path), "--json"]
        cli_s = _median_time(
            lambda: subprocess.run(cmd, check=True, capture_output=True), max(3, args.repeat // 2)
        )
        print(
            f"`aifabric analyze FILE --json` wall time, start-up included: median "
            f"{cli_s:.2f} s (goal < 1.5 s)"
        )
        start_s = _median_time(
            lambda: subprocess.run([str(exe), "--version"], check=True, capture_output=True), 3
        )
        print(f"  of which `aifabric --version` start-up alone: median {start_s:.2f} s")


if __name__ == "__main__":
    main()
