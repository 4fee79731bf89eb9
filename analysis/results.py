"""The analyzer's results as typed values: one frozen dataclass per concept.

`aifabric.analysis.metrics` builds them (`run_metrics` -> `RunMetrics`,
`capture_metrics` -> `CaptureMetrics`, `summary` -> `Summary`); the terminal text
(`render`), the report, a sweep's columns and `aifabric.Run.metrics()` read their
attributes. `to_dict()` is what `analyze --json` prints: the fields in the order
declared here, nested results as objects, sequences as lists. A field marked
`optional` is left out of `to_dict()` when it is None (what a run or a capture
did not measure: the time series without `--series`, a job's flow completion
times in a run without flows); every other field is always there, null where
its figure does not exist (an op that did not finish has no `time_ns`).

Units are in the field names (`_ns`, `_bps` in bit/s, `_bytes`); ratios and
fractions are plain floats (`utilization` 0..1 of line rate, `efficiency`
ideal / actual time).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def optional(default=None):
    """A field left out of `to_dict()` when it is None (see the module docstring)."""
    return field(default=default, metadata={"optional": True})


def _plain(value):
    if isinstance(value, Result):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Result:
    """What every result has: `to_dict()`, its JSON form."""

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.metadata.get("optional"):
                continue
            out[f.name] = _plain(value)
        return out


# --- shared figures ------------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution(Result):
    """count, mean, p50, p90, p99 and max of a sample (None each when it is empty)."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None


@dataclass(frozen=True)
class Imbalance(Result):
    """How unevenly a load spreads over `bins`: max/mean, coefficient of variation, Jain."""

    bins: int
    mean: float
    max: float
    max_mean: float
    cv: float
    jain: float

    @classmethod
    def of(cls, load) -> Imbalance:
        """The imbalance of a load vector (`aifabric.fabric.imbalance.imbalance`)."""
        from aifabric.fabric.imbalance import imbalance

        return cls(**imbalance(load))


@dataclass(frozen=True)
class UniformReference(Result):
    """The same figures expected under uniform hashing of the same QPs over the same next
    hops, one draw per hashed key (`hash_units`: QPs sharing a 5-tuple go together; the
    mean over `aifabric.analysis.ecmp.TRIALS` draws)."""

    max_mean: float
    cv: float
    jain: float


# --- ECMP ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EcmpSwitch(Result):
    """One switch's spread of the QPs that had a choice there, in one tier."""

    switch: str
    tier: str
    links: int
    ports: tuple[str, ...]
    qps: int
    hash_units: int  # the QPs' distinct hashed keys (`routing.hashed_fields`): the balls
    bytes_per_link: tuple[int, ...]
    qps_per_link: tuple[int, ...]
    bytes: Imbalance
    bytes_expected: UniformReference
    qps_imbalance: Imbalance
    qps_expected: UniformReference
    collisions: int
    collisions_expected: float


@dataclass(frozen=True)
class EcmpTier(Result):
    """One tier (`rtsw>ctsw`, `ctsw>rtsw`, ...): bytes and QPs over the links its QPs could
    take, each figure beside its uniform-hashing reference."""

    tier: str
    switches: int
    links: int
    links_in_tier: int
    links_used: int
    qps: int
    hash_units: int
    bytes: Imbalance
    bytes_expected: UniformReference
    qps_imbalance: Imbalance
    qps_expected: UniformReference
    switch_max_mean: float
    switch_max_mean_expected: float
    collisions: int
    collisions_expected: float


@dataclass(frozen=True)
class Ecmp(Result):
    tiers: tuple[EcmpTier, ...] = ()
    switches: tuple[EcmpSwitch, ...] = ()
    choices: int = 0


# --- a run's ports -------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowTotals(Result):
    count: int
    finished: int
    bytes: int


@dataclass(frozen=True)
class PortFigures(Result):
    """One port over the whole run (its samples summed, or their maximum)."""

    port: str
    port_id: int
    tx_bytes: int
    utilization: float
    peak_utilization: float
    qdepth_bytes: Distribution
    queue_delay_max_ns: float
    queue_delay_mean_ns: float
    ecn_marked: int
    ecn_fraction_est: float
    paused_ns: int
    paused_fraction: float
    pause_caused_ns: int
    pfc_sent: int
    drops: int


@dataclass(frozen=True)
class Congestion(Result):
    """The run's sampled ports together, and each of them (`per_port`)."""

    interval_ns: int
    samples: int
    ports: int
    ecn_marked: int
    ecn_fraction_est: float
    paused_ns: int
    paused_ports: int
    pfc_frames: int
    drops: int
    qdepth_max_bytes: int
    per_port: tuple[PortFigures, ...]
    cnp_sent: int | None = None


@dataclass(frozen=True)
class Hotspot(Result):
    """A port that cost the run something: the pause time it caused plus its deepest queue
    as delay (`cost_ns`)."""

    rank: int
    port: str
    cost_ns: float
    pause_caused_ns: int
    queue_delay_max_ns: float
    queue_delay_mean_ns: float
    qdepth_max_bytes: int
    ecn_marked: int
    drops: int
    paused_ns: int
    utilization: float


@dataclass(frozen=True)
class PausedPort(Result):
    """A port PFC paused, why (`cause`: "pause" spread from `because_of`, or "congestion"
    at its peer), and the congested port at the end of its chain (`root`)."""

    port: str
    first_pause_ns: int
    paused_ns: int
    pfc_received: int | None
    cause: str
    because_of: str | None
    hops_from_root: int
    root: str | None


# --- collectives and jobs -------------------------------------------------------------------


@dataclass(frozen=True)
class Collective(Result):
    """One collective op (or pattern): its time, ideal time at line rate, efficiency, and
    nccl-tests algbw and busbw; None where it did not finish. `protocol` and
    `predicted_ns` are the NCCL protocol the op ran and NCCL's cost-model time for it
    (aifabric.traffic.nccl), None for patterns and for runs written before they were
    recorded."""

    op: int
    job: int
    job_name: str
    kind: str
    algorithm: str
    bytes: int
    ranks: int
    start_ns: int
    end_ns: int
    time_ns: int | None
    ideal_ns: int | None
    efficiency: float | None
    algbw_bps: float | None
    busbw_factor: float | None
    busbw_bps: float | None
    busbw_emulated_bps: float | None
    protocol: str | None = None
    predicted_ns: int | None = None


@dataclass(frozen=True)
class Collectives(Result):
    count: int = 0
    finished: int = 0
    ops: tuple[Collective, ...] = ()


@dataclass(frozen=True)
class Job(Result):
    """One job's figures (jobs are never averaged together)."""

    job: int
    name: str
    kinds: tuple[str, ...]
    ops: int
    ops_finished: int
    bytes: int
    start_ns: int | None
    end_ns: int | None
    time_ns: int | None
    ideal_ns: int | None
    efficiency: float | None
    algbw_bps: Distribution
    busbw_bps: Distribution  # of its collective ops (a pattern has no busbw: its goodput)
    busbw_emulated_bps: Distribution
    # a job of patterns (an incast, a permutation, a matrix): the bytes of its flows that
    # finished (its ops' bytes in a run without flows) over its time; None for a collective
    goodput_bps: float | None
    fct_ns: Distribution | None = optional()  # in a run with flows
    receivers: int | None = optional()
    # PFC pause time on the ports of the NICs it sends from (a run with flows and ports)
    senders_paused_ns: int | None = optional()
    # a training job with compute (aifabric.fabric.completion.iterations): its compute-only
    # iteration (the lower bound), its iteration time, and the communication left exposed
    compute_ns: int | None = optional()
    iteration_ns: int | None = optional()
    exposed_ns: int | None = optional()


@dataclass(frozen=True)
class JobThroughput(Result):
    """What a job's receivers took (their downlinks carry only its flows)."""

    job: int
    name: str
    receivers: int
    line_rate_bps: float
    rx_bytes: int
    rx_bytes_per_interval: tuple[int, ...] | None = optional()  # with series
    utilization: tuple[float, ...] | None = optional()


@dataclass(frozen=True)
class LowInterval(Result):
    """A stretch of intervals where a running job's receivers took less than the low mark."""

    job: int
    name: str
    start_ns: int
    end_ns: int
    intervals: int
    utilization: float
    rx_bps: float


@dataclass(frozen=True)
class BusyLink(Result):
    port: str
    tx_bytes: int
    tx_bytes_per_interval: tuple[int, ...] | None = optional()  # with series
    utilization: tuple[float, ...] | None = optional()


@dataclass(frozen=True)
class Throughput(Result):
    low_utilization: float
    worst_intervals: tuple[LowInterval, ...] = ()
    jobs: tuple[JobThroughput, ...] = ()
    busiest: tuple[BusyLink, ...] = ()
    low_intervals: tuple[LowInterval, ...] | None = optional()  # with series: all, in time order


@dataclass(frozen=True)
class PortSeries(Result):
    """The per-port time series (with `series`): [port][sample] where two-dimensional."""

    t_ns: tuple[int, ...]
    interval_ns: int
    ports: tuple[str, ...]
    port_ids: tuple[int, ...]
    utilization: tuple[tuple[float, ...], ...]
    qdepth_max_bytes: tuple[tuple[int, ...], ...]
    ecn_marked: tuple[int, ...]
    paused_ns: tuple[int, ...]
    paused_ports: tuple[int, ...]
    pfc_sent: tuple[int, ...]
    cnp_sent: tuple[int, ...] | None = optional()  # engines that sample CNPs per port


# --- captures --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptureEcn(Result):
    ip_packets: int
    not_ect: int
    ect1: int
    ect0: int
    ce: int
    ce_fraction: float
    ce_fraction_of_ect: float


@dataclass(frozen=True)
class CaptureRoce(Result):
    packets: int
    bytes: int
    fecn: int
    becn: int


@dataclass(frozen=True)
class CaptureCnp(Result):
    count: int
    rate_per_s: float
    per_roce_packet: float
    qps: int


@dataclass(frozen=True)
class CapturePfc(Result):
    """802.1Qbb PFC frames, per priority 0..7; paused time at `rate_bps`."""

    frames: int
    frames_per_priority: tuple[int, ...]
    xoff_per_priority: tuple[int, ...]
    xon_per_priority: tuple[int, ...]
    quanta_per_priority: tuple[int, ...]
    paused_ns_per_priority: tuple[int, ...]
    rate_bps: int


@dataclass(frozen=True)
class CapturePause(Result):
    """802.3x PAUSE frames (not counted as PFC)."""

    frames: int
    quanta: int
    paused_ns: int


@dataclass(frozen=True)
class CaptureFlow(Result):
    src: str
    dst: str
    sport: int
    dport: int
    dqpn: int
    packets: int
    bytes: int
    ce: int
    first_ns: int
    duration_ns: int


@dataclass(frozen=True)
class CaptureFlows(Result):
    count: int = 0
    top: tuple[CaptureFlow, ...] = ()


@dataclass(frozen=True)
class PerInterface(Result):
    """Bytes and packets per interface; with two or more (each an uplink), the flows on each
    and their collisions beside uniform hashing."""

    bytes: tuple[int, ...]
    packets: tuple[int, ...]
    imbalance: Imbalance | None
    flows: tuple[int, ...] | None = optional()
    flows_imbalance: Imbalance | None = optional()
    collisions: int | None = optional()
    collisions_expected: float | None = optional()


@dataclass(frozen=True)
class CaptureSeries(Result):
    bin_ns: int
    t_ns: tuple[int, ...]
    throughput_bps: tuple[tuple[float, ...], ...]
    ce: tuple[int, ...]
    cnp: tuple[int, ...]
    pfc: tuple[int, ...]


@dataclass(frozen=True)
class CaptureMetrics(Result):
    """Metrics of one capture file."""

    source: str
    file: str
    format: str
    problem: str | None
    packets: int
    bytes: int
    captured_bytes: int
    cut_headers: int
    interfaces: int
    start_ns: int
    duration_ns: int
    kinds: dict[str, int]
    ecn: CaptureEcn
    roce: CaptureRoce
    cnp: CaptureCnp
    pfc: CapturePfc
    pause: CapturePause
    flows: CaptureFlows
    fct_ns: Distribution
    per_interface: PerInterface
    series: CaptureSeries | None = optional()  # with series


# --- faults ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityOut(Result):
    """What of one tier's links is out (down or drained) once a fault happened."""

    tier: str  # the links' upward direction: nic>rtsw, rtsw>ctsw, ctsw>atsw
    links_out: int
    links: int
    capacity_out_bps: int  # the rates of the links out, one direction
    capacity_bps: int  # the tier's, one direction
    fraction: float  # capacity_out_bps / capacity_bps


@dataclass(frozen=True)
class Fault(Result):
    """A fault the engine applied: what, when, and what it changed."""

    kind: str  # link or node
    target: str  # a link by its port's name, a switch by its name
    action: str  # down, drain or up
    at_ns: int  # as the scenario asked
    applied_ns: int  # when the engine began the change
    settled_ns: int  # when the last switch had its new routes
    switches_rerouted: int  # switches whose next hops towards some NIC changed
    flows_moved: int | None  # flows underway (started, not ended) whose route changed
    capacity_out: tuple[CapacityOut, ...]  # per tier with links out, once it happened


# --- maintenance waves -----------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityKept(Result):
    """What of one tier's links stays in service while a wave is out."""

    tier: str  # the links' upward direction, as in CapacityOut
    links_kept: int
    links: int
    capacity_kept_bps: int  # the rates of the links kept, one direction
    capacity_bps: int
    fraction: float  # capacity_kept_bps / capacity_bps


@dataclass(frozen=True)
class WaveJob(Result):
    """One job while a wave was out (its drain to its restore)."""

    job: int
    name: str
    rx_bps: float | None  # into each of its receivers, mean over the window's whole samples
    ops: int  # its collective ops that started and ended inside the window
    busbw_bps: float | None  # their mean busbw (nccl-tests); None when no op fits inside


@dataclass(frozen=True)
class Wave(Result):
    """One wave of a drain plan (run.json's `scenario.maintenance.waves`) as the run had it."""

    wave: int
    switches: tuple[str, ...]
    domain: int  # its maintenance domain
    drain_ns: int
    restore_ns: int
    reached: bool  # the engine applied its drain
    samples: int  # whole port-series intervals inside the window (those rx_bps averages)
    capacity_kept: tuple[CapacityKept, ...]  # per tier with links out while it was
    jobs: tuple[WaveJob, ...]


@dataclass(frozen=True)
class ScheduledJob(Result):
    """One job of a scheduled workload (run.json's `scenario.schedule.jobs`) as the run had it."""

    job: int
    name: str
    gpus: int
    zones: int  # AI Zones its GPUs span
    racks: int
    arrival_ns: int
    planned_start_ns: int  # when the scheduler gave it its GPUs (NCCL's cost model for holds)
    start_ns: int | None  # when the last of its GPUs began sending or receiving for it
    wait_ns: int | None  # start_ns - arrival_ns
    atsw_bytes: int  # payload bytes of its flows through ATSW switches (one count per switch)


@dataclass(frozen=True)
class Schedule(Result):
    """A scheduled workload's jobs and the bytes the run sent over the ATSW layer."""

    scheduler: str
    bytes: int  # payload bytes of every flow
    atsw_bytes: int  # of them, through ATSW switches: a flow's bytes once per ATSW on its path
    jobs: tuple[ScheduledJob, ...]


# --- a run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunMetrics(Result):
    """Metrics of one run directory (any engine): what `aifabric analyze RUN` shows."""

    source: str
    path: str
    engine: str
    status: str
    fabric: str
    scenario: dict[str, Any]  # the scenario's scalar keys (name, seed, ...)
    flows: FlowTotals
    fct_ns: Distribution
    ecmp: Ecmp
    emulation_scale: float
    pause_spread: tuple[PausedPort, ...]
    congestion: Congestion | None
    hotspots: tuple[Hotspot, ...]
    cnp_sent: int | None
    collectives: Collectives
    jobs: tuple[Job, ...]
    throughput: Throughput
    series: PortSeries | None = optional()  # with series
    captures: tuple[CaptureMetrics, ...] = ()
    faults: tuple[Fault, ...] | None = optional()  # those applied; a run without faults: None
    waves: tuple[Wave, ...] | None = optional()  # its drain plan's waves; without one: None
    schedule: Schedule | None = optional()  # a workload with a scheduler; without one: None

    def job(self, name: str | int) -> Job:
        """The job named `name` (or numbered)."""
        for j in self.jobs:
            if name in (j.name, j.job):
                return j
        have = ", ".join(j.name for j in self.jobs) or "none"
        raise KeyError(f"the run has no job {name!r} (its jobs: {have})")


# --- the few numbers compare shows -----------------------------------------------------------


@dataclass(frozen=True)
class JobSummary(Result):
    job: int
    name: str
    kind: str
    busbw_bps: float | None
    goodput_bps: float | None
    time_ns: float | None
    ideal_ns: float | None
    efficiency: float | None
    fct_p99_ns: float | None
    runs: int | None = optional()  # a group of runs (a sweep's configuration)
    spread: dict[str, float | None] | None = optional()  # and the 95% half-intervals


@dataclass(frozen=True)
class Summary(Result):
    """A run's or a capture's headline numbers (None where not measured), per job first;
    for a group of runs, the means, with `runs` and `spread` (95% half-intervals)."""

    name: str
    jobs: tuple[JobSummary, ...]
    ecmp_tier: str | None
    ecmp_max_mean: float | None
    ecmp_max_mean_expected: float | None
    ecmp_collisions: float | None
    ecmp_collisions_expected: float | None
    ecn_marked: float | None
    ecn_fraction: float | None
    cnp: float | None
    pfc_frames: float | None
    paused_ns: float | None
    drops: float | None
    max_queue_bytes: float | None
    fct_p50_ns: float | None
    fct_p99_ns: float | None
    runs: int | None = optional()
    spread: dict[str, float | None] | None = optional()

    # the figures a group of runs pools (all but name, jobs and the tier)
    @classmethod
    def figures(cls) -> list[str]:
        skip = ("name", "jobs", "ecmp_tier", "runs", "spread")
        return [f.name for f in fields(cls) if f.name not in skip]
