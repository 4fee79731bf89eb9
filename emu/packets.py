"""RoCEv2-like packets for the replay: UDP payloads that numba fills, sent with sendmmsg(2).

A data packet is the UDP payload of a RoCEv2 RDMA WRITE ONLY: the BTH (12
bytes: opcode 0x0A, P_Key 0xFFFF, destination QPN, PSN), a RETH (16 bytes:
virtual address = the byte offset in the flow, R_Key = the flow's row in the
flow table, DMA length = this packet's payload), the payload (zeros) and a
4-byte ICRC left zero (no NIC checks it here). The kernel adds IP (DSCP 26,
ECT(0)) and UDP (source port from the QPNs, destination 4791). A CNP is BTH
opcode 0x81 (BECN set) with the sender's QPN, 16 reserved bytes and the ICRC.
A NAK is the RC ACKNOWLEDGE (opcode 0x11) whose AETH syndrome 0x60 says "PSN
sequence error": the receiver expected the PSN it carries, so the sender goes
back there. Its AETH's message sequence number carries the flow's row (each
flow is one message), since several flows of a collective may share a QP.

Headers come from `aifabric.fabric.frames` (shared with the simulator's captures);
`fill_writes` writes the same BTH and RETH bytes at fixed offsets, in numba.
"""

from __future__ import annotations

import ctypes
import errno
import socket

import numpy as np
from numba import njit

from aifabric.fabric import frames as fr
from aifabric.fabric._numba_cache import lean_loads
from aifabric.fabric.frames import (
    AETH_NAK_PSN_SEQUENCE,
    BTH_BYTES,
    ICRC_BYTES,
    P_KEY_DEFAULT,
    RETH_BYTES,
)
from aifabric.fabric.frames import RC_ACKNOWLEDGE as OP_ACK
from aifabric.fabric.frames import RC_RDMA_WRITE_ONLY as OP_WRITE_ONLY

lean_loads()  # cached kernels load without numba's typing and lowering tables

HEADER_BYTES = BTH_BYTES + RETH_BYTES  # before the payload
OVERHEAD_BYTES = HEADER_BYTES + ICRC_BYTES
WIRE_OVERHEAD_BYTES = OVERHEAD_BYTES + 8 + 20 + 14 + 4 + 20
"""A replay packet's wire bytes besides its payload: the above, UDP 8, IPv4 20, Ethernet 14,
FCS 4, preamble and inter-frame gap 20."""


@njit(cache=True)
def fill_writes(buf, lens, flow, dqpn, psn0, offset0, remaining, mtu):
    """Fill up to len(buf) WRITE ONLY packets of one flow; return how many were filled.

    Row i gets PSN psn0 + i (24 bits) and the payload bytes at flow offset
    offset0 + i * mtu; lens[i] is the UDP payload length. The bytes are
    `write_only(...)`'s, written in place.
    """
    n = 0
    offset = offset0
    for i in range(buf.shape[0]):
        if remaining <= 0:
            break
        pay = min(mtu, remaining)
        psn = (psn0 + i) & 0xFFFFFF
        row = buf[i]
        row[0] = OP_WRITE_ONLY
        row[1] = 0
        row[2] = (P_KEY_DEFAULT >> 8) & 0xFF
        row[3] = P_KEY_DEFAULT & 0xFF
        row[4] = 0
        row[5] = (dqpn >> 16) & 0xFF
        row[6] = (dqpn >> 8) & 0xFF
        row[7] = dqpn & 0xFF
        row[8] = 0
        row[9] = (psn >> 16) & 0xFF
        row[10] = (psn >> 8) & 0xFF
        row[11] = psn & 0xFF
        for b in range(8):
            row[12 + b] = (offset >> (8 * (7 - b))) & 0xFF
        for b in range(4):
            row[20 + b] = (flow >> (8 * (3 - b))) & 0xFF
            row[24 + b] = (pay >> (8 * (3 - b))) & 0xFF
        lens[i] = HEADER_BYTES + pay + ICRC_BYTES
        remaining -= pay
        offset += pay
        n += 1
    return n


def write_only(dqpn: int, psn: int, offset: int, flow: int, payload: int) -> bytes:
    """One replay data packet (UDP payload) as `fill_writes` fills it."""
    head = fr.bth(OP_WRITE_ONLY, dqpn, psn) + fr.reth(offset, flow, payload)
    return head + bytes(payload) + bytes(ICRC_BYTES)


def parse_write(data: bytes) -> tuple[int, int, int, int, int]:
    """(opcode, dqpn, psn, flow, payload bytes) of a replay packet (at fixed offsets)."""
    op = data[0]
    dqpn = int.from_bytes(data[5:8], "big")
    psn = int.from_bytes(data[9:12], "big")
    if op != OP_WRITE_ONLY:
        return op, dqpn, psn, -1, 0
    flow = int.from_bytes(data[20:24], "big")
    pay = int.from_bytes(data[24:28], "big")
    return op, dqpn, psn, flow, pay


def cnp(sqpn: int) -> bytes:
    """A RoCEv2 CNP (UDP payload) to the QP that sent the marked packet."""
    return fr.cnp(sqpn) + bytes(ICRC_BYTES)


def nak(sqpn: int, psn: int, flow: int) -> bytes:
    """A go-back-N NAK to the QP `sqpn`: resend `flow` from `psn`, the one expected next."""
    return fr.acknowledge(sqpn, psn, AETH_NAK_PSN_SEQUENCE, flow) + bytes(ICRC_BYTES)


def parse_nak(data: bytes) -> tuple[int, int, int] | None:
    """(dqpn, psn, flow) of a NAK, or None for any other ACKNOWLEDGE."""
    if len(data) < 16 or data[0] != OP_ACK or data[12] != AETH_NAK_PSN_SEQUENCE:
        return None
    return (
        int.from_bytes(data[5:8], "big"),
        int.from_bytes(data[9:12], "big"),
        int.from_bytes(data[13:16], "big"),
    )


def kick_frame(src_mac: str, dst_mac: str) -> bytes:
    """A minimal frame (local experimental ethertype 0x88B5) that restarts a resumed qdisc."""
    mac = fr.mac_bytes(dst_mac) + fr.mac_bytes(src_mac)
    return mac + b"\x88\xb5" + bytes(46)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(_Iovec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


class _SockaddrIn(ctypes.Structure):
    _fields_ = [
        ("family", ctypes.c_uint16),
        ("port", ctypes.c_uint16),  # network order
        ("addr", ctypes.c_uint32),  # network order
        ("zero", ctypes.c_uint8 * 8),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
MSG_DONTWAIT = 0x40


_HDR = ctypes.sizeof(_Mmsghdr)
_FULL = (errno.EAGAIN, errno.ENOBUFS)  # the NIC queue is full for now
_LINK_DOWN = (errno.ENETDOWN, errno.ENETUNREACH, errno.EHOSTUNREACH)  # the host's link is down


class Batch:
    """`rows` packet buffers and the mmsghdr array that sends them in one sendmmsg call."""

    def __init__(self, rows: int, row_bytes: int):
        self.buf = np.zeros((rows, row_bytes), dtype=np.uint8)
        self.lens = np.zeros(rows, dtype=np.int64)
        self._iov = (_Iovec * rows)()
        self._msgs = (_Mmsghdr * rows)()
        self._to = _SockaddrIn(family=socket.AF_INET)
        # the iovecs' lengths as an array: set in one step, not one ctypes field at a time
        self._iov_len = np.frombuffer(self._iov, dtype=np.uint64).reshape(rows, 2)[:, 1]
        base = self.buf.ctypes.data
        for i in range(rows):
            self._iov[i].base = base + i * row_bytes
            self._msgs[i].hdr.iov = ctypes.pointer(self._iov[i])
            self._msgs[i].hdr.iovlen = 1
            self._msgs[i].hdr.name = ctypes.addressof(self._to)
            self._msgs[i].hdr.namelen = ctypes.sizeof(self._to)

    def send(self, sock: socket.socket | int, n: int, to: tuple[int, int]) -> int:
        """Send rows 0..n-1 from `sock` (or its descriptor) to `to` (IPv4 address, UDP
        port); returns how many left (0 when it would block).

        The socket is not connected on purpose: a connected UDP socket gets a random flow
        hash (`sk_txhash`) that its packets carry, and a Linux router forwards a packet
        that carries one by that hash instead of its multipath hash of the 5-tuple, so
        the paths would be neither the routes' nor the simulator's (aifabric.fabric.emuhash).
        A host whose link is down (a fault) loses what it sends, as a NIC would: the rows
        count as sent, and go-back-N resends them once they time out.
        """
        self._to.addr = socket.htonl(to[0])
        self._to.port = socket.htons(to[1])
        self._iov_len[:n] = self.lens[:n]
        fd = sock if isinstance(sock, int) else sock.fileno()
        r = _libc.sendmmsg(fd, self._msgs, n, MSG_DONTWAIT)
        if r < 0:
            err = ctypes.get_errno()
            if err in _FULL:
                return 0
            if err in _LINK_DOWN:
                return n
            raise OSError(err, "sendmmsg failed")
        return r


class RecvBatch:
    """Up to `rows` datagrams in one recvmmsg call, each with its IP_TOS (from IP_RECVTOS)."""

    CONTROL_BYTES = 32  # one cmsghdr (16 bytes) and the TOS byte, aligned

    def __init__(self, rows: int, row_bytes: int):
        self.buf = np.zeros((rows, row_bytes), dtype=np.uint8)
        self.control = np.zeros((rows, self.CONTROL_BYTES), dtype=np.uint8)
        self._iov = (_Iovec * rows)()
        self._msgs = (_Mmsghdr * rows)()
        raw = np.frombuffer(self._msgs, dtype=np.uint8).reshape(rows, _HDR)
        at = _Msghdr.controllen.offset
        self._controllen = raw[:, at : at + 8].view(np.uint64)[:, 0]
        at = _Mmsghdr.len.offset
        self.lens = raw[:, at : at + 4].view(np.uint32)[:, 0]  # each datagram's length
        for i in range(rows):
            self._iov[i].base = self.buf.ctypes.data + i * row_bytes
            self._iov[i].len = row_bytes
            self._msgs[i].hdr.iov = ctypes.pointer(self._iov[i])
            self._msgs[i].hdr.iovlen = 1
            self._msgs[i].hdr.control = self.control.ctypes.data + i * self.CONTROL_BYTES
        self.rows = rows

    def recv(self, fd: int) -> int:
        """Datagrams waiting on socket `fd`, at most `rows`: their count (0 when none)."""
        self._controllen[:] = self.CONTROL_BYTES
        r = _libc.recvmmsg(fd, self._msgs, self.rows, MSG_DONTWAIT, None)
        if r < 0:
            err = ctypes.get_errno()
            if err == errno.EAGAIN:
                return 0
            raise OSError(err, "recvmmsg failed")
        return r


NAKED, CNP_DUE, FINISHED, OTHER = 1, 2, 3, 4  # what `absorb` asks of its caller


@njit(cache=True)
def absorb(buf, lens, control, controllen, k, nbytes, expect, received, progress, ce,
           nak_for, last_cnp, now, t_cnp, out):  # fmt: skip
    """A receiver's go-back-N bookkeeping for `k` datagrams from `RecvBatch.recv`.

    A WRITE ONLY with the expected PSN is delivered (`received`, `expect`,
    `progress` at `now`); one past a gap asks for one NAK per gap; a CE-marked
    one counts in `ce` and asks for a CNP at most every `t_cnp`. Rows of `out`
    (kind, flow or datagram, PSN) say what to do: NAKED (send a NAK for that
    PSN), CNP_DUE, FINISHED (every byte arrived), OTHER (not a data packet:
    the row of `buf` to parse). Returns how many rows of `out` were filled.
    """
    m = 0
    n = nbytes.shape[0]
    for i in range(k):
        row = buf[i]
        if row[0] != OP_WRITE_ONLY or lens[i] < HEADER_BYTES:
            out[m, 0] = OTHER
            out[m, 1] = i
            m += 1
            continue
        f = 0
        pay = 0
        for b in range(4):
            f = (f << 8) | np.int64(row[20 + b])
            pay = (pay << 8) | np.int64(row[24 + b])
        if f >= n:
            continue
        psn = (np.int64(row[9]) << 16) | (np.int64(row[10]) << 8) | np.int64(row[11])
        tos = 0
        # one cmsghdr: cmsg_len (8 bytes), level SOL_IP (0), type IP_TOS (1), the byte
        if controllen[i] >= 17 and control[i, 8] == 0 and control[i, 12] == 1:
            tos = control[i, 16]
        ahead = (psn - expect[f]) & 0xFFFFFF
        if ahead == 0:
            received[f] += pay
            expect[f] += 1
            progress[f] = now
        elif ahead < 0x800000 and nak_for[f] != expect[f]:
            nak_for[f] = expect[f]  # a gap: one NAK, then wait for it
            out[m, 0] = NAKED
            out[m, 1] = f
            out[m, 2] = expect[f]
            m += 1
        if tos & 3 == 3:
            ce[f] += 1
            if now - last_cnp[f] >= t_cnp:
                last_cnp[f] = now
                out[m, 0] = CNP_DUE
                out[m, 1] = f
                m += 1
        if ahead == 0 and received[f] >= nbytes[f]:
            out[m, 0] = FINISHED
            out[m, 1] = f
            m += 1
    return m
