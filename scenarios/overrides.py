"""Key overrides of a scenario: `--set workload.qps=4`, and every point of a sweep.

An override names a key of a scenario's tables with dots and gives it a
value: `ecmp.policy`, `nic.sport`, `queue.ecn_kmin`, `queue.rtsw.pfc_xoff`,
`congestion_control.kind`, `scenario.seed`, `workload.qps`, and for one job
of several `workload.jobs.NAME.qps` (or its index, `workload.jobs.0.qps`);
`faults.0.at` changes a fault and `faults` replaces the list;
`maintenance.wave_size` sets a key of the drain plan and `maintenance` replaces it;
`nccl.steps`, `nccl.wire.ll`, `nccl.base_latency_us.ring.simple` set an entry
of the [nccl] table. Values are
TOML (`4`, `true`, `[1, 2]`, `"x"`), and a bare word that is not TOML is a
string (`50KiB`, `eecmp`).

`apply_overrides` is a pure function on the raw scenario table (the parsed
TOML): it returns a new table and leaves its input alone. Unknown keys are
refused here, naming the key and what its table takes; values are checked
by the loader afterwards, as if they had been written in the file.

A workload given by reference (`workload = "dense"` under [scenario]) is
inlined as a [workload] table before one of its keys is overridden, so
`--set workload.qps=4` works whichever way the scenario names its workload.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aifabric.fabric.errors import SpecError
from aifabric.fabric.specfile import relative_to

ECMP_KEYS = ("policy", "same_seed")
NIC_KEYS = ("sport",)


def parse_value(text: str) -> Any:
    """A value as TOML reads it (`4`, `true`, `[1, 2]`), or else the text itself (`50KiB`)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def parse_assignment(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, parsed value)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SpecError(f"override {text!r} must be written KEY=VALUE, e.g. ecmp.policy=eecmp")
    return key, parse_value(value)


def _known() -> dict[str, tuple[str, ...]]:
    """The keys each table of a scenario takes (from the modules that check them)."""
    from aifabric.fabric.cc import DEFAULTS as CC_DEFAULTS
    from aifabric.scenarios import FAULT_KEYS, SCENARIO_KEYS, SIMULATOR_KEYS
    from aifabric.scenarios.maintenance import KEYS as MAINTENANCE_KEYS
    from aifabric.topologies.spec import SCHEMA
    from aifabric.traffic.nccl import KEYS as NCCL_KEYS
    from aifabric.traffic.spec import COMMON, KINDS, WORKLOAD_KEYS

    job_keys = dict.fromkeys(COMMON)
    for keys in KINDS.values():
        job_keys.update(dict.fromkeys(keys))
    return {
        "scenario": SCENARIO_KEYS,
        "nic": NIC_KEYS,
        "ecmp": ECMP_KEYS,
        "queue": tuple(SCHEMA["queue"]),
        "congestion_control": ("kind", *CC_DEFAULTS),
        "faults": FAULT_KEYS,
        "maintenance": MAINTENANCE_KEYS,
        "workload": tuple(dict.fromkeys((*job_keys, *WORKLOAD_KEYS, "preset"))),
        "nccl": NCCL_KEYS,
        "simulator": SIMULATOR_KEYS,
    }


def check_key(key: str) -> None:
    """Refuse a key no scenario table takes, in one sentence naming it."""
    from aifabric.topologies.spec import QUEUE_ROLES

    known = _known()
    table, _, rest = key.partition(".")
    if table not in known:
        raise SpecError(
            f"unknown key {key}: a scenario's tables are {', '.join(known)} (write table.key)"
        )
    parts = rest.split(".") if rest else []
    if table == "faults":
        if not parts:
            return
        if len(parts) == 2 and parts[0].isdigit() and parts[1] in known["faults"]:
            return
        raise SpecError(
            f"unknown key {key}: write faults.N.KEY with KEY one of {', '.join(known['faults'])}"
        )
    if table == "maintenance" and not parts:
        return  # the whole plan: a sweep's grid names plans (an empty table plans none)
    if table == "queue" and len(parts) == 2 and parts[0] in QUEUE_ROLES:
        parts = parts[1:]
    if table == "workload" and len(parts) == 3 and parts[0] == "jobs":
        parts = parts[2:]
    if table == "nccl" and parts:
        parts = parts[:1]  # the entry below it (ring.ll, ...) is the loader's to check
    if len(parts) != 1 or parts[0] not in known[table]:
        raise SpecError(f"unknown key {key}: [{table}] takes {', '.join(known[table])}")


def apply_overrides(
    raw: dict,
    overrides: Mapping[str, Any] | Iterable[tuple[str, Any]],
    *,
    folder: Path | None = None,
) -> dict:
    """The raw scenario table with `overrides` (dotted key -> value) laid over it."""
    items = list(overrides.items() if isinstance(overrides, Mapping) else overrides)
    for key, _ in items:
        check_key(key)
    out = copy.deepcopy(raw)
    # scenario.workload first: it decides what the workload.* keys override
    items.sort(key=lambda kv: kv[0] != "scenario.workload")
    for key, value in items:
        table, _, rest = key.partition(".")
        if key == "scenario.workload":
            out.pop("workload", None)
        if table == "workload":
            _set_workload(out, rest.split("."), value, folder)
        elif table == "faults":
            _set_fault(out, rest, value, key)
        elif not rest:
            out[table] = copy.deepcopy(value)
        else:
            body = out.setdefault(table, {})
            *inner, last = rest.split(".")
            for part in inner:
                body = body.setdefault(part, {})
            if not isinstance(body, dict):
                raise SpecError(f"cannot set {key}: [{table}] is not a table")
            body[last] = copy.deepcopy(value)
    return out


def _inline_workload(raw: dict, folder: Path | None) -> dict:
    """The scenario's workload as a [workload] table (a preset or file reference inlined)."""
    from aifabric.traffic.spec import PRESETS

    head = raw.get("scenario", {})
    if isinstance(head, dict) and "workload" in head and "workload" not in raw:
        text, name, _ = PRESETS.read(relative_to(str(head["workload"]), folder))
        try:
            raw["workload"] = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"workload {name} is not valid TOML: {e}") from None
        del head["workload"]
    table = raw.setdefault("workload", {})
    if not isinstance(table, dict):
        raise SpecError("cannot override workload keys: [workload] is not a table")
    if "preset" in table:
        preset = table.pop("preset")
        if not isinstance(preset, str):
            raise SpecError(f"workload preset = {preset!r} must be a preset name")
        base = tomllib.loads(PRESETS.text(preset))
        table = {**base, **table}
        raw["workload"] = table
    return table


def _set_workload(raw: dict, parts: list[str], value: Any, folder: Path | None) -> None:
    from aifabric.traffic.spec import WORKLOAD_KEYS

    table = _inline_workload(raw, folder)
    jobs = table.get("jobs")
    if parts[0] == "jobs" and len(parts) == 3:
        if not isinstance(jobs, list):
            raise SpecError(f"cannot set workload.jobs.{parts[1]}: the workload has one job")
        _job(jobs, parts[1])[parts[2]] = copy.deepcopy(value)
        return
    key = parts[0]
    if isinstance(jobs, list) and key not in WORKLOAD_KEYS:
        for job in jobs:  # a job key without a job name: every job
            if isinstance(job, dict):
                job[key] = copy.deepcopy(value)
    else:
        table[key] = copy.deepcopy(value)


def _job(jobs: list, which: str) -> dict:
    if which.isdigit():
        if int(which) >= len(jobs):
            raise SpecError(f"workload.jobs.{which}: the workload has {len(jobs)} jobs")
        return jobs[int(which)]
    for job in jobs:
        if isinstance(job, dict) and job.get("name") == which:
            return job
    names = ", ".join(str(j.get("name", i)) for i, j in enumerate(jobs) if isinstance(j, dict))
    raise SpecError(f"workload.jobs.{which}: no job of that name; the jobs are {names}")


def _set_fault(raw: dict, rest: str, value: Any, key: str) -> None:
    if not rest:
        raw["faults"] = copy.deepcopy(value)
        return
    index, _, field = rest.partition(".")
    faults = raw.get("faults", [])
    if not isinstance(faults, list) or int(index) >= len(faults):
        raise SpecError(f"cannot set {key}: the scenario has {len(faults)} faults")
    faults[int(index)][field] = copy.deepcopy(value)
