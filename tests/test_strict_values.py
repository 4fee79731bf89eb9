"""Single values that gave tracebacks, and values that were accepted without a word (issue 26,
classes 7-9): each is now one sentence and a non-zero exit, before any work."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aifabric.cli import main

LEAF_SPINE = """[fabric]
kind = "leaf-spine"
[servers]
gpus_per_server = 2
servers_per_rack = 2
[zone]
racks = 4
ctsw_planes = 2
"""
SCENARIO = (
    '[scenario]\ntopology = "lab-small"\n[workload]\ncollective = "allreduce"\nsize = "1MiB"\n'
)
TWO_JOBS = """[scenario]
topology = "lab-small"
[[workload.jobs]]
name = "a"
collective = "allreduce"
size = "1MiB"
gpus = 8
[[workload.jobs]]
name = "a"
pattern = "incast"
senders = 3
size = "1MB"
"""


def cc(text: str) -> str:
    return SCENARIO + "[congestion_control]\n" + text


def case(id_, args, code, words, files=None):
    return pytest.param(args, code, words, files or {}, id=id_)


RUN = ["run", "s.toml", "-o", "out"]
SHOW_CSV = ["traffic", "show", "m.csv", "--fabric", "lab-small"]
SHOW_HTSIM = ["traffic", "show", "m.txt", "--fabric", "lab-small"]
CASES = [
    # class 8: single values that gave tracebacks
    case("kind-an-array", ["topo", "show", "t.toml"], 1, ["fabric.kind", "is not one of"],
         {"t.toml": LEAF_SPINE.replace('"leaf-spine"', '["leaf-spine"]')}),
    case("csv-field-over-128KiB", SHOW_CSV, 1, ["m.csv:2", "field larger than field limit"],
         {"m.csv": "src,dst,bytes\n" + "x" * 200_000 + ",b,1\n"}),
    case("htsim-start-1e30", SHOW_HTSIM, 1, ["start or size beyond"],
         {"m.txt": "Nodes 16\nConnections 1\n0->1 id 1 start 1e30 size 100\n"}),
    case("scheduler-not-a-url", ["sweep", "s.toml", "--scheduler", "nowhere", "-o", "sw"], 1,
         ["--scheduler 'nowhere'", "tcp://HOST:PORT"], {"s.toml": SCENARIO}),
    # class 9: accepted without a word
    case("tolerance-nan", ["crosscheck", "s.toml", "--tolerance", "nan", "-o", "x"], 2,
         ["nan", "(0, 1]"], {"s.toml": SCENARIO}),
    case("bare-rate", ["topo", "show", "t.toml"], 1, ["has no unit", "800G"],
         {"t.toml": LEAF_SPINE + "[links]\nrate = 800\n"}),
    *[case(f"zero-{t}", RUN, 1, [t, "above 0 ns"], {"s.toml": cc(f'kind = "dcqcn"\n{t} = 0\n')})
      for t in ("alpha_timer", "rto", "cnp_interval", "rate_timer")],
    case("same-link-down-twice", RUN, 1, ["is down twice"],
         {"s.toml": SCENARIO + '[[faults]]\nlink = "z0-r0-rtsw--z0-ctsw0"\n'
          '[[faults]]\nlink = "z0-r0-rtsw--z0-ctsw0"\nat = "1us"\n'}),
    case("link-number-1", RUN, 1, ["#k names the k-th of parallel links from 2 on"],
         {"s.toml": SCENARIO + '[[faults]]\nlink = "z0-r0-rtsw--z0-ctsw0#1"\n'}),
    case("two-jobs-one-name", RUN, 1, ["two jobs are named 'a'"], {"s.toml": TWO_JOBS}),
    case("parameter-of-another-kind", RUN, 1, ["alpha_timer is read by dcqcn, not by none"],
         {"s.toml": cc('kind = "none"\nalpha_timer = "10us"\n')}),
    case("data-on-the-control-priority", RUN, 1, ["control priority"],
         {"s.toml": SCENARIO + "priority = 6\n"}),
    case("fractional-steps", RUN, 1, ["fast_recovery_steps", "whole number"],
         {"s.toml": cc("fast_recovery_steps = 1.5\n")}),
    case("empty-output", ["run", "s.toml", "-o", ""], 2, ["-o ''"], {"s.toml": SCENARIO}),
    case("empty-capture", ["run", "s.toml", "--capture", "", "-o", "out"], 2, ["--capture"],
         {"s.toml": SCENARIO}),
    case("empty-matrix", SHOW_CSV, 1, ["holds no flows"],
         {"m.csv": "src,dst,bytes\n# nothing\n"}),
    # class 7: sizes bounded before work starts
    case("a-billion-seeds", ["sweep", "s.toml", "--seeds", "1-1000000000", "-o", "sw"], 1,
         ["1,000,000,000 seeds", "GB"], {"s.toml": SCENARIO}),
]  # fmt: skip


@pytest.mark.parametrize(("args", "code", "words", "files"), CASES)
def test_a_bad_value_is_one_sentence(args, code, words, files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = CliRunner().invoke(main, args)
    message = r.output.strip()
    assert r.exit_code == code, message[-2000:]
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in message
    last = message.splitlines()[-1]
    assert last.startswith("Error: ") and len(last) <= 400, last
    for word in words:
        assert word in last, last
    assert not (tmp_path / "out").exists() and not (tmp_path / "sw").exists()


def test_a_rate_prints_its_unit_once():
    from aifabric.fabric.units import format_rate

    assert f"{format_rate(800)}bps" == "800bps" and f"{format_rate(4 * 10**11)}bps" == "400Gbps"


def test_a_matrix_over_the_flow_table_limit_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    import importlib

    generate = importlib.import_module("aifabric.traffic.generate")
    monkeypatch.setattr(generate, "MAX_FLOWS", 10)
    path = tmp_path / "m.csv"
    path.write_text("src,dst,bytes\n" + "z0-r0-h0-nic0,z0-r1-h0-nic0,4096\n" * 20)
    r = CliRunner().invoke(main, ["traffic", "show", str(path), "--fabric", "lab-small"])
    assert r.exit_code == 1 and "more than the 10 flows" in r.output and "GB" in r.output, r.output


def test_a_capture_bigger_than_memory_is_refused_with_what_it_needs(tmp_path, monkeypatch):
    import struct

    import aifabric.fabric.memory as memory

    path = tmp_path / "empty-records.pcap"
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    path.write_bytes(header + struct.pack("<IIII", 0, 0, 0, 0) * 1000)
    monkeypatch.setattr(memory, "available_memory", lambda: 10_000)
    r = CliRunner().invoke(main, ["analyze", str(path)])
    assert r.exit_code == 1 and "1,000 records" in r.output and "GiB" in r.output, r.output


def test_more_local_workers_than_memory_holds_are_refused():
    from aifabric.experiments.runner import check_workers
    from aifabric.fabric.errors import AifabricError

    with pytest.raises(AifabricError, match=r"--workers 1,000,000 .* needs about .* GiB"):
        check_workers(1_000_000)
