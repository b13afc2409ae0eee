"""Tenancy on a real controller process (issue 17's attacks, each refused and changing nothing): a tenant
declaring a group for another job, sending bye for it, saying hello as another job's rank, speaking for another
rank of its own job, requests before hello; the admin API without or with a wrong operator token, with a foreign
Host header (DNS rebinding). /state and /jobs are compared before and after every attack, and each refusal is
logged with the identity it claimed and the peer's address."""

from __future__ import annotations

import json
import socket

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from lightrail.runtime.controller.client import ControllerClient  # noqa: E402


class Rank:
    """A raw JSON-lines connection (the attacker speaks exactly the bytes the test chooses)."""

    def __init__(self, info: dict):
        self.sock = socket.create_connection((info["host"], info["port"]), timeout=10)
        self.file = self.sock.makefile("rb")
        self.next = 0

    def ask(self, op: str, **fields) -> dict:
        self.next += 1
        self.sock.sendall(json.dumps({"id": self.next, "op": op, **fields}).encode() + b"\n")
        reply = json.loads(self.file.readline())
        assert reply["id"] == self.next, reply
        return reply

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Admin:
    def __init__(self, info: dict):
        self.base = f"http://{info['host']}:{info['admin_port']}"
        self.auth = {"Authorization": f"Bearer {info['operator_token']}"}

    def get(self, path: str, **headers):
        return httpx.get(self.base + path, headers={**self.auth, **headers}, timeout=10)

    def post(self, path: str, body: dict | None = None, *, headers: dict | None = None):
        return httpx.post(self.base + path, json=body, headers=self.auth if headers is None else headers,
                          timeout=10)

    def view(self) -> tuple[dict, dict]:
        """What a refused call must not change: circuits, owners, jobs and groups (not ``connected``: job B's raw
        socket sends no heartbeats, so on a loaded machine the controller may drop it while a test runs)."""
        jobs = self.get("/jobs").json()
        return self.get("/state").json(), {job: {k: v for k, v in info.items() if k != "connected"}
                                           for job, info in jobs.items()}

    def register(self, job: str, world: int, spares: int = 0) -> str:
        r = self.post("/jobs", {"job": job, "world": world, "spares": spares})
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"job", "world", "spares", "token"}
        return r.json()["token"]


@pytest.fixture
def two_tenants(spawn, tmp_path):
    """Job A (2 ranks, holding group "ring" lit) and job B (1 rank, the attacker), both honest so far."""
    proc, info = spawn(tmp_path / "c.db")
    admin = Admin(info)
    ta, tb = admin.register("A", 2), admin.register("B", 1)
    a = [ControllerClient(info["host"], info["port"], job="A", rank=r, timeout=20, token=ta) for r in range(2)]
    for r, c in enumerate(a):
        c.hello(2, {"rail0": r})
    for c in a:
        c.declare("ring", [0, 1], {"rail0": {0: 1, 1: 0}})
    b = Rank(info)
    assert b.ask("hello", job="B", rank=0, world=1, ports={"rail0": 5}, token=tb)["ok"]
    yield info, admin, a, b, (ta, tb), tmp_path / "controller-0.log"
    b.close()
    for c in a:
        c.close()


def _refused(reply: dict, field: str) -> None:
    assert reply["ok"] is False, reply
    assert reply["error"]["field"] == field, reply


RANK_ATTACKS = [
    ("declare a group for another job", "group", {"job": "A", "key": "evil", "members": [0],
                                                  "circuits": {"rail0": {"0": 5}}}, "job"),
    ("bye for another job (the whole job)", "bye", {"job": "A"}, "job"),
    ("bye for another job's rank", "bye", {"job": "A", "rank": 0}, "job"),
    ("acquire another job's group", "acquire", {"job": "A", "rank": 0, "key": "ring"}, "job"),
    ("release another job's group", "release", {"job": "A", "rank": 0, "key": "ring"}, "job"),
    ("speak for another rank of its own job", "acquire", {"job": "B", "rank": 1, "key": "x"}, "rank"),
    ("hello again as another job on a bound connection", "hello",
     {"job": "A", "rank": 0, "world": 2, "ports": {"rail0": 0}, "token": "guess"}, "job"),
]


@pytest.mark.parametrize("what,op,fields,field", RANK_ATTACKS, ids=[a[0] for a in RANK_ATTACKS])
def test_cross_tenant_rank_requests_are_refused_and_change_nothing(two_tenants, what, op, fields, field):
    info, admin, a, b, _, log = two_tenants
    before = admin.view()
    _refused(b.ask(op, **fields), field)
    assert admin.view() == before
    # the victim is unharmed: its ranks still acquire their group
    assert all(r["granted"] for r in _acquire_all(a, "ring"))
    refusals = [json.loads(line) for line in log.read_text().splitlines() if '"refused"' in line]
    assert refusals, "the refusal was not logged"
    last = refusals[-1]
    assert last["job"] == fields["job"] and last["op"] == op and last["peer"].startswith("127.0.0.1:")
    assert last["bound"] == ["B", 0]


def _acquire_all(clients, key):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(clients)) as pool:
        replies = [f.result(timeout=20) for f in [pool.submit(c.acquire, key) for c in clients]]
        list(pool.map(lambda c: c.release(key), clients))
    return replies


def test_hello_as_another_jobs_rank_is_refused_with_any_wrong_token(two_tenants):
    """A fresh connection claiming job A's rank 0 (whose real rank is connected) with B's token, a guess, an
    empty or no token, or for a job that was never registered: refused naming ``token``; nothing changes and
    A's rank keeps its connection (a later acquire of A is served)."""
    info, admin, a, _, (ta, tb), log = two_tenants
    before = admin.view()
    claim = {"job": "A", "rank": 0, "world": 2, "ports": {"rail0": 0}}
    for token in (tb, "x" * 43, "", None, ta[:-1]):
        r = Rank(info)
        extra = {} if token is None else {"token": token}
        _refused(r.ask("hello", **claim, **extra), "token")
        _refused(r.ask("group", job="A", key="evil", members=[0]), "op")  # still nobody: before hello
        r.close()
    r = Rank(info)
    _refused(r.ask("hello", job="ghost", rank=0, world=1, ports={"rail0": 7}, token=tb), "token")
    r.close()
    assert admin.view() == before
    assert all(x["granted"] for x in _acquire_all(a, "ring"))
    lines = [json.loads(line) for line in log.read_text().splitlines() if '"refused"' in line]
    assert any(x["job"] == "A" and x["rank"] == 0 and x["field"] == "token" and x["bound"] is None for x in lines)


def test_requests_before_hello_are_refused_but_heartbeat_is_answered(two_tenants):
    info, admin, _, _, _, _ = two_tenants
    before = admin.view()
    r = Rank(info)
    for op, fields in (("group", {"job": "A", "key": "k", "members": [0]}),
                       ("acquire", {"job": "A", "rank": 0, "key": "ring"}),
                       ("bye", {"job": "A"})):
        reply = r.ask(op, **fields)
        _refused(reply, "op")
        assert reply["error"]["fix"] == "say hello first"
    assert r.ask("heartbeat")["ok"] is True
    r.close()
    assert admin.view() == before


ADMIN_CALLS = [("GET", "/state", None), ("GET", "/jobs", None), ("GET", "/reconfigurations", None),
               ("POST", "/devices/rail0/circuits", {"changes": {"0": 6}, "job": "A"}),
               ("POST", "/devices/rail0/circuits", {"changes": {"6": 7}}),
               ("POST", "/jobs", {"job": "C", "world": 1}), ("DELETE", "/jobs/A", None),
               ("POST", "/devices/rail0/ports/0/fail", None)]


@pytest.mark.parametrize("method,path,body", ADMIN_CALLS, ids=[f"{m} {p}" for m, p, _ in ADMIN_CALLS])
def test_admin_without_or_with_a_wrong_operator_token_is_refused(two_tenants, method, path, body):
    _, admin, _, _, _, _ = two_tenants
    before = admin.view()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": admin.auth["Authorization"][:-1]},
                    {"Authorization": admin.auth["Authorization"].replace("Bearer ", "Basic ")}):
        r = httpx.request(method, admin.base + path, json=body, headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["field"] == "Authorization"
    assert admin.view() == before


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/state", "/jobs"])
def test_a_foreign_host_header_is_refused_on_every_endpoint(two_tenants, path):
    _, admin, _, _, _, _ = two_tenants
    before = admin.view()
    for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example", "[::2]:1", "localhost:abc", "::1",
                 "[::1]x", "localhost:80:80", "localhost:", "127.0.0.1.:80"):
        r = admin.get(path, Host=host)
        assert r.status_code == 400, (host, r.text)
        assert r.json()["field"] == "Host"
    for host in ("127.0.0.1", "localhost:1234", "[::1]:80", "LOCALHOST"):
        assert admin.get(path, Host=host).status_code == 200, host
    assert admin.view() == before


def test_jobs_registered_once_and_ended_by_the_operator(two_tenants):
    """Registering a job with ranks again is a 409 (its token unchanged); DELETE /jobs/{job} ends it: the job
    and its ports are gone from /jobs and /state; then it may be registered again, with a new token."""
    info, admin, a, _, (ta, _), _ = two_tenants
    r = admin.post("/jobs", {"job": "A", "world": 2})
    assert r.status_code == 409 and r.json()["field"] == "job", r.text
    for bad in ({"job": "", "world": 1}, {"job": "C", "world": 0}, {"job": "C", "world": 1, "spares": -1},
                {"job": "C", "world": 1, "colour": "red"}):
        assert admin.post("/jobs", bad).status_code == 422, bad
    assert "C" not in admin.get("/jobs").json()
    c = ControllerClient(info["host"], info["port"], job="A", rank=0, timeout=20, token=ta)
    assert admin.get("/jobs").json()["A"]["registered"] == [0, 1]
    r = httpx.delete(admin.base + "/jobs/A", headers=admin.auth, timeout=10)
    assert r.status_code == 200, r.text
    assert "A" not in admin.get("/jobs").json()
    assert admin.get("/state").json()["owners"]["rail0"] == {"5": "B"}
    assert httpx.delete(admin.base + "/jobs/A", headers=admin.auth, timeout=10).status_code == 400
    assert admin.register("A", 2) != ta
    c.close()
