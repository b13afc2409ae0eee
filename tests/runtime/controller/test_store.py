"""Restart from the SQLite file: a controller on the same file reports the same circuits and owners."""

from __future__ import annotations

import asyncio

import pytest

from lightrail.errors import InfeasibleError
from lightrail.runtime.controller.config import default_config
from lightrail.runtime.controller.store import Store


def test_restart_on_the_same_file_restores_circuits_and_owners(tmp_path, make, hello, declare, acquire, job_of):
    path = tmp_path / "c.db"
    config = default_config(rails=2, ports=8, delay=0.010)

    async def first():
        c, vt = make(config, Store(path))
        job_of(c)
        hello(c, "k", 0, 1, rail1=7)
        declare(c, "j", "ring", range(4), {"rail0": {0: 1, 1: 2, 2: 3, 3: 0}})
        declare(c, "j", "pair", [0, 1], {"rail1": {0: 1, 1: 0}})
        fs = [acquire(c, "j", r, "ring") for r in range(4)] + [acquire(c, "j", r, "pair") for r in (0, 1)]
        await vt.settle()
        c.configure("rail1", {5: 6})
        state = c.state()
        c.store.close()
        return state, fs

    state, _ = asyncio.run(first())
    assert state["devices"]["rail0"]["circuits"] == {"0": 1, "1": 2, "2": 3, "3": 0}
    assert state["devices"]["rail1"]["circuits"] == {"0": 1, "1": 0, "5": 6}
    assert state["owners"]["rail1"]["7"] == "k"

    async def second():
        store = Store(path)
        c, vt = make(config, store)
        assert c.state() == state
        persisted = Store(path).circuits()
        assert {d: drv.state() for d, drv in c.devices.items() if drv.state()} == persisted
        # the restored circuits count as lit: the same group is granted without a reconfiguration
        declare(c, "j", "ring", range(4), {"rail0": {0: 1, 1: 2, 2: 3, 3: 0}})
        fs = [acquire(c, "j", r, "ring") for r in range(4)]
        await vt.settle()
        assert all(f.done() for f in fs) and c.counters["grants_without_change"] == 1
        assert c.devices["rail0"].reconfigurations == 0
        with pytest.raises(InfeasibleError):  # ownership survived too
            hello(c, "x", 0, 1, rail1=7)

    asyncio.run(second())
