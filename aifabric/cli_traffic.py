"""`aifabric traffic ...`: workloads shown and exported (registered on import by aifabric.cli)."""

from __future__ import annotations

import click

from aifabric.analysis.table import render
from aifabric.cli import SEED, Group, emit_json, force_option, json_option, main, output_file
from aifabric.params import GPUS, SIZE, choice


def _spec(name: str):
    """A table of aifabric.traffic.spec, read when a command line is parsed (not at startup)."""

    def names():
        import aifabric.traffic.spec

        return getattr(aifabric.traffic.spec, name)

    return names


# Options that turn a bare collective or pattern name into a one-job workload.
_SPEC_OPTIONS = (
    ("algorithm", choice(_spec("ALGORITHMS")),
     "Collective algorithm (auto, the default: NCCL's cost model picks it)."),
    ("protocol", choice(_spec("PROTOCOLS")),
     "NCCL protocol (auto, the default: NCCL's cost model picks it)."),
    ("size", SIZE, "Bytes of the op, or per flow for patterns (e.g. 64MiB)."),
    ("gpus", GPUS, 'GPUs of the job, or "all".'),
    ("placement", choice(_spec("PLACEMENTS")), "Job placement."),
    ("channels", int, "Parallel rings or trees."),
    ("qps", int, "QPs per connection."),
    ("qp-mode", choice(_spec("QP_MODES")), "QP scaling mode."),
    ("chunk", SIZE, "Chunk (message) size."),
    ("window", int, "Clear-to-send: outstanding chunks per channel."),
    ("root", int, "Broadcast root rank."),
    ("stages", int, "Sendrecv pipeline stages."),
    ("iterations", int, "Times the op runs."),
    ("senders", int, "Incast senders."),
    ("flows", int, "Uniform: number of flows."),
    ("distribution", choice(_spec("DISTRIBUTIONS")), "Uniform: sizes."),
    ("load", float, "Uniform: offered load per NIC (0..1)."),
)  # fmt: skip


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
output_option = click.option("-o", "--output", required=True, help="The .npz flow table to write.")


@main.group(cls=Group)
def traffic():
    """Workloads: collectives, patterns, training iterations and traffic matrices as flows."""


def _workload(source: str, options: dict):
    """WORKLOAD and its options as the library's workload (options only for bare names)."""
    from aifabric.traffic.spec import named_job, workload_of

    given = {k.replace("-", "_"): v for k, v in options.items() if v is not None}
    if given and not named_job(source):
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise click.UsageError(
            f"{flags} apply to a collective or pattern name (e.g. allreduce), not to {source}"
        )
    return workload_of(source, given)


@traffic.command("presets")
@json_option
def traffic_presets(as_json):
    """List the workload presets."""
    from aifabric.traffic import load_workload, workload_presets

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
    """Per op: bytes, flows, steps, bytes per rank, ideal times, busbw factor.

    Two ideal times: at line rate (the busiest NIC's bytes at its rate) and NCCL's
    cost-model time for the op's algorithm and protocol on an idle fabric.

    WORKLOAD is a preset, a TOML file, a traffic-matrix file (.npz, .csv, htsim), or a
    collective or pattern name with options (e.g. `allreduce --size 64MiB --gpus 128`).
    """
    from aifabric.topologies import load_fabric
    from aifabric.traffic.summary import show

    s = show(load_fabric(fabric_name), _workload(workload, options), seed)
    if as_json:
        emit_json(s)
    else:
        click.echo(_show_text(s))


def _show_text(s: dict) -> str:
    from aifabric.fabric.units import format_time
    from aifabric.traffic.generate import MAX_FLOWS

    deps = "" if s["closed_form"] else f"{s['dependencies']:,} dependencies, "
    lines = [
        f"{s['workload']} on {s['fabric']}: {s['jobs']} job(s), {len(s['ops']):,} ops, "
        f"{s['flows']:,} flows, {deps}{_size(s['bytes'])} on the fabric"
    ]
    if s["closed_form"]:
        lines.append(
            f"(in closed form: more flows than the {MAX_FLOWS:,} a flow table holds, "
            "so `traffic export` needs fewer GPUs)"
        )
    rows = [
        [
            g["job"], f"{g['count']}", g["kind"], g["algorithm"], g["protocol"] or "-",
            _size(g["size_bytes"]),
            f"{g['ranks']:,}" + (f"x{g['groups']:,}" if g["groups"] > 1 else ""),
            f"{g['flows']:,}", f"{g['steps']:,}", _size(g["bytes"]),
            _size(g["max_rank_bytes"]), format_time(g["ideal_ns"]),
            format_time(g["predicted_ns"]) if g["protocol"] else "-",
            f"{g['busbw_factor']:.3f}",
        ]
        for g in s["op_groups"]
    ]  # fmt: skip
    head = ["job", "ops", "op", "algorithm", "protocol", "size", "ranks", "flows", "steps",
            "bytes", "per rank", "ideal", "NCCL model", "busbw x"]  # fmt: skip
    lines += ["", render(head, rows), "", f"ideal time, ops one after another: "
              f"{format_time(s['ideal_ns'])} at line rate, "
              f"{format_time(s['predicted_ns'])} by NCCL's cost model (collectives)"]  # fmt: skip
    compute = {op["job"]: op["compute_ns"] for op in s["ops"] if op.get("compute_ns")}
    for job, ns in compute.items():
        lines.append(
            f"job {job}: compute {format_time(ns)} per iteration, its lower bound; each op "
            "waits for its compute (aifabric analyze shows what was exposed)"
        )
    return "\n".join(lines)


def _check_output(output: str, force: bool) -> None:
    """Before any work: a .npz name, a folder that exists, no file overwritten unasked."""
    if not output.endswith(".npz"):
        raise click.UsageError(f"-o {output}: the flow table is written as a .npz file")
    output_file(output, force)


def _save(table, output: str) -> None:
    from aifabric.fabric.errors import AifabricError

    try:
        table.save(output)
    except OSError as e:
        raise AifabricError(f"cannot write {output}: {e.strerror or e}") from None


@traffic.command("export")
@click.argument("workload")
@fabric_option
@seed_option
@spec_options
@output_option
@force_option
def traffic_export(workload, fabric_name, seed, output, force, **options):
    """Write the flow table of WORKLOAD on a fabric as one .npz (numpy alone loads it)."""
    from aifabric.topologies import load_fabric
    from aifabric.traffic import generate

    _check_output(output, force)
    table = generate(load_fabric(fabric_name), _workload(workload, options), seed=seed)
    _save(table, output)
    click.echo(f"wrote {output}: {len(table):,} flows, {len(table.op_id):,} ops", err=True)


@traffic.command("import")
@click.argument("matrix", type=click.Path(exists=True, dir_okay=False))
@fabric_option
@seed_option
@output_option
@force_option
def traffic_import(matrix, fabric_name, seed, output, force):
    """Convert a traffic matrix (.npz flow table, .csv or htsim connection matrix) into the
    flow table of a fabric. docs/traffic.md describes the formats."""
    from aifabric.topologies import load_fabric
    from aifabric.traffic import import_flows

    _check_output(output, force)
    table = import_flows(matrix, load_fabric(fabric_name), seed=seed)
    _save(table, output)
    click.echo(f"wrote {output}: {len(table):,} flows", err=True)
