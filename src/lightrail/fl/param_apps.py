"""The parameter servers' HTTP apps (FastAPI, imported when an app is built): ``root_app`` and ``leaf_app`` over
their states, with lightrail's JSON errors.
"""

from __future__ import annotations

from lightrail.errors import LightrailError
from lightrail.fl.param_leaf import LeafState
from lightrail.fl.param_protocol import Aggregate, ParamServerError, PutModel, Result, SetRound, _error_body, _etag
from lightrail.fl.param_root import RootState


def _base_app(title: str):
    from lightrail.web import require_service

    fastapi, _ = require_service("fastapi", "uvicorn")
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = fastapi.FastAPI(title=title, version="1")

    @app.exception_handler(ParamServerError)
    async def _refused(_, e: ParamServerError):
        return JSONResponse(_error_body(e), status_code=e.status)

    @app.exception_handler(LightrailError)
    async def _bad(_, e: LightrailError):
        return JSONResponse(_error_body(e), status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
        if first.get("type") == "json_invalid":
            name, message = "body", f"is not valid JSON ({first.get('ctx', {}).get('error', first.get('msg'))})"
        else:
            name = loc[0] if loc else "body"
            message = first.get("msg", "invalid") + (f" (at {'.'.join(loc)})" if len(loc) > 1 else "")
        return JSONResponse({"type": "ScenarioError", "message": message, "field": name, "fix": None},
                            status_code=422)

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    return app


def root_app(state: RootState):
    from fastapi import Header, Response

    app = _base_app("lightrail fl root parameter server")

    @app.post("/jobs/{job}/model")
    async def put_model(job: str, body: PutModel):
        return state.put_model(job, body)

    @app.get("/jobs/{job}/model")
    async def get_model(job: str, if_none_match: str | None = Header(default=None)):
        j = state.job(job)
        etag = _etag(j.version)
        headers = {"ETag": etag, "X-Round": str(j.round), "X-Version": str(j.version)}
        if if_none_match == etag:
            return Response(status_code=304, headers=headers)
        j.model_downloads += 1
        state.counters["model_downloads"] += 1
        return Response(j.body, media_type="application/json", headers=headers)

    @app.get("/jobs/{job}/version")
    async def version(job: str):
        return state.version(job)

    @app.post("/jobs/{job}/round")
    async def set_round(job: str, body: SetRound):
        return state.set_round(job, body)

    @app.post("/jobs/{job}/aggregate")
    async def aggregate(job: str, body: Aggregate):
        return state.aggregate(job, body)

    @app.get("/stats")
    async def stats():
        return state.stats()

    return app


def leaf_app(state: LeafState):
    from fastapi import Header, Response

    app = _base_app("lightrail fl leaf parameter server")

    @app.get("/jobs/{job}/model")
    async def get_model(job: str, round: int | None = None,  # noqa: A002 - the query's name
                        if_none_match: str | None = Header(default=None)):
        state.counters["model_requests"] += 1
        m = await state.model(job, newer_than=round)
        headers = {"ETag": m.etag, "X-Round": str(m.round), "X-Version": str(m.version)}
        if if_none_match == m.etag:
            return Response(status_code=304, headers=headers)
        return Response(m.body, media_type="application/json", headers=headers)

    @app.post("/jobs/{job}/result")
    async def result(job: str, body: Result):
        return await state.result(job, body)

    @app.post("/jobs/{job}/flush")
    async def flush(job: str):
        return await state.flush(job)

    @app.post("/flush")
    async def flush_all():
        return {"flushed": await state.flush_all()}

    @app.get("/stats")
    async def stats():
        return state.stats()

    return app
