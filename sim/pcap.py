"""Packet captures of simulated ports: the frames a port sent, rebuilt as real bytes.

The kernel records, for every frame a captured port puts on the wire, its
time, kind, flow, PSN, payload size, CE mark and argument (PFC quanta or a
clear-to-send grant). Here each record becomes an Ethernet frame, built by
`aifabric.fabric.frames` (shared with the emulator's replay):

- data: IPv4 (DSCP 26, ECT(0) or CE) / UDP 4791 / BTH (RC SEND FIRST, MIDDLE,
  LAST or ONLY) / payload (zeros) / ICRC;
- CNP: BTH opcode 0x81, BECN set, 16 reserved bytes, ICRC (DSCP 48);
- ACK: BTH RC ACKNOWLEDGE / AETH, acknowledging the PSN of the last data
  packet its receiver took; a NAK (syndrome PSN sequence error) asks for the
  PSN after it;
- clear-to-send grants and requests: RC SEND ONLY with a 16-byte payload
  carrying the granted bytes;
- PFC: 802.1Qbb MAC control (0x8808, opcode 0x0101) to 01:80:c2:00:00:01,
  pausing the lossless priority for the quanta (0 resumes).

Files are classic pcap with nanosecond timestamps (magic 0xa1b23c4d); data
payloads are cut at `snaplen` bytes (the original length is recorded), as
`tcpdump -s` does.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from aifabric.fabric import frames as fr
from aifabric.sim import layout as L

PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
CTS_PAYLOAD_BYTES = 16


def node_mac(node: int) -> bytes:
    """A locally administered MAC address derived from a node id."""
    return b"\x02\xaf" + struct.pack("!I", node & 0xFFFFFFFF)


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
            return fr.pfc_frame(node_mac(node), self.priority, int(rec[L.CP_ARG]))
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
                op = fr.RC_SEND_ONLY
            elif psn == 0:
                op = fr.RC_SEND_FIRST
            elif psn >= npkts - 1 or size < self.mtu:
                op = fr.RC_SEND_LAST
            else:
                op = fr.RC_SEND_MIDDLE
            last = op in (fr.RC_SEND_LAST, fr.RC_SEND_ONLY)
            tos = (fr.DSCP_DATA << 2) | (fr.ECN_CE if rec[L.CP_CE] else fr.ECN_ECT0)
            transport = fr.bth(op, dqpn, psn, ackreq=int(last)) + bytes(size)
            return fr.roce_frame(*macs, self.ip[src], self.ip[dst], sport, tos, transport)
        if kind == L.K_CNP:
            transport = fr.cnp(sqpn)
        elif kind == L.K_ACK and rec[L.CP_ARG]:  # a NAK: go back to the PSN after it
            transport = fr.acknowledge(sqpn, psn + 1, fr.AETH_NAK_PSN_SEQUENCE)
        elif kind == L.K_ACK:
            transport = fr.acknowledge(sqpn, psn)
        elif kind == L.K_CTS:
            grant = struct.pack("!Q8x", int(rec[L.CP_ARG]))
            transport = fr.bth(fr.RC_SEND_ONLY, sqpn, 0) + grant
        else:  # K_REQ travels with the data, from the sender
            transport = fr.bth(fr.RC_SEND_ONLY, dqpn, 0) + bytes(CTS_PAYLOAD_BYTES)
            return fr.roce_frame(*macs, self.ip[src], self.ip[dst], sport, fr.TOS_CNP, transport)
        return fr.roce_frame(*macs, self.ip[dst], self.ip[src], sport, fr.TOS_CNP, transport)


def write_pcap(path: str | Path, frames, snaplen: int = 65535) -> None:
    """frames: (time_ns, bytes) pairs -> a pcap file with nanosecond timestamps."""
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", PCAP_MAGIC_NS, 2, 4, 0, 0, snaplen, LINKTYPE_ETHERNET))
        for t_ns, frame in frames:
            cut = frame[:snaplen]
            fh.write(struct.pack("<IIII", t_ns // 10**9, t_ns % 10**9, len(cut), len(frame)) + cut)
