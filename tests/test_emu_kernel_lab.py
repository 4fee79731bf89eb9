"""The Mininet engine's red and netem queue trees on Debian's full kernel, in QEMU (no root).

One boot of scripts/kernel-lab (about a minute under software emulation)
serves every test here; see tests/kernel_lab.py for what runs inside.
"""

from __future__ import annotations

import pytest

from tests import kernel_lab as K

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(K.unavailable() is not None, reason=str(K.unavailable())),
]
PAIRS = {p.name: p for p in K.pairs()}
DELAYED = [name for name, p in PAIRS.items() if p.tc.get("delay_ns")]


@pytest.fixture(scope="module")
def lab():
    results, console, _ = K.run()
    return results, console


def ints(values) -> list[int]:
    return [int(v) for v in values]


def floats(values) -> list[float]:
    return [float(v) for v in values]


def expected_tree(pair: K.Pair) -> set[str]:
    leaf = "red" if pair.tc["ecn"] == "red" else "bfifo"
    if pair.tc.get("delay_ns"):
        return {
            "htb/1:/root",
            "netem/10:/1:10",
            "tbf/30:/1:30",
            "netem/33:/30:1",
            f"{leaf}/31:/33:1",
        }
    return {"htb/1:/root", "pfifo/10:/1:10", "tbf/30:/1:30", f"{leaf}/31:/30:1"}


def test_debians_kernel_boots_with_the_queueing_modules(lab):
    r, console = lab
    assert r.get("kernel", [""])[0].endswith("-amd64"), console[-3000:]
    assert "module_failed" not in r, console[-3000:]
    assert r.get("exit") == ["0"], console[-3000:]


def test_the_guest_runs_iproute2s_ip_and_tc_not_busybox_applets(lab):
    """Whichever busybox the host has (busybox-static's shell prefers its own
    applets), the guest's `ip` and `tc` are the host's iproute2."""
    r, console = lab
    words = r.get("tools", [])
    assert words.count("utility,") == 2, console[-3000:]
    assert sum(w.startswith("iproute2-") for w in words) == 2, console[-3000:]


def test_the_kernel_probes_find_red_and_netem(lab):
    r, console = lab
    assert r.get("probe.red") == ["0"], console[-3000:]
    assert r.get("probe.netem") == ["0"], console[-3000:]


@pytest.mark.parametrize("name", list(PAIRS))
def test_the_plans_tc_lines_build_the_queue_tree(lab, name):
    r, console = lab
    assert r.get(f"apply.{name}") == ["0"], console[-3000:]
    assert set(r[f"tree.{name}"]) == expected_tree(PAIRS[name])


@pytest.mark.parametrize("name", DELAYED)
def test_netem_delays_both_classes_by_the_link_delay(lab, name):
    """Minimum RTT over the pings: at least twice the delay, since netem never
    releases a frame early; at most that plus the serialization of both frames,
    the stack's own RTT (measured on the undelayed pair in the same boot), and
    a fifth of the delay for timers firing late on the emulated CPU."""
    r, _ = lab
    pair = PAIRS[name]
    two_way_ms = 2 * pair.tc["delay_ns"] / 1e6
    wire_ms = 2 * (84 + 14) * 8 / pair.tc["rate_bps"] * 1e3
    base_ms = floats(r["rtt.base"])[2]
    for key in (f"rtt.{name}", f"rtt_cnp.{name}"):
        tx, rx = ints(r[key][:2])
        rtt_min = floats(r[key])[2]
        assert tx == rx > 0, (key, r[key])
        assert two_way_ms <= rtt_min <= two_way_ms + wire_ms + base_ms + 0.2 * two_way_ms, (
            key,
            rtt_min,
            two_way_ms,
        )


@pytest.mark.parametrize("name", list(PAIRS))
def test_dscp48_takes_the_cnp_class(lab, name):
    r, _ = lab
    sent = ints(r[f"rtt_cnp.{name}"][:1])[0]
    assert ints(r[f"cnp_packets.{name}"]) == [sent]


@pytest.mark.parametrize("name", list(PAIRS))
def test_pause_holds_the_queue_below_tbf_and_resume_releases_it(lab, name):
    r, console = lab
    tree = set(r[f"tree.{name}"])
    assert r[f"pause_apply.{name}"] == ["0"], console[-3000:]
    assert set(r[f"tree_paused.{name}"]) == tree
    tx, rx = ints(r[f"paused.{name}"][:2])
    assert tx == 5 and rx <= 1  # one frame's worth of tokens, then nothing
    backlog_bytes, backlog_packets = ints(r[f"paused_backlog.{name}"])
    assert backlog_packets >= tx - rx - 1 and backlog_bytes > 0
    assert r[f"resume_apply.{name}"] == ["0"], console[-3000:]
    assert set(r[f"tree_resumed.{name}"]) == tree
    tx, rx = ints(r[f"resumed.{name}"][:2])
    assert tx == rx > 0


def test_red_marks_an_ect_burst_and_drops_a_not_ect_one(lab):
    r, _ = lab
    marked0, early0, pdrop0 = ints(r["red_before.mark"])
    marked1, early1, pdrop1 = ints(r["red_ect.mark"])
    marked2, early2, pdrop2 = ints(r["red_not_ect.mark"])
    assert (marked0, early0, pdrop0) == (0, 0, 0)
    # ECT packets are marked, not dropped; a stray packet that cannot carry ECN (a neighbour
    # solicitation) may still be dropped early, so allow a few of those
    assert marked1 > 0 and early1 + pdrop1 <= 2 and early1 + pdrop1 < marked1 / 20
    assert marked2 == marked1 and early2 > 0
