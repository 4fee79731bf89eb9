"""What a fabric amounts to: nodes per tier, link rates, tier ratios, bisection, diameter."""

from __future__ import annotations

from collections import Counter

import numpy as np

from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.units import format_rate


def ratio_text(down: float, up: float) -> str:
    """Down:up capacity as a person writes it: '1:2.25', '6.98:1', '1:1'."""
    if up == 0 or down == 0:
        return "-"
    r = down / up
    text = lambda v: f"{v:.2f}".rstrip("0").rstrip(".")  # noqa: E731
    return f"{text(r)}:1" if r >= 1 else f"1:{text(1 / r)}"


def tiers(fabric: Fabric) -> list[dict]:
    """Per switch role present: count, ports, capacity down and up, and their ratio."""
    f = fabric
    ra = f.node_role[f.link_a]
    rb = f.node_role[f.link_b]
    low_is_a = ra < rb
    low = np.where(low_is_a, ra, rb)
    high = np.where(low_is_a, rb, ra)
    out = []
    for role in Role:
        n = f.count(role)
        if n == 0:
            continue
        down = int(f.link_rate_bps[(high == role) & (low < role)].sum())
        up = int(f.link_rate_bps[(low == role) & (high > role)].sum())
        side = f.link_rate_bps[(low == role) & (high == role)]
        out.append(
            {
                "role": role.label,
                "count": n,
                "down_bps": down,
                "up_bps": up,
                "peer_bps": int(side.sum()),
                "down_up": ratio_text(down, up) if role != Role.NIC else "-",
                "down_up_value": (down / up) if up and down else None,
            }
        )
    return out


def link_classes(fabric: Fabric) -> list[dict]:
    """Links grouped by the roles they join and their rate."""
    f = fabric
    ra = f.node_role[f.link_a]
    rb = f.node_role[f.link_b]
    keys = Counter(
        (int(min(a, b)), int(max(a, b)), int(r), int(d))
        for a, b, r, d in zip(ra, rb, f.link_rate_bps, f.link_delay_ns, strict=True)
    )
    return [
        {
            "between": f"{Role(a).label}-{Role(b).label}",
            "count": n,
            "rate_bps": r,
            "rate": format_rate(r),
            "delay_ns": d,
        }
        for (a, b, r, d), n in sorted(keys.items())
    ]


def bisection_bps(fabric: Fabric) -> int:
    """Bisection bandwidth of a hierarchical Clos, in bit/s.

    Cutting the NICs into two halves along the hierarchy (zones, then racks),
    traffic between the halves crosses every tier up to the tier that joins
    them, so the cut is the smallest of each tier's total uplink capacity,
    halved. Checked against a max-flow computation in the tests.
    """
    caps = [t["up_bps"] for t in tiers(fabric) if t["up_bps"] > 0]
    return min(caps) // 2 if caps else 0


def summarize_fabric(fabric: Fabric) -> dict:
    from aifabric.fabric.routing import Routing

    return {
        "name": fabric.name,
        "kind": fabric.kind,
        "nodes": {t["role"]: t["count"] for t in tiers(fabric)},
        "links": fabric.n_links,
        "link_classes": link_classes(fabric),
        "tiers": tiers(fabric),
        "bisection_bps": bisection_bps(fabric),
        "hop_diameter": Routing(fabric).hop_diameter(),
    }
