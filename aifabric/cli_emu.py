"""`aifabric clean` and the Mininet engine's commands (registered on import by aifabric.cli)."""

from __future__ import annotations

import os

import click

from aifabric.cli import emit_json, json_option, main


@main.command("clean")
@json_option
def clean(as_json):
    """Remove what a killed Mininet run left: processes, links, bridges, namespaces, temp dirs."""
    if os.geteuid() != 0:
        raise click.ClickException("aifabric clean needs root (it removes namespaces and links)")
    from aifabric.emu.clean import clean as run_clean

    removed = run_clean()
    if as_json:
        emit_json(removed)
        return
    click.echo(
        f"removed {removed['processes']} processes, {removed['links']} links, "
        f"{removed['bridges']} bridges, {removed['namespaces']} namespaces, "
        f"{removed['tempdirs']} temporary directories"
    )
