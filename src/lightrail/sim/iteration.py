"""Event-driven execution of one training iteration on electrical or photonic rails.

Actors are pipeline stages: every rank of a stage runs the same op list at the same times on a
symmetric fabric, so one actor stands for all of them and each communication op is charged for
all its concurrent groups at once (DESIGN.md: "all concurrently active groups of the same phase
together"). Ops run in global time order from a priority queue (ties broken by insertion
order), which is what lets the circuit state be decided causally:

- a collective or send first waits for its circuits. On photonic rails a missing circuit is
  installed by reconfiguring the rail switch: not while a changing port still carries traffic,
  and the changed ports stay dark for the switch's delay (the whole rail, for the original
  whole-switch policy). Then it runs for the time the engine gives on the state graph of its
  circuits (NVLink plus those circuits; electrical rails use the rail switches instead);
- a receive waits for its matching send (blocking sends; FIFO per stage pair);
- ops whose circuits are lit run at once, each timed on its own (their communicators share the
  links; contention between different phases' ops is not charged, the same on every fabric).

The reported iteration is the second of two run back to back, so the rails start in the state the
previous iteration left them in (steady state), not empty.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from math import prod
from typing import Literal

import numpy as np

from lightrail.control.opus import LIGHTRAIL, OpusParams, OpusPlanner, Requirement
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import NIC_BANDWIDTH, NVLINK_BANDWIDTH, photonic_rails, rails
from lightrail.timing import Engine
from lightrail.workload.program import Collective, Compute, Program, Recv, Send

__all__ = ["RailFabric", "TraceEvent", "IterationResult", "simulate_iteration"]

FabricKind = Literal["electrical", "photonic", "ideal"]


@dataclass(frozen=True, kw_only=True)
class RailFabric:
    """The scale-out rails: electrical packet switches, optical circuit switches, or ideal OCS."""

    kind: FabricKind = "photonic"
    reconfig_delay: float = 10e-3
    """OCS reconfiguration delay in seconds (MEMS: 10-25 ms, DESIGN.md); ignored by other kinds."""
    nic_bandwidth: float = NIC_BANDWIDTH
    nvlink_bandwidth: float = NVLINK_BANDWIDTH
    latency: float = 1e-6
    """Per hop (link) latency in seconds."""
    alpha: float = 3e-6
    """Start-up cost per collective step in seconds."""

    def __post_init__(self):
        if self.kind not in ("electrical", "photonic", "ideal"):
            raise ScenarioError(f"unknown fabric {self.kind!r}", field="fabric.kind",
                                fix="use electrical, photonic or ideal")
        if self.reconfig_delay < 0:
            raise ScenarioError(f"reconfig_delay={self.reconfig_delay}", field="fabric.reconfig_delay",
                                fix="use 0 or more seconds")

    @property
    def delay(self) -> float:
        return self.reconfig_delay if self.kind == "photonic" else 0.0

    @property
    def circuits(self) -> bool:
        return self.kind != "electrical"


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

    @property
    def reconfigurations_per_iteration(self) -> float:
        """Mean reconfigurations of one rail switch per iteration."""
        return float(np.mean(self.reconfigurations_per_rail)) if self.reconfigurations_per_rail else 0.0

    def summary(self) -> dict:
        return {
            "fabric": self.fabric, "policy": self.policy, "iteration_time_s": self.iteration_time_s,
            "compute_s": self.compute_s, "communication_s": self.communication_s,
            "reconfiguration_s": self.reconfiguration_s, "bubble_s": self.bubble_s,
            "reconfigurations_per_iteration": self.reconfigurations_per_iteration,
            "reconfigurations_per_rail": self.reconfigurations_per_rail,
        }


class _Durations:
    """Seconds each op part takes on the fabric, from the engine; cached by op shape."""

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
                         nvlink_bandwidth=fab.nvlink_bandwidth, latency=fab.latency)
        engine = Engine(topo, alpha=fab.alpha)
        per_transfer = op.nbytes if isinstance(op, Send) else op.nbytes / self._group_size(op)
        return sum(engine.transfer_time(local(src), local(dst), per_transfer) for src, dst in req.steps)

    def _group_size(self, op) -> int:
        return prod(self.layout.degree(d) for d in op.group_dims)


class _Rails:
    """Circuit state and port timing of every rail switch (ports are the rail's NICs, one per server)."""

    def __init__(self, planner: OpusPlanner, fabric: RailFabric, phase_configs: dict):
        lay = planner.layout
        shape = (lay.gpus_per_server, lay.servers)
        self.fabric, self.params = fabric, planner.params
        self.tx_target = np.full(shape, -1, np.int64)
        self.rx_source = np.full(shape, -1, np.int64)
        self.tx_busy, self.rx_busy = np.zeros(shape), np.zeros(shape)
        self.tx_dark, self.rx_dark = np.zeros(shape), np.zeros(shape)
        self.phase = [None] * lay.gpus_per_server
        self.phase_configs = phase_configs
        self.reconfigs: list[tuple[int, float, float, int, str]] = []  # rail, start, end, ports, phase

    def ensure(self, req: Requirement, t: float, earliest: float) -> float:
        """Make ``req``'s circuits present for an op that arrives at ``t``.

        A missing circuit is switched in starting no earlier than ``earliest`` (``t`` on demand; the
        end of the actor's previous phase when provisioned, since the next phase is known from the
        program) and no earlier than the last use of any port it changes. Every use of those ports
        before ``t`` is already known (events run in time order), so starting in the past is safe.
        Returns when the circuits are lit. Ops that share lit circuits run concurrently (their
        communicators share the links; each is timed on its own).
        """
        rail, tx, rx = req.circuits
        if not len(rail):
            return t
        lit = t
        if self.fabric.circuits:
            if self.params.partial:
                self._ports(rail, tx, rx, earliest, req.phase)
            else:
                self._switch(rail, tx, rx, earliest, req.phase)
            lit = max(t, self.tx_dark[rail, tx].max(), self.rx_dark[rail, rx].max())
        return lit

    def occupy(self, req: Requirement, start: float, end: float) -> None:
        rail, tx, rx = req.circuits
        np.maximum.at(self.tx_busy, (rail, tx), end)
        np.maximum.at(self.rx_busy, (rail, rx), end)

    def _switch(self, rail, tx, rx, t, phase) -> None:
        """The original Opus: rewrite the whole rail switch to the phase's configuration."""
        delay = self.fabric.delay
        for r in np.unique(rail):
            sel = rail == r
            present = bool(np.all(self.tx_target[r, tx[sel]] == rx[sel]))
            if present and (self.phase[r] == phase or self.params.skip_present):
                continue
            start = max(t, self.tx_busy[r].max(), self.rx_busy[r].max())  # drain the whole rail
            new = self.phase_configs[phase][r]
            changed = int(np.sum(new != self.tx_target[r]))
            self.tx_target[r] = new
            self.rx_source[r] = -1
            lit = np.flatnonzero(new >= 0)
            self.rx_source[r, new[lit]] = lit
            self.tx_dark[r] = self.rx_dark[r] = start + delay
            self.phase[r] = phase
            self.reconfigs.append((int(r), start, start + delay, changed, phase))

    def _ports(self, rail, tx, rx, t, phase) -> None:
        """Partial reconfiguration: only ports whose circuits change go dark, each rail on its own."""
        missing = self.tx_target[rail, tx] != rx
        if not np.any(missing):
            return
        rail, tx, rx = rail[missing], tx[missing], rx[missing]
        delay = self.fabric.delay
        old_rx = self.tx_target[rail, tx]  # our transmitters' current receivers
        old_tx = self.rx_source[rail, rx]  # transmitters currently lighting the receivers we need
        tx_rail = np.concatenate([rail, rail[old_tx >= 0]])
        tx_port = np.concatenate([tx, old_tx[old_tx >= 0]])
        rx_rail = np.concatenate([rail, rail[old_rx >= 0]])
        rx_port = np.concatenate([rx, old_rx[old_rx >= 0]])
        start = np.full(len(self.phase), float(t))  # per rail: no earlier than the last use of a changed port
        np.maximum.at(start, tx_rail, self.tx_busy[tx_rail, tx_port])
        np.maximum.at(start, rx_rail, self.rx_busy[rx_rail, rx_port])
        self.tx_dark[tx_rail, tx_port] = start[tx_rail] + delay
        self.rx_dark[rx_rail, rx_port] = start[rx_rail] + delay
        counts = np.bincount(rail, minlength=len(self.phase))
        for r in np.flatnonzero(counts):
            self.reconfigs.append((int(r), float(start[r]), float(start[r]) + delay, int(counts[r]), phase))
        self.tx_target[rail[old_tx >= 0], old_tx[old_tx >= 0]] = -1
        self.rx_source[rail[old_rx >= 0], old_rx[old_rx >= 0]] = -1
        self.tx_target[rail, tx] = rx
        self.rx_source[rail, rx] = tx


def simulate_iteration(program: Program, fabric: RailFabric, params: OpusParams = LIGHTRAIL, *,
                       planner: OpusPlanner | None = None) -> IterationResult:
    """Run two iterations of ``program`` on ``fabric`` and report the second (steady state)."""
    planner = planner or OpusPlanner(program.job.layout, params)
    sim = _Simulation(program, fabric, planner)
    end_first = sim.run(0.0, record=False)
    sim.run(end_first, record=True)
    return sim.result(end_first)


class _Simulation:
    def __init__(self, program: Program, fabric: RailFabric, planner: OpusPlanner):
        self.program, self.fabric, self.planner = program, fabric, planner
        self.durations = _Durations(program, fabric)
        configs = planner.phase_configurations(program.stages) if fabric.circuits and not planner.params.partial \
            else {}
        self.rails = _Rails(planner, fabric, configs)
        self.layout = program.job.layout

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
        self.acc = [dict(compute=0.0, communication=0.0, reconfiguration=0.0) for _ in range(pp)]
        self.events: list = [] if record else None
        reconfig_mark = len(self.rails.reconfigs)
        for s in range(pp):
            push(t0, s)
        provisioned = self.planner.params.mode == "provisioned"
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
            # a communication op (collective or send), possibly in several circuit parts
            reqs = self.planner.requirements(op, s)
            repeat = op.count if isinstance(op, Collective) and len(reqs) > 1 else 1
            now = t
            for _ in range(repeat):
                for part, req in enumerate(reqs):
                    ready = self.rails.ensure(req, now, min(prior[s], now) if provisioned else now)
                    seconds = self.durations.seconds(op, part, req)
                    if len(reqs) == 1 and isinstance(op, Collective):
                        seconds *= op.count
                    if ready > now and not getattr(op, "asynchronous", False):
                        self._event(track, f"circuits for {op.label}", "reconfiguration", now, ready - now)
                        self.acc[s]["reconfiguration"] += ready - now
                    self.rails.occupy(req, ready, ready + seconds)
                    self._event(track if not getattr(op, "asynchronous", False) else f"stage {s} async",
                                op.label, op.dim.value, ready, seconds)
                    now = ready + seconds
            if getattr(op, "asynchronous", False):
                async_end = max(async_end, now)
                end = t
            else:
                self.acc[s]["communication"] += now - t  # includes the circuit wait, taken out in result()
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
        end_time = max(max(finish), async_end, float(np.max(self.rails.tx_busy, initial=t0)))
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
        # communication counted above includes the reconfiguration wait; separate them
        stages = []
        for acc in self.acc:
            comm = acc["communication"] - acc["reconfiguration"]
            busy = acc["compute"] + comm + acc["reconfiguration"]
            stages.append({"compute_s": acc["compute"], "communication_s": comm,
                           "reconfiguration_s": acc["reconfiguration"], "bubble_s": max(0.0, total - busy)})
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
                               events, stages)
