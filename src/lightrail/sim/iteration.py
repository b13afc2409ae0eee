"""Event-driven execution of one training iteration on electrical or photonic rails, under a Plan.

Actors are pipeline stages: every rank of a stage runs the same op list at the same times on a
symmetric fabric, so one actor stands for all of them and each communication op is charged for
all its concurrent groups at once (DESIGN.md: "all concurrently active groups of the same phase
together"). Ops run in global time order from a priority queue (ties broken by insertion
order), which is what lets the circuit state be decided causally:

- a collective or send first checks in with the controller (Opus: before every op; with leases:
  only when its stage holds no lease on the op's configuration), then waits for its circuits. On
  photonic rails a missing circuit is installed by the Plan's policy: the whole rail switch
  rewritten to the op's configuration (Opus) or only the changed ports; not while a changing port
  still carries traffic (the controller learns a port is free when its release arrives, or, for a
  port another stage leases, once the revoke is acknowledged, ``ocs.revoke_rtt``; provisioned, the holders
  yield their leases as they announce their next phase, so no revoke), after the controller's command
  latency, and the changed ports stay dark for the switch's delay. Then it moves its bytes for the
  time :class:`lightrail.sim.durations.OpDurations` gives it alone (the engine on the state graph of its
  circuits, NVLink plus those circuits, or the rail switches on electrical rails; as NCCL runs it by
  default), slowed by what shares its links;
- a receive waits for its matching send (blocking sends; FIFO per stage pair): the data arrives when the
  send's flow ends. A send that checks in (or whose receiver must) is granted once the receiver checked in
  too, when it reaches its receive: the pair is one group, as the runtime's acquire barrier (a receive right
  after a send is posted with it, as Megatron batches them, so no pipeline schedule deadlocks);
- a communicator (a stage's group over the op's dimensions) runs its collectives one at a time in issue order,
  as NCCL's stream does: gradient buckets follow one another; ops of different communicators overlap;
- ops in flight at the same time share the links they both cross (:class:`lightrail.sharing.FairShare`:
  max-min fair rates, recomputed when an op starts or ends). A stage's ranks load their links alike, so an op's
  links are counted by class (the stage, the rail, NVLink or NIC, out or in) with the busiest link's time;
  ``fabric.sharing == "none"`` times each op on its own. A reconfiguration decided while an op is in flight
  takes its ports to be free when the op would end alone (an op runs no faster than alone).

Control-plane timing (``fabric.params.RailFabric.check_in_rtt``, ``command_latency``): a check-in is a round trip;
a request or release reaches the controller after half of it; the controller decides (on demand:
when the first op of a phase checks in; provisioned: when the previous phase's last op released,
not earlier) and the switch starts ``command_latency`` later; a rank that asked before the switch ended is
granted ``switch_grant_latency`` after its end (the controller's own lag there; 0 by default).

An emulation (``fabric.host_cores``: every rank a process on that many CPU cores, as ``train-demo`` runs) times
compute under processor sharing: a compute op is a flow on the host's cores, so a stage computes faster while
another waits (a bubble, a switch).

The reported iteration is the second of two run back to back, so the rails start in the state the
previous iteration left them in (steady state), not empty.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from lightrail.control.opus import LIGHTRAIL, OpusPlanner, Requirement
from lightrail.control.plan import Mode, Plan, Policy, union
from lightrail.fabric.params import RailFabric
from lightrail.sharing import FairShare, OpCost
from lightrail.sim.durations import OpDurations
from lightrail.sim.rails import Rails
from lightrail.sim.result import IterationResult, TraceEvent
from lightrail.workload.parallel import Dim
from lightrail.workload.program import CollectiveOp, CommOp, ComputeOp, Program, RecvOp, SendOp

__all__ = ["RailFabric", "TraceEvent", "IterationResult", "OpDurations", "simulate_iteration"]

_NO_CIRCUITS = (np.zeros(0, np.int64),) * 3

_CPU = np.array([-1])
"""The emulation host's cores as one link of the flow-level sharing (``fabric.host_cores``; network links are >= 0)."""


def _components(tx: np.ndarray, rx: np.ndarray) -> int:
    """Connected sets of the servers that circuits ``tx[i] -> rx[i]`` join (either direction)
    (:func:`_components_per_rail` on one rail)."""
    return int(_components_per_rail(np.zeros(len(tx), np.int64), tx, rx, 1)[0])


def _components_per_rail(rail: np.ndarray, tx: np.ndarray, rx: np.ndarray, rails: int) -> np.ndarray:
    """Per rail, the connected sets of the servers that its circuits ``tx[i] -> rx[i]`` join (either direction):
    each (rail, server) takes the least label of its circuits' ends, then its label's label (pointer jumping),
    until nothing changes; a set then shares one label, and its root's rail counts it. Every rail at once: a
    switch usually changes all of them (a DP ring of 8,192 servers per rail in a few rounds of array operations)."""
    if not len(tx):
        return np.zeros(rails, np.int64)
    span = int(max(tx.max(), rx.max())) + 1
    node, ends = np.unique(np.concatenate([rail * span + tx, rail * span + rx]), return_inverse=True)
    a, b = ends[: len(tx)], ends[len(tx):]
    label = np.arange(len(node))
    while True:
        low = np.minimum(label[a], label[b])
        new = label.copy()
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        new = new[new]
        if np.array_equal(new, label):
            return np.bincount(node[label == np.arange(len(label))] // span, minlength=rails)
        label = new


def simulate_iteration(program: Program, fabric: RailFabric, policy: Policy | Plan = LIGHTRAIL, *,
                       planner: OpusPlanner | None = None, durations: OpDurations | None = None) -> IterationResult:
    """Run two iterations of ``program`` on ``fabric`` and report the second (steady state).

    ``policy`` is the Policy to plan with, or the Plan itself (the one a runtime executes too: its policy and
    configurations are used as given; it must be this program's). ``planner`` and ``durations`` may be shared
    by runs of the same program that differ only in the delay or the controller's latency (their work does
    not depend on those)."""
    given = policy if isinstance(policy, Plan) else None
    planner = planner or OpusPlanner(program.job.layout, given.policy if given is not None else policy)
    sim = _Simulation(program, fabric, planner, durations, given)
    sim.run_iteration(record=False)  # leaves the rails as the previous iteration would
    return sim.result(sim.run_iteration(record=True))


def _checked(given: Plan | None, own: Plan) -> Plan:
    """The Plan to execute: the one given (a runtime's too), if it has this program's configurations, else
    the planner's own."""
    if given is None:
        return own
    if given.phases != own.phases or any(not np.array_equal(given.configurations[k], own.configurations[k])
                                         for k in own.configurations):
        raise ValueError("the plan given is not this program's (its configurations differ from the planner's)")
    return given


@dataclass
class _StageTotals:
    """One stage's time per category in an iteration, and its controller check-ins; the bubble is what
    the iteration leaves over (``result``)."""

    compute: float = 0.0
    communication: float = 0.0
    """Includes the control and circuit waits, which ``result`` takes out again."""
    reconfiguration: float = 0.0
    control: float = 0.0
    round_trips: int = 0
    peer_wait: float = 0.0
    """A send's wait for its receiver's check-in (a bubble: the receiver was busy elsewhere)."""
    requests: int = 0
    """Messages a rank sends the controller, as the runtime counts them: acquires, releases, acks, prepares."""
    phase: str | None = None
    """The configuration of its last check-in (a provisioned rank announces the next one when it changes)."""


class _Iteration:
    """Everything one iteration's run changes: the event queue (ties broken by insertion order), where
    each stage stands in its op list, the pipeline channels, the per-stage totals and the trace."""

    def __init__(self, start: float, stages: int, *, record: bool, reconfig_mark: int):
        self.start = start
        self.end = start
        self.queue: list[tuple[float, int, int | Generator]] = []  # (time, insertion counter, stage or op)
        self.counter = 0
        self.next_op = [0] * stages
        self.sent: dict[tuple[int, int], list[float]] = {}  # (from, to) stage -> arrival of each send, FIFO
        self.waiting: dict[tuple[int, int], tuple[int, float]] = {}  # (from, to) -> (stage blocked, since when)
        self.posted: dict[tuple[int, int], list[float]] = {}  # (from, to) -> when the receiver reached each receive
        self.sends: dict[tuple[int, int], int] = {}  # (from, to) -> sends issued so far (the k-th meets the k-th post)
        self.post_waiting: dict[tuple[int, int, int], Generator] = {}  # a send waiting for its receiver's post
        self.preposted: set[tuple[int, int]] = set()  # (stage, op index) of receives posted with the send before
        self.blocked: dict[int, float] = {}  # stage -> when its send began waiting for its receiver's post
        self.now = start  # the time of the event being run
        self.streams: dict[tuple, deque] = {}
        """Per communicator (stage, group dimensions): its ops in issue order, the first one running."""
        self.stream_of: dict[Generator, deque] = {}  # an op's process -> its communicator's stream
        self.issued: dict[tuple, int] = {}  # (stage, label, group dims) -> how many such ops the stage issued
        self.gathering: dict[tuple, list] = {}  # a collective over stages -> the processes waiting for the rest
        self.finish = [start] * stages
        self.async_end = start
        self.totals = [_StageTotals() for _ in range(stages)]
        self.events: list[TraceEvent] | None = [] if record else None
        self.reconfig_mark = reconfig_mark
        """Reconfigurations before this index of ``_Rails.reconfigs`` belong to earlier iterations."""
        self.acks_mark: list[int] = [0] * stages
        """``_Rails.acks`` when the iteration started."""
        self.group_switches: dict[int, int] = {}
        """Per rail, switches as a runtime counts them: one per group (see ``_count_groups``)."""
        for stage in range(stages):
            self.push(start, stage)

    def push(self, time: float, stage: int | Generator) -> None:
        """Run ``stage``'s next op, or resume an op in flight, at ``time``."""
        heapq.heappush(self.queue, (time, self.counter, stage))
        self.counter += 1

    def event(self, track: str, name: str, category: str, start: float, duration: float) -> None:
        if self.events is not None and duration > 0:
            self.events.append(TraceEvent(track, name, category, start, duration))


class _Simulation:
    """A program executed under a plan, iteration after iteration; what carries over from one
    iteration to the next (the clock, the rails, when each stage last used them) lives here."""

    def __init__(self, program: Program, fabric: RailFabric, planner: OpusPlanner, durations: OpDurations | None,
                 plan: Plan | None = None):
        self.program, self.fabric, self.planner = program, fabric, planner
        self.layout = program.job.layout
        self.plan = _checked(plan, planner.plan(program)) if fabric.circuits else None
        self.policy: Policy = self.plan.policy if self.plan is not None else planner.policy
        """What the rails and the check-ins follow: the Plan's policy."""
        self.durations = durations or OpDurations(program, fabric)
        self.rails = Rails(self.plan, fabric, self.layout)
        self.clock = 0.0
        """Where the next iteration starts: the end of the last one."""
        self.prior = [self.clock] * self.layout.pp
        """Per stage, the end of its last op on the rails (when a provisioned controller learns the next phase)."""
        self.share = FairShare(fair=fabric.sharing == "fair")
        """The ops in flight and their shares of the links."""
        self._pairs: dict[Requirement, Requirement] = {}
        self._cpu: dict[float, OpCost] = {}  # a compute op's flow on the host's cores, by its seconds
        self._ops: dict[tuple[int, int], tuple] = {}  # (id of an op, stage) -> what _prepared worked out
        self._sets: dict[tuple, list[int]] = {}  # missing circuits (bytes) -> connected sets per rail

    def _check_in(self, s: int, req: Requirement, *, receiver: bool = False) -> bool:
        """Does this op (part) ask the controller first? Opus: every op on the rails; leases: only when
        the stage holds no lease on its configuration. A receiver's lease on the phase is enough: its pair's
        group (both directions, as the runtime's ``pp:a<->b``) was granted whole."""
        if not self.fabric.circuits or not req.ncircuits:
            return False
        if receiver:
            return not (self.policy.leases and self.rails.leased.get(s) == req.phase)
        return not (self.policy.leases and self.rails.has_lease(s, req))

    def run_iteration(self, *, record: bool) -> _Iteration:
        """Run the program once from ``clock``; ``record`` keeps the trace events.

        Stages step through their op lists; a communication op is a process (a generator, as SimPy's) that
        yields ``("at", time)`` to wait and ``("flow", cost)`` to move its bytes on shared links; it resumes when
        the sharing says the flow has ended."""
        it = _Iteration(self.clock, self.layout.pp, record=record, reconfig_mark=len(self.rails.reconfigs))
        it.acks_mark = list(self.rails.acks)
        share = self.share
        while True:
            while it.queue or len(share):
                flow = share.next_finish()
                if flow is not None and (not it.queue or flow[0] <= it.queue[0][0]):
                    it.now = flow[0]
                    if share.finish(flow[1], flow[0]):  # else its bytes have moved and its latency runs on
                        self._resume(it, flow[1], flow[0])
                    continue
                t, _, who = heapq.heappop(it.queue)
                it.now = t
                if isinstance(who, int):
                    self._step(it, who, t)
                else:
                    self._resume(it, who, t)
            if not it.post_waiting or not self._post_ahead(it):
                break
        if it.post_waiting or it.waiting:
            stuck = sorted(it.post_waiting or it.waiting)
            raise RuntimeError(f"the pipeline deadlocked: sends or receives wait on {stuck}")
        it.end = max(max(it.finish), it.async_end, float(np.max(self.rails.state.tx_busy, initial=it.start)))
        self.clock = it.end
        return it

    def _step(self, it: _Iteration, s: int, t: float) -> None:
        """Stage ``s`` runs its next op at ``t``."""
        ops = self.program.stages[s]
        if it.next_op[s] >= len(ops):
            it.finish[s] = t
            return
        match ops[it.next_op[s]]:
            case ComputeOp() as op:
                it.next_op[s] += 1
                if self.fabric.host_cores is not None:  # on the emulation host's shared cores
                    proc = self._compute(it, s, op)
                    next(proc)
                    self._resume(it, proc, t)
                    return
                if it.events is not None:
                    it.event(f"stage {s}", op.label, "compute", t, op.seconds)
                it.totals[s].compute += op.seconds
                it.push(t + op.seconds, s)
            case RecvOp() as op:
                if (s, it.next_op[s]) not in it.preposted:
                    self._post(it, (s + op.offset, s), t)
                self._receive(it, s, op, t)
            case CollectiveOp() | SendOp() as op:
                nxt = it.next_op[s] + 1
                if isinstance(op, SendOp) and not op.asynchronous and nxt < len(ops) and isinstance(ops[nxt], RecvOp):
                    # a send and the receive after it are posted together (Megatron's batched isend/irecv in
                    # p2p_communication.py _communicate): the receive's peer need not wait for the send to end
                    it.preposted.add((s, nxt))
                    self._post(it, (s + ops[nxt].offset, s), t)
                it.next_op[s] += 1
                if op.asynchronous:
                    it.push(t, s)  # the stage goes on; the op runs on its communicator's stream
                key = (s, type(op).__name__, op.group_dims)
                stream = it.streams.get(key)
                if stream is None:
                    stream = it.streams[key] = deque()
                proc = self._communicate(it, s, op, t)
                next(proc)  # to its first wait: for the stream
                stream.append(proc)
                it.stream_of[proc] = stream
                if len(stream) == 1:
                    self._resume(it, proc, t)
            case op:
                raise TypeError(f"{op!r} is not a program op")

    def _resume(self, it: _Iteration, proc: Generator, t: float) -> None:
        """Run an op's process from ``t`` to its next wait; when it ends, its stream's next op starts."""
        try:
            what, arg = proc.send(t)
        except StopIteration:
            stream = it.stream_of.pop(proc, None)
            if stream is not None:  # it heads its stream: the next op of the stream starts
                stream.popleft()
                if stream:
                    self._resume(it, stream[0], t)
            return
        if what == "at":
            it.push(max(arg, it.now), proc)
        elif what == "gather":
            it.gathering[arg].append(proc)
        elif what == "post":
            it.post_waiting[arg] = proc
            it.blocked[arg[0]] = t
        else:
            self.share.start(proc, arg, t)

    def _post(self, it: _Iteration, key: tuple[int, int], t: float) -> None:
        """The receiver of channel ``key`` (from, to) reached its next receive at ``t``: a send waiting for that
        (its group's check-in barrier) goes on."""
        posts = it.posted.setdefault(key, [])
        posts.append(t)
        proc = it.post_waiting.pop((*key, len(posts) - 1), None)
        if proc is not None:
            it.push(max(t, it.now), proc)

    def _post_ahead(self, it: _Iteration) -> bool:
        """Every stage waits in a send for a receiver that waits in a send (a ring of them, as interleaved 1F1B's
        wrap makes): Megatron posts a stage's sends and receives of a step together (p2p_communication.py
        ``_communicate``, batch_isend_irecv), so each receiver posted its next receive on the channel when it
        blocked in its own send. Returns False if no waiting send found its receive (a true deadlock)."""
        moved = False
        for src, dst, _ in sorted(it.post_waiting):
            ops = self.program.stages[dst]
            for idx in range(it.next_op[dst], len(ops)):
                if isinstance(ops[idx], RecvOp) and dst + ops[idx].offset == src and (dst, idx) not in it.preposted:
                    it.preposted.add((dst, idx))
                    self._post(it, (src, dst), it.blocked.get(dst, it.now))
                    moved = True
                    break
        return moved

    def _receive(self, it: _Iteration, s: int, op: RecvOp, t: float) -> None:
        key = (s + op.offset, s)
        if it.sent.get(key):
            ready = it.sent[key].pop(0)
            if ready > t and it.events is not None:
                it.event(f"stage {s}", f"wait {op.label}", "bubble", t, ready - t)
            it.next_op[s] += 1
            it.push(max(t, ready), s)
        else:
            it.waiting[key] = (s, t)  # woken by the matching send's arrival

    def _deliver(self, it: _Iteration, key: tuple[int, int], when: float) -> None:
        """A send's data arrives at ``when``: its receiver, if already waiting, goes on."""
        if key not in it.waiting:
            it.sent.setdefault(key, []).append(when)
            return
        s, since = it.waiting.pop(key)
        op = self.program.stages[s][it.next_op[s]]
        if it.events is not None:
            it.event(f"stage {s}", f"wait {op.label}", "bubble", since, when - since)
        it.next_op[s] += 1
        it.push(when, s)

    def _communicate(self, it: _Iteration, s: int, op: CommOp, issued: float) -> Generator:
        """A collective or send, possibly in several circuit parts; ``count`` back-to-back collectives
        each check in under Opus's per-op rule. A process: starts when its stream is free.

        The controller plans an op's parts when the op starts (the check-ins and switches of its sequence of
        circuit configurations, each part taken to last as long as alone); then the parts move their bytes in
        turn on the shared links, each no sooner than planned and than the previous part has ended."""
        start = yield
        reqs, costs, sizes, on_rails, repeat, track, gather = self._prepared(op, s)
        if gather:
            start = yield from self._gather(it, s, op, start)
        totals = it.totals[s]
        record = it.events is not None
        peer, posted = (s + op.offset if isinstance(op, SendOp) else None), None
        if on_rails and self.fabric.circuits:
            leases = self.policy.leases
            provisioned, partial = self.policy.mode is Mode.PROVISIONED, self.policy.partial
            rtt, command = self.fabric.rtt, self.fabric.command
            if peer is not None:  # the k-th send of a channel meets its receiver's k-th receive
                k = it.sends.get((s, peer), 0)
                it.sends[(s, peer)] = k + 1
                if any(self._check_in(s, r) or self._check_in(peer, r, receiver=True) for r in reqs):
                    # the pair is one group: the controller grants it once both ranks checked in (the runtime's
                    # barrier), the receiver when it reaches its receive
                    if k >= len(it.posted.get((s, peer), ())):
                        yield "post", (s, peer, k)
                    posted = it.posted[(s, peer)][k]
        elif peer is not None:  # no check-in: the count of sends is all a channel needs
            it.sends[(s, peer)] = it.sends.get((s, peer), 0) + 1
        planned, now = [], start
        for _ in range(repeat):
            for req, cost, ncircuits in zip(reqs, costs, sizes, strict=True):
                ready = now
                if ncircuits:
                    mine = self._check_in(s, req)
                    theirs = peer is not None and self._check_in(peer, req, receiver=True)
                    if mine or theirs:
                        ask = min(self.prior[s], now) if provisioned else now  # when the controller learns the phase
                        target = self._pair(req) if peer is not None and leases else req
                        mark = len(self.rails.reconfigs)
                        if partial:  # the ports that change say which circuits were missing
                            lit = self.rails.ensure(target, ask + rtt / 2 + command)
                            missing = self.rails.missing
                        else:
                            known = self.rails.state.known_present(*target.circuits)  # all present: no gather
                            missing = _NO_CIRCUITS if known else self._missing(target)
                            lit = self.rails.ensure(target, ask + rtt / 2 + command)
                        if len(self.rails.reconfigs) > mark:
                            self._count_groups(it, missing, self.rails.reconfigs[mark:])
                        # the controller grants at once a rank asking after the switch ended, else at its end plus
                        # its own lag (``fabric.switch_grant``); the grant reaches the rank half a round trip later
                        after = self.fabric.switch_grant if lit > now + rtt / 2 else 0.0
                        own = max(now + rtt if mine else now, lit + rtt / 2 + after if lit > now else 0.0)
                        if own - now < 1e-12 * max(1.0, now):  # float noise from a zero round trip
                            own = now
                        ready = max(own, posted + rtt if posted is not None and posted + rtt > own else own)
                        for stage in [s] * mine + [peer] * theirs:
                            self._asks(it.totals[stage], req, provisioned)
                            if leases:
                                self.rails.take_lease(stage, req)
                        if not op.asynchronous:
                            control = min(rtt, own - now)
                            if record:
                                it.event(track, f"check-in {op.label}", "control", now, control)
                                it.event(track, f"circuits for {op.label}", "reconfiguration", now + control,
                                         own - now - control)
                                it.event(track, f"{op.label}: receiver's check-in", "bubble", own, ready - own)
                            totals.control += control
                            totals.reconfiguration += own - now - control
                            totals.peer_wait += ready - own
                    self.rails.occupy(req, ready + cost.seconds)  # no sooner than alone; the end is known when it comes
                planned.append((req, cost, ready, ncircuits))
                now = ready + cost.seconds
        if on_rails:  # what a provisioned controller learns next (updated when the op really ends)
            self.prior[s] = max(self.prior[s], now)
        now = start
        for req, cost, ready, ncircuits in planned:
            if ready > now:
                now = yield "at", ready
            end = yield "flow", cost
            if ncircuits:
                self.rails.occupy(req, end)
            if record:
                it.event(track, op.label, op.dim.value, now, end - now)
            now = end
        if op.asynchronous:
            it.async_end = max(it.async_end, now)
        else:
            totals.communication += now - issued
            it.push(now, s)
        if peer is not None:
            self._deliver(it, (s, peer), now)
        if on_rails:
            self.prior[s] = max(self.prior[s], now)

    def _prepared(self, op: CommOp, s: int) -> tuple:
        """What op ``op`` at stage ``s`` is, worked out once per simulation (an iteration runs the same few hundred
        ops tens of thousands of times): its parts' requirements, costs alone and circuit counts, whether it uses
        the rails,
        how many times its parts run (``count`` back-to-back collectives each check in under Opus's per-op
        rule), its trace track, and whether it gathers the pipeline's stages first."""
        key = (id(op), s)
        found = self._ops.get(key)
        if found is None:
            reqs = self.planner.requirements(op, s)
            on_rails = any(r.ncircuits for r in reqs)  # ops that stay inside servers (tp) do not end a rail phase
            repeat = op.count if len(reqs) > 1 or (not self.policy.leases and on_rails) else 1
            costs = tuple(self.durations.cost(op, part, req, s, op.count if repeat == 1 else 1)
                          for part, req in enumerate(reqs))
            track = f"stage {s}" if not op.asynchronous else f"stage {s} async {'+'.join(op.group_dims)}"
            gather = isinstance(op, CollectiveOp) and Dim.PP in op.group_dims and self.layout.pp > 1
            sizes = tuple(r.ncircuits for r in reqs)
            found = self._ops[key] = (reqs, costs, sizes, on_rails, repeat, track, gather, op)  # op held: its id its
        return found[:7]

    def _compute(self, it: _Iteration, s: int, op: ComputeOp) -> Generator:
        """A compute op on the emulation host's ``fabric.host_cores`` cores, which every rank's process shares: a
        flow on one CPU link (id -1, no network link's) that the stages computing at once share max-min fairly.
        Alone, the stage's ``r`` ranks take ``max(1, r / cores)`` times ``op.seconds`` (a rank's time on a core
        of its own) and use ``min(1, r / cores)`` of the host; ``n`` stages at once take ``max(1, n r / cores)``
        times it: processor sharing of ``n r`` processes on the cores."""
        start = yield
        cost = self._cpu.get(op.seconds)
        if cost is None:
            ratio = self.layout.world / self.layout.pp / self.fabric.host_cores
            alone = op.seconds * max(1.0, ratio)
            cost = self._cpu[op.seconds] = OpCost(alone, _CPU, np.array([alone * min(1.0, ratio)]), bandwidth_s=alone)
        end = yield "flow", cost
        it.event(f"stage {s}", op.label, "compute", start, end - start)
        it.totals[s].compute += end - start
        it.push(end, s)

    def _missing(self, req: Requirement) -> tuple:
        """The circuits of ``req`` not configured now: (rail, tx, rx) arrays."""
        rail, tx, rx = req.circuits
        keep = ~self.rails.state.present(rail, tx, rx) if len(rail) else np.zeros(0, bool)
        return rail[keep], tx[keep], rx[keep]

    def _count_groups(self, it: _Iteration, missing: tuple, reconfigs: list) -> None:
        """A stage's switch on a rail changes the circuits of several of the runtime's groups at once (a pipeline
        pair per rank on the rail, a DP ring, ...), and the controller switches and counts each group on its own:
        count one per group, a group being a connected set of the missing circuits' servers (a pair, a ring).
        The sets per rail are computed once per distinct set of missing circuits (a few dozen recur in an
        iteration of thousands of switches)."""
        rail, tx, rx = missing
        key = (rail.dtype.str, tx.dtype.str, rail.tobytes(), tx.tobytes(), rx.tobytes())
        sets = self._sets.get(key)
        if sets is None:
            sets = self._sets[key] = _components_per_rail(rail, tx, rx, self.layout.gpus_per_server).tolist()
        for r in {int(rec[0]) for rec in reconfigs}:
            it.group_switches[r] = it.group_switches.get(r, 0) + max(1, sets[r])

    def _pair(self, req: Requirement) -> Requirement:
        """A send's circuits and the reverse ones, where its phase is one configuration holding both: the runtime
        leases a stage pair's group (``pp:a<->b``) whole, both directions lit at its first acquire."""
        if req not in self._pairs:
            rail, tx, rx = req.circuits
            both = union(self.layout, req.circuits, (rail, rx, tx))
            whole = self.plan is not None and self.plan.serves(req.phase, both)
            self._pairs[req] = Requirement(req.phase, req.steps, both) if whole else req
        return self._pairs[req]

    def _asks(self, totals: _StageTotals, req: Requirement, provisioned: bool) -> None:
        """A rank checks in for ``req``: a round trip, and the requests the runtime sends for it (the acquire; the
        release after the op without leases; provisioned, the prepare that announced a new configuration)."""
        totals.round_trips += 1
        totals.requests += 1 + (not self.policy.leases) + (provisioned and totals.phase != req.phase)
        totals.phase = req.phase

    def _gather(self, it: _Iteration, s: int, op: CollectiveOp, now: float) -> Generator:
        """A collective whose group spans the pipeline's stages starts when every stage has reached it (their
        k-th op of that label and group, matched as NCCL matches a communicator's calls): the stages that come
        first wait, and all start when the last arrives. Yields until then; returns the start."""
        count = (s, op.label, op.group_dims)
        k = it.issued.get(count, 0)
        it.issued[count] = k + 1
        key = (op.label, op.group_dims, k)
        if len(it.gathering.setdefault(key, [])) + 1 < self.layout.pp:
            return (yield "gather", key)  # resumed by the last stage to arrive, at its time
        for proc in it.gathering.pop(key):
            it.push(now, proc)
        return now

    def result(self, it: _Iteration) -> IterationResult:
        total = it.end - it.start
        # communication counted above includes the control and reconfiguration waits; separate them
        stages = []
        for acc in it.totals:
            waits = acc.control + acc.reconfiguration
            comm = acc.communication - waits - acc.peer_wait
            busy = acc.compute + comm + waits
            stages.append({"compute_s": acc.compute, "communication_s": comm,
                           "reconfiguration_s": acc.reconfiguration, "control_s": acc.control,
                           "bubble_s": max(0.0, total - busy), "round_trips": acc.round_trips,
                           "requests": acc.requests + self.rails.acks[len(stages)] - it.acks_mark[len(stages)]})
        per_rail = [0] * self.layout.gpus_per_server
        for rail, start, end, _, phase in self.rails.reconfigs[it.reconfig_mark:]:
            per_rail[rail] += 1
            it.event(f"OCS rail {rail}", f"reconfigure to {phase}", "reconfiguration", start, end - start)
        mean = {k: float(np.mean([st[k] for st in stages])) for k in stages[0]}
        label = "electrical" if not self.fabric.circuits else self.policy.label
        events = list(it.events or [])
        return IterationResult(self.fabric.kind.value, label, total, mean["compute_s"], mean["communication_s"],
                               mean["reconfiguration_s"], mean["bubble_s"],
                               per_rail if self.fabric.circuits else [0] * self.layout.gpus_per_server,
                               events, stages, control_s=mean["control_s"],
                               controller_round_trips_per_iteration=mean["round_trips"],
                               controller_requests_per_iteration=mean["requests"], plan=self.plan,
                               group_reconfigurations_per_rail=[it.group_switches.get(r, 0) if self.fabric.circuits
                                                                else 0 for r in range(len(per_rail))],
                               same_without_drain=self.fabric.drain and not self.rails.drain_matters,
                               same_with_skip_present=self.plan is not None and not self.rails.skip_matters
                               and not (self.policy.partial or self.policy.skip_present))
