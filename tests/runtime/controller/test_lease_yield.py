"""Yields: a holder done with a leased group (provisioned mode: it announced another group next) gives the lease
back unasked with ``yield`` and the ops it ran under it, as the ack of a revoke not yet sent. Once every holder
yielded, the ports are free and the next group switches with no revoke round trip; a member behind still runs
its remaining ops first; a rank that yielded and needs the group again while the lease stands is a holder again
at once. Then the client's side (sent only to a controller that takes it, never re-sent after a reconnect), the
torch backend's choice of when to yield, a real controller's /metrics, and random programs with yields."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightrail.errors import ScenarioError
from lightrail.runtime.controller.client import ControllerClient
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.protocol import Ack, Acquire, Yield, parse_request

D = 0.010  # make()'s OCS delay


def yield_(c: Controller, rank: int, key: str, lease: int, ops: int) -> dict:
    return c.yield_lease(Yield(op="yield", job="j", rank=rank, key=key, lease=lease, ops=ops))


def ack(c: Controller, rank: int, key: str, lease: int, ops: int, inside: bool = False) -> dict:
    return c.ack(Ack(op="ack", job="j", rank=rank, key=key, lease=lease, ops=ops, inside=inside))


@pytest.fixture
def pair(lease_pair, acquire):
    """``await pair() -> (c, vt, pushed)``: the conftest's ``lease_pair`` (A = ranks 0 <-> 1, B = ranks 0 <-> 2,
    both switching port 0 of rail0), A granted to ranks 0 and 1 on lease 1 (its switch settled)."""
    async def start():
        c, vt, pushed = lease_pair()
        fa = [acquire(c, "j", r, "A", lease=True) for r in (0, 1)]
        await vt.settle()
        assert [f.result() for f in fa] == [{"lease": 1}, {"lease": 1}]
        return c, vt, pushed
    return start


def _switched(c: Controller, key: str) -> list[float]:
    """When each switch for group ``key`` was made."""
    return [rec["at"] for rec in c.applies if rec["group"] == key]


# --- the controller --------------------------------------------------------------------------------------------------


def test_when_every_holder_yielded_the_next_group_switches_at_once_with_no_revoke(pair, acquire, record_is_safe):
    """A and B take turns on port 0, each on a lease: the holders of the one in use yield, the other's members
    acquire, and it is switched by their acquire and granted exactly one OCS delay later (no revoke pushed)."""
    async def run():
        c, vt, pushed = await pair()
        held, members = "A", {"A": (0, 1), "B": (0, 2)}
        for turn in range(1, 5):
            nxt = "B" if held == "A" else "A"
            lease = c.groups[("j", held)].lease
            for r in members[held]:
                assert yield_(c, r, held, lease, ops=3) == {}
            g = c.groups[("j", held)]
            assert (g.status, g.lease, g.holders, g.ops) == ("idle", None, set(), {})  # over: ports free
            vt.now += 0.5
            t0 = vt.now
            futures = [acquire(c, "j", r, nxt, lease=True) for r in members[nxt]]
            assert _switched(c, nxt)[-1] == t0  # switched by the last member's acquire, not after a revoke
            await vt.settle()
            assert all(f.done() for f in futures) and vt.now == pytest.approx(t0 + D)
            assert [f.result() for f in futures] == [{"lease": turn + 1}] * 2
            assert list(c.latencies)[-2:] == pytest.approx([D, D])
            assert c.grant_latency["switch"].samples[-1] == pytest.approx(D)
            assert c.grant_overhead.samples[-1] == pytest.approx(0.0, abs=1e-9)
            assert not pushed and c.counters["revocations"] == 0 and c.counters["lease_yields"] == 2 * turn
            held = nxt
        assert c.revoke_rtt.count == 0 and c.grant_latency["revoke"].count == 0
        assert c.counters["unsafe_reconfigurations"] == 0 and all(record_is_safe(r) for r in c.applies)

    asyncio.run(run())


def test_without_yields_the_next_group_waits_for_the_acks_of_a_revoke(pair, acquire):
    """The same phase change with no yield: a revoke goes to both holders and B is switched only once both acks
    are in (here 3 ms later), so it is granted 3 ms + the OCS delay after its members acquired."""
    async def run():
        c, vt, pushed = await pair()
        vt.now += 0.5
        t0 = vt.now
        futures = [acquire(c, "j", r, "B", lease=True) for r in (0, 2)]
        assert sorted(r for r, _ in pushed) == [0, 1] and c.counters["revocations"] == 1
        await vt.settle()
        assert not any(f.done() for f in futures) and _switched(c, "B") == []
        vt.now += 0.003
        for r in (0, 1):
            ack(c, r, "A", 1, ops=3)
        assert _switched(c, "B") == [pytest.approx(t0 + 0.003)]
        await vt.settle()
        assert all(f.done() for f in futures) and vt.now == pytest.approx(t0 + 0.003 + D)
        assert list(c.latencies)[-2:] == pytest.approx([0.003 + D] * 2)
        assert c.counters["lease_yields"] == 0 and c.revoke_rtt.count == 1

    asyncio.run(run())


def test_a_holder_still_running_the_last_op_keeps_the_lease_until_it_yields(pair, acquire, record_is_safe):
    """Rank 0 sent its 3 ops and yields; rank 1 is still receiving the third under the lease when B is complete:
    the revoke goes to rank 1 alone, B waits, and rank 1's yield after its op (crossing the revoke) ends the lease
    and switches B; never a port of A switched while rank 1 holds it."""
    async def run():
        c, vt, pushed = await pair()
        assert yield_(c, 0, "A", 1, ops=3) == {}
        assert acquire(c, "j", 0, "B", op="prepare") is None  # rank 0's Agent: yield, then prepare the next group
        g = c.groups[("j", "A")]
        assert (g.status, g.lease, g.holders, g.ops) == ("granted", 1, {1}, {0: 3}) and not pushed
        fb = acquire(c, "j", 2, "B", lease=True)  # B complete: only rank 1's lease keeps it waiting
        assert pushed == [(1, {"op": "revoke", "job": "j", "rank": 1, "key": "A", "lease": 1})]
        vt.now += 1.0
        await vt.settle()
        assert not fb.done() and _switched(c, "B") == [] and c.devices["rail0"].state() == {0: 1, 1: 0}
        assert yield_(c, 1, "A", 1, ops=3) == {}  # its op 3 done (its client drops the revoke: given back)
        assert g.status == "idle" and g.lease is None and _switched(c, "B") == [vt.now]
        assert ack(c, 1, "A", 1, ops=3) == {"stale": True}  # an ack after the yield changes nothing
        f0 = acquire(c, "j", 0, "B", lease=True)
        await vt.settle()
        assert fb.done() and f0.done() and c.devices["rail0"].state() == {0: 2, 2: 0}
        assert c.counters["lease_yields"] == 2 and c.counters["revocations"] == 1
        assert c.counters["unsafe_reconfigurations"] == 0 and all(record_is_safe(r) for r in c.applies)

    asyncio.run(run())


@pytest.mark.parametrize("revoked_first", [False, True], ids=["not-revoked", "revoked"])
def test_a_member_that_yielded_behind_runs_its_remaining_ops_before_the_ports_are_freed(pair, acquire, release,
                                                                                       revoked_first):
    """Rank 0 yields after 4 ops, rank 1 after 2 (its prediction was wrong: it has ops 3 and 4 to run). No holder
    is left but the counts differ: the lease stands and B is not switched. Once B is complete the lease is revoked
    (to nobody: no holder left), so rank 1's acquire runs the rest at once, up to 4, and its release frees the
    ports. Without the revoke yet, rank 1 is a holder again at once (as if it never yielded)."""
    async def run():
        c, vt, pushed = await pair()
        yield_(c, 0, "A", 1, ops=4)
        yield_(c, 1, "A", 1, ops=2)
        g = c.groups[("j", "A")]
        assert (g.status, g.lease, g.holders, g.ops) == ("granted", 1, set(), {0: 4, 1: 2})
        fb = [acquire(c, "j", r, "B", lease=True) for r in ((0, 2) if revoked_first else (0,))]
        await vt.settle()
        assert g.revoking is revoked_first and not pushed and _switched(c, "B") == []
        f1 = acquire(c, "j", 1, "A", lease=True)
        assert f1.done() and g.holders == {1}
        if revoked_first:
            assert f1.result() == {"lease": 1, "ops": 2, "until": 4} and c.counters["rejoins"] == 1
            release(c, "j", 1, "A")  # after its ops 3 and 4
        else:
            assert f1.result() == {"lease": 1, "ops": 2} and c.counters["rejoins"] == 0 and g.limit == {}
            assert g.ops == {0: 4}
            fb.append(acquire(c, "j", 2, "B", lease=True))  # B complete: revoke to rank 1, now a holder again
            assert pushed == [(1, {"op": "revoke", "job": "j", "rank": 1, "key": "A", "lease": 1})]
            await vt.settle()
            assert _switched(c, "B") == []
            ack(c, 1, "A", 1, ops=4)
        assert g.status == "idle" and _switched(c, "B") == [vt.now]
        await vt.settle()
        assert all(f.done() for f in fb) and c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


def test_a_rank_that_yielded_and_needs_the_group_again_holds_it_at_once(pair, acquire, release):
    """Rank 0 yields A and prepares B, but its next op is on A after all: its acquire is granted at once on the same
    lease, with the ops it had run (its client counts on from there), and B no longer counts rank 0 in. The lease
    is then what it was: a revoke reaches both holders, and it ends with both acks."""
    async def run():
        c, vt, pushed = await pair()
        g = c.groups[("j", "A")]
        yield_(c, 0, "A", 1, ops=5)
        assert acquire(c, "j", 0, "B", op="prepare") is None
        assert c.groups[("j", "B")].intents == {0}
        f0 = acquire(c, "j", 0, "A", lease=True)  # wrong prediction: A once more, rank 1 still holds it
        assert f0.done() and f0.result() == {"lease": 1, "ops": 5}
        assert (g.status, g.lease, g.holders, g.ops, g.limit, g.revoking) == ("granted", 1, {0, 1}, {}, {}, False)
        assert c.groups[("j", "B")].intents == set() and ("j", 0) not in c.intent and not g.intents
        assert c.counters["rejoins"] == 0 and c.counters["lease_yields"] == 1
        fb = [acquire(c, "j", 2, "B", lease=True)]
        await vt.settle()
        assert not pushed and not fb[0].done()  # B is not complete: rank 0 is on A again
        fb.append(acquire(c, "j", 0, "B", lease=True))  # rank 0, done with A for good, without a yield
        assert sorted(r for r, _ in pushed) == [0, 1]  # both holders are told, as for any lease
        ack(c, 0, "A", 1, ops=7)
        await vt.settle()
        assert g.lease == 1 and _switched(c, "B") == []
        ack(c, 1, "A", 1, ops=7)
        assert g.lease is None and _switched(c, "B") == [vt.now]
        await vt.settle()
        assert all(f.done() for f in fb) and c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())


def test_a_rank_that_yielded_a_revoked_lease_waits_for_the_next_round_unless_behind(pair, acquire):
    """Rank 0 yielded A (3 ops), B's members came and the lease is revoked (rank 1, the holder, is told): rank 0's
    acquire of A is not granted on the revoked lease (it is not behind), it waits for the next round, which is
    granted once rank 1 acked and acquired too (B, prepared only, does not take the ports from acquirers)."""
    async def run():
        c, vt, pushed = await pair()
        yield_(c, 0, "A", 1, ops=3)
        acquire(c, "j", 0, "B", op="prepare")
        acquire(c, "j", 2, "B", op="prepare")
        assert c.groups[("j", "A")].revoking
        f0 = acquire(c, "j", 0, "A", lease=True)
        await vt.settle()
        assert not f0.done()
        ack(c, 1, "A", 1, ops=3)
        f1 = acquire(c, "j", 1, "A", lease=True)
        await vt.settle()
        assert f0.result() == f1.result() == {"lease": 2} and c.counters["rejoins"] == 0

    asyncio.run(run())


def test_stale_yields_change_nothing_and_a_non_member_is_refused(pair, acquire, snapshot):
    """A yield of another lease, of no lease, given twice, or after acking a revoke from inside an op is answered
    ``stale`` and changes nothing (not counted); a rank outside the group is refused naming ``rank``."""
    async def run():
        c, vt, pushed = await pair()
        before = snapshot(c), dict(c.counters)
        assert yield_(c, 0, "A", 2, ops=1) == {"stale": True}  # another lease
        assert yield_(c, 2, "B", 1, ops=1) == {"stale": True}  # no lease at all
        assert (snapshot(c), c.counters) == before
        assert yield_(c, 0, "A", 1, ops=1) == {}
        assert yield_(c, 0, "A", 1, ops=1) == {"stale": True}  # given back already
        acquire(c, "j", 2, "B", op="prepare")
        acquire(c, "j", 0, "B", op="prepare")  # revoked: rank 1 acks from inside its op 2
        ack(c, 1, "A", 1, ops=2, inside=True)
        g = c.groups[("j", "A")]
        assert yield_(c, 1, "A", 1, ops=2) == {"stale": True} and g.holders == {1} and g.limit == {1: 2}
        assert c.counters["lease_yields"] == 1
        with pytest.raises(ScenarioError) as e:
            yield_(c, 3, "A", 1, ops=1)
        assert e.value.field == "rank"

    asyncio.run(run())


def test_the_yield_message_is_validated_naming_its_field():
    line = {"id": 4, "op": "yield", "job": "j", "rank": 1, "key": "pp:0<->1", "lease": 3, "ops": 7}
    m = parse_request(json.dumps(line).encode())
    assert isinstance(m, Yield) and (m.lease, m.ops, m.key) == (3, 7, "pp:0<->1")
    for bad, field in (({"lease": 0}, "lease"), ({"ops": -1}, "ops"), ({"ops": None}, "ops"),
                       ({"inside": True}, "inside"), ({"lease": "3x"}, "lease")):
        with pytest.raises(ScenarioError) as e:
            parse_request(json.dumps({**line, **bad}).encode())
        assert e.value.field == field, (bad, e.value)
    with pytest.raises(ScenarioError) as e:
        parse_request(json.dumps({k: v for k, v in line.items() if k != "ops"}).encode())
    assert e.value.field == "ops"


def test_the_server_answers_a_yield_and_counts_it_on_metrics(pair, acquire):
    pytest.importorskip("prometheus_client")
    import lightrail.runtime.controller.ranks as ranks_mod
    from lightrail.runtime.controller.metrics import metrics_text

    async def run():
        c, vt, pushed = await pair()
        server = ranks_mod.RankServer(c, c.config)
        replies: list[dict] = []
        writer = SimpleNamespace(write=lambda d: replies.append(json.loads(d)), is_closing=lambda: False)
        for r in (0, 1):
            conn = ranks_mod.Conn(writer, f"p{r}", 0.0, 0.0, bound=("j", r))
            server.request(conn, b'{"id":9,"op":"yield","job":"j","rank":%d,"key":"A","lease":1,"ops":2}' % r)
        server.request(conn, b'{"id":10,"op":"yield","job":"j","rank":0,"key":"A","lease":1,"ops":2}')  # rank 1's
        return c, replies, metrics_text(c, server.metrics)

    c, replies, text = asyncio.run(run())
    assert replies[:2] == [{"id": 9, "ok": True}] * 2 and c.groups[("j", "A")].lease is None
    assert replies[2]["ok"] is False and replies[2]["error"]["field"] == "rank"  # speaks for another rank
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(values["lightrail_lease_yields_total"]) == 2 and float(values["lightrail_revocations_total"]) == 0


# --- the client ------------------------------------------------------------------------------------------------------


@pytest.fixture(name="yielding")
def yielding_fixture(scripted):
    """``start(yields=..., answer_yield=True)``: a scripted controller that grants leases and, if ``yields``,
    says so in its hello reply."""

    def start(*, yields: bool, answer_yield: bool = True):
        def answer(m):
            if m["op"] == "hold":  # after a reconnect: no peer's op to join, the client acquires
                return {"id": m["id"], "ok": True, "held": False}
            if m["op"] == "hello":
                return {"id": m["id"], "ok": True, "registered": 1, "world": 2, **({"yields": True} if yields else {})}
            if m["op"] == "acquire":
                return {"id": m["id"], "ok": True, "granted": True, "lease": 5}
            if m["op"] == "yield" and not answer_yield:
                return None
            return {"id": m["id"], "ok": True}
        return scripted(answer)

    return start


def test_the_client_yields_an_idle_lease_in_one_message_and_acquires_again(yielding, until):
    ctl = yielding(yields=True)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None)
    try:
        c.hello(2, {"rail0": 0})
        c.declare("pp", [0, 1], {"rail0": {0: 1, 1: 0}})
        assert c.acquire("pp", lease=True)["lease"] == 5
        assert not c.yield_lease("pp")  # inside its first op: nothing
        c.leave("pp")
        assert c.enter("pp") and not c.yield_lease("pp")  # inside its second
        c.leave("pp")
        sent = c.requests
        assert c.yield_lease("pp") and not c.holds("pp") and not c.enter("pp") and c.requests == sent + 1
        assert not c.yield_lease("pp") and not c.yield_lease("dp")  # nothing left to give back
        until(lambda: ctl.messages()[-1]["op"] == "yield", "the yield")
        assert ctl.messages()[-1] == {"id": ctl.messages()[-1]["id"], "op": "yield", "job": "j", "rank": 0,
                                      "key": "pp", "lease": 5, "ops": 2}
        assert c.acquire("pp", lease=True)["lease"] == 5 and ctl.messages()[-1]["op"] == "acquire"
        c.leave("pp")
        ctl_revoke = {"op": "revoke", "job": "j", "rank": 0, "key": "pp", "lease": 5}
        ctl.conns[-1].sendall(json.dumps(ctl_revoke).encode() + b"\n")
        until(lambda: ctl.messages()[-1]["op"] == "ack", "the ack")
        assert not c.yield_lease("pp")  # revoked and acked: nothing to yield
    finally:
        c.close()


def test_the_client_never_yields_to_a_controller_that_does_not_take_it(yielding):
    ctl = yielding(yields=False)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None)
    try:
        c.hello(2, {"rail0": 0})
        c.declare("pp", [0, 1], {"rail0": {0: 1, 1: 0}})
        c.acquire("pp", lease=True)
        c.leave("pp")
        assert not c.yield_lease("pp") and c.holds("pp")  # kept: an older controller would refuse the yield
        time.sleep(0.1)
        assert [m["op"] for m in ctl.messages()] == ["hello", "group", "acquire"]
    finally:
        c.close()


def test_a_yield_unanswered_at_a_reconnect_is_not_sent_again(yielding, until):
    """The restarted controller knows no lease: a yield of the lost connection's lease is dropped, as an ack is."""
    ctl = yielding(yields=True, answer_yield=False)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None, reconnect_timeout=20)
    try:
        c.hello(2, {"rail0": 0})
        c.declare("pp", [0, 1], {"rail0": {0: 1, 1: 0}})
        c.acquire("pp", lease=True)
        c.leave("pp")
        assert c.yield_lease("pp")
        until(lambda: ctl.messages()[-1]["op"] == "yield", "the yield")
        ctl.drop()
        until(lambda: len(ctl.lines) == 2 and c.connected, "the reconnect")
        time.sleep(0.2)
        assert [m["op"] for m in ctl.messages()] == ["hello", "group"]
        c.acquire("pp", lease=True)
        c.leave("pp")
        assert c.yield_lease("pp")  # the new controller's hello said yields too
    finally:
        c.close()


# --- a real controller and its clients -------------------------------------------------------------------------------


def test_real_clients_yield_and_the_next_pair_switches_with_no_revoke(spawn, tmp_path, until):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    operator = secrets.token_urlsafe(24)
    proc, info = spawn(tmp_path / "c.db", env={**os.environ, "LIGHTRAIL_OPERATOR_TOKEN": operator})
    admin = httpx.Client(base_url=f"http://127.0.0.1:{info['admin_port']}", timeout=10,
                         headers={"Authorization": f"Bearer {operator}"})
    token = admin.post("/jobs", json={"job": "j", "world": 3}).json()["token"]
    revokes: list[tuple[int, str]] = []
    clients = [ControllerClient("127.0.0.1", info["port"], job="j", rank=r, token=token, timeout=20,
                                on_revoke=lambda key, inside, r=r: revokes.append((r, key))) for r in range(3)]
    try:
        for r, client in enumerate(clients):
            assert client.hello(3, {"rail0": r})["yields"] is True
        clients[0].declare("A", [0, 1], {"rail0": {0: 1, 1: 0}}, phase="pp")
        clients[0].declare("B", [0, 2], {"rail0": {0: 2, 2: 0}}, phase="dp")

        async def op(ranks, key):
            return await asyncio.gather(*[asyncio.to_thread(clients[r].acquire, key, lease=True) for r in ranks])

        assert all("lease" in reply for reply in asyncio.run(op((0, 1), "A")))
        for r in (0, 1):
            clients[r].leave("A")
            assert clients[r].yield_lease("A")
        until(lambda: admin.get("/jobs").json()["j"]["groups"]["A"]["lease"] is None, "both yields in")
        assert all("lease" in reply for reply in asyncio.run(op((0, 2), "B")))
        text = admin.get("/metrics").text
        assert admin.get("/state").json()["devices"]["rail0"]["circuits"] == {"0": 2, "2": 0}
        for client in clients:
            client.bye()
    finally:
        for client in clients:
            client.close()
        admin.close()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(values["lightrail_lease_yields_total"]) == 2 and float(values["lightrail_revocations_total"]) == 0
    assert float(values["lightrail_unsafe_reconfigurations_total"]) == 0 and revokes == []


# --- the torch backend's choice ---------------------------------------------------------------------------------------


class _Client:
    """What Agent._prepare calls, recorded in order."""

    def __init__(self, held=()):
        self.calls, self.held = [], set(held)

    def yield_lease(self, key):
        self.calls.append(("yield", key))
        return True

    def holds(self, key):
        return key in self.held

    def prepare(self, key, wait=True):
        self.calls.append(("prepare", key))


@pytest.mark.parametrize(("nxt", "held", "calls"), [
    ("dp", (), [("yield", "pp"), ("prepare", "dp")]),  # conflicts on port 0: yield first, then prepare
    ("far", (), [("prepare", "far")]),  # other ports: the lease is kept
    ("same", (), [("prepare", "same")]),  # the same circuits: no conflict
    ("unknown", (), [("yield", "pp"), ("prepare", "unknown")]),  # unknown circuits: yield
    ("dp", ("dp",), [("yield", "pp")]),  # held already: no prepare
    ("pp", (), []), (None, (), []),  # no change of group, or no prediction (on-demand)
])
def test_the_agent_yields_before_a_next_group_that_conflicts(nxt, held, calls):
    torch_backend = pytest.importorskip("lightrail.runtime.torch_backend")
    from lightrail.workload.parallel import Layout

    agent = torch_backend.Agent(torch_backend.BackendConfig(layout=Layout.from_degrees(8, tp=2, pp=2)))
    agent.client = _Client(held)
    agent.circuits = {"pp": {"rail0": {0: 1, 1: 0}}, "dp": {"rail0": {0: 2, 2: 0}},
                      "far": {"rail0": {2: 3, 3: 2}, "rail1": {0: 1}}, "same": {"rail0": {0: 1}}}
    agent._prepare("pp", nxt)
    assert agent.client.calls == calls


# --- random programs with yields -------------------------------------------------------------------------------------


def _yielding(LeaseHarness):
    """LeaseHarness whose ranks, leaving an op under a lease they hold, sometimes yield it (often at a change of
    group, as the torch backend does, now and then wrongly before another op on it) and then prepare the next
    group. A rank that yielded a lease that stands, not revoked, is a holder again at its acquire with no barrier,
    so it starts that op only when it could have started it under the lease (every rank past earlier blocks)."""

    class Yielding(LeaseHarness):
        def __init__(self, seed: int, *, bursty: bool, prepare: float = 0.0, change: float = 0.7,
                     wrong: float = 0.15):
            super().__init__(seed, bursty=bursty, prepare=prepare)
            self.change, self.wrong = change, wrong
            self.yields = self.readmitted = self.freed = 0

        def _may_start(self, rank, pc: int) -> bool:
            if not super()._may_start(rank, pc):
                return False
            _, block, key = self.programs[rank][pc]
            g = self.c.groups[(rank[0], key)]
            readmit = g.lease is not None and not g.revoking and rank[1] in g.ops
            return not readmit or self._all_past(rank[0], block)

        def _poll(self) -> None:
            for rank, fut in self.futures.items():
                if fut.done() and self.phase[rank] == "waiting" and not fut.cancelled():
                    reply = fut.result()
                    self.readmitted += reply is not None and "ops" in reply and "until" not in reply
            super()._poll()

        def step(self, rank, *, drain: bool = False) -> bool:
            pc = self.pc[rank]
            moved = super().step(rank, drain=drain)
            if not moved or self.pc[rank] != pc + 1:
                return moved
            job, key = rank[0], self.programs[rank][pc][2]
            lease = self.leases[rank].get(key)
            if lease is None or lease["in_op"] or lease["revoked"]:
                return moved
            program = self.programs[rank]
            nxt = program[pc + 1][2] if pc + 1 < len(program) else None
            if self.rng.random() >= (self.wrong if nxt == key else self.change):
                return moved
            del self.leases[rank][key]
            reply = self.c.yield_lease(Yield(op="yield", job=job, rank=rank[1], key=key, lease=lease["id"],
                                             ops=lease["ops"]))
            assert reply == {}, (self.seed, rank, key, reply)  # the rank holds it: never stale
            self.yields += 1
            self.freed += self.c.groups[(job, key)].lease is None  # its last holder: the lease ended
            if nxt is not None and nxt != key and nxt not in self.leases[rank] and self.rng.random() < 0.7:
                self.c.acquire(Acquire(op="prepare", job=job, rank=rank[1], key=nxt))
            return moved

        async def run(self, steps: int = 1500) -> None:
            from tests.runtime.controller.conftest import drive
            await drive(self, steps, stop_early=True)
            assert all(f.done() and not f.cancelled() for f in self.futures.values())
            for g in self.c.groups.values():  # left: idle groups, and leases nobody needed back (some yielded)
                assert not g.waiters and not g.intents, (self.seed, g)
                assert g.status == "idle" or (g.lease is not None and not g.revoking and g.holders
                                              and g.holders | set(g.ops) == g.members), (self.seed, g)
            assert not self.vt.timers and not self.c._tasks

    return Yielding


def test_yields_in_random_programs_are_safe_live_and_used(LeaseHarness):
    """60 seeds each settled and bursty: never a switched port of a group in use or leased, never a grant before
    the barrier and the light, every program finishes; and the yields happen, end leases, and are taken back."""
    Yielding = _yielding(LeaseHarness)
    totals = {"yields": 0, "counted": 0, "freed": 0, "readmitted": 0, "rejoins": 0, "revocations": 0,
              "under_lease": 0}
    for bursty in (False, True):
        for seed in range(60):
            h = Yielding(seed, bursty=bursty, prepare=0.3 if bursty else 0.0)
            asyncio.run(h.run())
            totals["yields"] += h.yields
            totals["counted"] += h.c.counters["lease_yields"]
            totals["readmitted"] += h.readmitted
            totals["freed"] += h.freed
            totals["rejoins"] += h.c.counters["rejoins"]
            totals["revocations"] += h.c.counters["revocations"]
            totals["under_lease"] += h.under_lease_ops
    assert totals["counted"] == totals["yields"] > 1000 and totals["freed"] > 150, totals
    assert totals["readmitted"] > 400 and totals["rejoins"] > 0 and totals["revocations"] > 50, totals
    assert totals["under_lease"] > 3000, totals


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32 - 1), bursty=st.booleans(), prepare=st.sampled_from([0.0, 0.3, 0.8]),
       change=st.sampled_from([0.3, 1.0]), wrong=st.sampled_from([0.0, 0.15, 0.5]))
def test_yields_under_random_interleavings_hypothesis(LeaseHarness, seed, bursty, prepare, change, wrong):
    h = _yielding(LeaseHarness)(seed, bursty=bursty, prepare=prepare, change=change, wrong=wrong)
    asyncio.run(h.run())
