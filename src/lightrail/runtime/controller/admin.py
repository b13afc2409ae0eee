"""The controller's HTTP admin API (FastAPI, imported only when the app is built): the endpoints listed in
``server.py``'s docstring, operator-token and Host checks, and uvicorn's connection bounds (``guarded_http``).
"""

from __future__ import annotations

import asyncio
import hmac
import re

from pydantic import BaseModel, ConfigDict, Field

from lightrail.errors import InfeasibleError, LightrailError, ScenarioError
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.metrics import Metrics, RateLog, _log
from lightrail.runtime.controller.protocol import MAX_NAME, Bye, error_reply
from lightrail.runtime.controller.ranks import RankServer
from lightrail.web import require_service

ADMIN_MAX_CONNECTIONS = 32
"""Admin API connections at once, within ``FD_RESERVE`` (the rank connections are capped below the fd limit by it):
past it, the oldest connection with no request in progress makes room (issue 31: half-open requests held 3,000
descriptors and /healthz failed at a 1,024-fd limit)."""


ADMIN_HEADER_TIMEOUT_S = 10.0
"""An admin connection with no request in progress this long after it opened or its last response is closed (a
request's headers must arrive within it; uvicorn has no header timeout)."""


class Changes(BaseModel):
    """Body of ``POST /devices/{device}/circuits``: input -> output (null darkens), on behalf of ``job``."""

    model_config = ConfigDict(extra="forbid")
    changes: dict[int, int | None]
    job: str | None = None


class NewJob(BaseModel):
    """Body of ``POST /jobs``."""

    model_config = ConfigDict(extra="forbid")
    job: str = Field(min_length=1, max_length=MAX_NAME)
    world: int = Field(ge=1, le=1 << 20)
    spares: int = Field(0, ge=0, le=1 << 20)


_OPEN = {("GET", "/healthz"), ("GET", "/metrics")}


_HOST = re.compile(r"(?:\[([0-9a-f:.]+)\]|([a-z0-9._-]+))(?::[0-9]{1,5})?")


def _host_name(host: str) -> str | None:
    """``Host`` header -> host name, exactly: ``[::1]:80`` -> ``::1``, ``localhost:7601`` -> ``localhost``; None
    for anything else (a non-numeric port, a bare IPv6 address, text around the name)."""
    m = _HOST.fullmatch(host.strip().lower())
    if m is None:
        return None
    if m.group(1) is not None:  # [v6] with an optional port
        return m.group(1)
    return m.group(2)


def _status(e: LightrailError) -> int:
    """507 when the state file's disk is full, 503 when it is busy (the server's trouble, not the request's), 409
    for a conflict with the state (a job registered twice, a port still switching), 400 otherwise."""
    if e.field == "state":
        return 507 if "full" in e.message else 503
    fix = e.fix or ""
    return 409 if isinstance(e, InfeasibleError) and (fix.startswith("retry after") or e.field == "job") else 400


def guarded_http(max_connections: int = ADMIN_MAX_CONNECTIONS, header_timeout: float = ADMIN_HEADER_TIMEOUT_S):
    """uvicorn's HTTP protocol with the bounds it lacks: at most ``max_connections`` at once (a new one past it
    closes the oldest with no request in progress, so a flood of half-open requests cannot lock /healthz out; if
    every one is busy, the new one is closed), and a connection with no request in progress ``header_timeout``
    after it opened or its last response is closed."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    live: dict = {}  # connection -> None, oldest first

    class Guarded(AutoHTTPProtocol):
        _timer = None
        _refused = False

        def _busy(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def connection_made(self, transport) -> None:
            if len(live) >= max_connections:
                idle = next((c for c in live if not c._busy()), None)
                if idle is None:
                    self._refused = True
                    transport.close()
                    return
                idle._expire(force=True)
            live[self] = None
            super().connection_made(transport)
            self._timer = asyncio.get_running_loop().call_later(header_timeout, self._expire)

        def _expire(self, force: bool = False) -> None:
            if not force and self._busy():
                self._timer = asyncio.get_running_loop().call_later(header_timeout, self._expire)
                return
            live.pop(self, None)
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc) -> None:
            if self._refused:
                return
            live.pop(self, None)
            if self._timer is not None:
                self._timer.cancel()
            super().connection_lost(exc)

    return Guarded


def admin_app(controller: Controller, *, token: str | None = None, server: RankServer | None = None):
    """The HTTP admin API over ``controller`` (FastAPI app); ``token`` defaults to the config's
    ``operator_token`` (with neither, every guarded endpoint refuses)."""
    fastapi, _, prometheus_client = require_service()
    from fastapi.responses import JSONResponse, Response

    token = token or controller.config.operator_token
    hosts = {h.lower().strip("[]") for h in [*controller.config.allowed_hosts, controller.config.host]}
    metrics = getattr(controller, "metrics", None) or Metrics(controller, server)
    controller.metrics = metrics  # metrics_text(controller) reads the same registry
    rlog = server.rlog if server is not None else RateLog()
    app = fastapi.FastAPI(title="lightrail controller", version="1")

    def refused(status: int, message: str, field_: str, fix: str):
        return JSONResponse({"type": "ScenarioError", "message": message, "field": field_, "fix": fix},
                            status_code=status)

    @app.middleware("http")
    async def guard(request, call_next):
        host = request.headers.get("host", "")
        peer = request.client.host if request.client else "?"
        if _host_name(host) not in hosts:
            rlog("admin_refused", peer=peer, path=request.url.path, field="Host", host=host[:200])
            return refused(400, f"Host {host[:200]!r} is not one of this controller's names", "Host",
                           f"use one of {', '.join(sorted(hosts))} (allowed_hosts in the config)")
        if (request.method, request.url.path) not in _OPEN:
            got = request.headers.get("authorization", "")
            ok = token is not None and got.startswith("Bearer ") and hmac.compare_digest(
                got[7:].strip().encode(), token.encode())
            if not ok:
                rlog("admin_refused", peer=peer, path=request.url.path, method=request.method, field="Authorization")
                return refused(401, "missing or wrong operator token", "Authorization",
                               "send 'Authorization: Bearer <operator token>' (the ready line's operator_token)")
        return await call_next(request)

    @app.exception_handler(LightrailError)
    async def _refused(_, e: LightrailError):
        controller.counters["errors"] += 1
        return JSONResponse(error_reply(0, e)["error"], status_code=_status(e))

    # Every route is ``async def``: FastAPI runs a plain ``def`` route in a worker thread, and the controller's
    # state is the event loop's alone (a rank request could interleave with an admin change mid-update).
    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    @app.get("/state")
    async def state():
        return controller.state()

    @app.get("/jobs")
    async def jobs():
        return controller.jobs_view()

    issued: dict[str, tuple[int, int, str]] = {}  # job -> (world, spares, token) while no rank said hello with it

    @app.post("/jobs")
    async def register(body: NewJob):
        # A POST retried after its reply was lost gets the first one's answer (issue 31), not a second registration
        # that voids the token the first issued: same job, same world and spares, that token still the job's, and
        # no rank has said hello yet (after one, registering again starts the job afresh, as before). The token is
        # kept in memory only (the state file holds its sha256): a retry across a controller restart gets a new one.
        for name in [j for j in issued if controller.jobs.get(j, {}).get("ranks", True)]:
            del issued[name]  # ended, or running: no retry of its registration is answered from here
        prior = issued.get(body.job)
        if prior is not None and prior[:2] == (body.world, body.spares) and controller.authenticate(body.job, prior[2]):
            _log("job_registered", job=body.job, world=body.world, spares=body.spares, repeated=True)
            return {"job": body.job, "world": body.world, "spares": body.spares, "token": prior[2]}
        secret = controller.register_job(body.job, body.world, body.spares)
        issued[body.job] = (body.world, body.spares, secret)
        _log("job_registered", job=body.job, world=body.world, spares=body.spares)
        return {"job": body.job, "world": body.world, "spares": body.spares, "token": secret}

    @app.delete("/jobs/{job}")
    async def end_job(job: str):
        if job not in controller.jobs:
            raise ScenarioError(f"unknown job {job!r}", field="job", fix="GET /jobs lists them")
        ranks = [r for (j, r) in (server.bound if server is not None else {}) if j == job]
        for r in ranks:  # tell its connected ranks, then nobody speaks for the job any more
            controller.notify(job, r, {"op": "dead", "job": job, "rank": r, "reason": "the operator ended the job"})
        reply = controller.bye(Bye(op="bye", job=job))
        if server is not None:
            for r in ranks:
                conn = server.bound.pop((job, r), None)
                if conn is not None:
                    conn.bound = None
        _log("job_ended", job=job, ranks=len(ranks))
        return {"job": job, **reply}

    @app.get("/reconfigurations")
    async def reconfigurations():
        return list(controller.applies)

    @app.get("/metrics")
    async def metrics_():
        return Response(metrics.text(), media_type=_content_type(prometheus_client))

    @app.post("/devices/{device}/circuits")
    async def circuits(device: str, body: Changes):
        return controller.configure(device, body.changes, job=body.job)

    @app.post("/devices/{device}/ports/{port}/fail")
    async def port_fail(device: str, port: int):
        return _port_call(controller, "port_failed", device, port)

    @app.post("/devices/{device}/ports/{port}/repair")
    async def port_repair(device: str, port: int):
        return _port_call(controller, "port_repaired", device, port)

    return app


def _content_type(prometheus_client) -> str:
    """The text format generate_latest writes (0.0.4; prometheus_client >= 0.22 names 1.0.0 "latest")."""
    exposition = prometheus_client.exposition
    return getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", prometheus_client.CONTENT_TYPE_LATEST)


def _port_call(controller: Controller, method: str, device: str, port: int) -> dict:
    call = getattr(controller, method, None)
    if call is None:
        raise ScenarioError(f"this controller has no {method}", field="device", fix="upgrade lightrail")
    out = call(device, port)
    _log(method, device=device, port=port)
    return {"device": device, "port": port, **(out or {})}
