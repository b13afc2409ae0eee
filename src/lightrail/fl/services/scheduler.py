"""The scheduler: every ``--interval`` (and on ``POST /schedule``) it fails the rounds past their timeout
(:func:`lightrail.fl.store.expire_rounds`), reads the unfinished jobs from the DB and
writes the configured policy's job order (:func:`lightrail.fl.policies.job_order`) into the one ``job_order`` row,
so every client manager reads one consistent order.

Inputs of the order, per unfinished job: arrival (registration time), remaining service = remaining rounds after
the current one x demand + open places of the current round (demand - bound), and the number of known clients
eligible for it (counted in the ``clients`` table). ``GET /order`` shows the last order.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from lightrail.fl import store
from lightrail.fl.policies import Policy, job_order
from lightrail.fl.services import Pool, add_error_handler, log_event, parse_args, serve_app, setup_logging, start_thread

ROLE = "scheduler"

_STATE = ("SELECT j.id, j.arrival, j.rounds, j.round, j.demand, COALESCE(r.bound, 0), "
          "(SELECT count(*) FROM clients c WHERE c.cpu_ghz >= j.min_cpu_ghz AND c.memory_gb >= j.min_memory_gb "
          "AND ((j.os_mask >> c.os) & 1) = 1) "
          "FROM jobs j LEFT JOIN job_rounds r ON r.job = j.id AND r.round = j.round "
          "WHERE j.done_at IS NULL ORDER BY j.id")


class Scheduler:
    def __init__(self, pool: Pool, policy: Policy, seed: int | None = None):
        self.pool, self.policy = pool, policy
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.last: tuple[list[int], int] = ([], 0)
        self.passes = 0

    def schedule(self) -> dict:
        """One pass: read, order, write (skipped when the order did not change)."""
        with self.lock, self.pool.conn() as c:
            for failed in store.expire_rounds(c):  # rounds past their timeout fail and open again
                log_event("round_failed", **failed)
            rows = c.execute(_STATE).fetchall()
            ids = np.array([r[0] for r in rows], dtype=np.int64)
            arrival = np.array([r[1] for r in rows], dtype=float)
            remaining = np.array([max(r[2] - r[3] - 1, 0) * r[4] + max(r[4] - r[5], 0) for r in rows], dtype=np.int64)
            eligible = np.array([r[6] for r in rows], dtype=np.int64)
            order = job_order(self.policy, arrival_s=arrival, remaining_service=remaining, eligible_clients=eligible,
                              rng=self.rng) if len(rows) else np.array([], dtype=np.int64)
            jobs = [int(ids[i]) for i in order]
            self.passes += 1
            if jobs != self.last[0] or self.last[1] == 0:
                version = store.write_order(c, self.policy.value, jobs)
                self.last = (jobs, version)
            return {"policy": self.policy.value, "jobs": jobs, "version": self.last[1],
                    "remaining_service": {int(i): int(s) for i, s in zip(ids, remaining, strict=True)},
                    "eligible_clients": {int(i): int(e) for i, e in zip(ids, eligible, strict=True)}}

    def loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                self.schedule()
            except Exception as e:  # noqa: BLE001 - a pass that failed (DB restarting): log and try again
                log_event("schedule_failed", error=str(e))
                time.sleep(interval)


def make_app(sched: Scheduler):
    import fastapi

    app = fastapi.FastAPI(title="lightrail fl scheduler")
    add_error_handler(app)

    @app.get("/healthz")
    def healthz():
        return {"ok": True, "role": ROLE, "policy": sched.policy.value, "passes": sched.passes}

    @app.post("/schedule")
    def schedule():
        return sched.schedule()

    @app.get("/order")
    def order():
        policy, jobs, version = sched.pool.run(store.read_order)
        return {"policy": policy, "jobs": jobs, "version": version}

    return app


def main(argv: list[str] | None = None) -> None:
    def extra(p):
        p.add_argument("--policy", default="irs")
        p.add_argument("--interval", type=float, default=0.05, help="seconds between passes")
        p.add_argument("--seed", type=int, default=None, help="seed of the random policy")

    args = parse_args(ROLE, argv, extra)
    setup_logging(ROLE)
    policy = Policy.parse(args.policy)
    pool = Pool(args.db, size=2)
    sched = Scheduler(pool, policy, args.seed)
    try:
        sched.schedule()
    except Exception as e:  # noqa: BLE001 - started while the database restarts: the loop tries again
        log_event("schedule_failed", error=str(e))
    stop = threading.Event()
    start_thread(lambda: sched.loop(args.interval, stop), "schedule-loop")

    def on_stop():
        stop.set()
        pool.close()

    serve_app(ROLE, make_app(sched), args, on_stop=on_stop)


if __name__ == "__main__":
    main()
