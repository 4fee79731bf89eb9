"""Workloads: jobs placed on a fabric, collectives as NCCL runs them, flows and packets.

The API the engines and the CLI use:

    load_workload(source) -> Workload         a preset name (dense, moe), a TOML path, or a
                                              traffic-matrix file (.npz, .csv, htsim)
    import_flows(path, fabric, seed=0)        -> FlowTable of a traffic-matrix file
    workload_from_dict(table, name)           the same keys as a TOML (a scenario's [workload])
    workload_presets() -> list[str]
    generate(fabric, workload, seed=0)        -> FlowTable (aifabric.traffic.flows: the contract)
    packetize(flows, rate_bps, mtu_bytes)     -> Packets (numba kernel)

A workload is one job (its keys at the top level) or several (`[[jobs]]`
tables, with `name` and `description` beside them). Jobs never share a NIC.
Beside `[[jobs]]`, `scheduler = "first-fit" | "topology-aware"` places the jobs
as they arrive instead (traffic.scheduler), each at its `arrival`, or at times
drawn from a Poisson process with mean gap `interarrival`.

    key            kinds  default     meaning
    preset         -      -           start from a preset (dense, moe); the other keys override it
    collective     c      -           allreduce allgather reducescatter alltoall broadcast sendrecv
    algorithm      c      auto        ring|tree|halving-doubling (allreduce); ring; pairwise; p2p;
                                      auto: NCCL's cost model picks (traffic.nccl)
    protocol       c t    auto        ll | ll128 | simple | auto (NCCL's cost model picks)
    nccl           c t    {}          [nccl] keys over the scenario's (traffic.nccl.Table)
    size           c p    64MiB/2MB   op bytes, nccl-tests convention (per flow, mean for patterns)
    hierarchical   c      false       intra-server step on NVLink; per-rail ops across servers
    root, stages   c      0, 2        broadcast root rank; sendrecv pipeline stages
    iterations     c      1           the op repeated, one after the other
    pattern        p      -           permutation | incast | uniform
    senders        p      8           incast: senders into rank 0 (the job gets senders + 1 GPUs)
    flows, load    p      n, 0        uniform: flow count; offered load per NIC (Poisson arrivals)
    distribution   p      fixed       uniform sizes: fixed | exponential | pareto (pareto_shape 1.5)
    model          t      -           a label; marks a training iteration (see traffic.training)
    matrix         m      -           a traffic-matrix file (see traffic.matrix); its NICs are
                                      its own (no gpus, placement, channels)
    tp pp dp ep    t      8 1 rest 1  parallelism (tp inside a server)
    params, layers t      -, 32       model size (or layer_sizes = ["..", ..]), dtype_bytes = 2
    bucket, fsdp   t      25MiB, no   gradient AllReduce bucket; FSDP AllGather/ReduceScatter
    micro_batches  t      2 x pp      pipeline micro-batches; activation = 16MiB per send
    moe_layers     t      0           MoE layers, moe_alltoall = 32MiB per GPU per AllToAll
    forward        t      0           compute per layer and micro-batch; backward = 2 x forward
    gpu_tflops     t      0           or compute from 6 x params x tokens (tokens per iteration)
                                      FLOPs at gpu_tflops x efficiency (0.4)
    gpus           all    "all"       GPUs of the job
    placement      all    packed      packed | fragmented | rail-aligned (traffic.placement)
    channels, qps  all    1, 1        parallel rings/trees; QPs per connection
    qp_mode        all    split       split each message over the QPs | round-robin messages
    chunk          all    512KiB      message a channel posts at once
    window         all    0           clear-to-send: outstanding chunks per channel (0: none)
    priority       all    3           802.1p priority of the flows; start = earliest start time
    arrival        all    0           with a scheduler: when the job arrives
    duration       all    0           with a scheduler: how long it holds its GPUs (0: NCCL's
                                      cost-model time of its ops, plus its compute)

(c: collective, p: pattern, t: training, m: matrix.) Flow granularity: see
`aifabric.traffic.collectives`; dependencies across ops: see `aifabric.traffic.generate`.
"""

import aifabric.fabric  # noqa: F401  (sets the numba cache directory first)
from aifabric.traffic.flow_packets import Packets, packetize
from aifabric.traffic.flows import FlowTable
from aifabric.traffic.generate import generate
from aifabric.traffic.matrix import import_flows, read_matrix
from aifabric.traffic.spec import Job, Workload, load_workload, workload_from_dict, workload_presets

__all__ = [
    "FlowTable",
    "Job",
    "Packets",
    "Workload",
    "generate",
    "import_flows",
    "load_workload",
    "packetize",
    "read_matrix",
    "workload_from_dict",
    "workload_presets",
]
