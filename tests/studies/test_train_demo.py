"""The TP x PP x DP training demo: finite, layout-independent, deterministic, backend-independent losses."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from lightrail.errors import ScenarioError  # noqa: E402
from lightrail.runtime.launch import free_port, run_processes  # noqa: E402
from lightrail.studies.train_demo import DemoConfig, run_demo, train_worker  # noqa: E402

PARALLEL = DemoConfig(tp=2, pp=2, dp=2, steps=3)
SINGLE = DemoConfig(tp=1, pp=1, dp=1, microbatches=PARALLEL.microbatches * PARALLEL.dp, steps=10)
"""The same model and global batch on one rank (it takes every DP replica's microbatches)."""


def _register_wrapped_gloo() -> None:
    """Register "wrappedgloo": a second backend name whose groups are plain gloo (a stand-in for lightrail)."""
    def create(store, rank, size, timeout):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    dist.Backend.register_backend("wrappedgloo", create, devices=["cpu"])


def _run_single(config: DemoConfig) -> dict:
    if dist.is_initialized():  # someone else owns this process's default group: use a fresh process
        return run_processes(train_worker, 1, config)[0]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        return train_worker(0, 1, config)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def parallel() -> dict:
    return run_demo(PARALLEL).to_dict()


@pytest.fixture(scope="module")
def single() -> dict:
    return _run_single(SINGLE)


def test_parallel_losses_finite_and_agree_across_last_stage(parallel):
    assert len(parallel["losses"]) == PARALLEL.steps
    assert all(math.isfinite(x) for x in parallel["losses"])
    last = [r for r in parallel["ranks"] if r["stage"] == PARALLEL.pp - 1]
    assert len(last) == PARALLEL.tp * PARALLEL.dp
    assert all(r["loss_bits"] == parallel["loss_bits"] for r in last)
    assert parallel["losses_consistent"]
    assert all(not r["losses"] for r in parallel["ranks"] if r["stage"] != PARALLEL.pp - 1)
    assert len(parallel["iteration_s"]) == PARALLEL.steps and parallel["median_iteration_s"] > 0
    coords = sorted((r["stage"], r["dp_rank"], r["tp_rank"]) for r in parallel["ranks"])
    assert coords == [(s, d, t) for s in range(2) for d in range(2) for t in range(2)]
    assert [r["rank"] for r in parallel["ranks"]] == list(range(8))
    assert [(r["stage"], r["dp_rank"], r["tp_rank"]) for r in parallel["ranks"]][:3] == [(0, 0, 0), (0, 0, 1),
                                                                                         (0, 1, 0)]


def test_initial_loss_is_uniform_and_training_learns(single):
    assert single["losses"][0] == pytest.approx(math.log(SINGLE.vocab), rel=0.1)
    assert single["losses"][-1] < single["losses"][0] - 0.2


def test_layout_does_not_change_the_math(parallel, single):
    assert parallel["losses"][0] == pytest.approx(single["losses"][0], rel=1e-5)
    assert parallel["losses"] == pytest.approx(single["losses"][: PARALLEL.steps], rel=1e-4)


def test_runs_are_bit_identical_across_runs_and_backend_names(parallel):
    again = run_demo(PARALLEL, backend="wrappedgloo", init=_register_wrapped_gloo).to_dict()
    assert again["backend"] == "wrappedgloo"
    assert again["loss_bits"] == parallel["loss_bits"]
    assert again["losses_consistent"]


def test_single_rank_runs_are_bit_identical(single):
    assert _run_single(SINGLE)["loss_bits"] == single["loss_bits"]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"tp": 3}, "--tp"),
    ({"layers": 3}, "--pp"),
    ({"ranks": 4}, "--ranks"),
    ({"steps": 0}, "--steps"),
    ({"dp": 0}, "--dp"),
    ({"micro_batch": 1.5}, "--micro-batch"),
    ({"heads": 5}, "--heads"),
    ({"lr": -1.0}, "--lr"),
    ({"seed": -1}, "--seed"),
])
def test_bad_configs_name_the_field(kwargs, field):
    with pytest.raises(ScenarioError) as info:
        DemoConfig(**kwargs)
    assert info.value.field == field
    assert field in str(info.value)


def test_worker_rejects_a_world_that_does_not_match():
    with pytest.raises(ScenarioError, match="--ranks"):
        train_worker(0, 4, PARALLEL)


def test_a_baseline_replica_in_the_same_processes_trains_the_same_losses(parallel):
    """Paired measurement: a second replica on another backend's groups, in alternating blocks of steps,
    computes bit-identical losses to a run of its own, and both medians leave out each block's first step."""
    paired = run_demo(PARALLEL, backend="wrappedgloo", init=_register_wrapped_gloo, baseline="gloo",
                      block=2).to_dict()
    assert paired["baseline"]["backend"] == "gloo"
    assert paired["loss_bits"] == paired["baseline"]["loss_bits"] == parallel["loss_bits"]
    assert paired["losses_consistent"] and paired["baseline"]["losses_consistent"]
    for side in (paired, paired["baseline"]):
        assert len(side["iteration_s"]) == PARALLEL.steps
        assert side["median_iteration_s"] == side["iteration_s"][1]  # steps 0 and 2 start blocks
