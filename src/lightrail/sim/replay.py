"""Replay an imported execution trace (a Chakra DAG per rank) on electrical rails, event by event.

Unlike :mod:`lightrail.sim.iteration`, whose actors are pipeline stages of a compiled Program, here every
rank is its own actor and runs its trace's dependency graph as ASTRA-sim's workload layer does:

- a node is ready when every node it depends on has finished;
- compute nodes of a rank run one at a time (one compute stream), in the order they become ready
  (ties: file order), each for its recorded duration;
- communication runs beside compute: a collective starts when every member of its group has reached it
  (members match their k-th collective on that group, in file order, as NCCL requires) and the group's
  previous collective has ended (a communicator runs its collectives one at a time, in issue order, as
  NCCL's stream does);
- a send starts when it is ready (eager, as the iteration simulator's pipeline sends: it does not wait for
  the receiver); its receive (same source, destination and tag, FIFO) finishes when it is ready and the data
  has arrived;
- ops in flight at the same time share the links they both cross (:class:`lightrail.sharing.FairShare`:
  max-min fair rates, recomputed when an op starts or ends): each op is priced alone by the cost functions
  (an :class:`lightrail.sharing.OpCost`, e.g. from the step engine) and slowed by what else runs;
  ``sharing="none"`` times each on its own, as lightrail did before;
- nodes without time (metadata, memory) finish as soon as they are ready.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lightrail.sharing import FairShare, OpCost
from lightrail.sim.costs import FabricCost, RailsCost
from lightrail.sim.iteration import TraceEvent
from lightrail.workload.chakra import ChakraTrace, TraceNode

__all__ = ["ReplayResult", "FabricCost", "RailsCost", "replay"]


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
                "waiting_s": self._mean("waiting_s")}

    def to_dict(self) -> dict:
        return {**self.summary(), "per_rank": self.per_rank}


def _cost(value) -> OpCost:
    return value if isinstance(value, OpCost) else OpCost(float(value))


def replay(trace: ChakraTrace, collective: Callable[[TraceNode, tuple[int, ...]], OpCost | float],
           transfer: Callable[[int, int, float], OpCost | float], *, record: bool | int = True,
           sharing: str = "fair") -> ReplayResult:
    """Run ``trace`` once with ``collective(node, ranks)`` and ``transfer(src, dst, nbytes)`` pricing its
    communication alone (e.g. a :class:`RailsCost`'s methods: seconds, or an :class:`OpCost` with the links the
    op keeps busy, which ``sharing="fair"`` shares among ops in flight); raises if the trace deadlocks.
    ``record`` keeps the timeline events of every rank (True), none (False) or of the first ``record`` ranks (a
    number: a big trace's timeline would not fit a browser)."""
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
    complete: dict[str, dict[int, list[tuple[int, int]]]] = {}  # group -> k -> members (rank, node), all arrived
    next_k: dict[str, int] = {}  # group -> the collective its stream runs next
    busy_groups: set[str] = set()
    sends: dict[tuple[int, int, int], deque] = {}  # (src, dst, tag) -> flows of unmatched sends
    recvs: dict[tuple[int, int, int], deque] = {}  # (src, dst, tag) -> (time, rank, node) of unmatched receives
    delivered: dict[int, float] = {}  # send flow -> arrival, for sends whose receive is not ready yet
    paired: dict[int, tuple[float, int, int]] = {}  # send flow -> the receive waiting for it
    stream_free = [0.0] * world
    stream_busy = [False] * world
    pending: list[list[tuple[float, int]]] = [[] for _ in range(world)]  # heap of (ready time, node index)
    done = [[False] * len(nodes) for nodes in trace.ranks]
    totals = [{"compute_s": 0.0, "communication_s": 0.0} for _ in range(world)]
    events: list[TraceEvent] = []
    heap: list[tuple[float, int, int, int]] = []  # (finish time, counter, rank, node index)
    counter = 0
    share = FairShare(fair=sharing == "fair")
    flows: dict[int, tuple] = {}  # flow id -> (start, members, category, lane, group or None for a send)

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

    def communicate(members: list[tuple[int, int]], start: float, cost: OpCost, category: str, lane: str,
                    group: str | None = None) -> int:
        """Start an op's flow; it ends when the sharing says (:func:`end`)."""
        nonlocal counter
        fid = counter
        counter += 1
        flows[fid] = (start, members, category, lane, group)
        share.start(fid, cost, start)
        return fid

    def end(fid: int, t: float) -> None:
        start, members, category, lane, group = flows.pop(fid)
        for r, i in members:
            totals[r]["communication_s"] += t - start
            log(r, lane, trace.ranks[r][i], category, start, t - start)
            finish_at(t, r, i)
        if group is not None:
            busy_groups.discard(group)
            run_group(group, t)
        elif fid in paired:
            recv_t, recv_r, recv_i = paired.pop(fid)
            receive(recv_r, recv_i, recv_t, t)
        else:
            delivered[fid] = t

    def run_group(group: str, t: float) -> None:
        """Start the group's next collective if all its members are there and its stream is free."""
        k = next_k.get(group, 0)
        if group in busy_groups or k not in complete.get(group, {}):
            return
        members = complete[group].pop(k)
        next_k[group] = k + 1
        busy_groups.add(group)
        r, i = members[0]
        node = trace.ranks[r][i]
        communicate(members, t, _cost(collective(node, trace.group_of(node))), node.kind.value, " comm",
                    group)

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
                complete.setdefault(node.group, {})[key[1]] = [(m, j) for m, (_, j) in got.items()]
                run_group(node.group, t)
        elif node.op == "send":
            key = (r, node.peer, node.tag)
            fid = communicate([(r, i)], t, _cost(transfer(r, node.peer, node.nbytes)), "p2p", " comm")
            if recvs.get(key):
                paired[fid] = recvs[key].popleft()
            else:
                sends.setdefault(key, deque()).append(fid)
        elif node.op == "recv":
            key = (node.peer, r, node.tag)
            if sends.get(key):
                fid = sends[key].popleft()
                if fid in delivered:
                    receive(r, i, t, delivered.pop(fid))
                else:
                    paired[fid] = (t, r, i)
            else:
                recvs.setdefault(key, deque()).append((t, r, i))
        else:
            finish_at(t, r, i)

    for r, nodes in enumerate(trace.ranks):
        for i, n in enumerate(nodes):
            if not n.deps:
                ready(r, i, 0.0)
    end_time = [0.0] * world
    while heap or len(share):
        flow = share.next_finish()
        if flow is not None and (not heap or flow[0] <= heap[0][0]):
            if share.finish(flow[1], flow[0]):  # else its bytes have moved and its latency runs on
                end(flow[1], flow[0])
            continue
        t, _, r, i = heapq.heappop(heap)
        done[r][i] = True
        end_time[r] = max(end_time[r], t)
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
    total = max(end_time, default=0.0)
    # waiting: the iteration's time a rank is not computing, i.e. communicating or waiting for a peer or a
    # dependency (not idle: a rank whose collective is on the wire is busy, only not computing)
    per_rank = [{"rank": r, "end_s": end_time[r], **totals[r], "waiting_s": total - totals[r]["compute_s"]}
                for r in range(world)]
    return ReplayResult(total, per_rank, events)
