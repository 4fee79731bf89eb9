"""The shared frame builders, field by field against scapy's RoCE and MAC control layers."""

from __future__ import annotations

import pytest
from scapy.contrib.mac_control import MACControlClassBasedFlowControl
from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from aifabric.fabric import frames as fr

SRC_MAC, DST_MAC = "02:af:00:00:00:07", "02:af:00:00:01:02"
SIP, DIP = 0x0A000001, 0x0A000102


def frame(transport: bytes, tos: int = fr.TOS_DATA_ECT0, sport: int = 0xC123) -> Ether:
    return Ether(fr.roce_frame(SRC_MAC, DST_MAC, SIP, DIP, sport, tos, transport))


def icrc_by_scapy(raw: bytes) -> bytes:
    pkt = Ether(raw)
    pkt[BTH].icrc = None
    return bytes(pkt)[-4:]


@pytest.mark.parametrize("opcode", [fr.RC_SEND_FIRST, fr.RC_SEND_MIDDLE, fr.RC_SEND_LAST])
@pytest.mark.parametrize("becn, ackreq", [(0, 0), (1, 1)])
def test_bth_fields(opcode, becn, ackreq):
    b = BTH(fr.bth(opcode, 0xABCDEF, 0xFEDCBA, becn=becn, ackreq=ackreq) + bytes(4))
    assert (b.opcode, b.solicited, b.migreq, b.padcount, b.version) == (opcode, 0, 0, 0, 0)
    assert (b.pkey, b.fecn, b.becn, b.resv6) == (0xFFFF, 0, becn, 0)
    assert (b.dqpn, b.ackreq, b.resv7, b.psn) == (0xABCDEF, ackreq, 0, 0xFEDCBA)
    assert len(fr.bth(opcode, 1, 1)) == fr.BTH_BYTES


def test_qpn_and_psn_keep_24_bits():
    b = BTH(fr.bth(fr.RC_SEND_ONLY, 0x1ABCDEF, 0x1000005) + bytes(4))
    assert (b.dqpn, b.psn, b.becn, b.ackreq) == (0xABCDEF, 5, 0, 0)


def test_data_frame_ip_udp_and_icrc():
    payload = bytes(range(200))
    raw = fr.roce_frame(SRC_MAC, DST_MAC, SIP, DIP, 0xC123, fr.TOS_DATA_ECT0,
                        fr.bth(fr.RC_SEND_ONLY, 77, 9, ackreq=1) + payload)  # fmt: skip
    pkt = Ether(raw)
    assert (pkt.src, pkt.dst, pkt.type) == (SRC_MAC, DST_MAC, 0x0800)
    ip = pkt[IP]
    assert (ip.src, ip.dst, ip.tos, ip.ttl, ip.proto, ip.flags) == (
        "10.0.0.1", "10.0.1.2", 26 << 2 | 2, 64, 17, "DF",
    )  # fmt: skip
    assert ip.len == len(raw) - 14
    ip_check = ip.chksum
    ip.chksum = None
    assert IP(bytes(ip)).chksum == ip_check  # scapy computes the same checksum
    assert (pkt[UDP].sport, pkt[UDP].dport, pkt[UDP].len) == (0xC123, 4791, len(raw) - 34)
    assert raw[42 + fr.BTH_BYTES : -4] == payload and len(pkt[BTH]) == fr.BTH_BYTES + 200 + 4
    assert raw[-4:] == icrc_by_scapy(raw)
    assert raw[-4:] == fr.icrc(raw[14:34], raw[34:42], raw[42:-4])


def test_icrc_ignores_the_variant_fields():
    transport = fr.bth(fr.RC_SEND_ONLY, 5, 6) + bytes(64)
    a = fr.roce_frame(SRC_MAC, DST_MAC, SIP, DIP, 1000, fr.TOS_DATA_ECT0, transport)
    ce = fr.roce_frame(SRC_MAC, DST_MAC, SIP, DIP, 1000, (26 << 2) | fr.ECN_CE, transport)
    becn = fr.roce_frame(SRC_MAC, DST_MAC, SIP, DIP, 1000, fr.TOS_DATA_ECT0,
                         fr.bth(fr.RC_SEND_ONLY, 5, 6, becn=1) + bytes(64))  # fmt: skip
    other_qp = fr.roce_frame(SRC_MAC, DST_MAC, SIP, DIP, 1000, fr.TOS_DATA_ECT0,
                             fr.bth(fr.RC_SEND_ONLY, 4, 6) + bytes(64))  # fmt: skip
    assert a[-4:] == ce[-4:] == becn[-4:] != other_qp[-4:]


def test_reth_fields():
    raw = fr.bth(fr.RC_RDMA_WRITE_ONLY, 3, 4) + fr.reth(0x0123456789ABCDEF, 0xDEADBEEF, 4096)
    assert raw[12:20] == (0x0123456789ABCDEF).to_bytes(8, "big")
    assert raw[20:24] == (0xDEADBEEF).to_bytes(4, "big") and raw[24:28] == (4096).to_bytes(4, "big")
    assert len(raw) == fr.BTH_BYTES + fr.RETH_BYTES


def test_cnp_as_scapy_declares_it():
    raw = fr.roce_frame(SRC_MAC, DST_MAC, DIP, SIP, 0xC123, fr.TOS_CNP, fr.cnp(0x654321))
    pkt = Ether(raw)
    b = pkt[BTH]
    assert (b.opcode, b.becn, b.dqpn, b.psn) == (0x81, 1, 0x654321, 0)
    assert pkt.haslayer(CNPPadding) and pkt[IP].tos == 48 << 2
    assert len(fr.cnp(1)) == fr.BTH_BYTES + fr.CNP_PAD_BYTES
    assert raw[-4:] == icrc_by_scapy(raw)


@pytest.mark.parametrize(
    "syndrome, msn", [(fr.AETH_ACK, 0), (fr.AETH_NAK_PSN_SEQUENCE, 1234), (0x1F, 0xFFFFFF)]
)
def test_acknowledge_and_nak_aeth(syndrome, msn):
    raw = fr.roce_frame(SRC_MAC, DST_MAC, DIP, SIP, 7, fr.TOS_CNP,
                        fr.acknowledge(0x111111, 77, syndrome, msn))  # fmt: skip
    pkt = Ether(raw)
    assert (pkt[BTH].opcode, pkt[BTH].dqpn, pkt[BTH].psn) == (0x11, 0x111111, 77)
    assert (pkt[AETH].syndrome, pkt[AETH].msn) == (syndrome, msn)
    assert raw[-4:] == icrc_by_scapy(raw)


@pytest.mark.parametrize("priority", range(8))
@pytest.mark.parametrize("quanta", [0, 1, 0xFFFF])
def test_pfc_as_802_1qbb(priority, quanta):
    raw = fr.pfc_frame(SRC_MAC, priority, quanta)
    assert raw == fr.pfc_frame(fr.mac_bytes(SRC_MAC), priority, quanta)  # text or bytes MAC
    pkt = Ether(raw)
    assert len(raw) == 60 and (pkt.dst, pkt.src, pkt.type) == ("01:80:c2:00:00:01", SRC_MAC, 0x8808)
    pfc = pkt[MACControlClassBasedFlowControl]
    assert pfc._op_code == 0x0101
    for c in range(8):
        assert getattr(pfc, f"c{c}_enabled") == (c == priority)
        assert getattr(pfc, f"c{c}_pause_time") == (quanta if c == priority else 0)
