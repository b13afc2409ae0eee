"""Which job a checking-in client is offered: the scheduler's policies (Propius, arXiv 2510.19617, sec. 4).

The scheduler keeps an order of the jobs that still need clients; a client that checks in is offered the first
job in that order it is eligible for. The policies differ only in the order:

- ``fifo``: by arrival (the usual default of FL resource managers).
- ``random``: a fresh random order at every scheduling pass.
- ``srsf``: smallest remaining service first, remaining service = client-rounds the job still needs
  (remaining rounds x demand per round), the classic SRPT rule applied to client-rounds.
- ``irs``: intersection-based scheduling (Propius): jobs whose eligible client group is scarcest go first, so a
  client that can serve a picky job serves it before it is taken by a job any client can serve; ties by
  remaining service, then arrival.
- ``static``: static partitioning, the baseline: each client belongs to one job for good (dealt round-robin over
  the jobs it is eligible for); it is offered that job only, and idles once that job is done.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from lightrail.errors import ScenarioError

__all__ = ["Policy", "POLICIES", "job_order", "offer", "static_partition"]


class Policy(StrEnum):
    FIFO = "fifo"
    RANDOM = "random"
    SRSF = "srsf"
    IRS = "irs"
    STATIC = "static"

    @classmethod
    def parse(cls, text: str | Policy, *, field: str = "--policy") -> Policy:
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise ScenarioError(f"unknown policy {text!r}", field=field,
                                fix=f"one of: {', '.join(p.value for p in cls)}") from None


POLICIES = tuple(Policy)


def job_order(policy: Policy | str, *, arrival_s: np.ndarray, remaining_service: np.ndarray,
              eligible_clients: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """Job indices, the one to serve first first. ``eligible_clients[j]`` is how many known clients meet job j's
    requirements (IRS's scarcity); jobs that need nothing more should be left out by the caller.

    >>> job_order("srsf", arrival_s=np.array([0.0, 1.0, 2.0]), remaining_service=np.array([9, 3, 5]),
    ...           eligible_clients=np.array([10, 10, 10])).tolist()
    [1, 2, 0]
    >>> job_order("irs", arrival_s=np.array([0.0, 1.0]), remaining_service=np.array([1, 9]),
    ...           eligible_clients=np.array([100, 20])).tolist()
    [1, 0]
    """
    policy = Policy.parse(policy)
    n = len(arrival_s)
    if policy is Policy.RANDOM:
        return (rng or np.random.default_rng()).permutation(n)
    if policy is Policy.SRSF:
        return np.lexsort((arrival_s, remaining_service))
    if policy is Policy.IRS:
        return np.lexsort((arrival_s, remaining_service, eligible_clients))
    return np.lexsort((np.arange(n), arrival_s))  # fifo, and static (its order only matters among a client's one job)


def offer(order: np.ndarray, eligible_row: np.ndarray, open_jobs: np.ndarray) -> int:
    """The first job of ``order`` the client is eligible for and that still has open demand; -1 if none.

    >>> offer(np.array([2, 0, 1]), np.array([True, True, False]), np.array([True, True, True]))
    0
    """
    ok = eligible_row[order] & open_jobs[order]
    hit = np.flatnonzero(ok)
    return int(order[hit[0]]) if hit.size else -1


def static_partition(eligible: np.ndarray) -> np.ndarray:
    """Static partitioning: each client's one job (-1 if it is eligible for none), dealt so that every job gets
    the clients eligible for it in turn (client c goes to the job, among those it may serve, with the fewest
    clients so far).

    >>> static_partition(np.array([[True, True], [True, True], [False, True]])).tolist()
    [0, 1, 1]
    """
    c, j = eligible.shape
    owner = np.full(c, -1, dtype=np.int64)
    count = np.zeros(j, dtype=np.int64)
    for client in range(c):
        jobs = np.flatnonzero(eligible[client])
        if jobs.size:
            pick = jobs[np.argmin(count[jobs])]
            owner[client] = pick
            count[pick] += 1
    return owner
