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

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.units import parse_rate, parse_size, parse_time

KINDS = ("none", "dcqcn", "cts")
LOSS_RECOVERY = ("go-back-n", "selective")
FINISH = ("sender", "receiver")
HEADER_OVERHEAD_BYTES = 14 + 20 + 8 + 12 + 4 + 4 + 20
"""Bytes a RoCEv2 packet takes on the wire besides its payload: Ethernet 14, IPv4 20, UDP 8,
BTH 12, ICRC 4, FCS 4, preamble and inter-frame gap 20 (the `header_overhead` default)."""
MAX_HEADER_OVERHEAD_BYTES = 65_535
DEFAULT_ACK_EVERY = 4
"""RC lets a receiver coalesce ACKs; every 4 packets puts 0.5% of the data's bytes on the
reverse links at a 4 KiB MTU and costs about 1.5 times the CPU of one ACK per flow (every
packet: 2%, 2.2 times; benchmarks/bench_sim.py a --ack-every N)."""
DEFAULT_KIND = "dcqcn"
SIM_COMPONENTS = {"none": None, "dcqcn": "aifabric.sim.dcqcn", "cts": "aifabric.sim.cts"}
"""The simulator's module implementing each kind's hooks (aifabric.sim.congestion); None: no
hooks (the defaults). A new kind: its name here, its parameters below, its module, and
its branch in each hook of aifabric.sim.congestion."""


@dataclass(frozen=True)
class Parameter:
    name: str
    default: Any
    parse: Any  # str | number -> int (ns, bytes, bit/s) or float
    unit: str
    kinds: tuple[str, ...]  # the kinds that read it
    doc: str


# DCQCN parameter presets. A scenario picks one with `preset` and may override any
# parameter; the defaults below are the `paper-40g` preset. A scenario that names no preset
# gets the ConnectX set for its NICs' line rate (`preset_for_rate`).
#
# paper-40g: Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (SIGCOMM
#   2015), tuned for 40 Gb/s: CNP interval N = 50 us, alpha and rate timers K = T = 55 us,
#   byte counter B = 10 MB, F = 5, g = 1/256, AI = 40 Mb/s, HAI = 400 Mb/s.
# cx-100g: the firmware defaults NVIDIA documents for ConnectX-4 and later ("DCQCN CC
#   Parameters", NVIDIA DOCA SDK documentation, networking-docs.nvidia.com/doca/archive/
#   3-4-0/dcqcn-cc-parameters; the same table as the Mellanox community post "DCQCN
#   Parameters", community.mellanox.com/docs/DOC-2790; `mlxconfig query` on a ConnectX-6
#   shows the same values):
#     rpg_time_reset 300 us      -> rate_timer
#     rpg_byte_reset 32767 B     -> byte_counter
#     rpg_threshold 1            -> fast_recovery_steps
#     rpg_ai_rate 5 Mb/s         -> additive_increase
#     rpg_hai_rate 50 Mb/s       -> hyper_increase
#     rpg_min_rate 1 Mb/s        -> min_rate
#     dce_tcp_g 1019 (of 1024)   -> g = (1024 - 1019) / 1024 = 5/1024
#     dce_tcp_rtt 1 us           -> alpha_timer (alpha is updated every microsecond)
#     min_time_between_cnps 4 us -> cnp_interval (the receiver's CNP spacing per flow)
#   Not modelled: initial_alpha_value 1023 (the model starts alpha at 1, i.e. 1024/1024),
#   rate_reduce_monitor_period 4 us (at most one cut per 4 us; the 4 us CNP spacing
#   already bounds cuts to one per 4 us per flow), rpg_gd 11 and rpg_min_dec_fac 50 (a
#   cut by alpha / 2, at most halving, as the model does), clamp_tgt_rate_after_time_inc
#   (the target is clamped after a timer-driven increase; the model never clamps when
#   clamp_tgt_rate is off). clamp_tgt_rate 0 -> clamp_target = false.
# cx-200g, cx-400g: NVIDIA publishes one default set for all link speeds, not one per
#   speed, so these are derived, not documented: the cx-100g set with the additive and
#   hyper-increase steps scaled with line rate (x2, x4), so a recovery climbs the same
#   fraction of line rate per step as at 100 Gb/s. Timers, byte counter, gain and CNP
#   spacing are the documented values.
D, C = ("dcqcn",), ("cts",)
CONNECTX = {
    "cnp_interval": "4us",
    "alpha_timer": "1us",
    "rate_timer": "300us",
    "byte_counter": 32767,
    "fast_recovery_steps": 1,
    "additive_increase": "5M",
    "hyper_increase": "50M",
    "min_rate": "1M",
    "g": 5 / 1024,
    "clamp_target": False,
}
PRESETS = {
    "paper-40g": {},
    "cx-100g": CONNECTX,
    "cx-200g": {**CONNECTX, "additive_increase": "10M", "hyper_increase": "100M"},
    "cx-400g": {**CONNECTX, "additive_increase": "20M", "hyper_increase": "200M"},
}
PRESET_RATES_BPS = {"cx-100g": 100 * 10**9, "cx-200g": 200 * 10**9, "cx-400g": 400 * 10**9}


def preset_for_rate(rate_bps: int) -> str:
    """The DCQCN preset of a scenario that names none: the ConnectX set of the fastest line
    rate at or below the NICs' `rate_bps` (cx-400g on 400G links and faster), cx-100g
    below 100 Gb/s, since NVIDIA documents that set for every speed. The paper's 40 Gb/s
    set cuts a 400G NIC's rate so deep that an incast's link runs mostly idle
    (docs/transport.md), so it runs only when named."""
    fitting = [name for name, rate in PRESET_RATES_BPS.items() if rate <= rate_bps]
    return max(fitting, key=PRESET_RATES_BPS.__getitem__, default="cx-100g")


def _count(value):
    """A whole number (a count of steps, grants): 5, not 5.5 nor true."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("write a whole number")
    return value


PARAMETERS = (
    Parameter(
        "preset",
        None,
        lambda v: _choice(v, tuple(PRESETS)),
        "",
        D,
        "the DCQCN parameter set the other parameters default from; default: the ConnectX "
        "set for the NICs' line rate",
    ),
    Parameter("cnp_interval", "50us", parse_time, "ns", D, "at most one CNP per flow per interval"),
    Parameter("alpha_timer", "55us", parse_time, "ns", D, "alpha decays each interval with no CNP"),
    Parameter("rate_timer", "55us", parse_time, "ns", D, "one rate-increase step per interval"),
    Parameter(
        "byte_counter", "10MB", parse_size, "bytes", D, "one increase step per this many bytes"
    ),
    Parameter(
        "fast_recovery_steps", 5, _count, "", D, "fast-recovery steps before additive increase"
    ),
    Parameter("additive_increase", "40M", parse_rate, "bit/s", D, "rate added per additive step"),
    Parameter("hyper_increase", "400M", parse_rate, "bit/s", D, "rate added per hyper step"),
    Parameter("min_rate", "100M", parse_rate, "bit/s", D, "the lowest rate a cut reaches"),
    Parameter("g", 1 / 256, float, "", D, "gain of the alpha estimate"),
    Parameter(
        "clamp_target",
        True,
        lambda v: _flag(v),
        "",
        D,
        "a cut sets the target rate to the current rate (ConnectX clamp_tgt_rate); false: the "
        "target stays, so fast recovery heads back toward the rate before the cut",
    ),
    Parameter("cts_chunk", "256KiB", parse_size, "bytes", C, "bytes one grant admits"),
    Parameter("cts_window", 2, _count, "", C, "grants outstanding per flow"),
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
    Parameter(
        "ack_every",
        DEFAULT_ACK_EVERY,
        lambda v: _ack_every(v),
        "packets",
        KINDS,
        "the receiver acknowledges every this many in-order data packets and the last one "
        '(RC ACK coalescing); "flow": one ACK per flow, when its last byte arrives',
    ),
    Parameter(
        "finish",
        "sender",
        lambda v: _choice(v, FINISH),
        "",
        KINDS,
        "a flow ends at the sender when the ACK of its last byte returns (sender) or when "
        "its last byte arrives (receiver); the flows waiting on it start then",
    ),
    Parameter(
        "header_overhead",
        HEADER_OVERHEAD_BYTES,
        parse_size,
        "bytes",
        KINDS,
        "wire bytes of every packet besides its payload (headers, ICRC, FCS, preamble and "
        "gap); ACKs carry 4 more (AETH), CNPs and grants 16 more",
    ),
)
BY_NAME = {p.name: p for p in PARAMETERS}
DEFAULTS = {p.name: p.default for p in PARAMETERS}


def _flag(value):
    if not isinstance(value, bool):
        raise ValueError("write true or false")
    return value


def _ack_every(value):
    if value == "flow":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError('write a positive number of packets or "flow"')
    return value


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


TIMERS = ("cnp_interval", "alpha_timer", "rate_timer", "rto")  # 0 would fire without end


def cc_parameters(params: dict | None, kind: str | None = None, *, rate_bps: int) -> dict:
    """Congestion-control parameters with defaults filled in, parsed to ns, bytes and bit/s;
    DCQCN's from the preset given, else from `preset_for_rate(rate_bps)` (the NICs' rate).

    With `kind`, a parameter given that `kind` does not read is refused (a DCQCN timer in
    a run without DCQCN changes nothing: the scenario says something it does not do)."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(BY_NAME))
    if unknown:
        raise AifabricError(
            f"unknown congestion-control parameter {unknown[0]!r}; known: {', '.join(BY_NAME)}"
        )
    if kind is not None:
        for name in params:
            if kind not in BY_NAME[name].kinds:
                raise AifabricError(
                    f"congestion-control parameter {name} is read by "
                    f"{', '.join(BY_NAME[name].kinds)}, not by {kind}"
                )
    preset = params["preset"] if "preset" in params else preset_for_rate(rate_bps)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise AifabricError(f"unknown DCQCN preset {preset!r}; choose one of {', '.join(PRESETS)}")
    defaults = {**DEFAULTS, **PRESETS[preset], "preset": preset}
    out = {}
    for p in PARAMETERS:
        value = params.get(p.name, defaults[p.name])
        try:
            out[p.name] = p.parse(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise AifabricError(f"congestion-control parameter {p.name} = {value!r}: {e}") from None
    for name in TIMERS:
        if out[name] <= 0:
            raise AifabricError(f"congestion-control parameter {name} must be above 0 ns")
    if out["cts_window"] < 1 or out["cts_chunk"] < 1 or out["byte_counter"] < 1:
        raise AifabricError("cts_window, cts_chunk and byte_counter must be positive")
    if not 0 < out["g"] < 1:  # NaN fails it too
        raise AifabricError(f"the DCQCN gain g must be between 0 and 1, got {out['g']}")
    if out["fast_recovery_steps"] < 0:
        raise AifabricError("fast_recovery_steps must not be negative")
    if out["header_overhead"] > MAX_HEADER_OVERHEAD_BYTES:
        raise AifabricError(
            f"header_overhead must be at most {MAX_HEADER_OVERHEAD_BYTES:,} bytes, "
            f"got {out['header_overhead']:,}"
        )
    return out
