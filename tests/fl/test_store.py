"""The binding transaction of the fl control plane against a real PostgreSQL: under many concurrent threads
(one connection each) a round never gets more than ``demand`` clients and a client never holds two jobs; a
randomized sequence checked against a model; the static policy binds a client only to its partition job."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightrail.fl import store
from lightrail.fl.policies import static_partition
from lightrail.fl.services.client_manager import Checkin, checkin

ALL_OS = 0b1111


def _job(conn, rounds=1, demand=25, auto=True, over_selection=1.0, round_timeout_s=None, **req):
    """A job; without over-selection unless asked, so a round's places are its demand."""
    return store.register_job(conn, min_cpu_ghz=req.get("cpu", 0.0), min_memory_gb=req.get("mem", 0.0),
                              os_mask=req.get("os_mask", ALL_OS), rounds=rounds, demand=demand, auto_rounds=auto,
                              over_selection=over_selection, round_timeout_s=round_timeout_s)


def _run_threads(n, target):
    errors: list[BaseException] = []

    def wrap(k):
        try:
            target(k)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]


def test_forty_threads_fill_every_round_exactly(pg, db):
    """40 threads check in 400 clients (each client by two threads at once) against 8 rounds of demand 25:
    exactly 25 bindings per round, 200 clients bound, none twice."""
    jobs = [_job(db) for _ in range(8)]
    clients = [f"c{i}" for i in range(400)]
    for c in clients:
        store.upsert_client(db, c, 2.0, 4.0, 0)
    log: list[tuple[str, int]] = []
    lock = threading.Lock()

    def worker(k):
        rng = random.Random(k)
        mine = clients[(k % 20) * 20:(k % 20) * 20 + 20]  # threads k and k + 20 share their clients
        with store.connect(pg.uri) as conn:
            for c in rng.sample(mine, len(mine)):
                for j in rng.sample(jobs, len(jobs)):
                    got = store.bind(conn, c, j, 0, manager=f"t{k}")
                    if got == "bound":
                        with lock:
                            log.append((c, j))
                    if got in ("bound", "busy"):
                        break

    _run_threads(40, worker)
    per_round = dict(db.execute("SELECT job, bound FROM job_rounds").fetchall())
    assert per_round == {j: 25 for j in jobs}
    rows = db.execute("SELECT client_id, job FROM bindings").fetchall()
    assert len(rows) == 200 and sorted(rows) == sorted(log)
    assert len({c for c, _ in log}) == 200, "a client was bound twice"
    counts = db.execute("SELECT job, count(*) FROM bindings GROUP BY job").fetchall()
    assert all(n == 25 for _, n in counts)
    assert store.double_bookings(db)["total"] == 0


def test_bind_release_cycles_never_double_book(pg, db):
    """Threads bind random clients (shared by all threads) to random jobs and post results, so rounds end and
    new ones open while others bind: per round at most demand bindings, exactly demand results for every ended
    round, and no client ever holds two bindings at once (the DB's intervals and the threads' log agree)."""
    jobs = [_job(db, rounds=4, demand=25) for _ in range(4)]
    clients = [f"k{i}" for i in range(120)]
    for c in clients:
        store.upsert_client(db, c, 2.0, 4.0, 1)
    log: list[tuple[str, int, int, float, float]] = []
    lock = threading.Lock()

    def worker(k):
        rng = random.Random(1000 + k)
        with store.connect(pg.uri) as conn:
            for _ in range(60):
                c, j = rng.choice(clients), rng.choice(jobs)
                rnd = conn.execute("SELECT round FROM jobs WHERE id = %s", (j,)).fetchone()[0]
                t0 = time.monotonic()
                if store.bind(conn, c, j, rnd, manager=f"t{k}") != "bound":
                    continue
                time.sleep(rng.random() * 0.002)
                out = store.complete(conn, c, j, rnd)
                with lock:
                    log.append((c, j, rnd, t0, time.monotonic()))
                assert out is not None, "a binding vanished before its result"

    _run_threads(40, worker)
    assert store.double_bookings(db)["total"] == 0
    over = db.execute("SELECT r.job, r.round, r.demand, count(b.id), r.results, r.ended_at FROM job_rounds r "
                      "LEFT JOIN bindings b ON b.job = r.job AND b.round = r.round "
                      "GROUP BY r.job, r.round, r.demand, r.results, r.ended_at").fetchall()
    for job, rnd, demand, n, results, ended in over:
        assert n <= demand
        if ended is not None:
            assert results == demand == n, (job, rnd)
    assert sum(1 for _ in log) == db.execute("SELECT count(*) FROM bindings").fetchone()[0]
    assert any(r[5] is not None for r in over), "no round ended: the stress did not exercise round changes"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["bind", "result", "end"]), st.integers(0, 5), st.integers(0, 2)),
                    min_size=1, max_size=40))
def test_random_sequences_match_a_model(pg, ops):
    """Any sequence of binds, results and round ends leaves the DB as a plain model says: a bind succeeds iff
    the job's current round has a free place ("full" otherwise, checked first) and the client is free ("busy")."""
    with store.connect(pg.uri) as db:
        db.execute("TRUNCATE bindings, job_rounds, clients, jobs, job_order RESTART IDENTITY CASCADE")
        jobs = [_job(db, rounds=3, demand=2) for _ in range(3)]
        for c in range(6):
            store.upsert_client(db, f"h{c}", 2.0, 4.0, 0)
        rnd = {j: 0 for j in jobs}
        bound = {j: 0 for j in jobs}
        results = {j: 0 for j in jobs}
        holds: dict[int, tuple[int, int]] = {}
        for op, c, jx in ops:
            j, cid = jobs[jx], f"h{c}"
            done = rnd[j] >= 3
            if op == "bind":
                want = "full" if done or bound[j] >= 2 else ("busy" if c in holds else "bound")
                assert store.bind(db, cid, j, min(rnd[j], 2)) == want
                if want == "bound":
                    holds[c] = (j, rnd[j])
                    bound[j] += 1
            elif op == "result":
                held = holds.get(c)
                out = store.complete(db, cid, *held) if held else store.complete(db, cid, j, rnd[j])
                # without a binding: None, or the first verdict again for a result sent before (a retry)
                assert (out is None or out.get("duplicate") is True) == (held is None)
                if held:
                    hj = held[0]
                    del holds[c]
                    results[hj] += 1
                    if results[hj] == 2:
                        _advance_model(hj, rnd, bound, results, holds)
            else:
                if done:
                    continue
                store.end_round(db, j)
                _advance_model(j, rnd, bound, results, holds)
            assert store.double_bookings(db)["total"] == 0
            active = dict(((int(c[1:]), (jb, r)) for c, jb, r in
                           db.execute("SELECT client_id, job, round FROM bindings WHERE done_at IS NULL")))
            assert active == holds


def _advance_model(j, rnd, bound, results, holds):
    for c, (hj, _) in list(holds.items()):
        if hj == j:
            del holds[c]  # an ended round releases its unreported bindings
    rnd[j] += 1
    bound[j] = results[j] = 0


def test_static_binds_only_to_the_partition_job(db):
    """Under ``static``, clients are dealt to jobs like policies.static_partition (in check-in order) and a
    client whose job is full gets nothing even though another job has room."""
    a, b = _job(db, demand=2), _job(db, demand=10)
    store.write_order(db, "static", [a, b])
    body = dict(cpu_ghz=2.0, memory_gb=4.0, os="android")
    got = [checkin(db, Checkin(client_id=f"s{i}", **body), manager="t")["job"] for i in range(6)]
    parts = [db.execute("SELECT partition_job FROM clients WHERE id = %s", (f"s{i}",)).fetchone()[0]
             for i in range(6)]
    ref = static_partition(np.ones((6, 2), dtype=bool))
    assert parts == [[a, b][k] for k in ref]
    assert got == [a, b, a, b, None, b]  # s4 belongs to a, whose round (demand 2) is full; b still has room
    assert db.execute("SELECT bound FROM job_rounds WHERE job = %s", (b,)).fetchone()[0] == 3


def test_static_partition_respects_eligibility(db):
    picky = _job(db, demand=5, cpu=3.0)
    easy = _job(db, demand=5)
    store.write_order(db, "static", [picky, easy])
    slow = checkin(db, Checkin(client_id="slow", cpu_ghz=2.0, memory_gb=4.0, os="ios"), manager="t")
    fast = checkin(db, Checkin(client_id="fast", cpu_ghz=3.5, memory_gb=4.0, os="ios"), manager="t")
    assert slow["job"] == easy and fast["job"] == picky


def test_over_selection_late_results_and_timeouts_as_the_simulator_runs_them(db):
    """RoundRules in the database: demand 2 binds 3 places; the round ends at the 2nd result, the 3rd client's
    result is late (counted, discarded); a round past its timeout fails, releases its clients and opens again."""
    import time

    j = _job(db, rounds=2, demand=2, over_selection=1.3)
    for c in ("a", "b", "c"):
        store.upsert_client(db, c, 2.0, 4.0, 0)
        assert store.bind(db, c, j, 0) == "bound"
    store.upsert_client(db, "d", 2.0, 4.0, 0)
    assert store.bind(db, "d", j, 0) == "full"  # 3 places, all taken
    assert store.complete(db, "a", j, 0)["round_ended"] is False
    assert store.complete(db, "b", j, 0)["round_ended"] is True  # demand results: the round ends, c is out
    late = store.complete(db, "c", j, 0)
    assert late["late"] is True and late["late_results"] == 1
    assert db.execute("SELECT results, late FROM job_rounds WHERE job = %s AND round = 0", (j,)).fetchone() == (2, 1)
    again = store.complete(db, "c", j, 0)  # a retry: the same verdict, counted once
    assert again["late"] is True and again["duplicate"] is True
    assert db.execute("SELECT late FROM job_rounds WHERE job = %s AND round = 0", (j,)).fetchone() == (1,)
    assert store.bind(db, "c", j, 1) == "bound"  # free again, for round 1
    # timeout: round 0 of a second job fails after 0.2 s; its result is discarded, its straggler late
    k = _job(db, rounds=1, demand=2, round_timeout_s=0.2)
    assert store.bind(db, "d", k, 0) == "bound"
    store.upsert_client(db, "e", 2.0, 4.0, 0)
    assert store.bind(db, "e", k, 0) == "bound"
    assert store.complete(db, "d", k, 0)["late"] is False
    assert store.expire_rounds(db) == []
    time.sleep(0.25)
    assert store.expire_rounds(db) == [{"job": k, "round": 0}]
    assert db.execute("SELECT bound, results, failed, ended_at FROM job_rounds WHERE job = %s", (k,)).fetchone() == \
        (0, 0, 1, None)
    assert store.complete(db, "e", k, 0)["late"] is True
    assert store.bind(db, "d", k, 0) == "bound"  # the retried round takes clients again
    assert store.double_bookings(db)["total"] == 0


def test_a_registration_retried_with_its_request_id_gets_the_same_job_and_a_different_job_is_refused(db):
    """A reply lost after the commit: the retry with the same idempotency key finds the first job, opens no second
    round 0; the key reused for another job is refused naming ``request_id``; without a key every call is new."""
    import pytest

    from lightrail.errors import ScenarioError

    spec = {"min_cpu_ghz": 0.0, "min_memory_gb": 0.0, "os_mask": ALL_OS, "rounds": 3, "demand": 5}
    first = store.register_job(db, **spec, request_id="run-0")
    assert store.register_job(db, **spec, request_id="run-0") == first
    with pytest.raises(ScenarioError) as info:
        store.register_job(db, **{**spec, "demand": 6}, request_id="run-0")
    assert info.value.field == "request_id"
    other = store.register_job(db, **spec)
    assert store.register_job(db, **spec) != other != first
    assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 3
    assert db.execute("SELECT count(*) FROM job_rounds WHERE job = %s", (first,)).fetchone()[0] == 1
