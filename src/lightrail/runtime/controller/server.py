"""The controller process: the rank protocol (JSON lines over TCP) and the HTTP admin API in one
asyncio loop, structured (JSON) logs on stderr, one ``ready`` line on stdout once both listen.

Admin API (FastAPI): ``GET /healthz``, ``GET /state`` (circuits and port owners per device),
``GET /jobs`` (jobs, their groups and who holds them), ``GET /reconfigurations`` (recent ones, with
the ports they changed and the ports that were busy), ``GET /metrics`` (Prometheus text format),
``POST /devices/{device}/circuits`` (an operator's change, validated; nothing changes on error).

FastAPI and uvicorn are the optional extra ``service``: they are imported only when the controller
starts, so the rest of lightrail (and this module) works without them, and a controller started
without them stops with a LightrailError that names the fix.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import logging
import signal
import time

from pydantic import BaseModel, ConfigDict

from lightrail.errors import LightrailError
from lightrail.runtime.controller.config import ControllerConfig
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.protocol import (
    Ack,
    Acquire,
    Bye,
    Group,
    Hello,
    Release,
    encode,
    error_reply,
    parse_request,
)
from lightrail.runtime.controller.store import Store
from lightrail.web import json_logging, start_web

__all__ = ["serve", "admin_app", "metrics_text", "require_service"]

log = logging.getLogger("lightrail.controller")


def require_service(*modules: str) -> tuple:
    """Import ``modules`` of the optional extra ``service`` (default: the admin API's fastapi and uvicorn);
    without them, a LightrailError naming the fix rather than an ImportError traceback."""
    try:
        return tuple(importlib.import_module(name) for name in modules or ("fastapi", "uvicorn"))
    except ImportError as e:
        raise LightrailError(f"{e.name or 'a module'} is not installed; the controller's HTTP admin API (and "
                             f"reading it) needs lightrail's optional extra 'service'", field="controller",
                             fix="pip install 'lightrail[service]'") from None


def _log(what: str, /, **fields) -> None:
    log.info(what, extra={"fields": fields})


async def _handle(controller: Controller, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  connections: dict[tuple[str, int], asyncio.StreamWriter]) -> None:
    """One connection (normally one rank): requests in order; acquires may complete out of order.

    Replies are written without awaiting (one write per reply keeps lines whole); the loop waits for
    the socket to drain only when a slow reader lets the buffer grow. ``connections`` maps each rank
    that said hello to its connection, where the controller pushes revokes.
    """
    ranks: set[tuple[str, int]] = set()

    def send(reply: dict) -> None:
        if not writer.is_closing():
            writer.write(encode(reply))

    def granted(request_id: int, fut: asyncio.Future) -> None:
        if fut.cancelled():
            send({"id": request_id, "ok": False, "error": {"type": "Cancelled", "message": "request dropped",
                                                           "field": "key", "fix": "acquire again"}})
        else:
            send({"id": request_id, "ok": True, "granted": True, **(fut.result() or {})})

    try:
        while line := await reader.readline():
            controller.counters["requests"] += 1
            request_id = 0
            try:
                m = parse_request(line)
                request_id = m.id
                if isinstance(m, Hello):
                    reply = controller.hello(m)
                    ranks.add((m.job, m.rank))
                    connections[(m.job, m.rank)] = writer
                elif isinstance(m, Group):
                    reply = controller.declare(m)
                elif isinstance(m, Acquire):
                    fut = controller.acquire(m)
                    if fut is not None:
                        fut.add_done_callback(functools.partial(granted, m.id))
                        continue
                    reply = {"granted": m.op == "acquire"}
                    lease = controller.lease_of(m.job, m.key, m.rank)
                    if lease is not None and m.op == "acquire":
                        reply["lease"] = lease
                elif isinstance(m, Release):
                    reply = controller.release(m)
                elif isinstance(m, Ack):
                    reply = controller.ack(m)
                elif isinstance(m, Bye):
                    reply = controller.bye(m)
                send({"id": request_id, "ok": True, **reply})
            except LightrailError as e:
                controller.counters["errors"] += 1
                _log("bad_request", error=str(e))
                send(error_reply(request_id, e))
            if writer.transport.get_write_buffer_size() > 1 << 20:
                await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        for job, rank in ranks:
            if connections.get((job, rank)) is writer:
                del connections[(job, rank)]
            controller.disconnect(job, rank)
        writer.close()


def _pusher(connections: dict[tuple[str, int], asyncio.StreamWriter]):
    """The controller's ``notify``: write a pushed message on the rank's connection (if it still has one)."""
    def notify(job: str, rank: int, message: dict) -> None:
        writer = connections.get((job, rank))
        if writer is not None and not writer.is_closing():
            writer.write(encode(message))
    return notify


def metrics_text(controller: Controller) -> str:
    """Prometheus text exposition of the controller's counters, gauges and latency summary."""
    lines = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP lightrail_{name} {help_}", f"# TYPE lightrail_{name} {kind}"])
        lines.extend(f"lightrail_{name}{labels} {value:.9g}" for labels, value in samples)

    c, durable = controller.counters, controller.store.counters()
    metric("requests_total", "counter", "Protocol requests received.", [("", c["requests"])])
    metric("request_errors_total", "counter", "Requests refused with an error.", [("", c["errors"])])
    metric("grants_total", "counter", "Groups granted.", [("", c["grants"])])
    metric("grants_without_change_total", "counter", "Groups granted with their circuits already lit.",
           [("", c["grants_without_change"])])
    metric("leases_total", "counter", "Grants that were leases.", [("", c["leases"])])
    metric("revocations_total", "counter", "Leases revoked for another group.", [("", c["revocations"])])
    metric("rejoins_total", "counter", "Members behind in a revoked lease let in to run their remaining ops.",
           [("", c["rejoins"])])
    metric("unsafe_reconfigurations_total", "counter", "Reconfigurations that changed a port with traffic.",
           [("", c["unsafe_reconfigurations"])])
    metric("reconfigurations_total", "counter", "Reconfigurations per device (persisted).",
           [(f'{{device="{d}"}}', durable.get(f"reconfigurations:{d}", 0.0)) for d in controller.devices])
    metric("circuit_changes_total", "counter", "Inputs whose circuit changed, per device (persisted).",
           [(f'{{device="{d}"}}', durable.get(f"circuit_changes:{d}", 0.0)) for d in controller.devices])
    metric("reconfiguration_seconds_total", "counter", "Time spent reconfiguring (persisted).",
           [("", durable.get("reconfiguration_seconds", 0.0))])
    metric("circuits_lit", "gauge", "Lit circuits per device.",
           [(f'{{device="{d}"}}', len(drv.state())) for d, drv in controller.devices.items()])
    metric("jobs", "gauge", "Registered jobs.", [("", len(controller.jobs))])
    lat = sorted(controller.latencies)
    quantiles = [(f'{{quantile="{q}"}}', lat[min(len(lat) - 1, int(q * len(lat)))]) for q in (0.5, 0.9, 0.99)] \
        if lat else []
    metric("acquire_latency_seconds", "summary", "Acquire to grant, including the wait for the group's members.",
           quantiles)
    lines.append(f"lightrail_acquire_latency_seconds_count {len(lat)}")
    lines.append(f"lightrail_acquire_latency_seconds_sum {sum(lat):.9g}")
    return "\n".join(lines) + "\n"


class Changes(BaseModel):
    """Body of ``POST /devices/{device}/circuits``: input -> output (null darkens), on behalf of ``job``."""

    model_config = ConfigDict(extra="forbid")
    changes: dict[int, int | None]
    job: str | None = None


def admin_app(controller: Controller):
    """The HTTP admin API over ``controller`` (FastAPI app)."""
    fastapi, _ = require_service()
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = fastapi.FastAPI(title="lightrail controller", version="1")

    @app.exception_handler(LightrailError)
    async def _refused(_, e: LightrailError):
        controller.counters["errors"] += 1
        return JSONResponse(error_reply(0, e)["error"], status_code=400)

    @app.get("/healthz")
    def healthz():
        return {"ok": True}

    @app.get("/state")
    def state():
        return controller.state()

    @app.get("/jobs")
    def jobs():
        return controller.jobs_view()

    @app.get("/reconfigurations")
    def reconfigurations():
        return list(controller.applies)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics():
        return metrics_text(controller)

    @app.post("/devices/{device}/circuits")
    def circuits(device: str, body: Changes):
        return controller.configure(device, body.changes, job=body.job)

    return app


async def _serve(config: ControllerConfig, state_path: str, ready) -> None:
    require_service()
    start = time.perf_counter()
    store = Store(state_path)
    connections: dict[tuple[str, int], asyncio.StreamWriter] = {}
    controller = Controller(config, store, log=_log, notify=_pusher(connections))
    server = await asyncio.start_server(lambda r, w: _handle(controller, r, w, connections), config.host, config.port)
    port = server.sockets[0].getsockname()[1]
    web, web_task, admin_port = await start_web(admin_app(controller), config.host, config.admin_port,
                                                what="admin API", access_log=True)
    info = {"host": config.host, "port": port, "admin_port": admin_port, "state": state_path,
            "devices": len(controller.devices), "startup_s": round(time.perf_counter() - start, 4)}
    _log("ready", **info)
    ready(info)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    _log("stopping")
    web.should_exit = True
    server.close()
    await web_task
    store.close()


def serve(config: ControllerConfig, state_path: str, *, ready=None) -> None:
    """Run the controller until SIGTERM/SIGINT; ``ready(info)`` is called once it listens (default:
    print the info as one JSON line on stdout). Without the extra ``service``, a LightrailError first."""
    require_service()  # before the log handler and the event loop: a missing extra is a one-line error
    json_logging(log)
    ready = ready or (lambda info: print(json.dumps({"event": "ready", **info}), flush=True))
    asyncio.run(_serve(config, state_path, ready))
