"""Scenarios loaded and validated in one place, for every engine: TOML files and presets.

This sits beside the engines, above the topologies and the workloads it
builds a scenario from (`aifabric.fabric.scenario` is the shape it returns).

The presets are `scenarios/presets/*.toml`. A scenario file names a
topology and a workload and sets what differs from their defaults, every key
checked (an unknown key is an error, not silence):

    [scenario]
    name = "demo"                    # default: the file's stem
    description = "..."
    topology = "lab-medium"          # a topology preset or a TOML path
    workload = "preset-or-file"      # or an inline [workload] table instead
    seed = 1                         # the base seed; each seed below defaults to it
    placement_seed = 1               # fragmented placement, random patterns' draws
    qpn_seed = 1                     # QPNs (so UDP source ports); default: after placement
    hash_seed = 1                    # switches' ECMP hash seeds (both engines), ECN draws
    sample_interval = "10us"
    captures = ["z0-r0-rtsw--z0-ctsw0"]  # port names (Fabric.port_name), or a NIC

    [workload]                       # traffic.workload_from_dict keys
    [nic]             sport = "linux" | "xor" | "random": a QP's RoCEv2 UDP source port
                      (aifabric.fabric.addressing.SPORT_RULES; default linux)
    [ecmp]            policy = "5tuple" | "eecmp" | "pinned" | "spray" | "adaptive"
                             | "linux" | "ovs" (the emulator's routers, its OVS bridges)
                      same_seed = false
    [queue]           the topology's [queue] keys (and [queue.rtsw] ...), overriding it
    [congestion_control]  kind = "dcqcn" | "none" | "cts", and its parameters
                          (see aifabric.fabric.cc.PARAMETERS)
    [[faults]]        link = "nodeA--nodeB" (or "nodeA--nodeB#2", or a link id)
                      | node = "z0-ctsw1"; at = "50us"; action = "down" | "drain"
                      | "up" (brings back one taken down or drained earlier)
    [maintenance]     a drain plan in waves (aifabric.scenarios.maintenance): tier = "ctsw"
                      (zones = [0]) | switches = [...]; wave_size, order, start, hold, gap,
                      domains; expanded into drain and up faults, one domain out at a time
    [nccl]            NCCL's latencies, bandwidth factors, buffers (aifabric.traffic.nccl
                      Table keys), any subset; a job's `nccl = {...}` overrides it
    [simulator]       partitions = "auto" | N: the simulator's partitions, each on a core of
                      its own (aifabric.sim.partition; results are the same for any number)
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from aifabric import topologies, traffic
from aifabric.fabric.addressing import DEFAULT_SPORT, SPORT_RULES
from aifabric.fabric.cc import DEFAULT_KIND, cc_parameters
from aifabric.fabric.cc import DEFAULTS as CC_DEFAULTS
from aifabric.fabric.cc import KINDS as CONGESTION_CONTROLS
from aifabric.fabric.errors import AifabricError, SpecError, UnitError, shown
from aifabric.fabric.faults import ACTIONS as FAULT_ACTIONS
from aifabric.fabric.faults import check_faults
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.routing import POLICIES
from aifabric.fabric.scenario import Fault, Scenario, job_names
from aifabric.fabric.specfile import Presets, check_table, load_toml, relative_to
from aifabric.fabric.units import parse_time
from aifabric.scenarios import maintenance
from aifabric.scenarios.overrides import ECMP_KEYS, NIC_KEYS, apply_overrides
from aifabric.topologies.spec import QUEUE_ROLES, queue_profiles
from aifabric.traffic import nccl
from aifabric.traffic.generate import generate_scheduled

TABLES = (
    "scenario", "workload", "nic", "ecmp", "queue", "congestion_control", "faults",
    "maintenance", "nccl", "simulator",
)  # fmt: skip
SEED_KEYS = ("placement_seed", "qpn_seed", "hash_seed")
SCENARIO_KEYS = (
    "name", "description", "topology", "workload", "seed", *SEED_KEYS, "sample_interval",
    "captures",
)  # fmt: skip
FAULT_KEYS = ("link", "node", "at", "action")
SIMULATOR_KEYS = ("partitions",)


PRESETS = Presets("aifabric.scenarios", "presets", "scenario")


def scenario_presets() -> list[str]:
    return PRESETS.names()


def load_scenario(source: str | Path, *, seed: int | None = None, overrides=None) -> Scenario:
    """A scenario preset name or TOML path -> a `Scenario` with its flows generated;
    `overrides` (dotted key -> value, see aifabric.scenarios.overrides) are laid over the file."""
    text, stem, folder = PRESETS.read(source)
    raw = load_toml(text, f"scenario {stem}")
    if overrides:
        raw = apply_overrides(raw, overrides, folder=folder)
    return scenario_from_dict(raw, stem, folder=folder, seed=seed)


def _check_keys(name: str, table: str, body: Any, keys) -> dict:
    return check_table(f"scenario {name}", table, body, keys)


def scenario_from_dict(
    raw: dict, stem: str, *, folder: Path | None = None, seed: int | None = None
) -> Scenario:
    for table in raw:
        if table not in TABLES:
            raise SpecError(
                f"scenario {stem}: unknown table [{table}]; known tables: {', '.join(TABLES)}"
            )
    head = _check_keys(stem, "scenario", raw.get("scenario", {}), SCENARIO_KEYS)
    name = head.get("name", stem)
    if "topology" not in head:
        raise SpecError(f"scenario {name}: scenario.topology is missing (a topology preset)")
    topology = relative_to(str(head["topology"]), folder)
    fabric = topologies.load_fabric(topology)
    queue = raw.get("queue")
    if queue is not None:
        fabric = with_queues(fabric, queue, name)

    if ("workload" in head) == ("workload" in raw):
        raise SpecError(
            f"scenario {name}: give the workload once, as scenario.workload = a preset or "
            "file, or as a [workload] table"
        )
    if "workload" in head:
        workload = traffic.load_workload(relative_to(str(head["workload"]), folder))
    else:
        workload = traffic.workload_from_dict(raw["workload"], name, folder)
    if "nccl" in raw:
        table = nccl.Table.from_dict(raw["nccl"], f"scenario {name}: nccl")
        workload = dataclasses.replace(workload, nccl_table=table)

    run_seed = _seed(name, "seed", head.get("seed", 0) if seed is None else seed)
    seeds = {key: _seed(name, key, head[key]) for key in SEED_KEYS if key in head}
    placement_seed = seeds.get("placement_seed", run_seed)
    control = {fabric.queue(Role(r)).control_priority for r in set(fabric.node_role.tolist())}
    for i, job in enumerate(workload.jobs):
        if job.values.get("priority") in control:
            raise SpecError(
                f"scenario {name}: job {job.values.get('name') or i} sends data on priority "
                f"{job.values['priority']}, the fabric's control priority (CNPs, ACKs, grants)"
            )
    try:
        interval = parse_time(head.get("sample_interval", "10us"))
    except UnitError as e:
        raise SpecError(f"scenario {name}: scenario.sample_interval: {e}") from None
    if interval <= 0:
        raise SpecError(f"scenario {name}: scenario.sample_interval must be positive")
    captures = head.get("captures", [])
    if not isinstance(captures, list) or not all(isinstance(c, str) for c in captures):
        raise SpecError(f"scenario {name}: scenario.captures must be a list of port names")
    captures = port_names(fabric, captures, f"scenario {name}: scenario.captures: ")

    nic = _check_keys(name, "nic", raw.get("nic", {}), NIC_KEYS)
    sport = nic.get("sport", DEFAULT_SPORT)
    if sport not in SPORT_RULES:
        raise SpecError(
            f"scenario {name}: nic.sport = {shown(sport)} is not one of {', '.join(SPORT_RULES)}"
        )

    ecmp = _check_keys(name, "ecmp", raw.get("ecmp", {}), ECMP_KEYS)
    policy = ecmp.get("policy", "5tuple")
    if policy not in POLICIES:
        raise SpecError(
            f"scenario {name}: ecmp.policy = {shown(policy)} is not one of {', '.join(POLICIES)}"
        )
    same_seed = ecmp.get("same_seed", False)
    if not isinstance(same_seed, bool):
        raise SpecError(f"scenario {name}: ecmp.same_seed must be true or false")

    cc_table = _check_keys(
        name, "congestion_control", raw.get("congestion_control", {}), ("kind", *CC_DEFAULTS)
    )
    cc_table = dict(cc_table)
    cc = cc_table.pop("kind", DEFAULT_KIND)
    if cc not in CONGESTION_CONTROLS:
        raise SpecError(
            f"scenario {name}: congestion_control.kind = {shown(cc)} is not one of "
            f"{', '.join(CONGESTION_CONTROLS)}"
        )
    try:
        cc_parameters(cc_table, cc, rate_bps=fabric.nic_rate_bps)
    except AifabricError as e:
        raise SpecError(f"scenario {name}: {e}") from None

    simulator = _check_keys(name, "simulator", raw.get("simulator", {}), SIMULATOR_KEYS)
    partitions = simulator.get("partitions", "auto")
    if partitions != "auto" and (
        isinstance(partitions, bool)
        or not isinstance(partitions, int)
        or not 1 <= partitions <= 1024
    ):
        raise SpecError(
            f'scenario {name}: simulator.partitions = {shown(partitions)} is neither "auto" '
            "nor a whole number from 1 to 1024"
        )

    faults = tuple(_fault(fabric, name, body) for body in _fault_list(raw.get("faults", []), name))
    flows, placed = generate_scheduled(
        fabric, workload, placement_seed, qpn_seed=seeds.get("qpn_seed"), sport=sport
    )
    plan = raw.get("maintenance", {})
    try:
        waves = maintenance.plan(fabric, plan, flows, workload.raw)
    except SpecError as e:
        raise SpecError(f"scenario {name}: {e}") from None
    faults += maintenance.expand(waves)
    try:
        check_faults(fabric, faults)
    except AifabricError as e:
        raise SpecError(f"scenario {name}: faults: {e}") from None
    return Scenario(
        name=name,
        fabric=fabric,
        flows=flows,
        topology=topology,
        workload=workload.raw,
        sport=sport,
        ecmp=policy,
        same_seed=same_seed,
        seed=run_seed,
        placement_seed=placement_seed,
        qpn_seed=seeds.get("qpn_seed"),
        hash_seed=seeds.get("hash_seed", run_seed),
        cc=cc,
        cc_params=cc_table,
        faults=faults,
        sample_interval_ns=interval,
        captures=tuple(captures),
        partitions=partitions,
        extra={
            "description": head.get("description", ""),
            **({"nccl": raw["nccl"]} if "nccl" in raw else {}),
            **(
                {"maintenance": {**plan, "waves": [w.to_dict(fabric) for w in waves]}}
                if waves
                else {}
            ),
            **({"schedule": _schedule_record(fabric, workload, placed)} if placed else {}),
        },
    )


def _schedule_record(fabric: Fabric, workload, placed) -> dict:
    """run.json's `scenario.schedule`: the scheduler and each job's place in the schedule
    (arrival, planned start and end, GPUs, zones and racks spanned), in order of start."""
    names = job_names(workload.raw)
    return {
        "scheduler": workload.scheduler,
        "jobs": [p.to_dict(fabric, names[p.job]) for p in placed],
    }


def _seed(name: str, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(
            f"scenario {name}: scenario.{key} = {value!r} must be a whole number, 0 or more"
        )
    return value


def with_queues(fabric: Fabric, queue: dict, name: str) -> Fabric:
    """The fabric with the scenario's [queue] keys laid over its topology's."""
    if not isinstance(queue, dict):
        raise SpecError(f"scenario {name}: [queue] must be a table")
    merged = copy.deepcopy(fabric.spec.get("queue", {}))
    for key, value in queue.items():
        if key in QUEUE_ROLES:
            if not isinstance(value, dict):
                raise SpecError(f"scenario {name}: [queue.{key}] must be a table")
            merged.setdefault(key, {}).update(value)
        else:
            merged[key] = value
    queues = queue_profiles(f"{fabric.name} (scenario {name})", merged)
    try:
        return dataclasses.replace(fabric, queues=queues)
    except SpecError as e:
        raise SpecError(f"scenario {name}: {e}") from None


def _fault_list(body, name: str) -> list:
    if not isinstance(body, list) or not all(isinstance(b, dict) for b in body):
        raise SpecError(f"scenario {name}: faults must be [[faults]] tables")
    return body


def _fault(fabric: Fabric, name: str, body: dict) -> Fault:
    _check_keys(name, "faults", body, FAULT_KEYS)
    if ("link" in body) == ("node" in body):
        raise SpecError(f"scenario {name}: a fault names either a link or a node")
    try:
        at = parse_time(body.get("at", 0))
    except UnitError as e:
        raise SpecError(f"scenario {name}: faults.at: {e}") from None
    action = body.get("action", "down")
    if action not in FAULT_ACTIONS:
        raise SpecError(
            f"scenario {name}: faults.action = {action!r} must be one of {', '.join(FAULT_ACTIONS)}"
        )
    if "node" in body:
        node = resolve_node(fabric, body["node"], name)
        if fabric.node_role[node] == Role.NIC:
            raise SpecError(f"scenario {name}: fault node {body['node']} is a NIC, not a switch")
        return Fault("node", node, at, action)
    return Fault("link", resolve_link(fabric, body["link"], name), at, action)


def resolve_node(fabric: Fabric, value, name: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < fabric.n_nodes:
            raise SpecError(f"scenario {name}: fabric {fabric.name} has no node {value}")
        return value
    if not isinstance(value, str):
        raise SpecError(f"scenario {name}: {value!r} is not a node name")
    try:
        return fabric.node_id(value)
    except AifabricError:
        raise SpecError(f"scenario {name}: fabric {fabric.name} has no node {value!r}") from None


def resolve_link(fabric: Fabric, value, name: str) -> int:
    """A link id, or "a--b" (the first link between nodes a and b), or "a--b#k" (the k-th)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < fabric.n_links:
            raise SpecError(f"scenario {name}: fabric {fabric.name} has no link {value}")
        return value
    if not isinstance(value, str) or "--" not in value:
        raise SpecError(f"scenario {name}: link {value!r} must be a link id or 'nodeA--nodeB'")
    text, _, nth = value.partition("#")
    a_name, _, b_name = text.partition("--")
    a, b = resolve_node(fabric, a_name, name), resolve_node(fabric, b_name, name)
    import numpy as np

    la, lb = fabric.link_a, fabric.link_b
    links = np.flatnonzero(((la == a) & (lb == b)) | ((la == b) & (lb == a)))
    if "#" in value and not (nth.isdigit() and int(nth) >= 2):
        raise SpecError(
            f"scenario {name}: link {value!r}: #k names the k-th of parallel links from 2 on "
            f"(the first is {text!r})"
        )
    k = int(nth) if nth else 1
    if len(links) < k:
        raise SpecError(f"scenario {name}: fabric {fabric.name} has no link {value!r}")
    return int(links[k - 1])


def port_names(fabric: Fabric, names, context: str = "") -> tuple[str, ...]:
    """Each port's one printed name (`Fabric.port_name`), each once, in the order given;
    a port that does not exist is one sentence (starting with `context`)."""
    out = []
    for name in names:
        try:
            out.append(fabric.port_name(fabric.port_id(name)))
        except AifabricError as e:
            raise SpecError(f"{context}{e}") from None
    return tuple(dict.fromkeys(out))


def with_captures(scenario: Scenario, names) -> Scenario:
    """The scenario capturing `names` (port names or NICs) as well as its own captures."""
    more = port_names(scenario.fabric, names, "cannot capture: ")
    return dataclasses.replace(scenario, captures=tuple(dict.fromkeys((*scenario.captures, *more))))
