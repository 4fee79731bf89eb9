"""Single packets dissected by scapy: `aifabric pcap show`, and the slow reference parser.

`scapy_fields` derives, from scapy's dissection of a packet's captured bytes,
the same columns the fast kernel of `aifabric.analysis.capture` writes. The tests
compare the two on the same bytes; where scapy and the kernel could disagree
by design (a header cut by the snap length), the rule is the kernel's: a
layer counts only when all of its fixed header was captured.
"""

from __future__ import annotations

from aifabric.analysis import capture as C


def _layers():
    import scapy.contrib.mac_control as mc  # noqa: F401  (binds ethertype 0x8808)
    import scapy.contrib.roce as roce  # noqa: F401  (binds UDP port 4791)
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import CookedLinux, Dot1AD, Dot1Q, Ether

    return {
        "mc": mc,
        "roce": roce,
        "IP": IP,
        "UDP": UDP,
        "IPv6": IPv6,
        "Ether": Ether,
        "Dot1Q": Dot1Q,
        "Dot1AD": Dot1AD,
        "SLL": CookedLinux,
    }


def scapy_packet(data: bytes, linktype: int):
    """scapy's dissection of captured bytes of a given pcap link type."""
    from scapy.config import conf

    L = _layers()
    if linktype == C.LINK_ETHERNET:
        return L["Ether"](data)
    if linktype == C.LINK_SLL:
        return L["SLL"](data)
    if linktype in (C.LINK_RAW, C.LINK_IPV4, C.LINK_IPV6) and data:
        return (L["IP"] if data[0] >> 4 == 4 else L["IPv6"])(data)
    cls = conf.l2types.get(linktype)
    from scapy.packet import Raw

    return cls(data) if cls else Raw(data)


def scapy_fields(data: bytes, linktype: int = C.LINK_ETHERNET) -> dict[str, int]:
    """The kernel's columns for one packet, derived from scapy (see the module docstring)."""
    L = _layers()
    f = dict.fromkeys(C.U8_FIELDS + C.U32_FIELDS + C.U64_FIELDS, 0)
    f.pop("length")
    f.pop("caplen")
    f.pop("iface")
    f.pop("offset")
    f["quanta"] = [0] * 8
    n = len(data)
    if linktype == C.LINK_ETHERNET:
        if n < 14:
            f["flags"] = C.FLAG_CUT
            return f
        etype, start = L["Ether"](data).type, 14
    elif linktype == C.LINK_SLL:
        if n < 16:
            f["flags"] = C.FLAG_CUT
            return f
        etype, start = L["SLL"](data).proto, 16
    elif linktype == C.LINK_SLL2:
        if n < 20:
            f["flags"] = C.FLAG_CUT
            return f
        etype, start = int.from_bytes(data[:2], "big"), 20
    elif linktype in (C.LINK_RAW, C.LINK_IPV4, C.LINK_IPV6):
        if n < 1:
            f["flags"] = C.FLAG_CUT
            return f
        etype = {4: 0x0800, 6: 0x86DD}.get(data[0] >> 4)
        if etype is None:
            return f
        start = 0
    else:
        return f
    tags = 0
    while etype in (0x8100, 0x88A8) and tags < 2:
        f["ethertype"] = etype
        if n < start + 4:
            f["flags"] = C.FLAG_CUT
            return f
        tag = L["Dot1Q"](data[start:])
        if tags == 0:
            f["pcp"] = tag.prio
            f["vlan"] = tag.vlan
        etype = tag.type
        start += 4
        tags += 1
    f["ntags"] = tags
    f["ethertype"] = etype
    mc = L["mc"]
    if etype == C.ETH_MACCTL:
        if n < start + 2:
            f["flags"] = C.FLAG_CUT
            return f
        op = int.from_bytes(data[start : start + 2], "big")
        if op == 0x0001:
            if n < start + 4:
                f["flags"] = C.FLAG_CUT
                return f
            p = mc.MACControlPause(data[start:])
            f["kind"] = C.KIND_PAUSE
            f["quanta"][0] = p.pause_time
        elif op == 0x0101:
            if n < start + 20:
                f["flags"] = C.FLAG_CUT
                return f
            p = mc.MACControlClassBasedFlowControl(data[start:])
            f["kind"] = C.KIND_PFC
            f["pfc_enable"] = sum(getattr(p, f"c{k}_enabled") << k for k in range(8))
            f["quanta"] = [getattr(p, f"c{k}_pause_time") for k in range(8)]
        else:
            f["kind"] = C.KIND_MACCTL
        return f
    IP, IPv6, UDP = L["IP"], L["IPv6"], L["UDP"]
    if etype == 0x0800:
        if n < start + 20:
            f["flags"] = C.FLAG_CUT
            return f
        ip = IP(data[start:])
        if ip.version != 4 or ip.ihl < 5:
            return f
        f.update(ipver=4, dscp=ip.tos >> 2, ecn=ip.tos & 3, proto=ip.proto, kind=C.KIND_IP)
        f["src_lo"] = 0xFFFF00000000 | int.from_bytes(bytes(map(int, ip.src.split("."))), "big")
        f["dst_lo"] = 0xFFFF00000000 | int.from_bytes(bytes(map(int, ip.dst.split("."))), "big")
        if ip.frag:
            return f
        nxt = start + ip.ihl * 4
        if n < nxt:
            f["flags"] = C.FLAG_CUT
            return f
        proto = ip.proto
    elif etype == 0x86DD:
        if n < start + 40:
            f["flags"] = C.FLAG_CUT
            return f
        ip = IPv6(data[start:])
        if ip.version != 6:
            return f
        import ipaddress

        src = int(ipaddress.IPv6Address(ip.src))
        dst = int(ipaddress.IPv6Address(ip.dst))
        f.update(ipver=6, dscp=ip.tc >> 2, ecn=ip.tc & 3, kind=C.KIND_IP)
        f.update(src_hi=src >> 64, src_lo=src & (2**64 - 1))
        f.update(dst_hi=dst >> 64, dst_lo=dst & (2**64 - 1))
        proto = ip.nh
        nxt = start + 40
        while proto in (0, 43, 60):
            if n < nxt + 8:
                f["proto"] = proto
                f["flags"] = C.FLAG_CUT
                return f
            proto, nxt = data[nxt], nxt + (data[nxt + 1] + 1) * 8
        f["proto"] = proto
    else:
        return f
    if proto != 17:
        return f
    if n < nxt + 8:
        f["flags"] = C.FLAG_CUT
        return f
    udp = UDP(data[nxt:])
    f.update(sport=udp.sport, dport=udp.dport, kind=C.KIND_UDP)
    if udp.dport != C.ROCE_PORT:
        return f
    if n < nxt + 20:
        f["flags"] = C.FLAG_CUT
        return f
    # the 12 header bytes only: scapy's BTH also wants the 4-byte ICRC trailer, which a
    # short snap length cuts off and which no metric reads
    bth = L["roce"].BTH(data[nxt + 8 : nxt + 20] + bytes(4))
    f.update(opcode=bth.opcode, fecn=bth.fecn, becn=bth.becn, dqpn=bth.dqpn, psn=bth.psn)
    f["kind"] = C.KIND_CNP if bth.opcode == C.CNP_OPCODE else C.KIND_ROCE
    return f


LINK_NAMES = {
    C.LINK_ETHERNET: "Ethernet",
    C.LINK_SLL: "Linux cooked (SLL)",
    C.LINK_SLL2: "Linux cooked v2 (SLL2)",
    C.LINK_RAW: "raw IP",
    C.LINK_IPV4: "raw IPv4",
    C.LINK_IPV6: "raw IPv6",
}


def _value(v):
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, list | tuple):
        return [_value(x) for x in v]
    return str(v)


def dissect(cap: C.Capture, i: int) -> tuple[dict, object | None]:
    """Packet i as a JSON-able dict (its layers and fields as scapy reads them) and scapy's
    packet; a packet scapy cannot read (shorter than its link header) gets `problem` and
    its bytes instead, and None."""
    data = cap.packet_bytes(i)
    linktype = cap.linktype_of(i)
    out = {
        "index": i,
        "time_ns": int(cap.time_ns[i]) if cap.time_ns[i] >= 0 else None,
        "iface": int(cap.iface[i]),
        "linktype": LINK_NAMES.get(linktype, f"link type {linktype}"),
        "caplen": int(cap.caplen[i]),
        "length": int(cap.length[i]),
        "kind": C.KIND_NAMES[int(cap.kind[i])],
        "header_cut": bool(cap.flags[i] & C.FLAG_CUT),
    }
    try:
        pkt = scapy_packet(data, linktype)
        text = pkt.show(dump=True)
    except Exception as e:  # scapy raises struct.error, IndexError, ... on short packets
        out["problem"] = (
            f"{len(data)} captured bytes are too few for scapy to read the "
            f"{out['linktype']} header ({type(e).__name__}: {e})"
        )
        out["bytes"] = data.hex()
        return out, None
    layers = []
    for layer in pkt.iterpayloads():
        fields = {f.name: _value(layer.getfieldval(f.name)) for f in layer.fields_desc}
        layers.append({"layer": layer.name, "fields": fields})
    out["layers"] = layers
    out["text"] = text.rstrip()
    return out, pkt


def packets(cap: C.Capture, index: int, count: int) -> list[dict]:
    """`dissect` of packets index .. index + count - 1 (those that exist)."""
    return [dissect(cap, i)[0] for i in range(index, min(index + count, len(cap)))]


def text(rows: list[dict]) -> str:
    """`packets` as scapy's layer-by-layer dump."""
    out = []
    for p in rows:
        t = p["time_ns"]
        when = f"t={t // 10**9}.{t % 10**9:09d}s" if t is not None else "no timestamp"
        cut = "  (a header is cut short)" if p["header_cut"] else ""
        out.append(
            f"#{p['index']}  {when}  iface {p['iface']}  {p['caplen']} of "
            f"{p['length']} bytes captured  [{p['kind']}]{cut}"
        )
        if "problem" in p:
            out.append(f"{p['problem']}; the bytes: {p['bytes'] or '(none)'}")
        else:
            out.append(p["text"])
        out.append("")
    return "\n".join(out).rstrip()
