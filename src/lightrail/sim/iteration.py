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
  port another stage leases, once the revoke is acknowledged), after the controller's command
  latency, and the changed ports stay dark for the switch's delay. Then it runs for the time the
  engine gives on the state graph of its circuits (NVLink plus those circuits; electrical rails
  use the rail switches instead);
- a receive waits for its matching send (blocking sends; FIFO per stage pair);
- ops whose circuits are lit run at once, each timed on its own (their communicators share the
  links; contention between different phases' ops is not charged, the same on every fabric).

Control-plane timing (``fabric.params.RailFabric.check_in_rtt``, ``command_latency``): a check-in is a round trip;
a request or release reaches the controller after half of it; the controller decides (on demand:
when the first op of a phase checks in; provisioned: when the previous phase's last op released,
not earlier) and the switch starts ``command_latency`` later.

The reported iteration is the second of two run back to back, so the rails start in the state the
previous iteration left them in (steady state), not empty.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from math import prod

import numpy as np

from lightrail.control.opus import LIGHTRAIL, OpusParams, OpusPlanner, Requirement
from lightrail.control.plan import Plan
from lightrail.fabric.builders import photonic_rails, rails
from lightrail.fabric.circuits import CircuitState
from lightrail.fabric.params import RailFabric
from lightrail.timing import Engine
from lightrail.workload.program import Collective, Compute, Program, Recv, Send

__all__ = ["RailFabric", "TraceEvent", "IterationResult", "OpDurations", "simulate_iteration"]

@dataclass(frozen=True)
class TraceEvent:
    track: str
    name: str
    category: str
    start: float
    duration: float


@dataclass
class IterationResult:
    """Time and breakdown of a steady-state iteration; per-stage and per-rail detail."""

    fabric: str
    policy: str
    iteration_time_s: float
    compute_s: float
    communication_s: float
    reconfiguration_s: float
    bubble_s: float
    reconfigurations_per_rail: list[int]
    events: list[TraceEvent] = field(repr=False, default_factory=list)
    stages: list[dict] = field(repr=False, default_factory=list)
    control_s: float = 0.0
    """Time a stage waits for controller round trips (check-ins), mean over stages."""
    controller_round_trips_per_iteration: float = 0.0
    """Check-ins per rank per iteration (every rank of a stage checks in for its groups), mean over ranks."""
    plan: Plan | None = field(repr=False, default=None)

    @property
    def reconfigurations_per_iteration(self) -> float:
        """Mean reconfigurations of one rail switch per iteration."""
        return float(np.mean(self.reconfigurations_per_rail)) if self.reconfigurations_per_rail else 0.0

    def summary(self) -> dict:
        return {
            "fabric": self.fabric, "policy": self.policy, "iteration_time_s": self.iteration_time_s,
            "compute_s": self.compute_s, "communication_s": self.communication_s,
            "reconfiguration_s": self.reconfiguration_s, "control_s": self.control_s, "bubble_s": self.bubble_s,
            "reconfigurations_per_iteration": self.reconfigurations_per_iteration,
            "reconfigurations_per_rail": self.reconfigurations_per_rail,
            "controller_round_trips_per_iteration": self.controller_round_trips_per_iteration,
        }


class OpDurations:
    """Seconds each op part takes on the fabric, from the engine; cached by op shape.

    Independent of the switch's delay and the controller's latency, so runs that differ only in those
    (a delay sweep, the overhead breakdown) can share one."""

    def __init__(self, program: Program, fabric: RailFabric):
        self.layout = program.job.layout
        self.fabric = fabric
        self._cache: dict = {}

    def seconds(self, op, part: int, req: Requirement) -> float:
        shape = (type(op).__name__, getattr(op, "group_dims", op.dim), getattr(op, "kind", None),
                 getattr(op, "offset", 0), op.nbytes, part)
        if shape not in self._cache:
            self._cache[shape] = self._time(op, req)
        return self._cache[shape]

    def _time(self, op, req: Requirement) -> float:
        lay, fab = self.layout, self.fabric
        g = lay.gpus_per_server
        ranks = np.concatenate([np.concatenate(pair) for pair in req.steps]) if req.steps else np.zeros(0, int)
        if not len(ranks):
            return 0.0
        servers = np.unique(lay.server(ranks))
        local = (lambda r: np.searchsorted(servers, lay.server(r)) * g + lay.rail(r))  # noqa: E731
        if fab.circuits:
            rail, tx, rx = req.circuits
            topo = photonic_rails(len(servers), (rail, np.searchsorted(servers, tx), np.searchsorted(servers, rx)),
                                  gpus_per_server=g, nic_bandwidth=fab.nic_bandwidth,
                                  nvlink_bandwidth=fab.nvlink_bandwidth, latency=fab.latency)
        else:
            topo = rails(len(servers) * g, gpus_per_server=g, nic_bandwidth=fab.nic_bandwidth,
                         nvlink_bandwidth=fab.nvlink_bandwidth, latency=fab.latency, routing=fab.routing)
        engine = Engine(topo, alpha=fab.alpha)
        per_transfer = op.nbytes if isinstance(op, Send) else op.nbytes / self._group_size(op)
        return sum(engine.transfer_time(local(src), local(dst), per_transfer) for src, dst in req.steps)

    def _group_size(self, op) -> int:
        return prod(self.layout.degree(d) for d in op.group_dims)


class _Rails:
    """The rail switches executing a Plan: circuit state (:class:`CircuitState`, one device per rail,
    one port per server), the configuration each rail holds, and the leases stages hold."""

    def __init__(self, plan: Plan | None, fabric: RailFabric, params: OpusParams, layout):
        shape = (layout.gpus_per_server, layout.servers)
        self.plan, self.fabric, self.params = plan, fabric, params
        self.state = CircuitState(*shape, fabric.delay)
        self.holds: list[str | None] = [None] * shape[0]  # configuration each rail holds (whole switch)
        self.tx_lease, self.rx_lease = np.full(shape, -1, np.int64), np.full(shape, -1, np.int64)
        self.leased: dict[int, str] = {}  # stage -> configuration name it holds a lease on
        self.reconfigs: list[tuple[int, float, float, int, str]] = []  # rail, start, end, ports, configuration

    # -- leases ----------------------------------------------------------------------------------------
    def has_lease(self, stage: int, req: Requirement) -> bool:
        rail, tx, rx = req.circuits
        return self.leased.get(stage) == req.phase and bool(np.all(self.state.present(rail, tx, rx)))

    def take_lease(self, stage: int, req: Requirement) -> None:
        self._drop(stage)
        rail, tx, rx = req.circuits
        self.tx_lease[rail, tx] = stage
        self.rx_lease[rail, rx] = stage
        self.leased[stage] = req.phase

    def _drop(self, stage: int) -> None:
        self.leased.pop(stage, None)
        self.tx_lease[self.tx_lease == stage] = -1
        self.rx_lease[self.rx_lease == stage] = -1

    def _revoke(self, tx_ports, rx_ports) -> None:
        for stage in set(self.tx_lease[tx_ports].tolist()) | set(self.rx_lease[rx_ports].tolist()):
            if stage >= 0:
                self._drop(stage)

    def _free(self, tx_ports, rx_ports, decision: float) -> np.ndarray:
        """Per rail, when the controller may switch these (rail, port) arrays: their last traffic's release
        has arrived, and a lease on them was revoked and acknowledged (a group's lease has holders besides
        the asking rank, even when its own stage leased it: the revoke is a round trip)."""
        rails = len(self.holds)
        if not self.fabric.drain:
            return np.zeros(rails)
        half = self.fabric.rtt / 2
        busy, held = np.zeros(rails), np.zeros(rails, bool)
        for (rail, port), when, lease in ((tx_ports, self.state.tx_busy, self.tx_lease),
                                          (rx_ports, self.state.rx_busy, self.rx_lease)):
            np.maximum.at(busy, rail, when[rail, port])
            np.logical_or.at(held, rail, lease[rail, port] >= 0)
        # revoke: a holder inside an op acks when it ends
        return np.where(held, np.maximum(decision + half, busy) + half, busy + half)

    # -- switching -------------------------------------------------------------------------------------
    def ensure(self, req: Requirement, decision: float) -> float:
        """Make ``req``'s circuits present; a change starts no earlier than ``decision`` (the controller's
        decision plus its command latency) nor before its ports are free. Returns when they are lit."""
        rail, tx, rx = req.circuits
        if not len(rail) or not self.fabric.circuits:
            return 0.0
        if self.params.partial:
            self._ports(req, decision)
        else:
            self._switch(req, decision)
        return self.state.lit_at(rail, tx, rx)

    def occupy(self, req: Requirement, end: float) -> None:
        rail, tx, rx = req.circuits
        self.state.occupy(rail, tx, rx, end)

    def _switch(self, req: Requirement, decision: float) -> None:
        """The original Opus: rewrite the whole rail switch to the op's configuration (drain the rail)."""
        rail, tx, rx = req.circuits
        ports = np.arange(self.state.tx_target.shape[1])
        for r in np.unique(rail):
            sel = rail == r
            present = bool(np.all(self.state.present(r, tx[sel], rx[sel])))
            if self.holds[r] == req.phase and present or present and self.params.skip_present:
                continue
            new = self.plan.configurations[req.phase][r]
            if np.array_equal(new, self.state.tx_target[r]):  # nothing to switch on this rail
                self.holds[r] = req.phase
                continue
            whole = (np.full(len(ports), r), ports)
            start = max(decision, float(self._free(whole, whole, decision)[r]))  # drain the whole rail
            end, changed = self.state.rewrite(r, new, start)
            self._revoke(whole, whole)
            self.holds[r] = req.phase
            self.reconfigs.append((int(r), start, end, changed, req.phase))

    def _ports(self, req: Requirement, decision: float) -> None:
        """Partial reconfiguration: only ports whose circuits change go dark, each rail on its own."""
        rail, tx, rx = req.circuits
        (tx_rail, tx_port), (rx_rail, rx_port), (m_rail, _, _) = self.state.switched_ports(rail, tx, rx)
        if not len(m_rail):
            return
        start = np.maximum(decision, self._free((tx_rail, tx_port), (rx_rail, rx_port), decision))
        self.state.apply(rail, tx, rx, start)
        self._revoke((tx_rail, tx_port), (rx_rail, rx_port))
        counts = np.bincount(m_rail, minlength=len(self.holds))
        for r in np.flatnonzero(counts):
            self.reconfigs.append((int(r), float(start[r]), float(start[r]) + self.fabric.delay, int(counts[r]),
                                   req.phase))


def simulate_iteration(program: Program, fabric: RailFabric, params: OpusParams = LIGHTRAIL, *,
                       planner: OpusPlanner | None = None, durations: OpDurations | None = None) -> IterationResult:
    """Run two iterations of ``program`` on ``fabric`` and report the second (steady state).

    ``planner`` and ``durations`` may be shared by runs of the same program that differ only in the
    delay or the controller's latency (their work does not depend on those)."""
    planner = planner or OpusPlanner(program.job.layout, params)
    sim = _Simulation(program, fabric, planner, durations)
    end_first = sim.run(0.0, record=False)
    sim.run(end_first, record=True)
    return sim.result(end_first)


class _Simulation:
    def __init__(self, program: Program, fabric: RailFabric, planner: OpusPlanner, durations: OpDurations | None):
        self.program, self.fabric, self.planner = program, fabric, planner
        self.plan = planner.plan(program) if fabric.circuits else None
        self.durations = durations or OpDurations(program, fabric)
        self.rails = _Rails(self.plan, fabric, planner.params, program.job.layout)
        self.layout = program.job.layout

    def _check_in(self, s: int, req: Requirement) -> bool:
        """Does this op (part) ask the controller first? Opus: every op on the rails; leases: only when
        the stage holds no lease on its configuration."""
        if not self.fabric.circuits or not req.ncircuits:
            return False
        return not (self.planner.params.leases and self.rails.has_lease(s, req))

    def run(self, t0: float, *, record: bool) -> float:
        pp = self.layout.pp
        queue: list = []
        seq = 0

        def push(time, stage):
            nonlocal seq
            heapq.heappush(queue, (time, seq, stage))
            seq += 1

        index = [0] * pp
        channel: dict[tuple[int, int], list[float]] = {}
        waiting: dict[tuple[int, int], int] = {}
        finish = [t0] * pp
        async_end = t0
        # bubble is derived in result(): the iteration minus what the stage was busy with
        self.acc = [dict(compute=0.0, communication=0.0, reconfiguration=0.0, control=0.0, round_trips=0)
                    for _ in range(pp)]
        self.events: list = [] if record else None
        reconfig_mark = len(self.rails.reconfigs)
        for s in range(pp):
            push(t0, s)
        provisioned = self.planner.params.mode == "provisioned"
        leases = self.planner.params.leases
        rtt, command = self.fabric.rtt, self.fabric.command
        prior = list(self.prior) if hasattr(self, "prior") else [t0] * pp  # end of each actor's last rail op
        while queue:
            t, _, s = heapq.heappop(queue)
            ops = self.program.stages[s]
            if index[s] >= len(ops):
                finish[s] = t
                continue
            op = ops[index[s]]
            track = f"stage {s}"
            if isinstance(op, Compute):
                self._event(track, op.label, "compute", t, op.seconds)
                self.acc[s]["compute"] += op.seconds
                index[s] += 1
                push(t + op.seconds, s)
                continue
            if isinstance(op, Recv):
                key = (s + op.offset, s)
                if channel.get(key):
                    ready = channel[key].pop(0)
                    if ready > t:
                        self._event(track, f"wait {op.label}", "bubble", t, ready - t)
                    index[s] += 1
                    push(max(t, ready), s)
                else:
                    waiting[key] = s  # woken by the matching send
                continue
            # a communication op (collective or send), possibly in several circuit parts; `count`
            # back-to-back collectives each check in under Opus's per-op rule
            reqs = self.planner.requirements(op, s)
            asynchronous = getattr(op, "asynchronous", False)
            count = op.count if isinstance(op, Collective) else 1
            repeat = count if len(reqs) > 1 or (not leases and any(r.ncircuits for r in reqs)) else 1
            now = t
            for _ in range(repeat):
                for part, req in enumerate(reqs):
                    seconds = self.durations.seconds(op, part, req)
                    if repeat == 1 and isinstance(op, Collective):
                        seconds *= count
                    ready = now
                    if self._check_in(s, req):
                        self.acc[s]["round_trips"] += 1
                        ask = min(prior[s], now) if provisioned else now  # when the controller learns the phase
                        lit = self.rails.ensure(req, ask + rtt / 2 + command)
                        ready = max(now + rtt, lit + rtt / 2 if lit > now else 0.0)
                        if ready - now < 1e-12 * max(1.0, now):  # float noise from a zero round trip
                            ready = now
                        if leases:
                            self.rails.take_lease(s, req)
                        if not asynchronous:
                            control = min(rtt, ready - now)
                            self._event(track, f"check-in {op.label}", "control", now, control)
                            self._event(track, f"circuits for {op.label}", "reconfiguration", now + control,
                                        ready - now - control)
                            self.acc[s]["control"] += control
                            self.acc[s]["reconfiguration"] += ready - now - control
                    self.rails.occupy(req, ready + seconds)
                    self._event(track if not asynchronous else f"stage {s} async", op.label, op.dim.value, ready,
                                seconds)
                    now = ready + seconds
            if asynchronous:
                async_end = max(async_end, now)
                end = t
            else:
                self.acc[s]["communication"] += now - t  # includes the control and circuit waits, taken out later
                end = now
            if isinstance(op, Send):
                key = (s, s + op.offset)
                channel.setdefault(key, []).append(now)
                if key in waiting:
                    r = waiting.pop(key)
                    push(t, r)  # re-run its receive, which now finds the send
            index[s] += 1
            if any(req.ncircuits for req in reqs):  # ops that stay inside servers (tp) do not end a rail phase
                prior[s] = max(prior[s], now)
            push(end, s)
        end_time = max(max(finish), async_end, float(np.max(self.rails.state.tx_busy, initial=t0)))
        self.prior = prior
        if record:
            self.t0, self.t1 = t0, end_time
            self.reconfig_window = self.rails.reconfigs[reconfig_mark:]
        return end_time

    def _event(self, track, name, cat, start, dur) -> None:
        if self.events is not None and dur > 0:
            self.events.append(TraceEvent(track, name, cat, start, dur))

    def result(self, t0: float) -> IterationResult:
        total = self.t1 - self.t0
        # communication counted above includes the control and reconfiguration waits; separate them
        stages = []
        for acc in self.acc:
            waits = acc["control"] + acc["reconfiguration"]
            comm = acc["communication"] - waits
            busy = acc["compute"] + comm + waits
            stages.append({"compute_s": acc["compute"], "communication_s": comm,
                           "reconfiguration_s": acc["reconfiguration"], "control_s": acc["control"],
                           "bubble_s": max(0.0, total - busy), "round_trips": acc["round_trips"]})
        per_rail = [0] * self.layout.gpus_per_server
        for rail, start, end, _, phase in self.reconfig_window:
            per_rail[rail] += 1
            self._event(f"OCS rail {rail}", f"reconfigure to {phase}", "reconfiguration", start, end - start)
        mean = {k: float(np.mean([st[k] for st in stages])) for k in stages[0]}
        label = "electrical" if not self.fabric.circuits else self.planner.params.label
        events = list(self.events or [])
        return IterationResult(self.fabric.kind, label, total, mean["compute_s"], mean["communication_s"],
                               mean["reconfiguration_s"], mean["bubble_s"],
                               per_rail if self.fabric.circuits else [0] * self.layout.gpus_per_server,
                               events, stages, control_s=mean["control_s"],
                               controller_round_trips_per_iteration=mean["round_trips"], plan=self.plan)
