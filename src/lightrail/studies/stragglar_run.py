"""Measure StragglAR AllReduce for real against lightrail's ring and gloo's ``dist.all_reduce`` when one
rank arrives late, on CPU gloo processes.

A trial: every rank refills its buffer, leaves a barrier, the straggler sleeps ``delay_s``, then all run
the collective. Each rank times barrier exit to the end of its collective; the trial's time is the
slowest rank's (the collective is done only when every rank is). Methods are interleaved trial by
trial so drift on a shared machine hits them alike; the median over repeats is reported.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass

from lightrail.collectives import Schedule, generate
from lightrail.collectives.stragglar import stragglar_allreduce
from lightrail.errors import ScenarioError
from lightrail.runtime.launch import run_processes

__all__ = ["METHODS", "MethodTime", "StragglarRun", "measure_stragglar"]

METHODS = ("stragglar", "ring", "native")
_RTOL, _ATOL = 1e-4, 1e-3


def _validate(n: int, size_bytes: int, delay_s: float, straggler: int, repeats: int, warmup: int) -> None:
    if n < 2:
        raise ScenarioError(f"{n} ranks is too few", field="--ranks", fix="use 2 or more ranks")
    if not 0 <= straggler < n:
        raise ScenarioError(f"straggler {straggler} is not a rank of {n}", field="--straggler",
                            fix=f"pick a rank in 0..{n - 1}")
    if size_bytes < 4:
        raise ScenarioError(f"{size_bytes} bytes holds no float32 element", field="--size",
                            fix="give at least 4B, e.g. 64MiB")
    if not (math.isfinite(delay_s) and delay_s >= 0):
        raise ScenarioError(f"{delay_s!r} s is not a non-negative time", field="--straggler-delay",
                            fix="e.g. 50ms, or 0")
    if repeats < 1:
        raise ScenarioError(f"{repeats} repeats measures nothing", field="--repeats", fix="use 1 or more, e.g. 5")
    if warmup < 0:
        raise ScenarioError(f"{warmup} warm-up trials is negative", field="warmup", fix="use 0 or more")


def _rank_main(rank: int, n: int, elements: int, delay_s: float, straggler: int, repeats: int, warmup: int,
               schedules: dict[str, Schedule], threads: int) -> dict:
    """One process: returns its elapsed times per method (warm-up dropped) and its correctness checks."""
    import torch
    import torch.distributed as dist

    from lightrail.runtime.executor import run_schedule

    torch.set_num_threads(threads)  # n processes share the cores; extra intra-op threads only contend
    base = torch.randn(elements, generator=torch.Generator().manual_seed(12345 + rank), dtype=torch.float32)
    reference = base.clone()
    dist.all_reduce(reference)
    work = torch.empty_like(base)
    run = {"stragglar": lambda: run_schedule(schedules["stragglar"], work),
           "ring": lambda: run_schedule(schedules["ring"], work),
           "native": lambda: dist.all_reduce(work)}
    late = rank == straggler and delay_s > 0
    elapsed = {m: [] for m in METHODS}
    correct, max_err = {}, {}
    for trial in range(warmup + repeats):
        for method in METHODS:
            work.copy_(base)
            dist.barrier()
            start = time.perf_counter()
            if late:
                time.sleep(delay_s)
            run[method]()
            stop = time.perf_counter()
            if trial >= warmup:
                elapsed[method].append(stop - start)
            if trial == 0:  # once per method, outside the timed region
                correct[method] = bool(torch.allclose(work, reference, rtol=_RTOL, atol=_ATOL))
                max_err[method] = float((work - reference).abs().max())
    return {"elapsed": elapsed, "correct": correct, "max_abs_error": max_err}


@dataclass(frozen=True)
class MethodTime:
    """One method's median time to finish, StragglAR's speedup over it, and whether it was right."""

    method: str
    time_s: float
    stragglar_speedup: float
    correct: bool
    max_abs_error: float


@dataclass(frozen=True)
class StragglarRun:
    """A measured run: medians over ``repeats`` trials of the slowest rank's time, per method (``METHODS``)."""

    ranks: int
    size_bytes: int
    elements: int
    delay_s: float
    straggler: int
    repeats: int
    warmup: int
    stragglar_s: float
    ring_s: float
    native_s: float
    speedup_over_ring: float
    speedup_over_native: float
    trials_s: dict[str, list[float]]  # per method, each trial's slowest rank
    rank_medians_s: dict[str, list[float]]  # per method, each rank's median
    correct: dict[str, bool]  # per method, equal to dist.all_reduce on every rank
    max_abs_error: dict[str, float]
    steps: dict[str, int]
    torch_threads_per_rank: int
    backend: str

    @property
    def wrong(self) -> list[str]:
        """The methods whose result differed from ``dist.all_reduce``."""
        return [m for m in METHODS if not self.correct[m]]

    def rows(self) -> list[MethodTime]:
        times = {"stragglar": self.stragglar_s, "ring": self.ring_s, "native": self.native_s}
        return [MethodTime(m, times[m], times[m] / self.stragglar_s, self.correct[m], self.max_abs_error[m])
                for m in METHODS]

    def to_dict(self) -> dict:
        return asdict(self)


def measure_stragglar(n: int, size_bytes: int, delay_s: float, straggler: int | None = None, *, repeats: int = 5,
                      warmup: int = 1) -> StragglarRun:
    """Time StragglAR, lightrail's ring and gloo's native AllReduce of ``size_bytes`` per rank on ``n``
    CPU gloo processes with rank ``straggler`` (default: the last) ``delay_s`` late."""
    straggler = n - 1 if straggler is None else straggler
    n, size_bytes, straggler, repeats, warmup = int(n), int(size_bytes), int(straggler), int(repeats), int(warmup)
    delay_s = float(delay_s)
    _validate(n, size_bytes, delay_s, straggler, repeats, warmup)
    elements = size_bytes // 4
    schedules = {"stragglar": stragglar_allreduce(n, straggler=straggler), "ring": generate("allreduce", "ring", n)}
    threads = max(1, (os.cpu_count() or 1) // n)
    per_rank = run_processes(_rank_main, n, elements, delay_s, straggler, repeats, warmup, schedules, threads)
    trials = {m: [max(r["elapsed"][m][t] for r in per_rank) for t in range(repeats)] for m in METHODS}
    median = {m: statistics.median(trials[m]) for m in METHODS}
    return StragglarRun(
        ranks=n,
        size_bytes=size_bytes,
        elements=elements,
        delay_s=delay_s,
        straggler=straggler,
        repeats=repeats,
        warmup=warmup,
        stragglar_s=median["stragglar"],
        ring_s=median["ring"],
        native_s=median["native"],
        speedup_over_ring=median["ring"] / median["stragglar"],
        speedup_over_native=median["native"] / median["stragglar"],
        trials_s=trials,
        rank_medians_s={m: [statistics.median(r["elapsed"][m]) for r in per_rank] for m in METHODS},
        correct={m: all(r["correct"][m] for r in per_rank) for m in METHODS},
        max_abs_error={m: max(r["max_abs_error"][m] for r in per_rank) for m in METHODS},
        steps={"stragglar": schedules["stragglar"].nsteps, "ring": schedules["ring"].nsteps},
        torch_threads_per_rank=threads,
        backend="gloo",
    )


# The names before issue 32 gave StragglAR's study one spelling, kept for code that imports them.
StragglerRun = StragglarRun
measure_straggler = measure_stragglar
