"""The rank's client when its controller goes away, against a scripted controller on loopback (a thread
with a listening socket): what it says after a reconnect (hello, every declared group, a hold for each
group it is inside an op of, every unanswered request with a fresh id, acks of dead leases dropped),
that the caller waiting on the old request gets the new reply, the heartbeat that finds a frozen
controller, and the one line every wait raises once the controller is gone past the bound."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.client import ControllerClient, ControllerError


def test_reconnect_says_hello_redeclares_holds_and_resends_unanswered(scripted, until):
    held_back = set()  # acquires of "wait" are answered only on the second connection

    def answer(m):
        if m["op"] == "acquire" and m["key"] == "wait" and len(ctl.lines) == 1:
            held_back.add(m["id"])
            return None
        if m["op"] == "acquire" and m["key"] == "lease":
            return {"id": m["id"], "ok": True, "granted": True, "lease": 7}
        return {"id": m["id"], "ok": True, "granted": True} if m["op"] == "acquire" else {"id": m["id"], "ok": True}

    ctl = scripted(answer)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=1, token="secret", heartbeat_timeout=None,
                         reconnect_timeout=20)
    try:
        c.hello(4, {"rail0": 1})
        for key in ("op", "lease", "idle", "wait"):
            c.declare(key, [0, 1], {"rail0": {0: 1, 1: 0}})
        c.acquire("op")  # granted per op: inside it until release
        c.acquire("lease", lease=True)  # a lease, its first op running
        c.acquire("idle", lease=False)
        c.release("idle")  # done with: nothing to hold
        pending = c.send("acquire", job="j", rank=1, key="wait")
        until(lambda: held_back, "the first acquire of 'wait' to arrive")
        old_id = next(iter(held_back))
        ctl.drop()
        until(lambda: len(ctl.lines) == 2 and "acquire" in ctl.ops(), "the reconnect to re-send the acquire")
        again = ctl.messages()
        assert [m["op"] for m in again] == ["hello", "group", "group", "group", "group", "hold", "hold", "acquire"]
        assert again[0] == {"id": 0, "op": "hello", "job": "j", "rank": 1, "world": 4, "ports": {"rail0": 1},
                            "token": "secret"}
        assert [m["key"] for m in again[1:5]] == ["op", "lease", "idle", "wait"]
        assert sorted(m["key"] for m in again[5:7]) == ["lease", "op"]  # inside an op of each; not "idle"
        assert not any("first" in m for m in again[5:7])  # from inside the op: held whether or not a peer is
        assert again[7]["key"] == "wait" and again[7]["id"] != old_id  # a fresh id
        reply = c.wait(pending)  # the caller of the old request gets the new reply
        assert reply["granted"] is True
        assert c.reconnects == 1
        # the lease became a held op: its end releases it (and the next op under it holds first)
        assert not c.holds("lease") and not c.enter("lease")
        c.leave("lease")
        until(lambda: ctl.ops()[-1] == "release", "the release of the held lease")
        c.release("op")
        assert c.bye()["ok"] is True  # bye after a reconnect still works
    finally:
        c.close()


def test_after_a_reconnect_lease_acquires_are_holds_until_one_is_refused(scripted, until):
    refuse = threading.Event()

    def answer(m):
        if m["op"] == "acquire":
            return {"id": m["id"], "ok": True, "granted": True, "lease": 3}
        if m["op"] == "ack":
            return None  # never answered before the drop
        if m["op"] == "hold" and refuse.is_set():
            return {"id": m["id"], "ok": False, "error": {"type": "InfeasibleError", "field": "key",
                                                          "message": "circuit rail0:0->1 is not lit"}}
        return {"id": m["id"], "ok": True}

    ctl = scripted(answer)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None, reconnect_timeout=20)
    try:
        c.hello(2, {"rail0": 0})
        c.declare("dp", [0, 1], {"rail0": {0: 1, 1: 0}})
        c.acquire("dp", lease=True)
        c.leave("dp")  # the lease stands, no op in flight
        assert c.holds("dp")
        ctl.send({"op": "revoke", "job": "j", "rank": 0, "key": "dp", "lease": 3})
        until(lambda: "ack" in ctl.ops(), "the ack of the revoke")
        c.acquire("dp", lease=True)  # a new lease, idle after its op
        c.leave("dp")
        ctl.drop()
        until(lambda: len(ctl.lines) == 2 and c.connected, "the reconnect")
        time.sleep(0.2)  # anything the client would still send on its own
        assert ctl.ops() == ["hello", "group"]  # no hold (no op in flight), the unanswered ack dropped
        assert not c.holds("dp") and not c.enter("dp")  # the idle lease is forgotten
        # a peer may be inside the op already: the lease acquire is a hold (no barrier), granted per op
        reply = c.acquire("dp", lease=True)
        assert reply["granted"] and "lease" not in reply and ctl.ops()[-1] == "hold"
        c.release("dp")
        assert ctl.ops()[-1] == "release"
        refuse.set()  # the circuits were switched meanwhile: the hold is refused, the acquire goes out
        assert c.acquire("dp", lease=True)["lease"] == 3
        assert ctl.ops()[-2:] == ["hold", "acquire"] and c.holds("dp")
        c.leave("dp")
        c.acquire("dp", lease=True)  # and from then on acquires are acquires again
        assert ctl.ops()[-1] == "acquire"
    finally:
        c.close()


def test_a_lease_acquire_waiting_at_the_reconnect_becomes_a_hold(scripted, until):
    def answer(m):
        if m["op"] == "acquire" and len(ctl.lines) == 1:
            return None  # the first controller never grants it
        return {"id": m["id"], "ok": True}

    ctl = scripted(answer)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None, reconnect_timeout=20)
    try:
        c.hello(2, {"rail0": 0})
        c.declare("pp", [0, 1], {"rail0": {0: 1, 1: 0}})
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(c.acquire, "pp", lease=True)
            until(lambda: "acquire" in ctl.ops(), "the acquire")
            ctl.drop()
            reply = waiting.result(20)  # the peer is inside the op: the hold joins it
        assert reply["granted"] and reply["held"] and ctl.ops() == ["hello", "group", "hold"]
        assert ctl.messages()[-1]["first"] is True  # in place of the acquire: it only joins a peer's op
    finally:
        c.close()


def test_a_waiting_lease_acquire_keeps_trying_to_hold_and_a_won_hold_answers_it(scripted, until):
    holds = []

    def answer(m):
        if m["op"] == "hold":
            holds.append(m)
            if len(holds) < 4:  # not lit yet (a peer's prepare or hold lights it later)
                return {"id": m["id"], "ok": False, "error": {"type": "InfeasibleError", "field": "key",
                                                              "message": "circuit rail0:0->1 is not lit"}}
            return {"id": m["id"], "ok": True, "key": m["key"], "holders": [0, 1]}
        if m["op"] == "acquire":
            return None  # waits for the next round: the peer is inside this one (it holds)
        return {"id": m["id"], "ok": True}

    ctl = scripted(answer)
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None, reconnect_timeout=20)
    try:
        c.hello(2, {"rail0": 0})
        c.declare("dp", [0, 1], {"rail0": {0: 1, 1: 0}})
        ctl.drop()
        until(lambda: len(ctl.lines) == 2 and c.connected, "the reconnect")
        reply = c.acquire("dp", lease=True)  # hold refused, acquire waits, holds again until one is granted
        assert reply["granted"] and reply["held"] and len(holds) == 4
        assert ctl.ops() == ["hello", "group", "hold", "acquire", "hold", "hold", "hold"]
        c.release("dp")  # a per-op grant
        assert ctl.ops()[-1] == "release"
    finally:
        c.close()


def test_requests_made_while_reconnecting_go_out_once_it_is_back(scripted, until):
    ctl = scripted()
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None, reconnect_timeout=20)
    try:
        c.hello(2, {"rail0": 0})
        ctl.accepting.clear()  # the controller is down for a while: connections queue, nothing is read
        ctl.drop()
        until(lambda: not c.connected, "the loss to be seen")
        ids = [c.send("prepare", detached=False, job="j", rank=0, key=k) for k in ("a", "b")]
        ctl.accepting.set()
        assert [c.wait(i)["ok"] for i in ids] == [True, True]
        assert ctl.ops()[0] == "hello" and [m["key"] for m in ctl.messages()[1:]] == ["a", "b"]
    finally:
        c.close()


def test_refusals_and_failover_pushes_reach_the_caller(scripted, until):
    def answer(m):
        if m["op"] == "acquire":
            return {"id": m["id"], "ok": False, "error": {"type": "Failover", "message": "rank 3 failed over",
                                                          "field": "key", "fix": "re-declare"}}
        return {"id": m["id"], "ok": True}

    ctl = scripted(answer)
    seen = {"failover": [], "dead": []}
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, heartbeat_timeout=None,
                         on_failover=seen["failover"].append, on_dead=seen["dead"].append)
    try:
        c.hello(4, {"rail0": 0})
        assert c.heartbeat()["ok"] is True  # asked by the caller: answered to it
        with pytest.raises(ControllerError) as e:
            c.acquire("dp")
        assert e.value.kind == "Failover" and e.value.field == "key"
        failover = {"op": "failover", "job": "j", "rank": 3, "spare": 4, "epoch": 1, "ports": {"rail0": 4}}
        dead = {"op": "dead", "job": "j", "rank": 2, "reason": "no spare left"}
        port = {"op": "port_failed", "job": "j", "device": "rail0", "port": 5}
        for m in (failover, dead, port):
            ctl.send(m)
        until(lambda: len(c.pushes) == 3, "the pushes")
        assert seen == {"failover": [failover], "dead": [dead, port]}
    finally:
        c.close()


def test_a_frozen_controller_is_found_by_heartbeat_and_waits_end_in_one_line(scripted, until):
    """A controller that accepts and never answers is stalled, not gone: the client waits on one connection past
    ``reconnect_timeout`` up to ``stall_timeout``, then every wait raises one line naming the bound."""
    ctl = scripted()
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=2, timeout=600, heartbeat_timeout=0.2,
                         reconnect_timeout=0.3, stall_timeout=1.0)
    try:
        c.hello(4, {"rail0": 2})
        until(lambda: any(m["op"] == "heartbeat" for m in ctl.lines[0]), "a heartbeat")
        assert c.reconnects == 0  # answered heartbeats keep the connection
        ctl.frozen = True  # reads, never answers: the socket stays open, as a SIGSTOPped controller's does
        request = c.send("acquire", job="j", rank=2, key="dp")
        with pytest.raises(InfeasibleError) as e:
            c.wait(request)  # the client's own 600 s timeout is not what ends it
        text = str(e.value)
        assert e.value.field == "controller" and "\n" not in text
        assert "stall_timeout 1 s" in text and "stalled" in text and "no heartbeat reply" in text
        assert len(ctl.lines) == 2 and c.stalls == 1  # one hello, waiting on its connection (no stale ones queued)
        # the silent connection stayed open while it tried (a hello on a new one takes it over, so a controller
        # that was only slow does not see the rank fail), and was closed when it gave up
        until(lambda: 0 in ctl.ended, "the old connection to be closed")
        assert ctl.ended[0] > ctl.opened[1]
        with pytest.raises(InfeasibleError):
            c.send("release", job="j", rank=2, key="dp")  # nothing more goes out once it gave up
    finally:
        c.close()


def test_a_controller_that_never_comes_back_ends_waits_in_one_line(scripted):
    ctl = scripted()
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, timeout=600, heartbeat_timeout=None,
                         reconnect_timeout=0.5)
    try:
        c.hello(2, {"rail0": 0})
        ctl.frozen = True  # the acquire is never answered
        request = c.send("acquire", job="j", rank=0, key="dp")
        ctl.close()  # the listener is gone: every reconnect is refused
        with pytest.raises(InfeasibleError) as e:
            c.wait(request)
        assert e.value.field == "controller" and "\n" not in str(e.value)
        assert "is gone" in str(e.value) and c.reconnects == 0
    finally:
        c.close()


def test_a_controller_that_keeps_dropping_the_connection_is_not_hammered(scripted):
    ctl = scripted(lambda m: None if m["op"] == "acquire" else {"id": m["id"], "ok": True})  # acquires wait
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=0, timeout=600, heartbeat_timeout=None,
                         reconnect_timeout=30)
    try:
        c.hello(2, {"rail0": 0})
        c.send("acquire", job="j", rank=0, key="dp")
        ctl.flapping = True  # every reconnect's hello is answered, then the connection closes again
        ctl.drop()
        time.sleep(2.0)
        # the backoff goes on across short-lived connections (0.05, 0.1, 0.2, 0.4, 0.8, 1 s): ~6 in 2 s,
        # not the thousands a reset backoff made
        assert 2 <= c.reconnects <= 8 and len(ctl.lines) <= 10
    finally:
        c.close()


def test_a_stalled_controller_is_waited_for_past_reconnect_timeout(scripted, until, caplog):
    """Issue 31: a controller stopped longer than ``reconnect_timeout`` (its kernel still accepts) is waited for;
    its hello answered once it runs again, the rank goes on where it was, with one log line for the stall."""
    ctl = scripted()
    c = ControllerClient("127.0.0.1", ctl.port, job="j", rank=2, timeout=600, heartbeat_timeout=0.1,
                         reconnect_timeout=0.2)
    try:
        c.hello(4, {"rail0": 2})
        ctl.accepting.clear()  # stopped: new connections wait in the queue, unread
        ctl.frozen = True
        request = c.send("acquire", job="j", rank=2, key="dp")
        until(lambda: c.stalls == 1, "the client to find the controller stalled")
        time.sleep(1.0)  # five times reconnect_timeout
        assert c.wait  # (still waiting: nothing raised yet)
        ctl.frozen = False
        ctl.accepting.set()  # running again: the queued hello is read and answered
        assert c.wait(request)["ok"]
        assert c.reconnects == 1 and c.stalls == 1 and len(ctl.lines) == 2  # one reconnect, on one connection
        stalled = [r for r in caplog.records if "stall_timeout" in r.getMessage()]
        assert len(stalled) == 1 and "rank 2 of job 'j'" in stalled[0].getMessage()
    finally:
        c.close()


def test_stall_timeout_must_be_non_negative():
    with pytest.raises(ScenarioError) as e:
        ControllerClient("127.0.0.1", 1, job="j", rank=0, stall_timeout=-1)
    assert e.value.field == "stall_timeout"
