"""The job manager: jobs register their client requirements and report their rounds.

``POST /jobs`` ``{requirements: {min_cpu_ghz, min_memory_gb, os: [...]}, rounds, demand, work, auto_rounds,
over_selection, round_timeout_s}`` (rounds bind ``ceil(over_selection x demand)`` clients, default 1.3, and fail
after ``round_timeout_s``, default none: :class:`lightrail.fl.rounds.RoundRules`) ->
``{"job": id}`` (round 0 opens at once); ``POST /jobs/{id}/round_start`` opens the current round (jobs registered
with ``auto_rounds: false``); ``POST /jobs/{id}/round_end`` ends it (otherwise a round ends by itself when
``demand`` results arrived, see :func:`lightrail.fl.store.complete`); ``GET /jobs``, ``GET /jobs/{id}``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lightrail.fl import store
from lightrail.fl.model import OSES, os_code
from lightrail.fl.rounds import DEFAULT_OVER_SELECTION
from lightrail.fl.services import Pool, add_error_handler, log_event, parse_args, serve_app, setup_logging

ROLE = "job_manager"


class Requirements(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_cpu_ghz: float = Field(0.0, ge=0)
    min_memory_gb: float = Field(0.0, ge=0)
    os: list[str] = Field(default_factory=lambda: list(OSES))


class Registration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requirements: Requirements = Field(default_factory=Requirements)
    rounds: int = Field(gt=0)
    demand: int = Field(gt=0)
    work: float = Field(1.0, gt=0)
    auto_rounds: bool = True
    over_selection: float = Field(DEFAULT_OVER_SELECTION, ge=1, le=100)
    round_timeout_s: float | None = Field(None, gt=0)
    request_id: str | None = Field(None, min_length=1, max_length=128,
                                   description="Idempotency key: a retried registration gets the same job.")


def os_mask(names: list[str]) -> int:
    mask = 0
    for name in names:
        mask |= 1 << os_code(name, field="requirements.os")
    return mask


def make_app(pool: Pool):
    import fastapi

    from lightrail.errors import ScenarioError

    app = fastapi.FastAPI(title="lightrail fl job manager")
    add_error_handler(app)

    @app.get("/healthz")
    def healthz():
        return {"ok": True, "role": ROLE}

    @app.post("/jobs")
    def register(body: Registration):
        mask = os_mask(body.requirements.os)
        if not mask:
            raise ScenarioError("no OS allowed", field="requirements.os", fix=f"list some of: {', '.join(OSES)}")
        job = pool.run(store.register_job, min_cpu_ghz=body.requirements.min_cpu_ghz,
                       min_memory_gb=body.requirements.min_memory_gb, os_mask=mask, rounds=body.rounds,
                       demand=body.demand, work=body.work, auto_rounds=body.auto_rounds,
                       over_selection=body.over_selection, round_timeout_s=body.round_timeout_s,
                       request_id=body.request_id)
        log_event("job_registered", job=job, rounds=body.rounds, demand=body.demand, os_mask=mask)
        return {"job": job}

    @app.get("/jobs")
    def jobs():
        return pool.run(store.jobs_view)

    @app.get("/jobs/{job}")
    def job_(job: int):
        for j in pool.run(store.jobs_view):
            if j["id"] == job:
                return j
        raise ScenarioError(f"no job {job}", field="job", fix="register it with POST /jobs")

    @app.post("/jobs/{job}/round_start")
    def round_start(job: int):
        out = pool.run(store.start_round, job)
        log_event("round_start", **out)
        return out

    @app.post("/jobs/{job}/round_end")
    def round_end(job: int):
        out = pool.run(store.end_round, job)
        log_event("round_end", **out)
        return out

    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_args(ROLE, argv)
    setup_logging(ROLE)
    pool = Pool(args.db, size=4)
    serve_app(ROLE, make_app(pool), args, on_stop=pool.close)


if __name__ == "__main__":
    main()
