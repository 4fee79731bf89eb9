"""Congestion control, engine-neutral: the kinds, their parameters, defaults and units.

Both engines and the scenario loader read this one table. An engine maps a
kind to its own implementation (the simulator's kernel code, the
emulator's replay) and says which kinds it implements.

    none    no end-to-end control: NICs send at line rate, PFC alone keeps the
            fabric lossless (where PFC is on)
    dcqcn   DCQCN (Zhu et al., SIGCOMM 2015): switches mark ECN, receivers
            answer with CNPs, senders cut their rate and recover on timers
    cts     receiver-driven admission: a sender sends a chunk only when the
            receiver has granted it (clear-to-send), at most `cts_window`
            chunks outstanding
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fabric.errors import AifabricError
from fabric.units import parse_rate, parse_size, parse_time

KINDS = ("none", "dcqcn", "cts")
LOSS_RECOVERY = ("go-back-n", "selective")
DEFAULT_KIND = "dcqcn"
SIM_COMPONENTS = {"none": None, "dcqcn": "fabric.sim.dcqcn", "cts": "fabric.sim.cts"}
"""The simulator's module implementing each kind's hooks (fabric.sim.congestion); None: no
hooks (the defaults). A new kind: its name here, its parameters below, its module, and
its branch in each hook of fabric.sim.congestion."""


@dataclass(frozen=True)
class Parameter:
    name: str
    default: Any
    parse: Any  # str | number -> int (ns, bytes, bit/s) or float
    unit: str
    kinds: tuple[str, ...]  # the kinds that read it
    doc: str


# DCQCN defaults after Zhu et al. (SIGCOMM 2015): CNP interval N = 50 us, alpha and
# rate timers K = T = 55 us, byte counter B = 10 MB, F = 5, g = 1/256.
D, C = ("dcqcn",), ("cts",)
PARAMETERS = (
    Parameter("cnp_interval", "50us", parse_time, "ns", D, "at most one CNP per flow per interval"),
    Parameter("alpha_timer", "55us", parse_time, "ns", D, "alpha decays each interval with no CNP"),
    Parameter("rate_timer", "55us", parse_time, "ns", D, "one rate-increase step per interval"),
    Parameter(
        "byte_counter", "10MB", parse_size, "bytes", D, "one increase step per this many bytes"
    ),
    Parameter("fast_recovery_steps", 5, int, "", D, "fast-recovery steps before additive increase"),
    Parameter("additive_increase", "40M", parse_rate, "bit/s", D, "rate added per additive step"),
    Parameter("hyper_increase", "400M", parse_rate, "bit/s", D, "rate added per hyper step"),
    Parameter("min_rate", "100M", parse_rate, "bit/s", D, "the lowest rate a cut reaches"),
    Parameter("g", 1 / 256, float, "", D, "gain of the alpha estimate"),
    Parameter("cts_chunk", "256KiB", parse_size, "bytes", C, "bytes one grant admits"),
    Parameter("cts_window", 2, int, "", C, "grants outstanding per flow"),
    Parameter("rto", "100us", parse_time, "ns", KINDS, "retransmission timeout for a lost tail"),
    Parameter(
        "loss_recovery",
        "go-back-n",
        lambda v: _choice(v, LOSS_RECOVERY),
        "",
        KINDS,
        "go-back-n (RoCE NICs: the receiver NAKs the first gap, the sender resends all from "
        "there) or selective (only what was lost is resent, as in IRN)",
    ),
)
BY_NAME = {p.name: p for p in PARAMETERS}
DEFAULTS = {p.name: p.default for p in PARAMETERS}


def _choice(value, choices):
    if value not in choices:
        raise ValueError(f"choose one of {', '.join(choices)}")
    return value


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise AifabricError(
            f"unknown congestion control {kind!r}; choose one of {', '.join(KINDS)}"
        )
    return kind


def cc_parameters(params: dict | None) -> dict:
    """Congestion-control parameters with defaults filled in, parsed to ns, bytes and bit/s."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(BY_NAME))
    if unknown:
        raise AifabricError(
            f"unknown congestion-control parameter {unknown[0]!r}; known: {', '.join(BY_NAME)}"
        )
    out = {}
    for p in PARAMETERS:
        value = params.get(p.name, p.default)
        try:
            out[p.name] = p.parse(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise AifabricError(f"congestion-control parameter {p.name} = {value!r}: {e}") from None
    if out["cts_window"] < 1 or out["cts_chunk"] < 1 or out["byte_counter"] < 1:
        raise AifabricError("cts_window, cts_chunk and byte_counter must be positive")
    if not 0 < out["g"] < 1:
        raise AifabricError(f"the DCQCN gain g must be between 0 and 1, got {out['g']}")
    if out["fast_recovery_steps"] < 0:
        raise AifabricError("fast_recovery_steps must not be negative")
    return out
