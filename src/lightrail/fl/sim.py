"""A discrete-event simulation of check-ins and rounds under one scheduling policy (simulated seconds).

The model (Propius, arXiv 2510.19617, sec. 3-4, with the scheduler's own functions from
:mod:`lightrail.fl.policies`):

- A client is online during its sessions. While online and not bound to a job it checks in at Poisson times,
  mean gap ``checkin_interval_s`` (0: at once, whenever a job it can serve has open demand).
- At a check-in the scheduler's order of the active jobs (:func:`~lightrail.fl.policies.job_order`: arrival,
  remaining service = client-rounds still needed incl. the current round's open demand, eligible clients =
  eligibility column sums over all clients) is recomputed if job state changed since the last pass (at every
  pass for ``random``), and the client gets :func:`~lightrail.fl.policies.offer`'s job: the first in that order
  it is eligible for with open demand. ``static``: a client is eligible only for its
  :func:`~lightrail.fl.policies.static_partition` job.
- A job's round binds ``places = ceil(over_selection x demand)`` clients and ends when ``demand`` results are in,
  or fails at its timeout (its results discarded, the same round run again): :class:`~lightrail.fl.rounds.
  RoundRules`, the definition the real services apply too. A bound client computes ``work / speed`` seconds,
  then returns its result; a result for a round that has ended meanwhile is late: discarded and counted. If the
  client's session ends first, the result is lost at that moment (dropout) and its place reopens.
- A round's results come from distinct clients: a client that joined a job's current round (attempt) is not
  offered that job again until the next one (unless its result was lost). A client may serve one job in
  consecutive rounds; it is bound to at most one job at a time (checked afterwards from the binding log).
- The run ends when every job is complete, or at ``horizon_s``; bindings still in flight there are cut (neither a
  result nor a dropout), and unfinished jobs have no completion time.

Metrics, as Propius measures them (github.com/EricDinging/Propius at 73807cc): utilization is client-seconds of
work whose result a round used over online client-seconds (its client reports ``utilize_time / total_time``,
``evaluation/client/client.py`` ``Client.run``, where ``total_time`` sums the client's active periods; its
``utilize_time`` counts all executed work, kept here as ``busy_utilization``); JCT is completion - arrival of the
jobs that finished (``scripts/analyze.py`` leaves out jobs past its time cutoff); binding throughput is bindings
per second of the run.

Exact shortcut: only check-ins by clients that could be offered a job change anything, so the simulator draws the
next check-in from the superposition of the Poisson processes of those clients only (thinning: rate = their
number / ``checkin_interval_s``, resampled after every event by memorylessness) and picks one of them uniformly.
Clients are grouped into classes of equal eligibility rows; a class is "useful" when it may serve an open job.
A client whose check-in finds nothing (it already joined the current round of every open job it may serve) is
parked, out of the check-in process, until some job's demand opens again (a new round, a job arrives, a result
is lost): until then every check-in of it would find nothing too, so this changes no outcome.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.fl.policies import Policy, job_order, offer, static_partition
from lightrail.fl.population import Population
from lightrail.fl.rounds import CUT, DISCARDED, LATE, LOST, USED, RoundRules

__all__ = ["SimRun", "simulate", "double_bookings", "RESULT", "USED", "LOST", "CUT", "LATE", "DISCARDED",
           "HORIZON_CAP_S"]

RESULT = USED
"""The old name of USED (a returned result its round used)."""
HORIZON_CAP_S = 30 * 86_400.0
"""The horizon when none is given: a run stops when every job is done, and at the latest here."""


@dataclass(frozen=True, eq=False)
class SimRun:
    """One policy's run: the binding log (one entry per binding: client, job, round, start, end, outcome, see
    :mod:`lightrail.fl.rounds`) and per-job completion times (``nan``: not complete when the run ended)."""

    policy: str
    horizon_s: float
    end_s: float
    """When the run stopped: the last job's completion, or the horizon."""
    arrival_s: np.ndarray
    completion_s: np.ndarray
    log_client: np.ndarray
    log_job: np.ndarray
    log_round: np.ndarray
    log_start: np.ndarray
    log_end: np.ndarray
    log_outcome: np.ndarray
    online_s: float
    """Client-seconds online in [0, end_s)."""
    events: int
    elapsed_s: float
    idle_checkins: int = 0
    """Check-ins that found no job (the client had joined the current round of every open job it may serve)."""
    failed_rounds: int = 0
    """Rounds that timed out before ``demand`` results (each run again)."""
    rules: RoundRules = RoundRules()

    @property
    def finished(self) -> np.ndarray:
        return ~np.isnan(self.completion_s)

    @property
    def jobs_completed(self) -> int:
        return int(self.finished.sum())

    @property
    def jobs_unfinished(self) -> int:
        return len(self.completion_s) - self.jobs_completed

    @property
    def makespan_s(self) -> float:
        """The span the rates are over: ``end_s``."""
        return self.end_s

    @property
    def jct_s(self) -> np.ndarray:
        """Completion - arrival per job; ``nan`` for a job that did not finish (Propius's ``scripts/analyze.py``
        leaves such jobs out)."""
        return self.completion_s - self.arrival_s

    @property
    def mean_jct_s(self) -> float:
        """Mean JCT of the finished jobs (``nan`` if none finished)."""
        jct = self.jct_s[self.finished]
        return float(jct.mean()) if jct.size else math.nan

    def _count(self, outcome: int) -> int:
        return int((self.log_outcome == outcome).sum())

    @property
    def bindings(self) -> int:
        return len(self.log_client)

    @property
    def results(self) -> int:
        """Results their rounds used."""
        return self._count(USED)

    @property
    def lost(self) -> int:
        return self._count(LOST)

    @property
    def cut(self) -> int:
        return self._count(CUT)

    @property
    def late(self) -> int:
        return self._count(LATE)

    @property
    def discarded(self) -> int:
        return self._count(DISCARDED)

    @property
    def busy_s(self) -> float:
        """Client-seconds bound to a job (all work, whatever became of it)."""
        return float((self.log_end - self.log_start).sum())

    @property
    def used_s(self) -> float:
        """Client-seconds of work whose result a round used."""
        ok = self.log_outcome == USED
        return float((self.log_end[ok] - self.log_start[ok]).sum())

    @property
    def utilization(self) -> float:
        """Used client-seconds / online client-seconds (Propius's ``utilize_time / total_time`` counting only
        work whose result was used)."""
        return self.used_s / self.online_s if self.online_s > 0 else 0.0

    @property
    def busy_utilization(self) -> float:
        """Bound client-seconds (late, lost, discarded and cut work too) / online client-seconds: what Propius's
        evaluation client reports (``evaluation/client/client.py``: ``utilize_time`` adds every executed event)."""
        return self.busy_s / self.online_s if self.online_s > 0 else 0.0

    @property
    def bindings_per_s(self) -> float:
        return self.bindings / self.end_s if self.end_s > 0 else 0.0

    @property
    def double_bookings(self) -> int:
        return double_bookings(self.log_client, self.log_start, self.log_end)


def double_bookings(client: np.ndarray, start: np.ndarray, end: np.ndarray) -> int:
    """Bindings that start before the previous binding of the same client ended (interval overlap per client).

    >>> double_bookings(np.array([0, 0, 1]), np.array([0.0, 5.0, 1.0]), np.array([5.0, 9.0, 2.0]))
    0
    >>> double_bookings(np.array([0, 0]), np.array([0.0, 4.0]), np.array([5.0, 9.0]))
    1
    """
    if len(client) < 2:
        return 0
    order = np.lexsort((start, client))
    c, s, e = client[order], start[order], end[order]
    # the latest end so far within each client: offset by client so the running max never crosses clients
    span = float(max(np.abs(e).max(), np.abs(s).max(), 1.0)) * 4 + 1
    run = np.maximum.accumulate(e + c * span) - c * span
    same = c[1:] == c[:-1]
    return int((same & (s[1:] < run[:-1])).sum())


def _classes(elig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group clients by eligibility row: (class of each client, (K, J) rows of the classes)."""
    if elig.shape[1] == 0:
        return np.zeros(elig.shape[0], dtype=np.int64), np.zeros((1, 0), dtype=bool)
    packed = np.packbits(elig, axis=1)
    rows, inverse = np.unique(packed, axis=0, return_inverse=True)
    class_rows = np.unpackbits(rows, axis=1, count=elig.shape[1]).astype(bool)
    return inverse.reshape(-1).astype(np.int64), class_rows



def simulate(pop: Population, policy: Policy | str, *, seed: int = 0, checkin_interval_s: float = 30.0,
             horizon_s: float | None = None, rules: RoundRules | None = None,
             progress: Callable[[int], None] | None = None) -> SimRun:
    """Run ``pop`` under ``policy`` until every job completes or ``horizon_s`` (default: the population's).

    ``rules``: over-selection and round timeout (:class:`~lightrail.fl.rounds.RoundRules`, default 1.3x and no
    timeout). ``seed`` drives the check-in times and the random policy; runs of different policies with one seed
    see the same population. ``progress(jobs_completed)`` is called whenever a job completes. A job no client
    may serve (under this policy) never completes and does not keep the run going."""
    started = time.perf_counter()
    policy = Policy.parse(policy, field="policy")
    rules = RoundRules() if rules is None else rules
    horizon = float(pop.horizon_s if horizon_s is None else horizon_s)
    if not checkin_interval_s >= 0 or not math.isfinite(checkin_interval_s):
        raise ScenarioError(f"checkin_interval_s={checkin_interval_s}", field="checkin_interval_s",
                            fix="a mean gap of 0 s or more")
    if not horizon > 0:
        raise ScenarioError(f"horizon_s={horizon}", field="horizon_s", fix="a positive time")
    clients, jobs = pop.clients, pop.jobs
    n_c, n_j = len(clients), len(jobs)
    true_elig = pop.eligibility()
    eligible_count = true_elig.sum(axis=0)
    if policy is Policy.STATIC:
        owner = static_partition(true_elig)
        elig = np.zeros_like(true_elig)
        has = owner >= 0
        elig[np.flatnonzero(has), owner[has]] = True
    else:
        elig = true_elig
    servable = int(elig.any(axis=0).sum())
    cls_of, class_rows = _classes(elig)
    n_k = len(class_rows)
    cls = cls_of.tolist()

    rng = np.random.default_rng([seed, 0x5C])
    policy_rng = np.random.default_rng([seed, 0x9E])
    buf_n = 1 << 16
    exp_buf, uni_buf = rng.standard_exponential(buf_n).tolist(), rng.uniform(size=buf_n).tolist()
    ri = 0

    # per client (lists for fast scalar access in the loop)
    speed = clients.speed.tolist()
    session_end_now = [-1.0] * n_c  # end of the current session; -1 offline
    busy = [-1] * n_c  # job the client is bound to; -1 idle
    bind_start = [0.0] * n_c
    bind_round = [0] * n_c
    bind_attempt = [0] * n_c
    pos = [0] * n_c
    joined: list[dict[int, int]] = [{} for _ in range(n_c)]  # client -> {job: attempt it joined}
    parked: set[int] = set()
    wasted = 0
    pools: list[list[int]] = [[] for _ in range(n_k)]
    # per job; an attempt is one try of a round (a round that times out is tried again)
    arrival = jobs.arrival_s
    arrival_l = arrival.tolist()
    demand = jobs.demand.tolist()
    places = [rules.places(d) for d in demand]
    rounds = jobs.rounds.tolist()
    work = jobs.work.tolist()
    rounds_done = [0] * n_j
    attempt = [0] * n_j
    results = [0] * n_j  # results of the current attempt
    inflight = [0] * n_j  # bindings of the current attempt in flight
    used_log: list[list[int]] = [[] for _ in range(n_j)]  # log rows of the current attempt's results
    active = np.zeros(n_j, dtype=bool)
    open_np = np.zeros(n_j, dtype=bool)
    completion = np.full(n_j, np.nan)
    useful_k: list[int] = []
    failed_rounds = 0

    log_c: list[int] = []
    log_j: list[int] = []
    log_r: list[int] = []
    log_s: list[float] = []
    log_e: list[float] = []
    log_o: list[int] = []

    # event sources: session starts / ends (sorted arrays), arrivals (sorted), finishes and round deadlines
    # (heaps), the check-in
    on_order = np.argsort(pop.session_start, kind="stable")
    on_t, on_c = pop.session_start[on_order].tolist(), pop.session_client[on_order].tolist()
    on_end = pop.session_end[on_order].tolist()
    off_order = np.argsort(pop.session_end, kind="stable")
    off_t, off_c = pop.session_end[off_order].tolist(), pop.session_client[off_order].tolist()
    n_on, n_off = len(on_t), len(off_t)
    i_on = i_off = i_arr = 0
    heap: list[tuple[float, int, int]] = []
    deadlines: list[tuple[float, int, int]] = []  # (deadline, job, attempt)
    seq = 0
    done_jobs = 0
    events = 0
    order = np.zeros(0, dtype=np.int64)
    order_dirty = True
    open_dirty = False
    inf = math.inf
    dyn_order = policy in (Policy.SRSF, Policy.IRS)

    def unpark() -> None:
        for p in parked:
            pl = pools[cls[p]]
            pos[p] = len(pl)
            pl.append(p)
        parked.clear()

    def set_open(j: int) -> bool:
        want = bool(active[j]) and places[j] - inflight[j] - results[j] > 0
        if want != open_np[j]:
            open_np[j] = want
            if want and parked:  # places opened: parked clients check in again
                unpark()
            return True
        return False

    def next_attempt(j: int, now: float) -> None:
        """The job's current attempt is over (success or timeout): bindings still in flight for it are now
        late; the next attempt opens (if the job goes on) with its own deadline."""
        attempt[j] += 1
        results[j] = inflight[j] = 0
        used_log[j] = []
        if parked:  # clients that joined the old attempt may join the new one
            unpark()
        if active[j]:
            d = rules.deadline(now)
            if d < inf:
                heapq.heappush(deadlines, (d, j, attempt[j]))

    t = 0.0
    t_check = inf
    while done_jobs < servable:
        t_on = on_t[i_on] if i_on < n_on else inf
        t_off = off_t[i_off] if i_off < n_off else inf
        t_arr = arrival_l[i_arr] if i_arr < n_j else inf
        t_fin = heap[0][0] if heap else inf
        t_dl = deadlines[0][0] if deadlines else inf
        t = min(t_fin, t_dl, t_off, t_arr, t_on, t_check)
        if t > horizon or t == inf:
            t = horizon
            break
        events += 1
        if t_fin == t:  # a result comes back (before a deadline or a session end at the same time)
            _, _, c = heapq.heappop(heap)
            j = busy[c]
            busy[c] = -1
            log_c.append(c), log_j.append(j), log_r.append(bind_round[c])
            log_s.append(bind_start[c]), log_e.append(t)
            if rules.outcome(same_round=bind_attempt[c] == attempt[j], round_open=bool(active[j])) == USED:
                log_o.append(USED)
                used_log[j].append(len(log_o) - 1)
                inflight[j] -= 1
                results[j] += 1
                if rules.complete(results[j], demand[j]):
                    rounds_done[j] += 1
                    if rounds_done[j] == rounds[j]:
                        active[j] = False
                        completion[j] = t
                        done_jobs += 1
                        order_dirty = True
                        if progress:
                            progress(done_jobs)
                    next_attempt(j, t)
                if dyn_order:
                    order_dirty = True
                open_dirty |= set_open(j)
            else:  # its round ended meanwhile: discarded, counted
                log_o.append(LATE)
            k = cls[c]
            pool = pools[k]
            pos[c] = len(pool)
            pool.append(c)
        elif t_dl == t:  # a round's deadline
            _, j, a = heapq.heappop(deadlines)
            if active[j] and attempt[j] == a:  # not complete in time: it fails and runs again
                failed_rounds += 1
                for row in used_log[j]:
                    log_o[row] = DISCARDED
                next_attempt(j, t)
                order_dirty = True
                open_dirty |= set_open(j)
        elif t_off == t:  # a session ends
            c = off_c[i_off]
            i_off += 1
            j = busy[c]
            if j >= 0:  # dropout: the result is lost; a place of the current attempt reopens
                busy[c] = -1
                log_c.append(c), log_j.append(j), log_r.append(bind_round[c])
                log_s.append(bind_start[c]), log_e.append(t), log_o.append(LOST)
                if bind_attempt[c] == attempt[j] and active[j]:
                    inflight[j] -= 1
                    if joined[c].get(j) == bind_attempt[c]:
                        del joined[c][j]
                    open_dirty |= set_open(j)
            elif c in parked:
                parked.discard(c)
            else:
                pool = pools[cls[c]]
                i = pos[c]
                last = pool.pop()
                if last != c:
                    pool[i] = last
                    pos[last] = i
            session_end_now[c] = -1.0
        elif t_arr == t:  # a job registers; its round 0 opens
            j = i_arr
            i_arr += 1
            active[j] = True
            d = rules.deadline(t)
            if d < inf:
                heapq.heappush(deadlines, (d, j, attempt[j]))
            order_dirty = True
            open_dirty |= set_open(j)
        elif t_on == t:  # a session starts
            c = on_c[i_on]
            session_end_now[c] = on_end[i_on]
            i_on += 1
            pool = pools[cls[c]]
            pos[c] = len(pool)
            pool.append(c)
        else:  # a check-in by a client that can be offered a job
            if ri == buf_n:
                exp_buf, uni_buf = rng.standard_exponential(buf_n).tolist(), rng.uniform(size=buf_n).tolist()
                ri = 0
            u = uni_buf[ri]
            ri += 1
            total = 0
            for k in useful_k:
                total += len(pools[k])
            r = int(u * total)
            for k in useful_k:
                size = len(pools[k])
                if r < size:
                    break
                r -= size
            pool = pools[k]
            c = pool[r]
            if order_dirty or policy is Policy.RANDOM:
                act = np.flatnonzero(active)
                rem = (jobs.rounds[act] - np.array(rounds_done)[act]) * jobs.demand[act] - np.array(results)[act]
                order = act[job_order(policy, arrival_s=arrival[act], remaining_service=rem,
                                      eligible_clients=eligible_count[act], rng=policy_rng)]
                order_dirty = False
            row = elig[c]
            mine = joined[c]
            if mine:
                copied = False
                for jj, aa in list(mine.items()):
                    if aa != attempt[jj]:
                        del mine[jj]
                    elif open_np[jj]:
                        if not copied:
                            row, copied = row.copy(), True
                        row[jj] = False
            j = offer(order, row, open_np)
            last = pool.pop()
            if last != c:
                pool[r] = last
                pos[last] = r
            if j < 0:  # it joined the current round of every open job it may serve: park it
                parked.add(c)
                wasted += 1
            else:
                mine[j] = attempt[j]
                busy[c] = j
                bind_start[c] = t
                bind_round[c] = rounds_done[j]
                bind_attempt[c] = attempt[j]
                inflight[j] += 1
                open_dirty |= set_open(j)
                fin = t + work[j] / speed[c]
                if fin <= session_end_now[c]:
                    seq += 1
                    heapq.heappush(heap, (fin, seq, c))
        if open_dirty:
            useful_k = np.flatnonzero(class_rows[:, open_np].any(axis=1)).tolist() if open_np.any() else []
            open_dirty = False
        # next check-in among the useful clients (memoryless: resampled after every event)
        n_useful = 0
        for k in useful_k:
            n_useful += len(pools[k])
        if n_useful:
            if checkin_interval_s == 0:
                t_check = t
            else:
                if ri == buf_n:
                    exp_buf, uni_buf = rng.standard_exponential(buf_n).tolist(), rng.uniform(size=buf_n).tolist()
                    ri = 0
                t_check = t + exp_buf[ri] * checkin_interval_s / n_useful
                ri += 1
        else:
            t_check = inf

    end_t = min(t, horizon)
    for j in np.flatnonzero(active).tolist():  # results held by a round that had not ended: not used (yet)
        for row in used_log[j]:
            log_o[row] = CUT
    for c in range(n_c):  # in flight when the run stops: cut, neither a result nor a dropout
        if busy[c] >= 0:
            log_c.append(c), log_j.append(busy[c]), log_r.append(bind_round[c])
            log_s.append(bind_start[c]), log_e.append(end_t), log_o.append(CUT)
    return SimRun(policy=policy.value, horizon_s=horizon, end_s=end_t, arrival_s=np.asarray(arrival, dtype=float),
                  completion_s=completion, log_client=np.array(log_c, dtype=np.int64),
                  log_job=np.array(log_j, dtype=np.int64), log_round=np.array(log_r, dtype=np.int64),
                  log_start=np.array(log_s, dtype=float), log_end=np.array(log_e, dtype=float),
                  log_outcome=np.array(log_o, dtype=np.int64), online_s=pop.online_seconds(end_t),
                  events=events, elapsed_s=time.perf_counter() - started, idle_checkins=wasted,
                  failed_rounds=failed_rounds, rules=rules)
