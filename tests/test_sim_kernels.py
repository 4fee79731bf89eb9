"""Every simulator kernel against a slow, obvious reference."""

from __future__ import annotations

import dataclasses
import heapq
import importlib
import inspect
import re
from collections import Counter, deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from aifabric.fabric import cc, routing
from aifabric.fabric.model import EcnProfile
from aifabric.sim import Simulation, congestion, dcqcn, ecn, kernel, pfc
from aifabric.sim import layout as L
from aifabric.sim.driver import CACHE_LINE, zeros_aligned
from aifabric.sim.heap import (
    BUCKETS,
    HEAPS,
    NEAR_WINDOW_PS,
    SHIFT,
    clear,
    earliest_ps,
    pending,
    pop,
    schedule,
)
from aifabric.sim.kernel import prefetch
from aifabric.sim.queue import dequeue, enqueue, fifo_check
from tests import buffer_reference
from tests.conftest import fabric as preset
from tests.simhelp import ack_return_ps, flows, run


def event_list(rows):
    return np.zeros((HEAPS, rows, L.E_N), dtype=np.int64), np.zeros(L.G_NG, dtype=np.int64)


def test_event_list_pops_in_time_then_key_order_like_heapq():
    rng = np.random.default_rng(1)
    ev, g = event_list(4096)
    ref = []
    seq = 0
    out = np.zeros(L.E_N, dtype=np.int64)
    popped, expected = [], []
    both = 0  # pops with events in both heaps
    for _ in range(3000):
        both += 0 < g[L.G_FAR] < g[L.G_HEAP]
        if ref and rng.random() < 0.45:
            pop(ev, g, out)
            popped.append((int(out[L.E_TIME_PS]), int(out[L.E_A])))
            t, _, a = heapq.heappop(ref)
            expected.append((t, a))
        else:  # as the simulator: never before the last event; ties in both heaps
            now = popped[-1][0] if popped else 0
            t = now + int(rng.integers(0, 50)) + int(rng.choice([0, 1, 3])) * NEAR_WINDOW_PS
            schedule(ev, g, t, 1, seq, 0)
            heapq.heappush(ref, (t, seq, seq))
            seq += 1
    assert popped == expected
    assert g[L.G_HEAP] == len(ref)
    assert both > 1000


# times that fall on both sides of the wheel's reach (NEAR_WINDOW_PS past the present
# bucket) and on it, on the edges of the wheel's buckets, with ties everywhere
TIMES = st.one_of(
    st.integers(0, 6),
    st.integers(1, 6).map(lambda k: (k << SHIFT) - 1),
    st.integers(1, 6).map(lambda k: k << SHIFT),
    st.integers(NEAR_WINDOW_PS - 3, NEAR_WINDOW_PS + 3),
    st.integers(0, 6).map(lambda k: (k + 2) * NEAR_WINDOW_PS),
    st.integers(0, 2**62),  # any time the engine schedules
)


def key(kind, a, b) -> tuple:
    """What orders events of one time, written out: kind in TIE_ORDER's order, then the
    port (an arrival: the port whose link it crossed, b's low half), flow and timer, or
    stream."""
    who = {L.EV_ARRIVE: (b & 0xFFFFFFFF, 0), L.EV_CC_TIMER: (a, b % L.CC_TIMER_SLOTS)}
    return (L.TIE_ORDER.index(kind), *who.get(kind, (a, 0)))


# an event: a time, a kind, and its a and b
EVENTS = st.tuples(TIMES, st.sampled_from(L.TIE_ORDER), st.integers(0, 50), st.integers(0, 2**40))


@pytest.mark.parametrize("rows", [512, BUCKETS])  # too few rows for the wheel; the wheel
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.just("clear"), EVENTS), max_size=400))  # None: a pop
def test_event_list_pops_every_sequence_of_events_in_time_then_key_order(rows, ops):
    """Not in the order they were scheduled: events of one time that two partitions of a
    fabric would schedule in different orders are taken in the same order. A cleared list
    (`clear`, which resets the wheel's buckets only) is an empty one."""
    ev, g = event_list(rows)
    out = np.zeros(L.E_N, dtype=np.int64)
    ref, seen = [], set()
    for op in ops:
        if op == "clear":
            clear(ev, g)
            ref, seen = [], set()
            assert len(pending(ev, g)) == 0
            continue
        if op is None:
            if ref:
                assert earliest_ps(ev, g) == ref[0][0]
                pop(ev, g, out)
                t, _, kind, a, b = heapq.heappop(ref)
                assert list(out[[L.E_TIME_PS, L.E_KIND, L.E_A, L.E_B]]) == [t, kind, a, b]
            continue
        t, kind, a, b = op
        if (t, key(kind, a, b)) in seen:
            continue  # two events alike in time and key may go either way
        seen.add((t, key(kind, a, b)))
        schedule(ev, g, t, kind, a, b)
        heapq.heappush(ref, (t, key(kind, a, b), kind, a, b))
        assert sorted(map(tuple, pending(ev, g)[:, [L.E_TIME_PS, L.E_A, L.E_B]])) == sorted(
            (t, a, b) for t, _, _, a, b in ref
        )
    while ref:  # what is left drains in order too, each row whole
        pop(ev, g, out)
        t, _, kind, a, b = heapq.heappop(ref)
        assert list(out[[L.E_TIME_PS, L.E_KIND, L.E_A, L.E_B]]) == [t, kind, a, b]
    assert g[L.G_HEAP] == g[L.G_FAR] == g[L.G_WHEEL] == 0


def test_event_list_pops_descending_and_equal_times_in_order():
    # adversarial for a heap: every new event earlier than all before it, then a run of
    # equal times scheduled between pops; the same a window later, where the far
    # events move into the near heap among equal times scheduled after them
    for base in (0, NEAR_WINDOW_PS):
        ev, g = event_list(4096)
        out = np.zeros(L.E_N, dtype=np.int64)
        for k in range(1000):
            schedule(ev, g, base + 10_000 - k, 1, k, 0)
        got = []
        for k in range(1000):
            schedule(ev, g, base + 5_000, 1, 1000 + k, 0)
            pop(ev, g, out)
            got.append((int(out[L.E_TIME_PS]), int(out[L.E_A])))
            schedule(ev, g, 2 * NEAR_WINDOW_PS + 5_000, 1, 2000 + k, 0)
        while g[L.G_HEAP]:
            pop(ev, g, out)
            got.append((int(out[L.E_TIME_PS]), int(out[L.E_A])))
        want = sorted(
            [(base + 10_000 - k, k) for k in range(1000)]
            + [(base + 5_000, 1000 + k) for k in range(1000)]
            + [(2 * NEAR_WINDOW_PS + 5_000, 2000 + k) for k in range(1000)]
        )
        assert got == want


def test_a_runs_results_do_not_depend_on_the_order_its_first_events_were_scheduled_in():
    """Seven senders start an incast at once, so frames of one picosecond meet at the
    receiver's switch, and DCQCN's marking draws random numbers there. The same run with
    its first events scheduled in the reverse order ends the same, to the picosecond
    and the port sample (while ties went first scheduled, first served, it did not)."""
    fab = preset("lab-small")
    nics = fab.nic_ids
    table = flows(nics[1:8], [nics[0]] * 7, 300_000)
    sims = [Simulation(fab, table, cc="dcqcn") for _ in range(2)]
    ev, g = sims[1].ev, sims[1].g
    rows = pending(ev, g)
    clear(ev, g)
    for t, _, kind, a, b in rows[::-1]:
        schedule(ev, g, int(t), int(kind), int(a), int(b))
    for sim in sims:
        assert sim.run()
        sim.close()
    first, second = sims
    assert first.g[L.G_ECN] > 0  # marks were drawn
    assert np.array_equal(first.fl, second.fl)
    assert np.array_equal(first.fr, second.fr)
    for name in L.SERIES:
        assert np.array_equal(first.port_samples().dense(name), second.port_samples().dense(name))


def test_a_full_event_list_refuses_the_event_and_flags_the_overflow():
    ev, g = event_list(4)
    for k in range(4):
        schedule(ev, g, k * NEAR_WINDOW_PS, 1, k, 0)
    before = ev.copy()
    schedule(ev, g, 0, 1, 99, 0)
    assert g[L.G_OVERFLOW] == 1 and g[L.G_HEAP] == 4
    assert np.array_equal(ev, before)


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((1000, L.PK_N), np.int32), ((77, L.PT_N), np.int64), ((0, 5), np.int64)],
)
def test_aligned_arrays_are_zeroed_writable_and_start_a_cache_line(shape, dtype):
    for _ in range(5):
        a = zeros_aligned(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert a.size == 0 or a.ctypes.data % CACHE_LINE == 0
        assert not a.any()
        a[...] = 7
        assert (a == np.full(shape, 7, dtype=dtype)).all()


@njit
def _prefetch_rows(a, rows, cols):
    for k in range(len(rows)):
        prefetch(a, rows[k], cols[k])


def test_prefetch_is_only_a_hint_and_changes_nothing():
    rng = np.random.default_rng(2)
    for a in (rng.integers(0, 99, (300, L.PK_N)), rng.integers(0, 99, (300, 16)).astype(np.int32)):
        before = a.copy()
        _prefetch_rows(a, rng.integers(0, len(a), 1000), rng.integers(0, a.shape[1], 1000))
        assert np.array_equal(a, before)


def test_a_packet_row_is_one_cache_line_holding_its_fields_and_route():
    assert L.PK_N * 4 == CACHE_LINE
    fields = (
        L.PK_KIND,
        L.PK_WIRE_BYTES,
        L.PK_HOP,
        L.PK_NHOPS,
        L.PK_NEXT,
        L.PK_CE,
        L.PK_FLOW,
        L.PK_BYTES,
    )
    assert sorted(fields) == list(range(L.PK_ROUTE))
    assert L.PK_ROUTE + L.MAX_HOPS == L.PK_N
    assert L.MAX_HOPS is routing.MAX_HOPS  # one hop limit, routing's
    assert L.MAX_HOPS >= 6  # NIC, rack, spine, zone, spine, rack: the longest Clos route


def test_every_congestion_control_kind_is_registered_with_the_kernel_hooks():
    hooks = set(re.findall(r"^def (\w+)\(S", inspect.getsource(congestion), re.M))
    assert {"on_flow_start", "on_data", "on_cnp", "on_timer", "on_grant"} <= hooks
    dispatch = inspect.getsource(congestion)
    assert set(cc.SIM_COMPONENTS) == set(cc.KINDS)
    for kind, module in cc.SIM_COMPONENTS.items():
        if module is None:
            continue
        component = importlib.import_module(module)
        short = module.rsplit(".", 1)[1]
        defined = {
            name for name, fn in vars(component).items()
            if name.startswith(("on_", "may_", "send_", "next_", "timer_")) and callable(fn)
        }  # fmt: skip
        assert defined, kind
        assert defined <= hooks, f"{kind}: {defined - hooks} are not hooks"
        for name in defined:
            assert f"{short}.{name}(" in dispatch, f"{kind}: congestion.{name} never calls it"


@pytest.mark.parametrize("depth", [0, 100, 101, 150, 399, 400, 401, 10_000])
def test_red_probability_is_the_profile_closed_form(depth):
    profile = EcnProfile(100, 400, 0.3)
    assert ecn.red_probability(depth, 100, 400, 0.3) == pytest.approx(profile.probability(depth))


def test_marking_frequency_follows_the_red_probability():
    state = ecn.rng_state(3, 2).reshape(1, 2)
    n = 40_000
    for depth, p in ((250, 0.15), (390, 0.291), (500, 1.0), (50, 0.0)):
        marks = sum(ecn.should_mark(state, 0, 1, depth, 100, 400, 0.3) for _ in range(n))
        sigma = (n * p * (1 - p)) ** 0.5
        assert abs(marks - n * p) <= 4 * sigma + 1e-9


def test_queue_is_a_fifo_with_byte_counts():
    pt = np.zeros((2, L.PT_N), dtype=np.int64)
    for col in (L.PT_HEAD0, L.PT_TAIL0, L.PT_HEAD1, L.PT_TAIL1):
        pt[:, col] = -1
    pk = np.zeros((64, L.PK_N), dtype=np.int32)
    rng = np.random.default_rng(2)
    ref = {0: deque(), 1: deque()}
    nxt = 0
    for t in range(1, 501):
        cls = int(rng.integers(0, 2))
        if ref[cls] and (rng.random() < 0.5 or nxt == 64):
            i = dequeue(pt, pk, 1, cls, t)
            assert i == ref[cls].popleft()
        elif nxt < 64:
            pk[nxt, L.PK_WIRE_BYTES] = int(rng.integers(64, 5000))
            enqueue(pt, pk, 1, cls, nxt, t)
            ref[cls].append(nxt)
            nxt += 1
        for c in (0, 1):
            assert fifo_check(pt, pk, 1, c) == sum(pk[i, L.PK_WIRE_BYTES] for i in ref[c])
            assert pt[1, L.PT_Q0_BYTES + c] == sum(pk[i, L.PK_WIRE_BYTES] for i in ref[c])


def test_pfc_admit_and_release_follow_the_thresholds():
    pt = np.zeros((1, L.PT_N), dtype=np.int64)
    pt[0, L.PT_XOFF_BYTES], pt[0, L.PT_XON_BYTES], pt[0, L.PT_HEADROOM_BYTES] = 10_000, 6_000, 3_000
    rng = np.random.default_rng(4)
    ing, xoff, held = 0, False, []
    for _ in range(2000):
        if held and rng.random() < 0.5:
            w = held.pop(0)
            resume = pfc.release(pt, 0, w)
            ing -= w
            want = xoff and ing <= 6_000
            if want:
                xoff = False
            assert resume == want
        else:
            w = int(rng.integers(100, 2000))
            verdict = pfc.admit(pt, 0, w)
            if ing + w > 13_000:
                assert verdict == pfc.DROP
                continue
            ing += w
            held.append(w)
            want = pfc.ADMIT_XOFF if ing > 10_000 and not xoff else pfc.ADMIT
            xoff = xoff or want == pfc.ADMIT_XOFF
            assert verdict == want
        assert pt[0, L.PT_ING_BYTES] == ing and pt[0, L.PT_XOFF] == int(xoff)


@pytest.mark.parametrize("rate", [25 * 10**9, 100 * 10**9, 400 * 10**9])
def test_pause_duration_is_quanta_times_512_bit_times(rate):
    for quanta in (1, 100, 0xFFFF):
        assert pfc.pause_ps(quanta, rate) == -(-(quanta * 512 * 10**12) // rate)


@pytest.mark.parametrize("clamp", [1, 0])
def test_dcqcn_cut_and_increase_match_the_equations(clamp):
    prm = np.zeros(L.P_NPRM, dtype=np.int64)
    prm[L.P_FAST_STEPS], prm[L.P_AI_BPS], prm[L.P_HAI_BPS] = 5, 40 * 10**6, 400 * 10**6
    prm[L.P_MIN_RATE_BPS] = 10**8
    prm[L.P_CLAMP_TARGET] = clamp  # 0: a cut leaves the target rate (ConnectX's default)
    fprm = np.array([1 / 256])
    fl = np.zeros((1, L.FL_N), dtype=np.int64)
    fr = np.zeros((1, L.FR_N))
    line = 100e9
    fr[0, [L.FR_RC_BPS, L.FR_RT_BPS, L.FR_ALPHA, L.FR_LINE_BPS]] = [line, line, 1.0, line]
    rc, rt, alpha, g = line, line, 1.0, 1 / 256
    rng = np.random.default_rng(5)
    for _ in range(300):
        r = rng.random()
        if r < 0.2:
            dcqcn.cut(fl, fr, 0, prm, fprm)
            rt, rc, alpha = rc if clamp else rt, max(rc * (1 - alpha / 2), 1e8), (1 - g) * alpha + g
            t = b = 0
        elif r < 0.4:
            dcqcn.decay_alpha(fr, 0, fprm)
            alpha *= 1 - g
        else:
            stage = L.FL_T_STAGE if r < 0.7 else L.FL_B_STAGE
            fl[0, stage] += 1
            t, b = fl[0, L.FL_T_STAGE], fl[0, L.FL_B_STAGE]
            dcqcn.increase(fl, fr, 0, prm)
            if min(t, b) > 5:
                rt = min(rt + 400e6, line)
            elif max(t, b) >= 5:
                rt = min(rt + 40e6, line)
            rc = min((rt + rc) / 2, line)
        assert fr[0, L.FR_RC_BPS] == pytest.approx(rc)
        assert fr[0, L.FR_RT_BPS] == pytest.approx(rt)
        assert fr[0, L.FR_ALPHA] == pytest.approx(alpha)


def reference_store_and_forward(sizes_wire, rates, delays_ps):
    """One flow's packets through a chain of links, each packet forwarded whole:
    a packet leaves a hop when it has fully arrived and the link is free."""
    free = [0.0] * len(rates)
    last = 0.0
    for w in sizes_wire:
        t = 0.0
        for h, (rate, delay) in enumerate(zip(rates, delays_ps, strict=True)):
            start = max(t, free[h])
            ser = -(-w * 8 * 10**12 // rate)
            free[h] = start + ser
            t = start + ser + delay
        last = t
    return last


def test_event_loop_matches_a_store_and_forward_reference_to_the_picosecond():
    fab = preset("lab-small")
    nics = fab.nic_ids
    mtu = 4096
    size = 37 * mtu + 1234
    sim = run(fab, flows([nics[1]], [nics[14]], size))
    ports = sim.path_port[sim.path_ptr[0] : sim.path_ptr[1]]
    wires = [mtu + L.DATA_OVERHEAD_BYTES] * 37 + [1234 + L.DATA_OVERHEAD_BYTES]
    end_ps = reference_store_and_forward(
        wires,
        [int(fab.port_rate_bps[p]) for p in ports],
        [int(fab.port_delay_ns[p]) * 1000 for p in ports],
    )
    assert sim.fl[0, L.FL_T_RECEIVED_PS] == end_ps
    # the flow ends when the ACK of its last packet has come back the same way
    assert sim.fl[0, L.FL_T_END_PS] == end_ps + ack_return_ps(fab, ports)


def test_a_port_left_with_nothing_to_send_does_not_look_again():
    """A switch port that puts its last queued frame on the wire, or a NIC's that puts
    out an ACK and has no flow of its own to send, has nothing to look for when the frame
    is out; whatever queues the next frame (or adds a flow) starts it, or asks for a look
    if the port is still busy. So each switch a frame crosses adds one event, its
    arrival, and not also a look that finds nothing (which was 0.46 of 2.01 events per
    packet-hop on bench_sim's (a)); and a receiver's ACKs add none beyond their arrivals.
    One flow on fat-tree-k8, to a host under its own rack switch (2 links) and to one in
    another pod (6 links): the same frames, data and ACKs, with 4 more hops each."""
    fab = preset("fat-tree-k8")
    size = 400_000
    counted = {}
    for dst in (1, 127):
        sim = run(fab, flows([0], [dst], size), cc="none")
        links = int(sim.path_ptr[1] - sim.path_ptr[0])
        c = sim.counters()
        counted[links] = (c["events"], c["packet_hops"], c["packet_hops"] // links)
    (near, hops, frames), (far, _, same_frames) = counted[2], counted[6]
    assert frames == same_frames > 100
    # a sample interval more or less for the longer run (a few events), not 4 per frame
    assert 4 * frames <= far - near <= 4 * frames + 4, (far - near, frames)
    # each frame's arrivals, the sender's look for each data frame, the flow's start and
    # the sample intervals: no look after each of the receiver's ACKs
    data = -(-size // int(fab.link_mtu_bytes.max()))
    assert hops + data < near <= hops + data + 5, (near, hops, data)


# purge, grant and complete against slow models ---------------------------------------------


def fifo(sim, p, cls):
    """The packets queued in class cls of port p, head first."""
    out = []
    i = int(sim.pt[p, L.PT_HEAD0 + 2 * cls])
    while i >= 0:
        out.append(i)
        i = int(sim.pk[i, L.PK_NEXT])
    return out


def events(sim, *kinds) -> Counter:
    """The pending events of `kinds`, as (kind, a, b) with how many of each."""
    ev = pending(sim.ev, sim.g)
    rows = ev[np.isin(ev[:, L.E_KIND], kinds)]
    return Counter((int(r[L.E_KIND]), int(r[L.E_A]), int(r[L.E_B])) for r in rows)


def new_events(sim, before: Counter, *kinds) -> list:
    """(kind, a, b) of the events of `kinds` pending now beyond those of `before`
    (`events`), sorted."""
    return sorted((events(sim, *kinds) - before).elements())


def shared_switch(sim, s) -> buffer_reference.Switch:
    """The reference model of shared-buffer switch s in the simulator's present state."""
    pt, nd = sim.pt, sim.nd
    ports = [int(q) for q in np.flatnonzero(sim.fabric.port_node == s)]
    reserved = int(pt[ports[0], L.PT_RESERVED_BYTES])
    model = buffer_reference.Switch(
        int(nd[s, L.ND_SB_SIZE]) + 2 * len(ports) * reserved, len(ports),
        int(nd[s, L.ND_SB_ALPHA]), reserved, int(pt[ports[0], L.PT_HEADROOM_BYTES]),
        int(pt[ports[0], L.PT_XON_OFFSET_BYTES]),
    )  # fmt: skip
    for q in ports:
        model.egress[(q, 0)] = int(pt[q, L.PT_Q0_BYTES])
        if pt[q, L.PT_PFC_ON]:
            model.ingress[q] = int(pt[q, L.PT_ING_BYTES])
            model.held[q] = int(pt[q, L.PT_HDRM_BYTES])
            if pt[q, L.PT_XOFF]:
                model.paused.add(q)
        else:
            model.egress[(q, 1)] = int(pt[q, L.PT_Q1_BYTES])
    return model


@njit
def borrowing(fn, S, *args):
    """Kernel fn called on the state as the loop holds it (`kernel.borrowed`): its one
    compiled copy, the one a run uses."""
    return fn(kernel.borrowed(S), *args)


def reference_purge(sim, p):
    """What losing port p's queues does: every packet dropped in queue order, a timeout
    for its data (go-back-N: where it starts; selective: its bytes to send again; a
    grant: -bytes, a request: 0), a switch's lossless bytes
    released from the ingress they came over, a resume where that ends a pause (the
    shared-buffer switch's rule from tests/buffer_reference.py where it runs that)."""
    pt, pk, pc = sim.pt, sim.pk, sim.pc
    ing = {int(k): int(pt[k, L.PT_ING_BYTES]) for k in range(len(pt))}
    xoff = {int(k): int(pt[k, L.PT_XOFF]) for k in range(len(pt))}
    resends, resumes = [], []
    packets = fifo(sim, p, 0) + fifo(sim, p, 1)
    shared = shared_switch(sim, int(pt[p, L.PT_NODE])) if pt[p, L.PT_SHARED] else None
    for cls, queue in ((0, fifo(sim, p, 0)), (1, fifo(sim, p, 1))):
        for i in queue:
            if shared is not None and cls == 1:
                k = int(pk[i, L.PK_ROUTE + pk[i, L.PK_HOP] - 1]) ^ 1
                if shared.lossless_leaves(k, int(pk[i, L.PK_WIRE_BYTES])):
                    resumes.append(k)
                ing[k] = shared.ingress[k]
            elif cls == 1 and not pt[p, L.PT_IS_NIC]:
                k = int(pk[i, L.PK_ROUTE + pk[i, L.PK_HOP] - 1]) ^ 1
                if pt[k, L.PT_PFC_ON]:
                    ing[k] -= int(pk[i, L.PK_WIRE_BYTES])
                    if xoff[k] and ing[k] <= pt[k, L.PT_XON_BYTES]:
                        xoff[k] = 0
                        resumes.append(k)
            kind, f = int(pk[i, L.PK_KIND]), int(pk[i, L.PK_FLOW])
            if kind == L.K_DATA and sim.prm[L.P_GO_BACK_N]:
                resends.append((L.EV_RTO, f, int(pc[i, L.PC_OFFSET_BYTES])))
            elif kind == L.K_DATA:
                resends.append((L.EV_RETX, f, int(pk[i, L.PK_BYTES])))
            elif kind == L.K_CTS:
                resends.append((L.EV_RETX, f, -int(pc[i, L.PC_ARG])))
            elif kind == L.K_REQ:
                resends.append((L.EV_RETX, f, 0))
    return packets, resends, ing, resumes


@pytest.mark.parametrize("model", ["shared", "static"])
@pytest.mark.parametrize("recovery", ["go-back-n", "selective"])
@pytest.mark.parametrize("room", ["ample", "short"])
def test_purge_drops_a_ports_queues_as_the_reference_does(room, recovery, model):
    fab = preset("lab-medium")
    queues = {r: dataclasses.replace(q, model=model) for r, q in fab.queues.items()}
    fab = dataclasses.replace(fab, queues=queues)
    nics = fab.nic_ids
    table = flows(nics[1:16], [nics[0]] * 15, 2_000_000)
    sim = Simulation(fab, table, cc="none", cc_params={"loss_recovery": recovery})
    sim.run(until_ns=40_000)
    p = int(fab.nic_port[nics[0]]) ^ 1  # the switch's port towards the receiver
    packets, resends, ing, resumes = reference_purge(sim, p)
    # a deep queue (the shared pool holds less); its loss ends the senders' pauses (every
    # one of the 15 per-port XOFFs; most of them where they share the pool)
    assert len(packets) > (1000 if model == "static" else 800)
    assert len(resumes) == 15 if model == "static" else len(resumes) >= 10
    drops, nfree = int(sim.g[L.G_DROPS]), int(sim.g[L.G_NFREE])
    before = events(sim, L.EV_RETX, L.EV_RTO, L.EV_TX)
    now = int(sim.g[L.G_NOW_PS])
    sim.pt[p, L.PT_ALIVE] = sim.pt[p ^ 1, L.PT_ALIVE] = 0
    if room == "short":  # room for a few packets' events: the rest waits for a larger list
        sim.ev = sim.ev[:, : int(sim.g[L.G_HEAP]) + 10].copy()
        assert not borrowing(kernel.purge, sim._state(), p, now)
        assert sim.pt[p, L.PT_PURGE] == 1 and sim.g[L.G_PURGING] == 1
        sim._grow_events()
        assert borrowing(kernel.finish_purges, sim._state(), now)
    else:
        room = np.zeros((HEAPS, 4 * len(packets), L.E_N), np.int64)
        sim.ev = np.concatenate([sim.ev, room], axis=1)
        assert borrowing(kernel.purge, sim._state(), p, now)
    assert sim.pt[p, L.PT_PURGE] == 0 and sim.g[L.G_PURGING] == 0
    assert fifo(sim, p, 0) == fifo(sim, p, 1) == []
    assert sim.pt[p, L.PT_Q0_BYTES] == sim.pt[p, L.PT_Q1_BYTES] == 0
    assert sim.g[L.G_DROPS] - drops == len(packets)
    assert sim.g[L.G_NFREE] - nfree == len(packets)
    assert new_events(sim, before, L.EV_RETX, L.EV_RTO) == sorted(resends)
    assert {k: int(sim.pt[k, L.PT_ING_BYTES]) for k in ing} == ing
    assert [a for _, a, _ in new_events(sim, before, L.EV_TX)] == sorted(resumes)
    assert [int(sim.pt[k, L.PT_PFC_PENDING]) for k in resumes] == [0] * len(resumes)


def test_a_port_paused_again_and_again_keeps_one_wake_up_event_ahead(tmp_path):
    """A port paused by PFC asks to look again when the pause ends, hundreds of
    microseconds ahead; most pauses are lifted by an XON and taken again. Each such look
    must not leave an event of its own behind in the far heap: one event still to come
    carries the later ones (`kernel.wait_tx`, `carry`). A permutation on fat-tree-k8
    with small per-port buffers pauses thousands of times; at every point at most one
    EV_TX per port lies beyond the near window and at most two in all (before: one left
    per pause, up to 73 on one port)."""
    from aifabric.scenarios import scenario_from_dict
    from aifabric.sim.engine import simulation_for

    n = 128
    perm = np.random.default_rng(3).permutation(n)
    while (perm == np.arange(n)).any():
        perm = np.roll(perm, 1)
    rows = [f"{i}->{perm[i]} id {i + 1} start 0 size 500000" for i in range(n)]
    (tmp_path / "m.cm").write_text("\n".join([f"Nodes {n}", f"Connections {n}", *rows]) + "\n")
    raw = {
        "scenario": {"topology": "fat-tree-k8", "workload": "./m.cm"},
        "queue": {"model": "static", "pfc_xoff": "40000B", "pfc_xon": "20000B"},
        "congestion_control": {"kind": "none"},
    }
    sim = simulation_for(scenario_from_dict(raw, "pauses", folder=tmp_path))
    most_far = most = 0
    for t_ns in range(10_000, 400_000, 10_000):
        done = sim.run(until_ns=t_ns)
        ev = pending(sim.ev, sim.g)
        tx = ev[ev[:, L.E_KIND] == L.EV_TX]
        far = tx[tx[:, L.E_TIME_PS] > int(sim.g[L.G_NOW_PS]) + NEAR_WINDOW_PS, L.E_A]
        most = max(most, np.bincount(tx[:, L.E_A]).max(initial=0))
        most_far = max(most_far, np.bincount(far).max(initial=0))
        if done:
            break
    assert done and sim.counters()["pfc_frames"] > 1000
    assert most_far == 1 and most <= 2


def reference_grants(nbytes, chunk, window, delivered, granted):
    """The grants a clear-to-send receiver sends now: whole chunks (the last one short)
    while at most `window` chunks are granted and not yet received."""
    out = []
    while granted < nbytes:
        n = min(chunk, nbytes - granted)
        if granted + n - delivered > window * chunk:
            break
        granted += n
        out.append(n)
    return out, granted


def test_grant_sends_the_grants_the_reference_does():
    fab = preset("lab-small")
    nics = fab.nic_ids
    rng = np.random.default_rng(5)
    for _ in range(60):
        nbytes = int(rng.integers(1, 3_000_000))
        sim = Simulation(fab, flows([nics[1]], [nics[0]], nbytes), cc="cts")
        chunk = int(rng.integers(1, 300_000))
        window = int(rng.integers(1, 12))
        granted = int(rng.integers(0, nbytes + 1))
        delivered = int(rng.integers(0, granted + 1))
        fl = sim.fl
        fl[0, L.FL_CHUNK_BYTES], fl[0, L.FL_WINDOW] = chunk, window
        fl[0, L.FL_GRANTED_BYTES], fl[0, L.FL_DELIV_BYTES] = granted, delivered
        want, total = reference_grants(nbytes, chunk, window, delivered, granted)
        borrowing(kernel.grant, sim._state(), 0, 0)
        sent = np.flatnonzero(sim.pk[:-1, L.PK_KIND] == L.K_CTS)  # allocated in index order
        assert [int(sim.pc[i, L.PC_ARG]) for i in sent] == want
        assert fl[0, L.FL_GRANTED_BYTES] == total
        assert all(sim.pk[i, L.PK_FLOW] == 0 for i in sent)


def test_complete_finishes_a_flow_and_starts_its_dependents_as_the_reference_does():
    fab = preset("lab-small")
    nics = fab.nic_ids
    deps = [[], [0], [0], [0, 1], [2], [0]]
    start = [0, 0, 500, 0, 0, 2_000]
    # flow 0 is an op of its own: completing it starts the later op's flows waiting on it
    # (a flow of its own op would start when its data arrived: `data_arrived`)
    table = flows(nics[1:7], nics[7:13], 10_000, deps=deps, start_ns=start, op=[0, 1, 1, 1, 1, 1])
    sim = Simulation(fab, table, cc="none")
    before, now = events(sim, L.EV_FLOW_START), 1_000 * L.PS_PER_NS
    waiting = [len(d) for d in deps]
    want = []
    for h, d in enumerate(deps):  # the flows waiting on flow 0, in the order they are listed
        if 0 in d:
            waiting[h] -= 1
            if waiting[h] == 0:
                want.append((h, max(now, start[h] * L.PS_PER_NS)))
    borrowing(kernel.complete, sim._state(), 0, now)
    fl = sim.fl
    assert fl[0, L.FL_STATE] == L.ST_DONE and fl[0, L.FL_T_END_PS] == now
    assert sim.g[L.G_DONE] == 1
    # each waiting flow hears of it at its sender, its op's base latency later (a message,
    # EV_DEP: the sender may be another partition's), and counts it then
    told = sorted(
        (int(r[L.E_A]), int(r[L.E_TIME_PS]))
        for r in pending(sim.ev, sim.g)
        if r[L.E_KIND] == L.EV_DEP
    )
    assert told == sorted((h, now + int(fl[h, L.FL_BASE_PS])) for h, d in enumerate(deps) if 0 in d)
    assert list(fl[:, L.FL_DEPS]) == [len(d) for d in deps]
    for h, t in told:
        borrowing(kernel.release_dep, sim._state(), h, t)
    assert list(fl[:, L.FL_DEPS]) == waiting
    started = {a for _, a, _ in before}
    starts = [r for r in pending(sim.ev, sim.g) if r[L.E_KIND] == L.EV_FLOW_START]
    got = sorted((int(r[L.E_A]), int(r[L.E_TIME_PS])) for r in starts if r[L.E_A] not in started)
    assert got == sorted(want)
    # ending a flow sends nothing: its ACKs are the receiver's (`received`)
    assert not (sim.pk[:-1, L.PK_KIND] == L.K_ACK).any()


@pytest.mark.parametrize("ack_every", ["flow", 4])
@pytest.mark.parametrize("finish", ["receiver", "sender"])
def test_a_receiver_with_every_byte_acks_once_per_flow_and_ends_the_flow_at_the_receiver(
    ack_every, finish
):
    fab = preset("lab-small")
    nics = fab.nic_ids
    sim = Simulation(
        fab, flows(nics[1:3], nics[7:9], 10_000), cc="none",
        cc_params={"ack_every": ack_every, "finish": finish},
    )  # fmt: skip
    now = 1_000 * L.PS_PER_NS
    borrowing(kernel.received, sim._state(), 0, now)
    fl = sim.fl
    assert fl[0, L.FL_T_RECEIVED_PS] == now
    acks = np.flatnonzero(sim.pk[:-1, L.PK_KIND] == L.K_ACK)
    # a coalescing receiver acknowledged its last packet as it took it, before this
    assert len(acks) == (ack_every == "flow")
    if len(acks):
        assert sim.pk[acks[0], L.PK_FLOW] == 0 and sim.pc[acks[0], L.PC_ARG] == 0
    at_receiver = finish == "receiver"
    # the flow's state is its sender's, which has not heard the ACK yet: not done
    assert fl[0, L.FL_STATE] != L.ST_DONE
    assert fl[0, L.FL_T_END_PS] == (now if at_receiver else -1)
    assert sim.g[L.G_DONE] == at_receiver
    # the last ACK back at the sender: its sender is done, and the flow ends there if it
    # finishes at the sender (once either way)
    back = now + 2_000 * L.PS_PER_NS
    borrowing(kernel.acknowledged, sim._state(), 0, back)
    assert fl[0, L.FL_STATE] == L.ST_DONE
    assert fl[0, L.FL_T_END_PS] == (now if at_receiver else back)
    assert sim.g[L.G_DONE] == 1


@njit
def _sum_rows(S, n):
    """A helper of the kind the loop calls: it takes the state, branches and loops."""
    total = 0
    for i in range(n):
        if S.pt[i, L.PT_ALIVE]:
            total += S.fl[i % S.fl.shape[0], L.FL_BYTES]
        else:
            S.g[L.G_STUCK] += 0
    return total


@njit
def _sum_borrowed(S, n):
    return _sum_rows(kernel.borrowed(S), n)


def test_the_loop_compiles_no_reference_counting_for_its_state():
    """`kernel.borrowed` hands the loop's helpers arrays that hold no meminfo in numba's
    data model, so numba compiles no NRT_incref / NRT_decref for them (a call each per
    array per helper call); an ordinary array's model holds one. The helper reads the
    same memory either way."""
    from numba import typeof
    from numba.core.datamodel import default_manager

    from aifabric.sim import precompile

    fab = preset("lab-small")
    nics = fab.nic_ids
    sim = Simulation(fab, flows(nics[1:4], nics[4:7], 10_000), cc="none")
    S = sim._state()
    plain, borrowed = typeof(S), precompile.state_type(sim)
    assert default_manager[plain].contains_nrt_meminfo()
    assert not default_manager[borrowed].contains_nrt_meminfo()
    fields = dict(zip(borrowed.fields, borrowed.types, strict=True))
    net = dict(zip(fields["net"].fields, fields["net"].types, strict=True))
    assert isinstance(fields["pt"], kernel.BorrowedArray) and fields["pt"].ndim == 2
    assert isinstance(net["nic_port"], kernel.BorrowedArray)
    n = 12
    alive, size = sim.pt[:, L.PT_ALIVE], sim.fl[:, L.FL_BYTES]
    want = sum(int(size[i % len(size)]) for i in range(n) if alive[i])
    assert _sum_borrowed(S, n) == _sum_rows(S, n) == want
    assert "NRT_incref" in _sum_rows.inspect_llvm((plain, typeof(n)))
    counted = _sum_rows.inspect_llvm((borrowed, typeof(n)))
    assert "NRT_incref" not in counted and "NRT_decref" not in counted


def test_no_kernel_function_calls_itself_even_through_others():
    # numba compiles mutual recursion, but a cached recursive kernel crashes when loaded
    import ast
    from pathlib import Path

    modules = ("kernel", "congestion", "dcqcn", "cts", "heap", "queue", "pfc", "ecn")
    calls: dict[str, set[str]] = {}
    for mod in modules:
        tree = ast.parse((Path(kernel.__file__).parent / f"{mod}.py").read_text())
        local = {fn.name for fn in tree.body if isinstance(fn, ast.FunctionDef)}
        imported = {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "aifabric.sim":
                imported.update({a.name: a.name for a in node.names})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "aifabric.sim."
            ):
                source = node.module.rsplit(".", 1)[1]
                imported.update({a.name: f"{source}.{a.name}" for a in node.names})
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            called = calls.setdefault(f"{mod}.{fn.name}", set())
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                target = node.func
                if isinstance(target, ast.Name) and target.id in local:
                    called.add(f"{mod}.{target.id}")
                elif isinstance(target, ast.Name) and target.id in imported:
                    called.add(imported[target.id])
                elif getattr(getattr(target, "value", None), "id", "") in modules:
                    called.add(f"{target.value.id}.{target.attr}")

    def reaches(start, goal, seen):
        for nxt in calls.get(start, ()):
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    assert len(calls) > 50 and "kernel.send_data" in calls["kernel.start_frame"]
    assert [f for f in calls if reaches(f, f, set())] == []


def _collective(fabric, **spec):
    from aifabric import traffic

    return traffic.generate(fabric, traffic.workload_from_dict(spec, "c"), seed=1)


def test_a_release_tells_its_inputs_senders_of_the_room_a_paths_propagation_later():
    """A tree connection's release frees the buffer of each input with a window (credit):
    its sender hears of it a path's propagation later, and only then may send more."""
    fab = preset("lab-medium")
    sim = Simulation(fab, _collective(fab, collective="allreduce", algorithm="tree",
                                      protocol="ll", size="1MiB", gpus=16), cc="none")  # fmt: skip
    gr, gio, gx = sim.gr, sim.gio, sim.gx
    windowed = [
        s for s in range(len(gr))
        if any(gr[gio[j], L.GR_WINDOW] > 0
               for j in range(gr[s, L.GR_IN_OFF], gr[s, L.GR_IN_OFF] + gr[s, L.GR_IN_N]))
    ]  # fmt: skip
    assert windowed
    s, now = windowed[0], 10**6
    borrowing(kernel.release, sim._state(), s, 3, now)
    credits = sorted(
        (int(r[L.E_A]), int(r[L.E_TIME_PS]), int(r[L.E_B]))
        for r in pending(sim.ev, sim.g)
        if r[L.E_KIND] == L.EV_CREDIT
    )
    want = []
    delay = sim.pt[:, L.PT_DELAY_PS]
    for j in range(gr[s, L.GR_IN_OFF], gr[s, L.GR_IN_OFF] + gr[s, L.GR_IN_N]):
        i = int(gio[j])
        if gr[i, L.GR_WINDOW] == 0:
            continue
        f0 = int(gr[i, L.GR_FLOW0])
        qps = range(f0, f0 + int(gr[i, L.GR_NQP]))
        prop = min(
            int(delay[sim.path_port[sim.path_ptr[f] : sim.path_ptr[f + 1]]].sum()) for f in qps
        )
        assert gio[gx[j]] == s  # the pair's place among the input's outputs
        want.append((i, now + prop, 3 * L.CREDIT_SLOTS + int(gx[j] - gr[i, L.GR_OUT_OFF])))
    assert credits == sorted(want) and all(t > now for _, t, _ in credits)
    for i, t, b in credits:
        j = gr[i, L.GR_OUT_OFF] + b % L.CREDIT_SLOTS
        assert gx[j] == 0  # not before it comes
        borrowing(kernel.credit, sim._state(), i, b, t)
        assert gx[j] == 3


def test_a_step_of_no_bytes_reaches_its_receiver_a_paths_propagation_after_its_release():
    """A 64-byte ring AllReduce over 128 ranks has steps of no bytes: their release is a
    message to the receiver (EV_SEEN), which then has them, and nothing sooner."""
    fab = preset("lab-medium")
    sim = Simulation(fab, _collective(fab, collective="allreduce", algorithm="ring",
                                      size="64B", gpus=128), cc="none")  # fmt: skip
    gr = sim.gr
    s = int(np.flatnonzero(gr[:, L.GR_EMPTY])[0])
    assert gr[s, L.GR_BYTES] < gr[s, L.GR_STEPS] and gr[s, L.GR_PROP_PS] > 0
    now = 10**6
    borrowing(kernel.release, sim._state(), s, 2, now)
    seen = [
        (int(r[L.E_A]), int(r[L.E_TIME_PS]), int(r[L.E_B]))
        for r in pending(sim.ev, sim.g)
        if r[L.E_KIND] == L.EV_SEEN
    ]
    assert seen == [(s, now + int(gr[s, L.GR_PROP_PS]), 2)]
    assert gr[s, L.GR_DONE] == 0
    borrowing(kernel.seen, sim._state(), s, 2, seen[0][1])
    # the steps with no bytes among the first two are there; one with bytes is not
    steps = [kernel.step_end(gr, s, k) for k in range(3)]
    assert gr[s, L.GR_DONE] == next(k for k in range(3) if k == 2 or steps[k + 1] > steps[k])


def _as_partition(sim, parts: int, k: int, lookahead_ps: int):
    """`sim`'s state as partition k of `parts` holds it (aifabric.sim.partition)."""
    from aifabric.sim import partition

    part = partition.assign(sim.fabric, parts)
    sim.nd[:, L.ND_PART] = part
    sim.prm[L.P_PARTITIONED], sim.prm[L.P_PART] = 1, k
    sim.prm[L.P_LOOKAHEAD_PS] = lookahead_ps
    return part


def test_a_drop_tells_the_nics_that_act_on_it_in_their_partitions():
    """A data packet lost in partition 0: its timeout is its sender's event, the timeout
    later (a message when another partition holds the sender), and a go-back-N receiver
    in another partition hears a lookahead later that the flow may come out of order
    (EV_LOST); one in this partition knows at once."""
    fab = preset("fat-tree-k8")
    sim = Simulation(fab, _collective(fab, pattern="permutation", gpus=128, size="1MB"))
    lookahead, now = 500_000, 10**6
    part = _as_partition(sim, 2, 0, lookahead)
    src, dst = part[sim.flows.src], part[sim.flows.dst]
    rto = int(sim.prm[L.P_RTO_PS])
    assert sim.prm[L.P_GO_BACK_N] and rto > lookahead
    p = int(np.flatnonzero(part[fab.port_node] == 0)[0])  # a port of partition 0
    for f, lost, sent in (
        (int(np.flatnonzero((src == 1) & (dst == 1))[0]), [(L.EV_LOST, 1)], [(L.EV_RTO, 1)]),
        (int(np.flatnonzero((src == 0) & (dst == 1))[0]), [(L.EV_LOST, 1)], []),
        (int(np.flatnonzero((src == 1) & (dst == 0))[0]), [], [(L.EV_RTO, 1)]),
    ):
        sim.g[L.G_OUT] = 0
        before = events(sim, L.EV_RTO, L.EV_LOST)
        i = borrowing(kernel.alloc, sim._state())
        sim.pk[i, L.PK_KIND], sim.pk[i, L.PK_FLOW], sim.pk[i, L.PK_BYTES] = L.K_DATA, f, 4000
        sim.pc[i, L.PC_OFFSET_BYTES] = 8000
        borrowing(kernel.drop, sim._state(), i, p, now)
        out = sim.out[: int(sim.g[L.G_OUT])]
        got = sorted((int(r[L.O_KIND]), int(r[L.O_PART]), int(r[L.O_TIME_PS])) for r in out)
        want = sorted(
            [(k, q, now + lookahead) for k, q in lost] + [(k, q, now + rto) for k, q in sent]
        )
        assert got == want, f
        assert all(int(r[L.O_A]) == f for r in out)
        here = new_events(sim, before, L.EV_RTO, L.EV_LOST)
        assert here == ([] if sent else [(L.EV_RTO, f, 8000)]), f
        assert sim.fl[f, L.FL_MAY_REORDER] == (0 if lost else 1), f


def test_a_go_back_n_timeout_reads_only_what_its_sender_heard():
    """A go-back-N timeout goes back to what its sender's ACKs and NAKs said the receiver
    had, never to the receiver's own count, so it acts the same with the receiver in
    another partition, whichever end the flow finishes at: a flow that ended at its
    receiver (`finish = "receiver"`) goes back too until its sender hears the last ACK. A
    timeout the sender went back since does nothing."""
    fab = preset("fat-tree-k8")
    sim = Simulation(fab, _collective(fab, pattern="permutation", gpus=128, size="1MB"))
    part = _as_partition(sim, 2, 0, 500_000)
    rto = int(sim.prm[L.P_RTO_PS])
    now = 2 * rto
    f = int(np.flatnonzero((part[sim.flows.src] == 0) & (part[sim.flows.dst] == 1))[0])
    fl = sim.fl

    def timeout(acked, rewind=-1, at_sender=1):
        fl[f, L.FL_STATE] = L.ST_ACTIVE
        fl[f, L.FL_UNSENT_BYTES] = fl[f, L.FL_BYTES] - 16_000  # 16 kB sent
        fl[f, L.FL_DELIV_BYTES] = 12_000  # the receiver's (another partition's) count
        fl[f, L.FL_ACKED_BYTES] = acked
        fl[f, L.FL_ACKED_PSN] = 1 if acked == 4000 else 3  # the PSN that ACK asked for next
        fl[f, L.FL_PSN] = fl[f, L.FL_SENT_PKTS] = 4  # four packets sent
        fl[f, L.FL_REWIND_PS] = rewind
        sim.prm[L.P_FINISH_AT_SENDER] = at_sender
        sim.g[L.G_RETX_BYTES] = 0
        borrowing(kernel.data_timeout, sim._state(), f, 8000, now)  # lost data at 8000
        return int(sim.g[L.G_RETX_BYTES])

    assert timeout(4000, rewind=now - rto + 1) == 0  # went back after the loss
    assert fl[f, L.FL_PSN] == 4
    assert timeout(12_000) == 0  # an ACK said the receiver has it
    assert timeout(4000) == 12_000  # back to 4000, not to the receiver's 12 kB
    assert fl[f, L.FL_REWIND_PS] == now
    # and to the PSN its last ACK asked for next: what it sent since took PSNs from 1 on
    assert fl[f, L.FL_PSN] - 1 == fl[f, L.FL_SENT_PKTS] - 4
    # ends at a receiver in another partition, which may have ended it: it goes back all
    # the same, as on one partition
    assert timeout(4000, at_sender=0) == 12_000
    sim.prm[L.P_PARTITIONED] = 0
    assert timeout(4000, at_sender=0) == 12_000
