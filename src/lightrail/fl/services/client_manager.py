"""A client manager: clients check in and report results here (through the load balancer). Several run at once;
they share nothing but PostgreSQL, where binding is atomic (:func:`lightrail.fl.store.bind`).

``POST /checkin`` ``{client_id, cpu_ghz, memory_gb, os}``: upserts the client; a client that already holds an
active binding gets it back; otherwise the manager reads the scheduler's order, keeps the jobs whose current round
has free places, and offers the client the first one it is eligible for (:func:`lightrail.fl.policies.offer` over
:func:`lightrail.fl.model.eligibility`); if binding finds the round full (another manager won the last place), the
next job is tried. Under ``static`` the only candidate is the client's partition job. Replies
``{job, round, leaf_url}`` or ``{job: null}``.

``POST /result`` ``{client_id, job, round}``: frees the binding and counts the result (the round ends at
``demand`` results; a result for a round that ended first is late: ``{late: true}``, counted and discarded).
409 if the client holds no such binding.
"""

from __future__ import annotations

import time

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from lightrail.fl import store
from lightrail.fl.model import Clients, Jobs, eligibility, os_code
from lightrail.fl.policies import offer
from lightrail.fl.services import Pool, add_error_handler, log_event, parse_args, serve_app, setup_logging

ROLE = "client_manager"


class Checkin(BaseModel):
    model_config = ConfigDict(extra="forbid")
    client_id: str = Field(min_length=1, max_length=200)
    cpu_ghz: float = Field(ge=0)
    memory_gb: float = Field(ge=0)
    os: str


class Result(BaseModel):
    model_config = ConfigDict(extra="forbid")
    client_id: str = Field(min_length=1, max_length=200)
    job: int
    round: int


class Leaves:
    """The parameter-server leaves (from the ``services`` table), re-read at most once a second."""

    def __init__(self, pool: Pool):
        self.pool, self.urls, self.read_at = pool, [], 0.0

    def url(self, conn, job: int) -> str | None:
        if time.monotonic() - self.read_at > 1.0:
            self.urls = [s["url"] for s in store.services(conn, "leaf")]
            self.read_at = time.monotonic()
        return self.urls[job % len(self.urls)] if self.urls else None


def checkin(conn, body: Checkin, *, manager: str, leaves: Leaves | None = None) -> dict:
    os_i = os_code(body.os, field="os")
    store.upsert_client(conn, body.client_id, body.cpu_ghz, body.memory_gb, os_i)

    def reply(job, rnd, **extra):
        leaf = leaves.url(conn, job) if (leaves and job is not None) else None
        return {"job": job, "round": rnd, "leaf_url": leaf, "manager": manager, **extra}

    held = store.active_binding(conn, body.client_id)
    if held:
        return reply(*held, already=True)
    policy, order, version = store.read_order(conn)
    if policy == "static":
        part = store.assign_partition(conn, body.client_id)
        order = [part] if part is not None and part in order else []
    cands = store.checkin_candidates(conn, order)
    if cands:
        n = len(cands)
        jobs = Jobs(min_cpu_ghz=np.array([r[2] for r in cands]), min_memory_gb=np.array([r[3] for r in cands]),
                    os_mask=np.array([r[4] for r in cands], dtype=np.int64), rounds=np.ones(n, dtype=np.int64),
                    demand=np.ones(n, dtype=np.int64), work=np.ones(n), arrival_s=np.zeros(n))
        me = Clients(np.array([body.cpu_ghz]), np.array([body.memory_gb]), np.array([os_i]), np.ones(1))
        eligible = eligibility(me, jobs)[0]
        still_open = np.ones(n, dtype=bool)
        positions = np.arange(n)  # candidates are already in the scheduler's order
        while (k := offer(positions, eligible, still_open)) >= 0:
            job, rnd = int(cands[k][0]), int(cands[k][1])
            got = store.bind(conn, body.client_id, job, rnd, manager=manager)
            if got == "bound":
                return reply(job, rnd, order_version=version)
            if got == "busy":  # a concurrent check-in of the same client won
                held = store.active_binding(conn, body.client_id)
                if held:
                    return reply(*held, already=True)
            still_open[k] = False
    return {"job": None, "round": None, "leaf_url": None, "manager": manager, "order_version": version}


def make_app(pool: Pool, name: str):
    import fastapi
    from fastapi.responses import JSONResponse

    app = fastapi.FastAPI(title="lightrail fl client manager")
    add_error_handler(app)
    leaves = Leaves(pool)
    counters = {"checkins": 0, "bindings": 0, "results": 0, "late_results": 0}

    @app.get("/healthz")
    def healthz():
        return {"ok": True, "role": ROLE, "name": name, **counters}

    @app.post("/checkin")
    def checkin_(body: Checkin):
        counters["checkins"] += 1
        out = pool.run(checkin, body, manager=name, leaves=leaves)
        if out["job"] is not None and not out.get("already"):
            counters["bindings"] += 1
        return out

    @app.post("/result")
    def result(body: Result):
        out = pool.run(store.complete, body.client_id, body.job, body.round)
        if out is None:
            return JSONResponse({"error": {"type": "Conflict", "message": f"client {body.client_id!r} holds no "
                                           f"binding to job {body.job} round {body.round}", "field": "client_id",
                                           "fix": "check in first"}}, status_code=409)
        counters["late_results" if out["late"] else "results"] += 1
        if out["round_ended"]:
            log_event("round_ended", job=out["job"], round=out["round"], done=out["done"])
        return out

    return app


def main(argv: list[str] | None = None) -> None:
    def extra(p):
        p.add_argument("--connections", type=int, default=8, help="DB connections (concurrent requests)")

    args = parse_args(ROLE, argv, extra)
    setup_logging(ROLE)
    pool = Pool(args.db, size=args.connections)
    serve_app(ROLE, make_app(pool, args.name or ROLE), args, on_stop=pool.close)


if __name__ == "__main__":
    main()
