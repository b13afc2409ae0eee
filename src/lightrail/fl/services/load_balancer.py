"""The load balancer: the clients' front door. ``POST /checkin`` and ``POST /result`` go to the client managers
round-robin (httpx.AsyncClient); a manager that refuses the connection is skipped (the next one gets the request)
and the list is re-read. The list of live managers is read from the ``services`` table, which the supervisor
rewrites when it replaces one, so a replacement is picked up within ``--refresh`` seconds (or at once after a
connection error). ``GET /managers`` shows the current list.
"""

from __future__ import annotations

import asyncio
import itertools
import time

from fastapi import Request

from lightrail.fl import store
from lightrail.fl.services import Pool, add_error_handler, log_event, parse_args, serve_app, setup_logging

ROLE = "load_balancer"


class Balancer:
    def __init__(self, pool: Pool, refresh: float = 0.5):
        self.pool, self.refresh = pool, refresh
        self.urls: list[str] = []
        self.read_at = 0.0
        self.rr = itertools.count()
        self.client = None
        self.forwarded = 0
        self.skipped = 0

    def _read(self) -> list[str]:
        with self.pool.conn() as c:
            return [s["url"] for s in store.services(c, "client_manager")]

    async def managers(self, force: bool = False) -> list[str]:
        """The live managers, re-read every ``refresh`` s; while the database is down, the last list read."""
        import psycopg

        if force or not self.urls or time.monotonic() - self.read_at > self.refresh:
            try:
                self.urls = await asyncio.to_thread(self._read)
            except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                if not self.urls:
                    raise
                log_event("managers_not_reread", error=str(e).strip()[:200])
            self.read_at = time.monotonic()
        return self.urls

    async def forward(self, path: str, body: bytes):
        import httpx
        from fastapi.responses import JSONResponse, Response

        urls = await self.managers()
        tried: set[str] = set()
        for attempt in range(2):  # a second pass on a freshly read list after every manager failed
            start = next(self.rr)
            for k in range(len(urls)):
                url = urls[(start + k) % len(urls)]
                if url in tried:
                    continue
                tried.add(url)
                try:
                    r = await self.client.post(url + path, content=body,
                                               headers={"content-type": "application/json"})
                except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as e:
                    self.skipped += 1
                    log_event("manager_unreachable", url=url, error=type(e).__name__)
                    continue
                self.forwarded += 1
                return Response(r.content, status_code=r.status_code, media_type="application/json")
            urls = await self.managers(force=True)
            if attempt == 0 and not set(urls) - tried:
                await asyncio.sleep(0.2)
                urls = await self.managers(force=True)
        return JSONResponse({"error": {"type": "Unavailable", "message": "no client manager reachable",
                                       "field": "client_manager", "fix": "retry shortly"}}, status_code=503)


def make_app(bal: Balancer):
    import fastapi
    import httpx

    async def lifespan(_app):
        bal.client = httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=200,
                                                                          max_keepalive_connections=100))
        yield
        await bal.client.aclose()

    from contextlib import asynccontextmanager

    app = fastapi.FastAPI(title="lightrail fl load balancer", lifespan=asynccontextmanager(lifespan))
    add_error_handler(app)

    @app.get("/healthz")
    async def healthz():
        return {"ok": True, "role": ROLE, "forwarded": bal.forwarded, "skipped": bal.skipped}

    @app.get("/managers")
    async def managers():
        return {"managers": await bal.managers(force=True)}

    @app.post("/checkin")
    async def checkin(request: Request):
        return await bal.forward("/checkin", await request.body())

    @app.post("/result")
    async def result(request: Request):
        return await bal.forward("/result", await request.body())

    return app


def main(argv: list[str] | None = None) -> None:
    def extra(p):
        p.add_argument("--refresh", type=float, default=0.5, help="seconds between reads of the manager list")

    args = parse_args(ROLE, argv, extra)
    setup_logging(ROLE)
    pool = Pool(args.db, size=2)
    serve_app(ROLE, make_app(Balancer(pool, args.refresh)), args, on_stop=pool.close)


if __name__ == "__main__":
    main()
