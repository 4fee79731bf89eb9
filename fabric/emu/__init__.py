"""The Mininet engine: the scenario on real Linux network stacks in namespaces.

`available()` says in one sentence why the engine cannot run here (or None);
`run_scenario(scenario, writer)` builds the fabric, replays the flow table,
writes the run directory and tears everything down on every exit path.
"""

from __future__ import annotations

import os


def available(switch: str = "router") -> str | None:
    """None when the engine can run on this machine with `switch`es, else one sentence why not."""
    from fabric.emu import kernel

    if os.geteuid() != 0:
        return "the mininet engine needs root (network namespaces, veth links and qdiscs)"
    if not kernel.mininet_importable():
        return "the mininet engine needs Mininet (Debian package mininet) importable by Python"
    missing = kernel.missing_tools()
    if missing:
        return f"the mininet engine needs {', '.join(missing)} on the PATH"
    if switch == "ovs":
        from fabric.emu import ovs

        return ovs.missing()
    return None


def run_scenario(scenario, writer, **options):
    """Run `scenario` on emulated Linux network stacks, writing into `writer` (see engine.py)."""
    from fabric.emu.engine import run_scenario as run

    return run(scenario, writer, **options)
