"""Captures of simulated ports: frames checked against scapy, files against tshark."""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from scapy.contrib.mac_control import MACControlClassBasedFlowControl
from scapy.contrib.roce import AETH, BTH, CNPPadding
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from aifabric.fabric.addressing import nic_ipv4
from aifabric.sim import layout as L
from aifabric.sim.engine import write_captures
from aifabric.sim.pcap import FrameBuilder
from tests.conftest import fabric as preset
from tests.simhelp import flows, run
from tests.test_sim_closed_forms import with_queue

MTU = 4096


def record(port, kind, flow=0, psn=0, nbytes=0, ce=0, arg=0, t_ps=1000):
    r = np.zeros(L.CP_N, dtype=np.int64)
    r[[L.CP_TIME, L.CP_PORT, L.CP_KIND, L.CP_FLOW, L.CP_PSN, L.CP_BYTES, L.CP_CE, L.CP_ARG]] = (
        t_ps, port, kind, flow, psn, nbytes, ce, arg,
    )  # fmt: skip
    return r


@pytest.fixture
def builder():
    fab = preset("lab-small")
    nics = fab.nic_ids
    table = flows([nics[0]], [nics[9]], 3 * MTU)
    return fab, table, FrameBuilder(fab, table, nic_ipv4(fab), MTU)


def icrc_by_scapy(frame: bytes) -> bytes:
    pkt = Ether(frame)
    pkt[BTH].icrc = None
    return bytes(pkt)[-4:]


def test_data_frames_parse_as_rocev2_with_the_right_fields_and_icrc(builder):
    fab, table, b = builder
    port = int(fab.nic_port[table.src[0]])
    for psn, op, ce in ((0, 0x00, 0), (1, 0x01, 1), (2, 0x02, 0)):
        frame = b.frame(record(port, L.K_DATA, psn=psn, nbytes=MTU, ce=ce))
        pkt = Ether(frame)
        ip = nic_ipv4(fab)
        assert pkt[IP].src == ".".join(str(x) for x in int(ip[table.src[0]]).to_bytes(4, "big"))
        assert pkt[IP].tos & 3 == (3 if ce else 2)
        assert pkt[UDP].dport == 4791 and pkt[UDP].sport == int(table.sport[0])
        assert pkt[BTH].opcode == op and pkt[BTH].psn == psn
        assert pkt[BTH].dqpn == int(table.dqpn[0])
        assert len(pkt[BTH].payload) == MTU + 4 or len(bytes(pkt[BTH])) == 12 + MTU + 4
        assert frame[-4:] == icrc_by_scapy(frame)
        again = Ether(frame)
        del again[IP].chksum
        assert bytes(Ether(bytes(again)))[14:34] == frame[14:34]


def test_cnp_and_ack_frames_parse_in_scapy(builder):
    fab, table, b = builder
    back = int(fab.nic_port[table.dst[0]])
    cnp = Ether(b.frame(record(back, L.K_CNP)))
    assert cnp[BTH].opcode == 0x81 and cnp[BTH].becn == 1 and cnp.haslayer(CNPPadding)
    assert cnp[BTH].dqpn == int(table.sqpn[0])
    assert bytes(cnp)[-4:] == icrc_by_scapy(bytes(cnp))
    ack = Ether(b.frame(record(back, L.K_ACK, psn=2)))
    assert ack[BTH].opcode == 0x11 and ack.haslayer(AETH) and ack[BTH].psn == 2
    assert ack[AETH].syndrome == 0
    # a NAK (the record's argument: 1 + the byte offset it asks for) asks for the PSN after
    # the last its receiver took, with the syndrome "PSN sequence error"
    nak = Ether(b.frame(record(back, L.K_ACK, psn=2, arg=1 + 3 * MTU)))
    assert nak[BTH].opcode == 0x11 and nak[BTH].psn == 3 and nak[AETH].syndrome == 0x60


@pytest.mark.parametrize("quanta", [0, 1, 0xFFFF])
def test_pfc_frames_parse_as_802_1qbb(builder, quanta):
    fab, _, b = builder
    pkt = Ether(b.frame(record(5, L.K_PFC, arg=quanta)))
    assert pkt.dst == "01:80:c2:00:00:01" and pkt.type == 0x8808
    pfc = pkt[MACControlClassBasedFlowControl]
    assert pfc.c3_enabled == 1 and pfc.c3_pause_time == quanta
    assert sum(getattr(pfc, f"c{i}_enabled") for i in range(8)) == 1
    assert len(bytes(pkt)) == 60


def test_a_simulated_capture_holds_data_cnp_ack_and_pfc_that_tshark_decodes(tmp_path):
    fab = with_queue(
        preset("lab-small"),
        pfc={"xoff_bytes": 200 * 1024, "xon_bytes": 150 * 1024, "headroom_bytes": 64 * 1024},
        model="static",  # pauses at this XOFF
    )
    nics = fab.nic_ids
    senders = [int(n) for n in nics[1:4]]
    recv = int(nics[0])
    table = flows(senders, [recv] * 3, 600 * MTU)
    bottleneck = int(fab.nic_port[recv]) ^ 1
    upstream = int(fab.nic_port[senders[0]])
    sim = run(fab, table, cc="dcqcn", capture_ports=[bottleneck, upstream, upstream ^ 1])
    recs = sim.captures()
    kinds = set(recs[:, L.CP_KIND].tolist())
    assert {L.K_DATA, L.K_PFC, L.K_CNP, L.K_ACK} <= kinds
    folder = SimpleNamespace(capture_path=lambda name: tmp_path / f"{name}.pcap")
    held = write_captures(sim, folder, [bottleneck, upstream, upstream ^ 1])
    paths = [tmp_path / f"{name}.pcap" for name in held]
    for path in paths:
        port = fab.port_id(path.stem)
        assert len(rdpcap(str(path))) == (recs[:, L.CP_PORT] == port).sum() == held[path.stem]
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    for path in paths:
        out = subprocess.run(
            ["tshark", "-r", str(path), "-V"], capture_output=True, text=True, check=True
        ).stdout
        assert "Malformed" not in out
        assert "[Expert Info (Error" not in out
    summary = subprocess.run(
        ["tshark", "-r", str(paths[0]), "-T", "fields", "-e", "frame.protocols"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "infiniband" in summary
