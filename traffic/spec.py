"""Workload specs: TOML files, presets and inline tables, checked key by key.

A workload is one job or several. A file either holds one job's keys at its
top level or an array of `[[jobs]]` tables (with `name` and `description`
beside it). `preset = "dense"` starts from a preset and lets the other keys
override it (e.g. `gpus = 64` in a scenario's [workload] table). A job is one
of four kinds, chosen by the key it carries: `collective = ...`,
`pattern = ...`, `model = ...` (a training iteration) or `matrix = ...` (a
traffic-matrix file, `aifabric.traffic.matrix`). Every key is known
here with its type, bounds and default, so an unknown key, a bad unit or a
value out of range fails with one sentence that names the key and the value.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aifabric.fabric.errors import SpecError, UnitError, cut, shown
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
from aifabric.fabric.units import parse_size, parse_time
from aifabric.traffic import nccl
from aifabric.traffic.collectives import KINDS
from aifabric.traffic.scheduler import POLICIES as SCHEDULERS

COLLECTIVES = {name: c.algorithms for name, c in KINDS.items()}  # name -> its algorithms
PATTERNS = ("permutation", "incast", "uniform")
PLACEMENTS = ("packed", "fragmented", "rail-aligned")
QP_MODES = ("split", "round-robin")
PROTOCOLS = ("auto", *nccl.PROTOCOLS)
ALGORITHMS = tuple(dict.fromkeys(("auto", *(a for c in KINDS.values() for a in c.algorithms))))
DISTRIBUTIONS = ("fixed", "exponential", "pareto")
# Bounds that keep a workload within what one machine can generate and simulate;
# each refusal names the bound (docs/traffic.md lists them).
MAX_BYTES = 2**50  # an operation, flow, chunk or bucket: 1 PiB
MAX_PARAMS = 10**15  # parameters of a model
MAX_REPEATS = 10_000  # iterations, layers, micro-batches, MoE layers
MAX_UNIFORM_FLOWS = 10_000_000  # a uniform pattern's flows
MAX_TRAINING_OPS = 100_000  # operations of one training iteration
MAX_START_NS = 10**15  # a job's start: about 11.6 days of simulated time
MAX_COMPUTE_NS = 10**12  # a layer's forward or backward time: 1000 s
MAX_TFLOPS = 10**6  # a GPU's throughput
FLOW_BYTES = 96  # memory per flow while the table is built (columns, dependencies)


def _count(value):
    """A whole count that may be written as a float (70e9) or with a suffix ('70B')."""
    if isinstance(value, str):
        text = value.strip()
        scale = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
        factor = scale.get(text[-1:].lower())
        try:
            number = float(text[:-1] if factor else text) * (factor or 1)
        except ValueError:
            raise ValueError("must be a count such as 70e9 or '70B'") from None
        value = number
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a count such as 70e9 or '70B'")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite count such as 70e9 or '70B'")
    if value != int(value):
        raise ValueError("must be a whole count")
    return int(value)


def _choice(options: tuple[str, ...]):
    def parse(value):
        if value not in options:
            raise ValueError(f"is not one of {', '.join(options)}")
        return value

    return parse


def _gpus(value):
    if value == "all":
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError('must be a positive whole number or "all"')
    return value


def _table(value):
    if not isinstance(value, dict):
        raise ValueError("must be an inline table of [nccl] keys (aifabric.traffic.nccl)")
    return value


def _sizes(value):
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty list of sizes")
    sizes = tuple(parse_size(v) for v in value)
    if max(sizes) > MAX_BYTES:
        raise ValueError("must be sizes of at most 1PiB")
    return sizes


# Keys every job takes.
COMMON = {
    "name": Key(as_str, "", doc="job name"),
    "gpus": Key(_gpus, 0, doc='GPUs of the job, or "all" (the default: every free GPU)'),
    "placement": Key(_choice(PLACEMENTS), "packed", doc=", ".join(PLACEMENTS)),
    "priority": Key(as_int, 3, 0, "802.1p priority of the flows (the lossless class)"),
    "start": Key(parse_time, 0, 0, "earliest start of the job's first flows", MAX_START_NS),
    # with a scheduler (aifabric.traffic.scheduler): when the job arrives, how long it runs
    "arrival": Key(parse_time, 0, 0, "scheduler: when the job arrives", MAX_START_NS),
    "duration": Key(
        parse_time,
        0,
        0,
        "scheduler: how long it holds its GPUs; 0 = NCCL's cost model",
        MAX_START_NS,
    ),
    "channels": Key(as_int, 1, 1, "parallel rings or trees per connection"),
    "qps": Key(as_int, 1, 1, "QPs per connection (QP scaling)"),
    "qp_mode": Key(_choice(QP_MODES), "split", doc="split each message, or round-robin them"),
    "chunk": Key(
        parse_size, 512 * 2**10, 1, "message (chunk) size a channel posts at once", MAX_BYTES
    ),
    "window": Key(as_int, 0, 0, "clear-to-send: outstanding chunks per channel, 0 = no limit"),
}
# Keys of the jobs that issue collectives (collective and training jobs).
NCCL_KEYS = {
    "protocol": Key(_choice(PROTOCOLS), "auto", doc="NCCL protocol; auto: NCCL's cost model"),
    "nccl": Key(_table, {}, doc="[nccl] keys overriding the scenario's (aifabric.traffic.nccl)"),
}
COLLECTIVE = {
    "collective": Key(_choice(tuple(COLLECTIVES)), doc=", ".join(COLLECTIVES)),
    "algorithm": Key(as_str, "auto", doc=", ".join(ALGORITHMS)),
    "size": Key(
        parse_size, 64 * 2**20, 1, "bytes of the operation (nccl-tests convention)", MAX_BYTES
    ),
    "hierarchical": Key(as_bool, False, doc="intra-server step on NVLink, rails on the fabric"),
    "root": Key(as_int, 0, 0, "broadcast root rank"),
    "stages": Key(as_int, 2, 2, "sendrecv: pipeline stages"),
    "iterations": Key(as_int, 1, 1, "times the operation runs, one after the other", MAX_REPEATS),
    **NCCL_KEYS,
}
PATTERN = {
    "pattern": Key(_choice(PATTERNS), doc=", ".join(PATTERNS)),
    "size": Key(parse_size, 2 * 10**6, 1, "bytes per flow (the mean for uniform)", MAX_BYTES),
    "senders": Key(as_int, 8, 1, "incast: senders into rank 0"),
    "flows": Key(as_int, 0, 0, "uniform: number of flows, 0 = one per GPU"),
    "distribution": Key(_choice(DISTRIBUTIONS), "fixed", doc="uniform: flow sizes"),
    "pareto_shape": Key(as_number, 1.5, 1.01, "uniform: Pareto shape"),
    "load": Key(
        as_number, 0.0, 0, "uniform: offered load per NIC (Poisson arrivals), 0 = all at 0"
    ),
}
TRAINING = {
    "model": Key(as_str, doc="a label for the model; marks a training iteration"),
    "tp": Key(as_int, 8, 1, "tensor parallel, inside a server (NVLink)"),
    "pp": Key(as_int, 1, 1, "pipeline stages"),
    "dp": Key(as_int, 0, 0, "data parallel; 0 = the GPUs left over"),
    "ep": Key(as_int, 1, 1, "expert parallel, within the data-parallel group"),
    "params": Key(_count, 0, 0, "parameters of the model", MAX_PARAMS),
    "layers": Key(as_int, 32, 1, "transformer layers, split evenly over the stages", MAX_REPEATS),
    "layer_sizes": Key(_sizes, (), doc="per-layer parameter bytes (instead of params)"),
    "dtype_bytes": Key(as_int, 2, 1, "bytes per parameter and gradient"),
    "bucket": Key(parse_size, 25 * 2**20, 1, "gradient AllReduce bucket", MAX_BYTES),
    "fsdp": Key(as_bool, False, doc="shard parameters: AllGather and ReduceScatter per bucket"),
    "micro_batches": Key(as_int, 0, 0, "micro-batches per iteration; 0 = 2 x pp", MAX_REPEATS),
    "activation": Key(
        parse_size, 16 * 2**20, 0, "pipeline send per micro-batch and GPU", MAX_BYTES
    ),
    "moe_layers": Key(
        as_int, 0, 0, "MoE layers (each: 2 AllToAll forward, 2 backward)", MAX_REPEATS
    ),
    **NCCL_KEYS,
    "moe_alltoall": Key(
        parse_size, 32 * 2**20, 0, "AllToAll size per GPU per MoE layer", MAX_BYTES
    ),
    # compute (aifabric.traffic.training): given per layer, or from the model's FLOPs
    "forward": Key(
        parse_time, 0, 0, "forward time of one layer for one micro-batch", MAX_COMPUTE_NS
    ),
    "backward": Key(
        parse_time,
        0,
        0,
        "backward of one layer for one micro-batch; 0 = 2 x forward",
        MAX_COMPUTE_NS,
    ),
    "gpu_tflops": Key(as_number, 0.0, 0, "a GPU's peak TFLOP/s; 0 = no compute", MAX_TFLOPS),
    "efficiency": Key(as_number, 0.4, 0.001, "share of gpu_tflops the model reaches (MFU)", 1),
    "tokens": Key(_count, 0, 0, "tokens per iteration (global batch x sequence)", MAX_PARAMS),
}
MATRIX = {
    "matrix": Key(as_str, doc="a traffic-matrix file: .npz flow table, .csv or htsim (see "
                  "aifabric.traffic.matrix)"),
}  # fmt: skip
# Common keys a matrix job does not take: its file names the NICs and the flows.
MATRIX_FIXED = ("gpus", "placement", "channels")
KINDS = {"collective": COLLECTIVE, "pattern": PATTERN, "model": TRAINING, "matrix": MATRIX}
# beside [[jobs]]: the scheduler (aifabric.traffic.scheduler) and its arrival process
WORKLOAD_KEYS = ("name", "description", "jobs", "scheduler", "interarrival")


@dataclass(frozen=True)
class Job:
    """A checked job: its kind ("collective", "pattern", "training") and parsed values."""

    kind: str
    values: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


@dataclass(frozen=True)
class Workload:
    """A checked workload: its jobs, and the table it came from (for run.json)."""

    name: str
    description: str
    jobs: tuple[Job, ...]
    raw: dict[str, Any]
    nccl_table: nccl.Table = nccl.DEFAULT  # a scenario's [nccl] table; each job's nccl over it
    scheduler: str = ""  # "": every job placed at once by its placement key
    interarrival_ns: int = 0  # mean gap of the jobs' Poisson arrivals; 0: each job's arrival


PRESETS = Presets("aifabric.traffic", "presets", "workload")


def workload_presets() -> list[str]:
    return PRESETS.names()


def load_workload(source: str | Path) -> Workload:
    """A preset name, a TOML file or a traffic-matrix file (`traffic.matrix`) -> `Workload`."""
    from aifabric.traffic.matrix import is_matrix_file

    if is_matrix_file(source):
        return matrix_workload(source)
    if Path(str(source)).suffix.lower() not in ("", ".toml"):
        raise SpecError(
            f"workload file {source} does not exist (a traffic matrix is .npz, .csv or htsim text)"
        )
    text, name, folder = PRESETS.read(source)
    table = load_toml(text, f"workload {name}")
    return workload_from_dict(table, name, folder)


def matrix_workload(path: str | Path, keys: dict | None = None) -> Workload:
    """A one-job workload running the traffic matrix in `path`, with job `keys` (priority,
    start, qps, qp_mode, chunk, window)."""
    return workload_from_dict({"matrix": str(path), **(keys or {})}, Path(path).stem)


def named_job(source: str) -> str | None:
    """The key a bare collective or pattern name stands for ("collective", "pattern"), or None."""
    if source in COLLECTIVES:
        return "collective"
    return "pattern" if source in PATTERNS else None


def workload_of(source: str | Path, keys: dict | None = None) -> Workload:
    """A preset, a file, or a bare collective or pattern name (e.g. "allreduce") made a
    one-job workload with `keys` (those of its TOML table: size, gpus, ...)."""
    keys = {k: v for k, v in (keys or {}).items() if v is not None}
    kind = named_job(str(source))
    if kind:
        return workload_from_dict({kind: str(source), **keys}, str(source))
    if keys:
        raise SpecError(
            f"workload {source}: {', '.join(keys)} apply to a collective or pattern name "
            "(e.g. allreduce), not to a preset or file"
        )
    return load_workload(source)


def workload_from_dict(table: dict, name: str, folder: Path | None = None) -> Workload:
    """The keys of a workload TOML (e.g. a scenario's inline [workload] table) -> `Workload`.

    A job's `matrix` file is found relative to `folder` (the TOML's), else as given."""
    if not isinstance(table, dict):
        raise SpecError(f"workload {name} must be a table")
    if "preset" in table:
        table = _from_preset(table, name)
    if "jobs" in table:
        extra = sorted(set(table) - set(WORKLOAD_KEYS))
        if extra:
            raise SpecError(
                f"workload {name}: key {extra[0]} = {shown(table[extra[0]])} cannot stand beside "
                "[[jobs]]; put it inside a job"
            )
        bodies = table["jobs"]
        if (
            not isinstance(bodies, list)
            or not bodies
            or not all(isinstance(b, dict) for b in bodies)
        ):
            raise SpecError(f"workload {name}: jobs must be a non-empty array of tables")
        jobs = tuple(_job(name, f"jobs[{i}].", b, folder) for i, b in enumerate(bodies))
        display = table.get("name", name)
        description = table.get("description", "")
    else:
        body = {k: v for k, v in table.items() if k != "description"}
        beside = [k for k in ("scheduler", "interarrival") if k in body]
        if beside:
            raise SpecError(
                f"workload {name}: {beside[0]} = {shown(body[beside[0]])} places the jobs of "
                "[[jobs]]; write the job as a [[jobs]] table"
            )
        jobs = (_job(name, "", body, folder),)
        display = name
        description = table.get("description", "")
    for key, value in (("name", display), ("description", description)):
        if not isinstance(value, str):
            raise SpecError(f"workload {name}: {key} = {shown(value)} must be a string")
    names = [job.values.get("name") for job in jobs if job.values.get("name")]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecError(
            f"workload {name}: two jobs are named {twice[0]!r}; give each job its own name "
            "(the per-job tables tell them apart by it)"
        )
    scheduler, interarrival = _scheduling(name, table, jobs)
    return Workload(
        name=display,
        description=description,
        jobs=jobs,
        raw=dict(table),
        scheduler=scheduler,
        interarrival_ns=interarrival,
    )


def _scheduling(name: str, table: dict, jobs: tuple[Job, ...]) -> tuple[str, int]:
    """A workload's scheduler and mean interarrival time, checked against its jobs' keys."""
    bodies = table.get("jobs", [table])
    scheduler = table.get("scheduler", "") if "jobs" in table else ""
    if scheduler and scheduler not in SCHEDULERS:
        raise SpecError(
            f"workload {name}: scheduler = {shown(scheduler)} is not one of {', '.join(SCHEDULERS)}"
        )
    interarrival = 0
    if "interarrival" in table:
        try:
            interarrival = parse_time(table["interarrival"])
        except UnitError as e:
            raise SpecError(f"workload {name}: interarrival: {e}") from None
        if not 0 < interarrival <= MAX_START_NS or not scheduler:
            raise SpecError(
                f"workload {name}: interarrival = {shown(table['interarrival'])} must be a "
                "positive time, at most 10^6 s, beside a scheduler (the mean gap of the jobs' "
                "arrivals)"
            )
    for i, (job, body) in enumerate(zip(jobs, bodies, strict=True)):
        where = f"jobs[{i}]." if "jobs" in table else ""
        given = [k for k in ("arrival", "duration") if k in body]
        if given and not scheduler:
            raise SpecError(
                f"workload {name}: {where}{given[0]} applies to a job of a workload with a "
                "scheduler (scheduler = first-fit or topology-aware beside [[jobs]])"
            )
        refused = {"placement": "the scheduler places it", "start": "the scheduler starts it"}
        if interarrival:
            refused["arrival"] = "interarrival draws it"
        for key, why in refused.items():
            if scheduler and key in body:
                raise SpecError(
                    f"workload {name}: {where}{key} = {shown(body[key])} does not apply "
                    f"under scheduler = {scheduler}: {why}"
                )
        if scheduler and job.kind == "matrix":
            raise SpecError(
                f"workload {name}: {where}a matrix job names its NICs, so the scheduler "
                "cannot place it"
            )
    return scheduler, interarrival


def _from_preset(table: dict, name: str) -> dict:
    """`preset = "dense"` plus keys that override the preset's (single-job presets)."""
    preset = table["preset"]
    if not isinstance(preset, str):
        raise SpecError(f"workload {name}: preset = {shown(preset)} must be a preset name")
    base = tomllib.loads(PRESETS.text(preset))
    overrides = {k: v for k, v in table.items() if k != "preset"}
    if "jobs" in base and overrides:
        key = sorted(overrides)[0]
        raise SpecError(
            f"workload {name}: preset {preset} has several jobs, so {key} = "
            f"{shown(overrides[key])} cannot override it"
        )
    if "jobs" in overrides:
        raise SpecError(f"workload {name}: preset = {shown(preset)} cannot stand beside [[jobs]]")
    return {**base, **overrides}


def _job(name: str, where: str, body: dict, folder: Path | None = None) -> Job:
    kinds = [k for k in KINDS if k in body]
    if len(kinds) != 1:
        if kinds:
            raise SpecError(
                f"workload {name}: a job takes one of {', '.join(KINDS)}, "
                f"not both {kinds[0]} and {kinds[1]}"
            )
        raise SpecError(
            f"workload {name}: {where or 'the workload'} needs collective = ..., "
            "pattern = ..., model = ... (a training iteration) or matrix = ... (a file)"
        )
    kind = kinds[0]
    fixed = [k for k in MATRIX_FIXED if k in body] if kind == "matrix" else []
    if fixed:
        raise SpecError(
            f"workload {name}: {where}{fixed[0]} = {body[fixed[0]]!r} does not apply to a "
            "matrix job: its file names the NICs and the flows"
        )
    keys = {**COMMON, **KINDS[kind]}
    for key, value in body.items():
        if key not in keys:
            raise SpecError(
                f"workload {name}: unknown key {where}{cut(key)} = {shown(value)}; "
                f"a {kind} job takes {', '.join(keys)}"
            )
    values = parse_keys(f"workload {name}", where, body, keys)
    if values["priority"] > 7:
        raise SpecError(
            f"workload {name}: {where}priority = {values['priority']} must be an 802.1p "
            "priority 0..7"
        )
    if values["channels"] > 64 or values["qps"] > 256:
        raise SpecError(
            f"workload {name}: {where}channels = {values['channels']} and "
            f"qps = {values['qps']} must stay within 64 and 256"
        )
    if kind == "collective":
        why = nccl.refuse(values["collective"], values["algorithm"], values["protocol"])
        if why:
            raise SpecError(f"workload {name}: {where}{why}")
    if kind in ("collective", "model"):
        nccl.Table.from_dict(values["nccl"], f"workload {name}: {where}nccl")
    if kind == "model":
        kind = "training"
        if values["ep"] > 1 and not values["moe_layers"]:
            raise SpecError(
                f"workload {name}: {where}ep = {values['ep']} needs moe_layers, "
                "the layers whose experts it spreads"
            )
        if not values["params"] and not values["layer_sizes"]:
            raise SpecError(f"workload {name}: {where}params or layer_sizes must be given")
        why = compute_refusal(values)
        if why:
            raise SpecError(f"workload {name}: {where}{why}")
        ops = training_op_bound(values)
        if ops > MAX_TRAINING_OPS:
            raise SpecError(
                f"workload {name}: {where}this training iteration makes about {ops:,} "
                f"operations (gradient buckets, pipeline sends, MoE AllToAlls); at most "
                f"{MAX_TRAINING_OPS:,}: use a larger bucket or fewer micro_batches or moe_layers"
            )
    if kind == "pattern" and values["flows"] > MAX_UNIFORM_FLOWS:
        need = values["flows"] * values["channels"] * values["qps"] * FLOW_BYTES
        raise SpecError(
            f"workload {name}: {where}flows = {values['flows']:,} would need about "
            f"{need / 1e9:,.1f} GB to build its flow table; a uniform pattern takes at most "
            f"{MAX_UNIFORM_FLOWS:,} flows"
        )
    if kind == "matrix":
        path = Path(values["matrix"])
        if folder is not None and not path.is_absolute() and (folder / path).is_file():
            path = folder / path
        if not path.is_file():
            raise SpecError(f"workload {name}: {where}matrix = {values['matrix']!r}: no such file")
        values["matrix"] = str(path)
    if kind == "pattern" and values["pattern"] == "uniform" and values["load"] > 1:
        raise SpecError(
            f"workload {name}: {where}load = {values['load']:g} must be at most 1 (of the NIC rate)"
        )
    return Job(kind=kind, values=values)


def compute_refusal(values: dict) -> str | None:
    """Why a training job's compute keys do not fit together (None when they do): compute
    is given (`forward`, with `backward`) or derived (`gpu_tflops` with `tokens`), not both."""
    given = values["forward"] or values["backward"]
    if given and values["gpu_tflops"]:
        return (
            "forward/backward and gpu_tflops both set the compute time; give the times "
            "or the GPU's throughput, not both"
        )
    if values["backward"] and not values["forward"]:
        return "backward needs forward, the forward time of the same layer"
    if bool(values["gpu_tflops"]) != bool(values["tokens"]):
        return "gpu_tflops and tokens go together: compute = 6 x params x tokens FLOPs"
    return None


def training_op_bound(values: dict) -> int:
    """At most how many operations a training job's iteration issues (aifabric.traffic.training),
    from its keys alone: buckets per gradient pass, pipeline sends, MoE AllToAlls."""
    tp, pp = values["tp"], values["pp"]
    total = sum(values["layer_sizes"]) or values["params"] * values["dtype_bytes"]
    buckets = total // (tp * values["bucket"]) + pp
    passes = 3 if values["fsdp"] else 1
    micro = values["micro_batches"] or 2 * pp
    moe = 4 * values["moe_layers"] * micro if values["ep"] > 1 else 0
    return passes * buckets + 2 * (pp - 1) * micro + moe
