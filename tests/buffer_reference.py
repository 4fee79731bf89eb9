"""A slow, obvious reference model of one shared-buffer switch's admission rule.

The rules, as `aifabric.fabric.model.QueueProfile` states them (this module does not call
sim/buffer.py):

- The switch has `buffer` bytes; each port keeps `reserved` bytes for each of its two
  priorities; the rest is the shared pool. A counter (a lossy egress queue, or a port's
  lossless ingress bytes) of c bytes holds max(c - reserved, 0) of the pool.
- The dynamic threshold is floor(alpha x free pool), alpha a multiple of 1/65536, the
  free pool its size less the sum of every counter's part, taken before a frame counts.
- A lossy frame is dropped if it would take its queue's part above the threshold or the
  pool past its size.
- A lossless frame goes to its ingress's count if that stays within the threshold and
  the pool (or within the reserve); else to the ingress's headroom if that holds it;
  else it is dropped. The ingress pauses its peer (once) when its headroom holds bytes
  or its part is above zero and at least the threshold; leaving bytes come out of the
  headroom first; a paused ingress with an empty headroom resumes when its part is zero
  or `xon_offset` below the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Switch:
    buffer: int
    ports: int
    alpha_q16: int
    reserved: int = 0
    headroom: int = 0
    xon_offset: int = 0
    egress: dict = field(default_factory=dict)  # (port, class) -> bytes queued
    ingress: dict = field(default_factory=dict)  # port -> lossless bytes counted
    held: dict = field(default_factory=dict)  # port -> lossless bytes in its headroom
    paused: set = field(default_factory=set)

    @property
    def pool(self) -> int:
        return self.buffer - 2 * self.ports * self.reserved

    def part(self, count: int) -> int:
        return max(count - self.reserved, 0)

    def used(self) -> int:
        counts = list(self.egress.values()) + list(self.ingress.values())
        return sum(self.part(c) for c in counts)

    def threshold(self) -> int:
        free = self.pool - self.used()
        return max(free, 0) * self.alpha_q16 // 65536

    def fits(self, count: int, wire: int) -> bool:
        grow = self.part(count + wire) - self.part(count)
        if grow == 0:
            return True
        return self.part(count + wire) <= self.threshold() and self.used() + grow <= self.pool

    # lossy -------------------------------------------------------------------------------
    def lossy_arrives(self, port: int, cls: int, wire: int) -> bool:
        count = self.egress.get((port, cls), 0)
        if not self.fits(count, wire):
            return False
        self.egress[(port, cls)] = count + wire
        return True

    def lossy_leaves(self, port: int, cls: int, wire: int) -> None:
        self.egress[(port, cls)] -= wire

    # lossless ----------------------------------------------------------------------------
    def lossless_arrives(self, port: int, wire: int) -> str:
        count = self.ingress.get(port, 0)
        held = self.held.get(port, 0)
        if self.fits(count, wire):
            self.ingress[port] = count + wire
        elif held + wire <= self.headroom:
            self.held[port] = held + wire
        else:
            return "drop"
        if port not in self.paused:
            part = self.part(self.ingress.get(port, 0))
            if self.held.get(port, 0) > 0 or (part > 0 and part >= self.threshold()):
                self.paused.add(port)
                return "xoff"
        return "admit"

    def lossless_leaves(self, port: int, wire: int) -> bool:
        from_headroom = min(self.held.get(port, 0), wire)
        self.held[port] = self.held.get(port, 0) - from_headroom
        self.ingress[port] = self.ingress.get(port, 0) - (wire - from_headroom)
        if port in self.paused and self.held[port] == 0:
            part = self.part(self.ingress[port])
            if part == 0 or part + self.xon_offset <= self.threshold():
                self.paused.discard(port)
                return True
        return False
