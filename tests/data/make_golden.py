"""Regenerate the golden captures of tests/data and their expected metrics (golden.json).

    .venv/bin/python tests/data/make_golden.py

Packets are crafted with scapy (scapy.contrib.roce, scapy.contrib.mac_control).
Every expected value below is written from how the captures are built, by
arithmetic you can redo by hand; none comes from running the analyzer. The
comment beside each value says how it follows.

Frame sizes used throughout (bytes on the wire, no FCS):
  RoCE data, IPv4: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + payload + ICRC 4
      1024-byte payload -> 1082; 512-byte payload -> 570
  CNP, IPv4: 14 + 20 + 8 + BTH 12 + CNP padding 16 + ICRC 4 = 74
  plain UDP with 10 payload bytes: 14 + 20 + 8 + 10 = 52
  PFC and PAUSE frames: padded to the 60-byte Ethernet minimum
Pause time of q quanta at 100 Gb/s: q x 512 bit / 100e9 bit/s = q x 5.12 ns.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0_S = 1_700_000_000  # capture start, seconds since the epoch

A = ("10.0.0.1", "10.0.1.1", 0xC001, 0x000101)  # src, dst, UDP sport, destination QPN
B = ("10.0.0.2", "10.0.2.1", 0xC002, 0x000202)
CE_A = (3, 7)  # packets of flow A marked CE (the rest ECT(0))
CE_B = (4,)


def _layers():
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl, MACControlPause  # noqa: F401
    from scapy.contrib.roce import BTH, CNPPadding  # noqa: F401
    from scapy.layers.inet import IP, UDP  # noqa: F401
    from scapy.layers.inet6 import IPv6  # noqa: F401
    from scapy.layers.l2 import Dot1Q, Ether  # noqa: F401
    from scapy.packet import Raw  # noqa: F401

    return locals()


def _eth():
    return _layers()["Ether"](src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def roce(flow, payload: int, psn: int, ecn: int, opcode: int = 0x0A, fecn=0):
    L = _layers()
    src, dst, sport, dqpn = flow
    return (
        _eth()
        / L["IP"](src=src, dst=dst, tos=ecn)
        / L["UDP"](sport=sport, dport=4791)
        / L["BTH"](opcode=opcode, dqpn=dqpn, psn=psn, fecn=fecn)
        / L["Raw"](bytes(payload))
    )


def cnp(src, dst, dqpn):
    L = _layers()
    return (
        _eth()
        / L["IP"](src=src, dst=dst, tos=0)
        / L["UDP"](sport=0xC0FF, dport=4791)
        / L["BTH"](opcode=0x81, dqpn=dqpn, becn=1)
        / L["CNPPadding"]()
    )


def pfc(priority: int, quanta: int):
    L = _layers()
    fields = {f"c{priority}_enabled": 1, f"c{priority}_pause_time": quanta}
    return L["Ether"](src="02:00:00:00:00:01", dst="01:80:c2:00:00:01") / L[
        "MACControlClassBasedFlowControl"
    ](**fields)


def pause(quanta: int):
    L = _layers()
    return L["Ether"](src="02:00:00:00:00:01", dst="01:80:c2:00:00:01") / L["MACControlPause"](
        pause_time=quanta
    )


def write_pcap(path: Path, packets, *, big_endian=False, nanos=False, snaplen=65535, linktype=1):
    """packets: (time_ns, bytes); records are cut to snaplen like a capture would."""
    e = ">" if big_endian else "<"
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = [struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)]
    for t, data in packets:
        frac = t % 10**9 if nanos else (t % 10**9) // 1000
        cut = data[:snaplen]
        out.append(struct.pack(e + "IIII", t // 10**9, frac, len(cut), len(data)) + cut)
    path.write_bytes(b"".join(out))


def _pad4(b: bytes) -> bytes:
    return b + bytes(-len(b) % 4)


def _block(e: str, btype: int, body: bytes) -> bytes:
    body = _pad4(body)
    n = 12 + len(body)
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def ng_section(e: str) -> bytes:
    return _block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1))


def ng_iface(e: str, tsresol: int | None, snaplen=65535, tsoffset_s: int = 0) -> bytes:
    opts = b""
    if tsresol is not None:
        opts += struct.pack(e + "HH", 9, 1) + _pad4(bytes([tsresol]))
    if tsoffset_s:
        opts += struct.pack(e + "HHq", 14, 8, tsoffset_s)
    if opts:
        opts += struct.pack(e + "HH", 0, 0)
    return _block(e, 1, struct.pack(e + "HHI", 1, 0, snaplen) + opts)


def ng_epb(e: str, iface: int, ts_units: int, data: bytes) -> bytes:
    hdr = struct.pack(
        e + "IIIII", iface, ts_units >> 32, ts_units & 0xFFFFFFFF, len(data), len(data)
    )
    return _block(e, 6, hdr + data)


def ng_pb(e: str, iface: int, ts_units: int, data: bytes) -> bytes:
    """The obsolete Packet Block (type 2): a 16-bit interface id and a drop count."""
    hdr = struct.pack(e + "HHIIII", iface, 0, ts_units >> 32, ts_units & 0xFFFFFFFF, len(data),
                      len(data))  # fmt: skip
    return _block(e, 2, hdr + data)


def ng_spb(e: str, data: bytes) -> bytes:
    return _block(e, 3, struct.pack(e + "I", len(data)) + data)


def main() -> None:
    expected: dict[str, dict] = {}
    us = 1000  # ns

    # --- golden_roce.pcap: little-endian, microsecond timestamps --------------------------
    pk = []
    for i in range(10):  # flow A: 10 packets, 1024-byte payload, one every 100 us from 0
        pk.append((i * 100 * us, roce(A, 1024, i, 3 if i in CE_A else 2)))
    for i in range(5):  # flow B: 5 packets, 512-byte payload, at 50, 250, ..., 850 us
        pk.append(((50 + 200 * i) * us, roce(B, 512, i, 3 if i in CE_B else 2)))
    pk.append((310 * us, cnp(A[1], A[0], A[3])))  # two CNPs back to flow A's sender
    pk.append((710 * us, cnp(A[1], A[0], A[3])))
    L = _layers()
    pk.append(
        (
            20 * us,
            _eth()
            / L["IP"](src="10.0.0.9", dst="10.0.0.10")
            / L["UDP"](sport=5000, dport=53)
            / L["Raw"](bytes(10)),
        )
    )
    for k in range(3):  # PFC XOFF on priority 3, 1000 quanta, at 1, 2, 3 ms
        pk.append(((1000 + 1000 * k) * us, pfc(3, 1000)))
    pk.append((4000 * us, pfc(3, 0xFFFF)))  # XOFF, 65535 quanta ...
    pk.append((4002 * us, pfc(3, 0)))  # ... ended by an XON 2 us later
    pk.append((5000 * us, pause(100)))  # 802.3x PAUSE: not PFC
    pk.append((6000 * us, pause(100)))
    pk.sort(key=lambda x: x[0])
    raw = [(T0_S * 10**9 + t, bytes(p)) for t, p in pk]
    sizes = [len(b) for _, b in raw]
    assert sizes.count(1082) == 10 and sizes.count(570) == 5 and sizes.count(74) == 2
    assert sizes.count(52) == 1 and sizes.count(60) == 7
    write_pcap(HERE / "golden_roce.pcap", raw)
    expected["golden_roce.pcap"] = {
        "format": "pcap",
        "problem": "",
        "packets": 25,  # 10 A + 5 B + 2 CNP + 1 UDP + 5 PFC + 2 PAUSE
        "bytes": 10 * 1082 + 5 * 570 + 2 * 74 + 52 + 7 * 60,
        "captured_bytes": 10 * 1082 + 5 * 570 + 2 * 74 + 52 + 7 * 60,
        "cut_headers": 0,
        "interfaces": 1,
        "start_ns": T0_S * 10**9,  # flow A's first packet at 0 us
        "duration_ns": 6000 * us,  # the last PAUSE at 6 ms
        "kinds": {
            "other": 0,
            "ip": 0,
            "udp": 1,
            "roce": 15,
            "cnp": 2,
            "pfc": 5,
            "pause": 2,
            "macctl": 0,
        },  # fmt: skip
        "ecn": {
            "ip_packets": 18,  # 15 data + 2 CNP + 1 UDP
            "not_ect": 3,  # the CNPs and the UDP packet
            "ect1": 0,
            "ect0": 12,  # 15 data packets less 3 CE
            "ce": 3,  # A's packets 3 and 7, B's packet 4
            "ce_fraction": 3 / 18,
            "ce_fraction_of_ect": 3 / 15,
        },
        "roce": {"packets": 15, "bytes": 10 * 1082 + 5 * 570, "fecn": 0, "becn": 2},
        "cnp": {
            "count": 2,
            "rate_per_s": 2 / 6e-3,  # 2 CNPs over the 6 ms capture
            "per_roce_packet": 2 / 15,
            "qps": 1,  # both to QPN 0x101
        },
        "pfc": {
            "frames": 5,
            "frames_per_priority": [0, 0, 0, 5, 0, 0, 0, 0],
            "xoff_per_priority": [0, 0, 0, 4, 0, 0, 0, 0],
            "xon_per_priority": [0, 0, 0, 1, 0, 0, 0, 0],
            "quanta_per_priority": [0, 0, 0, 3 * 1000 + 0xFFFF, 0, 0, 0, 0],
            # 3 x 1000 quanta x 5.12 ns, plus the 65535-quanta pause cut by the XON after 2 us
            "paused_ns_per_priority": [0, 0, 0, 3 * 5120 + 2000, 0, 0, 0, 0],
            "rate_bps": 100 * 10**9,
        },
        "pause": {"frames": 2, "quanta": 200, "paused_ns": 2 * 512},  # 100 quanta = 512 ns
        # flows: A, B and the UDP packet; A lasts 900 us, B 800 us, the UDP packet 0
        "flows": {"count": 3},
        "fct_ns": {
            "count": 3,
            "mean": (900 + 800 + 0) * us / 3,
            "p50": 800 * us,
            "max": 900 * us,
        },  # fmt: skip
        "per_interface": {
            "bytes": [10 * 1082 + 5 * 570 + 2 * 74 + 52 + 7 * 60],
            "packets": [25],
            "imbalance": None,
        },  # fmt: skip
    }
    top = {
        "src": A[0], "dst": A[1], "sport": A[2], "dport": 4791, "dqpn": A[3], "packets": 10,
        "bytes": 10 * 1082, "ce": 2, "first_ns": T0_S * 10**9, "duration_ns": 900 * us,
    }  # fmt: skip
    expected["golden_roce.pcap"]["flows"]["top0"] = top

    whole = (HERE / "golden_roce.pcap").read_bytes()
    # --- malformed copies ---------------------------------------------------------------
    # the last record (a 60-byte PAUSE, 76 bytes with its header) loses its last 10 bytes
    (HERE / "golden_truncated.pcap").write_bytes(whole[:-10])
    expected["golden_truncated.pcap"] = {
        "packets": 24,
        "problem_has": [
            "ends in the middle of a record",
            f"at byte {len(whole) - 76:,}",
            "read 24 of ~25 records",
        ],  # fmt: skip
        "pause": {"frames": 1},
    }
    # record 10 (0-based) gets an impossible captured length: 10 records are read
    off = 24
    for _ in range(10):
        off += 16 + struct.unpack_from("<I", whole, off + 8)[0]
    bad = bytearray(whole)
    struct.pack_into("<I", bad, off + 8, 0x7FFFFFFF)
    (HERE / "golden_badlen.pcap").write_bytes(bytes(bad))
    expected["golden_badlen.pcap"] = {
        "packets": 10,
        "problem_has": ["corrupted record length", f"at byte {off:,}", "read 10 of ~"],
    }
    (HERE / "golden_badmagic.pcap").write_bytes(b"\x00\x01\x02\x03" + whole[4:])
    expected["golden_badmagic.pcap"] = {"error_has": "is not a pcap or pcapng capture"}

    # --- golden_multi.pcapng: a big-endian section with two interfaces and an SPB, then a
    # little-endian section with one interface -------------------------------------------
    data = bytes(roce(A, 1024, 0, 2))  # 1082 bytes, ECT(0)
    blocks = [ng_section(">"), ng_iface(">", 9), ng_iface(">", 0x80 | 20)]
    for k in range(4):  # interface 0, nanosecond resolution: T0 + k us
        blocks.append(ng_epb(">", 0, T0_S * 10**9 + k * us, data))
    for k in range(2):  # interface 1, 2^-20 s units: T0 + 5.5 s + k/2 s
        blocks.append(ng_epb(">", 1, ((T0_S + 5) << 20) + (1 << 19) + k * (1 << 19), data))
    blocks.append(ng_spb(">", data))  # interface 0, no timestamp
    # default resolution (microseconds) and if_tsoffset 100 s: times count from T0 - 100 s
    blocks += [ng_section("<"), ng_iface("<", None, tsoffset_s=100)]
    blocks.append(ng_epb("<", 0, (T0_S + 7 - 100) * 10**6, data))  # becomes interface 2
    blocks.append(ng_pb("<", 0, (T0_S + 8 - 100) * 10**6, data))  # obsolete block, T0 + 8 s
    (HERE / "golden_multi.pcapng").write_bytes(b"".join(blocks))
    expected["golden_multi.pcapng"] = {
        "format": "pcapng",
        "problem": "",
        "packets": 9,
        "bytes": 9 * 1082,
        "interfaces": 3,
        "start_ns": T0_S * 10**9,
        "duration_ns": 8 * 10**9,  # T0 to T0 + 8 s (the SPB has no time)
        "kinds": {"roce": 9},
        "per_interface": {
            "bytes": [5 * 1082, 2 * 1082, 2 * 1082],  # 4 EPB + 1 SPB, 2, 2
            "packets": [5, 2, 2],
            # loads 5, 2, 2: mean 3, max/mean 5/3, Jain 9^2 / (3 x 33)
            "imbalance": {"bins": 3, "max_mean": 5 / 3, "jain": 81 / 99},
            # the one flow is seen on all three interfaces: one ball in each bin, so no
            # collision, and uniform hashing of 3 balls into 3 bins expects
            # 3 - 3 (1 - (2/3)^3) = 3 x 8/27 = 8/9
            "flows": [1, 1, 1],
            "collisions": 0,
            "collisions_expected": 8 / 9,
        },
        "time_ns": [T0_S * 10**9 + k * us for k in range(4)]
        + [
            (T0_S + 5) * 10**9 + 500_000_000,
            (T0_S + 6) * 10**9,
            -1,
            (T0_S + 7) * 10**9,
            (T0_S + 8) * 10**9,
        ],  # fmt: skip
        "iface": [0, 0, 0, 0, 1, 1, 0, 2, 2],
        # one flow (every packet is the same packet of flow A): T0 to T0 + 8 s; the SPB's
        # packet has no time and does not stretch it
        "flows": {"count": 1, "top0": {"packets": 9, "duration_ns": 8 * 10**9}},
        "fct_ns": {"count": 1, "max": 8 * 10**9},
    }

    # --- golden_vlan_v6.pcap: big-endian, nanosecond timestamps, 64-byte snap length ------
    v6 = (
        _eth()
        / L["Dot1Q"](vlan=100, prio=3)
        / L["IPv6"](src="fd00::1", dst="fd00::2", tc=3)
        / L["UDP"](sport=0xC003, dport=4791)
        / L["BTH"](opcode=0x0A, dqpn=0x303, psn=5)
        / L["Raw"](bytes(1024))
    )
    v4 = (
        _eth()
        / L["Dot1Q"](vlan=200, prio=5)
        / L["IP"](src="10.0.3.1", dst="10.0.0.1", tos=1)
        / L["UDP"](sport=0xC004, dport=4791)
        / L["BTH"](opcode=0x81, dqpn=0x404, becn=1)
        / L["CNPPadding"]()
    )
    vp = L["Ether"](src="02:00:00:00:00:01", dst="01:80:c2:00:00:01") / L["Dot1Q"](vlan=0, prio=7)
    vp = vp / L["MACControlClassBasedFlowControl"](
        c2_enabled=1, c2_pause_time=7, c6_enabled=1, c6_pause_time=0
    )
    raw = [(T0_S * 10**9 + 1, bytes(v6)), (T0_S * 10**9 + 2, bytes(v4)),
           (T0_S * 10**9 + 3, bytes(vp))]  # fmt: skip
    write_pcap(HERE / "golden_vlan_v6.pcap", raw, big_endian=True, nanos=True, snaplen=64)
    expected["golden_vlan_v6.pcap"] = {
        "packets": 3,
        "duration_ns": 2,
        # 802.1Q 18 + IPv6 40 + UDP 8 = 66 > 64: the IPv6 packet is cut inside its UDP header
        "cut_headers": 1,
        "kinds": {"ip": 1, "cnp": 1, "pfc": 1, "roce": 0},
        # 1082 + 4 (tag) + 20 (IPv6 is 20 bytes longer) = 1106; 74 + 4 = 78; 64 (tag, padded)
        "bytes": 1106 + 78 + len(bytes(vp)),
        "captured_bytes": 64 + 64 + min(64, len(bytes(vp))),
        "ecn": {"ip_packets": 2, "ce": 1, "ect1": 1},  # tc=3 is CE; tos=1 is ECT(1)
        "pfc": {
            "frames": 1,
            "frames_per_priority": [0, 0, 1, 0, 0, 0, 1, 0],
            "xoff_per_priority": [0, 0, 1, 0, 0, 0, 0, 0],
            "paused_ns_per_priority": [0, 0, 7 * 512 // 100, 0, 0, 0, 0, 0],
        },  # fmt: skip
        "cnp": {"count": 1, "qps": 1},
        "roce": {"becn": 1},
    }
    # --- golden_short_*.pcap: packets shorter than their link header (or than the IP
    # header a raw-IP link starts with); scapy raises on all but the 12-byte SLL2 one (it
    # reads that one's first fields), `pcap show` must still say what they are. Every one
    # is a cut header of kind "other".
    short = {
        "ethernet": (1, [bytes(5), bytes(_eth())[:13]]),  # Ethernet needs 14 bytes
        "sll": (113, [bytes(10)]),  # Linux cooked needs 16
        "sll2": (276, [bytes(3), bytes(12)]),  # Linux cooked v2 needs 20
        "rawip": (101, [b"\x60\x00\x00", b"\x45" + bytes(9)]),  # IPv6 needs 40, IPv4 20
    }
    for name, (linktype, frames) in short.items():
        file = f"golden_short_{name}.pcap"
        write_pcap(HERE / file, [(T0_S * 10**9 + k * us, f) for k, f in enumerate(frames)],
                   linktype=linktype)  # fmt: skip
        expected[file] = {
            "format": "pcap",
            "problem": "",
            "packets": len(frames),
            "bytes": sum(len(f) for f in frames),
            "cut_headers": len(frames),
            "kinds": {"other": len(frames), "ip": 0, "udp": 0},
        }

    (HERE / "golden.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(expected)} captures' expectations to {HERE / 'golden.json'}")


if __name__ == "__main__":
    main()
