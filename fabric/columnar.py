"""The run directory's Parquet files: flows, per-port series and collectives as tables that
DuckDB, pandas and Arrow read, and the same arrays read back from them.

The tables hold what the `.npz` arrays hold, column for column, plus readable names beside
ids where the run has them (its topology and its jobs' names), so that a query needs no
lookup: `src_name` beside `src`, `port_name` beside `port`, `job_name` beside `job`. Names
are dictionary-encoded (one copy of each string per column chunk). Where an array says "never"
with -1 (a flow that did not start or finish, an op that did not end) the table has a
null, and a rate of an op without a time (0 in collectives.npz) is a null too, so that SQL
aggregates skip them; `*_arrays` turns them back.

Per-port series are in long form: one row per port and sample, ports one after another
(each port's samples in time order), so `GROUP BY port_name` and a filter on a port read
contiguous rows (and a port's slowly changing counters compress together: 5.6 times
smaller than time-major on fat-tree-k16); a row group holds whole ports, about ROW_GROUP
rows. The file's key-value metadata (`aifabric`, JSON) records the interval, the emulation
scale, the recorded ports and the arrays' dtypes, so that the arrays come back whole, even
for a run without samples.

Files are zstd-compressed at pyarrow's default level: the smallest of its codecs on these
tables, within 15% of the fastest's write time (benchmarks/parquet-2026-12-01.md). pyarrow
is imported here only, when a run writes or reads a table, and arrays are built from numpy
buffers, since `pyarrow.array` would import pandas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from aifabric.fabric.errors import AifabricError
from aifabric.fabric.files import replace_atomic
from aifabric.fabric.model import ROLES
from aifabric.fabric.portseries import ENTRY_KEYS, wide

COMPRESSION = "zstd"
ROW_GROUP = 1 << 19  # rows of ports.parquet per row group
META_KEY = b"aifabric"
NEVER = ("start_ns", "end_ns")  # -1 in the arrays, null in the tables
NO_RATE = ("algbw_bps", "busbw_bps")  # 0 in collectives.npz where an op has no time


class Names:
    """What a run knows to name its ids: its nodes and ports (from its fabric), its jobs."""

    def __init__(self, fabric=None, jobs: list[str] | None = None):
        self.fabric = fabric
        self.jobs = list(jobs or [])


def _arrow(pa, values, mask=None):
    """A pyarrow array over a numpy array's memory, null where `mask`. (`pa.array` would
    import pandas to ask whether the array is a Series: half a second of every run.)"""
    values = np.ascontiguousarray(values)
    validity, nulls = None, 0
    if mask is not None and mask.any():
        validity, nulls = pa.py_buffer(np.packbits(~mask, bitorder="little")), int(mask.sum())
    if values.dtype.kind in "US":
        return _strings(pa, values.tolist(), validity, nulls)
    if values.dtype == np.bool_:
        kind, data = pa.bool_(), np.packbits(values, bitorder="little")
    else:
        kind, data = pa.from_numpy_dtype(values.dtype), values
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(data)], nulls)


def _strings(pa, texts: list[str], validity=None, nulls: int = 0):
    encoded = [t.encode() for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers, nulls)


def _table(pa, fields: dict[str, Any], meta: dict):
    table = pa.Table.from_arrays(list(fields.values()), names=list(fields))
    return table.replace_schema_metadata({META_KEY: json.dumps(meta)})


def _names(pa, dictionary: list[str], ids) -> Any:
    """A dictionary column: `dictionary[ids]`, null where an id has no name."""
    ids = np.asarray(ids, dtype=np.int64)
    bad = (ids < 0) | (ids >= len(dictionary))
    indices = _arrow(pa, np.where(bad, 0, ids).astype(np.int32), bad)
    return pa.DictionaryArray.from_arrays(indices, _strings(pa, list(dictionary)))


def _column(pa, name: str, values) -> Any:
    values = np.asarray(values)
    if name in NEVER:
        return _arrow(pa, values, values < 0)
    return _arrow(pa, values)


def flows_table(cols: dict[str, Any], names: Names):
    """flows.parquet: one row per flow, every per-flow array, `path_link` as each flow's
    list of links, `fct_ns` (end - start of a finished flow) and the names."""
    import pyarrow as pa

    ptr = np.asarray(cols["path_ptr"], dtype=np.int64)
    n = len(ptr) - 1
    fields: dict[str, Any] = {}
    for name, values in cols.items():
        if name in ("path_ptr", "path_link"):
            continue
        values = np.asarray(values)
        if values.ndim != 1 or len(values) != n:
            raise ValueError(f"flow records' {name} is not one value per flow")
        fields[name] = _column(pa, name, values)
        if name == "job" and names.jobs:
            fields["job_name"] = _names(pa, names.jobs, values)
        if name in ("src", "dst") and names.fabric is not None:
            fields[f"{name}_name"] = _names(pa, list(names.fabric.node_name), values)
        if name == "end_ns":
            start = np.asarray(cols["start_ns"])
            done = (values >= 0) & (start >= 0)
            fields["fct_ns"] = _arrow(pa, np.where(done, values - start, 0), ~done)
    links = np.asarray(cols["path_link"])
    lists = pa.ListArray if ptr[-1] < 2**31 else pa.LargeListArray
    offsets = ptr.astype(np.int32 if lists is pa.ListArray else np.int64)
    fields["path_link"] = lists.from_arrays(_arrow(pa, offsets), _arrow(pa, links))
    meta = _dtypes(cols)
    return _table(pa, fields, {"dtypes": meta})


def ports_tables(interval_ns: int, t_ns, port, scale: float, series: dict[str, Any], names: Names):
    """ports.parquet, one table (a row group) per block of about ROW_GROUP rows: one row per
    entry of the series (a recorded port in a sample where it carried something, see
    aifabric.fabric.portseries; `series` holds sample_index, port_index and each series'
    values), each port's rows together in time order: t_ns, port, its names, the sample's
    interval and every series. The metadata holds what rebuilds the entries: the ports
    recorded and the number of samples."""
    import pyarrow as pa

    t_ns, port = np.asarray(t_ns), np.asarray(port)
    s = np.asarray(series["sample_index"], dtype=np.int64)
    j = np.asarray(series["port_index"], dtype=np.int64)
    values = {k: np.asarray(v) for k, v in series.items() if k not in ENTRY_KEYS}  # any int type
    for name, v in values.items():
        if v.shape != s.shape:
            raise ValueError(f"port series {name} is not one value per entry")
    meta = {
        "interval_ns": int(interval_ns),
        "scale": float(scale),
        "port": port.tolist(),
        "t_ns": t_ns.tolist(),
        "entries": True,
        "dtypes": {
            "t_ns": t_ns.dtype.str,
            "port": port.dtype.str,
            **{k: wide(v[:0]).dtype.str for k, v in values.items()},
        },
    }
    order = np.lexsort((s, j))  # by port, then time
    f = names.fabric
    for e0 in range(0, max(len(order), 1), ROW_GROUP):
        rows = order[e0 : e0 + ROW_GROUP]
        mine = port[j[rows]]
        fields: dict[str, Any] = {"t_ns": _arrow(pa, t_ns[s[rows]])}
        fields["port"] = _arrow(pa, mine)
        if f is not None:
            node, peer = f.port_node[mine], f.port_peer[mine]
            fields["port_name"] = _per_port(pa, f.port_names, mine, 1)
            fields["node_name"] = _per_port(pa, f.node_name, node, 1)
            fields["peer_name"] = _per_port(pa, f.node_name, peer, 1)
            fields["node_role"] = _per_port(pa, ROLES, f.node_role[node], 1)
            fields["peer_role"] = _per_port(pa, ROLES, f.node_role[peer], 1)
        fields["interval_ns"] = _arrow(pa, np.full(len(rows), int(interval_ns), dtype=np.int64))
        for name, v in values.items():  # int64 columns, whatever the entries' types
            fields[name] = _arrow(pa, wide(v[rows]))
        yield _table(pa, fields, meta)


def _per_port(pa, names, ids, samples: int):
    """A dictionary column of `names[ids[k]]`, each repeated for the port's `samples` rows;
    the dictionary holds only the names used."""
    ids = np.asarray(ids)
    # np.unique(ids, return_inverse=True), without its sort (the ids index `names`)
    present = np.zeros(len(names), dtype=bool)
    present[ids] = True
    used = np.flatnonzero(present)
    index = (np.cumsum(present) - 1)[ids]
    indices = _arrow(pa, np.repeat(index.astype(np.int32), samples))
    return pa.DictionaryArray.from_arrays(indices, _strings(pa, [names[int(i)] for i in used]))


def collectives_table(cols: dict[str, Any], names: Names):
    """collectives.parquet: one row per collective op, every array, `job_name`."""
    import pyarrow as pa

    fields: dict[str, Any] = {}
    for name, values in cols.items():
        values = np.asarray(values)
        if name in NO_RATE:
            fields[name] = _arrow(pa, values, values == 0)
        else:
            fields[name] = _column(pa, name, values)
        if name == "job" and names.jobs:
            fields["job_name"] = _names(pa, names.jobs, values)
    meta = {"dtypes": _dtypes(cols)}
    return _table(pa, fields, meta)


def _dtypes(cols: dict[str, Any]) -> dict[str, str]:
    return {k: np.asarray(v).dtype.str for k, v in cols.items()}


def write_parquet(path: Path, tables) -> None:
    """A table, or tables of one schema (each a row group), as Parquet at `path`,
    atomically (`replace_atomic`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(tmp: str) -> None:
        if isinstance(tables, pa.Table):
            pq.write_table(tables, tmp, compression=COMPRESSION)
            return
        writer = None
        try:
            for table in tables:
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema, compression=COMPRESSION)
                writer.write_table(table, row_group_size=table.num_rows or None)
        finally:
            if writer is not None:
                writer.close()

    replace_atomic(path, write)


def read_parquet(path: Path, columns: list[str] | None = None):
    """The table in `path`; a file that is not whole Parquet is one sentence."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path, columns=columns)
    except (OSError, ValueError, pa.ArrowException) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
        raise AifabricError(f"{path} cannot be read as Parquet ({why})") from None


def _meta(table, path: Path) -> dict:
    try:
        return json.loads((table.schema.metadata or {})[META_KEY])
    except (KeyError, ValueError):
        raise AifabricError(
            f"{path} was not written by aifabric (no {META_KEY.decode()} metadata)"
        ) from None


def _array(table, name: str, dtype: str) -> np.ndarray:
    col = table.column(name)
    if name in NEVER:
        col = col.fill_null(-1)
    elif name in NO_RATE:
        col = col.fill_null(0.0)
    values = col.to_numpy(zero_copy_only=False)
    if np.dtype(dtype).kind in "US":
        return np.array(values.tolist(), dtype=dtype)
    return values.astype(dtype, copy=False)


def flows_arrays(table, path: Path) -> dict[str, np.ndarray]:
    """flows.npz's arrays from flows.parquet's table."""
    dtypes = _meta(table, path)["dtypes"]
    out = {k: _array(table, k, d) for k, d in dtypes.items() if k not in ("path_ptr", "path_link")}
    paths = table.column("path_link").combine_chunks()
    out["path_ptr"] = paths.offsets.to_numpy().astype(dtypes["path_ptr"])
    values = paths.values.to_numpy(zero_copy_only=False)
    out["path_link"] = values.astype(dtypes["path_link"], copy=False)
    return out


def ports_arrays(table, path: Path) -> dict[str, Any]:
    """ports.npz's arrays from ports.parquet's table: its entries (sample_index ...) for a
    table written with them, else the dense [samples, ports] series of its long form."""
    meta = _meta(table, path)
    port = np.asarray(meta["port"], dtype=meta["dtypes"]["port"])
    out: dict[str, Any] = {
        "interval_ns": np.asarray(meta["interval_ns"], dtype=np.int64),
        "scale": np.asarray(meta["scale"], dtype=np.float64),
        "port": port,
    }
    series = [k for k in meta["dtypes"] if k not in ("t_ns", "port")]
    t = _array(table, "t_ns", meta["dtypes"]["t_ns"])
    if meta.get("entries"):
        t_ns = np.asarray(meta["t_ns"], dtype=meta["dtypes"]["t_ns"])
        out["t_ns"] = t_ns
        rows = _array(table, "port", meta["dtypes"]["port"])
        sample, where = _positions(t_ns, t), _positions(port, rows)
        order = np.lexsort((where, sample))  # back to (sample, port) order
        out["sample_index"], out["port_index"] = sample[order], where[order]
        for name in series:
            out[name] = _array(table, name, meta["dtypes"][name])[order]
        return out
    rows = table.num_rows
    samples = rows // len(port) if len(port) else 0
    out["t_ns"] = t[:samples].copy()
    for name in series:
        values = _array(table, name, meta["dtypes"][name])
        out[name] = np.ascontiguousarray(values.reshape(len(port), samples).T)
    return out


def _positions(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Where each of `values` is in `keys` (unique), -1 where it is not there."""
    order = np.argsort(keys, kind="stable")
    at = np.searchsorted(keys[order], values)
    at = np.minimum(at, max(len(keys) - 1, 0))
    if not len(keys):
        return np.full(len(values), -1, dtype=np.int64)
    found = keys[order][at] == values
    return np.where(found, order[at], -1).astype(np.int64)


def collectives_arrays(table, path: Path) -> dict[str, np.ndarray]:
    """collectives.npz's arrays from collectives.parquet's table."""
    return {k: _array(table, k, d) for k, d in _meta(table, path)["dtypes"].items()}
