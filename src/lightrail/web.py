"""What every HTTP service of lightrail shares (the controller's admin API, the FL services, the parameter
servers): importing the optional extra ``service`` with an error that names the fix (``require_service``), JSON log
lines, and starting uvicorn inside a running event loop and learning its port."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys

from lightrail.errors import LightrailError

__all__ = ["JsonFormatter", "json_logging", "require_service", "start_web"]


def require_service(*modules: str) -> tuple:
    """Import ``modules`` of the optional extra ``service`` (default: the admin API's fastapi, uvicorn and
    prometheus_client); without them, a LightrailError naming the fix rather than an ImportError traceback."""
    try:
        return tuple(importlib.import_module(name)
                     for name in modules or ("fastapi", "uvicorn", "prometheus_client"))
    except ImportError as e:
        raise LightrailError(f"{e.name or 'a module'} is not installed; the controller's HTTP admin API (and "
                             f"reading it) needs lightrail's optional extra 'service'", field="controller",
                             fix="pip install 'lightrail[service]'") from None


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: ``{"ts", "level", "event", **record.fields}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 6), "level": record.levelname.lower(), "event": record.getMessage()}
        entry.update(getattr(record, "fields", {}))
        return json.dumps(entry, default=str)


def json_logging(log: logging.Logger) -> None:
    """Send ``log``'s records to stderr as JSON lines (and nowhere else)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


async def start_web(app, host: str, port: int, *, what: str, lifespan: str = "off", access_log: bool = False,
                    sock=None, **options):
    """Serve ``app`` with uvicorn on ``host:port`` (0: any free port) in the running loop; returns
    ``(server, task, port)`` once it listens. A bind error is raised here, not lost in the task; stop it with
    ``server.should_exit = True`` and ``await task``. ``sock``: a listening socket to serve on instead (a
    supervisor's, handed down so a replaced process keeps its predecessor's address). ``options``: more
    ``uvicorn.Config`` settings (the controller's connection bounds: ``http``, ``timeout_keep_alive``...)."""
    import uvicorn

    web = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan,
                                        access_log=access_log, **options))
    task = asyncio.create_task(web.serve(sockets=[sock] if sock is not None else None))
    while not web.started:
        if task.done():
            await task  # raises the bind error
            raise OSError(f"{what} did not start on port {port}")
        await asyncio.sleep(0.01)
    return web, task, web.servers[0].sockets[0].getsockname()[1]
