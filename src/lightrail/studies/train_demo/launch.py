"""Launching the demo: ``run_demo`` (fixed world) and ``run_failover_demo`` (spares, staged failures) start the
ranks with ``lightrail.runtime.launch`` and gather their results (``DemoRun``, ``FailoverRun``, ``Recovery``).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from lightrail.errors import ScenarioError
from lightrail.runtime.launch import run_elastic, run_processes
from lightrail.runtime.torch_backend import Agent
from lightrail.studies.train_demo.config import DemoConfig
from lightrail.studies.train_demo.elastic import Failure, _woken_by, elastic_train_worker
from lightrail.studies.train_demo.worker import train_worker


@dataclass(frozen=True)
class ReplicaRun:
    """One replica's training over all ranks: its backend, losses and per-step times."""

    backend: str
    losses: tuple[float, ...]
    """Step losses, from the last stage's first rank (float32 values)."""
    loss_bits: tuple[int, ...]
    """Their float32 bit patterns: equal bits mean identical numerics."""
    losses_consistent: bool
    """Every last-stage rank reported the same bits."""
    iteration_s: tuple[float, ...]
    """Per step, the slowest rank's time."""
    median_iteration_s: float
    """Median of ``iteration_s`` without warm-up steps (see :func:`run_demo`)."""

    def to_dict(self) -> dict:
        return {"backend": self.backend, "losses": list(self.losses), "loss_bits": list(self.loss_bits),
                "losses_consistent": self.losses_consistent, "iteration_s": list(self.iteration_s),
                "median_iteration_s": self.median_iteration_s}


@dataclass(frozen=True)
class DemoRun:
    """What :func:`run_demo` returns: the run on its backend, every rank's raw result, and the baseline
    replica's run when there is one."""

    config: DemoConfig
    world: int
    main: ReplicaRun
    ranks: tuple[dict, ...]
    """Each rank's result, as :func:`train_worker` returns it."""
    baseline: ReplicaRun | None = None
    others: tuple[ReplicaRun, ...] = ()
    """The baselines after the first, when several trained (``run_demo(..., baseline=(a, b))``)."""

    def to_dict(self) -> dict:
        """``{"config", "backend", "world", "losses", "loss_bits", "losses_consistent", "iteration_s",
        "median_iteration_s", "ranks"}`` and, with a baseline, ``"baseline"`` (its backend and the same keys)."""
        main = self.main.to_dict()
        out = {"config": asdict(self.config), "backend": main.pop("backend"), "world": self.world, **main,
               "ranks": list(self.ranks)}
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict()
        return out


def run_demo(config: DemoConfig, *, backend: str = "gloo", init: Callable[[], Any] | None = None,
             pg_options: Any = None, baseline: str | tuple[str, ...] | None = None, block: int = 5,
             on_step: Callable[[int, int], None] | None = None) -> DemoRun:
    """Train ``config`` on ``config.world`` spawned CPU processes over ``backend``; aggregate the results.

    ``init`` (picklable, no arguments) runs in every worker before the default group exists, e.g.
    to register ``backend`` (``functools.partial(torch_backend.setup, backend_config)``: its agent
    reaches :func:`train_worker` as ``context``). The losses come from the last stage's first rank,
    with whether every last-stage rank reported the same bits; the per-step time is the slowest
    rank's, and its median leaves out the first (warm-up) step.

    With ``baseline`` (one backend or several), a replica also trains on each in the same processes, in
    blocks of ``block`` steps taking turns (see :func:`train_worker`); every median leaves out the first step
    of every block (the first one after a switch of backend finds the fabric as the other replica's block
    left it).
    """
    results = run_processes(train_worker, config.world, config, baseline, block, on_step, backend=backend, init=init,
                            pg_options=pg_options)
    skip = set(range(0, config.steps, block)) if baseline else {0}
    names = (baseline,) if isinstance(baseline, str) else tuple(baseline or ())
    runs = [_aggregate(config, name, [r["baselines"][k] for r in results], skip) for k, name in enumerate(names)]
    return DemoRun(config, config.world, _aggregate(config, backend, results, skip), tuple(results),
                   runs[0] if runs else None, tuple(runs[1:]))


def _aggregate(config: DemoConfig, backend: str, results: list[dict], skip: set[int]) -> ReplicaRun:
    reporters = [r for r in results if r["stage"] == config.pp - 1]
    first = reporters[0]
    per_step = [max(r["iteration_s"][s] for r in results) for s in range(config.steps)]
    kept = [t for s, t in enumerate(per_step) if s not in skip] or per_step
    return ReplicaRun(backend, tuple(first["losses"]), tuple(first["loss_bits"]),
                      all(r["loss_bits"] == first["loss_bits"] for r in reporters), tuple(per_step),
                      statistics.median(kept))


@dataclass(frozen=True)
class Recovery:
    """One failover's timeline, in seconds: from the kill to its detection (the controller's ``failover``
    push, or the launcher seeing the process end without one), the OCS rewiring the spare in, every rank's
    new process groups, the checkpoint restored, and the first step completed after it (from the kill)."""

    rank: int
    """The logical rank whose process died."""
    spare: int
    """The spare (process index) that took it over."""
    checkpoint_step: int
    """Training resumed after this step (the last every survivor completed; -1: from the start)."""
    steps_lost: int
    """Steps some rank had completed beyond the checkpoint (redone)."""
    detected_by: str
    detect_s: float
    rewire_s: float
    rebuild_s: float
    restore_s: float
    first_step_s: float
    woken_by: dict[str, int]
    """How the survivors learned of it: ``connection`` (a gloo op failed: the dead peer's or a dropped group's
    connection closed), ``controller`` (an acquire failed, or the push arrived between ops), ``timeout``
    (gloo's backstop: the cascade missed a rank), ``other``."""

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["woken_by"] = dict(self.woken_by)
        return out


@dataclass(frozen=True)
class FailoverRun:
    """What :func:`run_failover_demo` returns: the run (losses over every step, across the failure), every
    logical rank's result, and one :class:`Recovery` per failure."""

    config: DemoConfig
    main: ReplicaRun
    ranks: tuple[dict, ...]
    recoveries: tuple[Recovery, ...]
    spares: int

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "spares": self.spares, **self.main.to_dict(),
                "recoveries": [r.to_dict() for r in self.recoveries]}


def run_failover_demo(config: DemoConfig, *, spares: int, failure: Failure | None, backend: str = "gloo",
                      init: Callable[[], Any] | None = None, timeout_s: float = 30.0,
                      on_step: Callable[[int, int], None] | None = None,
                      before_failure: Callable[[Agent | None], None] | None = None) -> FailoverRun:
    """Train ``config`` on ``config.world`` ranks plus ``spares`` idle spare processes (``run_elastic``);
    ``failure`` kills one rank's process at the start of a step. ``timeout_s`` bounds every gloo op (a
    backstop: a rank blocked on a dead peer fails as soon as a peer drops its connections). ``on_step`` and
    ``before_failure`` (picklable) are :func:`elastic_train_worker`'s."""
    if failure is not None:
        if not 0 <= failure.rank < config.world:
            raise ScenarioError(f"--kill-rank {failure.rank} is not a rank of {config.world}", field="--kill-rank",
                                fix=f"use 0..{config.world - 1}")
        if not 0 <= failure.step < config.steps:
            raise ScenarioError(f"--kill-at-step {failure.step} is not a step of {config.steps}",
                                field="--kill-at-step", fix=f"use 0..{config.steps - 1}")
    if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
        raise ScenarioError(f"--spares {spares!r} must be a non-negative integer", field="--spares")
    if config.dp < 2:
        raise ScenarioError("a spare restores the failed rank's state from a DP replica, and dp is 1", field="--dp",
                            fix="use --dp 2 or more with --spares")
    results, notices, marks = run_elastic(elastic_train_worker, config.world, spares, config, failure, backend,
                                          on_step, before_failure, init=init, timeout_s=timeout_s)
    recoveries = []
    for notice in notices:
        if notice.spare is None or notice.rank < 0:
            continue
        records = [rec for r in results for rec in r["recovery"] if rec["generation"] == notice.generation]
        t_fail = marks.get("killed", min(rec.get("t_error", notice.t_detected) for rec in records))
        pushes = [rec["t_push"] for rec in records if rec.get("t_push") is not None]
        t_detect = min(pushes) if pushes else notice.t_detected
        rewire = [rec["rewire_s"] for rec in records if rec.get("rewire_s") is not None]
        rebuilt = max(rec["t_rebuilt"] for rec in records)
        recoveries.append(Recovery(
            rank=notice.rank, spare=notice.spare, checkpoint_step=records[0]["checkpoint_step"],
            steps_lost=max(rec["steps_lost"] for rec in records),
            detected_by="controller" if pushes else "launcher", detect_s=t_detect - t_fail,
            rewire_s=max(rewire) if rewire else 0.0, rebuild_s=rebuilt - t_detect,
            restore_s=max(rec["t_restored"] for rec in records) - rebuilt,
            first_step_s=max(rec.get("t_first_step", math.nan) for rec in records) - t_fail,
            woken_by=dict(Counter(_woken_by(rec["error"]) for rec in records if "error" in rec))))
    return FailoverRun(config, _aggregate(config, backend, results, {0}), tuple(results), tuple(recoveries), spares)
