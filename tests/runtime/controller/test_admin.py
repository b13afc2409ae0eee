"""Operator changes (``Controller.configure``, what ``POST /devices/{device}/circuits`` calls): validated
against ownership, busy ports and the configuration rules; on error nothing changes."""

from __future__ import annotations

import asyncio

import pytest

from lightrail.errors import InfeasibleError, ScenarioError

ADMIN_BAD = [
    ("two inputs on one output", "rail0", {5: 7, 6: 7}, None, InfeasibleError, "configuration."),
    ("another job's port", "rail0", {4: 7}, None, InfeasibleError, "changes.4"),
    ("another job's port, as j", "rail0", {4: 7}, "j", InfeasibleError, "changes.4"),
    ("a job's port without job", "rail0", {2: 3}, None, InfeasibleError, "changes."),
    ("a job's port as another job", "rail0", {2: 3}, "other", InfeasibleError, "changes."),
    ("busy port (darken)", "rail0", {0: None}, "j", InfeasibleError, "changes.0"),
    ("busy port (move)", "rail0", {1: 2}, "j", InfeasibleError, "changes."),
    ("busy output fed twice", "rail0", {2: 1}, "j", InfeasibleError, "configuration.2"),
    ("unknown device", "rail9", {5: 6}, None, ScenarioError, "device"),
    ("port out of range", "rail0", {5: 8}, None, ScenarioError, "changes.8"),
]


@pytest.mark.parametrize("what,device,changes,job,error,field", ADMIN_BAD, ids=[b[0] for b in ADMIN_BAD])
def test_admin_configure_refuses_and_changes_nothing(what, device, changes, job, error, field, make, hello, declare,
                                                     acquire, release, job_of, snapshot):
    async def run():
        c, vt = make()
        job_of(c)
        hello(c, "other", 0, 1, rail0=4)
        declare(c, "j", "a", [0, 1], {"rail0": {0: 1, 1: 0}})
        fs = [acquire(c, "j", r, "a") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fs)
        out = c.configure("rail0", {5: 6})  # unowned ports: any operator change
        assert out["completes_in_s"] == pytest.approx(0.010) and out["circuits"] == {0: 1, 1: 0, 5: 6}
        before = snapshot(c), c.store.circuits()
        with pytest.raises(error) as e:
            c.configure(device, changes, job=job)
        assert e.value.field.startswith(field), e.value
        assert (snapshot(c), c.store.circuits()) == before
        # once released, the owner may change its own ports
        for r in (0, 1):
            release(c, "j", r, "a")
        c.configure("rail0", {0: None, 1: None, 2: 3}, job="j")
        assert c.devices["rail0"].state() == {2: 3, 5: 6} == c.store.circuits()["rail0"]

    asyncio.run(run())


def test_admin_configure_does_not_switch_another_jobs_output(make, hello):
    async def run():
        c, _ = make()
        c.configure("rail0", {0: 3})  # an operator's circuit before any job
        hello(c, "A", 0, 1, rail0=0)
        hello(c, "B", 0, 1, rail0=3)
        with pytest.raises(InfeasibleError) as e:
            c.configure("rail0", {0: 5}, job="A")
        assert e.value.field == "changes.3"
        assert c.devices["rail0"].state() == {0: 3}

    asyncio.run(run())
