"""Tenancy and failures in the controller core (issue 17): job tokens (hashed, persisted), spares,
spare failover (LUMION: the failed rank's circuits rewired to the spare's ports), a job with no spare
left told it is dead, a job without spares keeping disconnect's behaviour, and re-declaration."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.config import default_config
from lightrail.runtime.controller.core import Failover, RankFailed
from lightrail.runtime.controller.protocol import Hello
from lightrail.runtime.controller.store import Store

PAIR = {"rail0": {0: 1, 1: 0}}


def say_hello(c, job, rank, world, port, *, spare=False):
    return c.hello(Hello(op="hello", job=job, rank=rank, world=world, ports={"rail0": port, "rail1": port},
                         token="t", spare=spare))


# --- tokens ----------------------------------------------------------------------------------------------------------


def test_register_job_gives_a_secret_kept_hashed_that_survives_a_restart(tmp_path, make):
    path = tmp_path / "c.db"

    async def run():
        c, _ = make(None, Store(path))
        token = c.register_job("j", 2, 1)
        assert len(token) >= 32 and c.authenticate("j", token)
        assert not c.authenticate("j", token + "x") and not c.authenticate("k", token)
        assert not c.authenticate("j", None) and not c.authenticate("nobody", "")
        stored = c.store.tokens()["j"]
        assert stored == hashlib.sha256(token.encode()).hexdigest() and token not in open(path, "rb").read().decode(
            "latin-1")
        say_hello(c, "j", 0, 2, 0)
        with pytest.raises(InfeasibleError) as e:  # a live job cannot be registered again
            c.register_job("j", 2, 0)
        assert e.value.field == "job" and c.authenticate("j", token)
        c.store.close()
        return token

    token = asyncio.run(run())

    async def again():
        c, _ = make(None, Store(path))
        assert c.authenticate("j", token) and c.jobs["j"]["spares"] == 1
        fresh = c.register_job("j", 4, 0)  # nobody connected since the restart: it starts afresh
        assert c.authenticate("j", fresh) and not c.authenticate("j", token)
        assert c.jobs["j"] == {"world": 4, "spares": 0, "epoch": 0, "ranks": {}} and not c.owner

    asyncio.run(again())


@pytest.mark.parametrize("world,spares,field", [(0, 0, "world"), (2, -1, "spares"), (True, 0, "world"),
                                                (3, 2, "world")])
def test_register_job_refuses_bad_sizes(make, world, spares, field):
    c, _ = make(default_config(rails=1, ports=8).model_copy(update={"max_ranks_per_job": 4}))
    with pytest.raises((ScenarioError, InfeasibleError)) as e:
        c.register_job("j", world, spares)
    assert e.value.field == field and "j" not in c.jobs and not c.store.tokens()


def test_spares_say_hello_with_their_own_rank_ids(make):
    c, _ = make()
    c.register_job("j", 2, 2)
    say_hello(c, "j", 2, 2, 2, spare=True)
    say_hello(c, "j", 3, 2, 3, spare=True)
    for rank, spare, field in ((4, True, "rank"), (1, True, "rank"), (2, False, "rank")):
        with pytest.raises(ScenarioError) as e:
            say_hello(c, "j", rank, 2, 5, spare=spare)
        assert e.value.field == field
    assert sorted(c.jobs["j"]["ranks"]) == [2, 3] and c.jobs_view()["j"]["connected"] == [2, 3]


def test_limits_on_ranks_and_groups_name_the_field(make, declare):
    config = default_config(rails=2, ports=8).model_copy(update={"max_ranks_per_job": 2, "max_groups_per_job": 2})
    c, _ = make(config)
    say_hello(c, "j", 0, 3, 0)
    say_hello(c, "j", 1, 3, 1)
    with pytest.raises(InfeasibleError) as e:
        say_hello(c, "j", 2, 3, 2)
    assert e.value.field == "max_ranks_per_job" and "2" in e.value.message
    say_hello(c, "j", 1, 3, 1)  # a known rank again is fine
    declare(c, "j", "a", [0, 1], PAIR)
    declare(c, "j", "b", [0, 1], {"rail1": {0: 1}})
    with pytest.raises(InfeasibleError) as e:
        declare(c, "j", "c", [0, 1], {"rail1": {1: 0}})
    assert e.value.field == "max_groups_per_job" and ("j", "c") not in c.groups
    assert declare(c, "j", "a", [0, 1], PAIR) == {"key": "a"}  # re-declaring is not a new group


def test_declare_replaces_an_idle_groups_changed_declaration(make, declare, acquire, job_of):
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "g", [0, 1], PAIR)
        declare(c, "j", "g", [0, 1, 2], {"rail0": {0: 2, 2: 0}})  # idle: replaced
        g = c.groups[("j", "g")]
        assert g.members == {0, 1, 2} and c.port_groups[("rail0", 2)] == {g} and ("rail0", 1) not in c.port_groups
        fs = [acquire(c, "j", r, "g") for r in (0, 1, 2)]
        await vt.settle()
        assert all(f.done() for f in fs) and c.devices["rail0"].state() == {0: 2, 2: 0}
        with pytest.raises(ScenarioError) as e:  # in use: refused
            declare(c, "j", "g", [0, 1], PAIR)
        assert e.value.field == "key" and c.groups[("j", "g")] is g

    asyncio.run(run())


# --- failover --------------------------------------------------------------------------------------------------------


def spare_job(make, path=None):
    """Job j: ranks 0 and 1 on port r of both rails, one spare (rank 2, port 2); group pair lit on rail0."""
    c, vt = make(None, Store(path) if path else None)
    pushed: list = []
    c.notify = lambda job, rank, message: pushed.append((rank, message))
    c.register_job("j", 2, 1)
    for r in (0, 1):
        say_hello(c, "j", r, 2, r)
    say_hello(c, "j", 2, 2, 2, spare=True)
    return c, vt, pushed


def test_a_failed_rank_fails_over_to_the_spare_rewiring_its_circuits(tmp_path, make, declare, acquire, release,
                                                                     snapshot):
    path = tmp_path / "c.db"

    async def run():
        c, vt, pushed = spare_job(make, path)
        declare(c, "j", "pair", [0, 1], PAIR, phase="dp")
        declare(c, "j", "up", [0, 1], {"rail1": {0: 1}})
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fs)
        release(c, "j", 0, "pair")
        f0 = acquire(c, "j", 0, "up")  # rank 0 waits for rank 1, which dies
        reply = c.rank_failed("j", 1)
        assert reply == {"failover": True, "spare": 2, "epoch": 1, "rewire_s": pytest.approx(0.010)}
        with pytest.raises(Failover) as e:  # the waiter is woken, with an error the server replies
            f0.result()
        assert type(e.value).__name__ == "Failover" and e.value.field == "rank"
        # the spare's ports are rank 1's now; the lit circuit through port 1 goes through port 2
        assert c.devices["rail0"].state() == {0: 2, 2: 0}
        assert c.jobs["j"]["ranks"] == {0: {"rail0": 0, "rail1": 0}, 1: {"rail0": 2, "rail1": 2}}
        assert c.jobs["j"]["epoch"] == 1 and ("rail0", 1) not in c.owner and c.owner[("rail0", 2)] == "j"
        assert c.groups[("j", "pair")].circuits == {"rail0": {0: 2, 2: 0}}
        assert c.groups[("j", "up")].circuits == {"rail1": {0: 2}}
        assert all(not g.intents and not g.holders and not g.waiters for g in c.groups.values())
        message = {"op": "failover", "job": "j", "rank": 1, "spare": 2, "epoch": 1, "ports": {"rail0": 2, "rail1": 2}}
        assert sorted(pushed, key=lambda p: p[0]) == [(0, message), (2, message)]
        assert c.store.jobs()["j"] == {"world": 2, "spares": 1, "epoch": 1, "ranks": c.jobs["j"]["ranks"]}
        assert c.store.circuits()["rail0"] == {0: 2, 2: 0}
        # the spare says hello as rank 1 (same ports); the failed process cannot take rank 1 back
        say_hello(c, "j", 1, 2, 2)
        with pytest.raises(InfeasibleError) as e:
            say_hello(c, "j", 1, 2, 1)
        assert e.value.field == "ports"
        assert c.rank_failed("j", 1) == {"failover": False}  # the replacement dies too: no spare left
        assert pushed[-1] == (0, {"op": "dead", "job": "j", "rank": 1,
                                  "reason": "rank 1 failed and job 'j' has no idle spare left"})

    asyncio.run(run())

    async def restarted():  # everything above is durable
        c2, vt2 = make(None, Store(path))
        assert c2.jobs["j"]["epoch"] == 1 and c2.jobs["j"]["ranks"][1] == {"rail0": 2, "rail1": 2}
        assert c2.devices["rail0"].state() == {0: 2, 2: 0}

    asyncio.run(restarted())


def test_after_a_failover_the_rewritten_group_is_granted_once_its_rewiring_is_lit(make, declare, acquire):
    async def run():
        c, vt, pushed = spare_job(make)
        declare(c, "j", "pair", [0, 1], PAIR)
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        t0 = vt.now
        assert c.rank_failed("j", 1)["rewire_s"] == pytest.approx(0.010)
        say_hello(c, "j", 1, 2, 2)  # the spare, as rank 1
        assert declare(c, "j", "pair", [0, 1], {"rail0": {0: 2, 2: 0}}) == {"key": "pair"}  # identical: idempotent
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        assert not any(f.done() for f in fs)  # lit, but still switching
        await vt.settle()
        assert all(f.done() for f in fs) and vt.now == pytest.approx(t0 + 0.010)
        assert c.counters["unsafe_reconfigurations"] == 0 and c.devices["rail0"].reconfigurations == 2

    asyncio.run(run())


def test_with_no_spare_left_the_job_is_told_it_is_dead(make, declare, acquire, release):
    async def run():
        c, vt, pushed = spare_job(make)
        c.rank_failed("j", 1)
        say_hello(c, "j", 1, 2, 2)
        pushed.clear()
        declare(c, "j", "pair", [0, 1], {"rail0": {0: 2, 2: 0}})
        f1 = acquire(c, "j", 1, "pair")
        before = c.jobs["j"]["ranks"]
        assert c.rank_failed("j", 0) == {"failover": False}
        with pytest.raises(RankFailed):
            f1.result()
        reason = "rank 0 failed and job 'j' has no idle spare left"
        assert pushed == [(1, {"op": "dead", "job": "j", "rank": 0, "reason": reason})]
        assert c.jobs["j"]["ranks"] == before and c.jobs["j"]["epoch"] == 1
        assert c.rank_failed("j", 0) == {"failover": False} and len(pushed) == 1  # reported twice: once

    asyncio.run(run())


def test_a_job_without_spares_keeps_disconnects_behaviour(make, declare, acquire, job_of):
    async def run():
        c, vt = make()
        pushed: list = []
        c.notify = lambda job, rank, message: pushed.append((rank, message))
        job_of(c, world=2)
        declare(c, "j", "pair", [0, 1], PAIR)
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        assert c.rank_failed("j", 1) == {"failover": False}
        g = c.groups[("j", "pair")]
        assert g.holders == {0} and not pushed and 1 in c.jobs["j"]["ranks"]  # released, still registered
        assert c.jobs_view()["j"]["connected"] == [0]
        with pytest.raises(ScenarioError):
            c.rank_failed("j", 7)
        assert all(f.done() for f in fs)

    asyncio.run(run())


def test_failover_leaves_circuits_alone_when_a_port_is_still_switching(make, declare, acquire):
    """Never switched mid-switch, even to rewire: the rewritten group is lit by the scheduler later."""
    async def run():
        c, vt, pushed = spare_job(make)
        declare(c, "j", "pair", [0, 1], PAIR)
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await asyncio.sleep(0)  # its switch is under way
        assert not any(f.done() for f in fs)
        reply = c.rank_failed("j", 1)
        assert reply["failover"] and reply["rewire_s"] == 0.0 and c.devices["rail0"].state() == PAIR["rail0"]
        assert all(isinstance(f.exception(), Failover) for f in fs)
        say_hello(c, "j", 1, 2, 2)
        fs = [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() and not f.exception() for f in fs)
        assert c.devices["rail0"].state() == {0: 2, 2: 0} and c.counters["unsafe_reconfigurations"] == 0

    asyncio.run(run())
