"""A rank's hello on a new connection while its old one is still open (issue 31: a paused controller resumes
with the rank's reconnect and its stale connection both unread): the new connection takes over, and the
controller forgets what the old one held (leases, per-op holds, waits), as it does when a connection closes
without bye. The client forgot them too when it reconnected (it holds again what it is inside, and its leases
not in use are gone): a lease the controller kept would be revoked on the new connection, the client (knowing
no such lease) would not ack it, and the conflicting group would wait for ever."""

from __future__ import annotations

import asyncio
import json

from tests.runtime.controller.conftest import FakeWriter

from lightrail.runtime.controller.ranks import Conn, RankServer


def _line(**message) -> bytes:
    return json.dumps(message).encode()

def _said_hello(server: RankServer, token: str, peer: str, rank: int, rail: str) -> Conn:
    """A new connection of job j's ``rank`` (world 3, its port ``rank`` on ``rail``) that said hello."""
    new = Conn(FakeWriter(), peer, 0.0, 0.0)
    server.open.add(new)
    server.request(new, _line(id=1, op="hello", job="j", rank=rank, world=3, ports={rail: rank}, token=token))
    assert new.writer.out[-1]["ok"]
    return new



def test_a_rehello_on_a_new_connection_drops_the_old_ones_lease(make):
    async def run():
        c, vt = make()
        server = RankServer(c, c.config)
        token = c.register_job("j", 3)
        conns = {r: Conn(FakeWriter(), f"peer:{r}", 0.0, 0.0) for r in range(3)}

        def say(conn: Conn, **message) -> dict:
            conn.writer.out.clear()
            server.request(conn, _line(**message))
            return conn.writer.out[-1] if conn.writer.out else {}

        for r, conn in conns.items():
            server.open.add(conn)
            assert say(conn, id=1, op="hello", job="j", rank=r, world=3, ports={"rail0": r}, token=token)["ok"]
        say(conns[0], id=2, op="group", job="j", key="A", members=[0, 1], circuits={"rail0": {"0": 1, "1": 0}})
        say(conns[0], id=3, op="group", job="j", key="B", members=[0, 2], circuits={"rail0": {"0": 2, "2": 0}})
        for r in (0, 1):
            server.request(conns[r], _line(id=4, op="acquire", job="j", rank=r, key="A", lease=True))
        await vt.settle()
        assert "lease" in conns[0].writer.out[-1] and c.lease_of("j", "A", 0) is not None
        for r in (0, 1):  # the op under the lease completed; the lease stands (no op in flight)
            conns[r].writer.out.clear()
        # rank 0 reconnects (the controller was paused): its hello on a new connection is read first
        fresh = Conn(FakeWriter(), "peer:0b", 0.0, 0.0)
        server.open.add(fresh)
        assert say(fresh, id=1, op="hello", job="j", rank=0, world=3, ports={"rail0": 0}, token=token)["ok"]
        assert conns[0].writer.closed and server.bound[("j", 0)] is fresh
        assert c.lease_of("j", "A", 0) is None  # forgotten with the old connection, as the client forgot it
        assert server.counters["rank_failures"] == 0 and ("j", 0) in c.connected
        # B (conflicting with A on port 0) is granted once rank 1 gives its lease back: no ack is awaited from
        # rank 0, whose client knows no lease on A any more
        server.request(fresh, _line(id=5, op="acquire", job="j", rank=0, key="B"))
        server.request(conns[2], _line(id=5, op="acquire", job="j", rank=2, key="B"))
        await vt.settle()
        revokes = [m for m in conns[1].writer.out if m.get("op") == "revoke"]
        assert revokes and not [m for m in fresh.writer.out if m.get("op") == "revoke"]
        server.request(conns[1], _line(id=6, op="ack", job="j", rank=1, key="A", lease=revokes[0]["lease"], ops=1,
                                       inside=False))
        await vt.settle()
        assert any(m.get("id") == 5 and m.get("granted") for m in fresh.writer.out), fresh.writer.out
        assert any(m.get("id") == 5 and m.get("granted") for m in conns[2].writer.out), conns[2].writer.out

    asyncio.run(run())


def test_a_rank_back_inside_an_op_frees_its_ports_with_its_heartbeat(make):
    """After the takeover (or a restart) the rank's ports wait for it to resume, since it may be inside an op on
    them. Rank 1 comes back inside an op on c (its hold) and sends nothing else until c's barrier completes, which
    waits for rank 2, which waits for b, which needs rank 1's rail0 port: before, b waited out resync_grace (30 s:
    the 30 s request timeouts of test_pause fired first). The client's heartbeat after its holds resumes it."""
    async def run():
        c, vt = make()
        server = RankServer(c, c.config)
        token = c.register_job("j", 3)
        conns = {r: Conn(FakeWriter(), f"peer:{r}", 0.0, 0.0) for r in range(3)}
        for r, conn in conns.items():
            server.open.add(conn)
            server.request(conn, _line(id=1, op="hello", job="j", rank=r, world=3, ports={"rail0": r, "rail1": r},
                                       token=token))
        for key, members, circuits in (("a", [0, 1], {"rail0": {"0": 1, "1": 0}}),
                                       ("b", [0, 2], {"rail0": {"0": 2, "2": 0}}),
                                       ("c", [1, 2], {"rail1": {"1": 2, "2": 1}})):
            server.request(conns[members[0]], _line(id=2, op="group", job="j", key=key, members=members,
                                                    circuits=circuits))
        for key, members in (("c", (1, 2)), ("a", (0, 1))):
            for r in members:
                server.request(conns[r], _line(id=3, op="acquire", job="j", rank=r, key=key, lease=True))
            await vt.settle()
        assert c.lease_of("j", "a", 1) is not None and c.lease_of("j", "c", 1) is not None
        fresh = Conn(FakeWriter(), "peer:1b", 0.0, 0.0)  # rank 1 back, inside its op on c
        server.open.add(fresh)
        for line in (dict(id=1, op="hello", job="j", rank=1, world=3, ports={"rail0": 1, "rail1": 1}, token=token),
                     dict(id=2, op="hold", job="j", rank=1, key="c", op_no=1)):
            server.request(fresh, _line(**line))
        assert fresh.writer.out[-1]["ok"] and ("rail0", 1) in c.unsynced
        t0 = vt.now
        granted = {}

        def check() -> None:
            for r in (0, 2):
                if r not in granted and any(m.get("id") == 4 and m.get("granted") for m in conns[r].writer.out):
                    granted[r] = vt.now
            revoke = next((m for m in conns[0].writer.out if m.get("op") == "revoke"), None)
            if revoke is not None and 0 in c.groups[("j", "a")].holders:  # rank 0 gives a's lease back
                server.request(conns[0], _line(id=5, op="ack", job="j", rank=0, key="a", lease=revoke["lease"],
                                               ops=1, inside=False))

        for r in (0, 2):
            server.request(conns[r], _line(id=4, op="acquire", job="j", rank=r, key="b"))
        server.request(fresh, _line(id=3, op="heartbeat"))  # the client's, after its holds
        assert ("rail0", 1) not in c.unsynced
        await vt.settle(check)
        assert sorted(granted) == [0, 2] and max(granted.values()) - t0 < 1.0 < c.resync_grace

    asyncio.run(run())


def test_a_lease_held_back_by_hold_goes_on_per_op_once_its_other_holders_are_gone(make):
    """Rank 1 comes back inside an op of lease c (its hold) while rank 2's connection, with the lease, is still open;
    then rank 2 comes back too, having forgotten the lease. Kept as a lease, c would wait for rank 2's lease ops,
    which rank 2 asks for with an acquire that waits for rank 1's op to end, while that op waits for rank 2 (the
    job stalled after a pause). Instead c goes on per op, as a round restored by hold: rank 2's first hold for the
    same op joins it, and once both release, c is free."""
    async def run():
        c, vt = make()
        server = RankServer(c, c.config)
        token = c.register_job("j", 3)

        def conn(peer: str) -> Conn:
            new = Conn(FakeWriter(), peer, 0.0, 0.0)
            server.open.add(new)
            return new

        def say(on: Conn, **message) -> dict:
            on.writer.out.clear()
            server.request(on, _line(**message))
            return on.writer.out[-1] if on.writer.out else {}

        def hello(on: Conn, rank: int) -> None:
            assert say(on, id=1, op="hello", job="j", rank=rank, world=3, ports={"rail1": rank}, token=token)["ok"]

        conns = {r: conn(f"peer:{r}") for r in (1, 2)}
        for r, on in conns.items():
            hello(on, r)
        say(conns[1], id=2, op="group", job="j", key="c", members=[1, 2], circuits={"rail1": {"1": 2, "2": 1}})
        for r in (1, 2):
            server.request(conns[r], _line(id=3, op="acquire", job="j", rank=r, key="c", lease=True, op_no=1))
        await vt.settle()
        lease = c.lease_of("j", "c", 2)
        assert lease is not None
        back1 = conn("peer:1b")  # rank 1, inside its first op on c, back while rank 2's connection stands
        hello(back1, 1)
        assert say(back1, id=2, op="hold", job="j", rank=1, key="c", op_no=1)["ok"]
        assert c.lease_of("j", "c", 2) == lease  # rank 2 still holds the lease: c goes on as one
        back2 = conn("peer:2b")  # rank 2 back too: it forgot the lease, and holds first for its first op on c
        hello(back2, 2)
        reply = say(back2, id=2, op="hold", job="j", rank=2, key="c", op_no=1, first=True)
        assert reply["ok"] and reply.get("held") is not False, reply  # joined the round rank 1 is inside
        g = c.groups[("j", "c")]
        assert g.lease is None and g.holders == {1, 2}
        for on, r in ((back1, 1), (back2, 2)):
            assert say(on, id=3, op="release", job="j", rank=r, key="c")["ok"]
        assert g.status.value == "idle" and not g.holders  # the round is over: the next op is a barrier again

    asyncio.run(run())


def test_a_lease_holder_back_alone_rejoins_the_lease_its_peer_still_holds(make):
    """Rank 2's connection is replaced (not inside an op) while rank 1 keeps the lease and runs its ops under it,
    no messages sent: rank 2's client forgot the lease, and its acquire for its next op would wait for a round rank
    1 never starts (rank 1 waits for it inside that op). The op number tells the controller how many ops rank 2
    ran under the lease, so it rejoins the lease at once."""
    async def run():
        c, vt = make()
        server = RankServer(c, c.config)
        token = c.register_job("j", 3)

        def conn(peer: str, rank: int) -> Conn:
            return _said_hello(server, token, peer, rank, "rail1")

        conns = {r: conn(f"peer:{r}", r) for r in (1, 2)}
        server.request(conns[1], _line(id=2, op="group", job="j", key="c", members=[1, 2],
                                       circuits={"rail1": {"1": 2, "2": 1}}))
        for r in (1, 2):
            server.request(conns[r], _line(id=3, op="acquire", job="j", rank=r, key="c", lease=True, op_no=5))
        await vt.settle()
        lease = c.lease_of("j", "c", 1)
        assert lease is not None and c.groups[("j", "c")].base == {1: 4, 2: 4}
        # both ran ops 5 and 6 under the lease; rank 2 is replaced between ops, rank 1 is inside op 7 (no message)
        back = conn("peer:2b", 2)
        assert c.lease_of("j", "c", 2) is None and c.lease_of("j", "c", 1) == lease
        back.writer.out.clear()
        server.request(back, _line(id=2, op="acquire", job="j", rank=2, key="c", lease=True, op_no=7))
        await vt.settle()
        reply = back.writer.out[-1]
        assert reply["ok"] and reply["granted"] and reply["lease"] == lease and reply["ops"] == 2, reply
        assert c.groups[("j", "c")].holders == {1, 2}

    asyncio.run(run())


def test_a_stale_hello_read_after_the_newer_one_takes_nothing_over(make):
    """Both queued while the controller was paused, the rank's given-up connection's hello is read after its new
    connection's: the older connection (accept order) is closed with one error line, the newer one keeps the rank
    (taken over, it would be closed, and the stale one's close then fail the rank)."""
    async def run():
        c, _ = make()
        server = RankServer(c, c.config)
        token = c.register_job("j", 2)
        hello = dict(op="hello", job="j", rank=1, world=2, ports={"rail0": 1}, token=token)
        stale, fresh = (Conn(FakeWriter(), f"peer:{n}", 0.0, 0.0, seq=n) for n in (2, 3))
        for conn in (stale, fresh):
            server.open.add(conn)
        server.request(fresh, _line(id=1, **hello))
        server.request(stale, _line(id=1, **hello))
        assert fresh.writer.out[-1]["ok"] and server.bound[("j", 1)] is fresh and not fresh.writer.closed
        assert not stale.writer.out[-1]["ok"] and stale.writer.out[-1]["error"]["field"] == "rank" and stale.failed
        assert ("j", 1) not in server.absent and server.counters["rank_failures"] == 0

    asyncio.run(run())


def test_a_grant_lost_with_the_replaced_connection_rejoins_its_round(make):
    """Rank 0's grant of b is written to the connection its client just gave up (the controller resumed from a
    pause and granted before reading the reconnect); rank 2 got its grant and is inside the op, waiting for rank 0.
    Rank 0's client sends the acquire again (rejoin, same op number): it joins the round rank 2 is inside instead
    of waiting for the next one, which rank 2 never starts."""
    async def run():
        c, vt = make()
        server = RankServer(c, c.config)
        token = c.register_job("j", 3)

        def conn(peer: str, rank: int) -> Conn:
            return _said_hello(server, token, peer, rank, "rail0")

        conns = {r: conn(f"peer:{r}", r) for r in (0, 2)}
        server.request(conns[0], _line(id=2, op="group", job="j", key="b", members=[0, 2],
                                       circuits={"rail0": {"0": 2, "2": 0}}))
        for r in (0, 2):
            server.request(conns[r], _line(id=3, op="acquire", job="j", rank=r, key="b", op_no=9))
        await vt.settle()
        assert all(on.writer.out[-1].get("granted") for on in conns.values())  # rank 0's never reaches its client
        back = conn("peer:0b", 0)
        back.writer.out.clear()
        server.request(back, _line(id=2, op="acquire", job="j", rank=0, key="b", op_no=9, rejoin=True))
        await vt.settle()
        assert back.writer.out and back.writer.out[-1]["ok"] and back.writer.out[-1].get("rejoined"), back.writer.out
        assert c.groups[("j", "b")].holders == {0, 2}
        for on, r in ((back, 0), (conns[2], 2)):
            server.request(on, _line(id=4, op="release", job="j", rank=r, key="b"))
        assert c.groups[("j", "b")].status.value == "idle"

    asyncio.run(run())


def test_both_grants_lost_both_rejoin(make):
    """Both members' grants of b are lost with their replaced connections, read one after the other: the first
    one's rejoin must not keep the second, already in the restored round, from rejoining too."""
    async def run():
        c, vt = make()
        server = RankServer(c, c.config)
        token = c.register_job("j", 3)

        def conn(peer: str, rank: int) -> Conn:
            return _said_hello(server, token, peer, rank, "rail0")

        conns = {r: conn(f"peer:{r}", r) for r in (0, 2)}
        server.request(conns[0], _line(id=2, op="group", job="j", key="b", members=[0, 2],
                                       circuits={"rail0": {"0": 2, "2": 0}}))
        for r in (0, 2):
            server.request(conns[r], _line(id=3, op="acquire", job="j", rank=r, key="b", op_no=9))
        await vt.settle()
        backs = {}
        for r in (2, 0):  # rank 2 back and rejoined, then rank 0 back (its old connection was still bound)
            backs[r] = conn(f"peer:{r}b", r)
            backs[r].writer.out.clear()
            server.request(backs[r], _line(id=2, op="acquire", job="j", rank=r, key="b", op_no=9, rejoin=True))
            await vt.settle()
            assert backs[r].writer.out and backs[r].writer.out[-1].get("rejoined"), (r, backs[r].writer.out)
        assert c.groups[("j", "b")].holders == {0, 2}

    asyncio.run(run())
