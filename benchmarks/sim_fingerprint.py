"""A digest of the simulator's numeric outputs, to show a change leaves results bit-identical.

    python benchmarks/sim_fingerprint.py [--save FILE | --compare FILE]
        [--loss-recovery go-back-n|selective] [--buffer-model shared|static]
        [--old-conventions] [--outcomes FILE [--against FILE]]

Runs every scenario preset (scenarios/presets), variants of two of them
that exercise what the presets do not (clear-to-send, spraying, DCQCN on an
incast), the cases (a) and (b) of bench_sim.py, and an LL tree AllReduce over
ai-zone's 3,072 GPUs (paced flows, trees' buffer windows: what neither the
presets nor the permutations hold); hashes each run's flow
records, port series, collective records, capture records and counters.
The port series in NEW_SERIES (added after earlier fingerprints were saved)
are hashed apart, as the case's `LABEL +new` entry, so that the digest of
everything else still compares with a file saved before they existed.
Prints one line per case; `--save` writes them to a JSON file and
`--compare` checks the entries it holds against one, exiting 1 on any
difference. Where a change alters results on purpose, `--outcomes FILE` writes
each case's flow completion times and counters as JSON, and `--against` an earlier
such file prints them side by side: the quantiles of the completion times, the largest
gap between the two distributions (Kolmogorov-Smirnov) and the counters.
`--buffer-model` runs every switch with that buffer model (static: the
per-port model every fingerprint saved before the shared-buffer model holds).
`--without-events` leaves the event counter out of the digest (a change that schedules
fewer events for the same results). `--old-conventions` runs every case with one ACK per
flow and flows finishing at the receiver (what the simulator did before those became
parameters), to compare with a file saved before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.stats import ks_2samp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_sim import BUFFER_MODEL, CASES, with_model  # noqa: E402

from aifabric import traffic  # noqa: E402
from aifabric.fabric.completion import collective_records  # noqa: E402
from aifabric.fabric.portseries import PortSamples  # noqa: E402
from aifabric.scenarios import load_scenario, scenario_presets  # noqa: E402
from aifabric.sim import Simulation  # noqa: E402
from aifabric.sim.engine import simulation_for  # noqa: E402
from aifabric.topologies import load_fabric  # noqa: E402

CAPTURED_NICS = 2  # the ports of the first NICs and of their switch are captured
NEW_SERIES = ("cnp_sent",)
# not hashed: the flow table's busbw factors, NCCL protocols and predicted times, copied into
# the records (no simulated result)
UNHASHED_COLLECTIVE_COLUMNS = ("busbw_factor", "protocol", "predicted_ns")
UNHASHED_COUNTERS: list = []  # counters left out of the digest (--without-events)


def hashed(parts: dict) -> str:
    h = hashlib.sha256()
    for part, fields in parts.items():
        for name in sorted(fields):
            value = np.asarray(fields[name])
            h.update(f"{part}.{name}:{value.dtype}:{value.shape}".encode())
            h.update(np.ascontiguousarray(value).tobytes())
    return h.hexdigest()


def dense(entries: dict) -> dict:
    """The port series as [samples, ports] arrays, as fingerprints hashed them before the
    simulator kept only entries: the digest does not depend on how they are stored."""
    ps = PortSamples.from_arrays(entries)
    out = {k: ps.dense(k) for k in ps.names}
    out.update(t_ns=ps.t_ns, port=ps.port, interval_ns=entries["interval_ns"])
    return out


def digest(sim: Simulation) -> tuple[str, str]:
    """The digest of the run without NEW_SERIES, and that of NEW_SERIES."""
    sim.close()
    rec = sim.flow_records()
    series = dense(sim.port_series())
    coll = collective_records(sim.flows, rec["start_ns"], rec["end_ns"])
    parts = {
        "flows": rec,
        "ports": {k: v for k, v in series.items() if k not in NEW_SERIES},
        "collectives": {k: v for k, v in coll.items() if k not in UNHASHED_COLLECTIVE_COLUMNS},
        "captures": {"records": sim.captures()},
        "counters": {
            k: v
            for k, v in sim.counters().items()
            if isinstance(v, int) and k not in UNHASHED_COUNTERS
        },
    }
    new = {"ports": {k: v for k, v in series.items() if k in NEW_SERIES}}
    return hashed(parts), hashed(new)


def outcomes(sim: Simulation) -> dict:
    """What a reader compares across a change of results: every finished flow's
    completion time (us) and the run's counters."""
    rec = sim.flow_records()
    done = rec["end_ns"] >= 0
    fct = np.sort(rec["end_ns"][done] - rec["start_ns"][done]) / 1e3
    counters = {k: v for k, v in sim.counters().items() if isinstance(v, int)}
    return {"fct_us": [round(float(x), 4) for x in fct], **counters}


def side_by_side(before: dict, after: dict) -> None:
    """Print each case's completion-time quantiles and counters, before and after."""
    keys = ("simulated_ns", "events", "ecn_marked", "pfc_frames", "drops", "retransmitted_bytes")
    for label, new in after.items():
        old = before.get(label)
        if old is None:
            continue
        a, b = np.asarray(old["fct_us"]), np.asarray(new["fct_us"])
        q = (0.5, 0.9, 0.99, 1.0)
        qa = " ".join(f"{x:9.2f}" for x in np.quantile(a, q)) if len(a) else "-"
        qb = " ".join(f"{x:9.2f}" for x in np.quantile(b, q)) if len(b) else "-"
        gap = ks_2samp(a, b).statistic if len(a) and len(b) else float("nan")
        print(f"{label}: {len(a)} -> {len(b)} flows done; KS {gap:.3f}")
        print(f"  FCT us p50 p90 p99 max  before {qa}")
        print(f"                          after  {qb}")
        print("  " + "; ".join(f"{k} {old[k]:,} -> {new[k]:,}" for k in keys))


def captured_ports(fabric) -> list[int]:
    ports = []
    for v in fabric.nic_ids[:CAPTURED_NICS]:
        p = int(fabric.nic_port[v])
        ports += [p, p ^ 1]
    return ports


OVERRIDE: dict = {}  # parameters every case takes (--loss-recovery, --old-conventions)
OLD_CONVENTIONS = {"ack_every": "flow", "finish": "receiver"}


def scenario_sim(scenario) -> Simulation:
    fabric = with_model(scenario.fabric)
    scenario = replace(
        scenario,
        fabric=fabric,
        cc_params={**scenario.cc_params, **OVERRIDE},
        captures=tuple(fabric.port_name(p) for p in captured_ports(fabric)),
    )
    return simulation_for(scenario)


def cases():
    for name in scenario_presets():
        yield name, lambda name=name: scenario_sim(load_scenario(name))
    variants = {
        "incast-pfc/cts": ("incast-pfc", {"cc": "cts", "cc_params": {"cts_chunk": "64KiB"}}),
        "incast-pfc/dcqcn": ("incast-pfc", {"cc": "dcqcn"}),
        "incast-lossy/cts": ("incast-lossy", {"cc": "cts", "cc_params": {"rto": "50us"}}),
        "ecmp-permutation/spray": ("ecmp-permutation", {"ecmp": "spray"}),
    }
    for label, (name, change) in variants.items():
        yield (
            label,
            lambda name=name, change=change: scenario_sim(replace(load_scenario(name), **change)),
        )
    for case in ("a", "b"):
        topo, make, size = CASES[case]

        def bench(topo=topo, make=make, size=size):
            fabric = with_model(load_fabric(topo))
            table = make(fabric, size, 1)
            return Simulation(
                fabric, table, ecmp="5tuple", seed=1, cc="none", sample_interval_ns=100_000,
                cc_params=OVERRIDE,
            )  # fmt: skip

        yield f"bench_sim ({case})", bench

    def paced_tree():
        fabric = with_model(load_fabric("ai-zone"))
        spec = dict(collective="allreduce", algorithm="tree", protocol="ll", size="1MiB")
        table = traffic.generate(fabric, traffic.workload_from_dict(spec, "tree"), seed=1)
        return Simulation(fabric, table, cc="none", cc_params=OVERRIDE)

    yield "ai-zone tree/ll", paced_tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--save", type=Path)
    group.add_argument("--compare", type=Path)
    ap.add_argument("--loss-recovery", choices=["go-back-n", "selective"])
    ap.add_argument("--buffer-model", choices=["shared", "static"])
    ap.add_argument("--old-conventions", action="store_true")
    ap.add_argument(
        "--without-events",
        action="store_true",
        help="leave the event counter out (a change that schedules fewer, same results)",
    )
    ap.add_argument("--outcomes", type=Path, help="write each case's FCTs and counters")
    ap.add_argument("--against", type=Path, help="an earlier --outcomes file to compare")
    args = ap.parse_args()
    if args.buffer_model:
        BUFFER_MODEL.append(args.buffer_model)
    if args.loss_recovery:
        OVERRIDE["loss_recovery"] = args.loss_recovery
    if args.old_conventions:
        OVERRIDE.update(OLD_CONVENTIONS)
    if args.without_events:
        UNHASHED_COUNTERS.append("events")
    out, seen = {}, {}
    for label, make in cases():
        sim = make()
        sim.run()
        out[label], out[f"{label} +new"] = digest(sim)
        seen[label] = outcomes(sim)
        print(f"{label:<26} {out[label][:16]}  +new {out[f'{label} +new'][:16]}", flush=True)
    if args.outcomes:
        args.outcomes.write_text(json.dumps(seen))
    if args.against:
        side_by_side(json.loads(args.against.read_text()), seen)
    if args.save:
        args.save.write_text(json.dumps(out, indent=1))
    if args.compare:
        before = json.loads(args.compare.read_text())
        differ = [k for k in before if before[k] != out.get(k)]
        if differ:
            print(f"DIFFERENT: {', '.join(differ)}")
            sys.exit(1)
        print(f"all {len(before)} digests in {args.compare} identical")


if __name__ == "__main__":
    main()
