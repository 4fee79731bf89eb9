"""The flow table: the contract between workloads and the engines.

A `FlowTable` is columns of equal length, one row per flow (one QP's share
of one transfer), plus the dependencies that order them and a table of the
collective operations they belong to. It saves to a single `.npz` that
numpy alone loads back (no pickle):

    schema       'aifabric.flows/1'
    flow columns flow_id job op step channel src dst bytes sqpn dqpn sport priority
                 start_ns (earliest start, e.g. compute time before a bucket)
    dep_ptr      int64[n + 1]   flow f may start once every flow in
    dep          int64[...]      dep[dep_ptr[f]:dep_ptr[f + 1]] has completed
    op columns   op_id op_job op_kind op_algorithm op_bytes op_ranks op_busbw_factor

Added within schema 1 (absent from older files, then filled with defaults):

    msg_bytes        per flow: message size on its QP (packets never cross a message
                     boundary); 0 = the whole flow is one message
    op_groups        communicators running the op at once (op_bytes, op_ranks are per one)
    op_steps         algorithm steps of the op
    op_channels      channels (parallel rings or trees)
    op_qps           QPs per connection
    op_qp_mode       "split" (each message cut across the QPs) or "round-robin"
    op_chunk_bytes   chunk (message) size a channel posts at once
    op_window        clear-to-send admission: outstanding chunks per channel a
                     receiver grants; 0 = no receiver-driven admission
    op_protocol      NCCL protocol the op runs: "ll", "ll128", "simple" ("" for
                     patterns and traffic matrices; aifabric.traffic.nccl); its flows'
                     bytes are the protocol's wire payload
    op_step_latency_ns  from the arrival of a step's input to the release of the step
    op_base_latency_ns  before the op's first step
    op_predicted_ns  NCCL's cost-model time of the op (0 where there is none)
    op_rate_factor   each QP's rate cap over its NIC's line rate (the protocol's bandwidth
                     beyond its wire format, NCCL's model; 1: none)
    op_ready_ns      the compute the op waits for, from its job's start (its flows' start_ns
                     include it; aifabric.traffic.training); 0: none
    op_compute_ns    its job's compute-only iteration time, the lower bound of the job's
                     iteration time; 0: the job models no compute
    op_buffer_bytes  each connection's buffer (data bytes): a stream's sender holds back
                     what would put more than this in its receiver's buffer before the
                     receiver has passed it on; 0 = unbounded
    group            per flow: the stream it is a QP of, -1 for a flow that is a whole
                     transfer; a stream's flows are consecutive rows, QP 0 first
    group_steps      per stream: its steps (equal shares of group_bytes, within a byte)
    group_bytes      per stream: the bytes of all its QPs
    group_offset     per stream: step k is released once every input stream has
    group_in_ptr     delivered step k - offset (CSR over group_in)
    group_in
    group_loop       per stream: steps per loop (0: none); a loop's first step waits for
                     no input (a ring rank sends its own chunk)

Streams are how collectives run (`aifabric.traffic.collectives`): a flow of a stream
sends a step once it is released; a flow that is a transfer starts once the flows it
waits for have delivered their data (those of its own op) or completed (earlier ops).

`src` and `dst` are NIC node ids of the fabric the table was made for;
`bytes` counts RoCE payload (it may be 0: a step with nothing to send, when
an op is smaller than its ranks; such a flow completes as soon as it may
start); `sport` is the RoCEv2 UDP source port derived from the QPNs.
`op_busbw_factor` follows nccl-tests: busbw = algbw x factor, the factor of
the op's kind in `aifabric.traffic.collectives.KINDS` (1 for traffic patterns).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from aifabric.fabric.errors import AifabricError

SCHEMA = "aifabric.flows/1"

FLOW_COLUMNS = {
    "flow_id": np.int64,
    "job": np.int32,
    "op": np.int32,
    "step": np.int32,
    "channel": np.int32,
    "src": np.int32,
    "dst": np.int32,
    "bytes": np.int64,
    "sqpn": np.int32,
    "dqpn": np.int32,
    "sport": np.int32,
    "priority": np.int8,
    "start_ns": np.int64,
}
OP_COLUMNS = {
    "op_id": np.int32,
    "op_job": np.int32,
    "op_kind": np.str_,
    "op_algorithm": np.str_,
    "op_bytes": np.int64,
    "op_ranks": np.int32,
    "op_busbw_factor": np.float64,
}
# Added later within schema 1: default when absent (see the module docstring).
EXTRA_FLOW_COLUMNS = {"msg_bytes": np.int64, "group": np.int64}
EXTRA_OP_COLUMNS = {
    "op_groups": np.int32,
    "op_steps": np.int32,
    "op_channels": np.int32,
    "op_qps": np.int32,
    "op_qp_mode": np.str_,
    "op_chunk_bytes": np.int64,
    "op_window": np.int32,
    "op_protocol": np.str_,
    "op_step_latency_ns": np.int64,
    "op_base_latency_ns": np.int64,
    "op_predicted_ns": np.int64,
    "op_rate_factor": np.float64,
    "op_ready_ns": np.int64,
    "op_compute_ns": np.int64,
    "op_buffer_bytes": np.int64,
}
GROUP_COLUMNS = {
    "group_steps": np.int32,
    "group_bytes": np.int64,
    "group_offset": np.int8,
    "group_loop": np.int32,
    "group_in_ptr": np.int64,
    "group_in": np.int64,
}
_EXTRA_DEFAULTS = {
    "op_groups": 1,
    "op_channels": 1,
    "op_qps": 1,
    "op_qp_mode": "split",
    "op_protocol": "",
    "op_rate_factor": 1.0,
}
_FLOW_DEFAULTS = {"group": -1}


@dataclass(frozen=True, eq=False)
class FlowTable:
    flow_id: np.ndarray
    job: np.ndarray
    op: np.ndarray
    step: np.ndarray
    channel: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    bytes: np.ndarray
    sqpn: np.ndarray
    dqpn: np.ndarray
    sport: np.ndarray
    priority: np.ndarray
    start_ns: np.ndarray
    dep_ptr: np.ndarray
    dep: np.ndarray
    op_id: np.ndarray
    op_job: np.ndarray
    op_kind: np.ndarray
    op_algorithm: np.ndarray
    op_bytes: np.ndarray
    op_ranks: np.ndarray
    op_busbw_factor: np.ndarray
    msg_bytes: np.ndarray | None = None
    op_groups: np.ndarray | None = None
    op_steps: np.ndarray | None = None
    op_channels: np.ndarray | None = None
    op_qps: np.ndarray | None = None
    op_qp_mode: np.ndarray | None = None
    op_chunk_bytes: np.ndarray | None = None
    op_window: np.ndarray | None = None
    op_protocol: np.ndarray | None = None
    op_step_latency_ns: np.ndarray | None = None
    op_base_latency_ns: np.ndarray | None = None
    op_predicted_ns: np.ndarray | None = None
    op_rate_factor: np.ndarray | None = None
    op_ready_ns: np.ndarray | None = None
    op_compute_ns: np.ndarray | None = None
    op_buffer_bytes: np.ndarray | None = None
    group: np.ndarray | None = None
    group_steps: np.ndarray | None = None
    group_bytes: np.ndarray | None = None
    group_offset: np.ndarray | None = None
    group_loop: np.ndarray | None = None
    group_in_ptr: np.ndarray | None = None
    group_in: np.ndarray | None = None

    def __post_init__(self):
        n = len(self.flow_id)
        m = len(self.op_id)
        for name, dtype in EXTRA_FLOW_COLUMNS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(n, _FLOW_DEFAULTS.get(name, 0), dtype))
        for name, dtype in GROUP_COLUMNS.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros(int(name == "group_in_ptr"), dtype))
        for name, dtype in EXTRA_OP_COLUMNS.items():
            if getattr(self, name) is None:
                value = _EXTRA_DEFAULTS.get(name, 0)
                object.__setattr__(self, name, np.full(m, value, dtype=dtype))
        for name in (*FLOW_COLUMNS, *EXTRA_FLOW_COLUMNS):
            if len(getattr(self, name)) != n:
                raise ValueError(f"flow column {name} has {len(getattr(self, name))} rows, not {n}")
        if len(self.dep_ptr) != n + 1 or (n and self.dep_ptr[-1] != len(self.dep)):
            raise ValueError("dep_ptr does not match the flows and dep")
        for name in (*OP_COLUMNS, *EXTRA_OP_COLUMNS):
            if len(getattr(self, name)) != m:
                raise ValueError(f"op column {name} has the wrong length")
        ng = len(self.group_steps)
        for name in ("group_bytes", "group_offset", "group_loop"):
            if len(getattr(self, name)) != ng:
                raise ValueError(f"stream column {name} has the wrong length")
        if len(self.group_in_ptr) != ng + 1 or self.group_in_ptr[-1] != len(self.group_in):
            raise ValueError("group_in_ptr does not match the streams and group_in")

    @property
    def n_groups(self) -> int:
        return len(self.group_steps)

    def __len__(self) -> int:
        return len(self.flow_id)

    def op_column(self, name: str, default) -> np.ndarray:
        """The op table's column `name` per flow, by the flow's op (`default` for a flow whose
        op is not in the op table, as in hand-built tables)."""
        col = getattr(self, name)
        if len(self.op_id) == 0:
            return np.full(len(self), default, dtype=col.dtype)
        order = np.argsort(self.op_id)
        row = order[np.clip(np.searchsorted(self.op_id, self.op, sorter=order), 0, len(order) - 1)]
        return np.where(self.op_id[row] == self.op, col[row], default)

    def deps_of(self, f: int) -> np.ndarray:
        return self.dep[self.dep_ptr[f] : self.dep_ptr[f + 1]]

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def save(self, path: str | Path) -> None:
        """Write the table as one .npz (atomically: a temporary file renamed into place)."""
        from aifabric.fabric.files import replace_atomic

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh:
                np.savez(fh, schema=np.array(SCHEMA), **self.arrays())

        replace_atomic(path, write)

    @classmethod
    def load(cls, path: str | Path) -> FlowTable:
        try:
            with np.load(path, allow_pickle=False) as z:
                schema = str(z["schema"]) if "schema" in z else None
                if schema != SCHEMA:
                    raise AifabricError(f"{path} is not an aifabric flow table ({SCHEMA})")
                return cls(**{f.name: z[f.name] for f in fields(cls) if f.name in z})
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise AifabricError(f"{path} cannot be read as a flow table: {e}") from None

    @classmethod
    def build(
        cls,
        flows: dict[str, np.ndarray],
        deps: list | tuple[np.ndarray, np.ndarray],
        ops: dict[str, list],
        groups: dict[str, np.ndarray] | None = None,
    ) -> FlowTable:
        """Assemble from columns (missing ones default to 0), dependencies and ops.

        `deps` is either one list of prerequisite flow ids per flow, or a
        ready CSR pair `(dep_ptr, dep)` (the fast path for large tables).
        """
        n = len(flows["src"])
        cols = {}
        for name, dtype in {**FLOW_COLUMNS, **EXTRA_FLOW_COLUMNS}.items():
            if name == "flow_id":
                cols[name] = np.arange(n, dtype=dtype)
            elif name in flows:
                cols[name] = np.asarray(flows[name], dtype=dtype)
            else:
                cols[name] = np.zeros(n, dtype=dtype)
        op_cols = {
            name: np.asarray(ops.get(name, []), dtype=dtype) for name, dtype in OP_COLUMNS.items()
        }
        op_cols.update(
            {
                name: np.asarray(ops[name], dtype=dtype)
                for name, dtype in EXTRA_OP_COLUMNS.items()
                if name in ops
            }
        )
        if "group" in flows:
            cols["group"] = np.asarray(flows["group"], dtype=np.int64)
        else:
            cols["group"] = np.full(n, -1, dtype=np.int64)
        for name, dtype in GROUP_COLUMNS.items():
            if groups and name in groups:
                op_cols[name] = np.asarray(groups[name], dtype=dtype)
        if isinstance(deps, tuple):
            dep_ptr, dep = (np.asarray(x, dtype=np.int64) for x in deps)
        else:
            if len(deps) != n:
                raise ValueError("one dependency list per flow")
            counts = np.fromiter((len(d) for d in deps), dtype=np.int64, count=n)
            dep_ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(counts, out=dep_ptr[1:])
            total = int(dep_ptr[-1])
            dep = np.fromiter((x for d in deps for x in d), dtype=np.int64, count=total)
        return cls(**cols, dep_ptr=dep_ptr, dep=dep, **op_cols)
