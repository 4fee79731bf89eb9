"""Workloads: jobs placed on a fabric, collectives as NCCL runs them, flows and packets.

The public API: `load_workload`, `workload_from_dict`, `workload_presets`,
`generate` (a workload on a fabric -> `FlowTable`) and `packetize` (flows ->
packets at a rate and MTU). See `traffic.spec` for the workload keys.
"""

from traffic.flows import FlowTable
from traffic.generate import generate
from traffic.packets import Packets, packetize
from traffic.spec import Job, Workload, load_workload, workload_from_dict, workload_presets

__all__ = [
    "FlowTable",
    "Job",
    "Packets",
    "Workload",
    "generate",
    "load_workload",
    "packetize",
    "workload_from_dict",
    "workload_presets",
]
