import functools

import pytest

from aifabric.topologies import load_fabric


@functools.cache
def fabric(name: str):
    """Presets are values: build each once per test session."""
    return load_fabric(name)


def run_scenario(folder, text: str):
    """The run directory of the scenario `text` run by `aifabric run` in `folder`."""
    from click.testing import CliRunner

    from aifabric.cli import main

    (folder / "s.toml").write_text(text)
    r = CliRunner().invoke(main, ["run", str(folder / "s.toml"), "-o", str(folder / "run")])
    assert r.exit_code == 0, r.output
    return folder / "run"


def pytest_collection_modifyitems(config, items):
    """`vmlab` tests (a QEMU guest, 5-20 minutes) and `slow` tests (the default suite stays
    near ten minutes; CI runs them after it) run only when -m names them."""
    markexpr = config.getoption("markexpr") or ""
    why = {
        "vmlab": "boots the VM lab for 5-20 minutes: run it with -m vmlab",
        "slow": "slow: run it with -m slow (CI does)",
    }
    for marker, reason in why.items():
        if marker in markexpr:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker(marker):
                item.add_marker(skip)


@pytest.fixture
def get_fabric():
    return fabric


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A small finished run directory (8 flows) that tests copy before they damage it."""
    from tests.test_analysis_run import make_run

    path = tmp_path_factory.mktemp("pristine") / "run"
    make_run(path, n_flows=8)
    return path


@pytest.fixture
def tiny(tmp_path):
    """A small sweepable scenario file (tests/test_sweep_overrides.TINY); a module with a
    `tiny` of its own uses that one."""
    from tests.test_sweep_overrides import TINY

    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path
