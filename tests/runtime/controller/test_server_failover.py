"""Failover through the real server: a rank whose connection closes without bye and that says no hello again within
``rejoin_timeout`` (or goes silent) is failed, the job's connected ranks get ``failover`` pushed, and the spare's
connection is re-bound to the failed rank: it says hello again as that rank, with the same token and its own
ports, and then speaks for it (not for its old spare id). Without a spare left, ``dead`` is pushed."""

from __future__ import annotations

import json
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")


class Raw:
    def __init__(self, info: dict):
        self.sock = socket.create_connection((info["host"], info["port"]), timeout=20)
        self.file = self.sock.makefile("rb")
        self.pushed: list[dict] = []
        self.next = 0

    def ask(self, op: str, **fields) -> dict:
        self.next += 1
        self.sock.sendall(json.dumps({"id": self.next, "op": op, **fields}).encode() + b"\n")
        return self.reply(self.next)

    def reply(self, request_id: int) -> dict:
        while True:
            message = json.loads(self.file.readline())
            if "id" not in message:
                self.pushed.append(message)
            elif message["id"] == request_id:
                return message

    def wait_push(self, op: str) -> dict:
        while not any(m["op"] == op for m in self.pushed):
            line = self.file.readline()
            assert line, "closed"
            message = json.loads(line)
            assert "id" not in message, message
            self.pushed.append(message)
        return next(m for m in self.pushed if m["op"] == op)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _setup(spawn, tmp_path, spares: int):
    _, info = spawn(tmp_path / "c.db", "--heartbeat-timeout", "10min", "--rejoin-timeout", "200ms")
    admin = f"http://{info['host']}:{info['admin_port']}"
    auth = {"Authorization": f"Bearer {info['operator_token']}"}
    r = httpx.post(f"{admin}/jobs", json={"job": "j", "world": 2, "spares": spares}, headers=auth, timeout=10)
    token = r.json()["token"]
    ranks = [Raw(info) for _ in range(2 + spares)]
    for r, c in enumerate(ranks):
        reply = c.ask("hello", job="j", rank=r, world=2, ports={"rail0": r}, token=token, spare=r >= 2)
        assert reply["ok"], reply
    assert ranks[0].ask("group", job="j", key="ring", members=[0, 1], circuits={"rail0": {"0": 1, "1": 0}})["ok"]
    return info, admin, auth, token, ranks


def test_a_closed_rank_fails_over_and_the_spares_connection_speaks_for_it(spawn, tmp_path):
    info, admin, auth, token, (r0, r1, spare) = _setup(spawn, tmp_path, spares=1)
    r1.close()  # rank 1 dies without bye
    push = spare.wait_push("failover")
    assert (push["job"], push["rank"], push["spare"], push["epoch"]) == ("j", 1, 2, 1)
    assert r0.wait_push("failover") == push
    # the spare's connection now speaks for rank 1: hello as rank 1 (same token, its own ports), then rank ops
    assert spare.ask("hello", job="j", rank=1, world=2, ports={"rail0": 2}, token=token)["ok"]
    refused = spare.ask("acquire", job="j", rank=2, key="ring")
    assert refused["ok"] is False and refused["error"]["field"] == "rank"
    assert spare.ask("group", job="j", key="ring", members=[0, 1], circuits={"rail0": {"0": 2, "2": 0}})["ok"]
    spare.sock.sendall(b'{"id": 90, "op": "acquire", "job": "j", "rank": 1, "key": "ring"}\n')
    granted = r0.ask("acquire", job="j", rank=0, key="ring")
    assert granted["ok"] and granted["granted"], granted
    assert spare.reply(90)["granted"]
    state = httpx.get(f"{admin}/state", headers=auth, timeout=10).json()
    assert state["devices"]["rail0"]["circuits"] == {"0": 2, "2": 0}
    values = {k: float(v) for k, v in (line.rsplit(" ", 1) for line in httpx.get(
        f"{admin}/metrics", timeout=10).text.splitlines() if not line.startswith("#"))}
    assert values["lightrail_rank_failures_total"] == 1
    for c in (r0, spare):
        c.close()


def test_without_a_spare_left_dead_is_pushed(spawn, tmp_path):
    info, admin, auth, token, (r0, r1, spare) = _setup(spawn, tmp_path, spares=1)
    r1.close()
    spare.wait_push("failover")
    spare.ask("hello", job="j", rank=1, world=2, ports={"rail0": 2}, token=token)
    time.sleep(0.05)
    spare.close()  # the spare (now rank 1) dies too: no spare is left
    dead = r0.wait_push("dead")
    assert (dead["job"], dead["rank"]) == ("j", 1)
    r0.close()


def test_port_fail_and_repair_through_the_admin_api(spawn, tmp_path):
    """The operator marks rank 1's port dead: the job's ranks get ``port_failed``, an acquire of a group using
    it is refused naming the device; after repair the group is granted."""
    info, admin, auth, token, (r0, r1) = _setup(spawn, tmp_path, spares=0)
    r = httpx.post(f"{admin}/devices/rail0/ports/1/fail", headers=auth, timeout=10)
    assert r.status_code == 200, r.text
    push = r0.wait_push("port_failed")
    assert (push["job"], push["device"], push["port"]) == ("j", "rail0", 1)
    refused = r0.ask("acquire", job="j", rank=0, key="ring")
    assert refused["ok"] is False and refused["error"]["field"] == "circuits.rail0", refused
    assert httpx.post(f"{admin}/devices/rail0/ports/1/fail", timeout=10).status_code == 401
    assert httpx.post(f"{admin}/devices/rail0/ports/1/repair", headers=auth, timeout=10).status_code == 200
    r1.sock.sendall(b'{"id": 90, "op": "acquire", "job": "j", "rank": 1, "key": "ring"}\n')
    assert r0.ask("acquire", job="j", rank=0, key="ring")["granted"]
    assert r1.reply(90)["granted"]
    for c in (r0, r1):
        c.close()
