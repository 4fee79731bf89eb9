"""Switch buffer profiles: the packet buffer of the switch classes in Meta's public fabric
descriptions, selectable by name per switch tier (`[queue.rtsw] profile = "tomahawk3"`).

A profile is a set of `[queue]` keys laid under what the topology or scenario gives:
any key set explicitly overrides the profile's value. Every number cites its source.

Meta's RoCE backend (Gangidi et al., "RDMA over Ethernet for Distributed AI Training at
Meta Scale", SIGCOMM 2024, and Meta's posts "Building Meta's GenAI Infrastructure",
engineering.fb.com, 2024-03-12, and "A RoCE network for distributed AI training at
scale", engineering.fb.com, 2024-08-05) names two switch classes:

- RTSW, the rack training switch: OCP Wedge400 and Minipack2 rack switches, built on
  Broadcom's Tomahawk line, shallow on-chip buffers shared by all ports (the GenAI
  post: "Arista 7800 with Wedge400 and Minipack2 OCP rack switches").
- CTSW, the cluster training switch: Arista 7800 modular chassis on Broadcom Jericho
  chips; the 2024-08-05 post: "The CTSW has deep buffers statically divided over the
  ports in the chassis".
"""

from __future__ import annotations

MIB = 2**20
GIB = 2**30

SWITCH_PROFILES: dict[str, dict[str, object]] = {
    # Broadcom Tomahawk 3 (BCM56980), 12.8 Tb/s, 32 x 400GE, the chip of Meta's Wedge400
    # and Minipack rack switches: "Small system buffers (64 MB)", one pool for every port
    # (I. Pepelnjak, "Data Center Switching ASICs Tradeoffs", blog.ipspace.net,
    # 2022-06-02; Minipack on Tomahawk III: Cumulus Networks, "First to power
    # Facebook's Minipack", cumulusnetworks.com, 2019; "the standard Wedge 400, which
    # uses the Broadcom Tomahawk 3 ASIC": grokipedia.com, "Meta Wedge 400-DC-F").
    # Read as 64 MiB. Minipack2 (Tomahawk 4) has no profile: no public figure for its
    # buffer was found.
    "tomahawk3": {"model": "shared", "buffer": 64 * MIB},
    # Broadcom Jericho2 (BCM88690), the chip of the Arista 7800R3 line cards Meta's CTSWs
    # are built of: "8 GB buffers implemented with HBM2" per chip, which serves 12 x
    # 400GE ports ("Jericho2 ASIC has 12 400GE ... lanes", same ipSpace post, after
    # Broadcom's data sheet; the 8 GB HBM per Jericho2 also in R. Warner, "Arista fixed
    # configuration Jericho2 deep buffer switches", people.ucsc.edu/~warner/Bufs).
    # Meta divides the CTSW's buffer statically over its ports (the 2024-08-05 post):
    # the static model with 8 GiB / 12 per port.
    "jericho2": {"model": "static", "buffer": 8 * GIB // 12},
}
