"""Reading packet captures fast: pcap and pcapng into columnar arrays.

Two numba kernels read the file's bytes (a read-only memory map): a walk over
the records (run twice: once to count them, once to fill arrays of exactly
that size with time, lengths and offsets), then one pass that decodes every
packet at fixed offsets: Ethernet (or Linux cooked SLL/SLL2, or raw IP), up
to two 802.1Q/802.1ad tags, IPv4 / IPv6, UDP, the RoCEv2 base transport header
(UDP destination port 4791) and MAC control frames (ethertype 0x8808): 802.1Qbb
PFC (opcode 0x0101) and 802.3x PAUSE (opcode 0x0001) are kept apart.

A capture that ends in the middle of a record, or whose record or block
length is impossible, is read up to that point; `Capture.problem` says in
one sentence what was wrong and how much was read. A file that is not a
capture at all raises `AifabricError`.

The columns (one row per packet) are grouped by dtype so the kernels take a
handful of arrays: `u8[U8_FIELDS]`, `u32[U32_FIELDS]`, `u64[U64_FIELDS]`,
`time_ns` and `quanta[:, 8]`; `Capture` exposes each as an attribute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

from aifabric.fabric._numba_cache import lean_loads
from aifabric.fabric.errors import AifabricError

lean_loads()  # cached kernels load without numba's typing and lowering tables

# What a packet is, from the deepest layer the kernel decoded completely.
KIND_OTHER = 0  # unknown ethertype or link type
KIND_IP = 1  # IPv4 / IPv6, not UDP (or a non-first fragment)
KIND_UDP = 2  # UDP, not RoCEv2
KIND_ROCE = 3  # RoCEv2 BTH, any opcode but CNP
KIND_CNP = 4  # RoCEv2 congestion notification packet (BTH opcode 0x81)
KIND_PFC = 5  # 802.1Qbb priority flow control (MAC control opcode 0x0101)
KIND_PAUSE = 6  # 802.3x PAUSE (MAC control opcode 0x0001)
KIND_MACCTL = 7  # another MAC control opcode
KIND_NAMES = ("other", "ip", "udp", "roce", "cnp", "pfc", "pause", "macctl")

CNP_OPCODE = 0x81
ROCE_PORT = 4791
ETH_MACCTL = 0x8808

# flags
FLAG_CUT = 1  # the snap length cut a header the packet declares (kind is what was decoded)

U8_FIELDS = (
    "kind", "flags", "ntags", "pcp", "ipver", "proto", "dscp", "ecn",
    "opcode", "fecn", "becn", "pfc_enable",
)  # fmt: skip
U32_FIELDS = ("length", "caplen", "iface", "vlan", "sport", "dport", "dqpn", "psn", "ethertype")
U64_FIELDS = ("src_hi", "src_lo", "dst_hi", "dst_lo", "offset")
_U8 = {n: i for i, n in enumerate(U8_FIELDS)}
_U32 = {n: i for i, n in enumerate(U32_FIELDS)}
_U64 = {n: i for i, n in enumerate(U64_FIELDS)}

# link types (pcap LINKTYPE_*)
LINK_ETHERNET = 1
LINK_RAW = 101
LINK_SLL = 113
LINK_IPV4 = 228
LINK_IPV6 = 229
LINK_SLL2 = 276

# kernel status codes
ST_OK = 0
ST_TRUNCATED = 1  # the file ends inside a record
ST_BAD_LENGTH = 2  # a record or block length that cannot be right
ST_BAD_IFACE = 3  # a pcapng packet names an interface that was not described
ST_BAD_RESOL = 4  # a pcapng if_tsresol the reader cannot represent
ST_TOO_MANY_IFACES = 5

MAX_IFACES = 256
MAX_RECORD = 262_144  # the largest record tcpdump and Wireshark write

PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": (True, 1000),  # little-endian, microseconds
    b"\xa1\xb2\xc3\xd4": (False, 1000),
    b"\x4d\x3c\xb2\xa1": (True, 1),  # little-endian, nanoseconds
    b"\xa1\xb2\x3c\x4d": (False, 1),
}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"


# --- byte helpers ---------------------------------------------------------------------


@njit(cache=True)
def _be16(b, o):
    return (np.uint32(b[o]) << 8) | np.uint32(b[o + 1])


@njit(cache=True)
def _be24(b, o):
    return (np.uint32(b[o]) << 16) | (np.uint32(b[o + 1]) << 8) | np.uint32(b[o + 2])


@njit(cache=True)
def _be32(b, o):
    return (
        (np.uint32(b[o]) << 24)
        | (np.uint32(b[o + 1]) << 16)
        | (np.uint32(b[o + 2]) << 8)
        | np.uint32(b[o + 3])
    )


@njit(cache=True)
def _be64(b, o):
    return (np.uint64(_be32(b, o)) << np.uint64(32)) | np.uint64(_be32(b, o + 4))


@njit(cache=True)
def _u16(b, o, le):
    if le:
        return np.uint32(b[o]) | (np.uint32(b[o + 1]) << 8)
    return _be16(b, o)


@njit(cache=True)
def _u32(b, o, le):
    if le:
        return (
            np.uint32(b[o])
            | (np.uint32(b[o + 1]) << 8)
            | (np.uint32(b[o + 2]) << 16)
            | (np.uint32(b[o + 3]) << 24)
        )
    return _be32(b, o)


# --- one packet -------------------------------------------------------------------------


@njit(cache=True)
def _decode_all(b, linktypes, u8, u32, u64, quanta):
    """Decode every packet whose record the walk found (offset, caplen, iface columns).

    One loop, no calls per packet (a call that takes arrays costs reference counting).
    A `continue` ends a packet: at an unknown type, or where the snap length cut a header
    (FLAG_CUT; `kind` then says what was decoded before it).
    """
    n = u8.shape[1]
    for i in range(n):
        o = np.int64(u64[4, i])
        end = o + np.int64(u32[1, i])
        linktype = linktypes[u32[2, i]]
        p = o
        etype = np.uint32(0)
        if linktype == LINK_ETHERNET:
            if p + 14 > end:
                u8[1, i] = FLAG_CUT
                continue
            etype = _be16(b, p + 12)
            p += 14
        elif linktype == LINK_SLL:
            if p + 16 > end:
                u8[1, i] = FLAG_CUT
                continue
            etype = _be16(b, p + 14)
            p += 16
        elif linktype == LINK_SLL2:
            if p + 20 > end:
                u8[1, i] = FLAG_CUT
                continue
            etype = _be16(b, p)
            p += 20
        elif linktype in (LINK_RAW, LINK_IPV4, LINK_IPV6):
            if p + 1 > end:
                u8[1, i] = FLAG_CUT
                continue
            v = b[p] >> 4
            if v == 4:
                etype = np.uint32(0x0800)
            elif v == 6:
                etype = np.uint32(0x86DD)
            else:
                continue
        else:
            continue
        ntags = 0
        cut = False
        while (etype == 0x8100 or etype == 0x88A8) and ntags < 2:
            if p + 4 > end:
                cut = True
                break
            tci = _be16(b, p)
            if ntags == 0:
                u8[3, i] = tci >> 13
                u32[3, i] = tci & 0xFFF
            etype = _be16(b, p + 2)
            p += 4
            ntags += 1
        u8[2, i] = ntags
        u32[8, i] = etype
        if cut:
            u8[1, i] = FLAG_CUT
            continue

        if etype == ETH_MACCTL:
            if p + 2 > end:
                u8[1, i] = FLAG_CUT
                continue
            op = _be16(b, p)
            if op == 0x0001:
                if p + 4 > end:
                    u8[1, i] = FLAG_CUT
                    continue
                u8[0, i] = KIND_PAUSE
                quanta[i, 0] = _be16(b, p + 2)
            elif op == 0x0101:
                if p + 20 > end:
                    u8[1, i] = FLAG_CUT
                    continue
                u8[0, i] = KIND_PFC
                u8[11, i] = b[p + 3]
                for k in range(8):
                    quanta[i, k] = _be16(b, p + 4 + 2 * k)
            else:
                u8[0, i] = KIND_MACCTL
            continue

        proto = np.uint32(0)
        if etype == 0x0800:
            if p + 20 > end:
                u8[1, i] = FLAG_CUT
                continue
            ihl = np.int64(b[p] & 0xF) * 4
            if (b[p] >> 4) != 4 or ihl < 20:
                continue
            u8[4, i] = 4
            u8[6, i] = b[p + 1] >> 2
            u8[7, i] = b[p + 1] & 3
            proto = np.uint32(b[p + 9])
            u8[5, i] = proto
            u64[1, i] = np.uint64(0xFFFF00000000) | np.uint64(_be32(b, p + 12))
            u64[3, i] = np.uint64(0xFFFF00000000) | np.uint64(_be32(b, p + 16))
            u8[0, i] = KIND_IP
            if (_be16(b, p + 6) & 0x1FFF) != 0:
                continue  # a later fragment: no transport header here
            if p + ihl > end:
                u8[1, i] = FLAG_CUT
                continue
            p += ihl
        elif etype == 0x86DD:
            if p + 40 > end:
                u8[1, i] = FLAG_CUT
                continue
            if (b[p] >> 4) != 6:
                continue
            tc = ((b[p] & 0xF) << 4) | (b[p + 1] >> 4)
            u8[4, i] = 6
            u8[6, i] = tc >> 2
            u8[7, i] = tc & 3
            proto = np.uint32(b[p + 6])
            u64[0, i] = _be64(b, p + 8)
            u64[1, i] = _be64(b, p + 16)
            u64[2, i] = _be64(b, p + 24)
            u64[3, i] = _be64(b, p + 32)
            u8[0, i] = KIND_IP
            p += 40
            # hop-by-hop, routing and destination options extension headers
            while proto == 0 or proto == 43 or proto == 60:
                if p + 8 > end:
                    cut = True
                    break
                nxt = np.uint32(b[p])
                p += (np.int64(b[p + 1]) + 1) * 8
                proto = nxt
            u8[5, i] = proto
            if cut:
                u8[1, i] = FLAG_CUT
                continue
        else:
            continue

        if proto != 17:
            continue
        if p + 8 > end:
            u8[1, i] = FLAG_CUT
            continue
        dport = _be16(b, p + 2)
        u32[4, i] = _be16(b, p)
        u32[5, i] = dport
        u8[0, i] = KIND_UDP
        p += 8
        if dport != ROCE_PORT:
            continue
        if p + 12 > end:
            u8[1, i] = FLAG_CUT
            continue
        opcode = b[p]
        u8[8, i] = opcode
        u8[9, i] = b[p + 4] >> 7
        u8[10, i] = (b[p + 4] >> 6) & 1
        u32[6, i] = _be24(b, p + 5)
        u32[7, i] = _be24(b, p + 9)
        u8[0, i] = KIND_CNP if opcode == CNP_OPCODE else KIND_ROCE


# --- record walks -----------------------------------------------------------------------


@njit(cache=True)
def _walk_pcap(b, le, ts_mul, snaplen, fill, time_ns, u32, u64):
    """Walk the records of a pcap file (after its 24-byte header).

    Returns (records, status, stop offset). With `fill` False only counts.
    """
    n_bytes = len(b)
    limit = max(snaplen, MAX_RECORD)
    o = 24
    i = 0
    while o < n_bytes:
        if o + 16 > n_bytes:
            return i, ST_TRUNCATED, o
        incl = _u32(b, o + 8, le)
        if incl > limit:
            return i, ST_BAD_LENGTH, o
        if o + 16 + incl > n_bytes:
            return i, ST_TRUNCATED, o
        if fill:
            sec = np.int64(_u32(b, o, le))
            frac = np.int64(_u32(b, o + 4, le))
            time_ns[i] = sec * 1_000_000_000 + frac * ts_mul
            u32[0, i] = _u32(b, o + 12, le)
            u32[1, i] = incl
            u64[4, i] = o + 16
        i += 1
        o += 16 + np.int64(incl)
    return i, ST_OK, o


@njit(cache=True)
def _ng_ts(ts, mul, div, shift):
    """A pcapng timestamp in interface units -> nanoseconds."""
    if shift >= 0:
        sec = ts >> np.uint64(shift)
        frac = ts & ((np.uint64(1) << np.uint64(shift)) - np.uint64(1))
        return np.int64(sec) * 1_000_000_000 + np.int64(
            (frac * np.uint64(1_000_000_000)) >> np.uint64(shift)
        )
    return np.int64(ts) * mul // div


@njit(cache=True)
def _walk_pcapng(b, fill, time_ns, u32, u64, ifaces):
    """Walk the blocks of a pcapng file; EPB, SPB and (obsolete) PB carry packets.

    `ifaces[k]` receives (linktype, snaplen, mul, div, shift) of interface k of the
    last section. Returns (records, status, stop offset, interfaces).
    """
    n_bytes = len(b)
    o = 0
    i = 0
    le = True
    n_if = 0
    iface_base = 0  # interfaces of earlier sections, so ids stay unique
    # per-interface parameters of the current section
    link = np.zeros(MAX_IFACES, dtype=np.int64)
    snap = np.zeros(MAX_IFACES, dtype=np.int64)
    mul = np.ones(MAX_IFACES, dtype=np.int64)
    div = np.ones(MAX_IFACES, dtype=np.int64)
    shift = np.full(MAX_IFACES, -1, dtype=np.int64)
    offs = np.zeros(MAX_IFACES, dtype=np.int64)
    while o < n_bytes:
        if o + 12 > n_bytes:
            return i, ST_TRUNCATED, o, iface_base + n_if
        btype = np.uint32(0)
        if b[o] == 0x0A and b[o + 1] == 0x0D and b[o + 2] == 0x0D and b[o + 3] == 0x0A:
            btype = np.uint32(0x0A0D0D0A)
            if b[o + 8] == 0x4D and b[o + 9] == 0x3C:
                le = True
            elif b[o + 8] == 0x1A and b[o + 9] == 0x2B:
                le = False
            else:
                return i, ST_BAD_LENGTH, o, iface_base + n_if
            iface_base += n_if
            n_if = 0
        else:
            btype = _u32(b, o, le)
        blen = np.int64(_u32(b, o + 4, le))
        if blen < 12 or blen % 4 != 0 or blen > MAX_RECORD + 64:
            return i, ST_BAD_LENGTH, o, iface_base + n_if
        if o + blen > n_bytes:
            return i, ST_TRUNCATED, o, iface_base + n_if
        if np.int64(_u32(b, o + blen - 4, le)) != blen:
            return i, ST_BAD_LENGTH, o, iface_base + n_if
        body = o + 8
        bend = o + blen - 4
        if btype == 1:  # interface description
            if bend - body < 8:
                return i, ST_BAD_LENGTH, o, iface_base + n_if
            if iface_base + n_if >= MAX_IFACES:
                return i, ST_TOO_MANY_IFACES, o, iface_base + n_if
            k = n_if
            link[k] = _u16(b, body, le)
            snap[k] = _u32(b, body + 4, le)
            mul[k] = 1000  # default resolution: microseconds
            div[k] = 1
            shift[k] = -1
            offs[k] = 0
            q = body + 8
            while q + 4 <= bend:
                code = _u16(b, q, le)
                olen = np.int64(_u16(b, q + 2, le))
                if code == 0 or q + 4 + olen > bend:
                    break
                if code == 9 and olen >= 1:
                    r = b[q + 4]
                    if r & 0x80:
                        e = np.int64(r & 0x7F)
                        if e > 32:
                            return i, ST_BAD_RESOL, o, iface_base + n_if
                        shift[k] = e
                    else:
                        e = np.int64(r)
                        if e > 18:
                            return i, ST_BAD_RESOL, o, iface_base + n_if
                        if e <= 9:
                            mul[k] = 10 ** (9 - e)
                            div[k] = 1
                        else:
                            mul[k] = 1
                            div[k] = 10 ** (e - 9)
                elif code == 14 and olen >= 8:
                    if le:
                        offs[k] = np.int64(_u32(b, q + 4, le)) | (
                            np.int64(_u32(b, q + 8, le)) << 32
                        )
                    else:
                        offs[k] = (np.int64(_u32(b, q + 4, le)) << 32) | np.int64(
                            _u32(b, q + 8, le)
                        )
                q += 4 + ((olen + 3) // 4) * 4
            ifaces[iface_base + k, 0] = link[k]
            ifaces[iface_base + k, 1] = snap[k]
            n_if += 1
        elif btype == 6 or btype == 2:  # enhanced packet / obsolete packet block
            if bend - body < 20:
                return i, ST_BAD_LENGTH, o, iface_base + n_if
            k = np.int64(_u32(b, body, le)) if btype == 6 else np.int64(_u16(b, body, le))
            if k >= n_if:
                return i, ST_BAD_IFACE, o, iface_base + n_if
            incl = np.int64(_u32(b, body + 12, le))
            if body + 20 + incl > bend:
                return i, ST_BAD_LENGTH, o, iface_base + n_if
            if fill:
                ts = (np.uint64(_u32(b, body + 4, le)) << np.uint64(32)) | np.uint64(
                    _u32(b, body + 8, le)
                )
                time_ns[i] = _ng_ts(ts, mul[k], div[k], shift[k]) + offs[k] * 1_000_000_000
                u32[0, i] = _u32(b, body + 16, le)
                u32[1, i] = incl
                u32[2, i] = iface_base + k
                u64[4, i] = body + 20
            i += 1
        elif btype == 3:  # simple packet block: interface 0, no timestamp
            if n_if == 0:
                return i, ST_BAD_IFACE, o, iface_base + n_if
            if bend - body < 4:
                return i, ST_BAD_LENGTH, o, iface_base + n_if
            orig = np.int64(_u32(b, body, le))
            incl = min(orig, bend - body - 4)
            if snap[0] > 0:
                incl = min(incl, snap[0])
            if fill:
                time_ns[i] = -1
                u32[0, i] = orig
                u32[1, i] = incl
                u32[2, i] = iface_base
                u64[4, i] = body + 4
            i += 1
        o += blen
    return i, ST_OK, o, iface_base + n_if


# --- the Python layer -------------------------------------------------------------------


@dataclass
class Capture:
    """The packets of one capture file as columns (see the module docstring)."""

    path: Path
    format: str  # "pcap" or "pcapng"
    size_bytes: int
    time_ns: np.ndarray
    u8: np.ndarray
    u32: np.ndarray
    u64: np.ndarray
    quanta: np.ndarray  # uint16 [n, 8]: PFC quanta per priority; PAUSE time in column 0
    linktypes: np.ndarray  # per interface
    snaplens: np.ndarray
    read_bytes: int = 0
    problem: str = ""  # one sentence when the file could not be read to its end
    estimated_records: int = 0
    _cache: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.time_ns)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _U8:
            return self.u8[_U8[name]]
        if name in _U32:
            return self.u32[_U32[name]]
        if name in _U64:
            return self.u64[_U64[name]]
        raise AttributeError(name)

    @property
    def n_ifaces(self) -> int:
        return len(self.linktypes)

    def packet_bytes(self, index: int) -> bytes:
        """The captured bytes of packet `index` (reads the file again)."""
        off = int(self.u64[_U64["offset"], index])
        n = int(self.u32[_U32["caplen"], index])
        with open(self.path, "rb") as fh:
            fh.seek(off)
            return fh.read(n)

    def linktype_of(self, index: int) -> int:
        k = int(self.u32[_U32["iface"], index])
        return int(self.linktypes[k]) if k < len(self.linktypes) else LINK_ETHERNET


def _map(path: Path) -> np.ndarray:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise AifabricError(f"cannot read {path}: {e.strerror}") from None
    if path.is_dir():
        raise AifabricError(f"{path} is a directory, not a capture file")
    if size == 0:
        raise AifabricError(f"{path} is empty, not a pcap or pcapng capture")
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise AifabricError(f"cannot read {path}: {e}") from None


def sniff(path: str | Path) -> str | None:
    """'pcap', 'pcapng' or None from the first four bytes of a file."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return None
    if head in PCAP_MAGICS:
        return "pcap"
    if head == PCAPNG_MAGIC:
        return "pcapng"
    return None


RECORD_BYTES = 8 + len(U8_FIELDS) + 4 * len(U32_FIELDS) + 8 * len(U64_FIELDS) + 16


def _alloc(n: int, path: Path | None = None):
    if path is not None:
        from aifabric.fabric.memory import check_memory

        check_memory(n * RECORD_BYTES, f"reading the {n:,} records of {path}")
    return (
        np.zeros(n, dtype=np.int64),
        np.zeros((len(U8_FIELDS), n), dtype=np.uint8),
        np.zeros((len(U32_FIELDS), n), dtype=np.uint32),
        np.zeros((len(U64_FIELDS), n), dtype=np.uint64),
        np.zeros((n, 8), dtype=np.uint16),
    )


_PROBLEMS = {
    ST_TRUNCATED: "ends in the middle of a record",
    ST_BAD_LENGTH: "has a corrupted record length",
    ST_BAD_IFACE: "has a packet on an interface it never described",
    ST_BAD_RESOL: "has a timestamp resolution finer than this reader supports",
    ST_TOO_MANY_IFACES: f"describes more than {MAX_IFACES} interfaces",
}


def read_capture(path: str | Path) -> Capture:
    """Read a pcap or pcapng file; see the module docstring."""
    path = Path(path)
    b = _map(path)
    size = len(b)
    head = bytes(b[:4])
    if head in PCAP_MAGICS:
        fmt = "pcap"
        if size < 24:
            raise AifabricError(f"{path} is cut off inside its pcap file header")
        le, ts_mul = PCAP_MAGICS[head]
        hdr = bytes(b[:24])
        snaplen = int.from_bytes(hdr[16:20], "little" if le else "big")
        linktype = int.from_bytes(hdr[20:24], "little" if le else "big") & 0x0FFFFFFF
        empty = _alloc(0)
        n, status, stop = _walk_pcap(b, le, ts_mul, snaplen, False, empty[0], empty[2], empty[3])
        cols = _alloc(n, path)
        _walk_pcap(b, le, ts_mul, snaplen, True, cols[0], cols[2], cols[3])
        linktypes = np.array([linktype], dtype=np.int64)
        snaplens = np.array([snaplen], dtype=np.int64)
    elif head == PCAPNG_MAGIC:
        fmt = "pcapng"
        ifaces = np.zeros((MAX_IFACES, 2), dtype=np.int64)
        empty = _alloc(0)
        n, status, stop, n_if = _walk_pcapng(b, False, empty[0], empty[2], empty[3], ifaces)
        cols = _alloc(n, path)
        _walk_pcapng(b, True, cols[0], cols[2], cols[3], ifaces)
        linktypes = ifaces[:n_if, 0].copy()
        snaplens = ifaces[:n_if, 1].copy()
    else:
        raise AifabricError(
            f"{path} is not a pcap or pcapng capture (it starts with 0x{head.hex()})"
        )
    time_ns, u8, u32, u64, quanta = cols
    _decode_all(b, linktypes, u8, u32, u64, quanta)
    cap = Capture(
        path=path,
        format=fmt,
        size_bytes=size,
        time_ns=time_ns,
        u8=u8,
        u32=u32,
        u64=u64,
        quanta=quanta,
        linktypes=linktypes,
        snaplens=snaplens,
        read_bytes=int(stop),
    )
    if status != ST_OK:
        est = n
        if stop > 24 and n:
            est = max(n + 1, round(n * (size - 24) / (stop - 24)))
        cap.estimated_records = est
        read = f"read {n:,} of ~{est:,} records" if n else "no record could be read"
        cap.problem = f"{path.name} {_PROBLEMS[status]} at byte {stop:,}: {read}"
    else:
        cap.estimated_records = n
    return cap
