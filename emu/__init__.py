"""The Mininet engine: the scenario on real Linux network stacks in namespaces.

`available()` says in one sentence why the engine cannot run here (or None);
the engine itself (`aifabric.emu.engine.ENGINE`, run through
`aifabric.engines.run_scenario("mininet", ...)`) builds the fabric, replays the
flow table, writes the run directory and tears everything down on every exit
path. `linux` holds the helpers that talk to the Linux kernel and its tools;
`plan` the emulated fabric as data; `net` and `ovs` make it real.
"""

from __future__ import annotations

import os

import aifabric.fabric  # noqa: F401  (sets the numba cache directory first)


def available(switch: str = "router") -> str | None:
    """None when the engine can run on this machine with `switch`es, else one sentence why not."""
    from aifabric.emu import linux

    if os.geteuid() != 0:
        return "the mininet engine needs root (network namespaces, veth links and qdiscs)"
    if not linux.mininet_importable():
        return "the mininet engine needs Mininet (Debian package mininet) importable by Python"
    missing = linux.missing_tools()
    if missing:
        return f"the mininet engine needs {', '.join(missing)} on the PATH"
    if switch == "ovs":
        from aifabric.emu import ovs

        return ovs.missing()
    return None
