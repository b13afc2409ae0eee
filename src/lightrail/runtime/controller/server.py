"""The controller process: the rank protocol (JSON lines over TCP) and the HTTP admin API in one
asyncio loop, structured (JSON) logs on stderr, one ``ready`` line on stdout once both listen.

Admin API (FastAPI; every endpoint but ``GET /healthz`` and ``GET /metrics`` needs ``Authorization: Bearer
<operator token>``, and every request a ``Host`` header naming one of ``allowed_hosts``): ``GET /healthz``,
``GET /state`` (circuits and port owners per device), ``GET /jobs`` (jobs, their groups and who holds them),
``POST /jobs`` (register a job: its token), ``DELETE /jobs/{job}``, ``GET /reconfigurations`` (recent ones,
with the ports they changed and the ports that were busy), ``GET /metrics`` (Prometheus text format),
``POST /devices/{device}/circuits`` (an operator's change, validated; nothing changes on error),
``POST /devices/{device}/ports/{port}/fail`` and ``.../repair``.

Tenancy on the rank protocol: a connection is nobody until its ``hello`` carries the job's token; from then
on it is bound to that (job, rank) and every request on it must speak for them (docs/controller.md).
Liveness (issue 31: a paused controller is not a dead job): a rank is failed (``Controller.rank_failed``) only on
evidence it is gone, measured while this process was running: a bound rank silent for ``heartbeat_timeout`` while
other ranks were heard, or a rank whose connection closed without ``bye`` and that said no hello on a new one
within ``heartbeat_timeout``. Time the loop did not run (SIGSTOP, a VM stall; seen as a late sweep) does not
count, and a closed connection is not a failure by itself: the rank may be reconnecting (after a pause, the
closes of its abandoned connections arrive with its new hello). A connection that never says hello is closed
after ``hello_timeout``. Clocks: durations use ``time.monotonic`` (the controller's clock, the one ``heartbeat``
replies carry); the wall clock appears only in log records.

FastAPI, uvicorn and prometheus_client are the optional extra ``service``: they are imported only when the
controller starts, so the rest of lightrail (and this module) works without them, and a controller started
without them stops with a LightrailError that names the fix.

The process lives in four rooms: ``metrics.py`` (Prometheus metrics, rate-limited logs), ``ranks.py`` (the rank
TCP server), ``admin.py`` (the admin HTTP app) and ``serve.py`` (start-up checks, the state lock, serving);
``require_service`` is in ``lightrail.web``. This module re-exports their names for the old import paths.
"""

from __future__ import annotations

from lightrail.runtime.controller.admin import (
    ADMIN_HEADER_TIMEOUT_S,
    ADMIN_MAX_CONNECTIONS,
    Changes,
    NewJob,
    _status,
    admin_app,
    guarded_http,
)
from lightrail.runtime.controller.metrics import _LATENCY_BUCKETS, LOG_BURST, Metrics, RateLog, log, metrics_text
from lightrail.runtime.controller.protocol import parse_request
from lightrail.runtime.controller.ranks import FD_RESERVE, REJOIN_MARGIN_S, Conn, RankServer
from lightrail.runtime.controller.serve import (
    TOKEN_ENV,
    StateLock,
    check_startup,
    event_loop_run,
    operator_token,
    serve,
)
from lightrail.web import require_service

__all__ = ["serve", "admin_app", "metrics_text", "require_service", "RankServer", "StateLock", "check_startup",
           "event_loop_run", "ADMIN_HEADER_TIMEOUT_S", "ADMIN_MAX_CONNECTIONS", "Changes", "NewJob", "_status",
           "guarded_http", "_LATENCY_BUCKETS", "LOG_BURST", "Metrics", "RateLog", "log", "parse_request",
           "FD_RESERVE", "REJOIN_MARGIN_S", "Conn", "TOKEN_ENV", "operator_token"]
