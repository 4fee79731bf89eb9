"""What a request would take in memory, checked before it is allocated.

A size a user gives (seeds, points, workers, records of a capture) is turned
into bytes and compared with what the system can give without swapping
(Linux's MemAvailable); a request that cannot fit is one sentence saying how
much it needs, before anything is allocated, instead of a MemoryError after
minutes of swapping.
"""

from __future__ import annotations

from aifabric.fabric.errors import AifabricError


def available_memory() -> int | None:
    """Bytes of memory the system can give without swapping, or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GiB"


def check_memory(need: int, what: str) -> None:
    """One sentence when `what` (e.g. "reading x.pcap's 200,000,000 records") needs more
    than the memory available."""
    free = available_memory()
    if free is not None and need > free:
        raise AifabricError(f"{what} needs about {gib(need)}, and {gib(free)} is available")
