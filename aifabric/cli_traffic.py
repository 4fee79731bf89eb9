"""`aifabric traffic ...`: workloads shown and exported (registered on import by aifabric.cli)."""

from __future__ import annotations

import click

from aifabric.cli import SEED, Group, emit_json, force_option, json_option, main, output_file
from aifabric.table import render

# Options that turn a bare collective or pattern name into a one-job workload.
_SPEC_OPTIONS = (
    ("algorithm", str, "Ring, tree, halving-doubling, pairwise, p2p."),
    ("size", str, "Bytes of the op, or per flow for patterns (e.g. 64MiB)."),
    ("gpus", str, 'GPUs of the job, or "all".'),
    ("placement", click.Choice(["packed", "fragmented", "rail-aligned"]), "Job placement."),
    ("channels", int, "Parallel rings or trees."),
    ("qps", int, "QPs per connection."),
    ("qp-mode", click.Choice(["split", "round-robin"]), "QP scaling mode."),
    ("chunk", str, "Chunk (message) size."),
    ("window", int, "Clear-to-send: outstanding chunks per channel."),
    ("segments", int, "Pipelined flows per connection (0: one per step)."),
    ("root", int, "Broadcast root rank."),
    ("stages", int, "Sendrecv pipeline stages."),
    ("iterations", int, "Times the op runs."),
    ("senders", int, "Incast senders."),
    ("flows", int, "Uniform: number of flows."),
    ("distribution", click.Choice(["fixed", "exponential", "pareto"]), "Uniform: sizes."),
    ("load", float, "Uniform: offered load per NIC (0..1)."),
)


def _size(nbytes: int) -> str:
    """Bytes with a binary prefix and up to two decimals (sizes here rarely divide evenly)."""
    for scale, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f}".rstrip("0").rstrip(".") + suffix
    return f"{nbytes}B"


def spec_options(f):
    f = click.option(
        "--hierarchical/--flat",
        default=None,
        help="Intra-server step on NVLink, rails on the fabric.",
    )(f)
    for name, kind, text in reversed(_SPEC_OPTIONS):
        f = click.option(f"--{name}", type=kind, default=None, help=text)(f)
    return f


fabric_option = click.option(
    "--fabric", "fabric_name", required=True, help="Topology preset or TOML file."
)
seed_option = click.option("--seed", type=SEED, default=0, show_default=True)


@main.group(cls=Group)
def traffic():
    """Workloads: collectives, patterns and training iterations as flows."""


def _workload(source: str, options: dict):
    from traffic import load_workload, workload_from_dict
    from traffic.spec import COLLECTIVES, PATTERNS

    given = {k.replace("-", "_"): v for k, v in options.items() if v is not None}
    if source in COLLECTIVES or source in PATTERNS:
        table = {"collective" if source in COLLECTIVES else "pattern": source, **given}
        if "gpus" in table:
            gpus = table["gpus"]
            table["gpus"] = int(gpus) if gpus.isdigit() else gpus
        return workload_from_dict(table, source), table
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise click.UsageError(
            f"{flags} apply to a collective or pattern name (e.g. allreduce), not to {source}"
        )
    workload = load_workload(source)
    return workload, workload.raw


def _build(source, fabric_name, seed, options):
    from topologies import load_fabric
    from traffic import generate

    workload, _ = _workload(source, options)
    fabric = load_fabric(fabric_name)
    return workload, fabric, generate(fabric, workload, seed=seed)


@traffic.command("presets")
@json_option
def traffic_presets(as_json):
    """List the workload presets."""
    from traffic import load_workload, workload_presets

    rows = [{"name": n, "description": load_workload(n).description} for n in workload_presets()]
    if as_json:
        emit_json(rows)
    else:
        click.echo(render(["preset", "description"], [r.values() for r in rows]))


@traffic.command("show")
@click.argument("workload")
@fabric_option
@seed_option
@spec_options
@json_option
def traffic_show(workload, fabric_name, seed, as_json, **options):
    """Per op: bytes, flows, steps, bytes per rank, ideal time, busbw factor.

    WORKLOAD is a preset, a TOML file, or a collective or pattern name with options
    (e.g. `allreduce --algorithm ring --size 64MiB --gpus 128`).
    """
    from fabric.units import format_time
    from topologies import load_fabric
    from traffic.generate import MAX_FLOWS
    from traffic.stats import describe

    wl, _ = _workload(workload, options)
    fabric = load_fabric(fabric_name)
    s = describe(fabric, wl, seed=seed)
    if as_json:
        emit_json({"workload": wl.name, "seed": seed, **s})
        return
    deps = "" if s["closed_form"] else f"{s['dependencies']:,} dependencies, "
    click.echo(
        f"{wl.name} on {fabric.name}: {len(wl.jobs)} job(s), {len(s['ops']):,} ops, "
        f"{s['flows']:,} flows, {deps}{_size(s['bytes'])} on the fabric"
    )
    if s["closed_form"]:
        click.echo(
            f"(in closed form: more flows than the {MAX_FLOWS:,} a flow table holds, "
            "so `traffic export` needs fewer GPUs)"
        )
    click.echo()
    groups: dict[tuple, list] = {}
    for op in s["ops"]:
        key = (op["job"], op["kind"], op["algorithm"], op["size_bytes"], op["ranks"], op["groups"])
        groups.setdefault(key, []).append(op)
    rows = []
    for (job, kind, algorithm, size, ranks, n_groups), ops in groups.items():
        op = ops[0]
        rows.append(
            [
                job,
                f"{len(ops)}",
                kind,
                algorithm,
                _size(size),
                f"{ranks:,}" + (f"x{n_groups:,}" if n_groups > 1 else ""),
                f"{op['flows']:,}",
                f"{op['steps']:,}",
                _size(op["bytes"]),
                _size(op["max_rank_bytes"]),
                format_time(op["ideal_ns"]),
                f"{op['busbw_factor']:.3f}",
            ]
        )
    click.echo(
        render(
            [
                "job",
                "ops",
                "op",
                "algorithm",
                "size",
                "ranks",
                "flows",
                "steps",
                "bytes",
                "per rank",
                "ideal",
                "busbw x",
            ],
            rows,
        )
    )
    total_ns = sum(op["ideal_ns"] for op in s["ops"])
    click.echo()
    click.echo(f"ideal time, ops one after another: {format_time(total_ns)}")


@traffic.command("export")
@click.argument("workload")
@fabric_option
@seed_option
@spec_options
@click.option(
    "-o",
    "--output",
    required=True,
    help="The .npz file to write.",
)
@force_option
def traffic_export(workload, fabric_name, seed, output, force, **options):
    """Write the flow table of WORKLOAD on a fabric as one .npz (numpy alone loads it)."""
    from fabric.errors import AifabricError

    if not output.endswith(".npz"):
        raise click.UsageError(f"-o {output}: the flow table is written as a .npz file")
    output_file(output, force)
    _, _, table = _build(workload, fabric_name, seed, options)
    try:
        table.save(output)
    except OSError as e:
        raise AifabricError(f"cannot write {output}: {e.strerror or e}") from None
    click.echo(f"wrote {output}: {len(table):,} flows, {len(table.op_id):,} ops", err=True)
