"""Topologies, paths and traffic of the TE wing: the datasets load, paths are the k shortest, the
gravity model has the stated form, bad files name the flag."""

from __future__ import annotations

import itertools
import json

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.te.inputs import TOPOLOGIES, load_topology, load_traffic
from lightrail.te.network import DEFAULT_CAPACITY_GBPS, Wan
from lightrail.te.paths import k_shortest_paths
from lightrail.te.traffic import gravity


@pytest.mark.parametrize("name, nodes, edges", [("geant", 22, 36), ("abilene", 12, 15), ("tatanld", 143, 181)])
def test_embedded_topologies_load_with_both_directions_of_every_link(name, nodes, edges):
    wan = load_topology(name)
    assert wan.n == nodes and wan.links == 2 * edges  # SNDlib / Topology Zoo counts, two directions each
    pairs = set(zip(wan.src.tolist(), wan.dst.tolist(), strict=True))
    assert all((b, a) in pairs for a, b in pairs)
    assert np.all(wan.capacity == DEFAULT_CAPACITY_GBPS) and np.all(np.isfinite(wan.length_km))


def test_sndlib_demands_become_masses_and_short_names_are_listed():
    assert load_topology("geant").mass is not None and load_topology("tatanld").mass is None
    assert {"geant", "abilene", "tatanld"} <= set(TOPOLOGIES)


def test_json_topology_file(tmp_path):
    f = tmp_path / "net.json"
    f.write_text(json.dumps({"name": "tri", "nodes": [{"name": "A", "lon": 0, "lat": 0}, "B", "C"],
                             "links": [{"a": "A", "b": "B", "capacity_gbps": 400, "length_km": 10},
                                       {"a": "B", "b": "C"}, {"a": "A", "b": "C", "length_km": 5}]}))
    wan = load_topology(str(f))
    assert wan.nodes == ("A", "B", "C") and wan.links == 6
    assert sorted(wan.capacity.tolist()) == [100.0] * 4 + [400.0] * 2


@pytest.mark.parametrize("doc, field", [
    ({"nodes": ["A", "B"], "links": [{"a": "A", "b": "Z"}]}, "--topology"),
    ({"nodes": ["A", "B"], "links": [{"a": "A", "b": "B", "capacity_gbps": -1}]}, "links.0.capacity_gbps"),
    ({"nodes": ["A"], "links": [{"a": "A", "b": "A"}]}, "nodes"),
    ({"nodes": ["A", "B"], "links": [{"a": "A", "b": "B", "speed": 1}]}, "links.0.speed"),
])
def test_bad_topology_file_names_the_field(tmp_path, doc, field):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ScenarioError) as e:
        load_topology(str(f))
    assert e.value.field == field


def test_unknown_topology_names_the_flag_and_lists_choices():
    with pytest.raises(ScenarioError) as e:
        load_topology("nowhere")
    assert e.value.field == "--topology" and "geant" in e.value.fix


def test_disconnected_topology_is_refused():
    wan = Wan.from_edges("two", "abcd", [(0, 1), (2, 3)])
    with pytest.raises(InfeasibleError, match="no path"):
        k_shortest_paths(wan)


def _random_wan(seed: int, n: int) -> Wan:
    g = nx.connected_watts_strogatz_graph(n, 4, 0.3, seed=seed)
    rng = np.random.default_rng(seed)
    km = rng.uniform(1, 10, g.number_of_edges())
    return Wan.from_edges("r", [str(i) for i in range(n)], list(g.edges), length_km=km)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(5, 9), k=st.integers(1, 5))
def test_paths_are_the_k_shortest_simple_paths_by_brute_force(seed, n, k):
    wan = _random_wan(seed, n)
    ps = k_shortest_paths(wan, k)
    length = {(a, b): w for a, b, w in zip(wan.src.tolist(), wan.dst.tolist(), wan.length_km, strict=True)}
    g = nx.DiGraph(list(length))
    for d, (s, t) in enumerate(ps.pairs.tolist()):
        routes = ps.routes[ps.offsets[d]:ps.offsets[d + 1]]
        every = sorted(sum(length[e] for e in itertools.pairwise(r)) for r in nx.all_simple_paths(g, s, t))
        got = [sum(length[e] for e in itertools.pairwise(r)) for r in routes]
        assert len(routes) == min(k, len(every)) and len(set(routes)) == len(routes)
        np.testing.assert_allclose(sorted(got), every[:len(got)])  # the k shortest lengths, ties either way
        assert all(r[0] == s and r[-1] == t and len(set(r)) == len(r) for r in routes)
    # the incidence holds exactly each route's links
    for p, r in enumerate(ps.routes):
        links = set(ps.incidence[:, p].nonzero()[0].tolist())
        assert links == {int(np.flatnonzero((wan.src == a) & (wan.dst == b))[0]) for a, b in itertools.pairwise(r)}
    assert ps.demands == n * (n - 1) and np.array_equal(np.bincount(ps.path_demand), np.diff(ps.offsets))


def test_gravity_is_a_product_of_masses_without_noise_or_cycle():
    wan = load_topology("abilene")
    tm = gravity(wan, 2, amplitude=0.0, noise=0.0)[0]
    m = wan.mass / wan.mass.sum()
    expected = np.outer(m, m)
    np.fill_diagonal(expected, 0)
    np.testing.assert_allclose(tm, expected / expected.sum())


def test_gravity_diurnal_cycle_follows_local_time():
    wan = Wan.from_edges("ew", ["west", "east"], [(0, 1)], lon=[-90.0, 90.0], lat=[0.0, 0.0])
    tms = gravity(wan, 288, noise=0.0, amplitude=0.5)  # one day at 5 minutes
    traffic = tms[:, 0, 1]
    # f_west * f_east with a 12 h phase shift: sin(x - pi/2) * sin(x + pi/2) terms; 24 h periodic
    hours = np.arange(288) * 5 / 60
    f = lambda lon: 1 + 0.5 * np.sin(2 * np.pi * (hours + lon / 15) / 24)  # noqa: E731
    np.testing.assert_allclose(traffic, 0.5 * np.sqrt(f(-90.0) * f(90.0)))


def test_gravity_noise_has_mean_one():
    wan = load_topology("abilene")
    noisy, clean = gravity(wan, 400, noise=0.2, seed=3), gravity(wan, 400, noise=0.0, seed=3)
    ratio = noisy[:, ~np.eye(wan.n, dtype=bool)] / clean[:, ~np.eye(wan.n, dtype=bool)]
    assert abs(ratio.mean() - 1) < 0.01 and 0.15 < np.log(ratio).std() < 0.25


def test_traffic_file_formats_round_trip(tmp_path):
    wan = load_topology("abilene")
    tms = gravity(wan, 3, seed=1)
    np.save(tmp_path / "t.npy", tms)
    lines = [m.ravel().tolist() for m in tms]
    (tmp_path / "t.txt").write_text("# one matrix per line\n" + "\n".join(" ".join(map(repr, r)) for r in lines))
    (tmp_path / "t.csv").write_text("\n".join(",".join(map(repr, r)) for r in lines))
    for name in ("t.npy", "t.txt", "t.csv"):
        np.testing.assert_array_equal(load_traffic(tmp_path / name, wan.n), tms)


def test_traffic_folder_of_one_matrix_per_file(tmp_path):
    wan = load_topology("abilene")
    tms = gravity(wan, 3, seed=2)
    for t, m in enumerate(tms):  # n rows of n numbers, .npy, and one line: all read in name order
        if t == 0:
            (tmp_path / "t0.txt").write_text("\n".join(" ".join(map(repr, row)) for row in m.tolist()))
        elif t == 1:
            np.save(tmp_path / "t1.npy", m)
        else:
            (tmp_path / "t2.csv").write_text(",".join(map(repr, m.ravel().tolist())))
    np.testing.assert_array_equal(load_traffic(tmp_path, wan.n), tms)
    (tmp_path / "t3.txt").write_text("1 2 3")
    with pytest.raises(ScenarioError, match="t3.txt has 3 numbers") as e:
        load_traffic(tmp_path, wan.n)
    assert e.value.field == "--traffic"


@pytest.mark.parametrize("text, match", [("1 2 3", "not 12\\*12"), ("x" * 3, "cannot read"),
                                         (" ".join(["-1"] * 144), "negative")])
def test_bad_traffic_file_names_the_flag(tmp_path, text, match):
    f = tmp_path / "bad.txt"
    f.write_text(text)
    with pytest.raises(ScenarioError, match=match) as e:
        load_traffic(f, 12)
    assert e.value.field == "--traffic"
