"""RoCEv2 and 802.1Qbb PFC frames as bytes, for every engine.

The simulator's captures rebuild the frames a port sent; the emulator's replay
sends the RoCEv2 transport (BTH onwards) as UDP payloads and PFC frames on raw
sockets. Both build them here, with `struct` at fixed offsets, as
scapy.contrib.roce and scapy.contrib.mac_control declare the headers:

- BTH (12 bytes): opcode, flags (solicited, migration, pad, version: all 0),
  P_Key 0xFFFF, FECN/BECN/reserved byte, destination QPN (24 bits),
  AckReq/reserved byte, PSN (24 bits);
- RETH (16 bytes): virtual address (64), R_Key (32), DMA length (32);
- AETH (4 bytes): syndrome (8), message sequence number (24);
- CNP: BTH opcode 0x81 with BECN set, 16 reserved bytes;
- ICRC (4 bytes): CRC-32 over the invariant fields, least significant byte first;
- PFC: MAC control (EtherType 0x8808) opcode 0x0101 to 01:80:c2:00:00:01, a
  class-enable vector and eight pause times in quanta of 512 bit times, padded
  to the 60-byte minimum frame.
"""

from __future__ import annotations

import struct
import zlib

from aifabric.fabric.addressing import ROCE_UDP_PORT

# BTH opcodes (RC transport, and the RoCEv2 CNP)
RC_SEND_FIRST = 0x00
RC_SEND_MIDDLE = 0x01
RC_SEND_LAST = 0x02
RC_SEND_ONLY = 0x04
RC_RDMA_WRITE_ONLY = 0x0A
RC_ACKNOWLEDGE = 0x11
CNP_OPCODE = 0x81
AETH_ACK = 0x00  # syndrome: ACK, credit count 0
AETH_NAK_PSN_SEQUENCE = 0x60  # syndrome: NAK, PSN sequence error (go back to the PSN)

BTH_BYTES = 12
RETH_BYTES = 16
AETH_BYTES = 4
CNP_PAD_BYTES = 16
ICRC_BYTES = 4
P_KEY_DEFAULT = 0xFFFF

DSCP_DATA = 26
DSCP_CNP = 48
ECN_ECT0 = 0b10
ECN_CE = 0b11
TOS_DATA_ECT0 = (DSCP_DATA << 2) | ECN_ECT0
TOS_CNP = DSCP_CNP << 2

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_MAC_CONTROL = 0x8808
PFC_OPCODE = 0x0101
PFC_MAC = bytes.fromhex("0180c2000001")
MIN_FRAME_BYTES = 60  # without the FCS


def mac_bytes(mac: bytes | str) -> bytes:
    """A MAC address as 6 bytes, from bytes or text such as 02:af:00:00:00:01."""
    return mac if isinstance(mac, bytes) else bytes.fromhex(mac.replace(":", ""))


def bth(opcode: int, dqpn: int, psn: int, *, becn: int = 0, ackreq: int = 0) -> bytes:
    return struct.pack(
        "!BBHII",
        opcode,
        0,
        P_KEY_DEFAULT,
        (becn << 30) | (dqpn & 0xFFFFFF),
        (ackreq << 31) | (psn & 0xFFFFFF),
    )


def reth(virtual_address: int, r_key: int, dma_length: int) -> bytes:
    return struct.pack("!QII", virtual_address, r_key, dma_length)


def aeth(syndrome: int, msn: int) -> bytes:
    return struct.pack("!I", (syndrome << 24) | (msn & 0xFFFFFF))


def cnp(qpn: int) -> bytes:
    """The transport of a CNP (BTH and reserved bytes) to the QP that sent a marked packet."""
    return bth(CNP_OPCODE, qpn, 0, becn=1) + bytes(CNP_PAD_BYTES)


def acknowledge(qpn: int, psn: int, syndrome: int = AETH_ACK, msn: int = 0) -> bytes:
    """The transport of an RC ACKNOWLEDGE (BTH and AETH): an ACK, or a NAK by its syndrome."""
    return bth(RC_ACKNOWLEDGE, qpn, psn) + aeth(syndrome, msn)


def ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ipv4_header(src: int, dst: int, tos: int, payload_len: int) -> bytes:
    """20 bytes of IPv4 carrying UDP: don't fragment, TTL 64, checksum filled in."""
    head = struct.pack("!BBHHHBBHII", 0x45, tos, 20 + payload_len, 0, 0x4000, 64, 17, 0, src, dst)
    return head[:10] + struct.pack("!H", ipv4_checksum(head)) + head[12:]


def icrc(ip: bytes, udp: bytes, transport: bytes) -> bytes:
    """The RoCEv2 invariant CRC: CRC-32 over 8 bytes of ones, then IPv4, UDP, BTH and
    payload with the variant fields (TOS, TTL, IP checksum, UDP checksum, the BTH's
    FECN/BECN/reserved byte) set to ones; stored least significant byte first."""
    masked_ip = bytearray(ip)
    masked_ip[1] = 0xFF
    masked_ip[8] = 0xFF
    masked_ip[10:12] = b"\xff\xff"
    masked_udp = bytearray(udp)
    masked_udp[6:8] = b"\xff\xff"
    masked_bth = bytearray(transport)
    masked_bth[4] = 0xFF
    crc = zlib.crc32(b"\xff" * 8 + bytes(masked_ip) + bytes(masked_udp) + bytes(masked_bth))
    return struct.pack("<I", crc & 0xFFFFFFFF)


def roce_frame(
    src_mac: bytes | str,
    dst_mac: bytes | str,
    sip: int,
    dip: int,
    sport: int,
    tos: int,
    transport: bytes,
) -> bytes:
    """Ethernet / IPv4 / UDP 4791 / `transport` (BTH onwards, without ICRC) / ICRC."""
    udp_len = 8 + len(transport) + ICRC_BYTES
    udp = struct.pack("!HHHH", sport, ROCE_UDP_PORT, udp_len, 0)
    ip = ipv4_header(sip, dip, tos, udp_len)
    ether = mac_bytes(dst_mac) + mac_bytes(src_mac) + struct.pack("!H", ETHERTYPE_IPV4)
    return ether + ip + udp + transport + icrc(ip, udp, transport)


def pfc_frame(src_mac: bytes | str, priority: int, quanta: int) -> bytes:
    """An 802.1Qbb PFC frame pausing `priority` for `quanta` (0 resumes), padded to 60 bytes."""
    times = [0] * 8
    times[priority] = quanta
    body = struct.pack("!HH8H", PFC_OPCODE, 1 << priority, *times)
    frame = PFC_MAC + mac_bytes(src_mac) + struct.pack("!H", ETHERTYPE_MAC_CONTROL) + body
    return frame + bytes(MIN_FRAME_BYTES - len(frame))
