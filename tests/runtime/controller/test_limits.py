"""Limits and liveness on a real controller process: the connection cap (one error line, then closed; the
admin API still answers), the hello timeout, a silent rank failed after heartbeat_timeout while a heartbeating
one lives on, a repeated acquire superseding the first (answered, never orphaned), and a hypothesis fuzz of
hostile lines, each answered with an error while /healthz stays fine and /state does not change."""

from __future__ import annotations

import json
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tests.runtime.controller.conftest import NATIVE_FRONTEND  # noqa: E402


def _auth(info: dict) -> dict:
    return {"Authorization": f"Bearer {info['operator_token']}"}


def _admin(info: dict, path: str):
    return httpx.get(f"http://{info['host']}:{info['admin_port']}{path}", headers=_auth(info), timeout=10)


def _register(info: dict, job: str, world: int) -> str:
    r = httpx.post(f"http://{info['host']}:{info['admin_port']}/jobs", json={"job": job, "world": world},
                   headers=_auth(info), timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["token"]


def _metrics(info: dict) -> dict[str, float]:
    text = _admin(info, "/metrics").text
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


class Raw:
    def __init__(self, info: dict, timeout: float = 10):
        self.sock = socket.create_connection((info["host"], info["port"]), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, line: bytes) -> None:
        self.sock.sendall(line + b"\n")

    def ask(self, message: dict) -> dict:
        self.send(json.dumps(message).encode())
        return json.loads(self.file.readline())

    def read(self) -> dict | None:
        line = self.file.readline()
        return json.loads(line) if line else None

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.mark.parametrize("frontend", ["loop", NATIVE_FRONTEND])
def test_connection_cap_refuses_with_one_line_and_admin_stays_up(spawn, tmp_path):
    proc, info = spawn(tmp_path / "c.db", "--max-connections", "3")
    assert info["max_connections"] == 3
    held = [Raw(info) for _ in range(3)]
    for r in held:  # each is served (and counted as open)
        assert r.ask({"id": 1, "op": "heartbeat"})["ok"] is True
    extra = Raw(info)
    refused = extra.read()
    assert refused["ok"] is False and refused["error"]["field"] == "max_connections"
    assert extra.read() is None  # then closed
    extra.close()
    assert httpx.get(f"http://{info['host']}:{info['admin_port']}/healthz", timeout=10).json() == {"ok": True}
    held.pop().close()
    deadline = time.monotonic() + 10
    while _metrics(info)["lightrail_connections"] > 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    again = Raw(info)  # a slot is free again
    assert again.ask({"id": 2, "op": "heartbeat"})["ok"] is True
    m = _metrics(info)
    assert m["lightrail_connections_refused_total"] == 1 and m["lightrail_connections"] == 3
    for r in [*held, again]:
        r.close()


@pytest.mark.parametrize("frontend", ["loop", NATIVE_FRONTEND])
def test_a_connection_that_never_says_hello_is_closed(spawn, tmp_path):
    proc, info = spawn(tmp_path / "c.db", "--hello-timeout", "300ms")
    r = Raw(info)
    assert r.ask({"id": 1, "op": "heartbeat"})["ok"] is True  # a heartbeat is no hello: the clock runs on
    reply = r.read()
    assert reply["ok"] is False and reply["error"]["field"] == "hello_timeout"
    assert r.read() is None
    r.close()
    assert _metrics(info)["lightrail_connection_timeouts_total"] == 1


@pytest.mark.parametrize("frontend", ["loop", NATIVE_FRONTEND])
def test_a_silent_rank_is_failed_and_a_heartbeating_one_lives(spawn, tmp_path):
    """heartbeat_timeout 0.4 s: rank 0 sends heartbeats every 0.1 s for 1.2 s and is still served; rank 1 says
    nothing after hello and is failed: its connection closed, the failure counted and logged as silence."""
    proc, info = spawn(tmp_path / "c.db", "--heartbeat-timeout", "400ms")
    token = _register(info, "j", 2)
    ranks = [Raw(info) for _ in range(2)]
    for r, c in enumerate(ranks):
        assert c.ask({"id": 1, "op": "hello", "job": "j", "rank": r, "world": 2, "ports": {"rail0": r},
                      "token": token})["ok"]
    end = time.monotonic() + 1.2
    while time.monotonic() < end:
        assert ranks[0].ask({"id": 2, "op": "heartbeat"})["ok"] is True
        time.sleep(0.1)
    assert ranks[1].read() is None  # closed by the controller
    assert ranks[0].ask({"id": 3, "op": "group", "job": "j", "key": "k", "members": [0]})["ok"] is True
    m = _metrics(info)
    assert m["lightrail_rank_failures_total"] == 1 and m["lightrail_connection_timeouts_total"] == 1
    log = (tmp_path / "controller-0.log").read_text().splitlines()
    failed = [json.loads(line) for line in log if '"rank_failed"' in line]
    assert [(f["job"], f["rank"]) for f in failed] == [("j", 1)] and "silent" in failed[0]["reason"]
    for c in ranks:
        c.close()


def test_a_repeated_acquire_supersedes_the_first(spawn, tmp_path):
    proc, info = spawn(tmp_path / "c.db")
    token = _register(info, "j", 2)
    ranks = [Raw(info) for _ in range(2)]
    for r, c in enumerate(ranks):
        assert c.ask({"id": 1, "op": "hello", "job": "j", "rank": r, "world": 2, "ports": {"rail0": r},
                      "token": token})["ok"]
    assert ranks[0].ask({"id": 2, "op": "group", "job": "j", "key": "p", "members": [0, 1],
                         "circuits": {"rail0": {"0": 1, "1": 0}}})["ok"]
    ranks[0].send(b'{"id": 3, "op": "acquire", "job": "j", "rank": 0, "key": "p"}')
    ranks[0].send(b'{"id": 4, "op": "acquire", "job": "j", "rank": 0, "key": "p"}')
    first = ranks[0].read()
    assert first["id"] == 3 and first["ok"] is False and first["error"]["type"] == "Superseded"
    assert _admin(info, "/jobs").json()["j"]["groups"]["p"]["waiting"] == [0]
    granted = ranks[1].ask({"id": 2, "op": "acquire", "job": "j", "rank": 1, "key": "p"})
    assert granted["ok"] and granted["granted"]
    second = ranks[0].read()
    assert second["id"] == 4 and second["ok"] and second["granted"]
    assert _metrics(info)["lightrail_superseded_total"] == 1
    for c in ranks:
        c.close()


# --- fuzz ---------------------------------------------------------------------------------------------------------

_json = st.recursive(st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
                     | st.floats(allow_nan=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4), max_leaves=12)
_ops = st.sampled_from(["hello", "group", "acquire", "prepare", "release", "ack", "hold", "bye", "teleport", ""])
_requests = st.fixed_dictionaries({"op": _ops | _json}, optional={
    "id": st.integers(min_value=-(2 ** 64), max_value=2 ** 64) | _json, "job": st.sampled_from(["j", "x"]) | _json,
    "rank": st.integers(-2, 2 ** 64) | _json, "key": _json, "world": _json, "ports": _json, "token": _json,
    "members": _json, "circuits": _json})
_lines = st.one_of(
    _requests.map(lambda d: json.dumps(d).encode()),
    _json.map(lambda v: json.dumps(v).encode()),
    st.binary(min_size=1, max_size=200),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 5000).map(lambda n: b'{"op": ' * n),
    st.integers(2 ** 63, 2 ** 200).map(lambda n: b'{"op": "heartbeat", "id": %d}' % n),
)


def test_fuzz_hostile_lines_each_get_an_error_and_change_nothing(spawn, tmp_path):
    """On one connection that never said hello, every hostile line (random JSON, random bytes, deep nesting,
    huge integers, requests with random fields) is answered with exactly one reply; the connection stays open,
    /state and /jobs are unchanged and /healthz answers (the hello timeout is lifted for the run)."""
    proc, info = spawn(tmp_path / "c.db", "--hello-timeout", "10min", "--heartbeat-timeout", "10min")
    token = _register(info, "j", 1)
    owner = Raw(info)
    assert owner.ask({"id": 1, "op": "hello", "job": "j", "rank": 0, "world": 1, "ports": {"rail0": 3},
                      "token": token})["ok"]
    before = _admin(info, "/state").json(), _admin(info, "/jobs").json()
    r = Raw(info)
    seen = {"n": 0}

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(_lines)
    def check(line: bytes) -> None:
        line = line.replace(b"\n", b" ")
        if not line.strip():
            return
        r.send(line)
        reply = json.loads(r.file.readline())
        assert isinstance(reply, dict) and "ok" in reply, reply
        if not reply["ok"]:
            assert reply["error"]["field"] and reply["error"]["message"], reply
        else:
            assert set(reply) == {"id", "ok", "t"}, (line, reply)  # only a heartbeat succeeds before hello
        seen["n"] += 1

    check()
    assert seen["n"] > 100
    assert r.ask({"id": 7, "op": "heartbeat"})["ok"] is True  # still open and in step
    assert httpx.get(f"http://{info['host']}:{info['admin_port']}/healthz", timeout=10).json() == {"ok": True}
    assert (_admin(info, "/state").json(), _admin(info, "/jobs").json()) == before
    assert owner.ask({"id": 2, "op": "heartbeat"})["ok"] is True
    log = (tmp_path / "controller-0.log").read_text().splitlines()
    assert sum('"bad_request"' in line or '"refused"' in line for line in log) < seen["n"]  # aggregated
    r.close()
    owner.close()
