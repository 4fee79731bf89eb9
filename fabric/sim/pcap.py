"""Packet captures of simulated ports: the frames a port sent, rebuilt as real bytes.

The kernel records, for every frame a captured port puts on the wire, its
time, kind, flow, PSN, payload size, CE mark and argument (PFC quanta or a
clear-to-send grant). Here each record becomes an Ethernet frame, built with
`struct` at fixed offsets:

- data: IPv4 (DSCP 26, ECT(0) or CE) / UDP 4791 / BTH (RC SEND FIRST, MIDDLE,
  LAST or ONLY) / payload (zeros) / ICRC;
- CNP: BTH opcode 0x81, BECN set, 16 reserved bytes, ICRC (DSCP 48);
- ACK: BTH RC ACKNOWLEDGE / AETH; clear-to-send grants and requests: RC SEND
  ONLY with a 16-byte payload carrying the granted bytes;
- PFC: 802.1Qbb MAC control (0x8808, opcode 0x0101) to 01:80:c2:00:00:01,
  pausing the lossless priority for the quanta (0 resumes).

Files are classic pcap with nanosecond timestamps (magic 0xa1b23c4d); data
payloads are cut at `snaplen` bytes (the original length is recorded), as
`tcpdump -s` does.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from fabric.addressing import ROCE_UDP_PORT
from fabric.sim import layout as L

PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
DSCP_DATA = 26
DSCP_CNP = 48
ECN_ECT0 = 0b10
ECN_CE = 0b11
PFC_MAC = bytes.fromhex("0180c2000001")
CNP_OPCODE = 0x81
RC_SEND_FIRST, RC_SEND_MIDDLE, RC_SEND_LAST, RC_SEND_ONLY = 0x00, 0x01, 0x02, 0x04
RC_ACKNOWLEDGE = 0x11


def node_mac(node: int) -> bytes:
    """A locally administered MAC address derived from a node id."""
    return b"\x02\xaf" + struct.pack("!I", node & 0xFFFFFFFF)


def ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ipv4(src: int, dst: int, tos: int, payload_len: int) -> bytes:
    head = struct.pack("!BBHHHBBHII", 0x45, tos, 20 + payload_len, 0, 0x4000, 64, 17, 0, src, dst)
    return head[:10] + struct.pack("!H", ipv4_checksum(head)) + head[12:]


def icrc(ip: bytes, udp: bytes, bth_and_payload: bytes) -> bytes:
    """The RoCEv2 invariant CRC: CRC-32 over 8 bytes of ones, then IPv4, UDP, BTH and
    payload with the variant fields (TOS, TTL, IP checksum, UDP checksum, the BTH's
    FECN/BECN/reserved byte) set to ones; stored least significant byte first."""
    masked_ip = bytearray(ip)
    masked_ip[1] = 0xFF
    masked_ip[8] = 0xFF
    masked_ip[10:12] = b"\xff\xff"
    masked_udp = bytearray(udp)
    masked_udp[6:8] = b"\xff\xff"
    masked_bth = bytearray(bth_and_payload)
    masked_bth[4] = 0xFF
    crc = zlib.crc32(b"\xff" * 8 + bytes(masked_ip) + bytes(masked_udp) + bytes(masked_bth))
    return struct.pack("<I", crc & 0xFFFFFFFF)


def bth(opcode: int, dqpn: int, psn: int, *, becn: int = 0, ackreq: int = 0) -> bytes:
    return struct.pack(
        "!BBHII",
        opcode,
        0,
        0xFFFF,
        (becn << 30) | (dqpn & 0xFFFFFF),
        (ackreq << 31) | (psn & 0xFFFFFF),
    )


def roce_frame(
    src_mac: bytes,
    dst_mac: bytes,
    sip: int,
    dip: int,
    sport: int,
    tos: int,
    transport: bytes,
) -> bytes:
    """Ethernet / IPv4 / UDP 4791 / `transport` (BTH onwards, without ICRC) / ICRC."""
    udp_len = 8 + len(transport) + 4
    udp = struct.pack("!HHHH", sport, ROCE_UDP_PORT, udp_len, 0)
    ip = _ipv4(sip, dip, tos, udp_len)
    return dst_mac + src_mac + b"\x08\x00" + ip + udp + transport + icrc(ip, udp, transport)


def pfc_frame(src_mac: bytes, priority: int, quanta: int) -> bytes:
    """An 802.1Qbb PFC frame pausing one priority (quanta 0: resume), padded to 60 bytes."""
    times = [0] * 8
    times[priority] = quanta
    body = struct.pack("!HH8H", 0x0101, 1 << priority, *times)
    frame = PFC_MAC + src_mac + b"\x88\x08" + body
    return frame + b"\x00" * (60 - len(frame))


class FrameBuilder:
    """Turns capture records of one simulation into frames."""

    def __init__(self, fabric, flows, ip: np.ndarray, mtu: int, lossless_priority: int = 3):
        self.fabric = fabric
        self.flows = flows
        self.ip = ip
        self.mtu = mtu
        self.priority = lossless_priority

    def frame(self, rec) -> bytes:
        f = self.fabric
        port = int(rec[L.CP_PORT])
        node, peer = int(f.port_node[port]), int(f.port_peer[port])
        kind = int(rec[L.CP_KIND])
        if kind == L.K_PFC:
            return pfc_frame(node_mac(node), self.priority, int(rec[L.CP_ARG]))
        t = self.flows
        flow = int(rec[L.CP_FLOW])
        src, dst = int(t.src[flow]), int(t.dst[flow])
        sqpn, dqpn, sport = int(t.sqpn[flow]), int(t.dqpn[flow]), int(t.sport[flow])
        psn = int(rec[L.CP_PSN])
        macs = (node_mac(node), node_mac(peer))
        if kind == L.K_DATA:
            npkts = max(1, -(-int(t.bytes[flow]) // self.mtu))
            size = int(rec[L.CP_BYTES])
            if npkts == 1:
                op = RC_SEND_ONLY
            elif psn == 0:
                op = RC_SEND_FIRST
            elif psn >= npkts - 1 or size < self.mtu:
                op = RC_SEND_LAST
            else:
                op = RC_SEND_MIDDLE
            last = op in (RC_SEND_LAST, RC_SEND_ONLY)
            tos = (DSCP_DATA << 2) | (ECN_CE if rec[L.CP_CE] else ECN_ECT0)
            transport = bth(op, dqpn, psn, ackreq=int(last)) + bytes(size)
            return roce_frame(*macs, self.ip[src], self.ip[dst], sport, tos, transport)
        if kind == L.K_CNP:
            transport = bth(CNP_OPCODE, sqpn, 0, becn=1) + bytes(16)
            tos = DSCP_CNP << 2
        elif kind == L.K_ACK:
            transport = bth(RC_ACKNOWLEDGE, sqpn, psn) + struct.pack("!I", 0)
            tos = DSCP_CNP << 2
        elif kind == L.K_CTS:
            grant = struct.pack("!Q8x", int(rec[L.CP_ARG]))
            transport = bth(RC_SEND_ONLY, sqpn, 0) + grant
            tos = DSCP_CNP << 2
        else:  # K_REQ travels with the data, from the sender
            transport = bth(RC_SEND_ONLY, dqpn, 0) + bytes(16)
            return roce_frame(*macs, self.ip[src], self.ip[dst], sport, DSCP_CNP << 2, transport)
        return roce_frame(*macs, self.ip[dst], self.ip[src], sport, tos, transport)


def write_pcap(path: str | Path, frames, snaplen: int = 65535) -> None:
    """frames: (time_ns, bytes) pairs -> a pcap file with nanosecond timestamps."""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, snaplen, LINKTYPE_ETHERNET))
        for t_ns, frame in frames:
            cut = frame[:snaplen]
            fh.write(struct.pack("<IIII", t_ns // 10**9, t_ns % 10**9, len(cut), len(frame)) + cut)


def port_label(fabric, port: int) -> str:
    return f"{fabric.node_name[fabric.port_node[port]]}-p{int(fabric.port_number[port])}"


def write_captures(folder: str | Path, fabric, builder: FrameBuilder, records, ports, snaplen):
    """One pcap per captured port; returns the paths written."""
    folder = Path(folder)
    paths = []
    for port in ports:
        sel = records[records[:, L.CP_PORT] == port]
        path = folder / f"{port_label(fabric, int(port))}.pcap"
        frames = ((int(r[L.CP_TIME]) // L.PS_PER_NS, builder.frame(r)) for r in sel)
        write_pcap(path, frames, snaplen)
        paths.append(path)
    return paths
