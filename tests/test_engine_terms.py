"""The engine's optional endpoint and local-memory terms (ASTRA-sim's cost terms; benchmarks/vs_astra_sim.py)
against closed forms, on explicit and compressed schedules alike."""

from __future__ import annotations

import pytest

from lightrail.collectives import generate
from lightrail.collectives.compressed import compressed_form
from lightrail.fabric.builders import ring, switch
from lightrail.timing import Engine

S, B, LAT, ED, LM = 2.0**30, 50e9, 500e-9, 10e-9, 1600e9


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_ring_allreduce_with_both_terms_is_the_closed_form(n):
    engine = Engine(ring(n, bandwidth=B, latency=LAT), endpoint_delay=ED, local_mem_bw=LM)
    t = engine.time(generate("allreduce", "ring", n), S)
    steps = 2 * (n - 1)
    want = steps * (LAT + S / n / B) + (steps + 1) * ED + (n - 1) * 3 * (S / n) / LM
    assert t.time_s == pytest.approx(want, rel=1e-12)


def test_terms_are_off_by_default_and_only_add():
    schedule = generate("allreduce", "halving-doubling", 8)
    plain = Engine(switch(8, bandwidth=B, latency=LAT)).time(schedule, S)
    both = Engine(switch(8, bandwidth=B, latency=LAT), endpoint_delay=ED, local_mem_bw=LM).time(schedule, S)
    # halving-doubling reduces S/2, S/4, S/8 into each rank over its three reduce-scatter steps
    extra = (len(plain.step_times) + 1) * ED + 3 * (S / 2 + S / 4 + S / 8) / LM
    assert both.time_s - plain.time_s == pytest.approx(extra, rel=1e-9)


def test_copy_only_collectives_pay_no_memory_term():
    schedule = generate("allgather", "ring", 8)
    engine = Engine(ring(8, bandwidth=B, latency=LAT), local_mem_bw=LM)
    assert engine.time(schedule, S).time_s == pytest.approx(Engine(ring(8, bandwidth=B, latency=LAT))
                                                            .time(schedule, S).time_s, rel=1e-12)


@pytest.mark.parametrize("algo", ["ring", "halving-doubling", "recursive-doubling"])
def test_compressed_and_explicit_schedules_pay_the_same_terms(algo):
    schedule = generate("allreduce", algo, 16)
    compressed = compressed_form("allreduce", algo, 16)
    engine = Engine(switch(16, bandwidth=B, latency=LAT), endpoint_delay=ED, local_mem_bw=LM)
    assert engine.time_compressed(compressed, S).time_s == pytest.approx(engine.time(schedule, S).time_s, rel=1e-12)
