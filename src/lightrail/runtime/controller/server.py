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
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import importlib
import json
import logging
import os
import re
import secrets
import signal
import socket
import tempfile
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from lightrail.errors import InfeasibleError, LightrailError, ScenarioError
from lightrail.runtime.controller.config import ControllerConfig
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.protocol import (
    MAX_NAME,
    Acquire,
    Bye,
    Hello,
    encode,
    encode_ok,
    error_reply,
    fast_request,
    parse_request,
    request_id,
)
from lightrail.runtime.controller.store import Store, check_state
from lightrail.web import json_logging, start_web

__all__ = ["serve", "admin_app", "metrics_text", "require_service", "RankServer", "StateLock", "check_startup",
           "event_loop_run"]

log = logging.getLogger("lightrail.controller")

TOKEN_ENV = "LIGHTRAIL_OPERATOR_TOKEN"
FD_RESERVE = 64  # file descriptors kept for the admin API, SQLite and logs when capping connections
ADMIN_MAX_CONNECTIONS = 32
"""Admin API connections at once, within ``FD_RESERVE`` (the rank connections are capped below the fd limit by it):
past it, the oldest connection with no request in progress makes room (issue 31: half-open requests held 3,000
descriptors and /healthz failed at a 1,024-fd limit)."""
ADMIN_HEADER_TIMEOUT_S = 10.0
"""An admin connection with no request in progress this long after it opened or its last response is closed (a
request's headers must arrive within it; uvicorn has no header timeout)."""
REJOIN_MARGIN_S = 2.0
"""Added to ``heartbeat_timeout`` for the default ``rejoin_timeout``: the client's reconnect backoff cap (1 s,
``client.BACKOFF``) plus a hello's round trip, with room to spare."""
LOG_BURST = 20  # log lines of one kind per second before they are counted instead (issue 17: 52 MB of log)


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


def _log(what: str, /, **fields) -> None:
    log.info(what, extra={"fields": fields})


class RateLog:
    """Log lines of one kind (``event``) at most ``burst`` per second; the rest are counted and reported in
    one ``<event>_suppressed`` line when the next second starts, so a flood of bad requests or refused
    connections costs a few lines a second, not megabytes."""

    def __init__(self, emit=_log, *, burst: int = LOG_BURST, clock=time.monotonic):
        self.emit, self.burst, self.clock = emit, burst, clock
        self.window: dict[str, tuple[float, int]] = {}  # event -> (window start, lines in it)

    def __call__(self, event: str, /, **fields) -> None:
        now = self.clock()
        start, n = self.window.get(event, (now, 0))
        if now - start >= 1.0:
            self._flush(event, n)
            start, n = now, 0
        self.window[event] = (start, n + 1)
        if n < self.burst:
            self.emit(event, **fields)

    def _flush(self, event: str, n: int) -> None:
        if n > self.burst:
            self.emit(f"{event}_suppressed", count=n - self.burst, window_s=1.0)

    def flush(self) -> None:
        """Report what the windows that are over suppressed (called by the server's sweep)."""
        now = self.clock()
        for event, (start, n) in list(self.window.items()):
            if now - start >= 1.0:
                self._flush(event, n)
                del self.window[event]


# --- metrics ------------------------------------------------------------------------------------------------------

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0, 30.0)


class Metrics:
    """The controller's Prometheus metrics in their own CollectorRegistry (one per controller, so two in one
    process never mix): histograms the server observes, and a collector that reads the controller's
    counters (monotonic: they only grow, whatever the number of requests) and gauges at scrape time.

    ``lightrail_acquire_latency_seconds`` stays a summary (the name studies/photonic_demo.py reads): its
    quantiles are over the last 100,000 grants (a sliding window, as Prometheus defines summary quantiles),
    its ``_count`` and ``_sum`` over every grant since start. ``lightrail_acquire_to_grant_seconds`` is the
    same measure as a histogram (aggregatable; the dashboard's heat map)."""

    def __init__(self, controller: Controller, server: RankServer | None = None):
        import prometheus_client
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
            SummaryMetricFamily,
        )

        if hasattr(prometheus_client, "disable_created_metrics"):
            prometheus_client.disable_created_metrics()  # no *_created series: they match lightrail_[a-z_]+ parsers

        self.controller, self.server = controller, server
        self.registry = CollectorRegistry(auto_describe=True)
        # Plain counters, exposed as histograms when scraped: prometheus_client's Histogram.observe costs ~3 us
        # (a lock and a bucket scan) per request, a bisect and two adds cost ~0.3 us (issue 17: 1,024 ranks).
        self._by_op: dict[str, _Hist] = {}
        self._grant = _Hist()
        self.window: deque[float] = deque(maxlen=100_000)
        self.grants = 0
        self.grant_sum = 0.0
        families = (CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily)
        self.registry.register(_Collector(self, *families))
        self.registry.register(_Histograms(self, HistogramMetricFamily))

    def request(self, op: str, seconds: float) -> None:
        h = self._by_op.get(op)
        if h is None:
            h = self._by_op[op] = _Hist()
        h.counts[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        h.sum += seconds

    def granted(self, seconds: float) -> None:
        h = self._grant
        h.counts[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        h.sum += seconds
        self.window.append(seconds)
        self.grants += 1
        self.grant_sum += seconds

    def text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


class _Hist:
    """Observations per latency bucket (``counts[i]``: at most ``_LATENCY_BUCKETS[i]``, the last: above all) and
    their sum; cumulated into Prometheus ``le`` buckets only when scraped."""

    __slots__ = ("counts", "sum")

    def __init__(self):
        self.counts = [0] * (len(_LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def buckets(self) -> list[tuple[str, int]]:
        from prometheus_client.utils import floatToGoString

        total, out = 0, []
        for le, n in zip((*_LATENCY_BUCKETS, float("inf")), self.counts, strict=True):
            total += n
            out.append((floatToGoString(le), total))
        return out


class _Histograms:
    """The request and grant histograms, from :class:`_Hist` counters, in prometheus_client's exposition."""

    def __init__(self, metrics: Metrics, family):
        self.metrics, self.family = metrics, family

    def collect(self):
        m = self.metrics
        f = self.family("lightrail_request_duration_seconds", "Time to handle one protocol request (read to reply "
                        "written; an acquire's wait is not included).", labels=["op"])
        for op, h in sorted(m._by_op.items()):
            f.add_metric([op], h.buckets(), h.sum)
        yield f
        f = self.family("lightrail_acquire_to_grant_seconds", "Acquire to grant, including the wait for the group's "
                        "members and the switch.")
        f.add_metric([], m._grant.buckets(), m._grant.sum)
        yield f

    def describe(self):
        return []


class _Collector:
    """Reads the controller's counters and gauges when scraped (nothing to keep in sync)."""

    COUNTERS = [("requests", "requests_total", "Protocol requests received."),
                ("errors", "request_errors_total", "Requests refused with an error."),
                ("grants", "grants_total", "Groups granted (persisted: summed over restarts)."),
                ("grants_without_change", "grants_without_change_total", "Groups granted with their circuits "
                 "already lit."),
                ("leases", "leases_total", "Grants that were leases."),
                ("revocations", "revocations_total", "Leases revoked for another group."),
                ("lease_yields", "lease_yields_total", "Leases a holder gave back unasked (yield: the ack of a revoke "
                 "not yet sent)."),
                ("rejoins", "rejoins_total", "Members behind in a revoked lease let in to run their remaining ops."),
                ("unsafe_reconfigurations", "unsafe_reconfigurations_total", "Reconfigurations that changed a port "
                 "with traffic (persisted: summed over restarts)."),
                ("failovers", "failovers_total", "Failed ranks replaced by a spare (persisted: summed over restarts)."),
                ("refused", "refused_total", "Requests refused for speaking for another job or rank (or a bad "
                 "token)."),
                ("connections_refused", "connections_refused_total", "Connections refused at max_connections."),
                ("timeouts", "connection_timeouts_total", "Connections closed for silence (no hello, or no "
                 "heartbeat)."),
                ("rank_failures", "rank_failures_total", "Ranks failed (silent, or closed without bye)."),
                ("superseded", "superseded_total", "Acquires replaced by a repeated acquire of the same group."),
                ("pauses", "controller_pauses_total", "Times this process found it had not run for a while (SIGSTOP, "
                 "a VM stall): that time counted as nobody's silence.")]

    def __init__(self, metrics: Metrics, counter, gauge, summary):
        self.metrics, self.counter, self.gauge, self.summary = metrics, counter, gauge, summary

    def collect(self):
        m, c = self.metrics, self.metrics.controller
        counters = c.counters
        server = m.server.counters if m.server is not None else {}
        for key, name, help_ in self.COUNTERS:
            yield self._one(self.counter, name, help_, counters.get(key, server.get(key, 0)))
        durable = c.store.counters()
        for key, help_ in (("reconfigurations", "Reconfigurations per device (persisted)."),
                           ("circuit_changes", "Inputs whose circuit changed, per device (persisted).")):
            f = self.counter(f"lightrail_{key}_total", help_, labels=["device"])
            for d in c.devices:
                f.add_metric([d], durable.get(f"{key}:{d}", 0.0))
            yield f
        yield self._one(self.counter, "reconfiguration_seconds_total", "Time spent reconfiguring (persisted).",
                        durable.get("reconfiguration_seconds", 0.0))
        f = self.gauge("lightrail_circuits_lit", "Lit circuits per device.", labels=["device"])
        for d, drv in c.devices.items():
            f.add_metric([d], len(drv.state()))
        yield f
        yield self._one(self.gauge, "jobs", "Registered jobs.", len(c.jobs))
        yield self._one(self.gauge, "groups", "Declared groups.", len(c.groups))
        yield self._one(self.gauge, "waiting_acquires", "Acquires waiting for a grant.",
                        sum(len(g.waiters) for g in c.groups.values()))
        if m.server is not None:
            yield self._one(self.gauge, "connections", "Open rank-protocol connections.", len(m.server.open))
            yield self._one(self.gauge, "ranks_connected", "Connections bound to a rank by hello.",
                            len(m.server.bound))
        if m.server is not None:
            lat, count, total = sorted(m.window), m.grants, m.grant_sum
        else:  # a bare controller (the admin app in process): the core's own record, in its clock
            lat = sorted(c.latencies)
            count, total = len(lat), sum(lat)
        f = self.summary("lightrail_acquire_latency_seconds", "Acquire to grant, including the wait for the group's "
                         "members (quantiles over the last 100,000 grants; count and sum since start).",
                         count_value=count, sum_value=total)
        for q in (0.5, 0.9, 0.99):
            if lat:
                f.add_sample("lightrail_acquire_latency_seconds", {"quantile": str(q)},
                             lat[min(len(lat) - 1, int(q * len(lat)))])
        yield f
        yield self._timings("grant_latency_seconds", "Controller side, per group grant: from ready (the last "
                            "member's acquire in) to the grant; kind: lit (circuits present, no lease revoked), "
                            "revoke (a lease on its ports revoked first), switch (the switch reconfigured).",
                            c.grant_latency)
        yield self._timings("grant_overhead_seconds", "Per switch grant: its grant latency minus the switch delay "
                            "the controller waited after ready (what is not the OCS itself).",
                            {"switch": c.grant_overhead})
        yield self._timings("revoke_seconds", "Revocation round trip: from pushing revoke to a lease's holders "
                            "until the lease ended (last ack or release in; its ports free).", {"": c.revoke_rtt})

    def _timings(self, name: str, help_: str, by_kind: dict):
        """A summary from core :class:`~lightrail.runtime.controller.core.Timings` (labelled by ``kind`` unless
        the only key is ""): quantiles over the last 100,000, ``_count`` and ``_sum`` since start. Every kind is
        shown, with no quantile while it has no sample, so the families exist from the start."""
        name = f"lightrail_{name}"
        labels = [] if list(by_kind) == [""] else ["kind"]
        f = self.summary(name, help_, labels=labels)
        for kind, t in by_kind.items():
            lat = sorted(t.samples)
            label = {"kind": kind} if labels else {}
            for q in (0.5, 0.9, 0.99):
                if lat:
                    f.add_sample(name, {**label, "quantile": str(q)}, lat[min(len(lat) - 1, int(q * len(lat)))])
            f.add_metric([kind] if labels else [], count_value=t.count, sum_value=t.sum)
        return f

    @staticmethod
    def _one(kind, name: str, help_: str, value: float):
        return kind(f"lightrail_{name}", help_, value=value)

    def describe(self):
        return []


def metrics_text(controller: Controller, metrics: Metrics | None = None) -> str:
    """Prometheus text exposition of the controller's counters, gauges and latency metrics."""
    metrics = metrics or getattr(controller, "metrics", None) or Metrics(controller)
    return metrics.text()


# --- the rank protocol --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Conn:
    """One rank-protocol connection: who it speaks for once it said hello, and when it was last heard."""

    writer: asyncio.Transport  # the connection's transport (or anything with write, is_closing, close)
    peer: str
    opened: float
    last_seen: float
    bound: tuple[str, int] | None = None  # (job, rank) after a good hello
    token: str | None = None
    waits: dict[str, int] = field(default_factory=dict)  # group key -> id of the acquire waiting on it
    failed: bool = False  # the server closed it (silence, no hello, a newer connection for its rank)
    left: bool = False  # its rank said bye: closing it is no failure

    def send(self, message: dict) -> None:
        if not self.writer.is_closing():
            self.writer.write(encode(message))

    def write(self, data: bytes) -> None:
        """An encoded reply (the hot path's byte templates)."""
        if not self.writer.is_closing():
            self.writer.write(data)


def _refusal(message: str, field_: str, fix: str) -> ScenarioError:
    return ScenarioError(message, field=field_, fix=fix)


class RankServer:
    """The JSON-lines rank protocol over asyncio streams (one :class:`Conn` per connection)."""

    def __init__(self, controller: Controller, config: ControllerConfig, *, clock=time.monotonic):
        self.controller, self.config, self.clock = controller, config, clock
        self.open: set[Conn] = set()
        self.bound: dict[tuple[str, int], Conn] = {}  # (job, rank) -> its connection (where pushes go)
        self.counters = {"refused": 0, "connections_refused": 0, "timeouts": 0, "rank_failures": 0, "superseded": 0,
                         "pauses": 0}
        # (job, rank) -> (when, peer): its connection closed without bye; failed unless it says hello again in time
        self.absent: dict[tuple[str, int], tuple[float, str]] = {}
        self.swept: float | None = None  # when the sweeper last ran (a late run: this process was not running)
        self.max_connections = _connection_cap(config.max_connections)
        self.rlog = RateLog()
        self.metrics = Metrics(controller, self)
        controller.metrics = self.metrics  # metrics_text(controller) finds it
        controller.notify = self.push

    # -- pushes and failures ------------------------------------------------------------------------------------
    def push(self, job: str, rank: int, message: dict) -> None:
        """The controller's ``notify``: write a pushed message on the rank's connection (if it still has one)."""
        conn = self.bound.get((job, rank))
        if conn is not None:
            conn.send(message)

    def fail(self, conn: Conn, reason: str) -> None:
        """The rank on ``conn`` failed (silent while others were heard): unbind it and fail it (:meth:`_failed`)."""
        if conn.bound is None:
            return
        job, rank = conn.bound
        conn.bound = None
        if self.bound.get((job, rank)) is conn:
            del self.bound[(job, rank)]
        self._failed(job, rank, conn.peer, reason)

    def lost(self, conn: Conn) -> None:
        """``conn`` closed without bye: not a failure yet (the rank may be reconnecting, e.g. after a pause of this
        process), so the rank is *absent*: its holds, leases and waits go (``Controller.connection_lost``, as
        the client forgets them too) and it is failed if it says no hello within ``heartbeat_timeout``."""
        if conn.bound is None:
            return
        job, rank = conn.bound
        conn.bound = None
        if self.bound.get((job, rank)) is not conn:
            return  # a newer connection speaks for it
        del self.bound[(job, rank)]
        if job not in self.controller.jobs or rank not in self.controller.jobs[job]["ranks"]:
            return  # it already left (bye), or its job ended
        self.absent[(job, rank)] = (self.clock(), conn.peer)
        self.rlog("rank_absent", job=job, rank=rank, peer=conn.peer)
        lost = getattr(self.controller, "connection_lost", None)
        try:
            if lost is not None:
                lost(job, rank)
        except LightrailError as e:
            _log("rank_failed_error", job=job, rank=rank, error=str(e))

    def _failed(self, job: str, rank: int, peer: str, reason: str) -> None:
        """Tell the controller the rank is gone: it fails it over to a spare (the spare's connection is re-bound
        here) or ends its holds."""
        self.absent.pop((job, rank), None)
        if job not in self.controller.jobs or rank not in self.controller.jobs[job]["ranks"]:
            return  # it already left (bye), or its job ended
        self.counters["rank_failures"] += 1
        self.rlog("rank_failed", job=job, rank=rank, peer=peer, reason=reason)
        rank_failed = getattr(self.controller, "rank_failed", None)
        try:
            if rank_failed is None:
                self.controller.disconnect(job, rank)
                return
            result = rank_failed(job, rank) or {}
        except LightrailError as e:  # e.g. the state file is busy: logged, the connection is gone anyway
            _log("rank_failed_error", job=job, rank=rank, error=str(e))
            return
        if result.get("failover"):
            spare = self.bound.pop((job, result["spare"]), None)
            if spare is not None:  # the spare now speaks for the failed rank (it says hello again as it)
                spare.bound = (job, rank)
                self.bound[(job, rank)] = spare
            _log("failover", job=job, rank=rank, spare=result["spare"], epoch=result.get("epoch"),
                 rewire_s=result.get("rewire_s"))

    def sweep(self) -> None:
        """Close connections that never said hello within ``hello_timeout``; fail bound ranks silent longer than
        ``heartbeat_timeout`` while others were heard, and absent ranks that said no hello again in that long.
        A sweep that comes late (by more than ``heartbeat_timeout / 2``) means this process did not run: that
        time is nobody's silence, so every clock of silence and absence moves on by it."""
        now = self.clock()
        period = self.period()
        if self.swept is not None and now - self.swept > period + self.config.heartbeat_timeout / 2:
            stalled = now - self.swept - period
            self.counters["pauses"] += 1
            _log("paused", seconds=round(stalled, 3))
            for conn in self.open:
                conn.last_seen = min(now, conn.last_seen + stalled)
            self.absent = {k: (min(now, t + stalled), peer) for k, (t, peer) in self.absent.items()}
        self.swept = now
        hb = self.config.heartbeat_timeout
        rejoin = self.rejoin_timeout()
        for (job, rank), (t, peer) in list(self.absent.items()):
            if now - t > rejoin:
                self._failed(job, rank, peer, f"connection closed without bye, no hello again within "
                                              f"{rejoin:g} s (rejoin_timeout)")
        bound = [c for c in self.open if c.bound is not None]
        heard = min((now - c.last_seen for c in bound), default=0.0)  # since the last rank was heard
        for conn in list(self.open):
            if conn.bound is None and not conn.failed and now - conn.opened > self.config.hello_timeout:
                self.counters["timeouts"] += 1
                self.rlog("hello_timeout", peer=conn.peer)
                conn.send({"id": 0, "ok": False, "error": {
                    "type": "ScenarioError", "message": f"no hello within {self.config.hello_timeout} s",
                    "field": "hello_timeout", "fix": "say hello first, with the job's token"}})
                conn.failed = True
                conn.writer.close()
            elif conn.bound is not None and now - conn.last_seen > self.config.heartbeat_timeout:
                if _unread(conn.writer):  # it did speak: the loop is behind (overload), not the rank silent
                    conn.last_seen = now
                    continue
                if len(bound) > 1 and heard > hb:
                    continue  # nobody was heard: this process's network (or clock) is the suspect, not the rank
                self.counters["timeouts"] += 1
                conn.failed = True
                self.fail(conn, f"silent for {now - conn.last_seen:.3f} s (heartbeat_timeout "
                                f"{self.config.heartbeat_timeout} s)")
                conn.writer.close()
        self.rlog.flush()

    def rejoin_timeout(self) -> float:
        """How long a rank whose connection closed without bye may take to say hello again: the config's, else
        ``heartbeat_timeout`` + :data:`REJOIN_MARGIN_S` (a client's next try after a pause comes within its
        backoff cap and one hello round trip)."""
        c = self.config
        return c.rejoin_timeout or c.heartbeat_timeout + REJOIN_MARGIN_S

    def period(self) -> float:
        """Seconds between sweeps."""
        c = self.config
        return min(c.heartbeat_timeout, c.hello_timeout, self.rejoin_timeout()) / 4

    async def sweeper(self) -> None:
        self.swept = self.clock()
        while True:
            await asyncio.sleep(self.period())
            self.sweep()
            self.flush()

    def flush(self) -> None:
        """Persist the controller's safety counters (a busy state file: next time)."""
        flush = getattr(self.controller, "flush_counters", None)
        if flush is not None:
            with contextlib.suppress(LightrailError):
                flush()

    # -- one connection -----------------------------------------------------------------------------------------
    def protocol(self) -> _RankProtocol:
        """A protocol for one new connection (``loop.create_server(server.protocol, ...)``)."""
        return _RankProtocol(self)

    def _bad(self, conn: Conn, rid: int, e: LightrailError, **claimed) -> None:
        self.controller.counters["errors"] += 1
        self.rlog("bad_request", peer=conn.peer, error=str(e), **claimed)
        conn.send(error_reply(rid, e))

    def _refuse(self, conn: Conn, rid: int, e: LightrailError, **claimed) -> None:
        """A request speaking for someone else: refused, logged with the identity it claimed and the peer."""
        self.counters["refused"] += 1
        self.controller.counters["errors"] += 1
        self.rlog("refused", peer=conn.peer, bound=list(conn.bound) if conn.bound else None, field=e.field,
                  **claimed)
        conn.send(error_reply(rid, e))

    def request(self, conn: Conn, line: bytes) -> None:
        c = self.controller
        c.counters["requests"] += 1
        t0 = time.perf_counter()
        m = fast_request(line)  # heartbeat, acquire, prepare, release: no pydantic (issue 17: 1,024 ranks)
        if m is None:
            try:
                m = parse_request(line, max_depth=self.config.max_depth)
            except LightrailError as e:
                self._bad(conn, request_id(line), e)
                return
        rid, op = m.id, m.op
        try:
            if op == "heartbeat":
                conn.write(encode_ok(rid, {"t": c.clock()}))
                self.metrics.request(op, time.perf_counter() - t0)
                return
            if op == "hello":
                reply = self._hello(conn, m)
                if reply is None:
                    return
            else:
                bound = conn.bound
                if (bound is None or m.job != bound[0] or getattr(m, "rank", bound[1]) not in (None, bound[1])) \
                        and not self._allowed(conn, m):
                    return
                if op == "acquire" or op == "prepare":
                    self._acquire(conn, m, t0)
                    return
                if op == "release":
                    reply = c.release(m)
                elif op == "group":
                    reply = c.declare(m)
                elif op == "ack":
                    reply = c.ack(m)
                elif op == "yield":
                    reply = c.yield_lease(m)
                elif op == "hold":
                    hold = getattr(c, "hold", None)
                    if hold is None:
                        raise ScenarioError("this controller does not take hold", field="op", fix="acquire again")
                    reply = hold(m)
                else:  # bye (the models admit no other op)
                    reply = self._bye(conn, m)
            conn.write(encode_ok(rid, reply))
        except LightrailError as e:
            self._bad(conn, rid, e, job=getattr(m, "job", None), rank=getattr(m, "rank", None), op=op)
        self.metrics.request(op, time.perf_counter() - t0)

    def _allowed(self, conn: Conn, m) -> bool:
        """A request after hello must speak for the connection's (job, rank)."""
        claimed = {"op": m.op, "job": m.job, "rank": getattr(m, "rank", None)}
        if conn.bound is None:
            self._refuse(conn, m.id, _refusal(f"{m.op} before hello", "op", "say hello first"), **claimed)
            return False
        job, rank = conn.bound
        if m.job != job:
            self._refuse(conn, m.id, _refusal(f"this connection speaks for job {job!r}, not {m.job!r}", "job",
                                              "a rank only speaks for its own job"), **claimed)
            return False
        mine = getattr(m, "rank", rank)
        if mine is not None and mine != rank:
            self._refuse(conn, m.id, _refusal(f"this connection speaks for rank {rank} of {job!r}, not rank {mine}",
                                              "rank", "a connection only speaks for the rank that said hello on it"),
                         **claimed)
            return False
        return True

    def _hello(self, conn: Conn, m: Hello) -> dict | None:
        claimed = {"op": "hello", "job": m.job, "rank": m.rank}
        if conn.bound is not None and conn.bound != (m.job, m.rank):
            job, rank = conn.bound
            self._refuse(conn, m.id, _refusal(f"this connection speaks for rank {rank} of {job!r}",
                                              "job" if m.job != job else "rank",
                                              "one connection per rank: open another one"), **claimed)
            return None
        if not m.token or not self.controller.authenticate(m.job, m.token):
            self._refuse(conn, m.id, _refusal(f"wrong or missing token for job {m.job!r}", "token",
                                              "pass the token POST /jobs returned for this job"), **claimed)
            return None
        reply = self.controller.hello(m)
        other = self.bound.get((m.job, m.rank))
        if other is not None and other is not conn:
            # The rank's old connection is still open (a reconnect before the server noticed the drop): the newest
            # connection with the right token wins; the old one is closed without failing the rank.
            other.bound = None
            other.failed = True
            other.writer.close()
        conn.bound, conn.token, conn.left = (m.job, m.rank), m.token, False
        self.bound[(m.job, m.rank)] = conn
        self.absent.pop((m.job, m.rank), None)  # back: re-admitted
        return reply

    def _bye(self, conn: Conn, m: Bye) -> dict:
        reply = self.controller.bye(m)
        job, rank = conn.bound
        if m.rank is None:  # the whole job ended: nobody speaks for it any more
            for (j, r), other in list(self.bound.items()):
                if j == job:
                    other.bound = None
                    del self.bound[(j, r)]
        else:
            conn.bound = None
            self.bound.pop((job, rank), None)
        conn.left = conn.bound is None  # closing after bye is not a failure
        return reply

    def _acquire(self, conn: Conn, m: Acquire, t0: float) -> None:
        c = self.controller
        fut = c.acquire(m)
        if fut is None:
            reply = {"granted": m.op == "acquire"}
            lease = c.lease_of(m.job, m.key, m.rank)
            if lease is not None and m.op == "acquire":
                reply["lease"] = lease
            conn.write(encode_ok(m.id, reply))
            t1 = time.perf_counter()
            if m.op == "acquire":
                self.metrics.granted(t1 - t0)
            self.metrics.request(m.op, t1 - t0)
            return
        old = conn.waits.get(m.key)
        if old is not None:  # a repeated acquire replaces the wait: the old request is answered, never orphaned
            self.counters["superseded"] += 1
            conn.send({"id": old, "ok": False, "error": {
                "type": "Superseded", "message": f"acquire {old} of {m.key!r} was replaced by acquire {m.id}",
                "field": "key", "fix": "wait for the newer request"}})
        conn.waits[m.key] = m.id
        rid, key = m.id, m.key

        def granted(f: asyncio.Future) -> None:
            if conn.waits.get(key) != rid:
                return  # superseded: already answered
            del conn.waits[key]
            if f.cancelled():
                conn.send({"id": rid, "ok": False, "error": {"type": "Cancelled", "message": "request dropped",
                                                             "field": "key", "fix": "acquire again"}})
                return
            e = f.exception()
            if e is not None:
                err = e if isinstance(e, LightrailError) else LightrailError(str(e), field="key")
                conn.send(error_reply(rid, err))
                return
            result = f.result()
            if result and "error" in result:
                conn.send({"id": rid, "ok": False, "error": result["error"]})
                return
            self.metrics.granted(time.perf_counter() - t0)
            conn.write(encode_ok(rid, {"granted": True, **result} if result else _GRANTED))

        if fut.done():  # granted (or failed) by this very request: the last member of a lit group
            granted(fut)
        else:
            fut.on_done = granted  # the grant is written as it happens (see Waiter)
        self.metrics.request(m.op, time.perf_counter() - t0)


_GRANTED = {"granted": True}


class _RankProtocol(asyncio.Protocol):
    """One rank-protocol connection, as an asyncio Protocol: requests are handled in ``data_received``, straight
    from the selector (a StreamReader would wake a task per read: ~2 loop callbacks a request more, a third of
    the controller's CPU at 1,024 ranks, issue 17). Requests in order; acquires may complete out of order. Lines
    are framed here (not readline) so a line over ``max_line`` gets an error reply and the rest of it is
    skipped, the connection staying open. While the transport's write buffer is over its high-water mark
    (a rank not reading its replies), reading from it pauses."""

    def __init__(self, server: RankServer):
        self.server = server
        self.conn: Conn | None = None
        self.buf = bytearray()
        self.skipping = False
        self.max_line = server.config.max_line

    def connection_made(self, transport: asyncio.Transport) -> None:
        server = self.server
        peer = _peer(transport)
        if len(server.open) >= server.max_connections:
            server.counters["connections_refused"] += 1
            server.rlog("connection_refused", peer=peer, open=len(server.open), max_connections=server.max_connections)
            transport.write(encode({"id": 0, "ok": False, "error": {
                "type": "InfeasibleError", "message": f"the controller serves at most {server.max_connections} "
                f"connections", "field": "max_connections", "fix": "retry later, or raise max_connections"}}))
            transport.close()  # after the reply is written
            return
        now = server.clock()
        self.conn = Conn(transport, peer, now, now)
        server.open.add(self.conn)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or conn.failed:
            return  # refused at the cap, or closed by the server: the rest is not read
        server, max_line, buf = self.server, self.max_line, self.buf
        conn.last_seen = server.clock()
        if not buf and not self.skipping and data.find(b"\n") == len(data) - 1 and len(data) <= max_line + 1:
            if len(data) > 1 and not data.isspace():  # the common read: one whole request line
                server.request(conn, data[:-1])
        else:
            buf += data
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                line = bytes(buf[start:nl])
                start = nl + 1
                if self.skipping:
                    self.skipping = False
                elif len(line) > max_line:
                    server._bad(conn, request_id(line[:4096]), _too_long(max_line))
                elif line.strip():
                    server.request(conn, line)
                if conn.failed:
                    break
            del buf[:start]
            if len(buf) > max_line:
                if not self.skipping:
                    server._bad(conn, request_id(bytes(buf[:4096])), _too_long(max_line))
                buf.clear()
                self.skipping = True
        if conn.failed:
            conn.writer.close()

    def pause_writing(self) -> None:
        if self.conn is not None and not self.conn.writer.is_closing():
            self.conn.writer.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None and not self.conn.writer.is_closing():
            self.conn.writer.resume_reading()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        self.server.open.discard(conn)
        if not conn.failed and not conn.left:
            self.server.lost(conn)
        conn.writer.close()




def _unread(writer: asyncio.StreamWriter) -> bool:
    """Bytes (or an EOF) wait in the connection's socket that the event loop has not read yet."""
    import select

    sock = writer.get_extra_info("socket")
    try:
        return bool(sock is not None and select.select([sock.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _too_long(max_line: int) -> ScenarioError:
    return ScenarioError(f"request line over {max_line} bytes", field="message",
                         fix="one request per line, under max_line bytes")


def _peer(writer: asyncio.StreamWriter) -> str:
    p = writer.get_extra_info("peername")
    return f"{p[0]}:{p[1]}" if isinstance(p, tuple) and len(p) >= 2 else str(p)


def _connection_cap(configured: int) -> int:
    """``max_connections``, but never more than the process may open files (minus a reserve): past the fd
    limit, accept() fails and the admin API with it (issue 17: 1,100 half-open connections at 1,024 fds)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return configured
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft - FD_RESERVE))


# --- the admin API ------------------------------------------------------------------------------------------------


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

    @app.post("/jobs")
    async def register(body: NewJob):
        secret = controller.register_job(body.job, body.world, body.spares)
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


# --- start-up checks, the state lock, serving ---------------------------------------------------------------------


class StateLock:
    """An exclusive ``flock`` on ``<state>.lock`` for the controller's lifetime, holding its pid and ports: a
    second controller on the same state file is refused, naming the first (the kernel drops the lock when the
    process dies, even by SIGKILL)."""

    def __init__(self, state: str | Path):
        import fcntl

        self.path = Path(f"{state}.lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace").strip()
            os.close(self.fd)
            try:
                info = json.loads(holder)
                who = f"pid {info.get('pid')}, port {info.get('port')}, admin port {info.get('admin_port')}"
            except ValueError:
                who = holder or "a process that has not written its ports yet"
            raise ScenarioError(f"the state file {state} is in use by a running controller ({who})",
                                field="--state", fix="stop that controller, or give another --state") from None

    def write(self, **info) -> None:
        data = json.dumps({"pid": os.getpid(), **info}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def check_startup(config: ControllerConfig, state_path: str, *, accept_rollback: bool = False) -> None:
    """Everything that would make ``serve`` fail after it started work, checked first (nothing written): the
    state path is a file we can create, holding a usable state no older than it acknowledged (``check_state``),
    and the ports are free."""
    state = Path(state_path)
    if state.is_dir():
        raise ScenarioError(f"{state_path} is a directory", field="--state", fix="give a file, e.g. "
                            f"{state / 'lightrail-controller.db'}")
    parent = state.parent if str(state.parent) else Path(".")
    existing = next((p for p in [parent, *parent.parents] if p.exists()), Path("/"))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK) or (
            state.exists() and not os.access(state, os.R_OK | os.W_OK)):
        raise ScenarioError(f"cannot write the state file {state_path}", field="--state",
                            fix="give a path in a writable directory")
    check_state(state, accept_rollback=accept_rollback)
    for flag, port in (("--port", config.port), ("--admin-port", config.admin_port)):
        if port == 0:
            continue
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((config.host, port))
            except OSError as e:
                raise ScenarioError(f"cannot listen on {config.host}:{port}: {e.strerror or e}", field=flag,
                                    fix="pick a free port, or 0 for any") from None


def operator_token(config: ControllerConfig) -> tuple[str, bool]:
    """The operator token: the config's, else the environment's, else a new one (True: generated)."""
    if config.operator_token:
        return config.operator_token, False
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        if len(env) < 16:
            raise ScenarioError(f"{TOKEN_ENV} is shorter than 16 characters", field=TOKEN_ENV,
                                fix="use a long random secret, e.g. python -c 'import secrets; "
                                    "print(secrets.token_urlsafe(32))'")
        return env, False
    return secrets.token_urlsafe(32), True


async def _serve(config: ControllerConfig, state_path: str, ready, concentrator: Path | None = None) -> None:
    start = time.perf_counter()
    token, generated = operator_token(config)
    config = config.model_copy(update={"operator_token": token})
    lock = StateLock(state_path)
    store = Store(state_path)
    controller = Controller(config, store, log=_log)
    ranks = RankServer(controller, config)
    stop = asyncio.Event()
    lost: list[str] = []
    if config.frontend == "native":
        from lightrail.runtime.controller.frontend import NativeFrontend

        def frontend_lost() -> None:
            if not stop.is_set():
                lost.append("the native front end (concentrator) exited")
                _log("frontend_lost")
                stop.set()

        server = await NativeFrontend.start(concentrator, config.host, config.port, ranks.protocol, frontend_lost)
        port = server.port
    else:
        try:
            server = await asyncio.get_running_loop().create_server(ranks.protocol, config.host, config.port,
                                                                    backlog=1024)
        except OSError as e:
            raise ScenarioError(f"cannot listen on {config.host}:{config.port}: {e.strerror or e}", field="--port",
                                fix="pick a free port, or 0 for any") from None
        port = server.sockets[0].getsockname()[1]
    try:
        web, web_task, admin_port = await start_web(admin_app(controller, token=token, server=ranks), config.host,
                                                    config.admin_port, what="admin API", access_log=False,
                                                    http=guarded_http(), timeout_keep_alive=5,
                                                    h11_max_incomplete_event_size=16 * 1024)
    except (OSError, SystemExit) as e:
        raise ScenarioError(f"cannot listen on {config.host}:{config.admin_port} ({e})", field="--admin-port",
                            fix="pick a free port, or 0 for any") from None
    lock.write(port=port, admin_port=admin_port, host=config.host)
    sweeper = asyncio.create_task(ranks.sweeper())
    loop = asyncio.get_running_loop()
    info = {"host": config.host, "port": port, "admin_port": admin_port, "state": state_path,
            "devices": len(controller.devices), "max_connections": ranks.max_connections,
            "heartbeat_timeout": config.heartbeat_timeout, "startup_s": round(time.perf_counter() - start, 4),
            "event_loop": type(loop).__module__.split(".")[0], "frontend": config.frontend}  # loop: uvloop/asyncio
    if config.frontend == "native":
        info["frontend_pid"] = server.proc.pid
    # Everything allocated so far (modules, models, the web app: ~80k objects) lives as long as the process:
    # out of the collector's way, a full collection no longer walks it (measured at 1,024 ranks: one such
    # collection stalled the loop 41 ms, every outstanding acquire with it; issue 17).
    gc.freeze()
    info["gc_frozen_objects"] = gc.get_freeze_count()
    _log("ready", **info, operator_token="generated" if generated else "given")
    ready({**info, "operator_token": token} if generated else info)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    _log("stopping")
    sweeper.cancel()
    web.should_exit = True
    server.close()
    await web_task
    ranks.flush()
    store.close()
    lock.release()
    if lost:
        raise LightrailError(lost[0], field="frontend", fix="see the controller's log; restart it (the state file "
                             "holds the circuits; ranks reconnect)")


def serve(config: ControllerConfig, state_path: str, *, ready=None, accept_rollback: bool = False) -> None:
    """Run the controller until SIGTERM/SIGINT; ``ready(info)`` is called once it listens (default:
    print the info as one JSON line on stdout). Without the extra ``service``, a LightrailError first;
    a state path or port that cannot work, a ScenarioError before anything is written."""
    require_service()  # before the log handler and the event loop: a missing extra is a one-line error
    check_startup(config, state_path, accept_rollback=accept_rollback)
    json_logging(log)
    ready = ready or (lambda info: print(json.dumps({"event": "ready", **info}), flush=True))
    native = config.frontend == "native"
    with tempfile.TemporaryDirectory(prefix="lightrail-frontend-") if native else contextlib.nullcontext() as build:
        concentrator = None
        if native:  # built before anything is written: no compiler is a one-line error
            from lightrail.runtime.controller.frontend import compile_concentrator

            concentrator = compile_concentrator(Path(build))
        event_loop_run()(_serve(config, state_path, ready, concentrator))


def event_loop_run():
    """uvloop's ``run`` where uvloop is installed (the extra ``service`` brings it), else asyncio's: the same
    asyncio API on libuv, measured here at half the CPU per request of the selector loop for a minimal
    request-reply server with 1,024 connections (issue 17; the ``floor`` of ``bench_controller.py --ranks``)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run

