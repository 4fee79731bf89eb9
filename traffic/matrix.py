"""Traffic matrices from files: flow tables, CSV, and htsim connection matrices.

Three formats, chosen by the file's suffix:

- `.npz`: a flow table (`aifabric.traffic.flows`, schema aifabric.flows/1), as `traffic
  export` writes it; used as it is (its NIC ids must be NICs of the fabric).
- `.csv`: one flow per row, `src,dst,bytes[,start]`. A first row naming the
  columns (src, dst, bytes, start; in any order) is optional. src and dst are
  NIC names (`z0-r0-h0-nic1`) or indices (0 = the fabric's first NIC, in
  topology order); bytes a size (`4096`, `4MiB`); start a time (`10us`; a plain
  number is ns), 0 when absent. Lines starting with `#` are comments.
- anything else (htsim's `.cm`): htsim's connection matrix. A header (`Nodes N`,
  `Connections C`, optionally `Triggers T`) and one line per connection,
  `src->dst id N start T size S` with hosts as indices (as above), T in
  microseconds and S in bytes. A connection may instead wait for a trigger
  (`trigger K`), fired when the connections that name it finish
  (`send_done_trigger K` or `recv_done_trigger K`; both mean "finished" here):
  `trigger id K oneshot` (one connection fires it) or `barrier count C` (C
  connections, all of them). The connection then waits for those flows, as a
  flow table's dependencies say.

`import_flows(path, fabric)` turns any of them into a flow table; a workload's
job `matrix = "file"` (or a scenario's `workload = "file.csv"`) runs one beside
other jobs, with the job keys priority, start, qps, qp_mode, chunk and window.
Flows are kept in file order unless a dependency points to a later row; then
they are ordered so every flow comes after those it waits for.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np

from aifabric.fabric.errors import SpecError, UnitError
from aifabric.fabric.model import Fabric, Role
from aifabric.fabric.units import LIMIT, parse_size, parse_time
from aifabric.traffic import collectives as coll

FORMATS = ("npz", "csv", "htsim")
CSV_COLUMNS = ("src", "dst", "bytes", "start")


@dataclass(frozen=True)
class Matrix:
    """Flows as a file names them: endpoints not yet resolved on a fabric."""

    source: str
    src: list[str]  # NIC name or index, as written
    dst: list[str]
    bytes: np.ndarray  # int64
    start_ns: np.ndarray  # int64
    line: list[int]  # the file's line of each flow (for messages)
    waits_t: np.ndarray  # flow waits_t[i] waits for flow waits_d[i]
    waits_d: np.ndarray

    def __len__(self) -> int:
        return len(self.src)


def file_format(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    return {".npz": "npz", ".csv": "csv"}.get(suffix, "htsim")


def is_matrix_file(source: str | Path) -> bool:
    """Whether `source` names a traffic-matrix file rather than a workload (TOML or preset)."""
    path = Path(str(source))
    return path.suffix.lower() != ".toml" and path.is_file()


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"traffic matrix {path} cannot be read as text: {e}") from None


def read_matrix(path: str | Path) -> Matrix:
    """A CSV or htsim file as a `Matrix` (a flow table `.npz` is read by `import_flows`)."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"traffic matrix {path} does not exist")
    fmt = file_format(path)
    if fmt == "npz":
        raise SpecError(f"{path} is a flow table, not a matrix: load it with import_flows")
    return read_csv(path) if fmt == "csv" else read_htsim(path)


def _quantity(parse, text: str, where: str, what: str) -> int:
    try:
        return parse(text.strip())
    except UnitError as e:
        raise SpecError(f"{where}: {what} {e}") from None


ROW_BYTES = 600  # what one parsed row costs before it is a flow (its strings, lists, ints)


def _check_rows(path: Path) -> None:
    """One sentence, before the file is parsed, for more rows than a flow table holds."""
    from aifabric.traffic.generate import MAX_FLOWS

    rows = 0
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 24):
                rows += chunk.count(b"\n")
    except OSError as e:
        raise SpecError(f"traffic matrix {path} cannot be read: {e.strerror}") from None
    if rows > MAX_FLOWS:
        raise SpecError(
            f"traffic matrix {path} has {rows:,} lines, more than the {MAX_FLOWS:,} flows a "
            f"flow table holds (reading it would take about {rows * ROW_BYTES / 1e9:,.0f} GB)"
        )


def _no_flows(path: Path) -> SpecError:
    return SpecError(f"traffic matrix {path} holds no flows (a run of it would send nothing)")


def read_csv(path: str | Path) -> Matrix:
    path = Path(path)
    _check_rows(path)
    reader = csv.reader(_read_text(path).splitlines())
    try:
        rows = [
            (n, [field.strip() for field in row])
            for n, row in enumerate(reader, start=1)
            if row and any(row) and not row[0].lstrip().startswith("#")
        ]
    except csv.Error as e:
        raise SpecError(f"{path}:{reader.line_num}: {e}") from None
    columns = list(CSV_COLUMNS)
    if rows and {"src", "dst"} <= {f.lower() for f in rows[0][1]}:
        n, head = rows.pop(0)
        columns = [f.lower() for f in head]
        unknown = [c for c in columns if c not in CSV_COLUMNS] + [
            c for c in ("src", "dst", "bytes") if c not in columns
        ]
        if unknown or len(set(columns)) != len(columns):
            raise SpecError(
                f"{path}:{n}: the columns are {', '.join(head)}; a traffic matrix CSV takes "
                f"{', '.join(CSV_COLUMNS)} (start optional), each once"
            )
    src, dst, nbytes, start, lines = [], [], [], [], []
    for n, row in rows:
        where = f"{path}:{n}"
        if len(row) not in (len(columns), len(columns) - ("start" in columns)) or len(row) < 3:
            raise SpecError(
                f"{where}: {len(row)} fields; a row holds {', '.join(columns)}"
                + (" (start optional)" if "start" in columns else "")
            )
        value = dict(zip(columns, row, strict=False))
        src.append(value["src"])
        dst.append(value["dst"])
        nbytes.append(_quantity(parse_size, value["bytes"], where, "bytes"))
        start.append(_quantity(parse_time, value.get("start") or "0", where, "start"))
        lines.append(n)
    if not src:
        raise _no_flows(path)
    z = np.zeros(0, dtype=np.int64)
    return Matrix(str(path), src, dst, np.array(nbytes, np.int64), np.array(start, np.int64),
                  lines, z, z)  # fmt: skip


def _htsim_number(token: str, where: str, what: str) -> Decimal:
    try:
        value = Decimal(token)
    except InvalidOperation:
        raise SpecError(f"{where}: {what} {token!r} is not a number") from None
    if not value.is_finite() or value < 0:
        raise SpecError(f"{where}: {what} {token!r} must be a number of at least 0")
    return value


def _whole(token: str, where: str, what: str) -> int:
    value = _htsim_number(token, where, what)
    if value != value.to_integral_value():
        raise SpecError(f"{where}: {what} {token!r} must be a whole number")
    return int(value)


def read_htsim(path: str | Path) -> Matrix:
    """htsim's connection matrix (see the module docstring for what is read)."""
    path = Path(path)
    _check_rows(path)
    header: dict[str, int] = {}
    src, dst, nbytes, start, lines, trigger_of = [], [], [], [], [], []
    fired_by: dict[int, list[int]] = {}
    triggers: dict[int, tuple[str, int]] = {}
    for n, text in enumerate(_read_text(path).splitlines(), start=1):
        tokens = text.split()
        where = f"{path}:{n}"
        if not tokens or tokens[0].startswith("#"):
            continue
        head = tokens[0]
        if head in ("Nodes", "Connections", "Triggers", "Failures") and len(tokens) == 2:
            header[head] = _whole(tokens[1], where, head)
            if head == "Failures" and header[head]:
                raise SpecError(f"{where}: failures are not read; give faults in the scenario")
            continue
        if head == "trigger":
            triggers.update([_htsim_trigger(tokens, where)])
            continue
        if "->" not in head:
            raise SpecError(
                f"{where}: {text.strip()!r} is not an htsim connection (src->dst id N start T "
                "size S); traffic matrices are .npz flow tables, .csv or htsim text"
            )
        a, _, b = head.partition("->")
        flow = len(src)
        src.append(a)
        dst.append(b)
        lines.append(n)
        fields = _htsim_fields(tokens[1:], where)
        if "size" not in fields or fields["size"] == "0":
            raise SpecError(f"{where}: give each connection a size in bytes (htsim's 0 is endless)")
        nbytes.append(_whole(fields["size"], where, "size"))
        if ("start" in fields) == ("trigger" in fields):
            raise SpecError(f"{where}: a connection takes either start T (us) or trigger K")
        us = _htsim_number(fields.get("start", "0"), where, "start")
        if us * 1000 > LIMIT or nbytes[-1] > LIMIT:
            raise SpecError(f"{where}: start or size beyond what a flow table holds ({LIMIT:,})")
        start.append(int((us * 1000).to_integral_value()))
        trigger_of.append(_whole(fields["trigger"], where, "trigger") if "trigger" in fields else 0)
        for key in ("send_done_trigger", "recv_done_trigger"):
            if key in fields:
                fired_by.setdefault(_whole(fields[key], where, key), []).append(flow)
    _check_counts(path, header, len(src), len(triggers))
    if not src:
        raise _no_flows(path)
    waits_t, waits_d = [], []
    for flow, k in enumerate(trigger_of):
        if not k:
            continue
        where = f"{path}:{lines[flow]}"
        if k not in triggers:
            raise SpecError(f"{where}: trigger {k} is never declared (trigger id {k} oneshot)")
        kind, count = triggers[k]
        firing = fired_by.get(k, [])
        if (
            not firing
            or (kind == "oneshot" and len(firing) != 1)
            or (kind == "barrier" and len(firing) != count)
        ):
            raise SpecError(
                f"{where}: trigger {k} ({kind}) is fired by {len(firing)} connections; a "
                "oneshot trigger needs exactly one, a barrier its count, to be a dependency"
            )
        waits_t += [flow] * len(firing)
        waits_d += firing
    return Matrix(
        str(path), src, dst, np.array(nbytes, np.int64), np.array(start, np.int64), lines,
        np.array(waits_t, np.int64), np.array(waits_d, np.int64),
    )  # fmt: skip


_HTSIM_KEYS = ("id", "start", "size", "trigger", "send_done_trigger", "recv_done_trigger")


def _htsim_fields(tokens: list[str], where: str) -> dict[str, str]:
    if len(tokens) % 2:
        raise SpecError(f"{where}: expected key value pairs after src->dst")
    fields = dict(zip(tokens[0::2], tokens[1::2], strict=True))
    unknown = [k for k in fields if k not in _HTSIM_KEYS]
    if unknown:
        raise SpecError(
            f"{where}: {unknown[0]!r} is not read here; a connection takes {', '.join(_HTSIM_KEYS)}"
        )
    return fields


def _htsim_trigger(tokens: list[str], where: str) -> tuple[int, tuple[str, int]]:
    rest = tokens[1:]
    if len(rest) < 3 or rest[0] != "id":
        raise SpecError(f"{where}: a trigger is `trigger id K oneshot` or `... barrier count C`")
    k = _whole(rest[1], where, "trigger id")
    if rest[2:] == ["oneshot"]:
        return k, ("oneshot", 1)
    if rest[2] == "barrier" and len(rest) == 5 and rest[3] == "count":
        return k, ("barrier", _whole(rest[4], where, "count"))
    raise SpecError(f"{where}: trigger {k}: only oneshot and barrier count C triggers are read")


def _check_counts(path: Path, header: dict, conns: int, triggers: int) -> None:
    for key, found in (("Connections", conns), ("Triggers", triggers)):
        if key in header and header[key] != found:
            raise SpecError(f"{path}: the header says {key} {header[key]}, the file has {found}")


def resolve(fabric: Fabric, matrix: Matrix) -> tuple[np.ndarray, np.ndarray]:
    """NIC node ids of every flow's ends (names or indices into the fabric's NICs)."""
    nics = fabric.nic_ids
    ids = {}

    def nic(text: str, line: int) -> int:
        if text in ids:
            return ids[text]
        where = f"{matrix.source}:{line}"
        if text.isdigit():
            if int(text) >= len(nics):
                raise SpecError(
                    f"{where}: NIC index {text} is not one of the {len(nics)} NICs of "
                    f"fabric {fabric.name} (0..{len(nics) - 1})"
                )
            ids[text] = int(nics[int(text)])
        else:
            try:
                node = fabric.node_id(text)
            except SpecError:
                node = -1
            if node < 0 or fabric.node_role[node] != Role.NIC:
                raise SpecError(f"{where}: {text!r} is not a NIC of fabric {fabric.name}")
            ids[text] = node
        return ids[text]

    src = np.array([nic(s, n) for s, n in zip(matrix.src, matrix.line, strict=True)], np.int64)
    dst = np.array([nic(d, n) for d, n in zip(matrix.dst, matrix.line, strict=True)], np.int64)
    same = np.flatnonzero(src == dst)
    if len(same):
        i = int(same[0])
        raise SpecError(
            f"{matrix.source}:{matrix.line[i]}: the flow sends from "
            f"{fabric.node_name[src[i]]} to itself"
        )
    return src, dst


def _dependency_order(matrix: Matrix) -> np.ndarray:
    """Flows in file order, unless one waits for a later one: then an order in which
    every flow follows those it waits for (Kahn's algorithm, lowest row first)."""
    n = len(matrix)
    t, d = matrix.waits_t, matrix.waits_d
    if not len(t) or (d < t).all():
        return np.arange(n)
    import heapq

    waiting = np.bincount(t, minlength=n)
    after: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(t.tolist(), d.tolist(), strict=True):
        after[b].append(a)
    ready = [f for f in range(n) if waiting[f] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        f = heapq.heappop(ready)
        order.append(f)
        for g in after[f]:
            waiting[g] -= 1
            if waiting[g] == 0:
                heapq.heappush(ready, g)
    if len(order) < n:
        stuck = min(set(range(n)) - set(order))
        raise SpecError(
            f"{matrix.source}:{matrix.line[stuck]}: the triggers form a cycle, so this "
            "connection could never start"
        )
    return np.array(order, np.int64)


def transfers(fabric: Fabric, matrix: Matrix) -> tuple[coll.Transfers, np.ndarray]:
    """The matrix as NIC-level transfers (and each one's start time), dependencies kept."""
    src, dst = resolve(fabric, matrix)
    order = _dependency_order(matrix)
    row = np.empty(len(order), np.int64)
    row[order] = np.arange(len(order))
    dep_ptr, dep = coll.csr_from_pairs(len(order), row[matrix.waits_t], row[matrix.waits_d])
    m = len(order)
    tr = coll.Transfers(
        src=src[order].astype(np.int32),
        dst=dst[order].astype(np.int32),
        channel=np.zeros(m, np.int32),
        step=np.zeros(m, np.int32),
        bytes=matrix.bytes[order],
        dep_ptr=dep_ptr,
        dep=dep,
        steps=1,
    )
    return tr, matrix.start_ns[order]


def load_flow_table(path: str | Path, fabric: Fabric):
    """A saved flow table, checked against `fabric`: every src and dst one of its NICs."""
    from aifabric.traffic.flows import FlowTable

    table = FlowTable.load(path)
    ends = np.concatenate([table.src, table.dst]).astype(np.int64)
    bad = ends[(ends < 0) | (ends >= fabric.n_nodes)]
    if not len(bad):
        bad = ends[fabric.node_role[ends] != Role.NIC]
    if len(bad):
        raise SpecError(
            f"flow table {path} was not made for fabric {fabric.name}: node {int(bad[0])} "
            "is not one of its NICs"
        )
    return table


def import_flows(path: str | Path, fabric: Fabric, seed: int = 0, **keys):
    """Any traffic-matrix file (.npz flow table, .csv, htsim) as a flow table on `fabric`.

    `keys` are the job keys a matrix takes (priority, start, qps, qp_mode, chunk,
    window); `seed` draws the QPNs."""
    from aifabric.traffic.generate import generate
    from aifabric.traffic.spec import matrix_workload

    return generate(fabric, matrix_workload(path, keys), seed=seed)
