"""Topology specs (TOML presets) and the builders that turn them into a `Fabric`."""

from __future__ import annotations

from pathlib import Path

from aifabric.fabric.model import Fabric
from aifabric.topologies.builders import build
from aifabric.topologies.spec import Spec, load, parse, preset_names


def load_fabric(source: str | Path) -> Fabric:
    """A preset name or a TOML path -> the built `Fabric`."""
    return build(load(source))


__all__ = ["Spec", "build", "load", "load_fabric", "parse", "preset_names"]
