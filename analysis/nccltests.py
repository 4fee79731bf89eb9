"""nccl-tests' text output, written and read: one row per collective op, as all_reduce_perf
(all_gather_perf, reduce_scatter_perf, alltoall_perf, broadcast_perf, sendrecv_perf)
prints it.

The widths, formats and headers follow nccl-tests' src/util.cu (writeResultHeader,
writeBenchmarkLinePreamble, writeBenchmarkLineBody, writeResultFooter); the size and count
columns its setupArgs and each test's GetCollByteCount: size is the larger of a rank's
send and receive buffers in bytes (for AllGather the gathered buffer, for ReduceScatter
and AllToAll the whole input), count the elements the call is given (float, 4 bytes: a
rank's share for AllGather, ReduceScatter and AllToAll). algbw = size / time in GB/s
(10^9 bytes), busbw = algbw x the op's factor (doc/PERFORMANCE.md).

Writing (`render_blocks`): a simulator measures each op once, so the in-place columns
repeat the out-of-place ones, and #wrong is N/A (no data is checked). Lines nccl-tests
ends with padding are written without it.

Reading (`parse_log`): the out-of-place columns of each data row, the test the log names
(`# Collective test starting: all_reduce_perf`, nccl-tests 2.14 and later) and its ranks
(the `#  Rank  r Group  g Pid ... device ...` lines of its preamble). A row that does
not parse is refused with its line number. `read_logs` gathers the rows of logs of one
test as columns for `aifabric calibrate`, and `fit_text` shows its fit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aifabric.fabric.errors import AifabricError

FLOAT_BYTES = 4  # the rows' type: float
HEADER = ("size", "count", "type", "redop", "root")  # how the header line begins


@dataclass(frozen=True)
class Test:
    """An nccl-tests program: the collective it times, and its redop and root columns."""

    program: str
    kind: str  # the collective, as aifabric.traffic.collectives names it
    redop: str
    root: int  # -1: none; broadcast_perf's default root is 0
    shared: bool  # the count column is a rank's share of size (size / 4 / ranks)


TESTS: dict[str, Test] = {
    t.kind: t
    for t in (
        Test("all_reduce_perf", "allreduce", "sum", -1, False),
        Test("all_gather_perf", "allgather", "none", -1, True),
        Test("reduce_scatter_perf", "reducescatter", "sum", -1, True),
        Test("alltoall_perf", "alltoall", "none", -1, True),
        Test("broadcast_perf", "broadcast", "none", 0, False),
        Test("sendrecv_perf", "sendrecv", "sum", -1, False),
    )
}
BY_PROGRAM = {t.program: t for t in TESTS.values()}


@dataclass(frozen=True)
class Row:
    """One op as a row: size in bytes, time in microseconds, bandwidths in GB/s."""

    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw_gbs: float
    busbw_gbs: float
    wrong: int | None = None  # None: N/A (not checked)
    line: int = 0  # where it was read (0: not read)


def row(test: Test, size: int, ranks: int, time_ns: float, busbw_factor: float, root=None) -> Row:
    """The row of one op of `size` bytes over `ranks` that took `time_ns` (> 0)."""
    count = size // FLOAT_BYTES // (ranks if test.shared else 1)
    algbw = size / time_ns  # bytes per ns = GB/s
    return Row(
        size=size, count=count, type="float", redop=test.redop,
        root=test.root if root is None or test.root < 0 else root,
        time_us=time_ns / 1e3, algbw_gbs=algbw, busbw_gbs=algbw * busbw_factor,
    )  # fmt: skip


def _float(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: two decimals, else one, else none, else an exponent."""
    for text in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def _body(r: Row) -> str:
    wrong = "   N/A" if r.wrong is None else f"{r.wrong:6g}"
    return f"  {_float(r.time_us, 7)}  {_float(r.algbw_gbs, 6)}  {_float(r.busbw_gbs, 6)}  {wrong}"


def format_row(r: Row) -> str:
    """A data row; the in-place columns repeat the out-of-place ones (one measurement)."""
    head = f"{r.size:12d}  {r.count:12d}  {r.type:>8s}  {r.redop:>6s}  {r.root:6d}"
    return head + _body(r) + _body(r)


def _columns(*values: str) -> str:
    """A header line: the row's five leading columns, then time, algbw, busbw and #wrong
    out of place and in place, at the rows' widths."""
    widths = (10, 12, 8, 6, 6) + (7, 6, 6, 6) * 2
    return ("# " + "  ".join(f"{v:>{w}s}" for v, w in zip(values, widths, strict=True))).rstrip()


def header_lines() -> list[str]:
    lead = "# " + "  ".join(" " * w for w in (10, 12, 8, 6, 6))
    return [
        "#",
        lead + "           out-of-place                       in-place",
        _columns(*HEADER, *("time", "algbw", "busbw", "#wrong") * 2),
        _columns("(B)", "(elements)", "", "", "", *("(us)", "(GB/s)", "(GB/s)", "") * 2),
    ]


def footer_line(rows: Sequence[Row]) -> str:
    """The mean busbw of the rows (nccl-tests averages out-of-place and in-place: the same)."""
    avg = sum(r.busbw_gbs for r in rows) / len(rows) if rows else 0.0
    return f"# {'Avg bus bandwidth':<20s} : {avg:g}"


@dataclass(frozen=True)
class Block:
    """One test's rows, with comment lines before them (`# job NAME`, what was measured);
    without a test, only the comments."""

    test: Test | None
    rows: tuple[Row, ...]
    comments: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # comment lines among the rows (an op that did not finish)


def render_block(b: Block) -> str:
    """A block as nccl-tests prints a test; one without rows (no test, or no op finished)
    is its comment lines only."""
    lines = [f"# {c}" for c in b.comments]
    if b.test is None or not b.rows:
        return "\n".join([*lines, *(f"# {n}" for n in b.notes)])
    lines.append(f"# Collective test starting: {b.test.program}")
    lines += header_lines()
    lines += [format_row(r) for r in b.rows]
    lines += [f"# {n}" for n in b.notes]
    lines += [footer_line(b.rows), "#"]
    return "\n".join(lines)


SIMULATED = (
    "one measurement per op: the in-place columns repeat the out-of-place ones; #wrong is "
    "N/A (no data is checked)"
)


def render_blocks(blocks: Sequence[Block], lead: Sequence[str] = ()) -> str:
    """The blocks after comment lines `lead` (what was measured) and SIMULATED."""
    head = [f"# {c}" for c in (*lead, SIMULATED)]
    return "\n".join([*head, *(render_block(b) for b in blocks)])


@dataclass(frozen=True)
class Op:
    """A collective op as the rows need it: a run's op (`ops_of_run`) or a sweep's, its
    time the mean over seeds (`aifabric.experiments`)."""

    job: str
    kind: str
    algorithm: str
    bytes: int
    ranks: int
    time_ns: float | None  # None: it did not finish
    busbw_factor: float
    root: int | None = None  # broadcast
    label: str = ""  # how a note names it ("op 3")


def ops_of_run(collectives, workload: dict) -> list[Op]:
    """`Op`s of the analyzer's per-op results (`aifabric.analysis.results.Collective`),
    with each broadcast's root from the run's workload spec."""
    from aifabric.fabric.scenario import job_bodies

    bodies = job_bodies(workload)
    return [
        Op(
            job=c.job_name,
            kind=c.kind,
            algorithm=c.algorithm,
            bytes=c.bytes,
            ranks=c.ranks,
            time_ns=c.time_ns,
            busbw_factor=c.busbw_factor or 0.0,
            root=int(bodies[c.job].get("root", 0)) if c.job < len(bodies) else None,
            label=f"op {c.op}",
        )  # fmt: skip
        for c in collectives
    ]


def blocks(ops: Sequence[Op]) -> list[Block]:
    """One block per job, in the order the jobs first appear, its ops in the order given;
    a job whose ops change kind (a training step) has a block per run of one kind. Ops of
    a traffic pattern or matrix have no nccl-tests test: a comment says so."""
    out: list[Block] = []
    jobs = list(dict.fromkeys(o.job for o in ops))
    for job in jobs:
        mine = [o for o in ops if o.job == job]
        name = job if job.startswith("job ") else f"job {job}"  # an unnamed job is "job 0"
        runs: list[list[Op]] = []
        for o in mine:
            if runs and runs[-1][0].kind == o.kind:
                runs[-1].append(o)
            else:
                runs.append([o])
        for run in runs:
            first = run[0]
            if first.kind not in TESTS:
                say = f"{name}: {len(run)} {first.kind} op(s), a traffic pattern: no rows"
                out.append(Block(None, (), (say,)))
                continue
            test = TESTS[first.kind]
            rows = tuple(
                row(test, o.bytes, o.ranks, o.time_ns, o.busbw_factor, o.root)
                for o in run
                if o.time_ns
            )
            notes = tuple(
                f"{o.label or 'an op'} ({o.bytes} B) did not finish: no row"
                for o in run
                if not o.time_ns
            )
            algorithms = "/".join(dict.fromkeys(o.algorithm for o in run))
            ranks = "/".join(str(r) for r in dict.fromkeys(o.ranks for o in run))
            out.append(
                Block(test, rows, (f"{name}: {first.kind} {algorithms} over {ranks} ranks",),
                      notes)
            )  # fmt: skip
    return out


# --- reading ---------------------------------------------------------------------------

_TEST_LINE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\b")
_END = ("# Out of bounds values", "# Avg bus bandwidth", "# Collective test concluded")


@dataclass(frozen=True)
class Log:
    """What an nccl-tests log holds: its test (None: it does not say), its ranks (None: no
    Rank lines) and its rows, out-of-place columns, with their line numbers."""

    path: str
    test: Test | None
    ranks: int | None
    rows: tuple[Row, ...]


def _program_test(name: str, path: str, line: int) -> Test:
    stem = Path(name).name
    for program, test in BY_PROGRAM.items():
        if stem == program or stem.startswith(program + "_"):  # all_reduce_perf_mpi
            return test
    known = ", ".join(BY_PROGRAM)
    raise AifabricError(f"{path}, line {line}: test {stem} is not one of {known}")


def _number(text: str, what: str, where: str, whole: bool = False):
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise AifabricError(f"{where}: {what} {text!r} is not {kind}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise AifabricError(f"{where}: {what} {text!r} is not a finite number")
    return value


def _parse_row(fields: list[str], line: int, where: str) -> Row:
    if len(fields) < 9:
        raise AifabricError(
            f"{where}: {len(fields)} columns, an nccl-tests row has at least 9 (size, count, "
            "type, redop, root, then time, algbw, busbw and #wrong out of place)"
        )
    size = _number(fields[0], "size", where, whole=True)
    count = _number(fields[1], "count", where, whole=True)
    root = _number(fields[4], "root", where, whole=True)
    time_us = _number(fields[5], "time", where)
    algbw = _number(fields[6], "algbw", where)
    busbw = _number(fields[7], "busbw", where)
    wrong = None if fields[8] == "N/A" else int(_number(fields[8], "#wrong", where))
    if size <= 0:
        raise AifabricError(f"{where}: size {size} is not a positive number of bytes")
    if count < 0:
        raise AifabricError(f"{where}: count {count} is negative")
    if time_us <= 0:
        raise AifabricError(f"{where}: time {fields[5]} us is not positive")
    if algbw < 0 or busbw < 0:
        raise AifabricError(f"{where}: a bandwidth is negative")
    return Row(size, count, fields[2], fields[3], root, time_us, algbw, busbw, wrong, line)


def _is_header(line: str) -> bool:
    return tuple(line.lstrip("#").split()[: len(HEADER)]) == HEADER


def parse_log(text: str, path: str = "the log") -> Log:
    """The rows of an nccl-tests log (its out-of-place columns), its test and ranks. Lines
    that are not comments outside the table (a launcher's messages) and NCCL's own logging
    (NCCL_DEBUG=INFO) among the rows are passed over."""
    test: Test | None = None
    tests: list[str] = []
    ranks: set[int] = set()
    rows: list[Row] = []
    header = in_table = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("#"):
            if (m := _TEST_LINE.match(line)) is not None:
                test = _program_test(m.group(1), path, number)
                tests += [test.program] if test.program not in tests else []
            elif (m := _RANK_LINE.match(line)) is not None:
                ranks.add(int(m.group(1)))
            elif _is_header(line):
                header = in_table = True
            elif line.startswith(_END):
                in_table = False
        elif line and in_table and " NCCL " not in f" {line} ":
            rows.append(_parse_row(line.split(), number, f"{path}, line {number}"))
    if not header:
        raise AifabricError(
            f"{path} is not an nccl-tests log: it has no '#  size  count  type  redop  root' "
            "header line"
        )
    if not rows:
        raise AifabricError(f"{path} has no data rows")
    if len(tests) > 1:
        raise AifabricError(
            f"{path} holds rows of several tests ({', '.join(tests)}); give one test's log"
        )
    return Log(path, test, len(ranks) if ranks else None, tuple(rows))


def read_log(path: str | Path) -> Log:
    """`parse_log` of a file; a file that is not text is not a log."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise AifabricError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise AifabricError(f"{path} is not an nccl-tests log: it is not text") from None
    return parse_log(text, str(path))


@dataclass(frozen=True)
class Logs:
    """The rows of logs of one test, as columns (one entry per row), and per log what it is."""

    kind: str
    size: np.ndarray
    ranks: np.ndarray
    time_us: np.ndarray
    described: tuple[str, ...]  # "all_reduce.log (all_reduce_perf, 16 ranks)"


def read_logs(paths: Sequence[str], kind: str | None = None, ranks: int | None = None) -> Logs:
    """The out-of-place rows of nccl-tests logs of one test: `kind` when a log does not name
    its test (or to check it), `ranks` when one does not list its ranks (or over them)."""
    kinds, size, n, time_us, described = [], [], [], [], []
    for path in paths:
        log = read_log(path)
        mine = kind or (log.test.kind if log.test else None)
        if mine is None:
            raise AifabricError(
                f"{path} does not say which test it is (no '# Collective test starting:' "
                "line); give --collective"
            )
        if log.test is not None and kind and log.test.kind != kind:
            raise AifabricError(f"{path} is {log.test.program}, not --collective {kind}")
        count = ranks or log.ranks
        if count is None:
            raise AifabricError(
                f"{path} does not list its ranks (no '#  Rank  0 Group ...' lines); give --ranks"
            )
        kinds += [mine] if mine not in kinds else []
        size += [r.size for r in log.rows]
        time_us += [r.time_us for r in log.rows]
        n += [count] * len(log.rows)
        described.append(f"{Path(path).name} ({TESTS[mine].program}, {count} ranks)")
    if len(kinds) > 1:
        raise AifabricError(f"the logs are of several tests ({', '.join(kinds)})")
    return Logs(kinds[0], np.array(size), np.array(n), np.array(time_us), tuple(described))


def fit_text(fit, logs: Logs, title: str) -> str:
    """What `calibrate` prints of a fit (`aifabric.traffic.nccl_calibrate.Fit`) of `logs`:
    per size the protocol, measured and fitted time and the error; then the fitted terms."""
    from aifabric.analysis.table import render

    several = len(set(logs.ranks.tolist())) > 1  # logs at several rank counts
    per_size = render(
        ["size (B)", *(["ranks"] if several else []), "protocol", "measured us", "fitted us",
         "error %"],
        [
            [int(logs.size[i]), *([int(logs.ranks[i])] if several else []), fit.protocol[i],
             f"{logs.time_us[i]:.2f}", f"{fit.fitted_us[i]:.2f}", f"{100 * fit.error[i]:+.2f}"]
            for i in range(len(logs.size))
        ],
        title=title,
    )  # fmt: skip
    default = "" if fit.fit_base else " (default)"
    terms = render(
        ["protocol", "sizes", "base latency us", "net latency us", "bandwidth factor"],
        [
            [p.protocol, p.rows, f"{p.base_latency_us:.4g}{default}", f"{p.net_latency_us:.4g}",
             f"{p.bandwidth_factor:.4g}"]
            for p in fit.protocols.values()
        ],
        title=f"fitted; max |error| {100 * abs(fit.error).max():.2f}%",
    )  # fmt: skip
    return f"{per_size}\n\n{terms}"
