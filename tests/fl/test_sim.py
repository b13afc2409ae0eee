"""The check-in / round simulator: invariants on a synthetic population, closed-form small cases, and each
policy's behaviour on hand-built cases."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.errors import ScenarioError
from lightrail.fl.model import OSES, Clients, Jobs
from lightrail.fl.policies import POLICIES
from lightrail.fl.population import Population, synthetic_population
from lightrail.fl.sim import LOST, RESULT, double_bookings, simulate

ANY = (1 << len(OSES)) - 1
IOS = 1 << OSES.index("ios")
ANDROID = OSES.index("android")


def population(*, speed, os=None, sessions=None, jobs, horizon=1e6, cpu=None, mem=None) -> Population:
    """Clients with the given speeds (OS android unless given), always online unless ``sessions`` (client, start,
    end) are given; ``jobs`` = [(arrival, rounds, demand, work, os_mask)]."""
    n = len(speed)
    clients = Clients(np.asarray(cpu if cpu is not None else [2.0] * n, dtype=float),
                      np.asarray(mem if mem is not None else [4.0] * n, dtype=float),
                      np.asarray(os if os is not None else [ANDROID] * n, dtype=np.int64),
                      np.asarray(speed, dtype=float))
    a, r, d, w, m = (np.array(x) for x in zip(*jobs, strict=True))
    jb = Jobs(np.zeros(len(a)), np.zeros(len(a)), m.astype(np.int64), r.astype(np.int64), d.astype(np.int64),
              w.astype(float), a.astype(float))
    if sessions is None:
        sessions = (list(range(n)), [0.0] * n, [horizon] * n)
    c, s, e = (np.asarray(x) for x in sessions)
    order = np.lexsort((s, c))
    return Population(clients, jb, c[order].astype(np.int64), s[order].astype(float), e[order].astype(float),
                      float(horizon))


@pytest.fixture(scope="module")
def small():
    return synthetic_population(300, 4, seed=1)


@pytest.fixture(scope="module")
def runs(small):
    return {p.value: simulate(small, p, seed=2) for p in POLICIES}


@pytest.mark.parametrize("policy", [p.value for p in POLICIES])
def test_invariants(small, runs, policy):
    run = runs[policy]
    jobs = small.jobs
    assert run.double_bookings == 0
    assert run.jobs_completed == len(jobs)  # the small population finishes well within a week
    assert run.bindings == run.results + run.lost + run.cut and run.cut == 0
    assert run.results == int((jobs.rounds * jobs.demand).sum())
    assert 0 <= run.utilization <= 1
    ok = run.log_outcome == RESULT
    # each round of each job gets exactly `demand` results
    for j in range(len(jobs)):
        per_round = np.bincount(run.log_round[ok & (run.log_job == j)], minlength=int(jobs.rounds[j]))
        assert per_round.tolist() == [int(jobs.demand[j])] * int(jobs.rounds[j])
    # a binding lies inside one of its client's sessions, and results take work / speed
    dur = run.log_end - run.log_start
    np.testing.assert_allclose(dur[ok], jobs.work[run.log_job[ok]] / small.clients.speed[run.log_client[ok]])
    assert (dur[run.log_outcome == LOST] < jobs.work[run.log_job[run.log_outcome == LOST]]
            / small.clients.speed[run.log_client[run.log_outcome == LOST]] + 1e-9).all()
    # every binding goes to a client eligible for its job
    assert small.eligibility()[run.log_client, run.log_job].all()
    assert (run.completion_s >= small.jobs.arrival_s).all()
    assert run.makespan_s == pytest.approx(run.completion_s.max())
    assert run.bindings_per_s == pytest.approx(run.bindings / run.makespan_s)


def test_same_seed_same_run(small, runs):
    again = simulate(small, "random", seed=2)
    np.testing.assert_array_equal(again.log_start, runs["random"].log_start)
    np.testing.assert_array_equal(again.completion_s, runs["random"].completion_s)


def test_static_only_serves_its_partition(small, runs):
    from lightrail.fl.policies import static_partition

    owner = static_partition(small.eligibility())
    run = runs["static"]
    assert (owner[run.log_client] == run.log_job).all()


def test_double_booking_counter():
    assert double_bookings(np.array([3, 3, 3]), np.array([0.0, 10.0, 2.0]), np.array([5.0, 12.0, 4.0])) == 1
    assert double_bookings(np.array([1, 2]), np.array([0.0, 0.0]), np.array([5.0, 5.0])) == 0
    assert double_bookings(np.array([1, 1]), np.array([0.0, 5.0]), np.array([5.0, 6.0])) == 0  # back to back


def test_closed_form_immediate_checkins():
    # one job, demand = clients, equal speeds, always online, check-ins at once: JCT = rounds x work / speed
    pop = population(speed=[2.0] * 4, jobs=[(5.0, 7, 4, 30.0, ANY)])
    run = simulate(pop, "fifo", checkin_interval_s=0)
    assert run.jct_s[0] == pytest.approx(7 * 30.0 / 2.0)
    assert run.bindings == 28 and run.lost == 0 and run.utilization == pytest.approx(28 * 15.0 / (4 * (5 + 105.0)))


@pytest.mark.parametrize("demand", [1, 3])
def test_closed_form_poisson_checkins(demand):
    # every round needs all `demand` clients to check in (mean gap g each): E[round] = work/speed + g x H_demand
    rounds, g, work, speed = 1500, 20.0, 30.0, 3.0
    pop = population(speed=[speed] * demand, jobs=[(0.0, rounds, demand, work, ANY)], horizon=1e7)
    run = simulate(pop, "fifo", checkin_interval_s=g, seed=5)
    harmonic = sum(1 / k for k in range(1, demand + 1))
    expected = rounds * (work / speed + g * harmonic)
    assert run.jct_s[0] == pytest.approx(expected, rel=0.05)


def test_dropout_loses_the_result_and_reopens_demand():
    # client 0 is online [0, 5) and cannot finish 10 s of work; client 1 (online from 3) takes over at 5
    pop = population(speed=[1.0, 1.0], sessions=([0, 1], [0.0, 3.0], [5.0, 100.0]),
                     jobs=[(0.0, 1, 1, 10.0, ANY)], horizon=100.0)
    run = simulate(pop, "fifo", checkin_interval_s=0)
    assert run.log_outcome.tolist() == [LOST, RESULT]
    assert run.log_client.tolist() == [0, 1]
    assert run.jct_s[0] == pytest.approx(15.0)
    assert run.busy_s == pytest.approx(15.0) and run.online_s == pytest.approx(5 + 12.0)


def test_unfinished_jobs_count_at_the_horizon():
    # job 1 needs iOS, and there is none: it never finishes; its JCT is the horizon - arrival
    pop = population(speed=[1.0, 1.0], jobs=[(0.0, 2, 1, 10.0, ANY), (50.0, 1, 1, 10.0, IOS)], horizon=1000.0)
    run = simulate(pop, "irs", checkin_interval_s=0)
    assert run.jobs_completed == 1 and run.makespan_s == 1000.0
    assert run.jct_s.tolist() == pytest.approx([20.0, 950.0])
    assert run.cut == 0 and run.double_bookings == 0


def test_srsf_finishes_the_short_job_first():
    # two jobs open to all arrive together, one client-round each per round, one client's worth of capacity
    jobs = [(0.0, 10, 2, 10.0, ANY), (0.0, 2, 2, 10.0, ANY)]
    pop = population(speed=[1.0, 1.0], jobs=jobs)
    fifo = simulate(pop, "fifo", checkin_interval_s=0)
    srsf = simulate(pop, "srsf", checkin_interval_s=0)
    assert fifo.completion_s[0] < fifo.completion_s[1]
    assert srsf.completion_s.tolist() == pytest.approx([120.0, 20.0])
    assert srsf.jct_s.mean() < fifo.jct_s.mean()


def test_irs_serves_the_picky_job_first():
    # an open job and an iOS-only job; only the two iOS clients (eligible for both) are online at first
    os_ = [OSES.index("ios")] * 2 + [ANDROID] * 2
    sessions = ([0, 1, 2, 3], [0.0, 0.0, 100.0, 100.0], [1e6] * 4)
    jobs = [(0.0, 1, 2, 10.0, ANY), (0.0, 1, 2, 10.0, IOS)]
    pop = population(speed=[1.0] * 4, os=os_, sessions=sessions, jobs=jobs)
    irs = simulate(pop, "irs", checkin_interval_s=0)
    fifo = simulate(pop, "fifo", checkin_interval_s=0)
    assert irs.completion_s.tolist() == pytest.approx([20.0, 10.0])  # picky job served first by the iOS clients
    assert fifo.completion_s.tolist() == pytest.approx([10.0, 20.0])
    assert irs.log_job[irs.log_start == 0].tolist() == [1, 1]


def test_static_idles_clients_its_job_no_longer_needs():
    # static deals clients 0, 2 to job 0 (1 round of 2) and 1, 3 to job 1 (10 rounds of 2); client 3 is offline
    # over [10, 50). Static: job 1's round 2 waits for client 3 (ends at 60, job 1 at 140) while clients 0 and 2
    # idle; busy 220 of 3 x 140 + 100 online client-seconds. Any dynamic policy lets them serve job 1: it ends at
    # 100; busy 220 of 3 x 100 + 60.
    sessions = ([0, 1, 2, 3, 3], [0.0, 0.0, 0.0, 0.0, 50.0], [1e6, 1e6, 1e6, 10.0, 1e6])
    pop = population(speed=[1.0] * 4, sessions=sessions, jobs=[(0.0, 1, 2, 10.0, ANY), (0.0, 10, 2, 10.0, ANY)])
    static = simulate(pop, "static", checkin_interval_s=0)
    assert static.completion_s.tolist() == pytest.approx([10.0, 140.0])
    assert static.utilization == pytest.approx(220 / (3 * 140 + 100))
    for policy in ("fifo", "random", "srsf", "irs"):
        dyn = simulate(pop, policy, checkin_interval_s=0)
        assert dyn.completion_s.tolist() == pytest.approx([10.0, 100.0]), policy
        assert dyn.utilization == pytest.approx(220 / (3 * 100 + 60)), policy
        assert dyn.utilization > static.utilization


def test_bad_arguments():
    pop = population(speed=[1.0], jobs=[(0.0, 1, 1, 1.0, ANY)])
    with pytest.raises(ScenarioError, match="policy"):
        simulate(pop, "lifo")
    with pytest.raises(ScenarioError, match="checkin_interval_s"):
        simulate(pop, "fifo", checkin_interval_s=-1)
    assert simulate(pop, "fifo", horizon_s=0.5, checkin_interval_s=0).cut == 1
