"""What the controller reports: its log lines (JSON, rate-limited by ``RateLog``) and its Prometheus metrics
(``Metrics`` counts on the hot path; ``metrics_text`` renders them with the controller's state at scrape time).
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightrail.runtime.controller.core import Controller
    from lightrail.runtime.controller.ranks import RankServer

log = logging.getLogger("lightrail.controller")


LOG_BURST = 20  # log lines of one kind per second before they are counted instead (issue 17: 52 MB of log)


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


_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0, 30.0)


class Metrics:
    """The controller's Prometheus metrics in their own CollectorRegistry (one per controller, so two in one
    process never mix): histograms the server observes, and a collector that reads the controller's
    counters (monotonic: they only grow, whatever the number of requests) and gauges at scrape time.

    ``lightrail_acquire_latency_seconds`` stays a summary (the name studies/train_demo/measure.py reads): its
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
        yield self._timings("switch_lag_seconds", "Per switch grant, its overhead in two parts: kind before, from "
                            "ready to the switch's start (0 when a prepare started it earlier); kind after, from the "
                            "switch's end to the grant.", c.switch_lag)
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
