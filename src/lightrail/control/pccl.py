"""Reconfiguration-aware collectives: per step, keep the circuits or switch to the step's own.

A reconfigurable fabric gives each of n GPUs ``ports`` optical ports into a circuit switch (or a
photonic mesh), optionally on top of a static base topology (ring, 2D torus). A collective's step
costs what the engine says on the current state graph: congestion and hop dilation when its pairs
ride circuits made for something else, the contention-free time on circuits made for it. Switching
costs the reconfiguration delay (PCCL, arXiv 2509.15450; short-circuiting rings, arXiv 2510.03491).

The choice space, per step i: stay on the current circuits, or reconfigure to the union of the
patterns of steps i..j (batching) when every GPU needs at most ``ports`` circuits out and in. The
exact plan is a dynamic programme over (step, current configuration), evaluated for many message
sizes and delays at once; ``plan_brute_force`` enumerates every choice sequence and is what the
tests compare it with. ``plan_threshold`` is the short-circuiting paper's greedy rule.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from lightrail.collectives.compressed import CompressedSchedule, compressed_form, step_traffic
from lightrail.collectives.schedule import Schedule
from lightrail.errors import InfeasibleError
from lightrail.fabric.params import ReconfigurableFabric
from lightrail.timing import Engine, StepModel

__all__ = ["Plan", "Planner", "Choice", "choose", "edge_colouring"]

@dataclass
class Plan:
    """Which configuration every step runs on, and what it costs (one size and delay)."""

    schedule: str
    size: float
    ocs_delay: float
    total_s: float
    step_config: list[int]
    reconfigure: list[bool]
    step_s: list[float]
    configurations: list[np.ndarray] = field(repr=False)

    @property
    def reconfigurations(self) -> int:
        return int(sum(self.reconfigure))

    def to_dict(self) -> dict:
        return {"schedule": self.schedule, "size_bytes": self.size, "reconfig_delay_s": self.ocs_delay,
                "time_s": self.total_s, "reconfigurations": self.reconfigurations,
                "plan": [{"step": i, "reconfigure": r, "configuration": c, "time_s": t}
                         for i, (r, c, t) in enumerate(zip(self.reconfigure, self.step_config, self.step_s,
                                                           strict=True))]}


class Planner:
    """Reconfiguration plans for one schedule on one fabric; step costs are computed once.

    Step costs are linear in the bytes per chunk, so one planner answers many message sizes and
    delays (``totals``) with the same engine work. ``schedule`` may be explicit or compressed
    (``collectives.compressed``): the plans are the same.
    """

    def __init__(self, schedule: Schedule | CompressedSchedule, fabric: ReconfigurableFabric, *,
                 max_batch: int | None = None, max_states: int = 16):
        if schedule.nranks != fabric.n:
            raise InfeasibleError(f"schedule has {schedule.nranks} ranks, fabric {fabric.n}", field="ranks")
        self.schedule, self.fabric = schedule, fabric
        # per step: sorted unique pair codes, chunks per pair, and an id shared by steps with the same traffic
        # (a compressed schedule's pattern is turned into pairs once, for every step that applies it)
        self.patterns, self.weights, self.pattern_id = step_traffic(schedule)
        self.configs: list[np.ndarray] = [fabric.initial_codes()]
        self._config_id: dict[bytes, int] = {self.configs[0].tobytes(): 0}
        self._engines: dict[int, Engine] = {}
        self._models: dict[tuple[int, int], StepModel] = {}
        limit = max_batch or fabric.ports * 4
        self.candidates: list[list[int]] = [self._batches(i, limit) for i in range(len(self.patterns))]
        # configurations that can be current when step i starts: the initial one and those installed
        # before. Past ``max_states`` the oldest installed ones are dropped (then the plan is optimal
        # within that window, not over the whole space: ``exact`` says which).
        self.current: list[list[int]] = [[0]]
        self.exact = True
        for i in range(len(self.patterns)):
            # newest first: the step's own candidates, then what was current, then the initial one
            keep = list(dict.fromkeys([*self.candidates[i], *reversed(self.current[-1])]))
            if len(keep) > max(max_states, len(self.candidates[i]) + 1):
                self.exact = False
                keep = keep[:max(max_states, len(self.candidates[i]) + 1) - 1]
                keep.append(0) if 0 not in keep else None
            self.current.append(keep)

    # -- configurations ---------------------------------------------------------------------------
    def _config(self, codes: np.ndarray) -> int:
        key = codes.tobytes()
        if key not in self._config_id:
            self._config_id[key] = len(self.configs)
            self.configs.append(codes)
        return self._config_id[key]

    def _batches(self, i: int, limit: int) -> list[int]:
        """Configurations serving steps i..j (j >= i) that fit the ports, one per distinct union."""
        out: list[int] = []
        union = np.zeros(0, np.int64)
        for j in range(i, len(self.patterns)):
            if j > i and self.pattern_id[j] == self.pattern_id[j - 1]:
                continue  # same traffic as the step before: the union cannot change
            merged = np.union1d(union, self.patterns[j])
            if not self.fabric.fits(merged) or (len(out) >= limit and len(merged) > len(union)):
                break
            if len(merged) > len(union) or not out:
                union = merged
                cid = self._config(union)
                if cid not in out:
                    out.append(cid)
        return out

    # -- costs -------------------------------------------------------------------------------------
    def model(self, step: int, config: int) -> StepModel:
        key = (self.pattern_id[step], config)
        if key not in self._models:
            engine = self._engines.get(config)
            if engine is None:
                engine = self._engines[config] = Engine(self.fabric.topology(self.configs[config]),
                                                        alpha=self.fabric.alpha)
            n = self.fabric.n
            codes = self.patterns[step]
            try:
                self._models[key] = engine.step_model(codes // n, codes % n, self.weights[step])
            except InfeasibleError:  # some pair has no path on these circuits
                self._models[key] = StepModel(np.array([np.inf]), np.zeros(1))
        return self._models[key]

    def cost(self, step: int, config: int, chunk_bytes: np.ndarray) -> np.ndarray:
        """Seconds of ``step`` on ``config`` for each chunk size (vector)."""
        m = self.model(step, config)
        if not len(m.latency):
            return np.zeros_like(chunk_bytes)
        return self.fabric.alpha + np.max(m.latency[:, None] + m.per_byte[:, None] * chunk_bytes[None, :], axis=0)

    # -- plans -------------------------------------------------------------------------------------
    def totals(self, sizes, delays) -> tuple[np.ndarray, np.ndarray]:
        """Optimal total time and reconfiguration count, arrays of shape (len(delays), len(sizes))."""
        value, count, _ = self._dynamic_programme(np.asarray(sizes, float), np.asarray(delays, float), track=False)
        return value, count

    def plan(self, size: float, delay: float | None = None) -> Plan:
        """The optimal plan at one size and delay (the fabric's delay by default)."""
        delay = self.fabric.ocs_delay if delay is None else delay
        _, _, choice = self._dynamic_programme(np.array([float(size)]), np.array([float(delay)]), track=True)
        return self._replay(size, delay, choice)

    def _dynamic_programme(self, sizes: np.ndarray, delays: np.ndarray, *, track: bool):
        cb = sizes / self.schedule.collective.chunks_per_buffer
        steps = len(self.patterns)
        current = self.current
        shape = (len(delays), len(sizes))
        value = {c: np.zeros(shape) for c in current[steps]}
        count = {c: np.zeros(shape) for c in current[steps]}
        choice: list[dict] = [dict() for _ in range(steps)]
        for i in range(steps - 1, -1, -1):
            new_value, new_count = {}, {}
            stay_cost = {c: self.cost(i, c, cb)[None, :] for c in dict.fromkeys([*current[i], *self.candidates[i]])}
            switch = []
            for c in self.candidates[i]:
                switch.append((c, delays[:, None] + stay_cost[c] + value[c], count[c] + 1))
            for c in current[i]:
                if c in value:
                    best_v, best_n = stay_cost[c] + value[c], count[c].copy()
                else:  # dropped from the window at the next step: staying is not an option
                    best_v, best_n = np.full(shape, np.inf), np.zeros(shape)
                best_c = np.full(shape, -1)  # -1: stay
                for target, v, k in switch:
                    if target == c:
                        continue
                    better = v < best_v
                    best_v = np.where(better, v, best_v)
                    best_n = np.where(better, k, best_n)
                    best_c = np.where(better, target, best_c)
                new_value[c], new_count[c] = best_v, best_n
                if track:
                    choice[i][c] = int(best_c[0, 0])
            value, count = new_value, new_count
        return value[0], count[0], choice

    def _replay(self, size: float, delay: float, choice: list[dict]) -> Plan:
        cb = np.array([size / self.schedule.collective.chunks_per_buffer])
        config, total = 0, 0.0
        configs, flags, times = [], [], []
        for i in range(len(self.patterns)):
            target = choice[i][config]
            switched = target >= 0
            if switched:
                config = target
                total += delay
            t = float(self.cost(i, config, cb)[0])
            total += t
            configs.append(config)
            flags.append(switched)
            times.append(t)
        return Plan(self.schedule.name, size, delay, total, configs, flags, times, self.configs)

    def plan_static(self, size: float) -> Plan:
        """Never reconfigure: every step on the initial circuits (and base)."""
        cb = np.array([size / self.schedule.collective.chunks_per_buffer])
        times = [float(self.cost(i, 0, cb)[0]) for i in range(len(self.patterns))]
        steps = len(times)
        return Plan(self.schedule.name, size, self.fabric.ocs_delay, sum(times), [0] * steps, [False] * steps,
                    times, self.configs)

    def plan_threshold(self, size: float, delay: float | None = None) -> Plan:
        """Short-circuiting rings' greedy rule: switch to a step's own circuits when the congestion
        and dilation it would pay on the current ones exceed the delay."""
        delay = self.fabric.ocs_delay if delay is None else delay
        cb = np.array([size / self.schedule.collective.chunks_per_buffer])
        config, total = 0, 0.0
        configs, flags, times = [], [], []
        for i in range(len(self.patterns)):
            own = self.candidates[i][0] if self.candidates[i] else config
            stay = float(self.cost(i, config, cb)[0])
            switch = float(self.cost(i, own, cb)[0])
            switched = own != config and switch + delay < stay
            if switched:
                config, total = own, total + delay
            t = switch if switched else stay
            total += t
            configs.append(config)
            flags.append(switched)
            times.append(t)
        return Plan(self.schedule.name, size, delay, total, configs, flags, times, self.configs)

    def plan_brute_force(self, size: float, delay: float | None = None) -> float:
        """The best total over every choice sequence (exponential: small schedules only)."""
        delay = self.fabric.ocs_delay if delay is None else delay
        cb = np.array([size / self.schedule.collective.chunks_per_buffer])
        options = [[None, *self.candidates[i]] for i in range(len(self.patterns))]
        cost: dict[tuple[int, int], float] = {}
        best = np.inf
        for combo in itertools.product(*options):
            config, total = 0, 0.0
            for i, target in enumerate(combo):
                if target is not None and target != config:
                    config, total = target, total + delay
                if (i, config) not in cost:
                    cost[i, config] = float(self.cost(i, config, cb)[0])
                total += cost[i, config]
            best = min(best, total)
        return best


def edge_colouring(codes: np.ndarray, n: int, colours: int) -> np.ndarray:
    """Split circuits into ``colours`` partial permutations (König: max degree <= colours suffices).

    Returns ``perm[colour, src] = dst`` (-1 where unused); raises if the degree is too high.
    """
    src, dst = codes // n, codes % n
    if len(codes) and (np.bincount(src).max() > colours or np.bincount(dst).max() > colours):
        raise InfeasibleError(f"a GPU needs more than {colours} circuits", field="ports",
                              fix="use more ports or fewer circuits per configuration")
    out = np.full((colours, n), -1, np.int64)  # out[c, u] = v
    into = np.full((colours, n), -1, np.int64)  # into[c, v] = u
    for u, v in zip(src.tolist(), dst.tolist(), strict=True):
        a = next(c for c in range(colours) if out[c, u] < 0)  # free at u
        b = next(c for c in range(colours) if into[c, v] < 0)  # free at v
        if a != b and into[a, v] >= 0:
            # flip the a/b alternating path that starts at v's a-edge, freeing a at v
            path, x, on_into, colour = [], v, True, a
            while True:
                y = into[colour, x] if on_into else out[colour, x]
                if y < 0:
                    break
                path.append((colour, (y, x) if on_into else (x, y)))
                x, on_into, colour = y, not on_into, b if colour == a else a
            for c, (p, q) in path:
                out[c, p] = -1
                into[c, q] = -1
            for c, (p, q) in path:
                flipped = b if c == a else a
                out[flipped, p] = q
                into[flipped, q] = p
        out[a, u] = v
        into[a, v] = u
    return out


@dataclass(frozen=True)
class Choice:
    """The best (algorithm, plan) for one collective on one fabric, with the runner-up for context."""

    op: str
    n: int
    size: float
    algorithm: str
    plan: Plan
    static_s: float
    ranking: list[tuple[str, float, int]]  # (algorithm, time, reconfigurations), best first

    def explain(self) -> str:
        best, *rest = self.ranking
        why = (f"{self.algorithm} with {best[2]} reconfiguration(s) takes {best[1] * 1e6:.1f} us"
               f" (on its initial circuits alone: {self.static_s * 1e6:.1f} us)")
        if rest:
            other = rest[0]
            why += f"; next best {other[0]} at {other[1] * 1e6:.1f} us ({other[1] / best[1]:.2f}x)"
        return why


def choose(op: str, size: float, fabric: ReconfigurableFabric, *, algorithms=None) -> Choice:
    """Pick the best (algorithm, plan) among the registered algorithms of ``op``, like a collective
    library's tuner would, by planning each one exactly on the fabric."""
    from lightrail.collectives import algorithms as registered
    from lightrail.collectives import get

    candidates = [get(op, a) for a in algorithms] if algorithms else registered(op)
    results = []
    for algo in candidates:
        if not algo.supports(fabric.n):
            continue
        compressed = compressed_form(algo.kind, algo.name, fabric.n)
        planner = Planner(algo(fabric.n) if compressed is None else compressed, fabric)
        plan = planner.plan(size)
        results.append((plan.total_s, algo.name, plan, planner.plan_static(size).total_s))
    if not results:
        raise InfeasibleError(f"no {op} algorithm supports {fabric.n} ranks", field="ranks")
    results.sort(key=lambda r: r[0])
    total, name, plan, static = results[0]
    ranking = [(r[1], r[0], r[2].reconfigurations) for r in results]
    return Choice(str(op), fabric.n, float(size), name, plan, static, ranking)
