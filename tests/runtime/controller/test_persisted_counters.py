"""Counters across restarts (issue 31 item 7): grants, unsafe reconfigurations and failovers are kept in the state
file, so a controller started again on it goes on from them (train-demo's JSON sums them over incarnations)."""

from __future__ import annotations

import asyncio

from lightrail.runtime.controller.config import default_config
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.protocol import Hello
from lightrail.runtime.controller.store import Store


def test_grants_unsafe_and_failovers_survive_a_restart(tmp_path, hello, declare, acquire, release):
    state = tmp_path / "c.db"
    config = default_config(rails=1, ports=8, delay=0.0)

    async def first() -> None:
        store = Store(state)
        c = Controller(config, store)
        c.register_job("j", 2, spares=1)
        for r in range(2):
            hello(c, "j", r, 2, rail0=r)
        c.hello(Hello(op="hello", job="j", rank=2, world=2, ports={"rail0": 2}, spare=True))
        declare(c, "j", "ring", [0, 1], {"rail0": {0: 1, 1: 0}})
        for _ in range(3):
            futures = [acquire(c, "j", r, "ring") for r in (0, 1)]
            await asyncio.wait_for(asyncio.gather(*[f for f in futures if f is not None]), 5)
            for r in (0, 1):
                release(c, "j", r, "ring")
        c.counters["unsafe_reconfigurations"] += 1  # as if one had happened
        assert c.rank_failed("j", 1)["failover"]
        c.flush_counters()
        store.close()

    asyncio.run(first())
    c = Controller(config, Store(state))
    assert (c.counters["grants"], c.counters["unsafe_reconfigurations"], c.counters["failovers"]) == (3, 1, 1)
    c.store.close()
