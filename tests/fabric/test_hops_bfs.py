"""Hop distances where no closed form answers (circuit topologies; chains of circuits on photonic rails) equal
scipy's breadth-first search, whichever search the topology runs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse.csgraph import shortest_path

from lightrail.fabric.builders import circuits, photonic_rails


def _scipy_hops(topo, u, v):
    v_unique = np.unique(v)
    dist = shortest_path(topo._reverse, unweighted=True, directed=True, indices=v_unique)
    dist[np.isinf(dist)] = -1
    return dist[np.searchsorted(v_unique, v), u].astype(np.int64)


@pytest.mark.parametrize("seed", range(12))
def test_circuit_topologies_count_hops_as_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 80))
    perms = []
    for _ in range(int(rng.integers(1, 3))):
        perm = rng.permutation(n)
        perm[(rng.random(n) < 0.3) | (perm == np.arange(n))] = -1  # dark ports, no loops
        perms.append(perm)
    topo = circuits(n, perms)
    u, v = rng.integers(0, n, 200), rng.integers(0, n, 200)
    assert np.array_equal(topo.hops(u, v), _scipy_hops(topo, u, v))


def test_a_ring_longer_than_the_search_levels_counts_hops_as_scipy():
    n = 600  # a one-way ring: up to 599 hops
    topo = circuits(n, [np.roll(np.arange(n), 1)])
    u, v = np.arange(n), np.roll(np.arange(n), 7)
    assert np.array_equal(topo.hops(u, v), _scipy_hops(topo, u, v))


def test_photonic_rails_with_chains_of_circuits_count_hops_as_scipy():
    servers, g = 8, 4
    rail = np.repeat(np.arange(g), servers)  # each rail a ring of servers: pairs 2+ circuits apart need BFS
    tx = np.tile(np.arange(servers), g)
    rx = (tx + 1 + rail % 2) % servers
    topo = photonic_rails(servers, (rail, tx, rx), gpus_per_server=g)
    nodes = np.arange(topo.num_nodes)
    u, v = np.repeat(nodes, len(nodes)), np.tile(nodes, len(nodes))
    assert np.array_equal(topo.hops(u, v), _scipy_hops(topo, u, v))
