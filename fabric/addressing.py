"""Addresses derived from indices: a NIC's IPv4 address, its QPNs and RoCEv2 UDP source ports.

NIC addresses are `10.{zone}.{rack}.{slot + 1}`, where slot is the NIC's
position in its rack (server x NICs per server + rail). Switches get none
here; the emulator numbers its router interfaces itself.

QPNs are allocated per NIC as the drivers do: rxe takes the next free index
of a pool from a minimum upward (xa_alloc_cyclic), mlx5's firmware hands out
increasing numbers per device. So a NIC's QPs count up from a base, in the
order they are created; the base is drawn per NIC (a device that has been up
a while is not at its first QPN). The UDP source port of a QP is derived
from the two QPNs by one of `SPORT_RULES` (`udp_sports`).
"""

from __future__ import annotations

import ipaddress

import numpy as np

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric

ROCE_UDP_PORT = 4791
ROCE_SPORT_BASE = 0xC000  # IB_ROCE_UDP_ENCAP_VALID_PORT_MIN: ports 0xC000-0xFFFF
QPN_MIN = 0x100  # below: QP0, QP1 and the numbers drivers keep for themselves
QPN_SPAN = (1 << 24) - QPN_MIN  # QPNs are 24-bit
FLOW_LABEL_MASK = 0xFFFFF  # the 20-bit IPv6/GRH flow label

# how a NIC derives a QP's UDP source port (the scenario's [nic] sport)
SPORT_RULES = ("linux", "xor", "random")
DEFAULT_SPORT = "linux"


def roce_udp_sport(sqpn, dqpn, base: int = ROCE_SPORT_BASE):
    """The `xor` rule: ((sQPN xor dQPN) & 0xFFFF) | base.

    Works on ints and numpy arrays alike. With consecutive QPNs at both ends
    (QPs of one connection) it often gives two QPs the same port.
    """
    return ((np.asarray(sqpn) ^ np.asarray(dqpn)) & 0xFFFF) | base


def rdma_flow_label(lqpn, rqpn):
    """The flow label the Linux RDMA core derives from a QP's local and remote QPNs
    (`rdma_calc_flow_label` in include/rdma/ib_verbs.h): the 48-bit product of the two
    24-bit QPNs folded onto itself (xor of its bits shifted down by 20 and by 40), low 20
    bits kept. Symmetric: both ends of a connection compute the same label."""
    v = np.asarray(lqpn).astype(np.uint64) * np.asarray(rqpn).astype(np.uint64)
    v = v ^ (v >> np.uint64(20))
    v = v ^ (v >> np.uint64(40))
    return v & np.uint64(FLOW_LABEL_MASK)


def flow_label_udp_sport(label):
    """A RoCEv2 UDP source port from a 20-bit flow label, as every RoCEv2 driver of the
    Linux RDMA core derives it (`rdma_flow_label_to_udp_sport` in include/rdma/ib_verbs.h):
    the label's top 6 bits xor-ed into its low 14, over 0xC000."""
    label = np.asarray(label).astype(np.uint64)
    low = label & np.uint64(0x3FFF)
    high = (label & np.uint64(0xFC000)) >> np.uint64(14)
    return ((low ^ high) | np.uint64(ROCE_SPORT_BASE)).astype(np.int64)


def linux_udp_sport(sqpn, dqpn):
    """The `linux` rule: the port rxe, irdma and hns send a QP's packets from when the
    application gave no flow label (`rdma_get_udp_sport(0, lqpn, rqpn)` in
    include/rdma/ib_verbs.h): `flow_label_udp_sport(rdma_flow_label(sqpn, dqpn))`."""
    return flow_label_udp_sport(rdma_flow_label(sqpn, dqpn))


def udp_sports(sqpn, dqpn, rule: str = DEFAULT_SPORT, rng: np.random.Generator | None = None):
    """int64 UDP source ports of the QPs (sqpn[i], dqpn[i]) under `rule` (see SPORT_RULES):
    `linux` (the RDMA core's), `xor` (`roce_udp_sport`), or `random`, one port per QP drawn
    from `rng` in 0xC000-0xFFFF."""
    sqpn, dqpn = np.asarray(sqpn), np.asarray(dqpn)
    if rule == "linux":
        return linux_udp_sport(sqpn, dqpn)
    if rule == "xor":
        return roce_udp_sport(sqpn.astype(np.int64), dqpn.astype(np.int64))
    if rule == "random":
        if rng is None:
            raise ValueError("the random source-port rule needs a generator")
        return rng.integers(ROCE_SPORT_BASE, 1 << 16, size=sqpn.shape, dtype=np.int64)
    raise SpecError(f"sport = {rule!r} is not one of {', '.join(SPORT_RULES)}")


def allocate_qpns(
    src, dst, n_nodes: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """int64 (sQPN, dQPN) of QPs listed in the order they are created: QP i connects a QP
    created at NIC src[i] to one created at NIC dst[i]. Every NIC numbers its QPs from a
    base drawn from `rng` (one per node, so a NIC's base does not depend on the others'
    traffic), one up per QP it creates, wrapping within QPN_MIN..2^24-1."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    n = len(src)
    base = rng.integers(QPN_MIN, 1 << 24, size=n_nodes, dtype=np.int64)
    # QP i creates its two ends at 2i and 2i + 1; a NIC's ends in that order count up
    end = np.stack([src, dst], axis=1).ravel()
    order = np.argsort(end, kind="stable")
    sorted_end = end[order]
    first = np.searchsorted(sorted_end, sorted_end, "left")
    local = np.empty(2 * n, dtype=np.int64)
    local[order] = np.arange(2 * n) - first
    qpn = (base[end] - QPN_MIN + local) % QPN_SPAN + QPN_MIN
    return qpn[0::2], qpn[1::2]


def nic_ipv4(fabric: Fabric) -> np.ndarray:
    """uint32 IPv4 address of every node (0 for switches)."""
    nics = fabric.nic_ids
    zone = fabric.node_zone[nics].astype(np.int64)
    rack = fabric.node_rack[nics].astype(np.int64)
    server = fabric.node_server[nics].astype(np.int64)
    rail = fabric.node_rail[nics].astype(np.int64)
    per_server = int(rail.max()) + 1 if len(nics) else 1
    slot = server * per_server + rail + 1
    if len(nics) and (zone.max() > 255 or rack.max() > 255 or slot.max() > 254):
        raise SpecError(
            f"fabric {fabric.name} is too large for 10.zone.rack.slot addresses "
            f"(zone {zone.max()}, rack {rack.max()}, slot {slot.max()})"
        )
    out = np.zeros(fabric.n_nodes, dtype=np.uint32)
    out[nics] = (10 << 24) | (zone << 16) | (rack << 8) | slot
    return out


def format_ipv4(value: int) -> str:
    return str(ipaddress.IPv4Address(int(value)))
