"""Verified schedules run for real on torch.distributed (gloo, CPU processes) and match the backend."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from lightrail.collectives import algorithms  # noqa: E402
from lightrail.collectives.stragglar import stragglar_allreduce  # noqa: E402
from lightrail.runtime.executor import run_schedule  # noqa: E402
from lightrail.runtime.launch import run_processes  # noqa: E402

SIZE = 1003  # does not divide evenly into any rank count here


def _block(rank: int, like: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(like.shape, generator=g)


def _check_all(rank: int, n: int) -> dict:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(SIZE, generator=g)
    reduced = x.clone()
    dist.all_reduce(reduced)
    errors = {}
    schedules = [("allreduce", a.name, a(n)) for a in algorithms("allreduce")]
    schedules.append(("allreduce", "stragglar", stragglar_allreduce(n)))
    for kind, name, schedule in schedules:
        errors[f"{kind}/{name}"] = float((run_schedule(schedule, x.clone()) - reduced).abs().max())
    for a in algorithms("reducescatter"):
        out = run_schedule(a(n), x.clone()).tensor_split(n)[rank]
        errors[f"reducescatter/{a.name}"] = float((out - reduced.tensor_split(n)[rank]).abs().max())
    for a in algorithms("allgather"):
        buf = torch.zeros(SIZE)
        mine = buf.tensor_split(n)[rank]
        mine.copy_(_block(rank, mine))
        want = torch.cat([_block(j, c) for j, c in enumerate(torch.zeros(SIZE).tensor_split(n))])
        errors[f"allgather/{a.name}"] = float((run_schedule(a(n), buf) - want).abs().max())
    for root in {0, n - 1}:
        out = run_schedule(algorithms("broadcast")[0](n, root=root), x.clone())
        want = torch.randn(SIZE, generator=torch.Generator().manual_seed(root))
        errors[f"broadcast/root{root}"] = float((out - want).abs().max())
        out = run_schedule(algorithms("reduce")[0](n, root=root), x.clone())
        errors[f"reduce/root{root}"] = float((out - reduced).abs().max()) if rank == root else 0.0
    return errors


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_every_schedule_matches_the_backend_on_gloo(n):
    results = run_processes(_check_all, n)
    for rank, errors in enumerate(results):
        bad = {k: v for k, v in errors.items() if not v <= 1e-4}
        assert not bad, f"rank {rank}: {bad}"
    assert len(results[0]) >= len(algorithms("allreduce")) + 1 + 6
