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
- A bound client computes ``work / speed`` seconds, then returns its result. If its session ends first, the
  result is lost at that moment (dropout) and the round's demand reopens by one; the busy time until then counts
  as busy (wasted) client-seconds.
- A round ends when ``demand`` results are in (open demand = demand - in flight - results, never overcommitted);
  the job starts its next round at once, and completes after ``rounds`` rounds. A round's results come from
  distinct clients: a client that joined a job's current round is not offered that job again until the next
  round (unless its result was lost). A client may serve one job in consecutive rounds; it is bound to at most
  one job at a time (checked afterwards from the binding log).
- The run ends when every job is complete or at ``horizon_s`` (bindings still in flight are cut there).

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

__all__ = ["SimRun", "simulate", "double_bookings", "RESULT", "LOST", "CUT"]

RESULT, LOST, CUT = 0, 1, 2
"""Outcomes of a binding in the log: result returned, lost (client went offline), cut at the horizon."""


@dataclass(frozen=True, eq=False)
class SimRun:
    """One policy's run: the binding log (one entry per binding: client, job, round, start, end, outcome) and
    per-job completion times (``nan``: not complete by the horizon)."""

    policy: str
    horizon_s: float
    arrival_s: np.ndarray
    completion_s: np.ndarray
    log_client: np.ndarray
    log_job: np.ndarray
    log_round: np.ndarray
    log_start: np.ndarray
    log_end: np.ndarray
    log_outcome: np.ndarray
    online_s: float
    """Client-seconds online in [0, makespan)."""
    events: int
    elapsed_s: float
    idle_checkins: int = 0
    """Check-ins that found no job (the client had joined the current round of every open job it may serve)."""

    @property
    def finished(self) -> np.ndarray:
        return ~np.isnan(self.completion_s)

    @property
    def jobs_completed(self) -> int:
        return int(self.finished.sum())

    @property
    def makespan_s(self) -> float:
        """When the last job completed; the horizon if some job did not."""
        return float(self.completion_s.max()) if self.finished.all() and len(self.completion_s) else self.horizon_s

    @property
    def jct_s(self) -> np.ndarray:
        """Completion - arrival per job; jobs not complete by the horizon count at the horizon."""
        end = np.where(self.finished, self.completion_s, self.horizon_s)
        return np.maximum(end - self.arrival_s, 0.0)

    @property
    def bindings(self) -> int:
        return len(self.log_client)

    @property
    def results(self) -> int:
        return int((self.log_outcome == RESULT).sum())

    @property
    def lost(self) -> int:
        return int((self.log_outcome == LOST).sum())

    @property
    def cut(self) -> int:
        return int((self.log_outcome == CUT).sum())

    @property
    def busy_s(self) -> float:
        return float((self.log_end - self.log_start).sum())

    @property
    def utilization(self) -> float:
        """Busy client-seconds (computing for a job, lost work included) / online client-seconds, over the
        makespan."""
        return self.busy_s / self.online_s if self.online_s > 0 else 0.0

    @property
    def bindings_per_s(self) -> float:
        return self.bindings / self.makespan_s if self.makespan_s > 0 else 0.0

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
             horizon_s: float | None = None, progress: Callable[[int], None] | None = None) -> SimRun:
    """Run ``pop`` under ``policy`` until every job completes or ``horizon_s`` (default: the population's).

    ``seed`` drives the check-in times and the random policy; runs of different policies with one seed see the
    same population. ``progress(jobs_completed)`` is called whenever a job completes."""
    started = time.perf_counter()
    policy = Policy.parse(policy, field="policy")
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
    pos = [0] * n_c
    joined: list[dict[int, int]] = [{} for _ in range(n_c)]  # client -> {job: round it joined}
    parked: set[int] = set()
    wasted = 0
    pools: list[list[int]] = [[] for _ in range(n_k)]
    # per job
    arrival = jobs.arrival_s
    arrival_l = arrival.tolist()
    demand = jobs.demand.tolist()
    rounds = jobs.rounds.tolist()
    work = jobs.work.tolist()
    rounds_done = [0] * n_j
    results = [0] * n_j
    inflight = [0] * n_j
    active = np.zeros(n_j, dtype=bool)
    open_np = np.zeros(n_j, dtype=bool)
    completion = np.full(n_j, np.nan)
    useful_k: list[int] = []

    log_c: list[int] = []
    log_j: list[int] = []
    log_r: list[int] = []
    log_s: list[float] = []
    log_e: list[float] = []
    log_o: list[int] = []

    # event sources: session starts / ends (sorted arrays), arrivals (sorted), finishes (heap), the check-in
    on_order = np.argsort(pop.session_start, kind="stable")
    on_t, on_c = pop.session_start[on_order].tolist(), pop.session_client[on_order].tolist()
    on_end = pop.session_end[on_order].tolist()
    off_order = np.argsort(pop.session_end, kind="stable")
    off_t, off_c = pop.session_end[off_order].tolist(), pop.session_client[off_order].tolist()
    n_on, n_off = len(on_t), len(off_t)
    i_on = i_off = i_arr = 0
    heap: list[tuple[float, int, int]] = []
    seq = 0
    done_jobs = 0
    events = 0
    order = np.zeros(0, dtype=np.int64)
    order_dirty = True
    open_dirty = False
    inf = math.inf
    dyn_order = policy in (Policy.SRSF, Policy.IRS)

    def set_open(j: int) -> bool:
        want = bool(active[j]) and demand[j] - inflight[j] - results[j] > 0
        if want != open_np[j]:
            open_np[j] = want
            if want and parked:  # demand opened: parked clients check in again
                for p in parked:
                    pl = pools[cls[p]]
                    pos[p] = len(pl)
                    pl.append(p)
                parked.clear()
            return True
        return False

    t = 0.0
    t_check = inf
    while True:
        t_on = on_t[i_on] if i_on < n_on else inf
        t_off = off_t[i_off] if i_off < n_off else inf
        t_arr = arrival_l[i_arr] if i_arr < n_j else inf
        t_fin = heap[0][0] if heap else inf
        t = min(t_fin, t_off, t_arr, t_on, t_check)
        if t > horizon or t == inf:
            t = horizon
            break
        events += 1
        if t_fin == t:  # a result comes back (before a session end at the same time)
            _, _, c = heapq.heappop(heap)
            j = busy[c]
            busy[c] = -1
            log_c.append(c), log_j.append(j), log_r.append(bind_round[c])
            log_s.append(bind_start[c]), log_e.append(t), log_o.append(RESULT)
            inflight[j] -= 1
            results[j] += 1
            if results[j] == demand[j]:
                results[j] = 0
                rounds_done[j] += 1
                if rounds_done[j] == rounds[j]:
                    active[j] = False
                    completion[j] = t
                    done_jobs += 1
                    order_dirty = True
                    if progress:
                        progress(done_jobs)
            if dyn_order:
                order_dirty = True
            open_dirty |= set_open(j)
            k = cls[c]
            pool = pools[k]
            pos[c] = len(pool)
            pool.append(c)
            if done_jobs == n_j:
                break
        elif t_off == t:  # a session ends
            c = off_c[i_off]
            i_off += 1
            j = busy[c]
            if j >= 0:  # dropout: the result is lost, the demand reopens
                busy[c] = -1
                log_c.append(c), log_j.append(j), log_r.append(bind_round[c])
                log_s.append(bind_start[c]), log_e.append(t), log_o.append(LOST)
                inflight[j] -= 1
                if joined[c].get(j) == bind_round[c]:
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
        elif t_arr == t:  # a job registers
            j = i_arr
            i_arr += 1
            active[j] = True
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
                for jj, rr in list(mine.items()):
                    if rr != rounds_done[jj]:
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
                mine[j] = rounds_done[j]
                busy[c] = j
                bind_start[c] = t
                bind_round[c] = rounds_done[j]
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

    end_t = t if done_jobs == n_j else horizon
    for c in range(n_c) if done_jobs < n_j else ():
        if busy[c] >= 0:
            log_c.append(c), log_j.append(busy[c]), log_r.append(bind_round[c])
            log_s.append(bind_start[c]), log_e.append(horizon), log_o.append(CUT)
    makespan = end_t
    return SimRun(policy=policy.value, horizon_s=horizon, arrival_s=np.asarray(arrival, dtype=float),
                  completion_s=completion, log_client=np.array(log_c, dtype=np.int64),
                  log_job=np.array(log_j, dtype=np.int64), log_round=np.array(log_r, dtype=np.int64),
                  log_start=np.array(log_s, dtype=float), log_end=np.array(log_e, dtype=float),
                  log_outcome=np.array(log_o, dtype=np.int64), online_s=pop.online_seconds(makespan),
                  events=events, elapsed_s=time.perf_counter() - started, idle_checkins=wasted)
