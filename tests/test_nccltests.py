"""nccl-tests in and out: `analyze --format nccl-tests` and `sweep show --format nccl-tests`
print a simulated run's ops as all_reduce_perf does; `calibrate` fits NCCL's cost model
back from logs made here from known latency and bandwidth terms, with nccl-tests' own
header and row format."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.analysis.metrics import run_metrics
from aifabric.analysis.nccltests import parse_log
from aifabric.cli import main
from aifabric.fabric.rundir import Run

TWO_JOBS = """
[scenario]
topology = "lab-small"
seed = 2
[[workload.jobs]]
name = "ring"
collective = "allreduce"
algorithm = "ring"
size = "256KiB"
gpus = 4
iterations = 2
[[workload.jobs]]
name = "gather"
collective = "allgather"
size = "512KiB"
gpus = 8
[ecmp]
policy = "5tuple"
"""

# all_reduce_perf's header (nccl-tests 2.17, no -T), copied from a log
HEADER = [
    "#",
    "#                                                              out-of-place                       in-place",  # noqa: E501
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",  # noqa: E501
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)",  # noqa: E501
]  # fmt: skip


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nccltests")
    (folder / "two.toml").write_text(TWO_JOBS)
    r = invoke("run", folder / "two.toml", "-o", folder / "run")
    assert r.exit_code == 0, r.output
    return Run(folder / "run")


def _blocks(text: str) -> dict[str, str]:
    """The output's blocks by job name."""
    out, name = {}, None
    for line in text.splitlines():
        if line.startswith("# job "):
            name = line.removeprefix("# job ").split(":")[0]
            out[name] = ""
        if name is not None:
            out[name] += line + "\n"
    return out


def test_analyze_prints_a_block_per_job_of_nccl_tests_rows(two_jobs):
    r = invoke("analyze", two_jobs.path, "--format", "nccl-tests")
    assert r.exit_code == 0, r.output
    blocks = _blocks(r.output)
    assert list(blocks) == ["ring", "gather"]
    ops = {o.job_name: [] for o in run_metrics(two_jobs).collectives.ops}
    for o in run_metrics(two_jobs).collectives.ops:
        ops[o.job_name].append(o)
    programs = {"ring": "all_reduce_perf", "gather": "all_gather_perf"}
    for name, text in blocks.items():
        lines = text.splitlines()
        assert f"# Collective test starting: {programs[name]}" in lines
        start = lines.index(HEADER[2])
        assert lines[start - 2 : start + 2] == HEADER
        log = parse_log(text)
        assert log.test.program == programs[name]
        mine = ops[name]
        assert len(log.rows) == len(mine) == (2 if name == "ring" else 1)
        n = mine[0].ranks
        factor = 2 * (n - 1) / n if name == "ring" else (n - 1) / n
        for row, op in zip(log.rows, mine, strict=True):  # the ops in order
            assert row.size == op.bytes
            assert row.count == op.bytes // 4 // (1 if name == "ring" else n)
            assert (row.type, row.redop, row.root) == (
                "float",
                {"ring": "sum"}.get(name, "none"),
                -1,
            )
            assert row.time_us == pytest.approx(op.time_ns / 1e3, abs=0.005)
            # algbw = size / time (GB/s), busbw = algbw x factor, to the printed digits
            assert row.algbw_gbs == pytest.approx(
                row.size / (row.time_us * 1e3), abs=0.006, rel=1e-3
            )
            assert row.busbw_gbs == pytest.approx(row.algbw_gbs * factor, abs=0.012, rel=1e-3)
            assert row.wrong is None
            fields = lines[row.line - 1].split()
            assert fields[9:12] == fields[5:8]  # in place: the one measurement again
        avg = float(lines[-2].split(":")[1])
        assert lines[-2].startswith("# Avg bus bandwidth    : ")
        assert avg == pytest.approx(np.mean([r.busbw_gbs for r in log.rows]), abs=0.01)


def test_a_job_of_several_kinds_has_a_block_per_kind_and_an_unfinished_op_no_row(pristine):
    # tests/test_analysis_run.py's COLLECTIVES: one job, five kinds, the send/recv unfinished
    r = invoke("analyze", pristine, "--format", "nccl-tests")
    assert r.exit_code == 0, r.output
    tests = [line.split(": ")[1] for line in r.output.splitlines() if "test starting" in line]
    assert tests == ["all_reduce_perf", "all_gather_perf", "alltoall_perf", "broadcast_perf"]
    parts = r.output.split("# Collective test starting: ")[1:]
    sizes = [[row.size for row in parse_log("# Collective test starting: " + p).rows]
             for p in parts]  # fmt: skip
    assert sizes == [[64 * 2**20], [32 * 2**20], [16 * 2**20], [8 * 2**20]]
    assert r.output.rstrip().endswith("# op 4 (1048576 B) did not finish: no row")
    a2a = parse_log("# Collective test starting: " + parts[2]).rows[0]
    assert (a2a.count, a2a.redop, a2a.time_us) == (16 * 2**20 // 4 // 16, "none", 500.0)
    assert a2a.busbw_gbs == pytest.approx(a2a.algbw_gbs * 15 / 16, abs=0.01)
    from aifabric.experiments.nccltests import _run_ops

    assert [op.time_ns for _, op in _run_ops(pristine)][-1] is None


def test_analyze_nccl_tests_refuses_json_too(two_jobs):
    r = invoke("analyze", two_jobs.path, "--format", "nccl-tests", "--json")
    assert r.exit_code == 2, r.output


def test_sweep_show_prints_a_row_per_size(tmp_path):
    spec = tmp_path / "tiny.toml"
    spec.write_text(TWO_JOBS.split("[[workload.jobs]]")[0] + '[workload]\ncollective = "allreduce"'
                    '\nsize = "64KiB"\ngpus = 4\n[ecmp]\npolicy = "5tuple"\n')  # fmt: skip
    out = tmp_path / "sweep"
    r = invoke("sweep", spec, "--vary", "workload.size=64KiB,256KiB",
               "--vary", "workload.algorithm=ring,tree", "--seeds", "1-2", "--workers", 1,
               "-o", out)  # fmt: skip
    assert r.exit_code == 0, r.output
    r = invoke("sweep", "show", out, "--format", "nccl-tests")
    assert r.exit_code == 0, r.output
    parts = r.output.split("# configuration ")[1:]
    assert [p.split(":")[0] for p in parts] == ["algorithm=ring", "algorithm=tree"]
    for part in parts:
        log = parse_log(part)
        assert [row.size for row in log.rows] == [65536, 262144]
        assert "the mean over 2 seed(s)" in part


# --- calibrate --------------------------------------------------------------------------

LINE_RATE = 100e9  # lab-small's NICs


def model_us(n, sizes, base, lat, bwf, tree=False):
    """NCCL's model for a ring (or tree) AllReduce over n ranks, written out here."""
    steps = 2 * math.ceil(math.log2(n)) if tree else 2 * (n - 1)
    factor = 2 if tree else 2 * (n - 1) / n  # NCCL gives a tree half the bus bandwidth
    return base + steps * lat + factor * np.asarray(sizes, float) * 8 / (LINE_RATE * bwf) * 1e6


def nccl_log(sizes, times_us, n, program="all_reduce_perf", preamble=True) -> str:
    """An nccl-tests log as all_reduce_perf 2.17 prints it (one GPU per process, MPI)."""
    lines = []
    if preamble:
        lines += [
            "# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703",
            f"# Collective test starting: {program}",
            "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 2(factor) warmup "
            "iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
            "#",
            "# Using devices",
        ]
        lines += [
            f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on {'node' + str(r // 8):>10s} device "
            f"{r % 8:2d} [0000:{0x1B + r % 8:02x}:00] NVIDIA H100 80GB HBM3"
            for r in range(n)
        ]
    lines += HEADER
    for s, t in zip(sizes, times_us, strict=True):
        algbw = s / t / 1e3
        busbw = algbw * 2 * (n - 1) / n
        body = f"  {t:7.2f}  {algbw:6.2f}  {busbw:6.2f}  {0:6g}"
        lines.append(f"{s:12d}  {s // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}{body}{body}")
    lines += [
        "# Out of bounds values : 0 OK",
        "# Avg bus bandwidth    : 12.3456 ",
        "#",
        f"# Collective test concluded: {program}",
    ]
    return "\n".join(lines) + "\n"


SIZES = [2**k for k in range(12, 31)]  # 4 KiB to 1 GiB


def _calibrate(tmp_path, log_text, *args, name="nccl.toml"):
    log = tmp_path / "all_reduce.log"
    log.write_text(log_text)
    out = tmp_path / name
    return invoke("calibrate", log, "--fabric", "lab-small", "-o", out, *args), out


def _nccl(out: Path) -> dict:
    """The [nccl] table calibrate wrote, checked as a scenario loads it."""
    from aifabric.scenarios import load_scenario
    from aifabric.traffic.nccl import DEFAULT, Table

    table = tomllib.loads(out.read_text())["nccl"]
    scenario = out.with_suffix(".scenario.toml")
    scenario.write_text(TWO_JOBS + "\n" + out.read_text())  # the written file, pasted in
    assert load_scenario(scenario).extra["nccl"] == table
    laid = Table.from_dict(table)  # over NCCL's defaults: what was fitted, the rest theirs
    for key, algorithms in table.items():
        for algorithm, protocols in algorithms.items():
            assert getattr(laid, key)[algorithm] == {
                **getattr(DEFAULT, key)[algorithm],
                **protocols,
            }
    allowed = {"base_latency_us", "net_latency_us", "nvlink_latency_us", "bandwidth_factor"}
    assert set(table) <= allowed | {"wire", "buffer_bytes", "steps"}
    for key in set(table) & allowed:
        for algorithm, protocols in table[key].items():
            assert algorithm in ("ring", "tree")
            assert set(protocols) <= {"ll", "ll128", "simple"}
            assert all(isinstance(v, float) and v >= 0 for v in protocols.values())
    return table


def test_calibrate_fits_one_protocol_back(tmp_path):
    n = 16
    times = model_us(n, SIZES, base=8.4, lat=9.0, bwf=0.9)  # Simple's default base latency
    r, out = _calibrate(tmp_path, nccl_log(SIZES, times, n), "--protocol", "simple")
    assert r.exit_code == 0, r.output
    table = _nccl(out)
    assert set(table) == {"net_latency_us", "bandwidth_factor"}
    assert table["net_latency_us"]["ring"]["simple"] == pytest.approx(9.0, rel=0.02)
    assert table["bandwidth_factor"]["ring"]["simple"] == pytest.approx(0.9, rel=0.02)
    text = out.read_text()
    assert text.startswith("# aifabric calibrate: all_reduce.log (all_reduce_perf, 16 ranks)")
    assert "lab-small" in text.splitlines()[0]
    # the table: a row per size, measured against fitted
    rows = [line.split() for line in r.output.splitlines() if line.split()[:1] == ["4096"]]
    assert rows and rows[0][1] == "simple" and abs(float(rows[0][4])) < 2


def test_calibrate_auto_splits_a_mixed_ll_simple_log(tmp_path):
    n = 8
    ll = model_us(n, SIZES, base=6.6, lat=1.5, bwf=0.3)
    simple = model_us(n, SIZES, base=8.4, lat=12.0, bwf=0.95)
    times = np.minimum(ll, simple)
    assert 4 <= int((ll < simple).sum()) <= len(SIZES) - 4  # both protocols have sizes
    r, out = _calibrate(tmp_path, nccl_log(SIZES, times, n), "--protocol", "auto")
    assert r.exit_code == 0, r.output
    table = _nccl(out)
    lat, bwf = table["net_latency_us"]["ring"], table["bandwidth_factor"]["ring"]
    assert set(lat) == set(bwf) == {"ll", "simple"}
    assert lat["ll"] == pytest.approx(1.5, rel=0.02)
    assert lat["simple"] == pytest.approx(12.0, rel=0.02)
    assert bwf["ll"] == pytest.approx(0.3, rel=0.02)
    assert bwf["simple"] == pytest.approx(0.95, rel=0.02)
    chosen = {
        int(w[0]): w[1] for w in map(str.split, r.output.splitlines()) if w and w[0].isdigit()
    }
    assert [chosen[s] for s in SIZES] == [
        "ll" if a < b else "simple" for a, b in zip(ll, simple, strict=True)
    ]


def test_calibrate_fits_a_tree_and_refuses_a_log_faster_than_the_nics(tmp_path):
    n = 16
    times = model_us(n, SIZES, base=6.8, lat=4.0, bwf=0.5, tree=True)  # LL's default base
    r, out = _calibrate(tmp_path, nccl_log(SIZES, times, n), "--algorithm", "tree",
                        "--protocol", "ll")  # fmt: skip
    assert r.exit_code == 0, r.output
    table = _nccl(out)
    assert table["net_latency_us"] == {"tree": {"ll": pytest.approx(4.0, rel=0.02)}}
    assert table["bandwidth_factor"] == {"tree": {"ll": pytest.approx(0.5, rel=0.02)}}
    fast = model_us(n, SIZES, base=8.4, lat=9.0, bwf=1.6)  # 160 Gbit/s through 100G NICs
    r, out = _calibrate(tmp_path, nccl_log(SIZES, fast, n), "--protocol", "simple", name="f")
    assert r.exit_code == 1 and "faster than the NICs' line rate" in r.output, r.output
    assert not out.exists()


def test_calibrate_fits_the_base_from_two_rank_counts(tmp_path):
    logs = []
    for n in (4, 16):
        path = tmp_path / f"ar{n}.log"
        path.write_text(nccl_log(SIZES, model_us(n, SIZES, base=20.0, lat=9.0, bwf=0.9), n))
        logs.append(path)
    out = tmp_path / "nccl.toml"
    r = invoke("calibrate", *logs, "--fabric", "lab-small", "--protocol", "simple",
               "--fit-base", "-o", out)  # fmt: skip
    assert r.exit_code == 0, r.output
    table = _nccl(out)
    assert table["base_latency_us"]["ring"]["simple"] == pytest.approx(20.0, rel=0.02)
    assert table["net_latency_us"]["ring"]["simple"] == pytest.approx(9.0, rel=0.02)
    r = invoke("calibrate", logs[0], "--fabric", "lab-small", "--fit-base", "-o", tmp_path / "b")
    assert r.exit_code == 1 and "two or more rank counts" in r.output, r.output
    assert not (tmp_path / "b").exists()


def test_calibrate_reads_analyze_output_with_ranks_given(two_jobs, tmp_path):
    r = invoke("analyze", two_jobs.path, "--format", "nccl-tests")
    ring = _blocks(r.output)["ring"]
    (tmp_path / "ring.log").write_text(ring)
    out = tmp_path / "nccl.toml"
    r = invoke("calibrate", tmp_path / "ring.log", "--fabric", "lab-small", "-o", out)
    assert r.exit_code == 1 and "--ranks" in r.output, r.output
    r = invoke("calibrate", tmp_path / "ring.log", "--fabric", "lab-small", "--ranks", 4, "-o", out)
    assert r.exit_code == 1 and "one size only" in r.output, r.output  # two ops of 256 KiB
    assert not out.exists()


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda row: row + "  2026-12-01 10:00:00", None),  # -T's timestamp column: fine
        (lambda row: row[: row.index("float")], "columns"),
        (lambda row: "  abc" + row[5:], "size 'abc'"),
        (lambda row: row.replace("sum", "sum  ", 1).replace(row.split()[5], "1.2.3", 1), "time"),
        (lambda row: row.replace(row.split()[5], "-4.00", 1), "time -4.00 us is not positive"),
    ],
)
def test_a_malformed_row_names_its_line(tmp_path, damage, said):
    lines = nccl_log(SIZES, model_us(8, SIZES, 8.4, 9.0, 0.9), 8).splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("4096 "))
    bad = first + 3
    lines[bad] = damage(lines[bad])
    r, out = _calibrate(tmp_path, "\n".join(lines) + "\n", "--protocol", "simple")
    if said is None:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 1, r.output
    message = r.output.strip().splitlines()[-1]
    assert f"line {bad + 1}:" in message and said in message, message
    assert not out.exists()


def test_what_is_not_a_log_is_refused_and_nothing_written(tmp_path):
    cases = {
        "a scenario": TWO_JOBS,
        "words": "size count type redop root\nnot a log at all\n",
        "empty": "",
    }
    for label, text in cases.items():
        r, out = _calibrate(tmp_path, text)
        assert r.exit_code == 1, (label, r.output)
        assert "is not an nccl-tests log" in r.output, (label, r.output)
        assert not out.exists()
    binary = tmp_path / "core"
    binary.write_bytes(bytes(range(256)) * 4)
    r = invoke("calibrate", binary, "--fabric", "lab-small", "-o", tmp_path / "x.toml")
    assert r.exit_code == 1 and "not text" in r.output, r.output
    # the header and no rows
    r, out = _calibrate(tmp_path, nccl_log([], [], 8))
    assert r.exit_code == 1 and "no data rows" in r.output, r.output
    assert not out.exists()
    # no test line and no Rank lines (an older nccl-tests): --collective and --ranks say it
    bare = nccl_log(SIZES, model_us(8, SIZES, 8.4, 9.0, 0.9), 8, preamble=False)
    r, out = _calibrate(tmp_path, bare)
    assert r.exit_code == 1 and "--collective" in r.output, r.output
    r, out = _calibrate(tmp_path, bare, "--collective", "allreduce", "--ranks", 8,
                        "--protocol", "simple")  # fmt: skip
    assert r.exit_code == 0, r.output


def test_calibrate_refuses_an_unknown_fabric_and_an_existing_output(tmp_path):
    log = tmp_path / "ar.log"
    log.write_text(nccl_log(SIZES, model_us(8, SIZES, 8.4, 9.0, 0.9), 8))
    out = tmp_path / "nccl.toml"
    r = invoke("calibrate", log, "--fabric", "no-such-fabric", "-o", out)
    assert r.exit_code == 1, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not out.exists()
    out.write_text("mine\n")
    r = invoke("calibrate", log, "--fabric", "lab-small", "-o", out)
    assert r.exit_code == 1 and "--force" in r.output, r.output
    assert out.read_text() == "mine\n"
    r = invoke("calibrate", log, "--fabric", "lab-small", "-o", out, "--force")
    assert r.exit_code == 0, r.output
    assert math.isfinite(_nccl(out)["net_latency_us"]["ring"]["simple"])
