"""One training rank: the replica it holds (model stage, optimizer, groups), a GPipe step over the PP group,
and the DP gradient all-reduce; ``train_worker`` runs a whole job's rank.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.torch_backend import Agent, idle_stats, registered
from lightrail.studies.train_demo.config import DemoConfig, _batch, _bits, _make_groups
from lightrail.studies.train_demo.model import _Stage
from lightrail.studies.train_demo.optimizer import _Adam
from lightrail.workload.parallel import Dim


def train_worker(rank: int, world: int, config: DemoConfig, baseline: str | tuple[str, ...] | None = None,
                 block: int = 5, on_step: Callable[[int, int], None] | None = None, *,
                 context: Agent | None = None) -> dict:
    """Train ``config.steps`` steps as ``rank`` of ``world`` (default group already initialised).

    Returns ``{"rank", "stage", "tp_rank", "dp_rank", "losses", "loss_bits", "iteration_s", "cpu_s", "controller",
    "step_start_s", "timeline"}`` (``cpu_s``: per step, the process's CPU seconds, every thread's); ``losses``
    (step losses averaged over the global batch, float32 values) and ``loss_bits`` (their float32 bit patterns)
    are empty except on the last pipeline stage; ``timeline`` is the lightrail agent's record of the replica's ops
    (``Agent.timeline``; empty on gloo), ``step_start_s`` when each step started (the same clock).

    With ``baseline`` (a backend name, or several), a replica of the model trains on groups of each baseline
    backend in the same processes, the replicas taking turns in blocks of ``block`` steps (the order rotating
    from block to block; with one baseline, the baseline first in even blocks), so all are timed under the same
    load; the first baseline's results are under ``"baseline"``, every baseline's under ``"baselines"``.

    ``context`` is the lightrail backend's agent of this process when the groups run on it (what
    ``torch_backend.setup`` returned in the launcher's ``init``): its controller requests are counted
    per step, reported under ``"controller"``, and it leaves the controller when training ends.

    ``on_step(rank, step)`` (picklable) runs after each step of the main replica, e.g. to tell the launcher
    how far training got (the train-demo kills its controller at a step).
    """
    if world != config.world:
        raise ScenarioError(f"{world} ranks run a layout of tp({config.tp}) * pp({config.pp}) * dp({config.dp}) "
                            f"= {config.world}", field="--ranks", fix=f"launch {config.world} ranks")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many ranks share few cores
    try:
        layout = config.layout()
        main = _Replica(config, rank, _make_groups(layout, rank), context, ops=context)
        if baseline is None:
            for step in range(config.steps):
                main.step(step)
                if on_step is not None:
                    on_step(rank, step)
            return main.result(rank)
        others = [_Replica(config, rank, _make_groups(layout, rank, b), context, ops=registered(b))
                  for b in ((baseline,) if isinstance(baseline, str) else baseline)]
        replicas = [*others, main]
        for first in range(0, config.steps, block):
            steps = range(first, min(first + block, config.steps))
            turn = first // block % len(replicas)
            for replica in replicas[turn:] + replicas[:turn]:
                for step in steps:
                    replica.step(step)
                    if on_step is not None and replica is main:
                        on_step(rank, step)
        return {**main.result(rank), "baseline": others[0].result(rank),
                "baselines": [other.result(rank) for other in others]}
    finally:
        if context is not None:
            context.close()
        torch.set_num_threads(threads)


class _Replica:
    """One copy of the model on one set of groups, with its losses, step times and controller requests."""

    def __init__(self, config: DemoConfig, rank: int, groups: dict, agent: Agent | None, *, ops: Agent | None = None):
        self.agent = agent  # shared by both replicas: requests count wherever they happen (acks of revokes)
        self.ops = ops  # the agent running this replica's groups (lightrail backends): its op timeline
        coords = {d: int(c) for d, c in config.layout().coords(rank).items()}
        self.config, self.groups = config, groups
        self.stage, self.tp_rank, self.dp_rank = coords[Dim.PP], coords[Dim.TP], coords[Dim.DP]
        self.rank = rank
        self.model = _Stage(config, self.stage, self.tp_rank, groups[Dim.TP])
        self.params = list(self.model.parameters())
        self.optimizer = _Adam(self.params, config.lr)
        self.losses, self.times, self.requests, self.starts = [], [], [], []
        self.cpu: list[float] = []  # per step, this process's CPU seconds (all threads: the client's reader too)
        self.snapshots: deque = deque(maxlen=3)  # (step, tensors, adam t); only kept with spares

    def step(self, step: int) -> None:
        start, sent, cpu = time.perf_counter(), self._requests(), time.process_time()
        self.starts.append(start)
        for p in self.params:
            p.grad = None
        loss = _pipeline_step(self.config, self.model, step, self.stage, self.dp_rank, self.groups[Dim.PP])
        loss = _sync_gradients(self.config, self.params, loss, self.groups[Dim.DP])
        self.optimizer.step()
        self.times.append(time.perf_counter() - start)
        self.cpu.append(time.process_time() - cpu)
        self.requests.append(self._requests() - sent)
        if loss is not None:
            self.losses.append(loss)

    def _requests(self) -> int:
        return 0 if self.agent is None else self.agent.requests

    # -- failover: in-memory checkpoints, new groups, restore ---------------------------------------------
    def snapshot(self, step: int) -> None:
        """Keep this rank's state after ``step`` (the last few): a DP replica holds the same, so it is
        the failed rank's checkpoint too, in memory on a peer."""
        opt = self.optimizer
        self.snapshots.append((step, [x.detach().clone() for x in (*self.params, *opt.m, *opt.v)], opt.t))

    def last_step(self) -> int:
        return self.snapshots[-1][0]

    def rollback(self, step: int) -> None:
        """Back to the state after ``step`` (-1: the initial one); later steps' records are dropped."""
        saved = next((s for s in self.snapshots if s[0] == step), None)
        if saved is None:
            raise InfeasibleError(f"no checkpoint of step {step} on rank {self.rank} (holds "
                                  f"{[s[0] for s in self.snapshots]})", field="checkpoint")
        with torch.no_grad():
            for x, y in zip((*self.params, *self.optimizer.m, *self.optimizer.v), saved[1], strict=True):
                x.copy_(y)
        self.optimizer.t = saved[2]
        self._truncate(step)
        while self.snapshots[-1][0] > step:
            self.snapshots.pop()

    def _truncate(self, step: int) -> None:
        self.losses = self.losses[: step + 1] if self.stage == self.config.pp - 1 else []
        self.times, self.requests = self.times[: step + 1], self.requests[: step + 1]
        self.cpu = self.cpu[: step + 1]
        self.starts = self.starts[: step + 1]

    def regroup(self, groups: dict) -> None:
        """Use a new generation's groups (the model's TP layers hold theirs)."""
        self.groups = groups
        for block in self.model.blocks:
            block.group = groups[Dim.TP]

    def state_vector(self, step: int) -> torch.Tensor:
        """Parameters, Adam moments and step count and, on the last stage, the losses up to ``step``: what
        a spare taking this rank's place over needs, in one flat tensor."""
        opt = self.optimizer
        pieces = [x.detach().reshape(-1) for x in (*self.params, *opt.m, *opt.v)]
        pieces.append(torch.tensor([float(opt.t), *self.losses[: step + 1]], dtype=torch.float32))
        return torch.cat(pieces)

    def load_state_vector(self, flat: torch.Tensor, step: int) -> None:
        opt, offset = self.optimizer, 0
        with torch.no_grad():
            for x in (*self.params, *opt.m, *opt.v):
                x.copy_(flat[offset: offset + x.numel()].view_as(x))
                offset += x.numel()
        opt.t = int(flat[offset])
        last = self.stage == self.config.pp - 1
        self.losses = [float(v) for v in flat[offset + 1:]] if last else []
        # steps this process did not run: no time, no requests of its own
        self.times, self.requests, self.starts = [0.0] * (step + 1), [0] * (step + 1), [0.0] * (step + 1)
        self.cpu = [0.0] * (step + 1)
        self.snapshots.clear()
        self.snapshot(step)

    def vector_size(self, step: int) -> int:
        n = 3 * sum(p.numel() for p in self.params) + 1
        return n + (step + 1 if self.stage == self.config.pp - 1 else 0)

    def result(self, rank: int) -> dict:
        controller = idle_stats() if self.agent is None else self.agent.stats()  # none on plain gloo
        controller["requests_per_step"] = self.requests
        return {"rank": rank, "stage": self.stage, "tp_rank": self.tp_rank, "dp_rank": self.dp_rank,
                "losses": self.losses, "loss_bits": [_bits(x) for x in self.losses], "iteration_s": self.times,
                "cpu_s": self.cpu, "controller": controller, "step_start_s": self.starts,
                "timeline": [] if self.ops is None else list(self.ops.timeline)}


def _pipeline_step(config: DemoConfig, model: _Stage, step: int, stage: int, dp_rank: int, pp_group):
    """GPipe: all microbatches forward, then all backward in reverse order; returns this replica's
    mean loss (a 0-d tensor) on the last stage, else None. Gradients accumulate in the parameters."""
    m = config.microbatches
    shape = (config.micro_batch, config.seq, config.d_model)
    inputs, outputs = [], []
    for i in range(m):
        tokens, targets = _batch(config, step, dp_rank * m + i)
        if model.first:
            x = tokens
        else:
            x = torch.empty(shape)
            dist.recv(x, group=pp_group, group_src=stage - 1)
            x.requires_grad_()
        y = model(x)
        if model.last:
            y = F.cross_entropy(y.reshape(-1, config.vocab), targets.reshape(-1)) / m
        else:
            dist.send(y.detach().contiguous(), group=pp_group, group_dst=stage + 1)
        inputs.append(x)
        outputs.append(y)
    for i in reversed(range(m)):
        if model.last:
            outputs[i].backward()
        else:
            grad = torch.empty(shape)
            dist.recv(grad, group=pp_group, group_src=stage + 1)
            outputs[i].backward(grad)
        if not model.first:
            dist.send(inputs[i].grad.contiguous(), group=pp_group, group_dst=stage - 1)
    if model.last:
        return torch.stack([y.detach() for y in outputs]).sum()
    return None


def _sync_gradients(config: DemoConfig, params: list[nn.Parameter], loss, dp_group) -> float | None:
    """Average gradients (and the loss, riding in the same flat buffer) over the DP group; return the loss."""
    pieces = [p.grad.reshape(-1) for p in params]
    if loss is not None:
        pieces.append(loss.reshape(1))
    flat = torch.cat(pieces)
    if dp_group is not None:
        dist.all_reduce(flat, group=dp_group)
        flat /= config.dp
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
        offset += p.numel()
    return float(flat[-1]) if loss is not None else None
