"""``POST /jobs`` is idempotent (issue 31): a registration retried after its reply was lost (same job, same world
and spares, before any rank said hello) gets the first answer, token included, instead of a second registration
that voids the token the first one issued. A different spec, or a job whose ranks came, registers afresh."""

from __future__ import annotations

import asyncio

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

OPERATOR = "operator-token-for-the-tests"


def test_a_retried_registration_gets_the_same_answer(make, hello):
    from lightrail.runtime.controller.admin import admin_app

    async def run():
        c, _ = make()
        transport = httpx.ASGITransport(app=admin_app(c, token=OPERATOR))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     headers={"Authorization": f"Bearer {OPERATOR}"}) as http:
            async def post(world: int, spares: int = 1) -> httpx.Response:
                return await http.post("/jobs", json={"job": "j", "world": world, "spares": spares})

            first = await post(2)
            again = await post(2)  # the first reply was lost: the client asks again
            assert first.status_code == again.status_code == 200 and again.json() == first.json()
            token = first.json()["token"]
            assert c.authenticate("j", token) and c.jobs["j"] == {"world": 2, "spares": 1, "epoch": 0, "ranks": {}}
            other = await post(3)  # another spec: registered afresh, the first token void
            assert other.status_code == 200 and other.json()["token"] != token and not c.authenticate("j", token)
            fresh = other.json()["token"]
            hello(c, "j", 0, 3, rail0=0)  # a rank came with it
            running = await post(3)
            assert running.status_code == 409 and running.json()["field"] == "job"  # the job runs: refused, as before
            c.disconnect("j", 0)
            c.connected.discard(("j", 0))
            later = await post(3)  # its ranks gone: a new run of the job, a new token (not the old answer)
            assert later.status_code == 200 and later.json()["token"] not in (token, fresh)
            assert c.authenticate("j", later.json()["token"]) and c.jobs["j"]["ranks"] == {}

    asyncio.run(run())
