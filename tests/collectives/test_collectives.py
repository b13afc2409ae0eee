"""Every registered collective algorithm, over many rank counts, proven by the verifier.

Besides correctness, the tests pin each algorithm's step count to its closed form, the bytes each
rank sends, and structural properties (ports per step, rail alignment, tree shapes).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightrail.collectives import (
    Combine,
    Kind,
    algorithms,
    bus_factor,
    generate,
    get,
    is_correct,
    parse_kind,
    register,
    resolve,
    verify,
)
from lightrail.collectives.stragglar import phase2
from lightrail.collectives.tree import _second_tree, btree_parents
from lightrail.collectives.verify import verify_bitset
from lightrail.errors import UnsupportedError

SMALL = range(2, 65)
BIG = (100, 127, 128, 255, 256, 511, 512, 1000, 1024)
SIZE = float(2**20)  # bytes per rank's buffer


def _log2_ceil(n: int) -> int:
    return (n - 1).bit_length()


def _log2_floor(n: int) -> int:
    return n.bit_length() - 1


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


def _fold(n: int) -> int:
    """Extra steps of MPICH's fold for non-powers of two (hand in, hand back)."""
    return 0 if _pow2(n) else 2


STEPS = {
    ("allreduce", "ring"): lambda n: 2 * (n - 1),
    ("allreduce", "recursive-doubling"): lambda n: _log2_floor(n) + _fold(n),
    ("allreduce", "halving-doubling"): lambda n: 2 * _log2_floor(n) + _fold(n),
    ("allreduce", "direct"): lambda n: 1,
    ("allreduce", "double-binary-tree"): lambda n: 2 * _log2_ceil(n),
    ("allreduce", "hierarchical"): lambda n: 2 * (math.gcd(n, 8) - 1) + 2 * (n // math.gcd(n, 8) - 1),
    ("allreduce", "stragglar"): lambda n: n - 2 + phase2(n).rounds,  # rounds vs their bound: test_stragglar.py
    ("reducescatter", "ring"): lambda n: n - 1,
    ("reducescatter", "recursive-halving"): lambda n: _log2_floor(n) + _fold(n),
    ("reducescatter", "bruck"): _log2_ceil,
    ("allgather", "ring"): lambda n: n - 1,
    ("allgather", "recursive-doubling"): lambda n: _log2_floor(n) + _fold(n),
    ("allgather", "bruck"): _log2_ceil,
    ("alltoall", "pairwise"): lambda n: n - 1,
    ("alltoall", "bruck"): _log2_ceil,
    ("alltoall", "ring"): lambda n: n * (n - 1) // 2,
    ("broadcast", "binomial-tree"): _log2_ceil,
    ("reduce", "binomial-tree"): _log2_ceil,
}
"""Closed-form step count of every registered algorithm (default parameters)."""

LARGEST = {("alltoall", "ring"): 256}
"""Largest n of the large-n proof for algorithms whose explicit schedule grows faster than n^2 (the ring
all-to-all holds n^2(n-1)/2 transfers: 8.4 million at 256 ranks, 0.5 billion at 1,024)."""

BANDWIDTH_OPTIMAL = {
    ("allreduce", "ring"): SMALL,
    ("allreduce", "hierarchical"): SMALL,
    ("allreduce", "halving-doubling"): [n for n in SMALL if _pow2(n)],
    ("reducescatter", "ring"): SMALL,
    ("reducescatter", "bruck"): SMALL,
    ("reducescatter", "recursive-halving"): [n for n in SMALL if _pow2(n)],
    ("allgather", "ring"): SMALL,
    ("allgather", "bruck"): SMALL,
    ("allgather", "recursive-doubling"): [n for n in SMALL if _pow2(n)],
    ("alltoall", "pairwise"): SMALL,
}
"""Algorithms (and sizes) in which every rank sends exactly ``bus_factor(kind, n)`` of its buffer."""

PEERS_PER_STEP = {("allreduce", "direct"): lambda n: n - 1, ("allreduce", "double-binary-tree"): lambda n: 2}
"""Most distinct peers a rank sends to (or receives from) in one step; 1 for every other algorithm."""


def _key(algo) -> tuple[str, str]:
    return (str(algo.kind), algo.name)


def _id(algo) -> str:
    return f"{algo.kind}-{algo.name}"


ALGORITHMS = algorithms()


def _sent_per_rank(schedule) -> np.ndarray:
    """Bytes each rank sends over the whole schedule, for a buffer of ``SIZE`` bytes per rank."""
    return np.bincount(schedule.src, minlength=schedule.nranks) * schedule.chunk_bytes(SIZE)


def _check_proof(schedule, algo, n: int) -> None:
    proof = verify(schedule)
    assert (proof.kind, proof.nranks, proof.nsteps) == (str(algo.kind), n, schedule.nsteps)
    assert verify_bitset(schedule).method == "bitset"  # the reference semantics agrees
    assert is_correct(schedule)


# Correctness: every algorithm, every size.


@pytest.mark.parametrize("algo", ALGORITHMS, ids=_id)
def test_every_algorithm_is_proven_for_every_small_n(algo):
    for n in SMALL:
        schedule = algo(n)
        assert schedule.kind is algo.kind and schedule.nranks == n
        _check_proof(schedule, algo, n)


@pytest.mark.slow
@pytest.mark.parametrize("n", BIG)
@pytest.mark.parametrize("algo", ALGORITHMS, ids=_id)
def test_every_algorithm_is_proven_for_large_n(algo, n):
    if n > LARGEST.get(_key(algo), n):
        pytest.skip(f"{algo.kind} {algo.name} is proven up to {LARGEST[_key(algo)]} ranks")
    schedule = algo(n)
    proof = verify(schedule)
    assert (proof.nranks, proof.nsteps) == (n, schedule.nsteps)
    assert schedule.nsteps == STEPS[_key(algo)](n)


def test_rotation_symmetric_schedules_use_the_fast_path():
    assert verify(generate("allreduce", "ring", 1024)).method == "interval+rotation"
    assert verify(generate("allgather", "bruck", 1000)).method.endswith("+rotation")


# Step counts and bytes.


def test_every_algorithm_has_a_step_closed_form():
    assert {_key(a) for a in ALGORITHMS} == set(STEPS)


@pytest.mark.parametrize("algo", ALGORITHMS, ids=_id)
def test_step_count_matches_closed_form(algo):
    closed_form = STEPS[_key(algo)]
    got = {n: algo(n).nsteps for n in SMALL}
    assert got == {n: closed_form(n) for n in SMALL}


@pytest.mark.parametrize("key", sorted(BANDWIDTH_OPTIMAL), ids="-".join)
def test_bandwidth_optimal_algorithms_send_bus_factor_of_the_buffer(key):
    kind, name = key
    for n in BANDWIDTH_OPTIMAL[key]:
        sent = _sent_per_rank(generate(kind, name, n))
        assert sent == pytest.approx(np.full(n, bus_factor(kind, n) * SIZE), rel=1e-12), n


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 64, 100])
def test_ring_allreduce_sends_2_n_minus_1_chunks_per_rank(n):
    schedule = generate("allreduce", "ring", n)
    assert schedule.chunk_bytes(SIZE) == SIZE / n
    assert np.array_equal(np.bincount(schedule.src, minlength=n), np.full(n, 2 * (n - 1)))
    assert _sent_per_rank(schedule) == pytest.approx(np.full(n, 2 * (n - 1) / n * SIZE), rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 256])
def test_halving_doubling_sends_2_n_minus_1_over_n_for_powers_of_two(n):
    sent = _sent_per_rank(generate("allreduce", "halving-doubling", n))
    assert sent == pytest.approx(np.full(n, 2 * (n - 1) / n * SIZE), rel=1e-12)


@pytest.mark.parametrize("n", [3, 6, 12, 100])
def test_halving_doubling_folded_ranks_send_less_than_their_partners(n):
    schedule = generate("allreduce", "halving-doubling", n)
    p = 1 << _log2_floor(n)
    sent = np.bincount(schedule.src, minlength=n)
    folded = 2 * np.arange(n - p)
    assert np.all(sent[folded] == p)  # hand in the whole buffer once, then wait
    assert np.all(sent[folded + 1] == p + 2 * (p - 1))


@pytest.mark.parametrize("n", [2, 3, 7, 16, 33])
def test_pairwise_alltoall_sends_n_minus_1_over_n(n):
    schedule = generate("alltoall", "pairwise", n)
    assert schedule.chunk_bytes(SIZE) == SIZE / n
    assert _sent_per_rank(schedule) == pytest.approx(np.full(n, (n - 1) / n * SIZE), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_direct_and_recursive_doubling_send_whole_buffers(n):
    direct = generate("allreduce", "direct", n)
    assert _sent_per_rank(direct) == pytest.approx(np.full(n, (n - 1) * SIZE))
    doubling = generate("allreduce", "recursive-doubling", n)
    if _pow2(n):
        assert _sent_per_rank(doubling) == pytest.approx(np.full(n, math.log2(n) * SIZE))


# Per-step structure.


@pytest.mark.parametrize("algo", ALGORITHMS, ids=_id)
def test_peers_per_step(algo):
    most = PEERS_PER_STEP.get(_key(algo), lambda n: 1)
    for n in SMALL:
        schedule = algo(n)
        step = np.repeat(np.arange(schedule.nsteps), np.diff(schedule.step_ptr))
        links = np.unique(np.stack([step, schedule.src, schedule.dst]), axis=1)
        out_degree = np.unique(links[:2], axis=1, return_counts=True)[1]
        in_degree = np.unique(links[[0, 2]], axis=1, return_counts=True)[1]
        assert out_degree.max() <= most(n), n
        assert in_degree.max() <= most(n), n


@pytest.mark.parametrize("algo", ALGORITHMS, ids=_id)
def test_no_step_is_empty(algo):
    for n in (2, 3, 8, 12, 17):
        assert np.all(np.diff(algo(n).step_ptr) > 0), n


@pytest.mark.parametrize(("kind", "name"), [("allreduce", "ring"), ("reducescatter", "ring")])
def test_ring_reduce_scatter_half_reduces_and_all_gather_half_copies(kind, name):
    n = 6
    schedule = generate(kind, name, n)
    ops = [set(step.combine.tolist()) for step in schedule.steps]
    assert ops[: n - 1] == [{Combine.REDUCE}] * (n - 1)
    assert ops[n - 1 :] == [{Combine.COPY}] * (schedule.nsteps - (n - 1))


# Roots, pipelines and servers.


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 16])
@pytest.mark.parametrize("kind", ["broadcast", "reduce"])
def test_binomial_tree_with_every_root(kind, n):
    algo = get(kind, "binomial-tree")
    for root in range(n):
        schedule = generate(kind, "binomial-tree", n, root=root)
        assert schedule.collective.root == root and schedule.params["root"] == root
        _check_proof(schedule, algo, n)
        assert schedule.nsteps == _log2_ceil(n)
        assert schedule.ntransfers == n - 1  # a tree: one edge per non-root rank
        others = np.delete(np.arange(n), root)
        ends = schedule.dst if kind == "broadcast" else schedule.src
        assert np.array_equal(np.sort(ends), others)  # each non-root rank receives (sends) once


@pytest.mark.parametrize("pipeline", [1, 2, 4])
def test_double_binary_tree_pipelines(pipeline):
    algo = get("allreduce", "double-binary-tree")
    for n in range(2, 33):
        schedule = generate("allreduce", "double-binary-tree", n, pipeline=pipeline)
        assert schedule.nchunks == 2 * pipeline and schedule.params["pipeline"] == pipeline
        _check_proof(schedule, algo, n)
        assert schedule.nsteps == 2 * _log2_ceil(n) + pipeline - 1


@pytest.mark.parametrize("n", SMALL)
def test_double_binary_tree_shapes(n):
    first = btree_parents(n)
    second = _second_tree(first)
    for parents in (first, second):
        assert np.count_nonzero(parents < 0) == 1  # one root
        assert np.all(np.bincount(parents[parents >= 0], minlength=n) <= 2)  # binary
    inner = [np.isin(np.arange(n), parents[parents >= 0]) for parents in (first, second)]
    both = np.flatnonzero(inner[0] & inner[1])
    # Even n: no rank is inner in both trees. Odd n (NCCL's shifted tree): only rank 0 is.
    assert both.tolist() == ([] if n % 2 == 0 else [0])


@pytest.mark.parametrize("gpus_per_server", [4, 8])
def test_hierarchical_per_server_size(gpus_per_server):
    algo = get("allreduce", "hierarchical")
    for n in range(gpus_per_server, 65, gpus_per_server):
        schedule = generate("allreduce", "hierarchical", n, gpus_per_server=gpus_per_server)
        _check_proof(schedule, algo, n)
        g, m = gpus_per_server, n // gpus_per_server
        assert schedule.params["gpus_per_server"] == g
        assert schedule.nsteps == 2 * (g - 1) + 2 * (m - 1)
        cross = schedule.src // g != schedule.dst // g
        # Traffic between servers stays on rails (same local rank) and is 2(m-1) chunks per rank,
        # i.e. 2(m-1)/m of the 1/g of the buffer each rank owns.
        assert np.all(schedule.src[cross] % g == schedule.dst[cross] % g)
        sent_across = np.bincount(schedule.src[cross], minlength=n) * schedule.chunk_bytes(SIZE)
        assert sent_across == pytest.approx(np.full(n, 2 * (m - 1) / m * SIZE / g), rel=1e-12)


@pytest.mark.parametrize(("n", "gpus_per_server", "g"), [(12, 8, 4), (6, 8, 2), (9, 8, 1), (8, 16, 8)])
def test_hierarchical_server_size_is_gcd(n, gpus_per_server, g):
    schedule = generate("allreduce", "hierarchical", n, gpus_per_server=gpus_per_server)
    assert schedule.params["gpus_per_server"] == g
    assert is_correct(schedule)


# The registry.


def test_registry_lists_every_kind_in_order():
    kinds = [a.kind for a in ALGORITHMS]
    assert set(kinds) == set(Kind)
    assert kinds == sorted(kinds, key=list(Kind).index)
    for kind in Kind:
        assert {a.name for a in algorithms(kind)} == {name for k, name in STEPS if k == kind}


@pytest.mark.parametrize("spelling", ["allreduce", "AllReduce", "all-reduce", "all_reduce", Kind.ALLREDUCE])
def test_generate_accepts_kind_spellings(spelling):
    assert generate(spelling, "ring", 4).kind is Kind.ALLREDUCE


def test_unknown_algorithm_lists_valid_names():
    with pytest.raises(UnsupportedError) as info:
        generate("allreduce", "no-such-algorithm", 8)
    assert info.value.field == "algo"
    assert "no-such-algorithm" in str(info.value)
    for algo in algorithms("allreduce"):
        assert algo.name in info.value.fix


def test_unknown_collective_lists_valid_kinds():
    with pytest.raises(UnsupportedError) as info:
        generate("allgatherv", "ring", 8)
    assert info.value.field == "op"
    assert "allgatherv" in str(info.value)
    for kind in Kind:
        assert kind.value in info.value.fix


@pytest.mark.parametrize("n", [1, 0, -3])
@pytest.mark.parametrize("algo", ALGORITHMS, ids=_id)
def test_fewer_than_two_ranks_is_unsupported(algo, n):
    with pytest.raises(UnsupportedError, match=f"{n} ranks") as info:
        algo(n)
    assert info.value.field == "ranks"
    assert "2 or more" in info.value.fix


def test_root_outside_the_ranks_is_unsupported():
    with pytest.raises(UnsupportedError, match="root=4") as info:
        generate("broadcast", "binomial-tree", 4, root=4)
    assert "0..3" in info.value.fix


def test_registering_a_duplicate_name_is_refused():
    before = get("allreduce", "ring")

    def impostor(n):
        raise AssertionError("must never be registered")

    with pytest.raises(ValueError, match="'ring' is already registered"):
        register("allreduce", "ring", summary="a second ring", steps="?")(impostor)
    assert get("allreduce", "ring") is before
    assert generate("allreduce", "ring", 4).nsteps == 6


def test_auto_resolves_to_the_kinds_default_and_names_resolve_to_themselves():
    assert {k: resolve(k, "auto", 6).name for k in Kind} == {
        Kind.ALLREDUCE: "ring", Kind.REDUCESCATTER: "ring", Kind.ALLGATHER: "ring", Kind.ALLTOALL: "pairwise",
        Kind.BROADCAST: "binomial-tree", Kind.REDUCE: "binomial-tree"}
    assert all(sum(a.auto for a in algorithms(k)) == 1 for k in Kind)  # one auto entry per kind
    assert resolve("allreduce", "recursive-doubling", 8) is get("allreduce", "recursive-doubling")
    assert generate("alltoall", "auto", 5).name == generate("alltoall", "pairwise", 5).name
    with pytest.raises(UnsupportedError, match="no allreduce algorithm named 'nope'"):
        resolve("allreduce", "nope", 8)


def test_auto_is_reserved_and_a_second_auto_entry_is_refused():
    def impostor(n):
        raise AssertionError("must never be registered")

    with pytest.raises(ValueError, match="names the registry's choice"):
        register("allreduce", "auto", summary="?", steps="?")(impostor)
    with pytest.raises(ValueError, match="already has an auto algorithm"):
        register("allreduce", "second-auto", summary="?", steps="?", auto=True)(impostor)
    assert resolve("allreduce", "auto", 4).name == "ring"
    assert "second-auto" not in {a.name for a in algorithms("allreduce")}


def test_parse_kind_ignores_case_and_separators():
    assert parse_kind("All-Reduce") is parse_kind("all_reduce") is Kind.ALLREDUCE
    with pytest.raises(UnsupportedError, match="unknown collective 'allsum'"):
        parse_kind("allsum")
