"""The fast capture reader against slow references, and golden capture metrics.

References: a plain struct-based walk of pcap / pcapng records (below), and
`aifabric.analysis.dissect.scapy_fields` (scapy's dissection) for each packet's
headers. Golden captures and their expected metrics come from
tests/data/make_golden.py, which states how each value follows by hand.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.analysis import capture as C
from aifabric.analysis.capture import read_capture
from aifabric.analysis.dissect import scapy_fields
from aifabric.analysis.metrics import capture_metrics, group_rows, pause_ns
from aifabric.cli import main
from aifabric.fabric.errors import AifabricError

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "golden.json").read_text())


# --- the slow reference record reader ------------------------------------------------------


def ref_records(path: Path):
    """(records, complete): records are (time_ns, origlen, data, iface, linktype)."""
    raw = path.read_bytes()
    if raw[:4] == C.PCAPNG_MAGIC:
        return _ref_pcapng(raw)
    le, mul = C.PCAP_MAGICS[raw[:4]]
    e = "<" if le else ">"
    snaplen, link = struct.unpack_from(e + "II", raw, 16)
    out, o = [], 24
    while o < len(raw):
        if o + 16 > len(raw):
            return out, False
        sec, frac, incl, orig = struct.unpack_from(e + "IIII", raw, o)
        if incl > max(snaplen, C.MAX_RECORD) or o + 16 + incl > len(raw):
            return out, False
        out.append((_wrap(sec * 10**9 + frac * mul), orig, raw[o + 16 : o + 16 + incl], 0, link))
        o += 16 + incl
    return out, True


def _wrap(x: int) -> int:
    """x as the int64 the kernel computes (two's complement wrap-around)."""
    return (x + 2**63) % 2**64 - 2**63


def _ref_pcapng(raw: bytes):
    out, o, e = [], 0, "<"
    ifaces: list[tuple[int, int, int, int]] = []  # linktype, snaplen, units/s, offset s
    base = 0
    while o < len(raw):
        if o + 12 > len(raw):
            return out, False
        if raw[o : o + 4] == C.PCAPNG_MAGIC:
            bom = raw[o + 8 : o + 12]
            if bom[:2] not in (b"\x4d\x3c", b"\x1a\x2b"):
                return out, False
            e = "<" if bom[:2] == b"\x4d\x3c" else ">"
            base += len(ifaces)
            ifaces = []
        btype, blen = struct.unpack_from(e + "II", raw, o)
        if blen < 12 or blen % 4 or blen > C.MAX_RECORD + 64:
            return out, False
        if o + blen > len(raw):
            return out, False
        if struct.unpack_from(e + "I", raw, o + blen - 4)[0] != blen:
            return out, False
        body = raw[o + 8 : o + blen - 4]
        if btype == 1:
            if len(body) < 8:
                return out, False
            link, _, snap = struct.unpack_from(e + "HHI", body)
            units, offset, q = 10**6, 0, 8
            while q + 4 <= len(body):
                code, olen = struct.unpack_from(e + "HH", body, q)
                if code == 0 or q + 4 + olen > len(body):
                    break
                if code == 9 and olen >= 1:
                    r = body[q + 4]
                    if (r & 0x80 and r & 0x7F > 32) or (not r & 0x80 and r > 18):
                        return out, False
                    units = 2 ** (r & 0x7F) if r & 0x80 else 10**r
                elif code == 14 and olen >= 8:
                    (offset,) = struct.unpack_from(e + "q", body, q + 4)
                q += 4 + (olen + 3) // 4 * 4
            ifaces.append((link, snap, units, offset))
        elif btype in (6, 2):
            if len(body) < 20:
                return out, False
            if btype == 6:
                k, hi, lo, incl, orig = struct.unpack_from(e + "IIIII", body)
            else:
                k, _, hi, lo, incl, orig = struct.unpack_from(e + "HHIIII", body)
            if k >= len(ifaces) or 20 + incl > len(body):
                return out, False
            ts, (link, _, units, offset) = (hi << 32) | lo, ifaces[k]
            t = _wrap(_wrap(ts * 10**9 // units) + offset * 10**9)
            out.append((t, orig, body[20 : 20 + incl], base + k, link))
        elif btype == 3:
            if not ifaces or len(body) < 4:
                return out, False
            (orig,) = struct.unpack_from(e + "I", body)
            n = min(orig, len(body) - 4)
            if ifaces[0][1]:
                n = min(n, ifaces[0][1])
            out.append((-1, orig, body[4 : 4 + n], base, ifaces[0][0]))
        o += blen
    return out, True


def assert_agrees(path: Path, cap=None):
    """The fast reader and the references agree on every record and every field."""
    cap = cap or read_capture(path)
    records, complete = ref_records(path)
    assert len(cap) == len(records)
    assert (cap.problem == "") == complete, cap.problem
    for i, (t, orig, data, iface, link) in enumerate(records):
        assert cap.time_ns[i] == t, i
        assert cap.length[i] == orig and cap.caplen[i] == len(data), i
        assert cap.iface[i] == iface, i
        assert cap.packet_bytes(i) == data, i
        want = scapy_fields(data, link)
        quanta = want.pop("quanta")
        got = {name: int(getattr(cap, name)[i]) for name in want}
        assert got == want, (i, data.hex())
        assert cap.quanta[i].tolist() == quanta, i


# --- golden captures ----------------------------------------------------------------------


GOOD = [name for name in GOLDEN if "error_has" not in GOLDEN[name]]


@pytest.mark.parametrize("name", GOOD)
def test_fast_reader_agrees_with_references_on_golden_captures(name):
    assert_agrees(DATA / name)


def _check(got, want, where):
    if isinstance(want, dict):
        for key, value in want.items():
            if key == "top0":
                _check(got["top"][0], value, f"{where}.top[0]")
            elif key == "problem_has":
                for text in value:
                    assert text in got["problem"], (where, got["problem"])
            elif key in ("time_ns", "iface"):
                continue
            else:
                assert key in got, f"{where}.{key}"
                _check(got[key], value, f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _check(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12), where
    else:
        assert got == want, where


@pytest.mark.parametrize("name", GOOD)
def test_golden_metrics(name):
    cap = read_capture(DATA / name)
    want = GOLDEN[name]
    _check(capture_metrics(cap).to_dict(), want, name)
    if "time_ns" in want:
        assert cap.time_ns.tolist() == want["time_ns"]
        assert cap.iface.tolist() == want["iface"]


def test_wrong_magic_is_one_sentence():
    with pytest.raises(AifabricError) as e:
        read_capture(DATA / "golden_badmagic.pcap")
    assert GOLDEN["golden_badmagic.pcap"]["error_has"] in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
@pytest.mark.parametrize("name", ["golden_roce.pcap", "golden_multi.pcapng"])
def test_timestamps_and_lengths_agree_with_tshark(name):
    out = subprocess.run(
        ["tshark", "-r", str(DATA / name), "-T", "fields", "-e", "frame.time_epoch",
         "-e", "frame.len", "-e", "frame.cap_len"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    cap = read_capture(DATA / name)
    rows = [line.split("\t") for line in out.strip().splitlines()]
    assert len(rows) == len(cap)
    for i, (epoch, length, caplen) in enumerate(rows):
        assert int(length) == cap.length[i] and int(caplen) == cap.caplen[i]
        if cap.time_ns[i] >= 0:
            sec, _, frac = epoch.partition(".")
            assert int(sec) * 10**9 + int(frac.ljust(9, "0")[:9]) == cap.time_ns[i], i


# --- random packets, every file flavour, malformed bytes -----------------------------------


def _random_packets(rng, n):
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl, MACControlPause
    from scapy.contrib.roce import BTH, CNPPadding
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt
    from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
    from scapy.packet import Raw

    out = []
    for _ in range(n):
        eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        tags = int(rng.integers(0, 3))
        if tags == 2:
            eth = eth / Dot1AD(vlan=int(rng.integers(4096))) / Dot1Q(vlan=int(rng.integers(4096)))
        elif tags == 1:
            eth = eth / Dot1Q(vlan=int(rng.integers(4096)), prio=int(rng.integers(8)))
        kind = int(rng.integers(0, 7))
        if kind == 0:
            en = int(rng.integers(0, 256))
            fields = {f"c{k}_enabled": (en >> k) & 1 for k in range(8)}
            fields |= {f"c{k}_pause_time": int(rng.integers(0, 65536)) for k in range(8)}
            out.append(eth / MACControlClassBasedFlowControl(**fields))
            continue
        if kind == 1:
            out.append(eth / MACControlPause(pause_time=int(rng.integers(0, 65536))))
            continue
        tos = int(rng.integers(0, 256))
        if rng.random() < 0.5:
            ip = IP(src=f"10.0.{rng.integers(256)}.{rng.integers(256)}", dst="10.1.2.3", tos=tos)
            if kind == 2:
                ip.frag = int(rng.integers(0, 2))
        else:
            ip = IPv6(src="fd00::1", dst=f"fd00::{rng.integers(1, 65535):x}", tc=tos)
            if kind == 2:
                ip = ip / IPv6ExtHdrDestOpt()
        if kind == 3:
            out.append(eth / ip / Raw(bytes(20)))  # no transport we decode (proto 0 / 59)
            continue
        dport = 4791 if kind >= 4 else int(rng.integers(1, 65536))
        udp = UDP(sport=int(rng.integers(0, 65536)), dport=dport)
        if kind == 5:
            bth = BTH(opcode=0x81, dqpn=int(rng.integers(1 << 24)), becn=1) / CNPPadding()
        else:
            bth = BTH(
                opcode=int(rng.integers(0, 256)),
                dqpn=int(rng.integers(1 << 24)),
                psn=int(rng.integers(1 << 24)),
                fecn=int(rng.integers(2)),
                becn=int(rng.integers(2)),
            ) / Raw(bytes(int(rng.integers(0, 200))))
        out.append(eth / ip / udp / bth)
    return [bytes(p) for p in out]


def _write_all_flavours(folder: Path, packets, snaplen, rng):
    import sys

    sys.path.insert(0, str(DATA))
    from make_golden import ng_epb, ng_iface, ng_section, ng_spb, write_pcap

    times = [
        1_700_000_000 * 10**9 + int(t) * 1000 for t in np.sort(rng.integers(0, 10**6, len(packets)))
    ]
    paths = []
    for be in (False, True):
        for nanos in (False, True):
            p = folder / f"r-{be}-{nanos}.pcap"
            write_pcap(p, list(zip(times, packets, strict=True)), big_endian=be, nanos=nanos,
                       snaplen=snaplen)  # fmt: skip
            paths.append(p)
    for e in "<>":
        blocks = [ng_section(e), ng_iface(e, 9, snaplen), ng_iface(e, 6, snaplen)]
        for j, (t, data) in enumerate(zip(times, packets, strict=True)):
            cut = data[:snaplen]
            if j % 7 == 6:
                blocks.append(ng_spb(e, data))
                continue
            k = j % 2
            units = t if k == 0 else t // 1000
            hdr_orig = len(data)
            block = ng_epb(e, k, units, cut)
            # the EPB writer records caplen == origlen; patch the original length
            off = 8 + 16
            fmt = e + "I"
            block = block[:off] + struct.pack(fmt, hdr_orig) + block[off + 4 :]
            blocks.append(block)
        p = folder / f"r-{e == '>'}.pcapng"
        p.write_bytes(b"".join(blocks))
        paths.append(p)
    return paths


@pytest.mark.parametrize("snaplen", [65535, 64, 40])
def test_fast_reader_agrees_on_random_packets(tmp_path, snaplen):
    rng = np.random.default_rng(snaplen)
    packets = _random_packets(rng, 120)
    for path in _write_all_flavours(tmp_path, packets, snaplen, rng):
        assert_agrees(path)


def _relink(frame: bytes, linktype: int) -> bytes | None:
    """An Ethernet frame re-encapsulated for another link type (None: not expressible)."""
    etype, rest = frame[12:14], frame[14:]
    if linktype == C.LINK_SLL:  # packet type, ARPHRD, address length, address, protocol
        return struct.pack(">HHH", 0, 1, 6) + frame[6:12] + bytes(2) + etype + rest
    if linktype == C.LINK_SLL2:  # protocol, reserved, ifindex, ARPHRD, type, length, address
        return etype + bytes(2) + struct.pack(">IHBB", 3, 1, 0, 6) + frame[6:12] + bytes(2) + rest
    if etype in (b"\x08\x00", b"\x86\xdd"):
        return rest
    return None


@pytest.mark.parametrize("linktype", [C.LINK_SLL, C.LINK_SLL2, C.LINK_RAW])
def test_fast_reader_agrees_on_other_link_types(tmp_path, linktype):
    import sys

    sys.path.insert(0, str(DATA))
    from make_golden import write_pcap

    rng = np.random.default_rng(linktype)
    frames = [_relink(f, linktype) for f in _random_packets(rng, 80)]
    frames = [f for f in frames if f is not None]
    assert len(frames) > 20
    for snaplen in (65535, 48):
        path = tmp_path / f"l{linktype}-{snaplen}.pcap"
        write_pcap(path, [(10**9 * k, f) for k, f in enumerate(frames)], snaplen=snaplen,
                   linktype=linktype)  # fmt: skip
        cap = read_capture(path)
        assert_agrees(path, cap)
        assert (cap.kind != C.KIND_OTHER).sum() > 10


def test_fast_reader_agrees_on_damaged_files(tmp_path):
    rng = np.random.default_rng(7)
    packets = _random_packets(rng, 60)
    for path in _write_all_flavours(tmp_path, packets, 65535, rng):
        whole = path.read_bytes()
        for trial in range(6):
            damaged = bytearray(whole)
            if trial < 3:  # cut anywhere past the file header
                damaged = damaged[: int(rng.integers(40, len(whole)))]
            else:  # flip bytes anywhere past the file header
                for at in rng.integers(32, len(whole), size=4):
                    damaged[at] = int(rng.integers(0, 256))
            bad = tmp_path / f"bad{path.suffix}"
            bad.write_bytes(bytes(damaged))
            assert_agrees(bad)


# --- kernels beside the metrics ------------------------------------------------------------


def test_group_rows_matches_numpy_unique():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 5, size=(5000, 3)).astype(np.uint64)
    keys[:, 2] <<= np.uint64(60)  # high bits count too
    t = rng.integers(0, 10**6, 5000)
    t[rng.random(5000) < 0.3] = -1  # unknown times (pcapng simple packet blocks)
    keys[0] = [7, 7, 7]  # a group whose only packet has no time
    t[0] = -1
    inv, rep, first, last = group_rows(keys, t)
    uniq, idx, ref_inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    assert len(rep) == len(uniq)
    # same partition: group g of the kernel is the unique row of its representative
    order = np.argsort(idx)  # first appearance order
    mapping = np.empty(len(uniq), dtype=np.int64)
    mapping[order] = np.arange(len(uniq))
    assert (mapping[ref_inv.ravel()] == inv).all()
    for g in range(len(rep)):
        known = t[(inv == g) & (t >= 0)]
        if known.size:
            assert first[g] == known.min() and last[g] == known.max()
        else:
            assert first[g] == last[g] == -1
    assert first[inv[0]] == -1


def test_pause_time_matches_a_slow_walk():
    rng = np.random.default_rng(4)
    n = 300
    t = np.sort(rng.integers(0, 10**7, n))
    iface = rng.integers(0, 3, n).astype(np.uint32)
    enable = rng.integers(0, 256, n).astype(np.uint8)
    quanta = rng.integers(0, 65536, (n, 8)).astype(np.uint16)
    quanta[rng.random((n, 8)) < 0.2] = 0
    rate = 25 * 10**9
    got = pause_ns(t, iface, enable, quanta, rate)
    for k in range(8):
        total = 0
        for ifc in range(3):
            frames = [
                (t[i], quanta[i, k]) for i in range(n) if iface[i] == ifc and enable[i] >> k & 1
            ]
            for j, (tj, q) in enumerate(frames):
                end = tj + int(q) * 512 * 10**9 // rate
                if j + 1 < len(frames):
                    end = min(end, frames[j + 1][0])
                total += end - tj
        assert got[k] == total


# --- the commands ----------------------------------------------------------------------------


def test_analyze_a_capture():
    r = CliRunner().invoke(main, ["analyze", str(DATA / "golden_roce.pcap")])
    assert r.exit_code == 0, r.output
    assert "802.1Qbb PFC: 5 frames" in r.output
    assert "802.3x PAUSE 2 frames" in r.output
    r = CliRunner().invoke(main, ["analyze", str(DATA / "golden_roce.pcap"), "--json",
                                  "--rate", "25G"])  # fmt: skip
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)
    # four times slower links: each quantum lasts 4 x 5.12 ns; the XON still ends at 2 us
    assert m["pfc"]["paused_ns_per_priority"][3] == 3 * 4 * 5120 + 2000


def test_truncated_capture_is_analyzed_with_a_warning():
    r = CliRunner().invoke(main, ["analyze", str(DATA / "golden_truncated.pcap"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["packets"] == 24
    assert "Warning: golden_truncated.pcap ends in the middle of a record" in r.stderr
    assert "read 24 of ~25 records" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_pcap_show_dissects_with_scapy():
    r = CliRunner().invoke(
        main, ["pcap", "show", str(DATA / "golden_roce.pcap"), "--index", "7", "--count", "1"]
    )
    assert r.exit_code == 0, r.output
    assert "#7" in r.output and "[cnp]" in r.output and "BTH" in r.output
    assert "dqpn" in r.output
    r = CliRunner().invoke(main, ["pcap", "show", str(DATA / "golden_roce.pcap"), "--index",
                                  "18", "--count", "7"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.output.count("[pfc]") == 5 and r.output.count("[pause]") == 2
    assert "MAC Control Class Based Flow Control" in r.output or "c3_pause_time" in r.output
    r = CliRunner().invoke(main, ["pcap", "show", str(DATA / "golden_roce.pcap"), "--index",
                                  "99"])  # fmt: skip
    assert r.exit_code == 1 and r.output.startswith("Error: ") and "25 packets" in r.output
    r = CliRunner().invoke(main, ["pcap", "show", str(DATA / "golden_badmagic.pcap")])
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1


def test_time_series_of_a_capture_add_up():
    r = CliRunner().invoke(main, ["analyze", str(DATA / "golden_roce.pcap"), "--json", "--series"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)
    s = m["series"]
    # 6 ms in about 100 bins, rounded up to 1-2-5 steps: 100 us bins, 61 of them
    assert s["bin_ns"] == 100_000 and len(s["t_ns"]) == 61
    carried = sum(sum(row) for row in s["throughput_bps"]) * s["bin_ns"] / 8e9
    assert carried == pytest.approx(m["bytes"])
    assert sum(s["ce"]) == 3 and sum(s["cnp"]) == 2 and sum(s["pfc"]) == 5
    # the CNPs at 310 us and 710 us fall into bins 3 and 7
    assert [i for i, c in enumerate(s["cnp"]) if c] == [3, 7]


def test_empty_and_headless_captures(tmp_path):
    whole = (DATA / "golden_roce.pcap").read_bytes()
    (tmp_path / "empty.pcap").write_bytes(whole[:24])
    (tmp_path / "short.pcap").write_bytes(whole[:10])
    (tmp_path / "magic.pcapng").write_bytes(C.PCAPNG_MAGIC)
    cap = read_capture(tmp_path / "empty.pcap")
    assert len(cap) == 0 and cap.problem == ""
    assert capture_metrics(cap).packets == 0
    with pytest.raises(AifabricError, match="cut off inside its pcap file header"):
        read_capture(tmp_path / "short.pcap")
    cap = read_capture(tmp_path / "magic.pcapng")
    assert len(cap) == 0 and "no record could be read" in cap.problem
    r = CliRunner().invoke(main, ["pcap", "show", str(tmp_path / "empty.pcap")])
    assert r.exit_code == 0 and "holds no packets" in r.output
