"""The demo's data plane (``lightrail fl demo`` with leaves): the job owner and the clients' side of the parameter
servers, recomputing every job's model from the updates the clients sent to check the root's (``model_exact``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from lightrail.errors import LightrailError
from lightrail.fl.supervisor import HOST

__all__ = ["DataPlane"]


class DataPlane:
    """The demo's data plane: the job owner and the clients' side of the parameter servers.

    * Owner: puts each job's initial model (``dim`` float32 numbers, seeded) on the root with ``expected`` = the
      job's demand. When the control plane ends round r of a job (its ``demand``-th result), :meth:`close_round`
      flushes every leaf (``POST /flush``) until the root has applied round r, posts round r+1's ``expected``
      and opens round r+1 to the clients (an in-process event: a client bound to round r+1 waits for it, since
      the control plane opens rounds by itself, before the root has the new model).
    * Client (bound; its check-in reply names its leaf): ``GET /jobs/{job}/model?round=r`` from the leaf, a
      deterministic "local step" ``update = step * (target_c - model)`` (``target_c`` seeded by the client), its
      result to the control plane, and only if that result is on time (not late: over-selection), ``POST
      /jobs/{job}/result`` to the leaf; every acknowledged update is recorded, once per client and round,
      so :meth:`report` recomputes each job's final model (FedAvg: initial + the mean update of every round, in
      the root's float32 steps) and compares it with the root's. A request that fails at the transport
      (a killed leaf) is retried against the leaf's current URL, re-read from the ``services`` table.
    * ``kill_leaf_at_round`` R: once leaf 0 acknowledged a result of round >= R (of any job), SIGKILL it; the
      supervisor replaces it with the same ``--state`` (see the module docstring).
    """

    def __init__(self, http, info: dict, *, dim: int = 64, seed: int = 0, kill_leaf_at_round: int | None = None,
                 timeout: float = 120.0, step: float = 0.5):
        ps = info["parameter_servers"]
        self.http, self.db, self.dim, self.seed, self.step = http, info["db"], dim, seed, step
        self.root = f"http://{HOST}:{ps['root']}"
        self.url_of = {i: f"http://{HOST}:{port}" for i, port in enumerate(ps["leaves"])}
        self.idx_of = {url: i for i, url in self.url_of.items()}
        self.leaf_pids = dict(enumerate(info["pids"].get("leaves", [])))
        self.first_pids = dict(self.leaf_pids)
        self.kill_at, self.killed = kill_leaf_at_round, None
        self.timeout = timeout
        self.demand: dict[int, int] = {}
        self.rounds: dict[int, int] = {}
        self.initial: dict[int, object] = {}
        self.sent: dict[tuple[int, int], dict[str, object]] = {}  # (job, round) -> client -> update (float64)
        self.opened: dict[tuple[int, int], asyncio.Event] = {}
        self.closing: dict[tuple[int, int], asyncio.Task] = {}
        self.counts = {"leaf_retries": 0, "leaf_refusals": 0, "late_models": 0, "flushes": 0}
        self.round_close_s: list[float] = []

    @staticmethod
    def name(job: int) -> str:
        return f"job-{job}"

    def event(self, job: int, rnd: int) -> asyncio.Event:
        return self.opened.setdefault((job, rnd), asyncio.Event())

    async def open_jobs(self, ids: list[int], jobs) -> None:
        import numpy as np

        for k, job in enumerate(ids):
            model = np.random.default_rng([self.seed, job, 0]).standard_normal(self.dim).astype(np.float32)
            self.initial[job], self.demand[job], self.rounds[job] = model, int(jobs.demand[k]), int(jobs.rounds[k])
            r = await self.http.post(f"{self.root}/jobs/{self.name(job)}/model",
                                     json={"model": model.tolist(), "round": 0, "expected": self.demand[job]})
            r.raise_for_status()
            self.event(job, 0).set()

    # ---- leaves: current URLs --------------------------------------------------------------------------------
    async def refresh(self) -> None:
        from lightrail.fl import store

        def read():
            with store.connect(self.db) as c:
                return store.services(c, "leaf")

        import psycopg

        try:
            rows = await asyncio.to_thread(read)
        except psycopg.OperationalError:  # the database is being restarted: keep the URLs we have
            return
        for row in rows:
            self.url_of[row["idx"]] = row["url"]
            self.idx_of[row["url"]] = row["idx"]
            self.leaf_pids[row["idx"]] = row["pid"]

    async def current(self, url: str) -> str:
        if url not in self.idx_of:
            await self.refresh()
        return self.url_of.get(self.idx_of.get(url, -1), url)

    async def leaf_call(self, method: str, url: str, path: str, **kw):
        """``method`` ``path`` on the leaf that ``url`` names (its current URL), retried while it is down."""
        import httpx

        deadline = time.monotonic() + self.timeout
        while True:
            target = await self.current(url)
            try:
                r = await self.http.request(method, target + path, **kw)
                if r.status_code < 500:
                    return target, r
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise LightrailError(f"leaf {target} did not answer {method} {path} in {self.timeout:g} s",
                                     field="leaf", fix="see the supervisor's log")
            self.counts["leaf_retries"] += 1
            await asyncio.sleep(0.1)
            await self.refresh()

    # ---- a client's round --------------------------------------------------------------------------------------
    def update(self, client: int, job: int, rnd: int, model):
        import numpy as np

        target = np.random.default_rng([self.seed, client, 1]).normal(0.0, 1.0, self.dim)
        noise = np.random.default_rng([self.seed, client, job, rnd, 2]).normal(0.0, 0.01, self.dim)
        return self.step * (target - np.asarray(model, np.float64)) + noise

    async def train(self, client: int, got: dict, *, train_s: float):
        """The bound client's local step: the model from its leaf, an update. ``(leaf, update)`` to
        :meth:`upload` once the control plane accepted the result; ``True`` if this update was uploaded before (a
        retried check-in); ``None`` if the leaf refused (the round moved on: check in again)."""
        import numpy as np

        job, rnd, cid = int(got["job"]), int(got["round"]), f"c{client}"
        if cid in self.sent.get((job, rnd), {}):
            return True  # acknowledged before (a retried check-in): nothing to send again
        await asyncio.wait_for(self.event(job, rnd).wait(), self.timeout)
        leaf = got.get("leaf_url") or self.url_of[job % len(self.url_of)]
        leaf, r = await self.leaf_call("GET", leaf, f"/jobs/{self.name(job)}/model", params={"round": rnd})
        body = r.json() if r.status_code == 200 else {}
        if body.get("round") != rnd:
            # the round moved on before this over-selected client came for its model (late, e.g. behind a leaf's
            # replacement): it checks in again. Not a lost result: ``leaf_refusals`` counts those (uploads refused)
            self.counts["late_models"] += 1
            return None
        upd = self.update(client, job, rnd, np.asarray(body["model"], np.float32))
        if train_s > 0:
            await asyncio.sleep(train_s)
        return leaf, upd

    async def upload(self, client: int, got: dict, leaf: str, upd) -> bool:
        """The update to the client's leaf, sent only after the control plane called the result on time (so an
        over-selected round's late updates never reach the model). False: the leaf refused it."""
        job, rnd, cid = int(got["job"]), int(got["round"]), f"c{client}"
        if cid in self.sent.get((job, rnd), {}):
            return True
        leaf, r = await self.leaf_call("POST", leaf, f"/jobs/{self.name(job)}/result",
                                       json={"client_id": cid, "round": rnd, "update": upd.tolist()})
        if r.status_code != 200:
            self.counts["leaf_refusals"] += 1
            return False
        self.sent.setdefault((job, rnd), {})[cid] = upd
        if (self.kill_at is not None and self.killed is None and rnd >= self.kill_at
                and self.idx_of.get(leaf) == 0):
            self.kill_leaf(job, rnd)
        return True

    def kill_leaf(self, job: int, rnd: int) -> None:
        pid = self.leaf_pids.get(0)
        acked = len(self.sent.get((job, rnd), {}))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.killed = {"leaf": 0, "pid": pid, "job": job, "round": rnd, "acknowledged_in_round": acked}

    # ---- the owner's side --------------------------------------------------------------------------------------
    def round_ended(self, job: int, rnd: int) -> None:
        """The control plane ended ``job``'s round ``rnd``: close it on the data plane (once)."""
        if (job, rnd) not in self.closing and job in self.demand:
            self.closing[(job, rnd)] = asyncio.create_task(self.close_round(job, rnd))

    async def close_round(self, job: int, rnd: int) -> None:
        import httpx

        start = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        name = self.name(job)
        while True:
            for url in list(self.url_of.values()):
                with contextlib.suppress(httpx.HTTPError):
                    await self.http.post(f"{await self.current(url)}/flush")
                    self.counts["flushes"] += 1
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if (await self.http.get(f"{self.root}/jobs/{name}/version")).json()["round"] > rnd:
                    break
            if time.monotonic() > deadline:
                raise LightrailError(f"the root did not apply round {rnd} of job {job} in {self.timeout:g} s",
                                     field="parameter_servers", fix="see the supervisor's log")
            await asyncio.sleep(0.05)
            await self.refresh()
        if rnd + 1 < self.rounds[job]:
            r = await self.http.post(f"{self.root}/jobs/{name}/round",
                                     json={"round": rnd + 1, "expected": self.demand[job]})
            r.raise_for_status()
        self.round_close_s.append(time.perf_counter() - start)
        self.event(job, rnd + 1).set()

    async def settled(self) -> None:
        """Every round the control plane ended is applied at the root."""
        while any(not t.done() for t in self.closing.values()):
            await asyncio.gather(*self.closing.values())

    # ---- the report ------------------------------------------------------------------------------------------
    async def report(self) -> dict:
        import numpy as np

        await self.refresh()
        root = (await self.http.get(f"{self.root}/stats")).json()  # before the final GETs below (downloads)
        leaves = [(await self.http.get(f"{url}/stats")).json() for _, url in sorted(self.url_of.items())]
        exact, per_job = True, {}
        for job, model in self.initial.items():
            m = model
            for rnd in range(self.rounds[job]):
                ups = list(self.sent.get((job, rnd), {}).values())
                if ups:
                    m = (np.asarray(m, np.float64) + np.mean(ups, axis=0)).astype(np.float32)
            got = (await self.http.get(f"{self.root}/jobs/{self.name(job)}/model")).json()
            final = np.asarray(got["model"], np.float32)
            sent = sum(len(self.sent.get((job, r), {})) for r in range(self.rounds[job]))
            js = root["jobs"].get(self.name(job), {})
            ok = (got["round"] == self.rounds[job] and js.get("results_applied") == sent
                  and bool(np.allclose(final, m, rtol=1e-6, atol=1e-6)))
            exact &= ok
            per_job[job] = {"round": got["round"], "results_sent": sent, "results_applied": js.get("results_applied"),
                            "max_abs_error": float(np.max(np.abs(final.astype(np.float64) - m))), "exact": ok}
        requests = sum(s["model_requests"] for s in leaves)
        downloads = root["model_downloads"]
        replaced = [i for i, pid in self.leaf_pids.items() if pid != self.first_pids.get(i)]
        return {"model_dim": self.dim, "leaves": len(self.url_of), "model_downloads_root": downloads,
                "model_requests_clients": requests,
                "downloads_saved_ratio": round(requests / downloads, 2) if downloads else None,
                "results_forwarded": root["results_applied"], "batches_forwarded": root["aggregates_received"],
                "duplicate_batches": root["duplicate_aggregates"], "rounds_applied": root["rounds_applied"],
                "recovered_results": sum(s.get("recovered_results", 0) for s in leaves),
                "model_exact": exact, "model_check": per_job, "leaf_killed": self.killed,
                "leaves_replaced": len(replaced), "replaced_leaves": replaced,
                "leaf_retries": self.counts["leaf_retries"], "leaf_refusals": self.counts["leaf_refusals"],
                "late_models": self.counts["late_models"],
                "round_close_s_max": round(max(self.round_close_s), 3) if self.round_close_s else None}

