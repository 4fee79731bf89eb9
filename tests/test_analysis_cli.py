"""What `analyze`, `report`, `compare` and `pcap show` do with what they are given: a
FIFO, a pipe, a device, a directory, packets scapy cannot dissect. Never a wait, never a
traceback: one sentence and exit 1, or the analysis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aifabric.cli import main

DATA = Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "golden.json").read_text())
SHORT = sorted(name for name in GOLDEN if name.startswith("golden_short_"))


def _aifabric(*args: str, shell: str | None = None) -> subprocess.CompletedProcess:
    """The command in a child process (so a command that blocked would time out)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    cmd = shell or [sys.executable, "-m", "aifabric", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env=env, shell=shell is not None,
        executable="/bin/bash" if shell else None,
    )  # fmt: skip


def _one_sentence(r, *needles: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("command", ["analyze", "report", "pcap show"])
def test_a_fifo_nothing_writes_to_is_named_not_waited_on(tmp_path, command):
    fifo = tmp_path / "capture.fifo"
    os.mkfifo(fifo)
    r = _aifabric(*command.split(), str(fifo), *(["-o", str(tmp_path / "r.html")] * (
        command == "report")))  # fmt: skip
    _one_sentence(r, "is a FIFO (named pipe) with nothing writing to it")
    assert not (tmp_path / "r.html").exists()


def test_a_pipe_is_read_to_its_end_and_analyzed_like_the_file(tmp_path):
    golden = DATA / "golden_roce.pcap"
    r = _aifabric(shell=f"{sys.executable} -m aifabric analyze <(cat {golden}) --json")
    assert r.returncode == 0, r.stderr
    piped = json.loads(r.stdout)
    direct = json.loads(_aifabric("analyze", str(golden), "--json").stdout)
    for key in ("packets", "bytes", "kinds", "ecn", "cnp", "pfc", "flows"):
        assert piped[key] == direct[key], key
    # named by the pipe's path (/dev/fd/63), not its last part
    assert piped["file"].startswith("/dev/fd/") and direct["file"] == golden.name
    r = _aifabric(shell=f"{sys.executable} -m aifabric analyze <(cat {golden})")
    assert r.stdout.startswith("/dev/fd/"), r.stdout
    out = tmp_path / "r.html"
    r = _aifabric(shell=f"{sys.executable} -m aifabric report <(cat {golden}) -o {out}")
    assert r.returncode == 0, r.stderr
    assert "<title>aifabric capture /dev/fd/" in out.read_text()
    r = _aifabric(shell=f"{sys.executable} -m aifabric analyze <(echo hello)")
    _one_sentence(r, "is a pipe whose bytes are not a pcap or pcapng")


def test_a_pipe_whose_writer_is_slow_is_waited_on_saying_so(tmp_path):
    """A FIFO some writer holds open: the command reads it to its end, and once it has waited
    a few seconds says on stderr what it waits for."""
    golden = DATA / "golden_roce.pcap"
    fifo = tmp_path / "slow.fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer from the start, writing nothing yet
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    child = subprocess.Popen(
        [sys.executable, "-m", "aifabric", "analyze", str(fifo), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        time.sleep(4)
        os.write(writer, golden.read_bytes())
    finally:
        os.close(writer)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert f"aifabric: reading {fifo} until its writer closes it (0 bytes so far" in err
    direct = json.loads(_aifabric("analyze", str(golden), "--json").stdout)
    assert json.loads(out)["packets"] == direct["packets"] > 0


def test_devices_and_directories_are_named_for_what_they_are(tmp_path):
    _one_sentence(
        _aifabric("analyze", "/dev/null"), "/dev/null is a character device, not a capture"
    )
    r = CliRunner().invoke(main, ["pcap", "show", str(tmp_path)])
    assert r.exit_code == 1 and "is a directory; pcap show reads one capture file" in r.output
    r = CliRunner().invoke(main, ["topo", "show", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert f"{tmp_path} is a directory, not a topology file" in r.output


@pytest.mark.parametrize("name", SHORT)
def test_pcap_show_says_what_scapy_cannot_dissect(name):
    """Packets shorter than their link header: scapy raises struct.error on them (on all but
    one); `pcap show` names the problem and shows the bytes, in text and in JSON."""
    n = GOLDEN[name]["packets"]
    r = CliRunner().invoke(main, ["pcap", "show", str(DATA / name), "--count", str(n)])
    assert r.exit_code == 0, r.output
    assert r.output.count("(a header is cut short)") == n, r.output
    partial = name == "golden_short_sll2.pcap"  # scapy reads the 12-byte one's first fields
    assert r.output.count("too few for scapy to read the") == n - partial, r.output
    r = CliRunner().invoke(main, ["pcap", "show", str(DATA / name), "--count", "9", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    raw = (DATA / name).read_bytes()
    assert [p["index"] for p in rows] == list(range(n))
    for p in rows[: n - partial]:
        assert p["header_cut"] and "layers" not in p and "header" in p["problem"]
        assert bytes.fromhex(p["bytes"]) in raw and len(p["bytes"]) == 2 * p["caplen"]
    # `analyze` reads the same files: every packet a cut header
    r = CliRunner().invoke(main, ["analyze", str(DATA / name), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["cut_headers"] == n


def test_pcap_show_json_has_scapy_layers_and_fields():
    r = CliRunner().invoke(
        main, ["pcap", "show", str(DATA / "golden_roce.pcap"), "--index", "0", "--json"]
    )
    assert r.exit_code == 0, r.output
    (p,) = json.loads(r.output)
    assert p["index"] == 0 and p["linktype"] == "Ethernet"
    layers = [x["layer"] for x in p["layers"]]
    assert layers[:3] == ["Ethernet", "IP", "UDP"]
    assert p["layers"][2]["fields"]["dport"] == 4791


def test_figures_read_with_one_unit_and_a_group_with_its_spread():
    from aifabric.analysis.render import _cell, fmt

    assert fmt(400 * 10**9, "rate") == "400Gbps"
    assert fmt(0, "rate") == "0bps" and fmt(500, "rate") == "500bps"  # not 0bpsbps
    assert fmt(2.7, "int") == "3" and fmt(1234.0, "int") == "1,234"  # a mean over runs
    assert _cell(96.43e9, "rate", 17.17e6) == "96.43Gbps ±17.17Mbps"
    assert _cell(96.42e9, "rate", 0.0) == "96.42Gbps ±0bps"
    assert _cell(5_220_000, "time", None) == "5.22ms" and _cell(None, "time", 5) == "-"
