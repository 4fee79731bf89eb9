"""Faults undone: a link or switch brought back (`action = "up"`) in the simulator, the checks
that refuse a restore of something that is up, and what a restore gives back."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from aifabric.cli import main
from aifabric.fabric.errors import AifabricError
from aifabric.fabric.faults import (
    check_faults,
    ports_down,
    rerouted_switches,
    restored_ports,
    routing_after,
    routing_at_start,
)
from aifabric.fabric.scenario import Fault
from aifabric.sim import Simulation
from aifabric.sim import layout as L
from tests.conftest import fabric as preset
from tests.simhelp import flows, run

SCENARIO = """[scenario]
topology = "lab-small"
[workload]
collective = "allreduce"
size = "1MiB"
"""
UPLINK = "z0-r0-rtsw--z0-ctsw0"


def test_a_link_down_then_up_mid_run_gives_its_flows_back_and_carries_traffic_again():
    fab = preset("lab-small")
    nics = fab.nic_ids
    table = flows(nics[0:4], nics[8:12], 2000 * 4096)
    base = run(fab, table)
    port = int(base.path_port[base.path_ptr[0] + 1])  # the first flow's uplink, upwards
    link = port // 2
    crossed = [
        f for f in range(4) if link in base.path_port[base.path_ptr[f] : base.path_ptr[f + 1]] // 2
    ]
    down, up = Fault("link", link, 20_000), Fault("link", link, 80_000, "up")
    sim = Simulation(fab, table, faults=[down, up], sample_interval_ns=10_000)

    assert not sim.run(until_ns=50_000)  # between the two: nobody routes over the link
    assert link not in (sim.path_port // 2).tolist()
    assert (sim.pt[[port, port ^ 1], L.PT_ALIVE] == 0).all()
    assert sim.run()

    rec = sim.flow_records()
    assert (rec["end_ns"] > 80_000).all() and (rec["delivered_bytes"] == 2000 * 4096).all()
    for f in crossed:  # re-hashed back onto the route they had before the fault
        got = rec["path_link"][rec["path_ptr"][f] : rec["path_ptr"][f + 1]]
        want = base.path_port[base.path_ptr[f] : base.path_ptr[f + 1]] // 2
        assert got.tolist() == want.tolist(), f
        assert rec["route_epoch"][f] == 2
    assert (sim.pt[[port, port ^ 1], L.PT_ALIVE] == 1).all()
    sim.close()
    series = sim.port_samples()
    tx, t = series["tx_bytes"][:, port], series["t_ns"]
    assert tx[(t >= 30_000) & (t < 80_000)].sum() == 0
    assert tx[(t >= 80_000) & (t < 90_000)].sum() > 0  # carries traffic again at once
    c = sim.counters()
    assert c["flows_done"] == 4 and c["flows_without_path"] == 0
    # nothing is left in the fabric: every packet back in the pool, no purge half done
    assert (sim.pk[:-1, L.PK_KIND] < 0).all() and sim.g[L.G_NFREE] == len(sim.pk) - 1
    assert sim.g[L.G_PURGING] == 0 and sim.g[L.G_OVERFLOW] == 0


def test_a_drained_switch_brought_back_takes_new_flows_again():
    fab = preset("lab-small")
    nics = fab.nic_ids
    spine = fab.node_id("z0-ctsw0")
    spine_links = set(np.flatnonzero((fab.link_a == spine) | (fab.link_b == spine)).tolist())
    # sixteen flows that start after the restore: hashed over all the spines again
    table = flows(
        np.repeat(nics[0:4], 4), np.repeat(nics[8:12], 4), 50 * 4096, start_ns=[60_000] * 16
    )
    faults = [Fault("node", spine, 10_000, "drain"), Fault("node", spine, 40_000, "up")]
    sim = run(fab, table, faults=faults)
    drained = run(fab, table, faults=faults[:1])
    used = set(sim.flow_records()["path_link"].tolist())
    assert used & spine_links
    assert not set(drained.flow_records()["path_link"].tolist()) & spine_links


def test_a_restored_switch_leaves_down_a_link_taken_down_on_its_own():
    fab = preset("lab-small")
    spine = fab.node_id("z0-ctsw0")
    link = fab.port_id(UPLINK) // 2
    node_down = Fault("node", spine, 10)
    link_down = Fault("link", link, 20)
    node_up = Fault("node", spine, 30, "up")
    back = restored_ports(fab, node_up, [node_down, link_down])
    assert 2 * link not in back and 2 * link + 1 not in back
    spine_ports = {p for p in range(fab.n_ports) if fab.port_node[p] == spine}
    assert spine_ports - {2 * link, 2 * link + 1} <= set(back)
    assert ports_down(fab, [node_down, link_down, node_up]) == {2 * link, 2 * link + 1}
    r = routing_at_start(fab, [])
    for fault in (node_down, link_down, node_up):
        r = routing_after(fault, r)
    assert r.failed_links == {link} and not r.failed_nodes


def test_a_restore_reroutes_the_switches_its_fault_rerouted():
    fab = preset("lab-small")
    link = fab.port_id(UPLINK) // 2
    start = routing_at_start(fab, [])
    after = routing_after(Fault("link", link, 10), start)
    back = routing_after(Fault("link", link, 20, "up"), after)
    moved = rerouted_switches(start, after)
    assert len(moved) > 0 and fab.node_id("z0-r0-rtsw") in moved
    assert moved.tolist() == rerouted_switches(after, back).tolist()
    assert len(rerouted_switches(start, back)) == 0
    assert np.array_equal(back.dist, start.dist)


@pytest.mark.parametrize(
    "faults, words",
    [
        ([("link", "up", 10_000)], "link z0-r0-rtsw--z0-ctsw0 is restored (action up) at 10us"),
        ([("link", "down", 50_000), ("link", "up", 10_000)], "is restored (action up) at 10us"),
        ([("link", "down", 10_000), ("link", "up", 10_000)], "but is not down or drained"),
        ([("link", "down", 0), ("link", "up", 0)], "is restored (action up) at 0ns"),
        ([("link", "down", 0), ("link", "up", 5), ("link", "up", 9)], "at 9ns but is not"),
        ([("link", "down", 0), ("link", "down", 9)], "is down twice with no restore"),
    ],
)
def test_a_restore_of_something_that_is_up_is_one_sentence(faults, words):
    fab = preset("lab-small")
    link = fab.port_id(UPLINK) // 2
    with pytest.raises(AifabricError) as e:
        check_faults(fab, [Fault(kind, link, at, action) for kind, action, at in faults])
    assert words in str(e.value)


def test_down_up_down_is_three_faults_the_simulator_takes():
    fab = preset("lab-small")
    link = fab.port_id(UPLINK) // 2
    faults = [Fault("link", link, 0), Fault("link", link, 5, "up"), Fault("link", link, 9)]
    check_faults(fab, faults)
    with pytest.raises(AifabricError, match="not down or drained"):
        nics = fab.nic_ids
        Simulation(fab, flows(nics[:1], nics[9:10], 10), faults=[Fault("link", link, 5, "up")])


@pytest.mark.parametrize(
    "body, words",
    [
        (f'[[faults]]\nlink = "{UPLINK}"\nat = "10us"\naction = "up"\n',
         "scenario s: faults: link z0-r0-rtsw--z0-ctsw0 is restored (action up) at 10us but is "
         "not down or drained before then"),
        ('[[faults]]\nnode = "z0-ctsw1"\nat = "20us"\naction = "drain"\n'
         '[[faults]]\nnode = "z0-ctsw1"\nat = "10us"\naction = "up"\n',
         "node z0-ctsw1 is restored (action up) at 10us"),
        ('[[faults]]\nnode = "z0-ctsw1"\naction = "sideways"\n',
         "faults.action = 'sideways' must be one of down, drain, up"),
    ],
)  # fmt: skip
def test_aifabric_run_refuses_a_restore_of_something_up_before_writing(tmp_path, body, words):
    (tmp_path / "s.toml").write_text(SCENARIO + body)
    r = CliRunner().invoke(main, ["run", str(tmp_path / "s.toml"), "-o", str(tmp_path / "out")])
    assert r.exit_code == 1, r.output
    assert words in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_a_sweep_varies_when_a_fault_is_undone_and_a_restore_too_early_fails_alone(tmp_path):
    import pandas as pd

    from aifabric.fabric.rundir import Run

    (tmp_path / "s.toml").write_text(
        SCENARIO + f'[[faults]]\nlink = "{UPLINK}"\nat = "10us"\n'
        f'[[faults]]\nlink = "{UPLINK}"\nat = "20us"\naction = "up"\n'
    )
    out = tmp_path / "sweep"
    args = ["sweep", tmp_path / "s.toml", "--vary", "faults.1.at=5us,30us", "--workers", 1]
    r = CliRunner().invoke(main, [str(a) for a in [*args, "-o", out]])
    assert r.exit_code == 1 and "1 of 2 points failed" in r.output, r.output
    table = pd.read_csv(out / "results.csv")
    assert list(table["faults.1.at"]) == ["5us", "30us"]
    early, late = table.iloc[0], table.iloc[1]
    assert early["status"] == "failed"
    assert "is restored (action up) at 5us but is not down or drained" in early["error"]
    assert late["status"] == "complete", late["error"]
    applied = Run(out / late["run_dir"]).meta["results"]["summary"]["faults"]
    assert [(f["action"], f["at_ns"]) for f in applied] == [("down", 10_000), ("up", 30_000)]


def _emu(topology="lab-small"):
    from aifabric.emu import plan as P
    from aifabric.fabric.scenario import Scenario
    from aifabric.topologies import load_fabric
    from aifabric.traffic.flows import FlowTable

    fabric = load_fabric(topology)
    table = FlowTable.build({"src": np.array([0]), "dst": np.array([1])}, [[]], {})
    sc = Scenario(name="t", fabric=fabric, flows=table, topology=topology, workload={})
    return sc, P.plan(sc, ecn="none")


def test_the_routers_get_back_their_interfaces_and_routes_when_a_link_comes_up():
    from aifabric.emu import plan as P

    sc, pl = _emu()
    f = sc.fabric
    link = f.port_id(UPLINK) // 2
    down, up = Fault("link", link, 10), Fault("link", link, 20, "up")
    after, lines_down = P.fault_lines(pl, f, down, pl.routing, [])
    back, lines_up = P.fault_lines(pl, f, up, after, [down])
    ends = {int(f.link_a[link]): 2 * link, int(f.link_b[link]): 2 * link + 1}
    for node, port in ends.items():
        assert f"link set dev {pl.port_iface[port]} down" in lines_down[node]
        assert lines_up[node][0] == f"link set dev {pl.port_iface[port]} up"
    # the routes given back are those the switches were built with
    assert set(lines_up) == set(lines_down)
    for v in lines_up:
        routes = [x.removeprefix("route replace ") for x in lines_up[v] if x.startswith("route")]
        built = P.switch_routes(f, pl.routing, v, pl.nic_ip, pl.port_iface)
        assert routes and set(routes) <= set(built)
        assert set(routes) == set(built) - set(
            P.switch_routes(f, after, v, pl.nic_ip, pl.port_iface)
        )
    assert back.failed_links == frozenset()


def test_a_switch_brought_back_gets_every_route_and_a_link_down_on_its_own_stays_down():
    from aifabric.emu import ovs
    from aifabric.emu import plan as P

    sc, pl = _emu()
    f = sc.fabric
    spine = f.node_id("z0-ctsw0")
    link = f.port_id(UPLINK) // 2
    faults = [Fault("node", spine, 10), Fault("link", link, 20), Fault("node", spine, 30, "up")]
    r0 = pl.routing
    r1, _ = P.fault_lines(pl, f, faults[0], r0, [])
    r2, _ = P.fault_lines(pl, f, faults[1], r1, faults[:1])
    r3, lines = P.fault_lines(pl, f, faults[2], r2, faults[:2])
    ups = [x for x in lines[spine] if x.startswith("link")]
    assert f"link set dev {pl.port_iface[2 * link + 1]} up" not in ups
    assert len(ups) == len(f.ports_of(spine)) - 1
    routes = [x for x in lines[spine] if x.startswith("route")]
    assert len(routes) == len(f.nic_ids)  # every one: it kept stale routes while down
    groups = ovs.group_changes(pl, f, r2, r3, spine)
    assert len(groups) == len(f.nic_ids)
    assert groups == ovs.bridge_rules(pl, f, r3, spine)[0]


DOWN_UP = SCENARIO + (
    f'[[faults]]\nlink = "{UPLINK}"\nat = "10us"\n'
    f'[[faults]]\nlink = "{UPLINK}"\nat = "30us"\naction = "up"\n'
)


@pytest.fixture(scope="module")
def down_up(tmp_path_factory):
    """A ring of lab-small whose rack-0 uplink goes down at 10 us and comes back at 30 us,
    run through `aifabric run`: (its output, its run directory)."""
    folder = tmp_path_factory.mktemp("down-up")
    (folder / "s.toml").write_text(DOWN_UP)
    r = CliRunner().invoke(main, ["run", str(folder / "s.toml"), "-o", str(folder / "run")])
    assert r.exit_code == 0, r.output
    return r.output, folder / "run"


def test_the_run_summary_and_run_json_list_every_fault_applied(down_up):
    from aifabric.fabric.rundir import Run

    output, path = down_up
    assert f"fault applied     {UPLINK} down at 10us\n" in output
    assert f"fault applied     {UPLINK} up at 30us\n" in output
    assert "fault not reached" not in output
    applied = Run(path).meta["results"]["summary"]["faults"]
    assert [(f["target"], f["action"], f["at_ns"], f["applied_ns"]) for f in applied] == [
        (UPLINK, "down", 10_000, 10_000),
        (UPLINK, "up", 30_000, 30_000),
    ]


def test_analyze_shows_what_each_fault_changed(down_up):
    import json

    from aifabric.fabric.rundir import Run

    _, path = down_up
    r = CliRunner().invoke(main, ["analyze", str(path), "--json"])
    assert r.exit_code == 0, r.output
    down, up = json.loads(r.output)["faults"]
    assert (down["action"], down["at_ns"], up["action"], up["at_ns"]) == (
        "down",
        10_000,
        "up",
        30_000,
    )
    fab = preset("lab-small")
    a, b = fab.node_role[fab.link_a], fab.node_role[fab.link_b]
    tier = np.flatnonzero((np.minimum(a, b) == 1) & (np.maximum(a, b) == 2))  # rtsw-ctsw
    rate = int(fab.link_rate_bps[fab.port_id(UPLINK) // 2])
    assert down["capacity_out"] == [
        {"tier": "rtsw>ctsw", "links_out": 1, "links": len(tier), "capacity_out_bps": rate,
         "capacity_bps": rate * len(tier), "fraction": 1 / len(tier)}
    ]  # fmt: skip
    assert up["capacity_out"] == []
    # the rack switch and the spine re-route around the link, and back
    assert down["switches_rerouted"] == up["switches_rerouted"] == 2
    # the flows the simulator re-routed at the restore (route epoch 2) that were underway
    flows = Run(path).flows()
    underway = (flows["start_ns"] < 30_000) & (flows["end_ns"] > 30_000)
    assert up["flows_moved"] == int(((flows["route_epoch"] == 2) & underway).sum()) > 0
    assert down["flows_moved"] >= up["flows_moved"]

    r = CliRunner().invoke(main, ["analyze", str(path)])
    assert r.exit_code == 0, r.output
    text = r.output[r.output.index("faults applied") :]
    rows = [line.split() for line in text.splitlines()[3:5]]
    share = f"({100 / len(tier):.2f}%)"
    assert rows[0][:3] == [UPLINK, "down", "10us"]
    assert rows[0][-3:] == ["rtsw>ctsw", f"1/{len(tier)}", share]
    assert rows[1][:3] == [UPLINK, "up", "30us"] and rows[1][-1] == "none"


TIME_CHARTS = (  # every chart over time (the busiest links' title counts them)
    "Throughput into each job's receivers",
    "busiest links",
    "Queue depth",
    "ECN, CNPs and PFC over time",
    "Collectives",
)


def test_the_report_marks_each_fault_on_every_chart_over_time(down_up, tmp_path):
    from tests.test_analysis_report import CHROMIUM, render_in_chromium

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian package chromium)")
    from aifabric.fabric.rundir import Run

    _, path = down_up
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["report", str(path), "-o", str(out)])
    assert r.exit_code == 0, r.output
    check = render_in_chromium(out, tmp_path / "profile")
    assert check["errors"] == [] and check["plots"] == check["rendered"]
    assert f"fault: {UPLINK} up at 30us (2 switches re-routed, " in out.read_text()
    run = Run(path)
    t0 = {"Collectives": int(run.collectives()["start_ns"].min())}
    series_t0 = int(run.ports()["t_ns"][0])
    marked = {}
    for fig in check["figures"]:
        title = fig["title"].split(":")[0].split(" (")[0]
        faults = [s for s in fig["shapes"] if (s.get("name") or "").startswith("fault: ")]
        if faults:
            marked[title] = faults
            at = t0.get(title, series_t0)
            # one line per fault (per subplot: the ECN, CNP and PFC timeline has three)
            per = 3 if title.startswith("ECN") else 1
            assert sorted((s["name"], s["x0"], s["x1"]) for s in faults) == sorted(
                [(f"fault: {UPLINK} down", (10_000 - at) / 1e3, (10_000 - at) / 1e3)] * per
                + [(f"fault: {UPLINK} up", (30_000 - at) / 1e3, (30_000 - at) / 1e3)] * per
            ), title
    assert sorted(next(c for c in TIME_CHARTS if c in t) for t in marked) == sorted(TIME_CHARTS)
