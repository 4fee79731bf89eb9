"""The `aifabric` command: one click group, thin commands, library code does the work.

Errors a user can cause (`AifabricError`) become one sentence and exit 1;
misuse of the command line is click's usage error, exit 2.
"""

from __future__ import annotations

import atexit
import gc
import json
import sys

import click

from aifabric.analysis.table import render
from aifabric.fabric import __version__
from aifabric.fabric.errors import AifabricError
from aifabric.params import choice

# The library is imported by the commands that use it: `aifabric --version` and
# `--help` stay free of numpy and numba, and a command pays only for its own.

# At exit, Python's last garbage collections walk every object numba and numpy
# made (about 0.15 s of CPU, a third of a small run); frozen objects are skipped
# and the operating system frees the memory. Finalizers and module teardown run.
atexit.register(gc.freeze)


def _export_formats():
    from aifabric.fabric.export import FORMATS

    return FORMATS


def _policies():
    from aifabric.fabric.routing import POLICIES

    return POLICIES


def _sport_rules():
    from aifabric.fabric.addressing import SPORT_RULES

    return SPORT_RULES


def emulated_switches():
    """The emulator's kinds of switch (`--switch`), each with the policy that hashes as it does."""
    from aifabric.fabric.routing import EMULATOR_POLICY

    return EMULATOR_POLICY


def loaded() -> None:
    """The command has loaded what it needs: collect garbage again (`aifabric.main` stops
    the collector while the command line loads), skipping every object loading made."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


NOTHING_TO_TEAR_DOWN: list[bool] = []  # `nothing_to_tear_down` was called


def nothing_to_tear_down() -> None:
    """Said by a command that has written all it writes and left nothing running (no
    thread, no child process, no file open): the program may end at once when it returns
    (`aifabric.__main__.command_line`)."""
    NOTHING_TO_TEAR_DOWN.append(True)


class Command(click.Command):
    """A command that collects garbage from its start (`loaded`)."""

    def invoke(self, ctx):
        loaded()
        return super().invoke(ctx)


class Group(click.Group):
    """A click group that turns library errors into one clear sentence."""

    command_class = Command

    def invoke(self, ctx):
        from aifabric.fabric.errors import AifabricError

        try:
            return super().invoke(ctx)
        except AifabricError as e:
            raise click.ClickException(str(e)) from None
        except BrokenPipeError:  # `aifabric ... | head`
            sys.stderr.close()
            ctx.exit(0)


def notice_compiles() -> None:
    """Until the command ends, say on stderr when numba compiles (a cache a new version emptied)."""
    from aifabric.warmup import compile_notice

    click.get_current_context().with_resource(compile_notice())


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
# A seed is any whole number from 0 (numpy's generators take no negative seed).
SEED = click.IntRange(min=0)
force_option = click.option("--force", is_flag=True, help="Overwrite the output file if it exists.")
# QP flows `aifabric ecmp` draws at most (about 20 us of CPU each: 2 million answer in under a
# minute; at 10 million it took minutes), and the memory each takes while it is hashed.
MAX_QP_FLOWS = 2_000_000
QP_FLOW_BYTES = 64


def output_file(output: str, force: bool) -> None:
    """Refuse, before any work, an output file that cannot be written or would be overwritten."""
    from pathlib import Path

    path = Path(output)
    if not output:
        raise AifabricError("the output file's name is empty")
    if path.is_dir():
        raise AifabricError(f"cannot write {output}: it is a directory")
    if not path.parent.exists():
        raise AifabricError(f"cannot write {output}: folder {path.parent} does not exist")
    if not path.parent.is_dir():
        raise AifabricError(f"cannot write {output}: {path.parent} is not a folder")
    if path.exists() and not force:
        raise AifabricError(f"{output} exists; give --force to overwrite it")


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aifabric")
def main():
    """A lab for the RoCE backend networks that train large models."""


@main.group(cls=Group)
def topo():
    """Topology presets, summaries and exports."""


@topo.command("presets")
@json_option
def topo_presets(as_json):
    """List the topology presets."""
    from aifabric.topologies import load, preset_names

    rows = []
    for name in preset_names():
        spec = load(name)
        rows.append({"name": name, "kind": spec.kind, "description": spec["fabric"]["description"]})
    if as_json:
        emit_json(rows)
    else:
        click.echo(render(["preset", "kind", "description"], [r.values() for r in rows]))


@topo.command("show")
@click.argument("source")
@json_option
def topo_show(source, as_json):
    """Summarize a topology: SOURCE is a preset name or a TOML file."""
    from aifabric.fabric.summary import summarize_fabric
    from aifabric.fabric.units import format_rate
    from aifabric.topologies import load_fabric

    s = summarize_fabric(load_fabric(source))
    if as_json:
        emit_json(s)
        return
    click.echo(
        f"{s['name']} ({s['kind']}): {sum(s['nodes'].values()):,} nodes, {s['links']:,} links"
    )
    click.echo()
    click.echo(
        render(
            ["tier", "nodes", "down", "up", "down:up"],
            [
                [
                    t["role"],
                    f"{t['count']:,}",
                    format_rate(t["down_bps"]) if t["down_bps"] else "-",
                    format_rate(t["up_bps"]) if t["up_bps"] else "-",
                    t["down_up"],
                ]
                for t in s["tiers"]
            ],
        )
    )
    click.echo()
    click.echo(
        render(
            ["links", "count", "rate", "delay"],
            [
                [c["between"], f"{c['count']:,}", c["rate"], f"{c['delay_ns']}ns"]
                for c in s["link_classes"]
            ],
        )
    )
    click.echo()
    click.echo(f"bisection bandwidth  {format_rate(s['bisection_bps'])}bps")
    click.echo(f"hop diameter         {s['hop_diameter']} links (NIC to NIC)")


@topo.command("export")
@click.argument("source")
@click.option(
    "--format",
    "fmt",
    type=choice(_export_formats),
    default="json",
    show_default=True,
)
@click.option(
    "-o",
    "--output",
    help="Write to a file instead of stdout.",
)
@force_option
def topo_export(source, fmt, output, force):
    """Export a topology as JSON (the run directory's topology.json), GraphML or DOT."""
    from aifabric.fabric.export import to_dot, to_graphml, topology_json
    from aifabric.topologies import load_fabric

    if output:
        output_file(output, force)
    fabric = load_fabric(source)
    if fmt == "json":
        text = topology_json(fabric)
    elif fmt == "graphml":
        text = to_graphml(fabric)
    else:
        text = to_dot(fabric)
    if output:
        from aifabric.fabric.files import write_atomic

        try:
            write_atomic(output, text)
        except OSError as e:
            raise AifabricError(f"cannot write {output}: {e.strerror or e}") from None
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


@main.command("ecmp")
@click.argument("source")
@click.option(
    "--flows",
    type=click.IntRange(1, MAX_QP_FLOWS),
    default=1000,
    show_default=True,
    help="Flows between random NICs in different racks.",
)
@click.option(
    "--policy",
    type=choice(_policies),
    default=None,
    help="ECMP policy [default: the first one listed].",
)
@click.option(
    "--qps",
    type=click.IntRange(1, 1024),
    default=1,
    show_default=True,
    help="QPs per flow (QP scaling).",
)
@click.option(
    "--sport",
    type=choice(_sport_rules),
    default=None,
    help="How NICs derive a QP's UDP source port from its QPNs [default: linux].",
)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option(
    "--same-seed", is_flag=True, help="Give every switch the same hash seed (shows polarization)."
)
@click.option(
    "--trials",
    type=click.IntRange(1, 1000),
    default=16,
    show_default=True,
    help="Draws for the uniform-hashing reference.",
)
@json_option
def ecmp(source, flows, policy, qps, sport, seed, same_seed, trials, as_json):
    """How ECMP spreads random flows over SOURCE's links, tier by tier (up and down), next
    to uniform hashing."""
    from aifabric.fabric.addressing import DEFAULT_SPORT
    from aifabric.fabric.spread import random_spread
    from aifabric.topologies import load_fabric

    if flows * qps > MAX_QP_FLOWS:
        raise AifabricError(
            f"--flows {flows:,} x --qps {qps:,} makes {flows * qps:,} QP flows, about "
            f"{flows * qps * QP_FLOW_BYTES / 1e9:,.1f} GB to hash; at most {MAX_QP_FLOWS:,}"
        )
    notice_compiles()
    result = random_spread(
        load_fabric(source),
        flows,
        policy or _policies()[0],
        qps=qps,
        seed=seed,
        same_seed=same_seed,
        trials=trials,
        sport=sport or DEFAULT_SPORT,
    )
    if as_json:
        emit_json(result)
    else:
        click.echo(_spread_text(result))


@main.command("warmup")
@click.option(
    "--processes", type=click.IntRange(min=1), default=None,
    help="Processes compiling at once on a full compile (default: one per core).",
)  # fmt: skip
def warmup(processes):
    """Compile the simulator's kernels now (scripts/install does it; once per version)."""
    from aifabric.warmup import run

    run(processes=processes)


def _spread_text(r: dict) -> str:
    head = (
        f"{r['fabric']}: {r['flows']:,} flows x {r['qps']} QP, policy {r['policy']}, "
        f"seed {r['seed']}"
        + (" (same seed on every switch)" if r["same_seed"] else "")
        + f"\nsource ports {r['sport']}: {r['ports_per_flow']:.2f} per flow, "
        f"{r['flows_all_ports_distinct']:.1%} of flows with one per QP; the uniform "
        f"reference draws once per {r['hash_units']:,} distinct hashed keys"
    )
    rows = [
        [
            t["tier"], f"{t['load']['bins']:,}", f"{t['qp_flows']:,}",
            f"{t['load']['max_mean']:.2f}", f"{t['expected']['max_mean']:.2f}",
            f"{t['load']['cv']:.3f}", f"{t['expected']['cv']:.3f}",
            f"{t['load']['jain']:.3f}", f"{t['expected']['jain']:.3f}",
        ]
        for t in r["tiers"]
    ]  # fmt: skip
    table = render(
        ["tier", "links", "QP flows", "max/mean", "uniform max/mean", "CV", "uniform CV", "Jain",
         "uniform Jain"],
        rows,
    )  # fmt: skip
    hists = [
        f"{t['tier']:<10} links carrying n QP flows  "
        + ", ".join(f"{k}: {v}" for k, v in t["flows_per_link"].items())
        for t in r["tiers"]
    ]
    lost = [f"{r['unreachable']} QP flows found no path"] if r["unreachable"] else []
    return "\n".join([head, table, "", *hists, *lost])


# Command modules add their commands to `main` when imported.
from aifabric import (  # noqa: E402, F401
    cli_analysis,
    cli_calibrate,
    cli_crosscheck,
    cli_emu,
    cli_run,
    cli_sweep,
    cli_traffic,
    cli_watch,
)
