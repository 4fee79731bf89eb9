import math

import networkx as nx
import numpy as np
import pytest

from aifabric.fabric.errors import SpecError
from aifabric.fabric.model import Role
from aifabric.fabric.summary import bisection_bps, summarize_fabric, tiers
from aifabric.topologies import build, parse, preset_names


def degrees(f, role):
    ids = np.flatnonzero(f.node_role == role)
    return {f.degree(i) for i in ids}


@pytest.mark.parametrize(
    ("preset", "counts", "degree"),
    [
        ("lab-small", (16, 4, 2, 0), {Role.RTSW: 4 + 4, Role.CTSW: 4 * 2}),
        ("lab-medium", (128, 8, 8, 0), {Role.RTSW: 16 + 16, Role.CTSW: 8 * 2}),
        # 192 racks x 2 servers x 8 GPUs; 18 = 16 x 1.125 CTSWs; 2 x 16 uplink planes x 1.125.
        ("ai-zone", (3072, 192, 18, 0), {Role.RTSW: 16 + 36, Role.CTSW: 192 * 2}),
        # 8 zones; CTSW uplinks ceil(384 / 7) = 55, 5 ATSWs per plane, 11 links to each.
        (
            "cluster-24k",
            (24576, 1536, 144, 90),
            {Role.RTSW: 52, Role.CTSW: 384 + 55, Role.ATSW: 8 * 11},
        ),
        ("fat-tree-k8", (128, 32, 32, 16), {Role.RTSW: 8, Role.CTSW: 8, Role.ATSW: 8}),
        ("fat-tree-k16", (1024, 128, 128, 64), {Role.RTSW: 16, Role.CTSW: 16, Role.ATSW: 16}),
        ("fat-tree-k32", (8192, 512, 512, 256), {Role.RTSW: 32, Role.CTSW: 32, Role.ATSW: 32}),
        ("rail-256", (256, 32, 8, 0), {Role.RTSW: 8 + 8, Role.CTSW: 4 * 8}),
    ],
)
def test_presets_build_with_the_counts_and_degrees_their_specs_imply(
    get_fabric, preset, counts, degree
):
    f = get_fabric(preset)
    assert tuple(f.count(r) for r in Role) == counts
    assert degrees(f, Role.NIC) == {1}
    for role, d in degree.items():
        assert degrees(f, role) == {d}, role


def test_every_preset_is_covered():
    assert {"lab-small", "lab-medium", "ai-zone", "cluster-24k"} <= set(preset_names())


def test_tier_ratios_follow_the_spec(get_fabric):
    ai = {t["role"]: t for t in tiers(get_fabric("ai-zone"))}
    # Meta doubled RTSW uplinks (1:2) and adds 1:1.125 spine redundancy.
    assert ai["rtsw"]["up_bps"] / ai["rtsw"]["down_bps"] == pytest.approx(2 * 1.125)
    assert ai["rtsw"]["down_up"] == "1:2.25"
    cl = {t["role"]: t for t in tiers(get_fabric("cluster-24k"))}
    ratio = cl["ctsw"]["down_up_value"]
    assert ratio <= 7 and ratio == pytest.approx(384 / 55)
    assert cl["ctsw"]["down_up"] == "6.98:1"


def test_rail_design_puts_nic_k_on_rail_switch_k(get_fabric):
    f = get_fabric("rail-256")
    nics = f.nic_ids
    sw = f.nic_switch[nics]
    assert np.array_equal(f.node_rail[sw], f.node_rail[nics])
    assert np.array_equal(f.node_rack[sw], f.node_rack[nics])
    # The 8 NICs of one server reach 8 different switches.
    server = nics[(f.node_rack[nics] == 0) & (f.node_server[nics] == 0)]
    assert len(set(f.nic_switch[server])) == 8


def test_cluster_24k_builds_in_seconds_and_names_follow_the_scheme(get_fabric):
    f = get_fabric("cluster-24k")
    assert f.node_name[f.nic_ids[0]] == "z0-r0-h0-nic0"
    assert "z7-r191-h1-nic7" in f._ids_by_name
    assert "z3-r12-rtsw" in f._ids_by_name
    assert "z0-ctsw17" in f._ids_by_name
    assert "p17-atsw4" in f._ids_by_name


def _max_flow_bisection(f):
    """Max flow from the first half of the NICs to the second: the bisection by definition."""
    g = nx.DiGraph()
    for a, b, rate in zip(f.link_a, f.link_b, f.link_rate_bps, strict=True):
        for u, v in ((a, b), (b, a)):
            cap = g.get_edge_data(u, v, {"capacity": 0})["capacity"]
            g.add_edge(int(u), int(v), capacity=cap + int(rate))
    nics = f.nic_ids
    half = len(nics) // 2
    for n in nics[:half]:
        g.add_edge("s", int(n), capacity=math.inf)
    for n in nics[half:]:
        g.add_edge(int(n), "t", capacity=math.inf)
    return nx.maximum_flow_value(g, "s", "t")


FAT_TREE_4 = '[fabric]\nkind = "fat-tree"\n[fat_tree]\nk = 4\n[links]\nrate = "100G"\n'
OVERSUBSCRIBED = """
[fabric]
kind = "leaf-spine"
[servers]
gpus_per_server = 4
servers_per_rack = 2
[zone]
racks = 4
ctsw_planes = 2
rtsw_up_down = 0.5
"""


@pytest.mark.parametrize(
    "source", ["lab-small", "lab-medium", "rail-256", FAT_TREE_4, OVERSUBSCRIBED]
)
def test_bisection_equals_max_flow(get_fabric, source):
    f = get_fabric(source) if "\n" not in source else build(parse(source, "inline"))
    assert bisection_bps(f) == _max_flow_bisection(f)


def test_summary_reports_diameter_and_bisection(get_fabric):
    s = summarize_fabric(get_fabric("cluster-24k"))
    assert s["nodes"]["nic"] == 24576
    assert s["hop_diameter"] == 6
    assert s["bisection_bps"] == 8 * 18 * 55 * 400 * 10**9 // 2
    assert summarize_fabric(get_fabric("lab-small"))["hop_diameter"] == 4


def spec_text(**overrides):
    tables = {
        "fabric": {"kind": '"leaf-spine"'},
        "servers": {"gpus_per_server": "2", "servers_per_rack": "2"},
        "zone": {"racks": "4", "ctsw_planes": "2"},
    }
    for key, value in overrides.items():
        table, _, name = key.partition("__")
        tables.setdefault(table, {})[name] = value
    return "\n".join(
        f"[{t}]\n" + "\n".join(f"{k} = {v}" for k, v in body.items() if v is not None)
        for t, body in tables.items()
    )


def test_the_base_spec_of_the_error_cases_builds():
    assert build(parse(spec_text(), "base")).count(Role.NIC) == 16


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"zone__rackz": "3"}, ["zone.rackz", "3"]),
        ({"switches__count": "3"}, ["unknown table [switches]"]),
        ({"links__rate": '"400X"'}, ["links.rate", "400X", "is not a rate"]),
        ({"links__delay": '"fast"'}, ["links.delay", "fast"]),
        ({"zone__racks": "0"}, ["zone.racks", "0", "at least 1"]),
        ({"zone__racks": '"four"'}, ["zone.racks", "four", "whole number"]),
        ({"servers__gpus_per_server": "3", "zone__ctsw_planes": "4"}, ["rtsw_up_down", "divide"]),
        ({"zone__ctsw_planes": "16", "zone__spine_redundancy": "1.1"}, ["spine_redundancy", "1.1"]),
        ({"zone__rtsw_up_down": "0"}, ["zone.rtsw_up_down", "zero"]),
        ({"radix__rtsw": "6"}, ["radix.rtsw = 6", "needs 8 ports"]),
        ({"radix__ctsw": "4"}, ["radix.ctsw = 4", "needs 8 ports"]),
        ({"fabric__kind": '"torus"'}, ["fabric.kind", "torus"]),
        ({"fat_tree__k": "4"}, ["[fat_tree]", "does not apply"]),
        ({"queue__ecn_kmin": '"2MiB"', "queue__ecn_kmax": '"1MiB"'}, ["kmin", "kmax"]),
        ({"queue__pfc_xon": '"2MiB"'}, ["xon", "xoff"]),
        ({"queue__ctsw": "{ buffer = '1KiB' }"}, ["queue.ctsw", "exceeds the buffer"]),
        (
            {"queue__buffer": '"512KiB"', "queue__model": '"static"'},
            ["queue.rtsw", "PFC xoff (1048576 B)", "(524288 B)"],
        ),
        ({"queue__model": '"fifo"'}, ["queue.rtsw", "queue model = 'fifo'", "shared, static"]),
        (
            {"queue__pfc_headroom": '"4195B"'},
            ["fabric bad", "rtsw queues' PFC headroom (4195 B)", "one frame", "(4196 B)"],
        ),
    ],
)
def test_invalid_specs_fail_with_one_sentence_naming_key_and_value(overrides, fragments):
    with pytest.raises(SpecError) as err:
        build(parse(spec_text(**overrides), "bad"))
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_buffer_checks_follow_the_features_that_are_on():
    lossless = spec_text(
        queue__buffer='"60000B"', queue__pfc_xoff='"60000B"', queue__pfc_xon='"30000B"',
        queue__ecn_kmin='"10000B"', queue__ecn_kmax='"50000B"',
    )  # fmt: skip
    q = build(parse(lossless, "lossless")).queue(Role.RTSW)
    assert (q.buffer_bytes, q.pfc.xoff_bytes, q.pfc.headroom_bytes) == (60_000, 60_000, 256 * 1024)
    off = spec_text(queue__buffer='"64KiB"', queue__ecn="false", queue__pfc="false")
    q = build(parse(off, "off")).queue(Role.CTSW)
    assert q.buffer_bytes < min(q.ecn.kmax_bytes, q.pfc.xoff_bytes)
    small = spec_text(queue__pfc_headroom='"4196B"')
    assert build(parse(small, "small")).queue(Role.RTSW).pfc.headroom_bytes == 4096 + 100
    tiny = spec_text(queue__pfc_headroom='"1KiB"', queue__pfc="false")
    assert build(parse(tiny, "tiny")).queue(Role.RTSW).pfc.headroom_bytes == 1024


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[fabric]\nkind = "fat-tree"\n[fat_tree]\nk = 5\n', "fat_tree.k = 5 must be even"),
        ("[fabric]\nkind = ", "not valid TOML"),
        ("[zone]\nracks = 1\n", "kind is missing"),
        (
            '[fabric]\nkind = "three-tier"\n[zone]\nracks = 2\nctsw_planes = 1\n'
            "[aggregation]\nzones = 2\nradix = 3\n",
            "aggregation.radix",
        ),
    ],
)
def test_more_invalid_specs(text, fragment):
    with pytest.raises(SpecError, match=fragment.replace("[", r"\[").replace(".", r"\.")):
        build(parse(text, "bad"))


def test_a_missing_file_and_an_unknown_preset_are_one_sentence(tmp_path):
    from aifabric.topologies import load

    with pytest.raises(SpecError, match="does not exist"):
        load(tmp_path / "nope.toml")
    with pytest.raises(SpecError, match="unknown topology preset 'no-such-preset'"):
        load("no-such-preset")


def test_three_tier_oversubscription_rounds_uplinks_up():
    text = """
[fabric]
kind = "three-tier"
[servers]
gpus_per_server = 4
servers_per_rack = 1
[zone]
racks = 7
ctsw_planes = 2
[aggregation]
zones = 3
atsw_per_plane = 2
oversubscription = 3
"""
    f = build(parse(text, "t"))
    ctsw = {t["role"]: t for t in tiers(f)}["ctsw"]
    # 7 racks x 2 links = 14 downlinks per CTSW; 14 / 3 -> 5, rounded up to 6 for 2 ATSWs.
    assert ctsw["down_bps"] / ctsw["up_bps"] == pytest.approx(14 / 6)
    assert f.count(Role.ATSW) == 2 * 2
    assert degrees(f, Role.ATSW) == {3 * 3}


def test_a_scenario_queue_the_model_cannot_honour_is_refused_naming_the_scenario():
    from aifabric.scenarios import scenario_from_dict

    raw = {
        "scenario": {"topology": "lab-small"},
        "workload": {"pattern": "incast", "senders": 3, "size": "1MB", "gpus": 4},
        "queue": {"rtsw": {"pfc_headroom": "2KiB"}},
    }
    with pytest.raises(SpecError, match="^scenario tight: fabric lab-small: the rtsw queues'"):
        scenario_from_dict(raw, "tight")
    raw["queue"] = {"buffer": "60000B", "pfc_xoff": "60000B", "pfc_xon": "30000B",
                    "ecn_kmin": "10000B", "ecn_kmax": "50000B"}  # fmt: skip
    assert scenario_from_dict(raw, "lossless").fabric.queue(Role.RTSW).pfc.xoff_bytes == 60_000


@pytest.mark.parametrize("name", preset_names())
def test_the_size_limit_counts_exactly_the_nodes_and_links_built(name, get_fabric, monkeypatch):
    """The limit is checked before building, from the spec alone: a preset builds at
    a limit of exactly its own counts, and one node or link fewer refuses it."""
    from aifabric.topologies import builders, load

    f = get_fabric(name)
    spec = load(name)
    monkeypatch.setattr(builders, "MAX_NODES", f.n_nodes)
    monkeypatch.setattr(builders, "MAX_LINKS", f.n_links)
    assert build(spec).n_links == f.n_links
    for limit in ("MAX_NODES", "MAX_LINKS"):
        monkeypatch.setattr(builders, limit, getattr(builders, limit) - 1)
        with pytest.raises(SpecError, match=f"{f.n_nodes:,} nodes and {f.n_links:,} links"):
            build(spec)
        monkeypatch.setattr(builders, limit, getattr(builders, limit) + 1)
