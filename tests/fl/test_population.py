"""The emulated population: the synthetic default is deterministic and documented; trace files round-trip and
bad lines are refused naming the file, line and column."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.errors import ScenarioError
from lightrail.fl.model import OSES
from lightrail.fl.population import (
    DAY,
    availability_csv,
    clients_csv,
    jobs_csv,
    parse_availability,
    parse_clients,
    parse_jobs,
    synthetic_population,
)


@pytest.fixture(scope="module")
def pop():
    return synthetic_population(2000, 20, seed=3)


def _arrays(p):
    c, j = p.clients, p.jobs
    return [c.cpu_ghz, c.memory_gb, c.os, c.speed, j.min_cpu_ghz, j.min_memory_gb, j.os_mask, j.rounds, j.demand,
            j.work, j.arrival_s, p.session_client, p.session_start, p.session_end]


def test_same_seed_same_population(pop):
    again = synthetic_population(2000, 20, seed=3)
    for a, b in zip(_arrays(pop), _arrays(again), strict=True):
        np.testing.assert_array_equal(a, b)
    other = synthetic_population(2000, 20, seed=4)
    assert not np.array_equal(pop.clients.speed, other.clients.speed)


def test_default_population_is_as_documented(pop):
    c, j = pop.clients, pop.jobs
    assert len(c) == 2000 and len(j) == 20
    assert ((c.cpu_ghz >= 1.0) & (c.cpu_ghz <= 3.5)).all() and (c.speed > 0).all()
    assert set(np.unique(c.memory_gb)) <= {2.0, 3.0, 4.0, 6.0, 8.0, 12.0}
    share = np.bincount(c.os, minlength=len(OSES)) / len(c)
    assert abs(share[OSES.index("android")] - 0.70) < 0.05 and abs(share[OSES.index("ios")] - 0.27) < 0.05
    assert np.quantile(c.speed, 0.99) / np.median(c.speed) > 3  # heavy-tailed speeds
    assert ((j.rounds >= 5) & (j.rounds <= 50)).all()
    assert ((j.demand >= 1) & (j.demand <= 200)).all()
    assert j.arrival_s[0] == 0 and (np.diff(j.arrival_s) >= 0).all()
    can = pop.eligibility().sum(axis=0)
    assert (can == len(c)).sum() >= 5  # some jobs open to all
    assert (can < 0.1 * len(c)).any()  # some picky
    assert (j.os_mask == 1 << OSES.index("ios")).sum() >= 2  # some iOS only
    assert (j.demand <= np.maximum(can // 4, 1)).all()
    from lightrail.fl.policies import static_partition
    owned = np.bincount(static_partition(pop.eligibility()), minlength=len(j))[:len(j)]
    assert (j.demand <= np.maximum(owned // 2, 1)).all()


def test_sessions_sorted_disjoint_and_diurnal(pop):
    cl, s, e = pop.session_client, pop.session_start, pop.session_end
    assert (e > s).all() and (s >= 0).all() and (e <= pop.horizon_s).all()
    same = cl[1:] == cl[:-1]
    assert (np.diff(cl) >= 0).all()
    assert (s[1:][same] > e[:-1][same]).all()  # merged: no overlap, no touching
    frac = pop.online_seconds(pop.horizon_s) / (len(pop.clients) * pop.horizon_s)
    assert 0.03 < frac < 0.25
    # diurnal: more starts near the peak (2 h) than 12 h away
    hour = (s[s > 0] % DAY) / 3600
    near = ((hour > 23) | (hour < 5)).sum()
    far = ((hour > 11) & (hour < 17)).sum()
    assert near > 2 * far


def test_trace_files_round_trip(pop):
    ids = tuple(f"dev-{i}" for i in range(len(pop.clients)))
    cl, got_ids = parse_clients(clients_csv(pop.clients, ids))
    assert got_ids == ids
    for a, b in zip((cl.cpu_ghz, cl.memory_gb, cl.os, cl.speed),
                    (pop.clients.cpu_ghz, pop.clients.memory_gb, pop.clients.os, pop.clients.speed), strict=True):
        np.testing.assert_array_equal(a, b)
    jb = parse_jobs(jobs_csv(pop.jobs))
    for name in ("min_cpu_ghz", "min_memory_gb", "os_mask", "rounds", "demand", "work", "arrival_s"):
        np.testing.assert_array_equal(getattr(jb, name), getattr(pop.jobs, name))
    c, s, e = parse_availability(availability_csv(pop.session_client, pop.session_start, pop.session_end, ids), ids)
    np.testing.assert_array_equal(c, pop.session_client)
    np.testing.assert_array_equal(s, pop.session_start)
    np.testing.assert_array_equal(e, pop.session_end)


def test_jobs_os_spellings_and_sorting():
    text = ("# a comment\narrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work\n"
            "50,2.0,4,android|ios,5,10,100\n0,0,0,any,3,2,50\n10,0,0,,1,1,1\n")
    j = parse_jobs(text)
    assert j.arrival_s.tolist() == [0.0, 10.0, 50.0]
    assert j.os_mask.tolist() == [15, 15, 0b11]


def test_availability_merges_overlaps():
    c, s, e = parse_availability("client_id,start_s,end_s\na,10,20\nb,0,5\na,15,30\na,40,50\n", ("a", "b"))
    assert list(zip(c.tolist(), s.tolist(), e.tolist(), strict=True)) == [(0, 10, 30), (0, 40, 50), (1, 0, 5)]


@pytest.mark.parametrize("text, needle", [
    ("client_id,cpu,memory_gb,os,speed\n", "header"),
    ("client_id,cpu_ghz,memory_gb,os,speed\nx,fast,4,android,1\n", "line 2, column cpu_ghz"),
    ("client_id,cpu_ghz,memory_gb,os,speed\nx,2,4,android,1\ny,2,4,symbian,1\n", "line 3, column os"),
    ("client_id,cpu_ghz,memory_gb,os,speed\nx,2,4,android,0\n", "line 2, column speed"),
    ("client_id,cpu_ghz,memory_gb,os,speed\nx,2,4,android,1\nx,2,4,ios,1\n", "column client_id"),
    ("client_id,cpu_ghz,memory_gb,os,speed\nx,2,4,android\n", "line 2: 4 columns"),
    ("client_id,cpu_ghz,memory_gb,os,speed\n", "no client"),
])
def test_bad_clients_name_line_and_column(text, needle):
    with pytest.raises(ScenarioError) as e:
        parse_clients(text, name="fleet.csv")
    assert needle in str(e.value) and "--clients-trace" in str(e.value)
    assert "fleet.csv" in str(e.value) or "unknown OS" in str(e.value)


@pytest.mark.parametrize("line, needle", [
    ("0,2,4,android,0,10,5", "column rounds"),
    ("0,2,4,android,5,2.5,5", "column demand"),
    ("-1,2,4,android,5,2,5", "column arrival_s"),
    ("0,2,4,android,5,2,0", "column work"),
    ("0,2,4,android|bsd,5,2,5", "column os"),
])
def test_bad_jobs_name_the_column(line, needle):
    with pytest.raises(ScenarioError) as e:
        parse_jobs("arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work\n" + line + "\n", name="jobs.csv")
    assert needle in str(e.value) and "--jobs-trace" in str(e.value) and "line 2" in str(e.value)


def test_bad_availability():
    with pytest.raises(ScenarioError, match="unknown client 'zz'"):
        parse_availability("client_id,start_s,end_s\nzz,0,1\n", ("a",))
    with pytest.raises(ScenarioError, match="column end_s"):
        parse_availability("client_id,start_s,end_s\na,5,5\n", ("a",))


def test_bad_sizes():
    with pytest.raises(ScenarioError, match="clients"):
        synthetic_population(0, 3)
    with pytest.raises(ScenarioError, match="jobs"):
        synthetic_population(3, 0)
