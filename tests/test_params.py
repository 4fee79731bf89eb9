"""The CLI's parameter types: quantities parsed by fabric.units, choices from library tables."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from aifabric.cli import ecmp, main
from aifabric.fabric.routing import POLICIES
from aifabric.params import GPUS, RATE, SIZE, TIME, choice
from aifabric.traffic.collectives import KINDS


@click.command()
@click.option("--size", type=SIZE)
@click.option("--rate", type=RATE)
@click.option("--time", type=TIME)
@click.option("--gpus", type=GPUS)
def probe(**values):
    click.echo(repr(sorted(values.items())))


def call(*args):
    return CliRunner().invoke(probe, list(args))


def test_quantities_become_ints_in_base_units():
    r = call("--size", "64MiB", "--rate", "400G", "--time", "1.5us", "--gpus", "16")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == repr(
        [("gpus", 16), ("rate", 400 * 10**9), ("size", 64 * 2**20), ("time", 1500)]
    )
    r = call("--size", "4096", "--time", "250", "--gpus", "all")
    assert "('size', 4096)" in r.output and "('time', 250)" in r.output
    assert "('gpus', 'all')" in r.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--size", "12Q"], ["--size", "'12Q' is not a size"]),
        (["--rate", "fast"], ["--rate", "'fast' is not a rate"]),
        (["--time", "-2us"], ["--time", "is not a time"]),
        (["--gpus", "0"], ["--gpus", "positive number of GPUs"]),
        (["--gpus", "many"], ["--gpus", "'many'"]),
    ],
)
def test_bad_quantities_are_usage_errors(args, words):
    r = call(*args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for w in words:
        assert w in r.output, r.output


def test_choices_come_from_the_library_tables():
    policy = next(p for p in ecmp.params if p.name == "policy")
    assert tuple(policy.type.choices) == POLICIES
    show = main.commands["traffic"].commands["show"]
    algorithm = next(p for p in show.params if p.name == "algorithm")
    named = {a for c in KINDS.values() for a in c.algorithms}
    assert set(algorithm.type.choices) == {"auto", *named}
    assert list(choice(("a", "b")).choices) == ["a", "b"]
    from aifabric.emu.net import SWITCHES
    from aifabric.fabric.routing import EMULATOR_POLICY

    for command in ("run", "crosscheck"):
        switch = next(p for p in main.commands[command].params if p.name == "switch")
        assert tuple(switch.type.choices) == tuple(EMULATOR_POLICY) == SWITCHES


def test_ecmp_names_uplinks_as_the_fabric_does():
    import json

    r = CliRunner().invoke(main, ["ecmp", "lab-small", "--flows", "50", "--json"])
    assert r.exit_code == 0, r.output
    from aifabric.topologies import load_fabric

    names = set(load_fabric("lab-small").port_names)
    uplinks = [u for t in json.loads(r.output)["tiers"] for u in t["links"]]
    assert uplinks and set(uplinks) <= names
