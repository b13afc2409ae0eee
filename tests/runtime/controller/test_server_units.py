"""The server's parts in process: protocol edges refused before they cost anything (depth counted outside
strings, int64, op type), the log rate limit, metrics that stay monotonic past 100,000 grants, and the
connection re-binding after a failover (a spare's connection then speaks for the failed rank)."""

from __future__ import annotations

import asyncio
import json

import pytest
from tests.runtime.controller.conftest import FakeWriter

from lightrail.errors import ScenarioError
from lightrail.runtime.controller.protocol import Heartbeat, Hello, parse_push, parse_request, request_id

pytest.importorskip("prometheus_client")


@pytest.mark.parametrize("line,field,words", [
    (b'{"op": ["hello"]}', "op", "string"),
    (b'{"op": 7}', "op", "string"),
    (b'{"id": 1}', "op", "string"),
    (b"[" * 65 + b"]" * 65, "message", "deeper"),
    (b'{"a": ' * 30_000, "message", "deeper"),
    (b'{"id": 9223372036854775808, "op": "heartbeat"}', "message", "int64"),
    (b'{"id": -9223372036854775809, "op": "heartbeat"}', "message", "int64"),
    (b'{"op": "heartbeat", "x": 1' + b"0" * 5000 + b"}", "message", "int64"),
    (b"\xff\xfe", "message", "JSON"),
    (b"null", "message", "object"),
])
def test_protocol_edges_raise_scenario_errors(line, field, words):
    with pytest.raises(ScenarioError) as e:
        parse_request(line)
    assert e.value.field == field and words in e.value.message


def test_depth_is_counted_outside_strings_and_int64_bounds_are_inclusive():
    """Brackets inside a string are not nesting; 64 levels pass, 65 do not; +-2^63 edges are exact."""
    deep_string = json.dumps({"op": "hello", "job": "[" * 200, "rank": 0, "world": 1, "ports": {}})
    assert parse_request(deep_string).job == "[" * 200
    assert parse_request(b'{"op": "heartbeat", "id": 9223372036854775807}').id == 2 ** 63 - 1
    assert parse_request(b'{"op": "heartbeat", "id": -9223372036854775808}').id == -(2 ** 63)
    nested = lambda n: b'{"op": "heartbeat", "id": 1, "x": ' + b"[" * (n - 1) + b"]" * (n - 1) + b"}"  # noqa: E731
    with pytest.raises(ScenarioError, match="extra inputs"):  # 64 levels: parsed (then refused as a field)
        parse_request(nested(64))
    with pytest.raises(ScenarioError, match="deeper"):
        parse_request(nested(65))
    assert isinstance(parse_request(b'{"op": "heartbeat"}'), Heartbeat)
    assert request_id(b'{"id": 42, "op": ["x"]}') == 42 and request_id(b"garbage") == 0


def test_hello_carries_token_and_spare_and_pushes_parse():
    h = parse_request(b'{"op": "hello", "job": "j", "rank": 4, "world": 4, "ports": {"r": 1}, "token": "t", '
                      b'"spare": true}')
    assert isinstance(h, Hello) and h.token == "t" and h.spare is True
    assert parse_push({"op": "failover", "job": "j", "rank": 1, "spare": 4, "epoch": 1, "ports": {"r": 4}}).spare == 4
    assert parse_push({"op": "dead", "job": "j", "rank": 1, "reason": "x"}).op == "dead"
    assert parse_push({"op": "port_failed", "job": "j", "device": "r", "port": 3}).port == 3
    with pytest.raises(ScenarioError):
        parse_push({"op": "failover", "job": "j"})


def test_rate_log_aggregates_a_flood():
    from lightrail.runtime.controller.metrics import RateLog

    lines, now = [], [0.0]
    rlog = RateLog(lambda event, **f: lines.append((event, f)), burst=5, clock=lambda: now[0])
    for i in range(10_000):
        now[0] = i * 1e-5  # 10,000 in 0.1 s
        rlog("bad_request", n=i)
    assert len(lines) == 5
    now[0] = 1.5
    rlog.flush()
    assert lines[-1] == ("bad_request_suppressed", {"count": 9_995, "window_s": 1.0})
    rlog("bad_request", n=-1)
    assert lines[-1] == ("bad_request", {"n": -1})


def test_metrics_counters_stay_monotonic_past_100k(make):
    from lightrail.runtime.controller.metrics import metrics_text
    from lightrail.runtime.controller.ranks import RankServer

    c, _ = make()
    server = RankServer(c, c.config)
    for _ in range(100_123):
        server.metrics.granted(0.001)
    c.counters["requests"] = 250_000
    values = dict(line.rsplit(" ", 1) for line in metrics_text(c).splitlines() if not line.startswith("#"))
    assert float(values["lightrail_acquire_latency_seconds_count"]) == 100_123  # not capped at the 100k window
    assert float(values["lightrail_acquire_to_grant_seconds_count"]) == 100_123
    assert float(values['lightrail_acquire_to_grant_seconds_bucket{le="0.001"}']) == 100_123
    assert float(values["lightrail_requests_total"]) == 250_000
    assert float(values['lightrail_acquire_latency_seconds{quantile="0.99"}']) == pytest.approx(0.001)


def test_failover_rebinds_the_spares_connection(make, hello):
    """rank_failed returning a failover: the failed rank's connection is unbound, the spare's connection now
    speaks for the failed rank (pushes to it reach the spare), the old spare id speaks for nobody."""
    from lightrail.runtime.controller.ranks import Conn, RankServer

    async def run():
        c, _ = make()
        server = RankServer(c, c.config)
        hello(c, "j", 0, 2, rail0=0)
        hello(c, "j", 1, 2, rail0=1)
        calls = []
        c.rank_failed = lambda job, rank: calls.append((job, rank)) or {"failover": True, "spare": 2, "epoch": 1,
                                                                         "rewire_s": 0.0}
        conns = {}
        for r in (0, 1, 2):
            conns[r] = Conn(FakeWriter(), f"127.0.0.1:{r}", 0.0, 0.0, bound=("j", r))
            server.bound[("j", r)] = conns[r]
            server.open.add(conns[r])
        server.fail(conns[1], "test")
        assert calls == [("j", 1)]
        assert conns[1].bound is None and conns[2].bound == ("j", 1)
        assert server.bound[("j", 1)] is conns[2] and ("j", 2) not in server.bound
        server.push("j", 1, {"op": "revoke"})
        assert conns[2].writer.out == [{"op": "revoke"}] and conns[1].writer.out == []
        server.fail(conns[1], "again")  # already failed: nothing more
        assert calls == [("j", 1)]
        # silence of every rank: this process's network is the suspect, nobody is failed (issue 31)
        now = c.config.heartbeat_timeout + 1.0
        server.clock = lambda: now
        c.rank_failed = lambda job, rank: calls.append((job, rank)) or {"failover": False}
        server.sweep()
        assert calls[1:] == [] and not conns[0].writer.closed
        # rank 1 (the spare's connection) is heard: silent rank 0 is failed and its connection closed
        conns[2].last_seen = now
        server.sweep()
        assert calls[1:] == [("j", 0)] and conns[0].writer.closed and not conns[2].writer.closed

    asyncio.run(run())


def test_the_grafana_dashboard_reads_metrics_the_controller_exposes(make):
    """Every metric docs/grafana-controller.json queries is one /metrics shows (a renamed metric breaks this)."""
    import re
    from pathlib import Path

    from lightrail.runtime.controller.metrics import metrics_text
    from lightrail.runtime.controller.ranks import RankServer

    c, _ = make()
    server = RankServer(c, c.config)
    server.metrics.granted(0.001)
    server.metrics.request("acquire", 0.0001)
    shown = {line.split("{")[0].split(" ")[0] for line in metrics_text(c).splitlines() if not line.startswith("#")}
    dashboard = json.loads((Path(__file__).parents[3] / "docs" / "grafana-controller.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    wanted = {m for e in exprs for m in re.findall(r"lightrail_[a-z_]+", e)}
    assert len(wanted) >= 15
    assert wanted <= shown, sorted(wanted - shown)


def test_a_rank_whose_heartbeat_waits_unread_is_not_failed(make, hello):
    """Under overload the loop may reach the sweep before it reads a heartbeat already in the socket: that rank
    spoke and is not failed; once the bytes are read and it stays silent, it is."""
    import socket

    from lightrail.runtime.controller.ranks import Conn, RankServer

    class SockWriter(FakeWriter):
        def __init__(self, sock):
            super().__init__()
            self.sock = sock

        def get_extra_info(self, name: str, default=None):
            return self.sock if name == "socket" else default

    async def run():
        c, _ = make()
        server = RankServer(c, c.config)
        hello(c, "j", 0, 1, rail0=0)
        failed = []
        c.rank_failed = lambda job, rank: failed.append((job, rank)) or {"failover": False}
        mine, peer = socket.socketpair()
        conn = Conn(SockWriter(mine), "peer", 0.0, 0.0, bound=("j", 0))
        server.bound[("j", 0)], server.clock = conn, lambda: 100.0
        server.open.add(conn)
        peer.sendall(b'{"op": "heartbeat"}\n')
        server.sweep()
        assert failed == [] and conn.last_seen == 100.0 and not conn.writer.closed
        mine.recv(100)
        server.clock = lambda: 200.0
        server.swept = 200.0 - server.period()  # the sweeper ran on time (a late one would be a pause of ours)
        server.sweep()
        assert failed == [("j", 0)] and conn.writer.closed
        mine.close()
        peer.close()

    asyncio.run(run())
