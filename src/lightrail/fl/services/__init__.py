"""The federated-learning control plane's services, one process each (FastAPI + uvicorn on loopback), all
sharing their state through PostgreSQL (:mod:`lightrail.fl.store`):

- :mod:`~lightrail.fl.services.job_manager`: jobs register and report rounds.
- :mod:`~lightrail.fl.services.scheduler`: writes the policy's job order into the DB every ``--interval``.
- :mod:`~lightrail.fl.services.client_manager`: check-ins and results; binds clients to jobs atomically.
- :mod:`~lightrail.fl.services.load_balancer`: the front door; forwards to the live client managers.

Each is started as ``python -m lightrail.fl.services.<name> --db URI --port 0 [...]``, prints one JSON line
``{"event": "ready", "role": ..., "port": ..., "pid": ...}`` on stdout once it listens, writes JSON log lines on
stderr, and stops cleanly on SIGTERM/SIGINT. This module holds what they share: argument parsing, the JSON
logger, a small connection pool, the error reply and the serve loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable

from lightrail.errors import LightrailError
from lightrail.web import json_logging, start_web

__all__ = ["ROLES", "Pool", "log_event", "parse_args", "serve_app", "error_body", "add_error_handler"]

ROLES = ("job_manager", "scheduler", "client_manager", "load_balancer")

log = logging.getLogger("lightrail.fl")


def setup_logging(role: str) -> None:
    json_logging(log)
    log.role = role  # type: ignore[attr-defined]


def log_event(what: str, /, **fields) -> None:
    """One JSON log line on stderr: ``{"ts", "level", "event": what, "role", "pid", **fields}``."""
    log.info(what, extra={"fields": {"role": getattr(log, "role", None), "pid": os.getpid(), **fields}})


def parse_args(role: str, argv: list[str] | None, extra: Callable[[argparse.ArgumentParser], None] | None = None):
    p = argparse.ArgumentParser(prog=f"python -m lightrail.fl.services.{role}")
    p.add_argument("--db", required=True, help="PostgreSQL URI")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--name", default=None, help="this instance's name in logs and bindings")
    p.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket (a supervisor's: "
                   "a replacement keeps its predecessor's address) instead of --host/--port")
    if extra:
        extra(p)
    return p.parse_args(argv)


DB_RETRY_S = 20.0
"""How long a request waits for a lost database (restarted by the supervisor) before it answers 503."""


class Pool:
    """A few psycopg connections shared by the request threads (opened lazily; a broken one is replaced)."""

    def __init__(self, uri: str, size: int = 8, retry_s: float = DB_RETRY_S):
        self.uri, self.retry_s = uri, retry_s
        self._q: queue.LifoQueue = queue.LifoQueue()
        for _ in range(size):
            self._q.put(None)

    @contextlib.contextmanager
    def conn(self):
        import psycopg

        from lightrail.fl.store import connect

        c = self._q.get()
        try:
            if c is None or c.closed:
                c = connect(self.uri)
            yield c
        except (psycopg.OperationalError, psycopg.InterfaceError):
            with contextlib.suppress(Exception):
                c.close()
            c = None
            raise
        finally:
            self._q.put(c)

    def run(self, fn: Callable, *args, **kwargs):
        """``fn(conn, *args, **kwargs)``, retried on a fresh connection while the database is unreachable (it is
        being restarted), for up to ``retry_s`` seconds; then the last error (the app answers 503). A transaction
        cut off by the outage either committed or did not: every store operation is safe to run again (a repeated
        check-in returns the binding it made, a repeated result its first verdict)."""
        import psycopg

        deadline, pause = time.monotonic() + self.retry_s, 0.05
        while True:
            try:
                with self.conn() as c:
                    return fn(c, *args, **kwargs)
            except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                if time.monotonic() + pause > deadline:
                    raise psycopg.OperationalError(str(e)) from e
                log_event("db_retry", error=str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def close(self) -> None:
        while not self._q.empty():
            c = self._q.get_nowait()
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()


def error_body(e: LightrailError) -> dict:
    return {"error": {"type": type(e).__name__, "message": e.message, "field": e.field, "fix": e.fix}}


def add_error_handler(app) -> None:
    """LightrailError -> 400 with ``{"error": {type, message, field, fix}}``; a lost DB -> 503."""
    import psycopg
    from fastapi.responses import JSONResponse

    @app.exception_handler(LightrailError)
    async def _refused(_, e: LightrailError):
        return JSONResponse(error_body(e), status_code=400)

    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(psycopg.InterfaceError)
    async def _db(_, e: psycopg.Error):
        log_event("db_error", error=str(e))
        return JSONResponse({"error": {"type": "Unavailable", "message": f"database unreachable: {e}", "field": "db",
                                       "fix": "retry shortly (the supervisor restarts the database)"}},
                            status_code=503)


def serve_app(role: str, app, args, *, on_stop: Callable[[], None] | None = None) -> None:
    """Listen on ``args.host:args.port``, print the ready line, run until SIGTERM/SIGINT."""
    asyncio.run(_serve(role, app, args, on_stop))


async def _serve(role: str, app, args, on_stop) -> None:
    start = time.perf_counter()
    sock = None
    if getattr(args, "fd", None) is not None:
        import socket

        sock = socket.socket(fileno=args.fd)
    web, task, port = await start_web(app, args.host, args.port, what=role, lifespan="on", sock=sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    info = {"role": role, "name": args.name or role, "host": args.host, "port": port, "pid": os.getpid(),
            "startup_s": round(time.perf_counter() - start, 4)}
    log_event("ready", **info)
    print(json.dumps({"event": "ready", **info}), flush=True)
    await stop.wait()
    log_event("stopping")
    web.should_exit = True
    await task
    if on_stop:
        on_stop()


def start_thread(fn: Callable[[], None], name: str) -> threading.Thread:
    t = threading.Thread(target=fn, name=name, daemon=True)
    t.start()
    return t
