"""`aifabric calibrate LOG... --fabric F`: NCCL's cost model fitted to nccl-tests logs
(registered on import by aifabric.cli).

The logs are read by `aifabric.analysis.nccltests`, the model fitted by
`aifabric.traffic.nccl_calibrate`; the command prints the fit per size and writes the
[nccl] table.
"""

from __future__ import annotations

from pathlib import Path

import click

from aifabric.cli import force_option, main, output_file
from aifabric.fabric.errors import AifabricError


def _kinds():
    from aifabric.traffic.nccl_calibrate import KINDS

    return KINDS


def _samples(logs, collective: str | None, ranks: int | None):
    """(kind, Samples, per-log description) of the logs, which must be of one test."""
    import numpy as np

    from aifabric.analysis.nccltests import TESTS, read_log
    from aifabric.traffic.nccl_calibrate import Samples

    kinds, size, n, time_us, described = set(), [], [], [], []
    for path in logs:
        log = read_log(path)
        kind = collective or (log.test.kind if log.test else None)
        if kind is None:
            raise AifabricError(
                f"{path} does not say which test it is (no '# Collective test starting:' "
                "line); give --collective"
            )
        if log.test is not None and collective and log.test.kind != collective:
            raise AifabricError(f"{path} is {log.test.program}, not --collective {collective}")
        count = ranks or log.ranks
        if count is None:
            raise AifabricError(
                f"{path} does not list its ranks (no '#  Rank  0 Group ...' lines); give --ranks"
            )
        kinds.add(kind)
        size += [r.size for r in log.rows]
        time_us += [r.time_us for r in log.rows]
        n += [count] * len(log.rows)
        described.append(f"{Path(path).name} ({TESTS[kind].program}, {count} ranks)")
    if len(kinds) > 1:
        raise AifabricError(f"the logs are of several tests ({', '.join(sorted(kinds))})")
    arrays = Samples(np.array(size), np.array(n), np.array(time_us))
    return kinds.pop(), arrays, described


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
    from aifabric.analysis.table import render
    from aifabric.fabric.files import write_atomic
    from aifabric.fabric.units import format_rate
    from aifabric.topologies import load_fabric
    from aifabric.traffic import nccl_calibrate as nc

    output_file(output, force)
    kind, samples, described = _samples(logs, collective, ranks)
    fabric = load_fabric(fabric_source)
    rate = nc.nic_line_rate_bps(fabric)
    f = nc.fit(kind, algorithm, protocol, samples, rate, fit_base=fit_base)
    several = len(set(samples.ranks.tolist())) > 1
    click.echo(
        render(
            ["size (B)", *(["ranks"] if several else []), "protocol", "measured us",
             "fitted us", "error %"],
            [
                [int(samples.size[i]), *([int(samples.ranks[i])] if several else []),
                 f.protocol[i], f"{samples.time_us[i]:.2f}", f"{f.fitted_us[i]:.2f}",
                 f"{100 * f.error[i]:+.2f}"]
                for i in range(len(samples))
            ],
            title=f"{kind} {algorithm} on {fabric.name} (NIC line rate "
            f"{format_rate(int(rate))}bps)",
        )
    )  # fmt: skip
    click.echo()
    click.echo(
        render(
            ["protocol", "sizes", "base latency us", "net latency us", "bandwidth factor"],
            [
                [p.protocol, p.rows, f"{p.base_latency_us:.4g}{'' if fit_base else ' (default)'}",
                 f"{p.net_latency_us:.4g}", f"{p.bandwidth_factor:.4g}"]
                for p in f.protocols.values()
            ],
            title=f"fitted; max |error| {100 * abs(f.error).max():.2f}%",
        )
    )  # fmt: skip
    comments = [
        f"aifabric calibrate: {', '.join(described)} on fabric {fabric_source} "
        f"(NIC line rate {format_rate(int(rate))}bps); {kind} {algorithm} "
        f"{'/'.join(f.protocols)}, max |error| {100 * abs(f.error).max():.2f}%"
    ]
    try:
        write_atomic(output, nc.to_toml(nc.nccl_table(f), comments))
    except OSError as e:
        raise AifabricError(f"cannot write {output}: {e.strerror or e}") from None
    click.echo(f"wrote {output}", err=True)
