"""Addresses derived from indices: a NIC's IPv4 address and RoCEv2 UDP source port.

NIC addresses are `10.{zone}.{rack}.{slot + 1}`, where slot is the NIC's
position in its rack (server x NICs per server + rail). Switches get none
here; the emulator numbers its router interfaces itself.
"""

from __future__ import annotations

import ipaddress

import numpy as np

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Fabric

ROCE_UDP_PORT = 4791
ROCE_SPORT_BASE = 0xC000


def roce_udp_sport(sqpn, dqpn, base: int = ROCE_SPORT_BASE):
    """RoCEv2 UDP source port from the queue pair numbers: (sQPN xor dQPN) | base.

    Works on ints and numpy arrays alike. NICs derive the port this way so
    every QP of a connection is its own ECMP flow (QP scaling adds entropy).
    """
    return ((np.asarray(sqpn) ^ np.asarray(dqpn)) & 0xFFFF) | base


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
