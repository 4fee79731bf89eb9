"""Every bad input of issue 15 through the command line: one sentence, a non-zero exit.

Each case writes the files it names into a temporary folder, runs the `aifabric`
command there, and asserts the exit status (1 for bad input, 2 for an option
out of its range, as the README says), the sentence's key words, a single line
of at most 300 characters, and no traceback. Cases whose fix belongs to
another part of the code (the scenario loader and `run` in sim and
aifabric/cli_run.py) stay here as strict expected failures that name it.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aifabric.cli import main

LEAF_SPINE = """[fabric]
kind = "leaf-spine"
[servers]
gpus_per_server = 8
servers_per_rack = 2
"""
ZONE = "[zone]\nracks = 4\nctsw_planes = 2\n"
SCENARIO = (
    '[scenario]\ntopology = "lab-small"\n[workload]\ncollective = "allreduce"\nsize = "1MiB"\n'
)


def topo(extra: str, zone: str = ZONE) -> str:
    return LEAF_SPINE + zone + extra


def nested(depth: int) -> str:
    return "x = " + "[" * depth + "]" * depth + "\n"


def case(id_, args, code, words, files=None, marks=()):
    return pytest.param(args, code, words, files or {}, id=id_, marks=marks)


CASES = [
    # Quantities: infinities, NaN, huge exponents (fabric/units.py and the spec parsers).
    case("rate-inf", ["topo", "show", "t.toml"], 1, ["links.rate", "inf", "finite rate"],
         {"t.toml": topo("[links]\nrate = inf\n")}),
    case("rate-nan", ["topo", "show", "t.toml"], 1, ["links.rate", "nan", "finite rate"],
         {"t.toml": topo("[links]\nrate = nan\n")}),
    case("rate-huge-exponent", ["topo", "show", "t.toml"], 1,
         ["links.rate", "'1e999999999G' is too large for a rate", "9.2 Ebit/s"],
         {"t.toml": topo('[links]\nrate = "1e999999999G"\n')}),
    case("delay-1e12s", ["topo", "show", "t.toml"], 1,
         ["links.delay", "too large for a time", "292 years"],
         {"t.toml": topo('[links]\ndelay = "1e12s"\n')}),
    case("buffer-1e30", ["topo", "show", "t.toml"], 1,
         ["queue.buffer", "'1e30' is too large for a size", "8 EiB"],
         {"t.toml": topo('[queue]\nbuffer = "1e30"\n')}),
    case("ecn-pmax-nan", ["topo", "show", "t.toml"], 1, ["queue.ecn_pmax = nan", "finite"],
         {"t.toml": topo("[queue]\necn_pmax = nan\n")}),
    case("rtsw-up-down-inf", ["topo", "show", "t.toml"], 1,
         ["zone.rtsw_up_down = inf", "finite"],
         {"t.toml": topo("", zone=ZONE + "rtsw_up_down = inf\n")}),
    case("mtu-1e12-float", ["topo", "show", "t.toml"], 1, ["links.mtu", "whole number"],
         {"t.toml": topo("[links]\nmtu = 1e12\n")}),
    case("mtu-1e12", ["topo", "show", "t.toml"], 1, ["links.mtu = 1000000000000", "at most 9,000"],
         {"t.toml": topo("[links]\nmtu = 1000000000000\n")}),
    case("size-1e30", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["size", "'1e30' is too large for a size"],
         {"w.toml": 'collective = "allreduce"\nsize = "1e30"\n'}),
    case("params-1e400-string", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["params = '1e400'", "finite count"], {"w.toml": 'model = "m"\nparams = "1e400"\n'}),
    case("params-1e400-float", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["params = inf", "finite count"], {"w.toml": 'model = "m"\nparams = 1e400\n'}),
    case("params-1e30", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["params", "at most 1,000,000,000,000,000"], {"w.toml": 'model = "m"\nparams = 1e30\n'}),
    case("start-1e12s", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["start", "'1e12s' is too large for a time"],
         {"w.toml": 'collective = "allreduce"\nstart = "1e12s"\n'}),
    case("load-nan-option",
         ["traffic", "show", "uniform", "--fabric", "lab-small", "--load", "nan"], 1,
         ["load = nan", "finite"]),
    case("load-nan-file", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["load = nan", "finite"], {"w.toml": 'pattern = "uniform"\nload = nan\n'}),
    case("start-1e12s-in-a-scenario", ["run", "s.toml", "-o", "out"], 1,
         ["start", "too large for a time"],
         {"s.toml": SCENARIO + 'start = "1e12s"\n'}),
    case("buffer-1e30-in-a-scenario", ["run", "s.toml", "-o", "out"], 1,
         ["buffer", "too large for a size"],
         {"s.toml": SCENARIO + '[queue]\nbuffer = "1e30"\n'}),
    # TOML nested too deep for Python's parser.
    case("nested-topology", ["topo", "show", "t.toml"], 1, ["nests arrays or tables too deep"],
         {"t.toml": nested(100_000)}),
    case("nested-workload", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["nests arrays or tables too deep"], {"w.toml": nested(100_000)}),
    case("nested-scenario", ["run", "s.toml", "-o", "out"], 1, ["too deep"],
         {"s.toml": nested(100_000)}),
    # Seeds.
    case("seed-negative-ecmp", ["ecmp", "lab-small", "--seed", "-1"], 2,
         ["--seed", "-1 is not in the range x>=0"]),
    case("seed-negative-traffic", ["traffic", "show", "uniform", "--fabric", "lab-small",
                                   "--seed", "-1"], 2, ["--seed", "-1 is not in the range x>=0"]),
    case("seed-negative-run", ["run", "demo", "--seed", "-1", "-o", "out"], 2,
         ["--seed", "-1"]),
    case("seed-negative-scenario", ["run", "s.toml", "-o", "out"], 1,
         ["scenario.seed = -1"],
         {"s.toml": SCENARIO.replace("[workload]", "seed = -1\n[workload]")}),
    # Runaways, refused before allocating, with the figure they would need.
    case("fat-tree-k2000", ["topo", "show", "t.toml"], 1,
         ["fat_tree.k = 2,000", "2,005,000,000 nodes", "GB", "at most 2,097,151 nodes"],
         {"t.toml": '[fabric]\nkind = "fat-tree"\n[fat_tree]\nk = 2000\n'}),
    case("ten-million-racks", ["topo", "show", "t.toml"], 1,
         ["zone.racks = 10,000,000", "170,000,002 nodes", "GB"],
         {"t.toml": topo("", zone="[zone]\nracks = 10000000\nctsw_planes = 2\n")}),
    case("ten-million-racks-in-a-scenario", ["run", "s.toml", "-o", "out"], 1,
         ["zone.racks = 10,000,000", "nodes"],
         {"t.toml": topo("", zone="[zone]\nracks = 10000000\nctsw_planes = 2\n"),
          "s.toml": SCENARIO.replace('"lab-small"', '"t.toml"')}),
    case("iterations-1e8", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["iterations = 100000000", "at most 10,000"],
         {"w.toml": 'collective = "allreduce"\niterations = 100000000\n'}),
    case("training-1e15-params", ["traffic", "show", "w.toml", "--fabric", "lab-medium"], 1,
         ["about 9,536,744 operations", "at most 100,000", "larger bucket"],
         {"w.toml": 'model = "m"\nparams = 1e15\n'}),
    case("training-moe-runaway", ["traffic", "show", "w.toml", "--fabric", "lab-medium"], 1,
         ["about 409,536,744 operations"],
         {"w.toml": 'model = "m"\nparams = 1e15\nlayers = 10000\nmicro_batches = 10000\n'
                    'moe_layers = 10000\nep = 2\n'}),
    case("start-292-years", ["traffic", "show", "w.toml", "--fabric", "lab-small"], 1,
         ["start = '9e18ns' must be at most 1000000s"],
         {"w.toml": 'collective = "allreduce"\nstart = "9e18ns"\n'}),
    case("delay-2s", ["topo", "show", "t.toml"], 1, ["links.fabric_delay = '2s'", "at most 1s"],
         {"t.toml": topo('[links]\nfabric_delay = "2s"\n')}),
    case("buffer-2TiB", ["topo", "show", "t.toml"], 1,
         ["queue.buffer = '2TiB' must be at most 1TiB"],
         {"t.toml": topo('[queue]\nbuffer = "2TiB"\n')}),
    case("uniform-49M-flows", ["traffic", "show", "uniform", "--fabric", "lab-small",
                               "--flows", "49000000"], 1,
         ["flows = 49,000,000", "4.7 GB", "at most 10,000,000 flows"]),
    case("ecmp-10M-flows", ["ecmp", "cluster-24k", "--flows", "10000000"], 2,
         ["10000000", "1<=x<=2000000"]),
    case("ecmp-2M-flows-4-qps", ["ecmp", "cluster-24k", "--flows", "2000000", "--qps", "4"], 1,
         ["8,000,000 QP flows", "0.5 GB", "at most 2,000,000"]),
    case("sample-interval-1ns", ["run", "s.toml", "-o", "out"], 1, ["sample_interval", "GB"],
         {"s.toml": "DEMO_1NS"}),
    # Output files.
    case("export-onto-an-existing-file", ["topo", "export", "lab-small", "-o", "old.json"], 1,
         ["old.json exists", "--force"], {"old.json": "keep me\n"}),
    case("traffic-export-onto-an-existing-file", ["traffic", "export", "dense", "--fabric",
                                                  "lab-small", "-o", "old.npz"], 1,
         ["old.npz exists", "--force"], {"old.npz": "keep me\n"}),
    case("export-into-a-file", ["topo", "export", "lab-small", "-o", "old.json/x"], 1,
         ["old.json is not a folder"], {"old.json": "keep me\n"}),
    case("export-into-a-missing-folder", ["topo", "export", "lab-small", "-o", "no/such/x"], 1,
         ["folder no/such does not exist"]),
    case("export-onto-a-folder", ["topo", "export", "lab-small", "-o", "."], 1,
         ["is a directory"]),
    # Long values are quoted cut short.
    case("a-5000-character-rate", ["topo", "show", "t.toml"], 1, ["links.rate", "..."],
         {"t.toml": topo(f'[links]\nrate = "{"1" * 5000}x"\n')}),
    case("a-5000-character-key", ["topo", "show", "t.toml"], 1, ["unknown key links.", "..."],
         {"t.toml": topo(f"[links]\n{'k' * 5000} = 1\n")}),
    case("a-5000-character-preset", ["topo", "show", "p" * 5000], 1,
         ["unknown topology preset", "..."]),
    case("a-5000-character-ecmp-policy", ["run", "s.toml", "-o", "out"], 1,
         ["ecmp.policy", "..."], {"s.toml": SCENARIO + f'[ecmp]\npolicy = "{"p" * 5000}"\n'}),
]  # fmt: skip


@pytest.mark.parametrize(("args", "code", "words", "files"), CASES)
def test_bad_input_is_one_sentence(args, code, words, files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        if text == "DEMO_1NS":
            from aifabric.scenarios import PRESETS

            text = PRESETS.text("demo").replace('"5us"', '"1ns"')
        (tmp_path / name).write_text(text)
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    r = CliRunner().invoke(main, args)
    message = r.output.strip()
    assert r.exit_code == code, message[-2000:]
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in message
    last = message.splitlines()[-1]
    assert last.startswith("Error: ") and len(last) <= 300, last
    for word in words:
        assert word in last, last
    for path, data in before.items():
        assert path.read_bytes() == data, f"{path.name} was overwritten"
    assert not (tmp_path / "out").exists() or code == 0


def test_a_fault_after_the_run_ended_is_said_not_hidden(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(SCENARIO + '[[faults]]\nnode = "z0-ctsw0"\nat = "10s"\n')
    r = CliRunner().invoke(main, ["run", "s.toml", "-o", "out"])
    assert r.exit_code == 0, r.output
    assert "fault not reached" in r.output and "z0-ctsw0 down at 10s" in r.output, r.output
    assert "the run ended before it" in r.output


def test_export_overwrites_with_force(tmp_path):
    out = tmp_path / "old.json"
    out.write_text("keep me\n")
    r = CliRunner().invoke(main, ["topo", "export", "lab-small", "-o", str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("{")
