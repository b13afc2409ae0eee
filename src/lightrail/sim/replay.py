"""Replay an imported execution trace (a Chakra DAG per rank) on electrical rails, event by event.

Unlike :mod:`lightrail.sim.iteration`, whose actors are pipeline stages of a compiled Program, here every
rank is its own actor and runs its trace's dependency graph as ASTRA-sim's workload layer does:

- a node is ready when every node it depends on has finished;
- compute nodes of a rank run one at a time (one compute stream), in the order they become ready
  (ties: file order), each for its recorded duration;
- communication runs beside compute: a collective starts when every member of its group has reached it
  (members match their k-th collective on that group, in file order, as NCCL requires) and takes the time
  the step engine gives (:class:`lightrail.timing.Engine`, the registry's ``auto`` schedule for the group);
- a send starts when it is ready and takes the engine's transfer time (eager, as the iteration simulator's
  pipeline sends: it does not wait for the receiver); its receive (same source, destination and tag, FIFO)
  finishes when it is ready and the data has arrived;
- nodes without time (metadata, memory) finish as soon as they are ready.

Concurrent communication ops are each timed on their own (contention between different groups' ops is
not charged, as in the iteration simulator).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lightrail.fabric.params import RailFabric
from lightrail.sim.iteration import TraceEvent
from lightrail.workload.chakra import ChakraTrace, TraceNode

__all__ = ["ReplayResult", "RailsCost", "replay"]


@dataclass
class ReplayResult:
    """One pass over the trace: when it ends and where each rank's time went."""

    iteration_time_s: float
    per_rank: list[dict]
    events: list[TraceEvent] = field(repr=False, default_factory=list)

    def _mean(self, key: str) -> float:
        return float(np.mean([r[key] for r in self.per_rank])) if self.per_rank else 0.0

    def summary(self) -> dict:
        return {"iteration_time_s": self.iteration_time_s, "ranks": len(self.per_rank),
                "compute_s": self._mean("compute_s"), "communication_s": self._mean("communication_s"),
                "idle_s": self._mean("idle_s")}

    def to_dict(self) -> dict:
        return {**self.summary(), "per_rank": self.per_rank}


class RailsCost:
    """Seconds of collectives and transfers on a rail-optimized electrical fabric of ``world`` GPUs, from one
    step engine whose routes and step patterns every group shares (a group's schedule is mapped onto its
    GPUs); cached by (kind, group, bytes)."""

    def __init__(self, world: int, fabric: RailFabric, gpus_per_server: int):
        self.world, self.fabric, self.gpus_per_server = world, fabric, gpus_per_server
        self._engine_obj = None
        self._cache: dict = {}

    @property
    def _engine(self):
        """Built on first use: a one-rank trace has no network."""
        if self._engine_obj is None:
            from lightrail.fabric.builders import rails
            from lightrail.timing import Engine

            f = self.fabric
            topology = rails(self.world, gpus_per_server=self.gpus_per_server, nic_bandwidth=f.nic_bandwidth,
                             nvlink_bandwidth=f.nvlink_bandwidth, latency=f.latency, routing=f.routing)
            self._engine_obj = Engine(topology, alpha=f.alpha)
        return self._engine_obj

    def collective(self, node: TraceNode, ranks: tuple[int, ...]) -> float:
        """The registry's ``auto`` schedule of the node's kind on its group, timed step by step as
        :meth:`Engine.time` does with the group's GPUs as its placement."""
        from lightrail.collectives.registry import AUTO, generate

        key = ("c", node.kind, ranks, node.nbytes)
        if key not in self._cache:
            seconds = 0.0
            if len(ranks) > 1:
                schedule = generate(node.kind, AUTO, len(ranks))
                gpus, engine = np.asarray(ranks), self._engine
                chunk = schedule.chunk_bytes(node.nbytes)
                ptr = schedule.step_ptr
                for a, z in zip(ptr[:-1], ptr[1:], strict=True):
                    if z > a:
                        model = engine.step_model(gpus[schedule.src[a:z]], gpus[schedule.dst[a:z]])
                        seconds += model.time(chunk, engine.alpha)
            self._cache[key] = seconds
        return self._cache[key]

    def transfer(self, src: int, dst: int, nbytes: float) -> float:
        key = ("p", src, dst, nbytes)
        if key not in self._cache:
            self._cache[key] = self._engine.transfer_time(np.array([src]), np.array([dst]), nbytes)
        return self._cache[key]


def replay(trace: ChakraTrace, collective: Callable[[TraceNode, tuple[int, ...]], float],
           transfer: Callable[[int, int, float], float], *, record: bool | int = True) -> ReplayResult:
    """Run ``trace`` once with ``collective(node, ranks)`` and ``transfer(src, dst, nbytes)`` pricing its
    communication (e.g. a :class:`RailsCost`'s methods); raises if the trace deadlocks. ``record`` keeps the
    timeline events of every rank (True), none (False) or of the first ``record`` ranks (a number: a big
    trace's timeline would not fit a browser)."""
    shown = trace.world if record is True else int(record)
    world = trace.world
    index = [{n.id: i for i, n in enumerate(nodes)} for nodes in trace.ranks]
    waiting = [[len(n.deps) for n in nodes] for nodes in trace.ranks]
    children: list[list[list[int]]] = [[[] for _ in nodes] for nodes in trace.ranks]
    for r, nodes in enumerate(trace.ranks):
        for i, n in enumerate(nodes):
            for d in n.deps:
                children[r][index[r][d]].append(i)
    # the k-th collective of each (rank, group), in file order
    kth: list[dict[int, int]] = []
    for nodes in trace.ranks:
        counts: dict[str, int] = {}
        seq = {}
        for i, n in enumerate(nodes):
            if n.op == "collective":
                seq[i] = counts.get(n.group, 0)
                counts[n.group] = seq[i] + 1
        kth.append(seq)
    arrived: dict[tuple[str, int], dict[int, tuple[float, int]]] = {}  # (group, k) -> rank -> (time, node)
    sends: dict[tuple[int, int, int], deque] = {}  # (src, dst, tag) -> arrival times of unmatched sends
    recvs: dict[tuple[int, int, int], deque] = {}
    stream_free = [0.0] * world
    stream_busy = [False] * world
    pending: list[list[tuple[float, int]]] = [[] for _ in range(world)]  # heap of (ready time, node index)
    done = [[False] * len(nodes) for nodes in trace.ranks]
    totals = [{"compute_s": 0.0, "communication_s": 0.0} for _ in range(world)]
    events: list[TraceEvent] = []
    heap: list[tuple[float, int, int, int]] = []  # (finish time, counter, rank, node index)
    counter = 0

    def finish_at(t: float, r: int, i: int) -> None:
        nonlocal counter
        heapq.heappush(heap, (t, counter, r, i))
        counter += 1

    def log(r: int, lane: str, node: TraceNode, category: str, start: float, seconds: float) -> None:
        if r < shown and seconds > 0:
            events.append(TraceEvent(f"rank {r}{lane}", node.name or f"node {node.id}", category, start, seconds))

    def start_compute(r: int, t: float) -> None:
        if stream_busy[r] or not pending[r]:
            return
        _, i = heapq.heappop(pending[r])
        node = trace.ranks[r][i]
        start = max(t, stream_free[r])
        stream_busy[r] = True
        stream_free[r] = start + node.seconds
        totals[r]["compute_s"] += node.seconds
        log(r, "", node, "compute", start, node.seconds)
        finish_at(start + node.seconds, r, i)

    def communicate(ranks_nodes: list[tuple[int, int]], start: float, seconds: float, category: str) -> None:
        for r, i in ranks_nodes:
            totals[r]["communication_s"] += seconds
            log(r, " comm", trace.ranks[r][i], category, start, seconds)
            finish_at(start + seconds, r, i)

    def receive(r: int, i: int, t: float, arrival: float) -> None:
        """A receive ready at ``t`` whose data arrives at ``arrival``: it waits, then finishes."""
        if arrival > t:
            log(r, " comm", trace.ranks[r][i], "wait", t, arrival - t)
        finish_at(max(t, arrival), r, i)

    def ready(r: int, i: int, t: float) -> None:
        node = trace.ranks[r][i]
        if node.op == "compute":
            heapq.heappush(pending[r], (t, i))
            start_compute(r, t)
        elif node.op == "collective":
            key = (node.group, kth[r][i])
            members = trace.group_of(node)
            got = arrived.setdefault(key, {})
            got[r] = (t, i)
            if len(got) == len(members):
                del arrived[key]
                start = max(when for when, _ in got.values())
                communicate([(m, j) for m, (_, j) in got.items()], start, collective(node, members),
                            node.kind.value)
        elif node.op == "send":
            key = (r, node.peer, node.tag)
            seconds = transfer(r, node.peer, node.nbytes)
            communicate([(r, i)], t, seconds, "p2p")
            if recvs.get(key):
                recv_t, recv_r, recv_i = recvs[key].popleft()
                receive(recv_r, recv_i, recv_t, t + seconds)
            else:
                sends.setdefault(key, deque()).append(t + seconds)
        elif node.op == "recv":
            key = (node.peer, r, node.tag)
            if sends.get(key):
                receive(r, i, t, sends[key].popleft())
            else:
                recvs.setdefault(key, deque()).append((t, r, i))
        else:
            finish_at(t, r, i)

    for r, nodes in enumerate(trace.ranks):
        for i, n in enumerate(nodes):
            if not n.deps:
                ready(r, i, 0.0)
    end = [0.0] * world
    while heap:
        t, _, r, i = heapq.heappop(heap)
        done[r][i] = True
        end[r] = max(end[r], t)
        if trace.ranks[r][i].op == "compute":
            stream_busy[r] = False
        for c in children[r][i]:
            waiting[r][c] -= 1
            if waiting[r][c] == 0:
                ready(r, c, t)
        start_compute(r, t)
    for r in range(world):
        if not all(done[r]):
            stuck = next(n for n, ok in zip(trace.ranks[r], done[r], strict=True) if not ok)
            from lightrail.errors import InfeasibleError

            raise InfeasibleError(f"rank {r} never finishes node {stuck.id} ({stuck.op}): a dependency cycle, or a "
                                  "collective or send whose partners never arrive", field=f"rank {r}",
                                  fix="check the trace's dependencies, groups and send/recv pairs")
    total = max(end, default=0.0)
    per_rank = [{"rank": r, "end_s": end[r], **totals[r], "idle_s": total - totals[r]["compute_s"]}
                for r in range(world)]
    return ReplayResult(total, per_rank, events)

