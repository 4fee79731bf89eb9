"""The simulator on several partitions (aifabric.sim.partition): the same results as on one,
to the last counter and port sample, and one partition, saying why, where it cannot."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from numba import njit

from aifabric import topologies, traffic
from aifabric.cli import main
from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Role
from aifabric.scenarios import load_scenario
from aifabric.sim import Simulation, partition
from aifabric.sim import layout as L
from aifabric.sim import windows as W
from aifabric.sim.engine import simulation_for, write_captures


@pytest.fixture(scope="module")
def k8():
    return topologies.load_fabric("fat-tree-k8")


def flows(fabric, **spec):
    return traffic.generate(fabric, traffic.workload_from_dict(spec, "w"), seed=1)


def ran(fabric, table, parts, **kw) -> Simulation:
    sim = Simulation(fabric, table, partitions=parts, **kw)
    assert sim.run()
    sim.close()
    return sim


def differences(one: Simulation, many: Simulation) -> list[str]:
    """What differs between two runs' flow records, port series and counters."""
    out = []
    a, b = one.flow_records(), many.flow_records()
    out += [k for k in a if not np.array_equal(np.asarray(a[k]), np.asarray(b[k]))]
    pa, pb = one.port_series(), many.port_series()
    out += [
        f"ports.{k}"
        for k in pa
        if not np.array_equal(np.asarray(pa[k], np.int64), np.asarray(pb[k], np.int64))
    ]
    ca, cb = one.counters(), many.counters()
    out += [f"counters.{k}" for k in ca if ca[k] != cb[k]]
    return out


SELECTIVE = {"loss_recovery": "selective"}
RECEIVER = {"finish": "receiver"}
CASES = {
    "permutation": (dict(pattern="permutation", gpus=128, size="2MB"), {}),
    "permutation, DCQCN": (dict(pattern="permutation", gpus=128, size="2MB"), dict(cc="dcqcn")),
    "permutation, clear-to-send": (
        dict(pattern="permutation", gpus=128, size="1MB"),
        dict(cc="cts"),
    ),
    "permutation, finish at the receiver": (
        dict(pattern="permutation", gpus=128, size="1MB"),
        dict(cc_params=RECEIVER),
    ),
    "permutation, an ACK per packet": (
        dict(pattern="permutation", gpus=64, size="1MB"),
        dict(cc_params={"ack_every": 1}),
    ),
    "incast, DCQCN": (dict(pattern="incast", gpus=33, size="1MB"), dict(cc="dcqcn")),
    "uniform, selective repeat": (
        dict(pattern="uniform", gpus=32, size="256KB"),
        dict(cc_params={"loss_recovery": "selective"}),
    ),
    "permutation, sprayed, selective repeat": (
        dict(pattern="permutation", gpus=128, size="1MB"),
        dict(ecmp="spray", cc_params={"loss_recovery": "selective"}),
    ),
    "incast, sprayed, DCQCN, selective repeat": (
        dict(pattern="incast", gpus=33, size="1MB"),
        dict(ecmp="spray", cc="dcqcn", cc_params={"loss_recovery": "selective"}),
    ),
    "incast, sprayed, DCQCN, go-back-N (out of order: NAKs, timeouts at the senders)": (
        dict(pattern="incast", gpus=33, size="1MB"),
        dict(ecmp="spray", cc="dcqcn"),
    ),
    # each switch picks the next hop by its own queues; the hops after it, rewritten there
    # from what it holds of the next switches, are picked again at each of them
    "permutation, adaptive routing": (
        dict(pattern="permutation", gpus=128, size="2MB"),
        dict(ecmp="adaptive"),
    ),
    "ring AllReduce, adaptive routing, DCQCN": (
        dict(collective="allreduce", algorithm="ring", size="1MiB", gpus=64),
        dict(ecmp="adaptive", cc="dcqcn"),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_any_number_of_partitions_gives_the_results_of_one(k8, case):
    spec, kw = CASES[case]
    table = flows(k8, **spec)
    one = ran(k8, table, 1, **kw)
    assert one.partitioned["partitions"] == 1
    for parts in (2, 3, 4):
        many = ran(k8, table, parts, **kw)
        assert many.partitioned["partitions"] == parts, many.partitioned
        assert many.partitioned["windows"] > 10
        assert many.partitioned["outboxes_filled"] == 0
        assert differences(one, many) == [], parts


def test_a_partitioned_run_ends_at_its_last_flow_as_one_partition_does(k8):
    """The run stops after the event that completes its last flow, in every partition:
    the time, the events and the last sample row are those of one partition."""
    table = flows(k8, pattern="permutation", gpus=128, size="512KB")
    one = ran(k8, table, 1)
    many = ran(k8, table, 4)
    assert many.now_ns == one.now_ns == int(one.flow_records()["end_ns"].max())
    assert many.counters()["events"] == one.counters()["events"]
    assert many.sample_rows == one.sample_rows


def lossy(fabric, buffer_bytes: int):
    """Every switch with PFC off and a static buffer of `buffer_bytes` per port (ECN
    marking from a quarter to half of it): drops."""
    queues = {}
    for r in Role:
        if r != Role.NIC:
            q = fabric.queue(r)
            pfc = replace(q.pfc, enabled=False)
            ecn = replace(q.ecn, kmin_bytes=buffer_bytes // 4, kmax_bytes=buffer_bytes // 2)
            queues[r] = replace(q, model="static", buffer_bytes=buffer_bytes, ecn=ecn, pfc=pfc)
    return replace(fabric, queues={**fabric.queues, **queues})


LOSSY = {  # (workload, switch buffer, simulation options)
    "an incast from hosts across the fabric, selective repeat": (
        dict(pattern="incast", gpus=25, senders=24, size="512KB", placement="fragmented"),
        64 * 2**10, dict(cc_params=SELECTIVE),
    ),
    "a permutation, selective repeat (drops at uplinks, timeouts across the cut)": (
        dict(pattern="permutation", gpus=128, size="1MB"), 64 * 2**10,
        dict(cc_params=SELECTIVE),
    ),
    "an incast within one partition's racks, go-back-N": (
        dict(pattern="incast", gpus=128, senders=24, size="512KB"), 64 * 2**10, {},
    ),
    "a permutation, clear-to-send, selective repeat": (
        dict(pattern="permutation", gpus=128, size="1MB"), 64 * 2**10,
        dict(cc="cts", cc_params=SELECTIVE),
    ),
    "a permutation, go-back-N (timeouts across the cut)": (
        dict(pattern="permutation", gpus=128, size="1MB"), 64 * 2**10, {},
    ),
    "an incast from hosts across the fabric, go-back-N": (
        dict(pattern="incast", gpus=25, senders=24, size="512KB", placement="fragmented"),
        64 * 2**10, {},
    ),
    "a permutation, adaptive routing, go-back-N": (
        dict(pattern="permutation", gpus=128, size="1MB"), 64 * 2**10, dict(ecmp="adaptive"),
    ),
    "a permutation, adaptive routing, selective repeat": (
        dict(pattern="permutation", gpus=128, size="1MB"), 64 * 2**10,
        dict(ecmp="adaptive", cc_params=SELECTIVE),
    ),
    "a sprayed DCQCN permutation, go-back-N (last packets behind a gap), no drops": (
        dict(pattern="permutation", gpus=128, size="1MB"), None, dict(ecmp="spray", cc="dcqcn"),
    ),
    "a permutation, go-back-N, flows ending at their receivers (timeouts after the end)": (
        dict(pattern="permutation", gpus=128, size="1MB"), 64 * 2**10, dict(cc_params=RECEIVER),
    ),
    "a sprayed DCQCN permutation, flows ending at their receivers (NAKs after the end)": (
        dict(pattern="permutation", gpus=128, size="1MB"), None,
        dict(ecmp="spray", cc="dcqcn", cc_params=RECEIVER),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", LOSSY)
def test_runs_that_drop_give_the_results_of_one_partition(k8, case):
    """A drop's timeout is an event at the NIC that acts on it (a message to its partition,
    the timeout later), a go-back-N receiver in another partition hears a lookahead later
    that its flow lost data (EV_LOST: before the flow's next packet can arrive), and a
    go-back-N timeout reads only what its sender heard ACKed, so runs that drop, lost data
    sent again by NAK or by timeout, are one partition's. So are go-back-N runs sprayed
    out of order, where a flow's last packet behind a gap starts its sender's timeout."""
    spec, buffer_bytes, kw = LOSSY[case]
    fabric = k8 if buffer_bytes is None else lossy(k8, buffer_bytes)
    table = flows(fabric, **spec)
    one = ran(fabric, table, 1, **kw)
    counters = one.counters()
    assert counters["retransmitted_bytes"] > 0
    assert (counters["drops"] > 0) == (buffer_bytes is not None)
    for parts in (2, 3):
        many = ran(fabric, table, parts, **kw)
        assert many.partitioned["partitions"] == parts, many.partitioned
        assert differences(one, many) == [], parts


CAPTURED = {  # (workload, switch buffer, simulation options)
    "a lossy permutation, go-back-N: NAKs, timeouts, data sent again": (
        dict(pattern="permutation", gpus=128, size="512KB"), 64 * 2**10, {},
    ),
    "an incast, DCQCN: CNPs and PFC": (
        dict(pattern="incast", gpus=33, size="1MB"), None, dict(cc="dcqcn"),
    ),
    "a permutation, clear-to-send: requests and grants": (
        dict(pattern="permutation", gpus=64, size="512KB"), None, dict(cc="cts"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CAPTURED)
def test_captures_are_the_same_on_any_number_of_partitions(k8, case, tmp_path):
    """A captured port's frames are all its own partition's, and a control packet carries
    what its receiver took (not its sender's PSN): every port's pcap is byte for byte one
    partition's."""
    spec, buffer_bytes, kw = CAPTURED[case]
    fabric = k8 if buffer_bytes is None else lossy(k8, buffer_bytes)
    table = flows(fabric, **spec)
    ports = list(range(fabric.n_ports))  # every port, on both sides of every cut
    one = ran(fabric, table, 1, capture_ports=ports, **kw)
    kinds = set(one.captures()[:, L.CP_KIND].tolist())
    assert {L.K_DATA, L.K_ACK} <= kinds
    if kw.get("cc") == "dcqcn":
        assert {L.K_CNP, L.K_PFC} <= kinds
    if kw.get("cc") == "cts":
        assert {L.K_CTS, L.K_REQ} <= kinds
    if buffer_bytes is not None:  # NAKs among the ACKs
        assert one.counters()["drops"] > 0
        assert (one.captures()[:, L.CP_ARG][one.captures()[:, L.CP_KIND] == L.K_ACK] > 0).any()

    def pcaps(sim, name):
        out = tmp_path / name
        out.mkdir()
        folder = SimpleNamespace(capture_path=lambda port: out / f"{port}.pcap")
        write_captures(sim, folder, ports)
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    files = pcaps(one, "one")
    assert len(files) == len(ports)
    for parts in (2, 3):
        many = ran(fabric, table, parts, capture_ports=ports, **kw)
        assert many.partitioned["partitions"] == parts, many.partitioned
        assert differences(one, many) == [], parts
        assert pcaps(many, str(parts)) == files, parts


def test_the_lossy_preset_runs_on_partitions():
    """incast-lossy (PFC off, a small buffer, go-back-N): drops, and one partition's results
    on two."""
    sc = load_scenario("incast-lossy")
    kw = dict(cc=sc.cc, cc_params=sc.cc_params)
    one = ran(sc.fabric, sc.flows, 1, **kw)
    assert one.counters()["drops"] > 0
    many = ran(sc.fabric, sc.flows, 2, **kw)
    assert many.partitioned["partitions"] == 2, many.partitioned
    assert differences(one, many) == []


def _switch(fabric, name: str) -> int:
    return fabric.node_name.index(name)


FAULTS = {  # (workload, faults: (node or link, time in ns, action), simulation options)
    "an AllToAll, a CTSW drained and restored": (
        dict(collective="alltoall", algorithm="pairwise", size="1MiB", gpus=32),
        [("z0-ctsw0", 10_000, "drain"), ("z0-ctsw0", 40_000, "up")],
        {},
    ),
    "two ring AllReduces, DCQCN, an ATSW and a link drained": (
        dict(collective="allreduce", algorithm="ring", size="1MiB", gpus=64, iterations=2),
        [("p1-atsw0", 5_000, "drain"), (100, 30_000, "drain")],
        dict(cc="dcqcn"),
    ),
    "an AllToAll, two CTSWs drained at once, one back (E-ECMP, selective repeat)": (
        dict(collective="alltoall", algorithm="pairwise", size="1MiB", gpus=32),
        [("z0-ctsw0", 10_000, "drain"), ("z0-ctsw1", 10_000, "drain"), ("z0-ctsw0", 30_000, "up")],
        dict(ecmp="eecmp", cc="dcqcn", cc_params=SELECTIVE),
    ),
    "a permutation, linux (flows underway move), selective repeat": (
        dict(pattern="permutation", gpus=128, size="2MB"),
        [("p0-atsw0", 20_000, "drain"), ("p0-atsw0", 60_000, "up")],
        dict(ecmp="linux", cc_params=SELECTIVE),
    ),
    "a permutation, linux (flows underway move, out of order), go-back-N": (
        dict(pattern="permutation", gpus=128, size="2MB"),
        [("p0-atsw0", 20_000, "drain"), ("p0-atsw0", 60_000, "up")],
        dict(ecmp="linux"),
    ),
    "a permutation, an ATSW down and back (frames queued and in flight lost across cuts)": (
        dict(pattern="permutation", gpus=128, size="2MB"),
        [("p0-atsw0", 20_000, "down"), ("p0-atsw0", 60_000, "up")],
        {},
    ),
    "a permutation, linux, an ATSW down (flows underway move), go-back-N": (
        dict(pattern="permutation", gpus=128, size="2MB"),
        [("p0-atsw0", 20_000, "down")],
        dict(ecmp="linux"),
    ),
    "an AllToAll, a CTSW down, selective repeat": (
        dict(collective="alltoall", algorithm="pairwise", size="1MiB", gpus=32),
        [("z0-ctsw0", 10_000, "down")],
        dict(cc_params=SELECTIVE),
    ),
}  # fmt: skip


def _faults(fabric, plan):
    from aifabric.fabric.scenario import Fault

    return [
        Fault("link", what, at, action) if isinstance(what, int)
        else Fault("node", _switch(fabric, what), at, action)
        for what, at, action in plan
    ]  # fmt: skip


@pytest.mark.parametrize("case", FAULTS)
def test_faults_during_the_run_on_any_number_of_partitions(k8, case):
    """Windows end before a fault's time; the partitions share the flows it re-routes (each
    knows the flows it sends) and all re-route them, since both ends of a flow read its
    route; a link or switch taken down loses what each partition's own ports queued, at
    the fault's time, and the frames on its links where they arrive: flow records (routes
    and the routing that chose each included), port series and counters are one
    partition's, on threads spinning (2) or meeting by message (3)."""
    spec, plan, kw = FAULTS[case]
    table = flows(k8, **spec)
    faults = _faults(k8, plan)
    one = ran(k8, table, 1, faults=faults, **kw)
    assert (one.route_epoch > 0).any(), "no flow was re-routed: the case tests nothing"
    if "out of order" in case:  # receivers NAK'd the gaps, senders went back
        assert one.counters()["retransmitted_bytes"] > 0
    if any(action == "down" for _, _, action in plan):
        assert one.counters()["drops"] > 0
    for parts in (2, 3):
        many = ran(k8, table, parts, faults=faults, **kw)
        assert many.partitioned["partitions"] == parts, many.partitioned
        assert differences(one, many) == [], parts
        assert many.applied_faults == one.applied_faults


def test_a_link_down_under_a_deep_queue_purges_it_with_an_outbox_of_a_few_rows(k8, monkeypatch):
    """The link to a 64-to-1 incast's receiver goes down under its deep queue: the purge
    tells each lost packet's sender in another partition (its timeout), more rows than the
    outbox holds when it has room for a few, so the purge waits for the driver to keep
    rows aside and goes on, in the same order, at the fault's time. A frame in flight when
    its link went down is lost at the port it arrives at, which its own partition holds."""
    from aifabric.fabric.scenario import Fault

    table = flows(k8, pattern="incast", gpus=65, senders=64, size="1MB", placement="fragmented")
    link = int(k8.nic_port[int(table.dst[0])]) // 2
    faults = [Fault("link", link, 40_000, "down")]
    one = ran(k8, table, 1, faults=faults)
    assert one.counters()["drops"] > 100
    monkeypatch.setattr(partition, "out_rows", lambda sim, far, lookahead: 0)  # the least
    for parts in (2, 3):
        many = ran(k8, table, parts, faults=faults)
        assert many.partitioned["partitions"] == parts, many.partitioned
        assert many.partitioned["outboxes_filled"] > 100
        assert differences(one, many) == [], parts


def test_the_link_failure_preset_runs_on_partitions():
    """link-failure (an RTSW uplink down 50 us in, under DCQCN): one partition's results on
    two and three."""
    sc = load_scenario("link-failure")

    def on(parts):
        sim = simulation_for(replace(sc, partitions=parts))
        assert sim.run()
        sim.close()
        return sim

    one = on(1)
    assert one.counters()["drops"] > 0 and one.applied_faults
    for parts in (2, 3):
        many = on(parts)
        assert many.partitioned["partitions"] == parts, many.partitioned
        assert differences(one, many) == [], parts


COLLECTIVES = {
    "ring AllReduce, 4 QPs round-robin (steps with no bytes for some QPs)": dict(
        collective="allreduce", algorithm="ring", size="1MiB", gpus=64, qps=4,
        qp_mode="round-robin", chunk="64KiB",
    ),
    "tree AllReduce, 2 channels (buffers: credits)": dict(
        collective="allreduce", algorithm="tree", size="1MiB", gpus=64, channels=2
    ),
    "halving-doubling AllReduce (transfers that wait on transfers)": dict(
        collective="allreduce", algorithm="halving-doubling", size="1MiB", gpus=64
    ),
    "AllToAll": dict(collective="alltoall", algorithm="pairwise", size="1MiB", gpus=32),
    "64-byte ring AllReduce (steps of no bytes at all)": dict(
        collective="allreduce", algorithm="ring", size="64B", gpus=128
    ),
    "two AllGathers, one after the other": dict(
        collective="allgather", algorithm="ring", size="1MiB", gpus=128, iterations=2
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", COLLECTIVES)
def test_collectives_on_any_number_of_partitions_give_the_results_of_one(k8, case):
    """What one end of a collective's connection learns of the other (a step released, its
    buffer free, a transfer it waits on arrived or done) comes as a message, so each
    end may run in its own partition: the results are one partition's."""
    table = flows(k8, **COLLECTIVES[case])
    one = ran(k8, table, 1)
    for parts in (2, 3):
        many = ran(k8, table, parts)
        assert many.partitioned["partitions"] == parts, many.partitioned
        assert many.partitioned["windows"] > 10
        assert differences(one, many) == [], parts


def latencies(us: float) -> dict:
    """An [nccl] table with every latency `us`."""
    row = {row: {"ll": us, "ll128": us, "simple": us} for row in ("ring", "tree")}
    return dict(base_latency_us=row, net_latency_us=row, nvlink_latency_us=row)


def test_a_wait_shorter_than_a_link_shortens_the_windows(k8):
    """Latencies of 0.2 us, below the links' 500 ns: a ring's next step and op hear of
    the one they wait on, at a NIC another partition may hold, sooner than a frame crosses
    a link. The windows are that short instead, the run says why, and its results are one
    partition's."""
    table = flows(
        k8, collective="allgather", algorithm="ring", size="1MiB", gpus=128, iterations=2,
        nccl=latencies(0.2),
    )  # fmt: skip
    one = ran(k8, table, 1)
    for parts in (2, 3):
        many = ran(k8, table, parts)
        info = many.partitioned
        assert info["partitions"] == parts, info
        assert 0 < info["lookahead_ns"] < 500
        assert info["lookahead_by"] == "a transfer's wait for one at another partition"
        assert differences(one, many) == [], parts
    links = ran(k8, flows(k8, pattern="permutation", gpus=128, size="64KB"), 2)
    assert links.partitioned["lookahead_ns"] == 500 and "lookahead_by" not in links.partitioned


def test_a_wait_of_no_time_runs_on_one_partition_saying_why(k8):
    """Latencies of 0: a ring's next op hears at once that the one before it ended, at a
    NIC another partition may hold; no window is that short, and the run stays on one
    partition and says so."""
    table = flows(
        k8, collective="allgather", algorithm="ring", size="1MiB", gpus=128, iterations=2,
        nccl=latencies(0.0),
    )  # fmt: skip
    sim = ran(k8, table, 2)
    assert sim.partitioned["partitions"] == 1
    assert sim.partitioned["why"] == (
        "a transfer's wait for one at another partition takes no time (a message must take "
        "a window's time)"
    )
    assert differences(ran(k8, table, 1), sim) == []


def test_auto_leaves_a_small_run_on_one_partition(k8, monkeypatch):
    monkeypatch.setattr(partition, "cores", lambda: 4)
    sim = ran(k8, flows(k8, pattern="permutation", gpus=128, size="64KB"), "auto")
    assert sim.partitioned["partitions"] == 1
    assert "small run (128 flows" in sim.partitioned["why"]


def test_auto_leaves_a_job_on_a_few_racks_on_one_partition(k8, monkeypatch):
    """A job whose senders sit in one partition would leave the other's core spinning:
    auto runs it on one partition and says why; a job over the whole fabric gets two."""
    monkeypatch.setattr(partition, "cores", lambda: 2)
    monkeypatch.setattr(partition, "AUTO_FLOWS", 10)
    few = ran(k8, flows(k8, pattern="permutation", gpus=32, size="64KB"), "auto")
    assert few.partitioned["partitions"] == 1
    assert "sit mostly in one part of the fabric" in few.partitioned["why"]
    assert "the fewest has 0)" in few.partitioned["why"]
    whole = ran(k8, flows(k8, pattern="permutation", gpus=128, size="64KB"), "auto")
    assert whole.partitioned["partitions"] == 2


RESIDENT = """
import json, os
from aifabric import topologies, traffic
from aifabric.sim import Simulation, partition

def resident():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

fabric = topologies.load_fabric("fat-tree-k8")
spec = {"pattern": "permutation", "size": "64KiB"}
sim = Simulation(fabric, traffic.generate(fabric, traffic.workload_from_dict(spec, "w"), seed=1))
partition.PartitionedRun(sim, 2)  # loads what it calls
before = resident()
run = partition.PartitionedRun(sim, 2)
print(json.dumps({"grown": resident() - before, "buffers": sim.ev.nbytes + sim.smp.nbytes}))
"""


def test_a_partition_does_not_write_its_empty_event_list_and_sample_buffer_up_front():
    """Each partition gets an event list and a sample buffer of its own (fat-tree-k8:
    10 and 13 MB), from zero pages the kernel maps only where the run writes them. Copied
    or zeroed up front, two partitions wrote 46 MB before their first event; now 14 MB.
    In a process of its own, where no freed memory is resident to be reused."""
    out = subprocess.run([sys.executable, "-c", RESIDENT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    assert m["grown"] < m["buffers"], m


def test_racks_are_cut_into_partitions_of_as_many_nics(k8):
    for parts in (2, 3, 4):
        part = partition.assign(k8, parts)
        assert (part >= 0).all() and set(part.tolist()) == set(range(parts))
        nics = np.bincount(part[k8.node_role == Role.NIC], minlength=parts)
        assert nics.max() - nics.min() <= 16, nics  # whole racks of 16... or 4 NICs
        # a NIC is where its leaf is
        nic = np.flatnonzero(k8.node_role == Role.NIC)
        assert (part[nic] == part[k8.nic_switch[nic]]).all()
    part = partition.assign(k8, 2)
    far = partition.far_parts(k8, part)
    cut = far > 0
    assert cut.any() and not cut[k8.nic_port[nic]].any()  # no NIC link is cut
    assert (far[cut] - 1 == part[k8.port_peer[cut]]).all()
    assert partition.lookahead_ps(k8, part) == int(k8.port_delay_ns[cut].min()) * L.PS_PER_NS


def test_partitions_in_a_scenario_and_on_the_command_line(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        '[scenario]\ntopology = "fat-tree-k8"\n'
        '[workload]\npattern = "permutation"\ngpus = 128\nsize = "256KB"\n'
        "[simulator]\npartitions = 2\n"
    )
    assert load_scenario(path).partitions == 2
    assert load_scenario(path, overrides={"simulator.partitions": 1}).partitions == 1
    for bad in (0, -1, "many", 2.5, True):
        with pytest.raises(SpecError, match="simulator.partitions"):
            load_scenario(path, overrides={"simulator.partitions": bad})
    result = CliRunner().invoke(main, ["run", str(path), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "partitions        2, windows of 500 ns" in result.output
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["results"]["summary"]["partitions"]["partitions"] == 2
    assert meta["scenario"]["simulator"] == {"partitions": 2}
    result = CliRunner().invoke(
        main, ["run", str(path), "-o", str(tmp_path / "one"), "--set", "simulator.partitions=1"]
    )
    assert result.exit_code == 0, result.output
    one = tmp_path / "one"
    assert (one / "flows.parquet").read_bytes() == (tmp_path / "run" / "flows.parquet").read_bytes()
    assert (one / "ports.parquet").read_bytes() == (tmp_path / "run" / "ports.parquet").read_bytes()


def test_a_simulation_refuses_partitions_it_cannot_have(k8):
    table = flows(k8, pattern="permutation", gpus=16, size="64KB")
    for bad in (0, "two", 1.5):
        with pytest.raises(Exception, match="partitions must be"):
            Simulation(k8, table, partitions=bad)


def test_a_scenario_preset_runs_identically_on_partitions():
    """A preset with PFC pauses across the cut (incast-pfc): the same on 3 partitions."""
    sc = load_scenario("incast-pfc")
    kw = dict(cc=sc.cc, cc_params=sc.cc_params, sample_interval_ns=sc.sample_interval_ns)
    one = ran(sc.fabric, sc.flows, 1, **kw)
    many = ran(sc.fabric, sc.flows, 3, **kw)
    assert one.counters()["pfc_frames"] > 0
    assert many.partitioned["partitions"] == 3, many.partitioned
    assert differences(one, many) == []


@pytest.mark.parametrize(
    "spec",
    [
        dict(pattern="permutation", gpus=128, size="256KB"),
        dict(collective="allreduce", algorithm="halving-doubling", size="1MiB", gpus=128),
    ],
    ids=["frames", "frames and messages"],
)
def test_an_outbox_that_fills_keeps_its_rows_aside_and_loses_none(k8, monkeypatch, spec):
    """Outboxes of a few rows: most of a window's frames (and a collective's messages) into
    another partition are kept aside by the driver and taken first by their partition,
    and nothing changes."""
    table = flows(k8, **spec)
    one = ran(k8, table, 1)
    monkeypatch.setattr(partition, "MAX_OUT_ROWS", L.OUT_RESERVE + 4)
    for spinning in (True, False):
        monkeypatch.setattr(partition, "cores", lambda spinning=spinning: 4 if spinning else 1)
        many = ran(k8, table, 2)
        assert many.partitioned["partitions"] == 2
        assert many.partitioned["outboxes_filled"] > 10
        assert differences(one, many) == [], spinning


def test_a_sweep_point_is_the_same_point_on_any_number_of_partitions(tmp_path):
    """Partitions change a run's speed, never its results: a sweep reuses a point run on
    another number of them, and its workers (which share the machine's cores already) run
    "auto" on one."""
    from aifabric.experiments.runner import run_point, scenario_hash

    path = tmp_path / "p.toml"
    path.write_text(
        '[scenario]\ntopology = "lab-small"\n'
        '[workload]\npattern = "permutation"\ngpus = 16\nsize = "64KB"\n'
    )
    sc = load_scenario(path)
    assert sc.partitions == "auto"
    hashes = {scenario_hash(replace(sc, partitions=p).to_dict()) for p in ("auto", 1, 4)}
    assert len(hashes) == 1
    row = run_point(str(path), [], 1, str(tmp_path / "run"), "sim", [])
    assert row["status"] == "complete", row
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["scenario"]["simulator"] == {"partitions": 1}


@pytest.mark.parametrize("parts", [2, 3])  # threads spinning in numba; meeting by message
def test_a_partitioned_run_stopped_midway_keeps_what_ran(k8, monkeypatch, parts):
    """A stop (Ctrl-C, SIGTERM: the progress hook raises) ends every thread, and the
    simulation holds what the partitions simulated so far, closed at the earliest of
    them: some flows started, none past that time, the sample rows up to it."""
    monkeypatch.setattr(partition, "cores", lambda: 2)
    monkeypatch.setattr(partition, "PROGRESS_S", 0.0)  # the first report: after a window

    class Stop(Exception):
        pass

    def hook(progress):
        raise Stop

    table = flows(k8, pattern="permutation", gpus=128, size="4MB")
    sim = Simulation(k8, table, partitions=parts)
    with pytest.raises(Stop):
        sim.run(progress=hook)
    assert sim.partitioned == {"partitions": parts, "stopped": True}
    sim.close()
    records = sim.flow_records()
    now = sim.now_ns
    assert 0 < now < 1_000_000  # 4 MB flows at 100G take over 320 us; it stopped early
    assert (records["start_ns"] >= 0).sum() > 64 and (records["end_ns"] == -1).all()
    assert (records["start_ns"] <= now).all()
    assert sim.sample_rows == now // sim.sample_interval_ns + (now % sim.sample_interval_ns > 0)


def test_spinning_threads_report_after_so_many_events_whatever_the_windows(k8, monkeypatch):
    """Thread 0 comes back to Python (progress, and where a Ctrl-C is acted on) every 512
    windows or after YIELD_EVENTS events of its partition, whichever comes first: a big
    fabric's windows take a third of a second each, so 512 of them made a stop wait minutes.
    The windows of this run are fewer than 512; the events decide, and nothing changes."""
    monkeypatch.setattr(partition, "cores", lambda: 2)
    table = flows(k8, pattern="permutation", gpus=128, size="512KB")
    one = ran(k8, table, 1)
    reports, default = {}, W.YIELD_EVENTS
    for every in (default, 20_000):
        monkeypatch.setattr(W, "YIELD_EVENTS", every)
        seen = []
        sim = Simulation(k8, table, partitions=2)
        assert sim.run(progress=seen.append)
        sim.close()
        assert sim.partitioned["windows"] < W.YIELD_WINDOWS
        assert differences(one, sim) == []
        reports[every] = len(seen)
    events = one.counters()["events"]
    assert reports[default] == 0  # fewer than 512 windows, and fewer events than that
    assert reports[20_000] >= events // 3 // 20_000  # partition 0 runs about half of them


def test_a_partitioned_run_is_one_line_on_the_terminal():
    from aifabric.cli_run import partitions_line

    assert partitions_line({"partitions": 2, "stopped": True}) == "2, stopped before the end"
    why = "a run to a given time"
    line = partitions_line({"partitions": 1, "mpi_ranks": 2, "asked": "auto", "why": why})
    assert line == "1, on MPI rank 0 alone (2 ranks): a run to a given time"
    short = {"partitions": 2, "lookahead_ns": 400.0, "windows": 1234}
    by = "a transfer's wait for one at another partition"
    assert partitions_line({**short, "lookahead_by": by}) == (
        "2, windows of 400 ns (1,234 windows, shorter than a link's delay: a transfer's wait "
        "for one at another partition)"
    )
    assert partitions_line(short) == "2, windows of 400 ns (1,234 windows)"


@pytest.mark.parametrize("cores", [1, 2])
def test_more_partitions_than_cores_says_so_on_the_terminal(tmp_path, monkeypatch, cores):
    """Two partitions on one core meet from Python after every window, and a run says so
    with what a window cost (on incast-pfc, about a millisecond here); on two cores, where
    they meet in numba, the line is as it was."""
    monkeypatch.setattr(partition, "cores", lambda: cores)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main, ["run", "incast-pfc", "-o", str(out), "--set", "simulator.partitions=2"]
    )
    assert result.exit_code == 0, result.output
    part = json.loads((out / "run.json").read_text())["results"]["summary"]["partitions"]
    assert part["partitions"] == 2 and part["windows"] > 1 and part["wall_s"] > 0
    line = next(x for x in result.output.splitlines() if x.startswith("partitions"))
    if cores == 1:
        assert part["too_few_cores"] == 1
        each = part["wall_s"] / part["windows"] * 1e3
        assert line.endswith(
            f"; only 1 core, so they met from Python after each window "
            f'({each:.2f} ms a window; "auto" takes one per core)'
        )
    else:
        assert "too_few_cores" not in part and "Python" not in line


@njit(cache=False)
def _stand_in_loop(S, t_stop, max_events):
    """A kernel with the loop's arguments: a state of arrays, two int64 bounds."""
    if t_stop < 0:
        raise ValueError("a stand-in told to stop before time began")
    S[0][0] += max_events
    return t_stop + S[1][0]


@njit(cache=False)
def _through(loop, S, t_stop, max_events):
    return W.call_loop(loop, S, t_stop, max_events)


def test_a_partition_calls_the_loop_at_its_address_with_its_result_and_its_errors():
    """`windows` calls the loop through the address of its compiled code (not linking a
    copy of it): what the loop returns and writes, and what it raises, come back."""
    S = (np.zeros(1, np.int64), np.full(1, 5, np.int64))
    loop = W.loop_address(S, _stand_in_loop)
    assert loop == W.loop_address(S, _stand_in_loop)  # compiled once, for the state's type
    assert _through(loop, S, 7, 3) == 12 and S[0][0] == 3
    assert _through(loop, S, 1, 2) == 6 and S[0][0] == 5
    with pytest.raises(ValueError, match="before time began"):
        _through(loop, S, -1, 0)
    assert S[0][0] == 5
