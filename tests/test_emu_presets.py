"""Every scenario preset on the Mininet engine completes, or is refused before anything is built
(root, slow).

Each preset runs on the topology it names with the engine's defaults (the
scale from the replay's probed capacity, the timeout from the estimate).
By default two presets run with routers, about two minutes each on a busy
2-core machine: incast-pfc (PFC) and link-failure (DCQCN, a link failing
mid-run). `AIFABRIC_PRESETS=router` runs every preset with routers, `all`
also with Open vSwitch bridges; the rest take longer (incast-lossy drops
millions of packets and resends them go-back-N: about 16 ms of fabric time,
over five minutes of wall time).
"""

from __future__ import annotations

import os

import pytest

from aifabric.emu import available

CHOICE = os.environ.get("AIFABRIC_PRESETS", "")
SWITCHES = ("router", "ovs") if CHOICE == "all" else ("router",)
DEFAULT_PRESETS = ("incast-pfc", "link-failure")

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the Mininet engine tests need root"),
    pytest.mark.skipif(os.geteuid() == 0 and available() is not None, reason=str(available())),
]


def _presets() -> list[str]:
    from aifabric.scenarios import scenario_presets

    return scenario_presets() if CHOICE in ("router", "all") else list(DEFAULT_PRESETS)


@pytest.mark.parametrize("switch", SWITCHES)
@pytest.mark.parametrize("name", _presets())
def test_a_preset_completes_or_is_refused_up_front(tmp_path, name, switch):
    from aifabric.emu import available as emu_available
    from aifabric.emu.clean import leftovers
    from aifabric.emu.engine import ENGINE
    from aifabric.engines import run_scenario
    from aifabric.fabric.errors import AifabricError
    from aifabric.fabric.rundir import Run
    from aifabric.scenarios import load_scenario

    if emu_available(switch) is not None:
        pytest.skip(str(emu_available(switch)))
    sc = load_scenario(name)
    try:
        ENGINE.session(sc, switch=switch)
    except AifabricError as e:
        # refused before anything is built, saying how long and what to change
        assert "would take at least" in str(e) and "--scale" in str(e), e
        assert not (tmp_path / "run").exists()
        return
    summary = run_scenario("mininet", sc, tmp_path / "run", options={"switch": switch})
    run = Run(tmp_path / "run")
    assert run.status == "complete", run.meta["message"]
    assert summary["flows_done"] == len(sc.flows)
    assert summary["bytes_received"] == int(sc.flows.bytes.sum())
    left = leftovers()
    assert not any(left.values()), left
