import json

import networkx as nx
import pytest
from click.testing import CliRunner

from aifabric import __version__
from aifabric.cli import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_version():
    r = run("--version")
    assert r.exit_code == 0, r.output
    assert __version__ in r.output


def test_topo_presets_lists_every_preset():
    r = run("topo", "presets", "--json")
    assert r.exit_code == 0, r.output
    names = {p["name"] for p in json.loads(r.output)}
    assert {"lab-small", "lab-medium", "ai-zone", "cluster-24k"} <= names
    table = run("topo", "presets")
    assert "cluster-24k" in table.output and "three-tier" in table.output


def test_topo_show_cluster_24k_reports_nics_and_the_7_to_1_tier():
    r = run("topo", "show", "cluster-24k")
    assert r.exit_code == 0, r.output
    assert "24,576" in r.output
    assert "6.98:1" in r.output
    data = json.loads(run("topo", "show", "cluster-24k", "--json").output)
    assert data["nodes"]["nic"] == 24576
    ctsw = next(t for t in data["tiers"] if t["role"] == "ctsw")
    assert 6.9 < ctsw["down_up_value"] <= 7


def test_unknown_preset_is_one_sentence_and_non_zero():
    r = run("topo", "show", "no-such-preset")
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: unknown topology preset")
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_a_bad_spec_file_names_the_key(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[fabric]\nkind = "leaf-spine"\n[zone]\nracks = 4\nctsw_planez = 2\n')
    r = run("topo", "show", str(path))
    assert r.exit_code == 1, r.output
    assert "zone.ctsw_planez" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("fmt", ["json", "graphml", "dot"])
def test_topo_export(tmp_path, fmt):
    out = tmp_path / f"lab.{fmt}"
    r = run("topo", "export", "lab-small", "--format", fmt, "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    if fmt == "json":
        data = json.loads(text)
        assert data["schema"] == "aifabric.topology/1"
        assert sum(n["role"] == "nic" for n in data["nodes"]) == 16
        assert len(data["links"]) == 32
        assert {n["ipv4"] for n in data["nodes"] if n["role"] == "nic"} >= {"10.0.0.1"}
    elif fmt == "graphml":
        g = nx.read_graphml(out)
        assert g.number_of_nodes() == 22 and g.number_of_edges() == 32
        assert g.nodes["z0-r0-rtsw"]["role"] == "rtsw"
    else:
        assert text.startswith('graph "lab-small"')
        assert text.count(" -- ") == 32


@pytest.mark.parametrize("name", ["lab-small", "rail-256", "fat-tree-k8"])
def test_topology_json_holds_every_node_and_link_as_the_model_does(name):
    """topology.json's rows are the model's `Node` and `Link` fields (role as its label, a
    NIC's address beside), one per line, and read back as the same fabric."""
    from dataclasses import asdict

    import numpy as np

    from aifabric.fabric.addressing import format_ipv4, nic_ipv4
    from aifabric.fabric.export import fabric_from_topology, topology_json
    from aifabric.topologies import load_fabric

    fabric = load_fabric(name)
    text = topology_json(fabric)
    data = json.loads(text)
    ips = nic_ipv4(fabric)
    for node, row in zip(fabric.nodes, data["nodes"], strict=True):
        want = {**asdict(node), "role": node.role.label}
        if node.role.label == "nic":
            want["ipv4"] = format_ipv4(ips[node.id])
        assert row == want and list(row) == list(want)
    assert data["links"] == [asdict(link) for link in fabric.links]
    rows = [line for line in text.splitlines() if line.startswith('{"id": ')]
    assert len(rows) == len(fabric.nodes) + len(fabric.links)  # one per line
    back = fabric_from_topology(data)
    for col in ("node_role", "node_zone", "node_rack", "link_a", "link_b", "link_rate_bps"):
        assert np.array_equal(getattr(back, col), getattr(fabric, col)), col


def test_ecmp_shows_tiers_and_the_uniform_reference():
    r = run("ecmp", "lab-medium", "--flows", "300", "--seed", "1")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("tier "))
    assert lines[1].startswith("source ports linux: ")  # the rule, and its ports per flow
    columns = [c.strip() for c in lines[head].split("  ") if c.strip()]
    rows = lines[head + 2 : head + 4]
    assert len(set(columns)) == len(columns), columns
    for figure in ("max/mean", "CV", "Jain"):  # each beside its uniform-hashing expectation
        assert columns.index(f"uniform {figure}") == columns.index(figure) + 1, columns
    # up, and down over lab-medium's parallel links from each spine to each rack
    assert [row.split()[0] for row in rows] == ["rtsw>ctsw", "ctsw>rtsw"]
    assert "uplinks" not in r.output
    data = json.loads(run("ecmp", "lab-medium", "--flows", "300", "--json").output)
    up = next(t for t in data["tiers"] if t["tier"] == "rtsw>ctsw")
    assert up["qp_flows"] == 300
    assert sum(up["links"].values()) == 300
    assert up["expected"]["cv"] > 0
    # the down tier's keys say links too: they are not uplinks
    assert all("uplinks" not in t and "flows_per_uplink" not in t for t in data["tiers"])


def test_ecmp_same_seed_shows_polarization():
    def second_tier(*extra):
        out = run("ecmp", "fat-tree-k8", "--flows", "2000", "--json", *extra).output
        return next(t for t in json.loads(out)["tiers"] if t["tier"] == "ctsw>atsw")

    polarized, spread = second_tier("--same-seed"), second_tier()
    assert polarized["flows_per_link"]["0"] > 64  # 3 of 4 core uplinks idle
    assert polarized["load"]["max_mean"] > 2 * spread["load"]["max_mean"]


def test_ecmp_rejects_bad_options():
    r = run("ecmp", "lab-small", "--flows", "0")
    assert r.exit_code == 2, r.output
    r = run("ecmp", "lab-small", "--policy", "magic")
    assert r.exit_code == 2, r.output
