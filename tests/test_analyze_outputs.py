"""`aifabric analyze` prints, byte for byte, what it printed before its metrics became
typed results: text, --json and --json --series, for every scenario preset (one of them
with a capture) and every capture of tests/data (`tests/analyze_outputs.py` recorded
them from the code of the dicts)."""

from __future__ import annotations

import json

import pytest

from tests import analyze_outputs as A

PRESETS = A.presets()
CAPTURES = A.captures()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("presets")
    out = {}
    for preset in PRESETS:
        A.simulate(preset, root / preset)
        out[preset] = root / preset
    return out


def fixed(name: str, variant: str) -> str:
    """The recorded output with the one bug the typed results fixed: a run's
    `congestion.per_port` rows of hot ports carried the `cost_ns` of their hot spot (ranking
    them wrote it into the row), the other ports' rows did not; `cost_ns` is a hot spot's
    figure (`hotspots`). Everything else stays byte for byte."""
    want = A.read_recorded(name, variant)
    if variant == "text" or name not in PRESETS:
        return want
    m = json.loads(want)
    for row in m["congestion"]["per_port"]:
        row.pop("cost_ns", None)
    return json.dumps(m, indent=2) + "\n"


def test_the_recorded_cost_on_per_port_rows_was_the_hot_spots():
    """What `fixed` removes was there, and only on the ports ranked as hot spots."""
    m = json.loads(A.read_recorded("demo", "json"))
    costly = {r["port"]: r["cost_ns"] for r in m["congestion"]["per_port"] if "cost_ns" in r}
    hot = {h["port"]: h["cost_ns"] for h in m["hotspots"]}
    assert hot and all(costly[port] == cost for port, cost in hot.items())
    assert len(costly) < len(m["congestion"]["per_port"])


def _same(name: str, variant: str, got: str) -> None:
    want = fixed(name, variant)
    if got == want:
        return
    if variant != "text":  # name the first key that differs
        a, b = json.loads(got), json.loads(want)
        assert a == b, f"{name} {variant}: the JSON differs"
    lines = [
        (i, x, y)
        for i, (x, y) in enumerate(zip(got.splitlines(), want.splitlines(), strict=False))
        if x != y
    ]
    raise AssertionError(f"{name} {variant}: first difference {lines[:1]} (or the length)")


def test_every_preset_and_capture_has_a_record():
    names = {p.name for p in A.RECORDED.iterdir()}
    for name in [*PRESETS, *(c.name for c in CAPTURES)]:
        for variant in A.VARIANTS:
            assert A.recorded_name(name, variant) in names, (name, variant)


@pytest.mark.parametrize("variant", list(A.VARIANTS))
@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_run_is_analyzed_as_before(runs, preset, variant):
    _same(preset, variant, A.analyze(runs[preset], variant))


@pytest.mark.parametrize("variant", list(A.VARIANTS))
@pytest.mark.parametrize("capture", CAPTURES, ids=[c.name for c in CAPTURES])
def test_a_capture_is_analyzed_as_before(capture, variant):
    _same(capture.name, variant, A.analyze(capture, variant))


def test_the_records_cover_what_the_typed_results_add_nothing_to(runs):
    """The run with a capture has its capture's metrics in the JSON (so the comparison
    above covers a run's captures), and the series variant has the series."""
    preset = next(iter(A.CAPTURED))
    m = json.loads(A.read_recorded(preset, "series"))
    assert len(m["captures"]) == 1 and m["captures"][0]["packets"] > 0
    assert "series" in m and "low_intervals" in m["throughput"]
