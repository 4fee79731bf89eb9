"""A scenario: fabric + workload + NIC ports + ECMP + queues + congestion control + faults + seeds.

This is what every engine runs. `to_dict()` is what run.json records under
"scenario". Scenarios are loaded and validated in one place,
`aifabric.scenarios` (`load_scenario`, presets in `scenarios/presets/`);
this module only fixes the shape every engine reads. It sits below the
workloads: the flow table is built by `traffic` and only carried here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aifabric.fabric.cc import DEFAULT_KIND, cc_parameters
from aifabric.fabric.model import Fabric, Role

if TYPE_CHECKING:
    from aifabric.traffic.flows import FlowTable


@dataclass(frozen=True)
class Fault:
    """A link or switch taken down (or drained: no new flows, in-flight ones finish) at a time."""

    kind: str  # "link" or "node"
    target: int  # link id or node id
    at_ns: int = 0
    action: str = "down"  # "down" or "drain"


@dataclass(frozen=True, eq=False)
class Scenario:
    name: str
    fabric: Fabric
    flows: FlowTable
    topology: str  # the preset name or TOML path the fabric came from
    workload: dict[str, Any]  # the workload spec as given
    sport: str = "linux"  # the NICs' UDP source-port rule the flows' ports follow ([nic] sport)
    ecmp: str = "5tuple"
    same_seed: bool = False
    seed: int = 0  # the base seed: each seed below that is not given is this one
    placement_seed: int | None = None  # placement and random patterns (aifabric.traffic.generate)
    qpn_seed: int | None = None  # QPNs; None: drawn after placement, from its generator
    hash_seed: int | None = None  # the switches: ECMP hash seeds, the simulator's ECN draws
    cc: str = DEFAULT_KIND
    cc_params: dict[str, Any] = field(default_factory=dict)
    faults: tuple[Fault, ...] = ()
    sample_interval_ns: int = 10_000
    captures: tuple[str, ...] = ()  # ports to capture, by `Fabric.port_name`
    partitions: int | str = "auto"  # the simulator's ([simulator] partitions)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for name in ("placement_seed", "hash_seed"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self.seed)

    def capture_ports(self) -> list[int]:
        """The captured ports' ids, each once, in order."""
        return sorted({self.fabric.port_id(name) for name in self.captures})

    def cc_parameters(self) -> dict[str, Any]:
        """The congestion-control parameters that run: defaults filled in, DCQCN's preset
        following the NICs' rate unless the scenario names one (aifabric.fabric.cc)."""
        return cc_parameters(self.cc_params, rate_bps=self.fabric.nic_rate_bps)

    def cc_recorded(self) -> dict[str, Any]:
        """`[congestion_control]` as given, and the DCQCN preset that runs under `dcqcn`."""
        preset = {"preset": self.cc_parameters()["preset"]} if self.cc == "dcqcn" else {}
        return {"kind": self.cc, **self.cc_params, **preset}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topology": self.topology,
            "fabric": self.fabric.name,
            "topology_spec": self.fabric.spec,
            "workload": self.workload,
            "nic": {"sport": self.sport},
            "ecmp": {"policy": self.ecmp, "same_seed": self.same_seed},
            "queues": {role.label: _queue_dict(self.fabric, role) for role in _roles()},
            "congestion_control": self.cc_recorded(),
            "faults": [f.__dict__ for f in self.faults],
            "seed": self.seed,
            "placement_seed": self.placement_seed,
            "qpn_seed": self.qpn_seed,
            "hash_seed": self.hash_seed,
            "sample_interval_ns": self.sample_interval_ns,
            "captures": list(self.captures),
            "simulator": {"partitions": self.partitions},
            "flows": len(self.flows),
            **self.extra,
        }


def _roles():
    return tuple(Role)


def _queue_dict(fabric: Fabric, role) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(fabric.queue(role))


def job_bodies(workload: dict) -> list[dict]:
    """The jobs of a workload spec, in order: its `jobs`, or the workload itself (one job)."""
    return workload.get("jobs") if isinstance(workload.get("jobs"), list) else [workload]


def job_names(workload: dict) -> list[str]:
    """A name per job of a workload spec: its `name`, else its collective, pattern or model;
    made unique. The sweep's per-job columns (`busbw_gbps@NAME`) and the run directory's
    `job_name` columns use it."""
    bodies = job_bodies(workload)
    names = []
    for i, body in enumerate(bodies):
        name = body.get("name") or next(
            (str(body[k]) for k in ("collective", "pattern", "model") if k in body), f"job{i}"
        )
        names.append(name if name not in names else f"{name}{i}")
    return names
