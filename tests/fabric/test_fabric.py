"""Fabric builders, closed-form hop distances and OCS circuit configurations."""

from __future__ import annotations

import dataclasses
import itertools
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError, LightrailError, UnsupportedError
from lightrail.fabric import (
    NodeKind,
    check_partial_permutation,
    circuits,
    fat_tree,
    is_duplex,
    is_partial_permutation,
    rails,
    ring,
    ring_permutation,
    square_shape,
    switch,
    torus,
)

B = 50e9


def all_pairs(topo):
    v = topo.num_nodes
    return np.meshgrid(np.arange(v), np.arange(v), indexing="ij")


def bfs_hops(topo) -> np.ndarray:
    return dataclasses.replace(topo, hops_fn=None).hops(*all_pairs(topo))


def out_degree(topo) -> np.ndarray:
    return np.bincount(topo.src, minlength=topo.num_nodes)


def link_set(topo) -> list[tuple[int, int]]:
    return sorted(zip(topo.src.tolist(), topo.dst.tolist(), strict=True))


BUILT = {
    **{f"switch-{n}": (lambda n=n: switch(n)) for n in (2, 3, 5, 8)},
    **{f"ring-{n}": (lambda n=n: ring(n)) for n in (2, 3, 4, 5, 8, 9)},
    **{
        f"torus-{'x'.join(map(str, s))}": (lambda s=s: torus(s))
        for s in [
            (2, 2),
            (3, 3),
            (4, 3),
            (5, 4),
            (2, 1),
            (1, 4),
            (2, 5),
            (2, 2, 2),
            (3, 2, 1),
            (3, 3, 3),
            (4, 2, 3),
            (1, 1, 3),
            (2, 2, 2, 2),
        ]
    },
    **{
        f"fat_tree-{n}-{k}-{o}": (lambda n=n, k=k, o=o: fat_tree(n, hosts_per_leaf=k, oversubscription=o))
        for n, k in [(4, 4), (6, 8), (8, 4), (10, 4), (12, 4), (16, 8), (3, 2)]
        for o in (1, 2, 3)
    },
    **{
        f"rails-{n}-{g}": (lambda n=n, g=g: rails(n, gpus_per_server=g, routing="ecmp"))
        for n, g in [(2, 8), (4, 4), (8, 4), (16, 4), (8, 8), (6, 8), (16, 8), (32, 8)]
    },
}


# -- closed-form hops --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILT))
def test_closed_form_hops_equal_bfs_on_all_node_pairs(name):
    topo = BUILT[name]()
    assert topo.hops_fn is not None, "builders attach a closed form"
    closed = topo.hops(*all_pairs(topo))
    bfs = bfs_hops(topo)
    assert np.all(bfs >= 0), "builders produce connected fabrics"
    np.testing.assert_array_equal(closed, bfs)


@pytest.mark.parametrize(("n", "g"), [(8, 4), (16, 4), (32, 8)])
def test_pxn_rails_differ_from_graph_distance_only_from_a_rail_switch_to_another_rails_gpu(n, g):
    """PXN forbids the NVLink hop after a NIC; everything else is the graph distance."""
    pxn, ecmp = rails(n, gpus_per_server=g), rails(n, gpus_per_server=g, routing="ecmp")
    u, v = all_pairs(pxn)
    first_rail = n + n // g
    other_rail = (u >= first_rail) & (v < n) & (u - first_rail != v % g)
    np.testing.assert_array_equal(pxn.hops(u, v)[~other_rail], bfs_hops(ecmp)[~other_rail])
    assert np.all(pxn.hops(u, v)[other_rail] > bfs_hops(ecmp)[other_rail])


def test_pxn_routes_cross_only_the_destinations_rail_and_ring_allreduce_gets_one_nic():
    """NCCL's PXN: a flow between servers uses the rail of its destination GPU, so one ring's bus
    bandwidth is one NIC (as on a switch), where ECMP over both paths would give two."""
    from lightrail.studies.collective import evaluate
    from lightrail.timing import Engine

    n, g = 64, 8
    topo = rails(n, gpus_per_server=g, nic_bandwidth=50e9)
    src, dst = np.arange(n), (np.arange(n) + 3) % n
    routes = Engine(topo).route(src, dst)
    used = topo.dst[routes.link]
    rail_hops = used >= n + n // g  # links into a rail switch
    assert np.all(used[rail_hops] - (n + n // g) == dst[routes.pair[rail_hops]] % g)
    busbw = {r: evaluate("allreduce", "ring", n, 1 << 30, rails(n, gpus_per_server=g, nic_bandwidth=50e9,
                                                                   routing=r)).busbw_Bps for r in ("pxn", "ecmp")}
    assert busbw["pxn"] == pytest.approx(50e9, rel=1e-9)
    assert busbw["ecmp"] == pytest.approx(100e9, rel=1e-9)


@pytest.mark.parametrize("name", ["ring-5", "torus-4x3", "fat_tree-12-4-2", "rails-16-4", "switch-5"])
def test_closed_form_hops_accepts_scalars_and_any_shape(name):
    topo = BUILT[name]()
    bfs = bfs_hops(topo)
    u, v = 1, topo.num_nodes - 1
    assert int(topo.hops(np.int64(u), np.int64(v))) == bfs[u, v]
    uu, vv = np.array([[0, 1], [2, 3]]), np.array([[3, 2], [1, 0]])
    np.testing.assert_array_equal(topo.hops(uu, vv), bfs[uu, vv])


def test_hops_are_the_expected_numbers_on_simple_fabrics():
    assert switch(4).hops(np.array([0, 0, 1]), np.array([0, 3, 4])).tolist() == [0, 2, 1]
    assert ring(8).hops(np.zeros(8, int), np.arange(8)).tolist() == [0, 1, 2, 3, 4, 3, 2, 1]
    assert int(torus((4, 4)).hops(np.int64(0), np.int64(10))) == 4  # (0,0) -> (2,2)
    r = rails(16, gpus_per_server=8)
    # same server, same rail, neither (PXN over NVLink then the rail)
    assert r.hops(np.array([0, 0, 0]), np.array([5, 8, 13])).tolist() == [2, 2, 4]


# -- links and degrees -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILT))
def test_links_are_duplex_unique_and_between_known_nodes(name):
    topo = BUILT[name]()
    links = link_set(topo)
    assert len(set(links)) == len(links), "no parallel links"
    assert set(links) == {(d, s) for s, d in links}, "every link has its reverse"
    assert all(s != d for s, d in links)
    assert topo.num_endpoints == int(np.sum(topo.node_kind == NodeKind.GPU))
    assert np.all(topo.node_kind[: topo.num_endpoints] == NodeKind.GPU), "GPUs are nodes 0..n-1"


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16])
def test_switch_links(n):
    topo = switch(n, bandwidth=B, latency=2e-6)
    assert topo.num_nodes == n + 1 and topo.num_links == 2 * n
    assert topo.node_kind[n] == NodeKind.EPS
    np.testing.assert_array_equal(out_degree(topo), [1] * n + [n])
    assert set(link_set(topo)) == {(i, n) for i in range(n)} | {(n, i) for i in range(n)}
    assert np.all(topo.bandwidth == B) and np.all(topo.latency == 2e-6)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13])
def test_ring_links(n):
    topo = ring(n, bandwidth=B)
    assert topo.num_nodes == n
    expected = {(i, (i + 1) % n) for i in range(n)} | {((i + 1) % n, i) for i in range(n)}
    assert set(link_set(topo)) == expected
    np.testing.assert_array_equal(out_degree(topo), np.full(n, 2 if n > 2 else 1))
    assert topo.num_links == (2 * n if n > 2 else 2)


@pytest.mark.parametrize("shape", [(3, 3), (4, 5), (3, 3, 3), (4, 3, 5), (3, 3, 3, 3)])
def test_torus_out_degree_is_two_per_dimension(shape):
    topo = torus(shape)
    np.testing.assert_array_equal(out_degree(topo), np.full(prod(shape), 2 * len(shape)))
    assert topo.num_links == 2 * len(shape) * prod(shape)


@pytest.mark.parametrize("shape", [(2, 2), (2, 3), (2, 1), (1, 4), (2, 2, 2), (3, 2, 1), (1, 1, 3)])
def test_torus_sides_of_two_and_one(shape):
    topo = torus(shape)
    per_dim = [2 if s > 2 else 1 if s == 2 else 0 for s in shape]
    np.testing.assert_array_equal(out_degree(topo), np.full(prod(shape), sum(per_dim)))
    # neighbours differ in exactly one coordinate by +-1 (mod side)
    cu = np.array(np.unravel_index(topo.src, shape))
    cv = np.array(np.unravel_index(topo.dst, shape))
    diff = np.abs(cu - cv)
    assert np.all((diff != 0).sum(axis=0) == 1)
    sides = np.array(shape)[:, None]
    assert np.all(np.minimum(diff, sides - diff).sum(axis=0) == 1)


def test_torus_rejects_bad_sides():
    with pytest.raises(InfeasibleError) as err:
        torus((-2, -3))
    assert err.value.field == "shape"
    with pytest.raises(LightrailError):
        torus((4, 0, 2))
    with pytest.raises(UnsupportedError):
        torus((1, 1))


@pytest.mark.parametrize("n,k", [(8, 4), (12, 4), (10, 4), (32, 8), (64, 16)])
@pytest.mark.parametrize("over", [1, 1.5, 2, 3])
def test_fat_tree_uplink_capacity_per_leaf(n, k, over):
    topo = fat_tree(n, bandwidth=B, hosts_per_leaf=k, oversubscription=over)
    leaves = -(-n // k)
    first_spine = n + leaves
    assert topo.num_nodes > first_spine
    assert np.all(topo.node_kind[n:] == NodeKind.EPS)
    np.testing.assert_array_equal(out_degree(topo)[:n], 1)
    for leaf in range(n, first_spine):
        up = (topo.src == leaf) & (topo.dst >= first_spine)
        down = (topo.dst == leaf) & (topo.src >= first_spine)
        assert topo.bandwidth[up].sum() == pytest.approx(k * B / over, rel=1e-12)
        assert topo.bandwidth[down].sum() == pytest.approx(k * B / over, rel=1e-12)
        hosts = (topo.src == leaf) & (topo.dst < n)
        assert sorted(topo.dst[hosts].tolist()) == [g for g in range(n) if n + g // k == leaf]
    assert np.all(topo.bandwidth[topo.src < n] == B)


@pytest.mark.parametrize("n,k", [(4, 4), (6, 8), (16, 32)])
def test_fat_tree_with_one_leaf_has_no_spines(n, k):
    topo = fat_tree(n, bandwidth=B, hosts_per_leaf=k, oversubscription=2)
    assert topo.num_nodes == n + 1 and topo.num_links == 2 * n


def test_fat_tree_rejects_undersubscription():
    with pytest.raises(InfeasibleError) as err:
        fat_tree(16, hosts_per_leaf=4, oversubscription=0.5)
    assert err.value.field == "oversubscription"


@pytest.mark.parametrize("n,g", [(16, 8), (32, 8), (8, 4), (16, 4)])
def test_rails_links_with_several_servers(n, g):
    nic, nvl = 50e9, 450e9
    topo = rails(n, gpus_per_server=g, nic_bandwidth=nic, nvlink_bandwidth=nvl)
    servers = n // g
    assert topo.num_nodes == n + servers + g
    assert np.all(topo.node_kind[n : n + servers] == NodeKind.NVSWITCH)
    assert np.all(topo.node_kind[n + servers :] == NodeKind.EPS)
    deg = out_degree(topo)
    np.testing.assert_array_equal(deg[:n], 2)
    np.testing.assert_array_equal(deg[n : n + servers], g)  # NVSwitch to its server's GPUs
    np.testing.assert_array_equal(deg[n + servers :], servers)  # a rail to one GPU per server
    for gpu in range(n):
        out = topo.src == gpu
        got = dict(zip(topo.dst[out].tolist(), topo.bandwidth[out].tolist(), strict=True))
        assert got == {n + gpu // g: nvl, n + servers + gpu % g: nic}


@pytest.mark.parametrize("n,g", [(8, 8), (4, 4), (6, 8), (2, 8)])
def test_rails_with_one_server_is_an_nvlink_switch(n, g):
    topo = rails(n, gpus_per_server=g, nvlink_bandwidth=450e9)
    assert topo.num_nodes == n + 1
    np.testing.assert_array_equal(out_degree(topo)[:n], 1)
    assert np.all(topo.bandwidth == 450e9)


@pytest.mark.parametrize("n,g", [(12, 8), (20, 8), (10, 4), (9, 2)])
def test_rails_rejects_partial_servers(n, g):
    with pytest.raises(InfeasibleError) as err:
        rails(n, gpus_per_server=g)
    assert err.value.field == "ranks"
    assert str(g) in str(err.value)


@pytest.mark.parametrize("builder", [switch, ring, fat_tree, rails])
@pytest.mark.parametrize("n", [0, 1])
def test_builders_reject_fewer_than_two_gpus(builder, n):
    with pytest.raises(UnsupportedError):
        builder(n)


# -- circuits ----------------------------------------------------------------------------------------


def test_circuits_build_the_union_of_permutations():
    n = 6
    p1 = ring_permutation(n)
    p2 = np.array([3, 4, 5, 0, 1, 2])
    p3 = np.array([-1, 2, -1, -1, -1, -1])
    topo = circuits(n, [p1, p2, p3], bandwidth=B, latency=1e-6)
    expected = [(i, int(p[i])) for p in (p1, p2, p3) for i in range(n) if p[i] >= 0]
    assert link_set(topo) == sorted(expected)
    assert topo.num_nodes == n and topo.num_endpoints == n
    assert topo.hops_fn is None and topo.meta["ports"] == 3
    assert np.all(topo.bandwidth == B) and np.all(topo.latency == 1e-6)
    # a one-way ring: going backwards costs n-1 circuits
    one_way = circuits(n, [p1])
    assert int(one_way.hops(np.int64(1), np.int64(0))) == n - 1


def test_circuits_keep_parallel_circuits_of_different_ports():
    topo = circuits(4, [[1, 0, 3, 2], [1, 0, 3, 2]])
    assert topo.num_links == 8
    assert link_set(topo).count((0, 1)) == 2


@pytest.mark.parametrize(
    "configs,index,words",
    [
        ([[1, 2, 1]], 0, "both go to output 1"),
        ([[1, 2, 0], [2, 1, 0]], 1, "connected to itself"),  # port 1 -> 1
        ([[1, 2, 0], [1, 5, 0]], 1, "not a port of 3"),
        ([[1, 2, -2]], 0, "not a port of 3"),
        ([[0, 2, 1]], 0, "connected to itself"),
        ([[1.0, 2.0, 0.0]], 0, "flat list"),
        ([[[1, 2, 0]]], 0, "flat list"),
    ],
)
def test_circuits_reject_bad_permutations_naming_the_configuration(configs, index, words):
    with pytest.raises(InfeasibleError) as err:
        circuits(3, configs)
    assert err.value.field == f"configurations[{index}]"
    assert words in str(err.value)


def test_circuits_reject_wrong_length_and_empty_list():
    with pytest.raises(InfeasibleError) as err:
        circuits(3, [[1, 0]])
    assert err.value.field == "configurations" and "3 entries" in str(err.value)
    with pytest.raises(InfeasibleError) as err:
        circuits(4, [[1, 2, 3, 0], [1, 0]])
    assert err.value.field == "configurations"
    with pytest.raises(InfeasibleError) as err:
        circuits(3, [])
    assert err.value.field == "configurations" and err.value.fix


def test_check_partial_permutation_names_the_inputs_of_a_conflict():
    with pytest.raises(InfeasibleError) as err:
        check_partial_permutation([3, -1, 3, 0], field="ocs[2]")
    assert err.value.field == "ocs[2]"
    assert "inputs 0 and 2 both go to output 3" in str(err.value)
    out = check_partial_permutation([1, -1, 0])
    assert out.dtype == np.int64 and out.tolist() == [1, -1, 0]


@st.composite
def partial_permutations(draw, min_size=2, max_size=40):
    """A random permutation with fixed points and a random subset of ports darkened (-1)."""
    n = draw(st.integers(min_size, max_size))
    perm = np.array(draw(st.permutations(range(n))))
    dark = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    perm[(perm == np.arange(n)) | dark] = -1
    return perm


@given(partial_permutations())
def test_random_permutations_are_partial_permutations(perm):
    assert is_partial_permutation(perm)
    assert is_partial_permutation(perm, len(perm))
    np.testing.assert_array_equal(check_partial_permutation(perm), perm)
    if np.any(perm >= 0):
        assert not is_partial_permutation(perm, int(perm.max()))  # a port beyond n


@given(partial_permutations(min_size=3), st.data())
def test_one_duplicated_output_is_not_a_partial_permutation(perm, data):
    lit = np.flatnonzero(perm >= 0)
    # i takes j's output; i must not be that output itself (that would be a self loop instead)
    choices = [(i, j) for i in range(len(perm)) for j in lit if i != j and perm[j] != i]
    if not choices:
        return
    i, j = data.draw(st.sampled_from(choices))
    bad = perm.copy()
    bad[i] = perm[j]
    assert not is_partial_permutation(bad)
    with pytest.raises(InfeasibleError, match="both go to output"):
        check_partial_permutation(bad)
    with pytest.raises(InfeasibleError) as err:
        circuits(len(bad), [np.full(len(bad), -1), bad])
    assert err.value.field == "configurations[1]"


@given(partial_permutations(), st.data())
def test_self_loops_and_out_of_range_ports_are_not_partial_permutations(perm, data):
    n = len(perm)
    i = data.draw(st.integers(0, n - 1))
    loop = perm.copy()
    loop[np.flatnonzero(perm == i)] = -1  # keep outputs unique
    loop[i] = i
    assert not is_partial_permutation(loop)
    far = perm.copy()
    far[i] = data.draw(st.sampled_from([n, n + 7, -2]))
    assert not is_partial_permutation(far)


@given(st.integers(2, 30), st.data())
def test_random_matchings_are_duplex(n, data):
    order = data.draw(st.permutations(range(n)))
    pairs = data.draw(st.integers(0, n // 2))
    perm = np.full(n, -1)
    for a, b in zip(order[: 2 * pairs : 2], order[1 : 2 * pairs : 2], strict=True):
        perm[a], perm[b] = b, a
    assert is_partial_permutation(perm)
    assert is_duplex(perm)
    if pairs:
        a = int(np.flatnonzero(perm >= 0)[0])
        one_way = perm.copy()
        one_way[perm[a]] = -1  # drop the reverse circuit
        assert not is_duplex(one_way)


@given(partial_permutations())
def test_is_duplex_means_every_circuit_has_its_reverse(perm):
    lit = np.flatnonzero(perm >= 0)
    expected = all(perm[perm[i]] == i for i in lit)
    assert is_duplex(perm) == expected


@given(st.integers(2, 200), st.integers(-300, 300))
def test_ring_permutation(n, step):
    perm = ring_permutation(n, step)
    np.testing.assert_array_equal(perm, (np.arange(n) + step) % n)
    assert sorted(perm.tolist()) == list(range(n))
    assert is_partial_permutation(perm) == (step % n != 0)
    assert is_duplex(perm) == ((2 * step) % n == 0)


def test_ring_permutation_examples():
    assert ring_permutation(4).tolist() == [1, 2, 3, 0]
    assert ring_permutation(4, -1).tolist() == [3, 0, 1, 2]
    assert is_duplex(ring_permutation(2)) and is_duplex(ring_permutation(6, 3))
    assert not is_duplex(ring_permutation(5))


# -- square_shape ------------------------------------------------------------------------------------


@settings(max_examples=300)
@given(st.integers(1, 5000), st.integers(1, 4))
def test_square_shape_product_and_order(n, dims):
    shape = square_shape(n, dims)
    assert len(shape) == dims
    assert prod(shape) == n
    assert list(shape) == sorted(shape, reverse=True)
    assert all(s >= 1 for s in shape)


def _spreads(n: int, dims: int):
    """max - min side over every way of writing n as a product of ``dims`` factors."""
    if dims == 1:
        yield 0, (n,)
        return
    for f in range(1, n + 1):
        if n % f == 0:
            for _, rest in _spreads(n // f, dims - 1):
                shape = (f, *rest)
                yield max(shape) - min(shape), shape


@pytest.mark.parametrize("dims", [2, 3])
def test_square_shape_is_as_square_as_possible(dims):
    for n in itertools.chain(range(1, 130), [144, 210, 360, 512, 720]):
        best = min(spread for spread, _ in _spreads(n, dims))
        shape = square_shape(n, dims)
        assert max(shape) - min(shape) == best, (n, dims, shape)


@pytest.mark.parametrize(
    "n,dims,shape",
    [
        (1024, 2, (32, 32)),
        (1024, 3, (16, 8, 8)),
        (4096, 3, (16, 16, 16)),
        (64, 3, (4, 4, 4)),
        (12, 2, (4, 3)),
        (7, 2, (7, 1)),
        (36, 2, (6, 6)),
        (1, 3, (1, 1, 1)),
        (8, 1, (8,)),
        (96, 2, (12, 8)),
    ],
)
def test_square_shape_examples(n, dims, shape):
    assert square_shape(n, dims) == shape


@settings(max_examples=60, deadline=None)
@given(servers=st.integers(1, 6), g=st.integers(1, 4), seed=st.integers(0, 2**32 - 1),
       density=st.floats(0.0, 1.0))
def test_photonic_rails_closed_form_hops_equal_bfs(servers, g, seed, density):
    """Photonic rails answer most hop counts in closed form (a circuit joins the two servers) and leave paths over
    several circuits to BFS: every pair of nodes gets what BFS over the same links gets."""
    from lightrail.fabric.builders import photonic_rails
    from lightrail.fabric.topology import Topology

    rng = np.random.default_rng(seed)
    rail, tx, rx = [], [], []
    for r in range(g):  # a partial matching per rail: each transmitter and each receiver in one circuit at most
        chosen = rng.permutation(servers)
        for s in range(servers):
            if rng.random() < density and chosen[s] != s:
                rail.append(r), tx.append(s), rx.append(int(chosen[s]))
    topo = photonic_rails(servers, (rail, tx, rx), gpus_per_server=g)
    assert topo.hops_fn is not None
    plain = Topology(topo.name, topo.num_endpoints, topo.node_kind, topo.src, topo.dst, topo.bandwidth, topo.latency)
    u, v = (a.ravel() for a in np.meshgrid(np.arange(topo.num_nodes), np.arange(topo.num_nodes)))
    np.testing.assert_array_equal(topo.hops(u, v), plain.hops(u, v))
