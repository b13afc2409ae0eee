"""The step engine against closed forms worked out by hand (DESIGN.md "Time model").

Every step costs ``alpha + max over pairs [path latency + max over its links load_e / bandwidth_e]``.
On a switch a GPU-GPU path is two links (the sender's uplink, the receiver's downlink), so a
step costs ``alpha + 2L + max(bytes one rank sends, bytes one rank receives) / B``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.collectives import generate, verify
from lightrail.collectives.tree import btree_parents
from lightrail.errors import InfeasibleError
from lightrail.fabric import circuits, fat_tree, rails, ring, ring_permutation, switch, torus
from lightrail.sim import Engine

ALPHA = 3e-6
L = 1e-6
B = 50e9
NVL = 450e9
GIB = 2**30
SIZES = [GIB, 4096.0]
NS = [2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 31, 32]


def approx(x):
    return pytest.approx(x, rel=1e-9)


def on_switch(n: int) -> Engine:
    return Engine(switch(n, bandwidth=B, latency=L), alpha=ALPHA)


def timed(engine: Engine, kind: str, algo: str, n: int, size: float, **params) -> float:
    schedule = generate(kind, algo, n, **params)
    verify(schedule)
    return engine.time(schedule, size).time_s


# -- contention-free closed forms on a switch --------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", NS)
def test_ring_allreduce_on_switch(n, size):
    expected = 2 * (n - 1) * (ALPHA + 2 * L) + 2 * (n - 1) / n * size / B
    assert timed(on_switch(n), "allreduce", "ring", n, size) == approx(expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_recursive_doubling_allreduce_on_switch_power_of_two(n, size):
    expected = math.log2(n) * (ALPHA + 2 * L + size / B)
    assert timed(on_switch(n), "allreduce", "recursive-doubling", n, size) == approx(expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 24, 31])
def test_recursive_doubling_allreduce_on_switch_with_fold(n, size):
    p = 1 << (n.bit_length() - 1)
    # fold in, log2 p exchanges, fold out: each a whole buffer over one uplink / downlink
    steps = int(math.log2(p)) + 2
    schedule = generate("allreduce", "recursive-doubling", n)
    assert schedule.nsteps == steps
    expected = steps * (ALPHA + 2 * L + size / B)
    assert on_switch(n).time(schedule, size).time_s == approx(expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_halving_doubling_allreduce_on_switch(n, size):
    expected = 2 * math.log2(n) * (ALPHA + 2 * L) + 2 * (n - 1) / n * size / B
    assert timed(on_switch(n), "allreduce", "halving-doubling", n, size) == approx(expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", NS)
def test_binomial_broadcast_on_switch(n, size):
    expected = math.ceil(math.log2(n)) * (ALPHA + 2 * L + size / B)
    assert timed(on_switch(n), "broadcast", "binomial-tree", n, size) == approx(expected)
    assert timed(on_switch(n), "broadcast", "binomial-tree", n, size, root=n - 1) == approx(expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", NS)
def test_pairwise_alltoall_on_switch(n, size):
    expected = (n - 1) * (ALPHA + 2 * L + size / (n * B))
    assert timed(on_switch(n), "alltoall", "pairwise", n, size) == approx(expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", NS)
def test_direct_allreduce_on_switch(n, size):
    expected = ALPHA + 2 * L + (n - 1) * size / B
    assert timed(on_switch(n), "allreduce", "direct", n, size) == approx(expected)


def _tree_steps(parents: np.ndarray) -> list[tuple[int, int, int]]:
    """(step, src, dst) of a pipeline-1 tree AllReduce, derived from the parent array alone.

    Reduce: a child sends to its parent once its whole subtree has arrived, at step = its
    height. Broadcast: after the root's reduction (step = root height), a child at depth d
    receives at step root height + d - 1.
    """
    n = len(parents)
    children = {r: [c for c in range(n) if parents[c] == r] for r in range(n)}

    def height(r):
        return 1 + max(height(c) for c in children[r]) if children[r] else 0

    def depth(r):
        return 0 if parents[r] < 0 else 1 + depth(parents[r])

    root = int(np.flatnonzero(parents < 0)[0])
    top = height(root)
    up = [(height(c), c, int(parents[c])) for c in range(n) if parents[c] >= 0]
    down = [(top + depth(c) - 1, int(parents[c]), c) for c in range(n) if parents[c] >= 0]
    return up + down


def _expected_tree_time(n: int, size: float) -> float:
    first = btree_parents(n)
    mirror = np.array([-1 if first[n - 1 - r] < 0 else n - 1 - first[n - 1 - r] for r in range(n)])
    transfers = _tree_steps(first) + _tree_steps(mirror)
    half = size / 2  # each tree carries half the buffer
    total = 0.0
    for s in range(max(t[0] for t in transfers) + 1):
        sent = np.zeros(n)
        received = np.zeros(n)
        for step, src, dst in transfers:
            if step == s:
                sent[src] += half
                received[dst] += half
        total += ALPHA + 2 * L + max(sent.max(), received.max()) / B
    return total


def test_tree_hand_derivation_n4():
    # tree 1: 1 -> 2 <- 3, 2 -> 0; mirror: 2 -> 1 <- 0, 1 -> 3. Steps carry 2, 1, 1, 2 half-buffers
    # on the busiest link (a parent with two children receives, then sends, two halves).
    expected = 4 * (ALPHA + 2 * L) + (2 + 1 + 1 + 2) * (GIB / 2) / B
    assert _expected_tree_time(4, GIB) == approx(expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [4, 6, 8, 16])
def test_double_binary_tree_on_switch(n, size):
    expected = _expected_tree_time(n, size)
    assert timed(on_switch(n), "allreduce", "double-binary-tree", n, size, pipeline=1) == approx(expected)


# -- neighbours on a ring fabric ---------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_ring_allreduce_on_ring_fabric_is_one_hop(n, size):
    engine = Engine(ring(n, bandwidth=B, latency=L), alpha=ALPHA)
    expected = 2 * (n - 1) * (ALPHA + L) + 2 * (n - 1) / n * size / B
    assert timed(engine, "allreduce", "ring", n, size) == approx(expected)


def test_recursive_doubling_on_ring_fabric_pays_congestion_and_dilation():
    n = 8
    topo = ring(n, bandwidth=B, latency=L)
    engine = Engine(topo, alpha=ALPHA)
    schedule = generate("allreduce", "recursive-doubling", n)
    forward = {(i, (i + 1) % n): i for i in range(n)}
    backward = {((i + 1) % n, i): i for i in range(n)}

    def loads_by_direction(step):
        loads = engine.link_loads(step.src, step.dst, GIB) / GIB
        fw, bw = np.zeros(n), np.zeros(n)
        for e, (u, v) in enumerate(zip(topo.src.tolist(), topo.dst.tolist(), strict=True)):
            if (u, v) in forward:
                fw[forward[(u, v)]] = loads[e]
            else:
                bw[backward[(u, v)]] = loads[e]
        return fw, bw

    steps = list(schedule.steps)
    assert len(steps) == 3
    # distance 1: i <-> i^1; link i -> i+1 carries one buffer for even i, none for odd i
    fw, bw = loads_by_direction(steps[0])
    np.testing.assert_allclose(fw, [1, 0, 1, 0, 1, 0, 1, 0])
    np.testing.assert_allclose(bw, [1, 0, 1, 0, 1, 0, 1, 0])
    # distance 2: 0 -> 2 crosses links 0, 1 and 1 -> 3 crosses links 1, 2: link 1 carries both
    fw, bw = loads_by_direction(steps[1])
    np.testing.assert_allclose(fw, [1, 2, 1, 0, 1, 2, 1, 0])
    np.testing.assert_allclose(bw, [1, 2, 1, 0, 1, 2, 1, 0])
    # distance 4: both ways are shortest, ECMP sends half of each of the 8 buffers each way
    # over 4 links: 8 * 4 / 16 = 2 buffers on every link
    fw, bw = loads_by_direction(steps[2])
    np.testing.assert_allclose(fw, 2)
    np.testing.assert_allclose(bw, 2)

    on_ring = engine.time(schedule, GIB).time_s
    expected = (ALPHA + L + GIB / B) + (ALPHA + 2 * L + 2 * GIB / B) + (ALPHA + 4 * L + 2 * GIB / B)
    assert on_ring == approx(expected)
    assert on_ring > on_switch(n).time(schedule, GIB).time_s
    assert on_ring > engine.time(generate("allreduce", "ring", n), GIB).time_s


# -- oversubscribed fat-tree -------------------------------------------------------------------------


@pytest.mark.parametrize("over", [1, 2, 3])
def test_fat_tree_oversubscription_slows_cross_leaf_permutation(over):
    n, k, nbytes = 16, 4, 64e6
    engine = Engine(fat_tree(n, bandwidth=B, latency=L, hosts_per_leaf=k, oversubscription=over), alpha=ALPHA)
    src = np.arange(n)
    dst = (src + k) % n  # every GPU sends to the next leaf
    # the k flows of a leaf share its uplinks, whose total capacity is k * B / over
    expected = ALPHA + 4 * L + over * nbytes / B
    assert engine.transfer_time(src, dst, nbytes) == approx(expected)
    # a permutation within each leaf never reaches the spines
    inside = src - src % k + (src + 1) % k
    assert engine.transfer_time(src, inside, nbytes) == approx(ALPHA + 2 * L + nbytes / B)


def test_fat_tree_two_to_one_doubles_the_per_byte_cost():
    src = np.arange(16)
    dst = (src + 8) % 16
    per_byte = []
    for over in (1, 2):
        engine = Engine(fat_tree(16, bandwidth=B, hosts_per_leaf=4, oversubscription=over))
        per_byte.append(engine.transfer_time(src, dst, 1e9) - engine.transfer_time(src, dst, 0.0))
    assert per_byte[1] == approx(2 * per_byte[0])


# -- rails -------------------------------------------------------------------------------------------


def _rails16(routing="pxn"):
    return rails(16, gpus_per_server=8, nic_bandwidth=B, nvlink_bandwidth=NVL, latency=L, routing=routing)


@pytest.mark.parametrize("routing", ["pxn", "ecmp"])
def test_ring_allreduce_on_two_rail_servers_link_loads(routing):
    n, g = 16, 8
    topo = _rails16(routing)
    engine = Engine(topo, alpha=ALPHA)
    schedule = generate("allreduce", "ring", n)
    step = schedule.step(0)
    c = GIB / n

    def nvs(r):
        return n + r // g

    def rail(r):
        return n + 2 + r % g

    expected: dict[tuple[int, int], float] = {}

    def carry(path, nbytes):
        for u, v in zip(path, path[1:], strict=False):
            expected[(u, v)] = expected.get((u, v), 0.0) + nbytes

    for a in range(n):
        b = (a + 1) % n
        if a // g == b // g:
            carry([a, nvs(a), b], c)
        elif routing == "pxn":  # NVLink to b's rail, then the rail
            carry([a, nvs(a), (a // g) * g + b % g, rail(b), b], c)
        else:  # ECMP over two 4-hop paths: NVLink to b's rail then the rail, or a's rail then NVLink
            carry([a, nvs(a), (a // g) * g + b % g, rail(b), b], c / 2)
            carry([a, rail(a), (b // g) * g + a % g, nvs(b), b], c / 2)
    loads = engine.link_loads(step.src, step.dst, c)
    got = {(u, v): x for u, v, x in zip(topo.src.tolist(), topo.dst.tolist(), loads, strict=True) if x}
    assert got.keys() == expected.keys()
    for key, x in expected.items():
        assert got[key] == approx(x)

    # NVLinks carry at most c at 450 GB/s; the cross-server pairs see c (PXN) or c/2 (ECMP) on NIC links
    assert max(x for (u, v), x in got.items() if u < n + 2 and v < n + 2) == approx(c)
    step_time = ALPHA + 4 * L + (c if routing == "pxn" else c / 2) / B
    assert engine.time(schedule, GIB).time_s == approx(2 * (n - 1) * step_time)


@pytest.mark.parametrize("size", SIZES)
def test_hierarchical_allreduce_on_rails_keeps_nics_for_rail_traffic(size):
    n, g = 16, 8
    m = n // g
    topo = _rails16()
    engine = Engine(topo, alpha=ALPHA)
    schedule = generate("allreduce", "hierarchical", n, gpus_per_server=g)
    verify(schedule)
    nic = (topo.src >= n + m) | (topo.dst >= n + m)
    nvlink = ~nic
    assert np.all(topo.bandwidth[nic] == B) and np.all(topo.bandwidth[nvlink] == NVL)
    kinds = []
    for step in schedule.steps:
        loads = engine.link_loads(step.src, step.dst, 1.0)
        if np.any(loads[nic]):
            assert not np.any(loads[nvlink]), "rail steps stay on the rails"
            assert np.all(loads[nic] > 0), "all rails work at once"
            kinds.append("rail")
        else:
            assert np.any(loads[nvlink])
            kinds.append("nvlink")
    assert kinds == ["nvlink"] * (g - 1) + ["rail"] * 2 * (m - 1) + ["nvlink"] * (g - 1)
    # intra-server steps move blocks of N/g over NVLink; rail steps move N/n over the NIC
    expected = 2 * (g - 1) * (ALPHA + 2 * L + size / g / NVL) + 2 * (m - 1) * (ALPHA + 2 * L + size / n / B)
    assert engine.time(schedule, size).time_s == approx(expected)


# -- engine mechanics --------------------------------------------------------------------------------


def test_engine_shares_step_patterns_and_is_repeatable():
    n = 12
    engine = on_switch(n)
    schedule = generate("allreduce", "ring", n)
    profile = engine.profile(schedule)
    assert len(profile) == 2 * (n - 1)
    assert len({id(m) for m in profile}) == 1, "a ring's steps are one pattern"
    assert engine.profile(schedule)[0] is profile[0], "patterns are cached across calls"
    first = engine.time(schedule, GIB)
    second = engine.time(schedule, GIB)
    assert first.time_s == second.time_s
    np.testing.assert_array_equal(first.step_times, second.step_times)
    assert first.steps == 2 * (n - 1) and first.size == GIB
    assert engine.time(schedule, GIB, profile=profile).time_s == first.time_s
    fresh = on_switch(n).time(schedule, GIB)
    assert fresh.time_s == first.time_s


def test_step_time_is_linear_in_message_size():
    engine = on_switch(8)
    schedule = generate("allreduce", "halving-doubling", 8)
    t0, t1, t2 = (engine.time(schedule, s).time_s for s in (0.0, GIB, 2 * GIB))
    assert t0 == approx(6 * (ALPHA + 2 * L))
    assert t2 - t1 == approx(t1 - t0)


def test_transfer_time_of_an_empty_step_is_zero():
    engine = on_switch(4)
    none = np.zeros(0, dtype=np.int64)
    assert engine.transfer_time(none, none, 1e6) == 0.0
    assert not np.any(engine.link_loads(none, none, 1e6))
    assert engine.step_model(none, none).time(1e6, ALPHA) == 0.0


def test_unreachable_pairs_and_too_many_ranks_are_infeasible():
    split = circuits(4, [[1, 0, 3, 2]])  # two islands: {0, 1} and {2, 3}
    with pytest.raises(InfeasibleError) as err:
        Engine(split).transfer_time([0], [2], 1.0)
    assert err.value.field == "topology"
    with pytest.raises(InfeasibleError) as err:
        on_switch(4).profile(generate("allreduce", "ring", 8))
    assert err.value.field == "ranks"


def test_placement_maps_ranks_to_gpus():
    n = 8
    topo = ring(n, bandwidth=B, latency=L)
    spread = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # rank r on GPU spread[r]
    engine = Engine(topo, alpha=ALPHA, placement=spread)
    # ranks 0 -> 1 sit on GPUs 0 -> 2: two hops
    assert engine.transfer_time([0], [1], 1e6) == approx(ALPHA + 2 * L + 1e6 / B)
    loads = engine.link_loads([0], [1], 1e6)
    used = {(int(topo.src[e]), int(topo.dst[e])) for e in np.flatnonzero(loads)}
    assert used == {(0, 1), (1, 2)}


def test_circuit_ring_times_like_a_one_way_ring():
    n = 6
    engine = Engine(circuits(n, [ring_permutation(n)], bandwidth=B, latency=L), alpha=ALPHA)
    expected = 2 * (n - 1) * (ALPHA + L) + 2 * (n - 1) / n * GIB / B
    assert timed(engine, "allreduce", "ring", n, GIB) == approx(expected)
    # backwards goes all the way round: n-1 circuits, none shared with another pair
    assert engine.transfer_time([1], [0], 1e6) == approx(ALPHA + (n - 1) * L + 1e6 / B)


# -- properties --------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), st.data(), st.floats(1.0, 1e10))
def test_any_permutation_step_on_a_switch(n, data, nbytes):
    perm = np.array(data.draw(st.permutations(range(n))))
    src = np.flatnonzero(perm != np.arange(n))
    if not len(src):
        return
    engine = on_switch(n)
    assert engine.transfer_time(src, perm[src], nbytes) == approx(ALPHA + 2 * L + nbytes / B)


TOPOLOGIES = [
    switch(6, bandwidth=B),
    ring(7, bandwidth=B),
    ring(2, bandwidth=B),
    torus((3, 4), bandwidth=B),
    torus((2, 2, 3), bandwidth=B),
    fat_tree(12, bandwidth=B, hosts_per_leaf=4, oversubscription=2),
    fat_tree(10, bandwidth=B, hosts_per_leaf=4, oversubscription=3),
    rails(16, gpus_per_server=4),
    rails(6, gpus_per_server=8),
    circuits(6, [ring_permutation(6), [3, 4, 5, 0, 1, 2]]),
]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(range(len(TOPOLOGIES))), st.data())
def test_link_loads_conserve_flow_along_shortest_paths(which, data):
    topo = TOPOLOGIES[which]
    n = topo.num_endpoints
    pairs = data.draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1]),
            min_size=1,
            max_size=30,
        )
    )
    src, dst = (np.array(x) for x in zip(*pairs, strict=True))
    nbytes = np.array(data.draw(st.lists(st.floats(1.0, 1e9), min_size=len(src), max_size=len(src))))
    loads = Engine(topo).link_loads(src, dst, nbytes)
    assert np.all(loads >= 0)
    assert loads.sum() == pytest.approx(float(np.sum(nbytes * topo.hops(src, dst))), rel=1e-9)
    # every sender's out-links together carry what it sends (and more only if it forwards)
    sent = np.bincount(src, weights=nbytes, minlength=topo.num_nodes)
    out = np.bincount(topo.src, weights=loads, minlength=topo.num_nodes)
    assert np.all(out[:n] >= sent[:n] * (1 - 1e-9))


# -- rings in closed form: arcs and a range maximum against hop-by-hop routing ------------------------------

def _by_routing(engine: Engine) -> Engine:
    """The same engine with the ring closed form switched off: every pair routed hop by hop."""
    engine.__dict__["_ring"] = None
    return engine


def _ring_case(n: int, seed: int):
    rng = np.random.default_rng(seed)
    topo = ring(n, bandwidth=50e9, latency=5e-7)
    if seed % 2:  # uneven links: the range maximum must pick the slowest link of each arc
        topo = type(topo)(topo.name, topo.num_endpoints, topo.node_kind, topo.src, topo.dst,
                          rng.choice([25e9, 50e9, 100e9], size=topo.num_links), topo.latency, topo.hops_fn)
    return topo, rng


@pytest.mark.parametrize("n", [3, 4, 5, 8, 16, 17, 32, 64, 128, 256])
def test_ring_closed_form_equals_routing_on_xor_and_random_steps(n):
    for seed in range(4):
        topo, rng = _ring_case(n, seed)
        fast, slow = Engine(topo), _by_routing(Engine(topo))
        assert fast._ring is not None
        steps = [(np.arange(n), (np.arange(n) + rng.integers(1, n)) % n, None)]
        if n & (n - 1) == 0:  # XOR steps (recursive doubling / halving): every mask up to 32 ranks
            masks = range(1, n) if n <= 32 else (1, 3, n // 4, n // 2, n // 2 + 1, n - 1)
            steps += [(np.arange(n), np.arange(n) ^ mask, None) for mask in masks]
        m = 3 * n
        src = rng.integers(0, n, m)
        dst = (src + rng.integers(1, n, m)) % n
        steps += [(src, dst, None), (src, dst, rng.integers(1, 9, m).astype(float))]
        for src, dst, weight in steps:
            a, b = fast.step_model(src, dst, weight), slow.step_model(src, dst, weight)
            assert np.array_equal(a.latency, b.latency) and np.array_equal(a.per_byte, b.per_byte)
            nbytes = 4096.0 if weight is None else weight
            assert np.array_equal(fast.link_loads(src, dst, nbytes), slow.link_loads(src, dst, nbytes))


@pytest.mark.parametrize("n", [4, 8, 16, 32, 64, 128, 256])
def test_halving_and_recursive_doubling_on_a_ring_time_as_routed(n):
    topo = ring(n, bandwidth=50e9, latency=5e-7)
    for algo in ("halving-doubling", "recursive-doubling", "double-binary-tree"):
        schedule = generate("allreduce", algo, n)
        for alpha in (0.0, 3e-6):
            got = Engine(topo, alpha=alpha).time(schedule, 2.0**30)
            want = _by_routing(Engine(topo, alpha=alpha)).time(schedule, 2.0**30)
            assert got.time_s == want.time_s and np.array_equal(got.step_times, want.step_times)


def test_ring_closed_form_falls_back_where_it_would_not_be_exact():
    topo = ring(8, bandwidth=50e9, latency=5e-7)
    engine = Engine(topo)
    src, dst = np.arange(8), (np.arange(8) + 3) % 8
    assert not engine._ring_exact(src, dst, np.full(8, 0.3))  # fractional bytes: sums would round differently
    assert Engine(switch(8))._ring is None and Engine(ring(2))._ring is None
    with_circuit = topo.with_links([0], [4], [50e9], [5e-7])
    assert Engine(with_circuit)._ring is None
    # a ring pair at distance n/2 splits its bytes evenly over both directions (ECMP at the source)
    loads = engine.link_loads([0], [4], [8.0])
    assert sorted(loads[loads > 0]) == [4.0] * 8
