"""Start n CPU processes joined in a process group on loopback, run a function, collect results.

The default group is gloo unless the caller names another backend; ``init`` (a picklable callable
taking no arguments) runs in every worker before ``init_process_group``, e.g. to register a custom
backend, and what it returns reaches ``fn`` as its ``context`` argument: workers get their state
through arguments (``functools.partial(torch_backend.setup, config)`` hands each its backend agent),
never through the environment. The launcher sets only ``GLOO_SOCKET_IFNAME=lo``, for loopback.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "run_processes"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, n: int, port: int, fn: Callable, args: tuple, results, backend: str = "gloo",
            init: Callable[[], Any] | None = None, pg_options: Any = None) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    context = init() if init is not None else None
    options = {} if pg_options is None else {"pg_options": pg_options}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n, **options)
    try:
        results[rank] = fn(rank, n, *args) if context is None else fn(rank, n, *args, context=context)
    finally:
        dist.destroy_process_group()


def run_processes(fn: Callable, n: int, *args, backend: str = "gloo", init: Callable[[], Any] | None = None,
                  pg_options: Any = None) -> list:
    """Run ``fn(rank, n, *args)`` in n spawned processes; returns each rank's (picklable) result.

    Parameters
    ----------
    backend : the default group's torch.distributed backend ("gloo", or a name ``init`` registers).
    init : picklable callable with no arguments run in each worker before ``init_process_group``; if it
        returns something (not None), ``fn`` gets it as keyword ``context``.
    pg_options : passed to ``init_process_group`` as ``pg_options`` when not None (must pickle).
    """
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_worker, args=(n, free_port(), fn, args, results, backend, init, pg_options), nprocs=n,
                           join=True, start_method="spawn")
        return [results[r] for r in range(n)]
