"""Chunked collectives: ``Engine.time(..., splits=k)`` runs k chunks of size/k one after another, as ASTRA-sim's
``preferred-dataset-splits`` k does with ``active-chunks-per-dimension`` 1 (measured in docs/astra-sim.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lightrail.cli.app import app
from lightrail.collectives import generate
from lightrail.collectives.compressed import compressed_form
from lightrail.errors import UnsupportedError
from lightrail.fabric.builders import ring, switch
from lightrail.timing import Engine

N = float(2**30)
B = 50e9
ALPHA = 3e-6


@pytest.mark.parametrize("k", [1, 2, 3, 4, 16])
@pytest.mark.parametrize("p", [2, 4, 8, 64])
def test_ring_allreduce_in_k_splits_is_k_start_ups_of_each_step(p, k):
    """k x (2(p-1) alpha + 2(p-1)/p N/(kB)): the bandwidth term is unchanged, the start-ups are paid k times."""
    got = Engine(switch(p, bandwidth=B), alpha=ALPHA).time(generate("allreduce", "ring", p), N, splits=k)
    want = k * (2 * (p - 1) * ALPHA + 2 * (p - 1) / p * N / (k * B))
    assert got.time_s == pytest.approx(want, rel=1e-12)
    assert got.steps == k * 2 * (p - 1) and got.size == N


@pytest.mark.parametrize("k", [2, 4])
def test_on_a_ring_each_chunk_pays_the_link_latency_of_every_step(k):
    p, lat = 8, 500e-9
    got = Engine(ring(p, bandwidth=B, latency=lat), alpha=ALPHA).time(generate("reducescatter", "ring", p), N, splits=k)
    assert got.time_s == pytest.approx(k * (p - 1) * (ALPHA + lat) + (p - 1) / p * N / B, rel=1e-12)


@pytest.mark.parametrize(("op", "algo", "topology"), [
    ("allreduce", "ring", ring), ("allreduce", "halving-doubling", switch), ("allgather", "bruck", switch),
    ("alltoall", "ring", ring), ("allreduce", "double-binary-tree", switch)])
@pytest.mark.parametrize("terms", [{}, {"endpoint_delay": 10e-9, "local_mem_bw": 1600e9}])
def test_k_splits_is_k_times_the_collective_of_one_chunk(op, algo, topology, terms):
    engine = Engine(topology(8, bandwidth=B, latency=500e-9), alpha=ALPHA, **terms)
    schedule = generate(op, algo, 8)
    one = engine.time(schedule, N / 4)
    got = engine.time(schedule, N, splits=4)
    assert got.time_s == pytest.approx(4 * one.time_s, rel=1e-12)  # endpoint delays: 4 x (steps + 1), as ASTRA-sim
    assert np.array_equal(got.step_times, np.tile(one.step_times, 4))


@pytest.mark.parametrize(("op", "algo"), [("allreduce", "ring"), ("allreduce", "halving-doubling"),
                                          ("alltoall", "pairwise"), ("broadcast", "binomial-tree")])
@pytest.mark.parametrize("terms", [{}, {"endpoint_delay": 10e-9}, {"endpoint_delay": 10e-9, "local_mem_bw": 1600e9}])
def test_one_split_is_identical_to_no_splits(op, algo, terms):
    engine = Engine(switch(16, bandwidth=B, latency=1e-6), alpha=ALPHA, **terms)
    schedule = generate(op, algo, 16)
    for size in (1.0, 1e3, 3e6 + 1, N):
        plain, one = engine.time(schedule, size), engine.time(schedule, size, splits=1)
        assert one.time_s == plain.time_s  # bit for bit
        assert np.array_equal(one.step_times, plain.step_times)


def test_compressed_schedules_split_alike():
    engine = Engine(ring(32, bandwidth=B, latency=500e-9), alpha=ALPHA, endpoint_delay=1e-9)
    cs = compressed_form("allreduce", "ring", 32)
    for k in (1, 4, 7):
        assert engine.time_compressed(cs, N, splits=k).time_s == \
            pytest.approx(engine.time(cs.expand(), N, splits=k).time_s, rel=1e-12)


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, True, "4", None])
def test_splits_must_be_a_whole_number_of_chunks(bad):
    engine = Engine(switch(4, bandwidth=B))
    with pytest.raises(UnsupportedError) as info:
        engine.time(generate("allreduce", "ring", 4), N, splits=bad)
    assert info.value.field == "splits"


def test_np_integer_splits_are_accepted():
    engine = Engine(switch(4, bandwidth=B))
    schedule = generate("allreduce", "ring", 4)
    assert engine.time(schedule, N, splits=np.int64(4)).time_s == engine.time(schedule, N, splits=4).time_s


# The CLI: lightrail collective --splits K


def _collective(*args: str):
    return CliRunner().invoke(app, ["collective", *args])


@pytest.mark.parametrize(("op", "algo", "topology"), [("allreduce", "ring", "ring"), ("alltoall", "ring", "ring"),
                                                      ("allreduce", "halving-doubling", "switch")])
def test_cli_splits_equals_the_engine(op, algo, topology):
    args = ["--op", op, "--algo", algo, "--ranks", "8", "--size", "1GiB", "--topology", topology,
            "--bandwidth", "400Gbps", "--latency", "500ns", "--alpha", "3us", "--json"]
    one = json.loads(_collective(*args).output)
    got = json.loads(_collective(*args, "--splits", "4").output)
    topo = (ring if topology == "ring" else switch)(8, bandwidth=50e9, latency=500e-9)
    want = Engine(topo, alpha=3e-6).time(generate(op, algo, 8), N, splits=4)
    assert got["time_s"] == pytest.approx(want.time_s, rel=1e-12)
    assert (got["splits"], one["splits"]) == (4, 1)
    assert got["steps"] == 4 * one["steps"] == want.steps
    assert got["size_bytes"] == N and got["algbw_Bps"] == pytest.approx(N / got["time_s"])
    assert got["busbw_Bps"] / got["algbw_Bps"] == pytest.approx(one["busbw_Bps"] / one["algbw_Bps"])
    assert got["schedule"].endswith("in 4 chunks") and got["verified"]


@pytest.mark.parametrize(("args", "needle"), [(["--splits", "0"], "--splits"), (["--splits", "-3"], "--splits"),
                                              (["--size", "16B", "--splits", "17"], "at most 16"),
                                              (["--splits", "2", "--reconfigurable"], "--reconfigurable")])
def test_cli_refuses_bad_splits_without_a_traceback(args, needle):
    result = _collective("--ranks", "8", *args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
