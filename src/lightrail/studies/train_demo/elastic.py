"""The elastic worker: a rank that survives a peer's failure, re-forms its groups with a spare, restores the
last checkpoint and resumes (``elastic_train_worker``), and the failure it may be told to stage.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lightrail.errors import InfeasibleError, LightrailError, ScenarioError
from lightrail.runtime.launch import Elastic, Notice
from lightrail.runtime.torch_backend import Agent
from lightrail.studies.train_demo.config import DemoConfig, _make_groups
from lightrail.studies.train_demo.worker import _Replica
from lightrail.workload.parallel import Dim


@dataclass(frozen=True)
class Failure:
    """Which rank's process is killed (SIGKILL, by itself) at the start of which step, in the first generation;
    ``hang`` stops it instead (SIGSTOP): the controller fails it when its heartbeats stop, and the launcher
    kills it then."""

    rank: int
    step: int
    hang: bool = False


def _recovery_error(error: BaseException) -> bool:
    """Errors a rank sees when a peer died: gloo's closed connection or timeout (RuntimeError,
    ``dist.DistError``) or the controller's Failover / RankFailed answer (a LightrailError)."""
    return isinstance(error, RuntimeError | LightrailError | dist.DistError)


def elastic_train_worker(proc: int, world: int, config: DemoConfig, failure: Failure | None, backend: str = "gloo",
                         on_step: Callable[[int, int], None] | None = None,
                         before_failure: Callable[[Agent | None], None] | None = None,
                         *, context: Agent | None = None, elastic: Elastic) -> dict:
    """Train as process ``proc`` of :func:`run_elastic` (rank ``proc``, or an idle spare for ``proc >= world``).

    Each rank keeps its state after its last few steps in memory; a DP replica holds the same, so a
    failed rank's checkpoint lives on its peer. When a peer dies, every op that waits on it fails
    (gloo: connection closed; the controller wakes blocked acquires), the rank drops its groups —
    closing its connections, so ranks blocked on it fail in turn — and waits for the launcher's
    notice: the next generation's groups are built on a fresh store prefix, the ranks agree on the
    last step every survivor completed, roll back to it, the spare receives the failed rank's state
    from its DP peer (a broadcast over the DP group), and training continues from there.

    ``on_step(rank, step)`` runs after each completed step (logical rank: a spare reports as the rank it took
    over); ``before_failure(agent)`` runs in the failing rank just before it dies (the train-demo waits there
    for a controller restart to settle, see ``runtime.controller.process.ControllerKiller``).
    """
    if config.dp < 2:
        raise ScenarioError("a spare restores the failed rank's state from a DP replica, and dp is 1", field="--dp",
                            fix="use --dp 2 or more with --spares")
    torch.set_num_threads(1)
    layout, agent, generation = config.layout(), context, 0
    records: list[dict] = []
    notice: Notice | None = None
    if elastic.spare:
        if agent is not None:
            agent.connect_spare(proc - world)
        _warm_up(config)
        while True:  # idle until a notice names this spare (or the job ends: rank -1)
            notice = elastic.notice(generation + 1, timeout_s=86400.0)  # the launcher ends it (rank -1)
            generation = notice.generation
            if notice.spare == proc or notice.spare is None:
                break
        if notice.spare != proc:
            if agent is not None:
                agent.close()
            return {"spare": proc, "used": False}
        rank = notice.rank
    else:
        rank = proc
    replica: _Replica | None = None
    pending: dict = {}
    try:
        while True:
            record = None
            if notice is not None:  # this generation starts after a failure
                record = {"generation": generation, "rank": rank, "spare": elastic.spare and replica is None,
                          "t_notice": time.time(), "t_detected": notice.t_detected, **pending}
                if agent is not None:
                    record.update(agent.failover(notice.rank, notice.spare, spare_index=notice.spare - world))
            elastic.init_group(backend, rank, generation)
            if replica is None:
                replica = _Replica(config, rank, _make_groups(layout, rank), agent)
                replica.snapshot(-1)
            else:
                replica.regroup(_make_groups(layout, rank))  # the replica holds the only references to them
            start = 0
            if record is not None:
                record["t_rebuilt"] = time.time()
                start = _restore(elastic, replica, generation, notice, record) + 1
                record["t_restored"] = time.time()
                records.append(record)
            failed = False
            try:
                for step in range(start, config.steps):
                    if failure is not None and generation == 0 and rank == failure.rank and step == failure.step:
                        if before_failure is not None:
                            before_failure(agent)
                        elastic.mark("killed")
                        os.kill(os.getpid(), signal.SIGSTOP if failure.hang else signal.SIGKILL)
                    replica.step(step)
                    replica.snapshot(step)
                    if on_step is not None:
                        on_step(rank, step)
                    if record is not None and "t_first_step" not in record:
                        record["t_first_step"] = time.time()
            except Exception as e:  # noqa: BLE001 (sorted below; the traceback is not kept: it holds the groups)
                if not _recovery_error(e):
                    raise
                failed, reason = True, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                field = e.field if isinstance(e, LightrailError) and e.field else "rank"
            if not failed:
                return {**replica.result(rank), "recovery": records, "proc": proc}
            t_error = time.time()
            push = agent.pending_failure() if agent is not None else None
            if push is not None and push.get("op") == "failover":
                elastic.report_failed(push["rank"], generation)  # a hung rank's process still lives
            _drop_groups(replica, agent)
            try:
                notice = elastic.notice(generation + 1, timeout_s=elastic.timeout_s)
            except InfeasibleError as e:  # the error was not a peer's failure: it is the job's, said as it was
                raise InfeasibleError(f"rank {rank} stopped at step {step} on {reason}, and {e.message}",
                                      field=field, fix="see the controller's log beside its state file") from None
            if notice.spare is None:
                raise InfeasibleError(f"rank {notice.rank} failed and no spare is left", field="--spares",
                                      fix="start the job with (more) --spares")
            generation = notice.generation
            pending = {"t_error": t_error, "error": reason}
    finally:
        if agent is not None:
            agent.close()


def _warm_up(config: DemoConfig) -> None:
    """A spare's hot standby: one step of a one-rank copy of the model (same widths), so its first step after
    taking a rank over does not pay torch's first-call costs (3.4 s of a 3.8 s step, 8 ranks on 2 loaded cores)."""
    one = dataclasses.replace(config, tp=1, pp=1, dp=1, layers=1, microbatches=1, steps=1, ranks=None)
    _Replica(one, 0, {Dim.TP: None, Dim.DP: None, Dim.PP: None}, None).step(0)


def _drop_groups(replica: _Replica, agent: Agent | None) -> None:
    """Let go of every group of the failed generation: their gloo connections close, so a peer blocked
    on this rank fails now instead of at its timeout (the cascade that wakes the whole job)."""
    replica.groups = {}
    for block in replica.model.blocks:
        block.group = None
    if agent is not None:
        agent.abort()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 (a group whose peer died may fail to shut down; it is gone either way)
        pass


def _restore(elastic: Elastic, replica: _Replica, generation: int, notice: Notice, record: dict) -> int:
    """Agree on the checkpoint (the last step every survivor completed), roll back to it, and send the
    failed rank's state from its DP peer to the spare. Returns the checkpoint's step."""
    store, world, config = elastic.store, elastic.world, replica.config
    taking_over = record["spare"]
    if not taking_over:
        store.set(f"g{generation}/last/{replica.rank}", str(replica.last_step()))
    survivors = [r for r in range(world) if r != notice.rank]
    lasts = [int(store.get(f"g{generation}/last/{r}")) for r in survivors]
    step = min(lasts)
    record.update(checkpoint_step=step, steps_lost=max(lasts) - step)
    if not taking_over:
        replica.rollback(step)
    layout = config.layout()
    dp_ranks = next(g for g in layout.groups(Dim.DP).tolist() if replica.rank in g)
    if notice.rank in dp_ranks:  # the failed rank's DP group: its lowest survivor sends the checkpoint
        source = next(r for r in dp_ranks if r != notice.rank)
        flat = replica.state_vector(step) if not taking_over else torch.empty(replica.vector_size(step))
        dist.broadcast(flat, group=replica.groups[Dim.DP], group_src=dp_ranks.index(source))
        if taking_over:
            replica.load_state_vector(flat, step)
    return step


def _woken_by(reason: str) -> str:
    if "Timed out" in reason or "timeout" in reason.lower():
        return "timeout"
    if reason.startswith("ControllerError"):
        return "controller"
    if "Connection" in reason or "Read error" in reason or "reset" in reason:
        return "connection"
    return "other"
