"""The ring all-to-all (ASTRA-sim's ``Ring`` with ``All_to_All``): proven for many n, its shape and its time."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.collectives import generate, get, verify
from lightrail.collectives.verify import verify_bitset
from lightrail.fabric.builders import ring, switch
from lightrail.timing import Engine

SIZE = float(2**20)


@pytest.mark.parametrize("n", [*range(2, 34), 47, 64, 100, 128])
def test_ring_alltoall_is_proven(n):
    schedule = generate("alltoall", "ring", n)
    proof = verify(schedule)
    assert (proof.kind, proof.nranks, proof.nsteps) == ("alltoall", n, n * (n - 1) // 2)
    if n <= 33:
        assert verify_bitset(schedule).method == "bitset"


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16, 31])
def test_every_step_is_every_rank_sending_one_block_to_its_successor(n):
    schedule = generate("alltoall", "ring", n)
    for step in schedule.steps:
        assert np.array_equal(np.sort(step.src), np.arange(n))
        assert np.array_equal(step.dst, (step.src + 1) % n)
    # n(n-1)/2 blocks of N/n per rank: the sum over destinations d = 1..n-1 of d hops
    sent = np.bincount(schedule.src, minlength=n) * schedule.chunk_bytes(SIZE)
    assert sent == pytest.approx(np.full(n, (n - 1) / 2 * SIZE), rel=1e-12)


@pytest.mark.parametrize("n", [3, 4, 8, 13])
def test_each_block_travels_its_distance_clockwise(n):
    schedule = generate("alltoall", "ring", n)
    origin, dest = np.divmod(schedule.chunk, n)
    hops = np.bincount(schedule.chunk, minlength=n * n).reshape(n, n)
    assert np.array_equal(hops, (np.arange(n)[None, :] - np.arange(n)[:, None]) % n)
    assert np.all((schedule.src - origin) % n < (dest - origin) % n)  # never past its destination


@pytest.mark.parametrize("n", [3, 8, 16])
def test_time_on_a_ring_is_n_n_minus_1_over_2_neighbour_steps(n):
    alpha, bw, lat = 2e-6, 50e9, 500e-9
    got = Engine(ring(n, bandwidth=bw, latency=lat), alpha=alpha).time(generate("alltoall", "ring", n), SIZE)
    want = n * (n - 1) / 2 * (alpha + lat + SIZE / n / bw)
    assert got.time_s == pytest.approx(want, rel=1e-12)


def test_on_a_switch_the_ring_is_n_over_2_times_the_pairwise_bytes():
    n, bw = 8, 50e9
    engine = Engine(switch(n, bandwidth=bw))
    ring_t = engine.time(generate("alltoall", "ring", n), SIZE).time_s
    pairwise_t = engine.time(generate("alltoall", "pairwise", n), SIZE).time_s
    assert ring_t == pytest.approx(n / 2 * pairwise_t, rel=1e-12)


def test_registered_under_ring_and_not_the_default():
    algo = get("alltoall", "ring")
    assert algo.steps == "n(n-1)/2" and not algo.auto
    assert generate("alltoall", "auto", 6).name.startswith("pairwise")
