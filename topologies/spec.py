"""Topology specs: TOML files and presets, checked key by key before anything is built.

A spec is a few TOML tables. `[fabric] kind` picks the builder; each kind
takes its own tables (see `KINDS`). Every key is known here with its type,
bounds and default, so an unknown key, a bad unit or an out-of-range value
fails with one sentence that names the key and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aifabric.fabric.errors import SpecError, cut, shown
from aifabric.fabric.model import (
    BUFFER_MODELS,
    DEFAULT_QUEUE,
    MAX_ALPHA,
    EcnProfile,
    PfcProfile,
    QueueProfile,
    Role,
)
from aifabric.fabric.specfile import (
    Key,
    Presets,
    as_bool,
    as_int,
    as_number,
    as_str,
    load_toml,
    parse_keys,
)
from aifabric.fabric.switch_profiles import SWITCH_PROFILES
from aifabric.fabric.units import parse_rate, parse_size, parse_time

MAX_MTU = 9000  # payload bytes: a jumbo frame
MAX_DELAY_NS = 10**9  # a link's propagation delay: 1 s (paths add several)
MAX_QUEUE_BYTES = 2**40  # a buffer or threshold: 1 TiB

KINDS = {
    "two-tier": ("servers", "zone"),
    "leaf-spine": ("servers", "zone"),
    "three-tier": ("servers", "zone", "aggregation"),
    "rail": ("servers", "rail"),
    "fat-tree": ("fat_tree",),
}
COMMON = ("fabric", "links", "radix", "queue")

_QUEUE_KEYS = {
    "profile": Key(as_str, "", doc=f"a switch profile: {', '.join(SWITCH_PROFILES)}"),
    "model": Key(as_str, DEFAULT_QUEUE.model, doc=" or ".join(BUFFER_MODELS)),
    "alpha": Key(as_number, DEFAULT_QUEUE.alpha, 0, "shared: dynamic threshold", MAX_ALPHA),
    "reserved": Key(parse_size, DEFAULT_QUEUE.reserved_bytes, 0, maximum=MAX_QUEUE_BYTES),
    "buffer": Key(parse_size, DEFAULT_QUEUE.buffer_bytes, 1, maximum=MAX_QUEUE_BYTES),
    "ecn": Key(as_bool, DEFAULT_QUEUE.ecn.enabled),
    "ecn_kmin": Key(parse_size, DEFAULT_QUEUE.ecn.kmin_bytes, 0, maximum=MAX_QUEUE_BYTES),
    "ecn_kmax": Key(parse_size, DEFAULT_QUEUE.ecn.kmax_bytes, 0, maximum=MAX_QUEUE_BYTES),
    "ecn_pmax": Key(as_number, DEFAULT_QUEUE.ecn.pmax, 0),
    "pfc": Key(as_bool, DEFAULT_QUEUE.pfc.enabled),
    "pfc_xoff": Key(parse_size, DEFAULT_QUEUE.pfc.xoff_bytes, 1, maximum=MAX_QUEUE_BYTES),
    "pfc_xon": Key(parse_size, DEFAULT_QUEUE.pfc.xon_bytes, 0, maximum=MAX_QUEUE_BYTES),
    "pfc_headroom": Key(parse_size, DEFAULT_QUEUE.pfc.headroom_bytes, 0, maximum=MAX_QUEUE_BYTES),
    "pfc_quanta": Key(as_int, DEFAULT_QUEUE.pfc.pause_quanta, 1),
    "pfc_xon_offset": Key(
        parse_size, DEFAULT_QUEUE.pfc.xon_offset_bytes, 0, maximum=MAX_QUEUE_BYTES
    ),
    "lossless_priority": Key(as_int, DEFAULT_QUEUE.lossless_priority, 0),
    "control_priority": Key(as_int, DEFAULT_QUEUE.control_priority, 0),
}

SCHEMA: dict[str, dict[str, Key]] = {
    "fabric": {
        "kind": Key(as_str, doc="two-tier, leaf-spine, three-tier, rail or fat-tree"),
        "name": Key(as_str, ""),
        "description": Key(as_str, ""),
    },
    "servers": {
        "gpus_per_server": Key(as_int, 8, 1, "one backend NIC per GPU"),
        "servers_per_rack": Key(as_int, 2, 1),
    },
    "zone": {
        "racks": Key(as_int, minimum=1, doc="racks per AI Zone, one RTSW each"),
        "ctsw_planes": Key(as_int, minimum=1, doc="CTSWs the RTSW uplinks need"),
        "spine_redundancy": Key(as_number, 1.0, 1, "CTSWs built per CTSW needed (Meta: 1.125)"),
        "rtsw_up_down": Key(as_number, 1.0, 0, "RTSW uplink : downlink capacity (Meta: 2)"),
    },
    "aggregation": {
        "zones": Key(as_int, minimum=1),
        "atsw_per_plane": Key(as_int, 1, 1, "ATSWs that each CTSW plane connects to"),
        "oversubscription": Key(as_number, 1.0, 1, "CTSW downlink : uplink capacity (Meta: 7)"),
    },
    "rail": {
        "groups": Key(as_int, minimum=1, doc="groups of servers, each with one switch per rail"),
        "servers_per_group": Key(as_int, minimum=1),
        "spines": Key(as_int, minimum=1),
        "rail_up_down": Key(as_number, 1.0, 0, "rail switch uplink : downlink capacity"),
    },
    "fat_tree": {
        "k": Key(as_int, minimum=2, doc="switch radix; k**3/4 hosts"),
    },
    "links": {
        "rate": Key(parse_rate, 400 * 10**9, doc="NIC to switch"),
        "fabric_rate": Key(parse_rate, 0, doc="switch to switch; default: rate"),
        "delay": Key(parse_time, 100, 0, "propagation, NIC to switch", MAX_DELAY_NS),
        "fabric_delay": Key(parse_time, 500, 0, "propagation, switch to switch", MAX_DELAY_NS),
        "mtu": Key(as_int, 4096, 256, "RoCE path MTU, payload bytes", MAX_MTU),
    },
    "radix": {
        "rtsw": Key(as_int, 64, 1),
        "ctsw": Key(as_int, 576, 1),
        "atsw": Key(as_int, 576, 1),
    },
    "queue": dict(_QUEUE_KEYS),
}
QUEUE_ROLES = ("nic", "rtsw", "ctsw", "atsw")


@dataclass(frozen=True)
class Spec:
    """A checked spec: `values[table][key]`, parsed, with defaults filled in."""

    name: str
    kind: str
    values: dict[str, dict[str, Any]]
    queues: dict[Role, QueueProfile]
    raw: dict[str, Any]

    def __getitem__(self, table: str) -> dict[str, Any]:
        return self.values[table]


PRESETS = Presets("aifabric.topologies", "presets", "topology")


def preset_names() -> list[str]:
    return PRESETS.names()


def load(source: str | Path) -> Spec:
    """A preset name or a path to a TOML file -> a checked `Spec`."""
    text, name, _ = PRESETS.read(source)
    return parse(text, name)


def parse(text: str, name: str) -> Spec:
    raw = load_toml(text, f"topology {name}")
    unknown = set(raw) - set(SCHEMA)
    if unknown:
        table = sorted(unknown)[0]
        raise SpecError(
            f"topology {name}: unknown table [{cut(table)}]; known tables: {', '.join(SCHEMA)}"
        )
    fabric_table = raw.get("fabric")
    if not isinstance(fabric_table, dict) or "kind" not in fabric_table:
        raise SpecError(f"topology {name}: [fabric] kind is missing ({', '.join(KINDS)})")
    kind = fabric_table["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise SpecError(
            f"topology {name}: fabric.kind = {shown(kind)} is not one of {', '.join(KINDS)}"
        )
    allowed = set(COMMON) | set(KINDS[kind])
    for table in raw:
        if table not in allowed:
            raise SpecError(
                f"topology {name}: table [{table}] does not apply to a {kind} fabric "
                f"(it takes {', '.join(t for t in SCHEMA if t in allowed)})"
            )
    values = {}
    for table in (*COMMON, *KINDS[kind]):
        body = raw.get(table, {})
        if not isinstance(body, dict):
            raise SpecError(f"topology {name}: {table} must be a table")
        if table == "queue":
            body = {k: v for k, v in body.items() if k not in QUEUE_ROLES}
        values[table] = _check_table(name, table, body, SCHEMA[table])
    display = values["fabric"]["name"] or name
    queues = queue_profiles(name, raw.get("queue", {}))
    return Spec(name=display, kind=kind, values=values, queues=queues, raw=raw)


def _check_table(name: str, table: str, body: dict, keys: dict[str, Key]) -> dict[str, Any]:
    for key in body:
        if key not in keys:
            raise SpecError(
                f"topology {name}: unknown key {table}.{cut(key)} = {shown(body[key])}; "
                f"[{table}] takes {', '.join(keys)}"
            )
    return parse_keys(f"topology {name}", f"{table}.", body, keys)


def queue_profiles(name: str, body: dict) -> dict[Role, QueueProfile]:
    if not isinstance(body, dict):
        raise SpecError(f"topology {name}: queue must be a table")
    base = {k: v for k, v in body.items() if k not in QUEUE_ROLES}
    out = {}
    # switches first: a threshold at odds with its buffer is named where it takes effect
    for role_name in sorted(QUEUE_ROLES, key=lambda r: r == "nic"):
        override = body.get(role_name, {})
        if not isinstance(override, dict):
            raise SpecError(f"topology {name}: queue.{role_name} must be a table")
        table = f"queue.{role_name}"
        given = {**base, **override}
        _check_table(name, table, given, _QUEUE_KEYS)
        profile = given.get("profile", "")
        if profile not in ("", *SWITCH_PROFILES):
            raise SpecError(
                f"topology {name}: {table}.profile = {shown(profile)} is not one of "
                f"{', '.join(SWITCH_PROFILES)}"
            )
        # a profile sets a switch's buffer; NICs keep their own (and the static model)
        under = SWITCH_PROFILES.get(profile, {}) if role_name != "nic" else {}
        merged = _check_table(name, table, {**under, **given}, _QUEUE_KEYS)
        try:
            out[Role[role_name.upper()]] = QueueProfile(
                buffer_bytes=merged["buffer"],
                ecn=EcnProfile(
                    merged["ecn_kmin"], merged["ecn_kmax"], merged["ecn_pmax"], merged["ecn"]
                ),
                pfc=PfcProfile(
                    merged["pfc_xoff"],
                    merged["pfc_xon"],
                    merged["pfc_headroom"],
                    merged["pfc_quanta"],
                    merged["pfc"],
                    merged["pfc_xon_offset"],
                ),
                lossless_priority=merged["lossless_priority"],
                control_priority=merged["control_priority"],
                model=merged["model"],
                alpha=float(merged["alpha"]),
                reserved_bytes=merged["reserved"],
                profile=profile if role_name != "nic" else "",
            )
        except SpecError as e:
            raise SpecError(f"topology {name}: [{table}] {e}") from None
    return out
