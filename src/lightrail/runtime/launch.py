"""Start n CPU processes joined in a gloo process group on loopback, run a function, collect results."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "run_processes"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, n: int, port: int, fn: Callable, args: tuple, results) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    try:
        results[rank] = fn(rank, n, *args)
    finally:
        dist.destroy_process_group()


def run_processes(fn: Callable, n: int, *args) -> list:
    """Run ``fn(rank, n, *args)`` in n spawned processes; returns each rank's (picklable) result."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_worker, args=(n, free_port(), fn, args, results), nprocs=n, join=True,
                           start_method="spawn")
        return [results[r] for r in range(n)]
