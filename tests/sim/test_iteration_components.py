"""The simulator counts a switch per group as the controller does: one per connected set of the servers its changed
circuits join (``sim.iteration._components``, array label propagation), checked against networkx on random graphs."""

from __future__ import annotations

import networkx as nx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.sim.iteration import _components, _components_per_rail


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=60))
def test_components_equal_networkx_connected_components(edges):
    tx = np.array([a for a, _ in edges], np.int64)
    rx = np.array([b for _, b in edges], np.int64)
    g = nx.Graph()
    g.add_edges_from(edges)
    assert _components(tx, rx) == nx.number_connected_components(g)


def test_a_dp_ring_of_thousands_of_servers_is_one_set_and_pairs_are_their_own():
    n = 8192
    ring = np.arange(n)
    assert _components(ring, np.roll(ring, -1)) == 1
    assert _components(ring[0::2], ring[1::2]) == n // 2  # pipeline pairs: one set each
    assert _components(np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(0, 30)), max_size=60))
def test_components_of_every_rail_at_once_equal_each_rail_alone(circuits):
    rail = np.array([r for r, _, _ in circuits], np.int64)
    tx = np.array([a for _, a, _ in circuits], np.int64)
    rx = np.array([b for _, _, b in circuits], np.int64)
    per_rail = _components_per_rail(rail, tx, rx, 4)
    assert per_rail.tolist() == [_components(tx[rail == r], rx[rail == r]) for r in range(4)]
