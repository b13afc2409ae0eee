"""The check-in / round simulator: invariants on a synthetic population, closed-form small cases, and each
policy's behaviour on hand-built cases."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.errors import ScenarioError
from lightrail.fl.model import OSES, Clients, Jobs
from lightrail.fl.policies import POLICIES
from lightrail.fl.population import Population, synthetic_population
from lightrail.fl.rounds import RoundRules
from lightrail.fl.sim import CUT, DISCARDED, LATE, LOST, USED, double_bookings, simulate

ANY = (1 << len(OSES)) - 1
IOS = 1 << OSES.index("ios")
ANDROID = OSES.index("android")
EXACT = RoundRules(over_selection=1.0)
"""No over-selection: a round binds exactly ``demand`` clients (the hand-computed cases below assume it)."""


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
    assert run.bindings == run.results + run.lost + run.cut + run.late and run.discarded == 0  # no timeout
    assert run.results == int((jobs.rounds * jobs.demand).sum())
    assert run.late > 0  # over-selection (1.3x by default) leaves the slowest of each round late
    assert 0 <= run.utilization < run.busy_utilization <= 1
    ok = run.log_outcome == USED
    # each round of each job gets exactly `demand` results
    for j in range(len(jobs)):
        per_round = np.bincount(run.log_round[ok & (run.log_job == j)], minlength=int(jobs.rounds[j]))
        assert per_round.tolist() == [int(jobs.demand[j])] * int(jobs.rounds[j])
    # a binding lies inside one of its client's sessions, and results take work / speed
    dur = run.log_end - run.log_start
    done = ok | (run.log_outcome == LATE)
    np.testing.assert_allclose(dur[done], jobs.work[run.log_job[done]] / small.clients.speed[run.log_client[done]])
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
    run = simulate(pop, "fifo", checkin_interval_s=0, rules=EXACT)
    assert run.jct_s[0] == pytest.approx(7 * 30.0 / 2.0)
    assert run.bindings == 28 and run.lost == 0 and run.utilization == pytest.approx(28 * 15.0 / (4 * (5 + 105.0)))


@pytest.mark.parametrize("demand", [1, 3])
def test_closed_form_poisson_checkins(demand):
    # every round needs all `demand` clients to check in (mean gap g each): E[round] = work/speed + g x H_demand
    rounds, g, work, speed = 1500, 20.0, 30.0, 3.0
    pop = population(speed=[speed] * demand, jobs=[(0.0, rounds, demand, work, ANY)], horizon=1e7)
    run = simulate(pop, "fifo", checkin_interval_s=g, seed=5, rules=EXACT)
    harmonic = sum(1 / k for k in range(1, demand + 1))
    expected = rounds * (work / speed + g * harmonic)
    assert run.jct_s[0] == pytest.approx(expected, rel=0.05)


def test_dropout_loses_the_result_and_reopens_demand():
    # client 0 is online [0, 5) and cannot finish 10 s of work; client 1 (online from 3) takes over at 5
    pop = population(speed=[1.0, 1.0], sessions=([0, 1], [0.0, 3.0], [5.0, 100.0]),
                     jobs=[(0.0, 1, 1, 10.0, ANY)], horizon=100.0)
    run = simulate(pop, "fifo", checkin_interval_s=0, rules=EXACT)
    assert run.log_outcome.tolist() == [LOST, USED]
    assert run.log_client.tolist() == [0, 1]
    assert run.jct_s[0] == pytest.approx(15.0)
    assert run.busy_s == pytest.approx(15.0) and run.online_s == pytest.approx(5 + 12.0)


def test_a_job_no_client_may_serve_neither_finishes_nor_keeps_the_run_going():
    # job 1 needs iOS, and there is none: it never finishes, has no JCT, and the run ends with job 0
    pop = population(speed=[1.0, 1.0], jobs=[(0.0, 2, 1, 10.0, ANY), (50.0, 1, 1, 10.0, IOS)], horizon=1000.0)
    run = simulate(pop, "irs", checkin_interval_s=0, rules=EXACT)
    assert run.jobs_completed == 1 and run.jobs_unfinished == 1 and run.makespan_s == 20.0
    assert run.jct_s[0] == pytest.approx(20.0) and np.isnan(run.jct_s[1]) and run.mean_jct_s == pytest.approx(20.0)
    assert run.cut == 0 and run.double_bookings == 0


def test_srsf_finishes_the_short_job_first():
    # two jobs open to all arrive together, one client-round each per round, one client's worth of capacity
    jobs = [(0.0, 10, 2, 10.0, ANY), (0.0, 2, 2, 10.0, ANY)]
    pop = population(speed=[1.0, 1.0], jobs=jobs)
    fifo = simulate(pop, "fifo", checkin_interval_s=0, rules=EXACT)
    srsf = simulate(pop, "srsf", checkin_interval_s=0, rules=EXACT)
    assert fifo.completion_s[0] < fifo.completion_s[1]
    assert srsf.completion_s.tolist() == pytest.approx([120.0, 20.0])
    assert srsf.jct_s.mean() < fifo.jct_s.mean()


def test_irs_serves_the_picky_job_first():
    # an open job and an iOS-only job; only the two iOS clients (eligible for both) are online at first
    os_ = [OSES.index("ios")] * 2 + [ANDROID] * 2
    sessions = ([0, 1, 2, 3], [0.0, 0.0, 100.0, 100.0], [1e6] * 4)
    jobs = [(0.0, 1, 2, 10.0, ANY), (0.0, 1, 2, 10.0, IOS)]
    pop = population(speed=[1.0] * 4, os=os_, sessions=sessions, jobs=jobs)
    irs = simulate(pop, "irs", checkin_interval_s=0, rules=EXACT)
    fifo = simulate(pop, "fifo", checkin_interval_s=0, rules=EXACT)
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
    static = simulate(pop, "static", checkin_interval_s=0, rules=EXACT)
    assert static.completion_s.tolist() == pytest.approx([10.0, 140.0])
    assert static.utilization == pytest.approx(220 / (3 * 140 + 100))
    for policy in ("fifo", "random", "srsf", "irs"):
        dyn = simulate(pop, policy, checkin_interval_s=0, rules=EXACT)
        assert dyn.completion_s.tolist() == pytest.approx([10.0, 100.0]), policy
        assert dyn.utilization == pytest.approx(220 / (3 * 100 + 60)), policy
        assert dyn.utilization > static.utilization


def test_bad_arguments():
    pop = population(speed=[1.0], jobs=[(0.0, 1, 1, 1.0, ANY)])
    with pytest.raises(ScenarioError, match="policy"):
        simulate(pop, "lifo")
    with pytest.raises(ScenarioError, match="checkin_interval_s"):
        simulate(pop, "fifo", checkin_interval_s=-1)
    cut = simulate(pop, "fifo", horizon_s=0.5, checkin_interval_s=0)
    assert (cut.cut, cut.lost, cut.results, cut.makespan_s) == (1, 0, 0, 0.5)


# ---- rounds as Propius runs them: over-selection, completion at demand, late results, timeouts, the horizon ----

def test_over_selection_binds_ceil_1_3_x_demand_and_closes_at_demand_results():
    # demand 2 -> 3 places; speeds 1, 2, 4 and work 8: results at 2, 4 and 8. Round 0 ends at 4 (its 2nd result);
    # the slowest client's result, at 8, is late: discarded and counted. Round 1 binds the two free clients at 4
    # (8/4 and 8/2 later: 6 and 8) and ends at 8; the job ends there.
    pop = population(speed=[1.0, 2.0, 4.0], jobs=[(0.0, 2, 2, 8.0, ANY)])
    run = simulate(pop, "fifo", checkin_interval_s=0)
    assert RoundRules().places(2) == 3
    assert (run.log_start == 0).sum() == 3  # all three bound to round 0
    assert run.completion_s[0] == pytest.approx(8.0)
    late = run.log_outcome == LATE
    assert run.late == 1 and run.log_client[late].tolist() == [0] and run.log_end[late].tolist() == [8.0]
    assert run.log_round[late].tolist() == [0]
    assert run.results == 4 and run.bindings == 5
    # utilization counts only used work: 2 + 4 (round 0) + 2 + 4 (round 1) of 3 x 8 online client-seconds
    assert run.utilization == pytest.approx(12 / 24) and run.busy_utilization == pytest.approx(20 / 24)
    exact = simulate(population(speed=[2.0, 4.0], jobs=[(0.0, 2, 2, 8.0, ANY)]), "fifo", checkin_interval_s=0,
                     rules=EXACT)  # without over-selection a round waits for its slowest client
    assert exact.late == 0 and exact.completion_s[0] == pytest.approx(8.0)


def test_a_round_that_times_out_fails_discards_its_results_and_runs_again():
    # demand 1, timeout 6. Client 0 (speed 1, work 10) is bound at 0 and cannot finish by 6: round 0 fails at 6.
    # Client 1 (speed 5) comes online at 7, joins the retried round (opened at 6) and finishes at 9 < 12. The run
    # ends there; client 0, still computing its late work, is cut (neither a result nor a dropout).
    pop = population(speed=[1.0, 5.0], sessions=([0, 1], [0.0, 7.0], [100.0, 100.0]),
                     jobs=[(0.0, 1, 1, 10.0, ANY)], horizon=100.0)
    run = simulate(pop, "fifo", checkin_interval_s=0, rules=RoundRules(over_selection=1.0, round_timeout_s=6.0))
    assert run.failed_rounds == 1 and run.completion_s[0] == pytest.approx(9.0)
    assert dict(zip(run.log_client.tolist(), run.log_outcome.tolist(), strict=True)) == {1: USED, 0: CUT}
    # two clients, demand 2, timeout 5: the fast one's result (at 2) is discarded when round 0 fails at 5
    pop = population(speed=[1.0, 4.0], jobs=[(0.0, 1, 2, 8.0, ANY)], horizon=12.0)
    run = simulate(pop, "fifo", checkin_interval_s=0, rules=RoundRules(over_selection=1.0, round_timeout_s=5.0))
    assert run.log_outcome[0] == DISCARDED and run.log_end[0] == 2.0 and run.log_client[0] == 1
    assert run.jobs_completed == 0 and np.isnan(run.mean_jct_s) and run.failed_rounds == 2  # at 5 and 10
    assert LATE in run.log_outcome.tolist()  # client 0's result of round 0, at 8
    assert run.results == 0 and run.utilization == 0.0


def test_the_horizon_cuts_in_flight_work_and_jct_counts_finished_jobs_only():
    # job 0 finishes at 20; job 1 (10 rounds of 100 s) is still running at the horizon 150: its binding in flight
    # there is cut, not lost, and it has no JCT; the mean JCT is job 0's
    pop = population(speed=[1.0, 1.0], jobs=[(0.0, 2, 1, 10.0, ANY), (0.0, 10, 1, 100.0, ANY)], horizon=1000.0)
    run = simulate(pop, "fifo", checkin_interval_s=0, rules=EXACT, horizon_s=150.0)
    assert run.jobs_completed == 1 and run.jobs_unfinished == 1
    assert run.mean_jct_s == pytest.approx(20.0) and np.isnan(run.jct_s[1])
    assert run.makespan_s == 150.0 and run.lost == 0 and run.cut == 1
    assert run.log_end[run.log_outcome == CUT].tolist() == [150.0]
    assert run.online_s == pytest.approx(2 * 150.0)


def test_round_rules_refuse_nonsense():
    with pytest.raises(ScenarioError, match="over_selection"):
        RoundRules(over_selection=0.9)
    with pytest.raises(ScenarioError, match="round_timeout_s"):
        RoundRules(round_timeout_s=0)
    assert RoundRules(over_selection=1.3).places(25) == 33 and RoundRules(over_selection=1.3).places(100) == 130
