"""Collectives, placement, QP scaling and flow generation against closed forms and references."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from aifabric import topologies, traffic
from aifabric.fabric.addressing import linux_udp_sport
from aifabric.fabric.errors import SpecError
from aifabric.traffic import collectives as coll
from aifabric.traffic.generate import expand_qps, ragged_arange
from aifabric.traffic.placement import place, server_keys

MiB = 2**20


@pytest.fixture(scope="module")
def medium():
    return topologies.load_fabric("lab-medium")


@pytest.fixture(scope="module")
def small():
    return topologies.load_fabric("lab-small")


def flows_of(fabric, seed=0, **spec):
    return traffic.generate(fabric, traffic.workload_from_dict(spec, "test"), seed=seed)


def sent_per_rank(table) -> dict[int, int]:
    out: dict[int, int] = {}
    for s, b in zip(table.src.tolist(), table.bytes.tolist(), strict=True):
        out[s] = out.get(s, 0) + b
    return out


def check_graph(table):
    """Dependencies point to earlier flows (so the graph is acyclic) and a topological
    run from the flows that wait for nothing completes every flow."""
    n = len(table)
    row = np.repeat(np.arange(n), np.diff(table.dep_ptr))
    assert np.all(table.dep < row), "a flow waits for itself or a later flow"
    assert np.all(table.dep >= 0)
    waiting = np.diff(table.dep_ptr).copy()
    succ: list[list[int]] = [[] for _ in range(n)]
    for f, d in zip(row.tolist(), table.dep.tolist(), strict=True):
        succ[d].append(f)
    ready = [f for f in range(n) if waiting[f] == 0]
    done = 0
    while ready:
        f = ready.pop()
        done += 1
        for g in succ[f]:
            waiting[g] -= 1
            if waiting[g] == 0:
                ready.append(g)
    assert done == n, f"{n - done} flows are never reachable"


# closed forms --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 8, 16])
@pytest.mark.parametrize("channels", [1, 2])
def test_ring_allreduce_per_rank_bytes(medium, n, channels):
    size = 48 * n * channels * 1024
    t = flows_of(medium, collective="allreduce", algorithm="ring", size=size, gpus=n,
                 channels=channels)  # fmt: skip
    per = sent_per_rank(t)
    assert len(per) == n
    assert set(per.values()) == {2 * (n - 1) * size // n}
    assert int(t.op_steps[0]) == 2 * (n - 1)
    check_graph(t)


@pytest.mark.parametrize("kind", ["allgather", "reducescatter", "alltoall"])
@pytest.mark.parametrize("n", [2, 5, 16])
def test_gather_scatter_alltoall_per_rank_bytes(medium, kind, n):
    size = 7 * n * 4096
    t = flows_of(medium, collective=kind, size=size, gpus=n)
    assert set(sent_per_rank(t).values()) == {(n - 1) * size // n}
    check_graph(t)


@pytest.mark.parametrize("n", [7, 16, 100])
def test_ring_totals_are_exact_for_any_size(medium, n):
    size = 10**7 + 3  # not divisible by n
    t = flows_of(medium, collective="allreduce", size=size, gpus=n)
    assert int(t.bytes.sum()) == 2 * (n - 1) * size


def test_ring_streams_are_released_by_the_edge_before(medium):
    """One stream per ring edge; its step k waits for step k-1 of the edge into its sender."""
    n = 6
    t = flows_of(
        medium, collective="allreduce", algorithm="ring", size=6 * 4096, gpus=n, channels=2
    )
    assert len(t) == t.n_groups == 2 * n and not len(t.dep)
    assert set(t.group_steps.tolist()) == {2 * (n - 1)} and set(t.group_offset.tolist()) == {1}
    for s in range(t.n_groups):
        (i,) = t.group_in[t.group_in_ptr[s] : t.group_in_ptr[s + 1]]
        assert t.dst[i] == t.src[s] and t.channel[i] == t.channel[s]


def test_ring_steps_written_out_wait_for_the_step_before_upstream(medium):
    from aifabric.traffic.steps import expand_steps

    n = 6
    t = expand_steps(
        flows_of(medium, collective="allreduce", algorithm="ring", size=6 * 4096, gpus=n, qps=2)
    )
    assert len(t) == n * 2 * 2 * (n - 1)
    assert int(t.bytes.sum()) == 2 * (n - 1) * 6 * 4096
    nic_rank = {int(x): i for i, x in enumerate(np.unique(t.src))}
    for f in range(len(t)):
        deps = t.deps_of(f)
        if t.step[f] == 0:
            assert len(deps) == 0
            continue
        r = nic_rank[int(t.src[f])]
        got = {(nic_rank[int(t.src[d])], int(t.step[d])) for d in deps}
        assert got == {((r - 1) % n, int(t.step[f]) - 1)}
        assert len(deps) == 2  # both QPs of the step upstream
    check_graph(t)


def test_steps_fold_back_into_the_streams_they_were_cut_from(medium):
    """The emulator replays steps and records streams: a stream starts with its first step
    and ends with its last, and not at all while one of its steps has not ended."""
    from aifabric.traffic.steps import (
        expand_steps_with_origin,
        first_latency_ns,
        fold_paths,
        fold_steps,
    )

    streams = flows_of(medium, collective="allreduce", algorithm="ring", size=6 * 4096, gpus=4)
    steps, origin = expand_steps_with_origin(streams)
    assert len(origin) == len(steps)
    for name in ("src", "dst", "sport", "channel", "op"):
        assert np.array_equal(getattr(steps, name), getattr(streams, name)[origin])
    assert np.array_equal(np.bincount(origin, weights=steps.bytes), streams.bytes)
    rng = np.random.default_rng(1)
    start = rng.integers(0, 1000, len(steps))
    end = start + rng.integers(1, 1000, len(steps))
    late = int(np.flatnonzero(origin == 2)[3])
    end[late] = -1
    s, e = fold_steps(origin, len(streams), start, end)
    for i in range(len(streams)):
        mine = origin == i
        assert s[i] == start[mine].min()
        assert e[i] == (-1 if i == 2 else end[mine].max())
    # the simulator records a stream from its start, its op's base and step latency before
    # its first step is released
    lead = first_latency_ns(streams)
    op = streams.op_id.tolist().index(int(streams.op[0]))
    assert lead.tolist() == [streams.op_step_latency_ns[op] + streams.op_base_latency_ns[op]] * 4
    assert lead[0] > 0
    s2, _ = fold_steps(origin, len(streams), start + 10**6, end + 10**6, lead)
    assert np.array_equal(s2, s + 10**6 - lead)
    # each step's path: its own links; a stream's, its first step's
    lens = np.arange(len(steps)) % 3 + 1
    ptr = np.concatenate([[0], np.cumsum(lens)])
    links = np.arange(ptr[-1])
    fptr, flinks = fold_paths(origin, len(streams), ptr, links)
    for i in range(len(streams)):
        j = int(np.flatnonzero(origin == i)[0])
        assert flinks[fptr[i] : fptr[i + 1]].tolist() == links[ptr[j] : ptr[j + 1]].tolist()


@pytest.mark.parametrize("protocol, qps", [("ll", 1), ("ll", 2)])
@pytest.mark.parametrize("hierarchical", [False, True])
def test_steps_written_out_wait_for_room_in_the_receivers_buffer(
    medium, protocol, qps, hierarchical
):
    """A tree's stream sends step k only once each of its outputs has been released step
    k - window (the simulator's `in_window`), where a release is its inputs' arrival plus the
    step latency, or its own window's release. Replayed as the emulator replays the steps
    (a flow starts once the flows it waits for have ended, plus the step latency after
    data and none after a marker), with random transfer times, every step starts exactly
    when that rule, worked out here from the streams, releases it; and the windows hold
    some steps back."""
    from aifabric.traffic.steps import expand_steps_with_origin, is_marker, stream_windows

    size = 2**20 * (8 if hierarchical else 1)  # 1 MiB over each rail of 2 servers
    t = flows_of(medium, collective="allreduce", algorithm="tree", protocol=protocol,
                 size=size, gpus=16, qps=qps, hierarchical=hierarchical)  # fmt: skip
    win = stream_windows(t)
    assert (win > 0).any() and (win < t.group_steps).any()
    steps, origin = expand_steps_with_origin(t)
    marker = is_marker(origin)
    assert (steps.bytes[marker] == 0).all() and marker.any()
    flow = np.where(marker, -1 - origin, origin)
    assert np.array_equal(np.bincount(origin[~marker], weights=steps.bytes[~marker]), t.bytes)
    lat, first = 1000, 3000
    rng = np.random.default_rng(7)
    took = np.where(marker, 0, rng.integers(1, 5000, len(steps)))
    start = np.zeros(len(steps), dtype=np.int64)
    end = np.zeros(len(steps), dtype=np.int64)
    for f in range(len(steps)):  # rows wait only for earlier rows
        d = steps.deps_of(f)
        after = np.where(marker[d], 0, lat)
        start[f] = max([first, *(end[d] + after).tolist()])
        end[f] = start[f] + took[f]
    # the rule, from the streams: release(x, j), arrival(x, j) = its QPs' last end
    ins = [
        t.group_in[t.group_in_ptr[x] : t.group_in_ptr[x + 1]].tolist() for x in range(t.n_groups)
    ]
    outs = [[o for o in range(t.n_groups) if x in ins[o]] for x in range(t.n_groups)]
    of = {}
    for f in np.flatnonzero(~marker):
        of.setdefault((int(t.group[flow[f]]), int(steps.step[f])), []).append(f)
    release, arrival = {}, {}
    changed = True
    while changed:  # to a fixed point (a step's inputs may come later in this order)
        changed = False
        for x, j in sorted(of, key=lambda xj: xj[1]):
            r = max([first] + [arrival.get((i, j), -1) + lat for i in ins[x]])
            w = int(win[x])
            if w and j >= w:
                r = max([r] + [release.get((o, j - w), -1) for o in outs[x]])
            changed |= release.get((x, j)) != r
            release[(x, j)] = r
            arrival[(x, j)] = r + max(int(took[f]) for f in of[(x, j)])
    held = 0
    for (x, j), fs in of.items():
        assert {int(start[f]) for f in fs} == {release[(x, j)]}, (x, j)
        free = max([first] + [arrival[(i, j)] + lat for i in ins[x]])
        held += release[(x, j)] > free
    assert held > 0


def reference_tree(n):
    """NCCL's binary tree written from its children (trees.cc ncclGetBtree): rank 0's one
    child is the largest power of two below n; a rank whose lowest set bit is b has the
    children rank - b/2 and rank + b/2, the latter halved down until it is below n."""
    parent = [-1] * n
    bit = 1
    while bit < n:
        bit <<= 1
    if n > 1:
        parent[bit >> 1] = 0
    for r in range(1, n):
        low = (r & -r) >> 1
        if low == 0:
            continue
        parent[r - low] = r
        while low and r + low >= n:
            low >>= 1
        if low:
            parent[r + low] = r
    return parent


@pytest.mark.parametrize("n", [2, 3, 8, 12, 13, 16])
def test_double_binary_tree_bytes(medium, n):
    size = 2 * 64 * 1024 * 3
    t = flows_of(medium, collective="allreduce", algorithm="tree", size=size, gpus=n,
                 chunk=64 * 1024)  # fmt: skip
    assert int(t.bytes.sum()) == 2 * (n - 1) * size
    parent = reference_tree(n)
    # the second tree: mirrored for an even n, shifted by one for an odd n
    place = [n - 1 - p if n % 2 == 0 else (p + 1) % n for p in range(n)]
    expect = [0] * n
    leaf_in = [0] * n
    for tree in (0, 1):
        for pos in range(n):
            rank = pos if tree == 0 else place[pos]
            children = parent.count(pos)
            expect[rank] += (size // 2) * ((parent[pos] >= 0) + children)
            leaf_in[rank] += children == 0
    if n % 2 == 0:  # every rank is a leaf of one tree, inner in the other (or the root)
        assert leaf_in == [1] * n
    nics = np.unique(np.concatenate([t.src, t.dst]))
    per = sent_per_rank(t)
    assert [per.get(int(x), 0) for x in nics] == expect
    check_graph(t)


@pytest.mark.parametrize("n", [2, 4, 6, 8, 12, 16])
def test_halving_doubling_totals(medium, n):
    size = 2**20
    t = flows_of(medium, collective="allreduce", algorithm="halving-doubling", size=size, gpus=n)
    p = 1 << (n.bit_length() - 1)
    e = n - p
    assert int(t.bytes.sum()) == 2 * (p - 1) * size + 2 * e * size
    if e == 0:
        assert set(sent_per_rank(t).values()) == {2 * (n - 1) * size // n}
    assert int(t.op_steps[0]) == 2 * int(math.log2(p)) + (2 if e else 0)
    check_graph(t)


def test_alltoall_pairs_each_peer_once_per_channel(medium):
    n = 9
    t = flows_of(medium, collective="alltoall", size=n * 1000, gpus=n, channels=2)
    pairs = list(zip(t.src.tolist(), t.dst.tolist(), t.channel.tolist(), strict=True))
    assert len(set(pairs)) == len(pairs) == 2 * n * (n - 1)


@pytest.mark.parametrize("n", [2, 5, 16])
def test_broadcast_and_sendrecv(medium, n):
    size = 3 * MiB
    t = flows_of(medium, collective="broadcast", size=size, gpus=n, root=1, chunk=MiB)
    per = sent_per_rank(t)
    assert int(t.bytes.sum()) == (n - 1) * size
    assert set(per.values()) == {size} and len(per) == n - 1
    nics = np.unique(np.concatenate([t.src, t.dst]))
    assert int(nics[1]) in per and int(nics[0]) not in per  # the chain starts at the root
    check_graph(t)
    if n % 2 == 0:
        s = flows_of(medium, collective="sendrecv", size=size, gpus=n, stages=2)
        assert int(s.bytes.sum()) == (n // 2) * size
        check_graph(s)


def test_hierarchical_keeps_servers_off_the_fabric(medium):
    size = 8 * 16 * 4096
    t = flows_of(
        medium, collective="allreduce", algorithm="ring", size=size, gpus=128, hierarchical=True
    )
    server = server_keys(medium, medium.nic_ids)[0]
    server_of = np.full(medium.n_nodes, -1)
    server_of[medium.nic_ids] = server
    assert np.all(server_of[t.src] != server_of[t.dst])
    assert np.all(medium.node_rail[t.src] == medium.node_rail[t.dst])
    m, g = 16, 8
    assert set(sent_per_rank(t).values()) == {2 * (m - 1) * size // (m * g)}


@pytest.mark.parametrize(
    "spec",
    [
        dict(collective="allreduce", algorithm="ring"),
        dict(collective="allreduce", algorithm="tree"),
        dict(collective="allreduce", algorithm="halving-doubling"),
        dict(collective="allgather"),
        dict(collective="reducescatter"),
        dict(collective="alltoall"),
        dict(collective="broadcast", root=3),
        dict(collective="sendrecv", stages=4),
    ],
)
def test_transfer_count_closed_form(spec):
    for n in (2, 3, 8, 24):
        for step_bytes in (64 * 1024, 2 * MiB):
            kind = spec["collective"]
            algorithm = spec.get("algorithm") or traffic.spec.COLLECTIVES[kind][0]
            stages = spec.get("stages", 2)
            if kind == "sendrecv" and n % stages:
                continue
            args = (kind, algorithm, n, 5 * MiB + 7, 2, step_bytes, 256 * 1024)
            tr = coll.collective(*args, root=spec.get("root", 0) % n, stages=stages)
            assert coll.transfer_count(*args, stages=stages) == len(tr)


@pytest.mark.parametrize(
    "kind, factor",
    [
        ("allreduce", lambda n: 2 * (n - 1) / n),
        ("allgather", lambda n: (n - 1) / n),
        ("reducescatter", lambda n: (n - 1) / n),
        ("alltoall", lambda n: (n - 1) / n),
        ("broadcast", lambda n: 1.0),
        ("sendrecv", lambda n: 1.0),
    ],
)
def test_busbw_factor_is_nccl_tests(kind, factor):
    for n in (2, 3, 8, 24576):
        assert coll.KINDS[kind].busbw_factor(n) == pytest.approx(factor(n))
    assert coll.busbw_factor("incast", 9) == 1.0  # patterns: busbw = algbw


def test_every_kind_is_a_workload_choice():
    assert {k: c.algorithms for k, c in coll.KINDS.items()} == traffic.spec.COLLECTIVES
    assert set(coll.KINDS) == {
        "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv"
    }  # fmt: skip
    with pytest.raises(ValueError, match="unknown collective gather"):
        coll.kind("gather")


@pytest.mark.parametrize(
    "kind, per_rank",
    [
        ("allreduce", lambda n, s: 2 * (n - 1) * s // n),
        ("allgather", lambda n, s: (n - 1) * s // n),
        ("reducescatter", lambda n, s: (n - 1) * s // n),
        ("alltoall", lambda n, s: (n - 1) * s // n),
    ],
)
def test_symmetric_kinds_send_their_closed_form(kind, per_rank):
    c = coll.KINDS[kind]
    for n in (2, 4, 16):  # powers of two: halving-doubling's extra ranks send more
        size = n * 3 * 4096
        for algorithm in c.algorithms:
            if algorithm == "tree":
                continue  # leaves send less than inner ranks (checked below)
            sent, recv = c.rank_bytes(algorithm, n, size, coll.Shape(channels=2))
            assert set(sent.tolist()) == {per_rank(n, size)}, algorithm
            assert set(recv.tolist()) == {per_rank(n, size)}, algorithm


def test_chains_and_tree_closed_forms():
    n, size = 12, 5 * MiB
    sent, recv = coll.KINDS["broadcast"].rank_bytes("ring", n, size, coll.Shape(root=4))
    assert sent.sum() == (n - 1) * size and sent[3] == 0 and recv[4] == 0  # the chain ends at 3
    sent, recv = coll.KINDS["sendrecv"].rank_bytes("p2p", n, size, coll.Shape(stages=3))
    assert sent.tolist() == [size] * 8 + [0] * 4 and recv.tolist() == [0] * 4 + [size] * 8
    sent, recv = coll.KINDS["allreduce"].rank_bytes("tree", n, size, coll.Shape())
    # each of the two trees carries its half up and down every one of its n - 1 edges
    assert sent.sum() == recv.sum() == 2 * (n - 1) * size


@pytest.mark.parametrize("kind", sorted(coll.KINDS))
def test_each_kind_builds_what_its_closed_forms_say(kind):
    c = coll.KINDS[kind]
    for algorithm in c.algorithms:
        for n in (2, 5, 8, 12):
            shape = coll.Shape(channels=2, step_bytes=256 * 1024, chunk=64 * 1024, root=n - 1)
            if c.refuse(n, shape):
                continue
            size = 3 * MiB + 11
            tr = c.transfers(algorithm, n, size, shape)
            assert len(tr) == c.transfer_count(algorithm, n, size, shape)
            assert tr.steps == c.op_steps(algorithm, n, size, shape)
            sent, recv = c.rank_bytes(algorithm, n, size, shape)
            assert np.array_equal(np.bincount(tr.src, weights=tr.bytes, minlength=n), sent)
            assert np.array_equal(np.bincount(tr.dst, weights=tr.bytes, minlength=n), recv)


def test_refusals_name_the_key():
    assert "stages = 2" in coll.KINDS["sendrecv"].refuse(5, coll.Shape(), "GPUs")
    assert "root = 7" in coll.KINDS["broadcast"].refuse(4, coll.Shape(root=7))
    assert coll.KINDS["allreduce"].refuse(3, coll.Shape()) is None


@pytest.mark.parametrize(
    "kind, algorithm",
    [
        ("allreduce", "ring"),
        ("allreduce", "tree"),
        ("allreduce", "halving-doubling"),
        ("allgather", "ring"),
        ("reducescatter", "ring"),
        ("alltoall", "pairwise"),
        ("broadcast", "ring"),
        ("sendrecv", "p2p"),
    ],
)
@pytest.mark.parametrize("hierarchical", [False, True])
def test_closed_form_plan_equals_the_table(medium, kind, algorithm, hierarchical):
    """rank by rank: bytes sent and received, flows, steps, ideal time."""
    from aifabric.traffic.ideal import collective_stats
    from aifabric.traffic.placement import place
    from aifabric.traffic.summary import op_stats

    for gpus, size, channels in ((12, 10**6 + 1, 1), (32, 3 * MiB + 5, 2)):
        spec = dict(collective=kind, algorithm=algorithm, gpus=gpus, size=size, channels=channels,
                    qps=3, chunk="64KiB", hierarchical=hierarchical, root=5,
                    stages=2 if hierarchical else 4, placement="fragmented")  # fmt: skip
        if hierarchical and gpus % 8:
            spec["gpus"] = 16
        w = traffic.workload_from_dict(spec, "t")
        t = traffic.generate(medium, w, seed=9)
        nics = place(medium, spec["gpus"], "fragmented", np.random.default_rng(9))
        planned = collective_stats(medium, w.jobs[0], nics, "t")[0]
        built = op_stats(medium, t)[0]
        for key in ("flows", "steps", "bytes", "max_rank_bytes", "mean_rank_bytes", "ideal_ns"):
            assert planned[key] == built[key], key
        sent = np.bincount(t.src, weights=t.bytes, minlength=medium.n_nodes)
        recv = np.bincount(t.dst, weights=t.bytes, minlength=medium.n_nodes)
        from aifabric.traffic.generate import collective_instances, job_shape

        want_s = np.zeros(medium.n_nodes)
        want_r = np.zeros(medium.n_nodes)
        for ranks, part, root in collective_instances(medium, w.jobs[0], nics, "t"):
            shape = replace(job_shape(w.jobs[0], len(ranks), algorithm, "simple", None, part),
                            root=root)  # fmt: skip
            s_, r_ = coll.kind(kind).rank_bytes(algorithm, len(ranks), part, shape)
            want_s[ranks] += s_
            want_r[ranks] += r_
        assert np.array_equal(sent, want_s) and np.array_equal(recv, want_r)


def test_show_falls_back_to_closed_form_only_when_too_big(medium):
    from aifabric.traffic.summary import describe

    w = traffic.workload_from_dict(dict(collective="alltoall", gpus=64), "t")
    assert describe(medium, w)["closed_form"] is False
    big = topologies.load_fabric("cluster-24k")
    d = describe(big, traffic.workload_from_dict(dict(collective="alltoall"), "t"))
    assert d["closed_form"] is True and d["flows"] == 24576 * 24575
    assert d["ops"][0]["max_rank_bytes"] == 64 * MiB - 64 * MiB // 24576  # minus its own block


# dependencies and several ops ------------------------------------------------------------


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_presets_make_acyclic_ordered_ops(medium, name):
    t = traffic.generate(medium, traffic.load_workload(name))
    check_graph(t)
    ops = np.unique(t.op)
    assert len(ops) == len(t.op_id)
    assert np.all(np.diff(t.op) >= 0)  # flows of an op are contiguous, ops in issue order


def test_ops_of_a_job_are_ordered_per_nic(medium):
    t = flows_of(medium, collective="allreduce", size=4 * MiB, gpus=8, iterations=3)
    check_graph(t)
    second = np.flatnonzero(t.op == 1)
    heads = second[np.diff(t.dep_ptr)[second] > 0]
    assert len(heads) == len(second)  # every flow of the second op waits for something
    first_deps = [d for f in second for d in t.deps_of(f) if t.op[d] == 0]
    assert first_deps and max(t.step[first_deps]) == t.step[t.op == 0].max()


def test_training_dense_shape(medium):
    w = traffic.workload_from_dict(
        dict(
            model="m",
            tp=8,
            pp=2,
            params=1e9,
            layers=4,
            bucket="256MiB",
            micro_batches=3,
            activation="1MiB",
            qps=1,
            channels=1,
        ),  # fmt: skip
        "t",
    )
    t = traffic.generate(medium, w)
    kinds = list(t.op_kind)
    # 2 stages x 3 micro-batches forward and backward = 6 sends; then buckets per stage
    assert kinds.count("sendrecv") == 6
    stage_bytes = 1e9 * 2 / 2 / 8
    assert kinds.count("allreduce") == 2 * math.ceil(stage_bytes / (256 * MiB))
    ar = t.op_kind[t.op] == "allreduce"
    dp = 128 // 16
    assert int(t.bytes[ar].sum()) == 2 * 8 * 2 * (dp - 1) * int(stage_bytes)
    assert int(t.op_ranks[t.op_kind == "allreduce"][0]) == dp


def test_training_errors_name_the_key(medium):
    w = traffic.workload_from_dict(dict(model="m", tp=3, params=1e9), "t")
    with pytest.raises(SpecError, match="tp = 3"):
        traffic.generate(medium, w)
    w = traffic.workload_from_dict(dict(model="m", tp=8, pp=3, params=1e9), "t")
    with pytest.raises(SpecError, match="pp = 3"):
        traffic.generate(medium, w)


# placement ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["packed", "fragmented", "rail-aligned"])
def test_placements_respect_capacity(medium, policy):
    rng = np.random.default_rng(3)
    taken = np.zeros(medium.n_nodes, dtype=bool)
    server, rack, _ = server_keys(medium, medium.nic_ids)
    jobs = []
    for size in (8, 16, 24, 8, 32, 16):
        jobs.append(place(medium, size, policy, rng, taken))
    all_nics = np.concatenate(jobs)
    assert len(np.unique(all_nics)) == len(all_nics)  # never two jobs on one NIC
    pos = np.searchsorted(medium.nic_ids, all_nics)
    assert np.bincount(server[pos]).max() <= 8
    assert np.bincount(rack[pos]).max() <= 16
    assert [len(j) for j in jobs] == [8, 16, 24, 8, 32, 16]


def test_packed_keeps_a_rack_job_in_one_rack(medium):
    rng = np.random.default_rng(0)
    taken = np.zeros(medium.n_nodes, dtype=bool)
    place(medium, 4, "packed", rng, taken)  # leaves a partial server and rack behind
    for size in (16, 12, 8, 3):
        nics = place(medium, size, "packed", rng, taken)
        assert len(np.unique(medium.node_rack[nics])) == 1
        if size < 8:
            assert len(np.unique(medium.node_server[nics] + 100 * medium.node_rack[nics])) == 1


def test_fragmented_is_seeded_and_scattered(medium):
    a = place(medium, 32, "fragmented", np.random.default_rng(5))
    b = place(medium, 32, "fragmented", np.random.default_rng(5))
    assert np.array_equal(a, b)
    assert len(np.unique(medium.node_rack[a])) > 2  # 32 GPUs would fit in 2 racks


def test_rail_aligned_orders_ranks_rail_major(medium):
    nics = place(medium, 32, "rail-aligned", np.random.default_rng(0))
    rails = medium.node_rail[nics]
    assert np.all(np.diff(rails) >= 0) and len(np.unique(rails)) == 8
    with pytest.raises(SpecError, match="multiple"):
        place(medium, 12, "rail-aligned", np.random.default_rng(0))


def test_too_big_a_job_is_one_sentence(medium):
    with pytest.raises(SpecError, match="does not fit"):
        flows_of(medium, collective="allreduce", gpus=129)


# QP scaling ---------------------------------------------------------------------------------


def reference_qp_bytes(nbytes, qps, mode, chunk, offset=0):
    """Per-QP bytes, message by message."""
    out = [0] * qps
    messages = []
    left = nbytes
    while left > 0:
        messages.append(min(chunk, left))
        left -= messages[-1]
    for i, m in enumerate(messages):
        if mode == "split":
            for q in range(qps):
                out[q] += m * (q + 1) // qps - m * q // qps
        else:
            out[(offset + i) % qps] += m
    return out


@pytest.mark.parametrize("mode", ["split", "round-robin"])
@pytest.mark.parametrize("qps", [1, 2, 3, 8])
def test_qp_expansion_matches_message_by_message(mode, qps):
    rng = np.random.default_rng(qps)
    m = 40
    sizes = rng.integers(0, 5000, m)
    src = rng.integers(0, 3, m).astype(np.int32)
    tr = coll.Transfers(
        src=src,
        dst=(src + 1).astype(np.int32),
        channel=np.zeros(m, np.int32),
        step=np.zeros(m, np.int32),
        bytes=sizes.astype(np.int64),
        dep_ptr=np.zeros(m + 1, np.int64),
        dep=np.zeros(0, np.int64),
        steps=1,
    )
    t, q, nbytes, msg, _, _ = expand_qps(tr, qps, mode, 700)
    assert int(nbytes.sum()) == int(sizes.sum())
    offsets = {0: 0, 1: 0, 2: 0}
    for i in range(m):
        want = reference_qp_bytes(int(sizes[i]), qps, mode, 700, offsets[int(src[i])])
        offsets[int(src[i])] += -(-int(sizes[i]) // 700)
        assert nbytes[i * qps : (i + 1) * qps].tolist() == want


@pytest.mark.parametrize("mode", ["split", "round-robin"])
def test_qp_modes_in_a_collective(medium, mode):
    base = flows_of(medium, collective="allreduce", size=64 * MiB, gpus=16)
    t = flows_of(medium, collective="allreduce", size=64 * MiB, gpus=16, qps=4, qp_mode=mode)
    assert len(t) == 4 * len(base)
    assert int(t.bytes.sum()) == int(base.bytes.sum())
    conns = set(zip(t.src.tolist(), t.sqpn.tolist(), strict=True))
    assert len(conns) == 16 * 4  # four QPs per ring edge
    assert np.array_equal(t.sport, linux_udp_sport(t.sqpn, t.dqpn))  # the default rule
    per_qp = t.bytes.reshape(-1, 4).sum(axis=0)
    assert per_qp.max() - per_qp.min() <= 512 * 1024 * len(base)
    if mode == "split":
        assert set(t.msg_bytes.tolist()) == {128 * 1024}
    else:
        assert set(t.msg_bytes.tolist()) == {512 * 1024}
    check_graph(t)


def test_qpns_are_distinct_per_nic(medium):
    t = flows_of(medium, collective="alltoall", size=MiB, gpus=16, qps=2)
    ends = {}
    for s, d, sq, dq in zip(t.src.tolist(), t.dst.tolist(), t.sqpn.tolist(), t.dqpn.tolist(),
                            strict=True):  # fmt: skip
        for nic, qpn, conn in ((s, sq, (s, d, sq)), (d, dq, (s, d, sq))):
            assert ends.setdefault((nic, qpn), conn) == conn
    assert t.sqpn.min() >= 0x100 and t.sqpn.max() < 1 << 24


# seeds and patterns -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        dict(pattern="uniform", distribution="exponential", load=0.3, placement="fragmented"),
        dict(pattern="permutation"),
        dict(collective="allreduce", gpus=32, placement="fragmented", qps=2),
    ],
)
def test_same_seed_same_table(medium, spec):
    a = flows_of(medium, seed=11, **spec).arrays()
    b = flows_of(medium, seed=11, **spec).arrays()
    c = flows_of(medium, seed=12, **spec).arrays()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not all(np.array_equal(a[k], c[k]) for k in a)


def test_patterns(medium):
    p = flows_of(medium, seed=2, pattern="permutation", size=1000)
    assert sorted(p.src.tolist()) == sorted(p.dst.tolist()) == sorted(medium.nic_ids.tolist())
    assert np.all(p.src != p.dst)
    i = flows_of(medium, pattern="incast", senders=5, size="2MB")
    assert len(np.unique(i.dst)) == 1 and len(np.unique(i.src)) == 5
    assert int(i.bytes.sum()) == 5 * 2 * 10**6
    u = flows_of(
        medium,
        seed=4,
        pattern="uniform",
        flows=4000,
        size="1MB",
        distribution="exponential",
        load=0.5,
    )
    assert np.all(u.src != u.dst)
    assert abs(u.bytes.mean() / 1e6 - 1) < 0.1
    assert np.all(np.diff(u.start_ns) >= 0) and u.start_ns[-1] > 0
    # offered load: bytes over the arrival span, per NIC, against 400G
    offered = u.bytes.sum() * 8 / (u.start_ns[-1] * 1e-9) / 128 / 400e9
    assert 0.4 < offered < 0.6


def test_several_jobs_never_share_a_nic(medium):
    w = traffic.workload_from_dict(
        {
            "jobs": [
                dict(collective="allreduce", gpus=48, placement="fragmented"),
                dict(collective="alltoall", gpus=40),
                dict(pattern="incast", senders=7),
            ]
        },
        "multi",
    )
    t = traffic.generate(medium, w, seed=1)
    nics = [set(np.concatenate([t.src[t.job == j], t.dst[t.job == j]]).tolist()) for j in range(3)]
    assert [len(x) for x in nics] == [48, 40, 8]
    assert not (nics[0] & nics[1]) and not (nics[1] & nics[2]) and not (nics[0] & nics[2])
    check_graph(t)


# specs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "table, words",
    [
        (dict(collective="allreduce", sise="1MiB"), ["sise", "1MiB"]),
        (dict(collective="allreduce", size="12Q"), ["size", "12Q"]),
        (dict(collective="allreduce", algorithm="pairwise"), ["algorithm", "pairwise"]),
        (dict(collective="gather"), ["collective", "gather"]),
        (dict(pattern="incast", qps=0), ["qps", "0"]),
        (dict(size="1MiB"), ["collective", "pattern"]),
        (dict(collective="allreduce", pattern="incast"), ["collective", "pattern"]),
        (dict(model="x", tp=8), ["params"]),
        ({"jobs": [dict(collective="allreduce")], "gpus": 3}, ["gpus", "3"]),
    ],
)
def test_bad_specs_are_one_sentence(table, words):
    with pytest.raises(SpecError) as e:
        traffic.workload_from_dict(table, "w")
    text = str(e.value)
    assert "\n" not in text
    for w in words:
        assert w in text


def test_presets_load_and_files(tmp_path):
    assert traffic.workload_presets() == ["dense", "moe"]
    for name in traffic.workload_presets():
        assert traffic.load_workload(name).description
    path = tmp_path / "w.toml"
    path.write_text('collective = "allgather"\nsize = "8MiB"\ngpus = 4\n')
    w = traffic.load_workload(str(path))
    assert w.jobs[0]["size"] == 8 * MiB
    with pytest.raises(SpecError, match="unknown workload"):
        traffic.load_workload("no-such-preset")
    path.write_text("collective = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        traffic.load_workload(str(path))


def test_preset_key_with_overrides():
    w = traffic.workload_from_dict({"preset": "dense", "gpus": 64, "pp": 2}, "scenario")
    job = w.jobs[0]
    assert (job["gpus"], job["pp"], job["tp"]) == (64, 2, 8)
    assert w.description == traffic.load_workload("dense").description
    with pytest.raises(SpecError, match="preset"):
        traffic.workload_from_dict({"preset": "nope"}, "scenario")
    with pytest.raises(SpecError, match="gpu"):
        traffic.workload_from_dict({"preset": "moe", "gpu": 3}, "scenario")


def test_flow_table_round_trip(medium, tmp_path):
    t = flows_of(medium, collective="allreduce", gpus=16, qps=2, window=4)
    t.save(tmp_path / "f.npz")
    back = traffic.FlowTable.load(tmp_path / "f.npz")
    a, b = t.arrays(), back.arrays()
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert int(back.op_window[0]) == 4
    # a file written before the added columns still loads, with defaults
    old = {k: v for k, v in a.items() if k not in ("msg_bytes", "op_window", "op_qps")}
    np.savez(tmp_path / "old.npz", schema=np.array("aifabric.flows/1"), **old)
    back = traffic.FlowTable.load(tmp_path / "old.npz")
    assert np.all(back.msg_bytes == 0) and back.op_qps.tolist() == [1]


def test_flow_table_build_still_takes_lists():
    t = traffic.FlowTable.build(
        {"src": [1, 2], "dst": [2, 1], "bytes": [10, 20]},
        [[], [0]],
        {
            "op_id": [0],
            "op_job": [0],
            "op_kind": ["x"],
            "op_algorithm": ["y"],
            "op_bytes": [30],
            "op_ranks": [2],
            "op_busbw_factor": [1.0],
        },  # fmt: skip
    )
    assert t.deps_of(1).tolist() == [0] and t.op_groups.tolist() == [1]


def test_ragged_arange():
    starts = np.array([5, 0, 9])
    lengths = np.array([2, 0, 3])
    assert ragged_arange(starts, lengths).tolist() == [5, 6, 9, 10, 11]


def test_cluster_24k_ring_is_one_stream_per_edge_with_every_step():
    """49,150 dependent steps per edge, held as 24,576 streams (not 1.2 billion flows)."""
    fabric = topologies.load_fabric("cluster-24k")
    size = 64 * MiB
    t = flows_of(fabric, collective="allreduce", size=size, algorithm="ring")
    n = 24576
    assert len(t) == t.n_groups == n
    assert set(t.group_steps.tolist()) == {2 * (n - 1)}
    assert int(t.bytes.sum()) == 2 * (n - 1) * size
    # stream r is released by the stream into its sender
    assert np.array_equal(t.dst[t.group_in], t.src)
