"""`aifabric calibrate LOG... --fabric F`: NCCL's cost model fitted to nccl-tests logs
(registered on import by aifabric.cli).

The logs are read by `aifabric.analysis.nccltests`, the model fitted by
`aifabric.traffic.nccl_calibrate`; the command prints the fit per size and writes the
[nccl] table.
"""

from __future__ import annotations

import click

from aifabric.cli import force_option, main, output_file
from aifabric.fabric.errors import AifabricError


@main.command("calibrate")
@click.argument("logs", nargs=-1, required=True, metavar="LOG...")
@click.option(
    "--fabric",
    "fabric_source",
    required=True,
    metavar="PRESET|FILE",
    help="The fabric the logs ran on: its NICs' link rate is the model's line rate.",
)
@click.option(
    "-o", "--output", default="nccl.toml", show_default=True, help="The [nccl] TOML table to write."
)
@click.option("--algorithm", type=click.Choice(["ring", "tree"]), default="ring", show_default=True)
@click.option(
    "--protocol",
    type=click.Choice(["ll", "ll128", "simple", "auto"]),
    default="auto",
    show_default=True,
    help="auto: each size to the protocol whose fitted model is fastest.",
)
@click.option(
    "--ranks",
    type=click.IntRange(2),
    default=None,
    help="Ranks of the logs [default: their '#  Rank' lines].",
)
@click.option(
    "--collective",
    type=click.Choice(["allreduce", "allgather", "reducescatter", "alltoall"]),
    default=None,
    help="The test [default: the log's header].",
)
@click.option(
    "--fit-base",
    is_flag=True,
    help="Fit the base latency too (needs logs at two or more rank counts).",
)
@force_option
def calibrate(logs, fabric_source, output, algorithm, protocol, ranks, collective, fit_base,
              force):  # fmt: skip
    """Fit NCCL's cost model (per-step latency, protocol bandwidth) to nccl-tests logs
    (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf; their
    out-of-place columns) on FABRIC; print the fit per size and write an [nccl] table."""
    from aifabric.analysis.nccltests import fit_text, read_logs
    from aifabric.fabric.files import write_atomic
    from aifabric.fabric.units import format_rate
    from aifabric.topologies import load_fabric
    from aifabric.traffic import nccl_calibrate as nc

    output_file(output, force)
    logs = read_logs(logs, collective, ranks)
    fabric = load_fabric(fabric_source)
    rate = nc.nic_line_rate_bps(fabric)
    samples = nc.Samples(logs.size, logs.ranks, logs.time_us)
    f = nc.fit(logs.kind, algorithm, protocol, samples, rate, fit_base=fit_base)
    line_rate = f"NIC line rate {format_rate(int(rate))}bps"
    click.echo(fit_text(f, logs, f"{logs.kind} {algorithm} on {fabric.name} ({line_rate})"))
    comments = [
        f"aifabric calibrate: {', '.join(logs.described)} on fabric {fabric_source} "
        f"({line_rate}); {logs.kind} {algorithm} {'/'.join(f.protocols)}, "
        f"max |error| {100 * abs(f.error).max():.2f}%"
    ]
    try:
        write_atomic(output, nc.to_toml(nc.nccl_table(f), comments))
    except OSError as e:
        raise AifabricError(f"cannot write {output}: {e.strerror or e}") from None
    click.echo(f"wrote {output}", err=True)
