import functools

import pytest

from topologies import load_fabric


@functools.cache
def fabric(name: str):
    """Presets are values: build each once per test session."""
    return load_fabric(name)


@pytest.fixture
def get_fabric():
    return fabric
