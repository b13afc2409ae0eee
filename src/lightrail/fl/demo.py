"""``lightrail fl demo``: the control plane and parameter servers as an ``fl serve`` subprocess, emulated clients
checking in through the load balancer and running real federated rounds through the leaves
(:mod:`lightrail.fl.data_plane`), optionally with one service killed mid-run (``kill``), and the report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import uuid

from lightrail.errors import LightrailError, ScenarioError
from lightrail.fl.data_plane import DataPlane
from lightrail.fl.policies import Policy
from lightrail.fl.postgres import pdeathsig
from lightrail.fl.rounds import DEFAULT_OVER_SELECTION, RoundRules
from lightrail.fl.supervisor import HOST, READY_TIMEOUT_S, _drain, stop_procs

__all__ = ["start_subprocess", "demo_population", "emulate", "demo", "KILLABLE", "Killer"]

KILLABLE = ("job_manager", "load_balancer", "scheduler", "client_manager", "leaf", "postgres", "postgres_backend")
"""What ``--kill`` can SIGKILL mid-run: a service of ``fl serve`` (instance 0 of client managers and leaves), the
PostgreSQL server, or one of its backends (a connection's server process: the server then resets every
connection and recovers)."""


def start_subprocess(*, policy: str, client_managers: int = 2, leaves: int = 0, seed: int | None = None,
                     timeout: float = READY_TIMEOUT_S, stderr=None,
                     leaf_flush_interval_ms: float | None = None) -> tuple[subprocess.Popen, dict]:
    """``python -m lightrail.fl.serve`` as a child; its process and ready line."""
    argv = [sys.executable, "-m", "lightrail.fl.serve", "--policy", policy, "--client-managers",
            str(client_managers), "--leaves", str(leaves)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if leaf_flush_interval_ms is not None:
        argv += ["--leaf-flush-interval-ms", str(leaf_flush_interval_ms)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=stderr, text=True,
                            preexec_fn=pdeathsig(signal.SIGTERM))
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sel.select(0.2):
                line = proc.stdout.readline()
                if not line:
                    break
                with contextlib.suppress(ValueError):
                    msg = json.loads(line)
                    if isinstance(msg, dict) and msg.get("event") == "ready":
                        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
                        return proc, msg
            elif proc.poll() is not None:
                break
    finally:
        sel.close()
    stop_procs([proc])
    raise LightrailError("the fl control plane did not start", field="fl serve", fix="run `lightrail fl serve` to "
                         "see its errors")


def demo_population(clients: int, jobs: int, seed: int, rounds: int):
    """Synthetic clients and jobs (:mod:`lightrail.fl.population`'s default), rounds capped at ``rounds`` and
    demand at a fifth of the clients that can serve the job (so a short demo finishes)."""
    import numpy as np

    from lightrail.fl.model import Jobs, eligibility
    from lightrail.fl.population import synthetic_clients, synthetic_jobs

    rng = np.random.default_rng(seed)
    cl = synthetic_clients(clients, rng)
    jb = synthetic_jobs(jobs, cl, rng)
    can = eligibility(cl, jb).sum(axis=0)
    demand = np.maximum(1, np.minimum(jb.demand, np.maximum(can // 5, 1)))
    jb = Jobs(jb.min_cpu_ghz, jb.min_memory_gb, jb.os_mask, np.minimum(jb.rounds, rounds), demand, jb.work,
              jb.arrival_s, jb.min_os_version, jb.min_fp16_mem)
    keep = can > 0
    if not keep.all():  # a job no client can serve would never finish
        jb = jb.select(keep)
    return cl, jb


def _db_retry(db: str, fn, timeout: float = 60.0):
    """``fn(conn)`` on a fresh connection, retried while the database restarts."""
    import psycopg

    from lightrail.fl import store

    deadline = time.monotonic() + timeout
    while True:
        try:
            with store.connect(db, connect_timeout=5) as c:
                return fn(c)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _backend_pid(postmaster: int) -> int | None:
    """A client backend of the server (its ``[local]`` connection process), or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            if int(stat[1]) == postmaster and b"[local]" in open(f"/proc/{entry}/cmdline", "rb").read():
                return int(entry)
    return None


class Killer:
    """SIGKILLs ``service`` once a client result of round >= ``at_round`` was accepted; reports what it killed and
    whether the supervisor replaced it."""

    def __init__(self, db: str, service: str, at_round: int):
        self.db, self.service, self.at_round = db, service, at_round
        self.task: asyncio.Task | None = None
        self.killed: dict | None = None
        self.started = time.perf_counter()

    def result_accepted(self, rnd: int) -> None:
        if self.task is None and rnd >= self.at_round:
            self.task = asyncio.create_task(asyncio.to_thread(self._kill, rnd))

    def _row(self, role: str) -> dict | None:
        from lightrail.fl import store

        return next((r for r in _db_retry(self.db, lambda c: store.services(c, role)) if r["idx"] == 0), None)

    def _kill(self, rnd: int) -> None:
        role = "postgres" if self.service == "postgres_backend" else self.service
        row = self._row(role)
        pid = row["pid"] if row else None
        if self.service == "postgres_backend" and pid:
            pid = _backend_pid(pid)
        if not pid:
            self.killed = {"service": self.service, "pid": None, "round": rnd, "error": "no such process"}
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.killed = {"service": self.service, "pid": pid, "round": rnd,
                       "at_s": round(time.perf_counter() - self.started, 3)}

    async def report(self) -> dict | None:
        if self.task is not None:
            await self.task
        if self.killed is None or self.killed.get("pid") is None or self.service == "postgres_backend":
            return self.killed
        deadline = time.monotonic() + 60.0  # the run may end before the supervisor has replaced it
        while True:
            row = await asyncio.to_thread(self._row, self.service)
            replaced = bool(row and row["pid"] != self.killed["pid"])
            if replaced or time.monotonic() > deadline:
                return {**self.killed, "replaced": replaced, "new_pid": row["pid"] if row else None}
            await asyncio.sleep(0.1)


async def _call(http, method: str, url: str, *, timeout: float, **kw):
    """An HTTP request retried through a service's restart (transport errors, 5xx) for up to ``timeout`` s; the
    first definitive reply (< 500). A LightrailError naming the service once time is up."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            r = await http.request(method, url, **kw)
            if r.status_code < 500:
                return r
            why = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.TransportError as e:
            why = type(e).__name__
        if time.monotonic() > deadline:
            raise LightrailError(f"{method} {url} failed for {timeout:g} s ({why})", field="fl serve",
                                 fix="see the supervisor's log (lightrail fl serve)")
        await asyncio.sleep(0.1)


async def emulate(info: dict, clients, jobs, *, concurrency: int = 50, time_scale: float = 0.0001,
                  timeout: float = 120.0, on_bound=None, data_plane: dict | None = None,
                  rules: RoundRules | None = None, kill: tuple[str, int] | None = None) -> dict:
    """Register ``jobs`` with the job manager and run ``clients`` against the load balancer until every job is
    done: each client checks in, a bound one "trains" for work / speed x ``time_scale`` seconds and posts its
    result; an unbound one checks in again a little later. Counts and wall-clock times. A service that does not
    answer (it is being replaced) is retried; its errors are counted in ``errors``.

    ``data_plane`` (keyword arguments of :class:`DataPlane`, e.g. ``{"dim": 64, "seed": 0}``; needs parameter
    servers in ``info``): the training is real federated rounds through the leaves, see :class:`DataPlane`;
    the result's ``"data_plane"`` is its report. ``rules``: the jobs' over-selection and round timeout
    (:class:`~lightrail.fl.rounds.RoundRules`; the control plane applies them, see :mod:`lightrail.fl.store`); a
    result the control plane calls late is counted in ``late_results``. ``kill`` ``(service, R)``: SIGKILL that
    service (:data:`KILLABLE`; a leaf through ``data_plane``'s ``kill_leaf_at_round``) once a result of round >= R
    was accepted; the result's ``"killed"`` says what and whether it was replaced."""
    import httpx

    rules = RoundRules() if rules is None else rules
    jm, lb = f"http://{HOST}:{info['job_manager']}", f"http://{HOST}:{info['load_balancer']}"
    killer = Killer(info["db"], *kill) if kill is not None and kill[0] != "leaf" else None
    async with httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=concurrency + 10)) as http:
        ids, run = [], uuid.uuid4().hex  # each registration's idempotency key: retried through a restart, one job
        for j in range(len(jobs)):
            r = await _call(http, "POST", f"{jm}/jobs", timeout=timeout,
                            json={"requirements": jobs.requirements(j), "rounds": int(jobs.rounds[j]),
                                  "demand": int(jobs.demand[j]), "work": float(jobs.work[j]),
                                  "over_selection": rules.over_selection, "round_timeout_s": rules.round_timeout_s,
                                  "request_id": f"{run}-{j}"})
            r.raise_for_status()
            ids.append(r.json()["job"])
        dp = None
        if data_plane is not None and info.get("parameter_servers", {}).get("root"):
            dp = DataPlane(http, info, timeout=timeout, **data_plane)
            await dp.open_jobs(ids, jobs)
        with contextlib.suppress(httpx.HTTPError):
            await http.post(f"http://{HOST}:{info['scheduler']}/schedule")
        registered = time.time()
        queue: asyncio.Queue = asyncio.Queue()
        for c in range(len(clients)):
            queue.put_nowait(c)
        stats = {"checkins": 0, "bindings": 0, "results": 0, "late_results": 0, "empty": 0, "errors": 0}
        done = asyncio.Event()

        async def worker():
            while not done.is_set():
                c = await queue.get()
                try:
                    body = {"client_id": f"c{c}", **clients.attributes(c)}
                    r = await http.post(f"{lb}/checkin", json=body)
                    stats["checkins"] += 1
                    if r.status_code != 200:
                        stats["errors"] += 1
                        await asyncio.sleep(0.02)
                        continue
                    got = r.json()
                    if got["job"] is None:
                        stats["empty"] += 1
                        await asyncio.sleep(0.01)
                        continue
                    stats["bindings"] += 0 if got.get("already") else 1
                    if on_bound:
                        on_bound(got)
                    j = ids.index(got["job"]) if got["job"] in ids else 0
                    train_s = float(jobs.work[j]) / float(clients.speed[c]) * time_scale
                    trained = None
                    if dp is not None:
                        trained = await dp.train(c, got, train_s=train_s)
                        if trained is None:
                            stats["errors"] += 1
                            await asyncio.sleep(0.05)
                            continue
                    else:
                        await asyncio.sleep(train_s)
                    # the verdict first (retried through a restart: a repeated result gets its first verdict),
                    # then, only if on time, the update to the leaf
                    r = await _call(http, "POST", f"{lb}/result", timeout=timeout,
                                    json={"client_id": f"c{c}", "job": got["job"], "round": got["round"]})
                    if r.status_code != 200:
                        stats["errors"] += 1
                        continue
                    verdict = r.json()
                    late = bool(verdict.get("late"))
                    stats["late_results" if late else "results"] += 0 if verdict.get("duplicate") else 1
                    if late:
                        continue
                    if isinstance(trained, tuple) and not await dp.upload(c, got, *trained):
                        stats["errors"] += 1
                    if killer is not None:
                        killer.result_accepted(int(got["round"]))
                    if dp is not None and verdict.get("round_ended"):
                        dp.round_ended(int(got["job"]), int(got["round"]))
                except (httpx.HTTPError, LightrailError):
                    stats["errors"] += 1
                    await asyncio.sleep(0.02)
                finally:
                    queue.put_nowait(c)

        async def watch():
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    r = await http.get(f"{jm}/jobs")
                    view = r.json() if r.status_code == 200 else None
                    if not isinstance(view, list):  # the job manager or its database is being replaced
                        continue
                    if dp is not None:  # a round ended whose ending reply was lost: close it all the same
                        for v in view:
                            for rnd in range(v["rounds_completed"] if v["id"] in ids else 0):
                                dp.round_ended(v["id"], rnd)
                    if all(v["done_at"] is not None for v in view if v["id"] in ids):
                        break
            done.set()

        start = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await watch()
        wall = time.perf_counter() - start
        await asyncio.wait(tasks, timeout=2.0)  # requests in flight finish (their results are counted)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        plane = None
        if dp is not None:
            await dp.settled()
            plane = await dp.report()
        data_wall = time.perf_counter() - start
        view = (await _call(http, "GET", f"{jm}/jobs", timeout=timeout)).json()
        killed = await killer.report() if killer is not None else None
    per_job = [{"job": v["id"], "rounds": v["rounds"], "demand": v["demand"], "rounds_completed": v["rounds_completed"],
                "done": v["done_at"] is not None,
                "completion_s": round(v["done_at"] - registered, 3) if v["done_at"] is not None else None}
               for v in view if v["id"] in ids]
    out = {"wall_s": round(wall, 3), "jobs": per_job, **stats, "killed": killed}
    if plane is not None:
        out["data_plane"] = {**plane, "wall_s": round(data_wall, 3)}
        if kill is not None and kill[0] == "leaf":
            out["killed"] = {"service": "leaf", **(plane["leaf_killed"] or {}),
                             "replaced": bool(plane["leaves_replaced"])} if plane["leaf_killed"] else None
    return out


def demo(*, clients: int = 500, jobs: int = 4, policy: str = "irs", seed: int = 0, rounds: int = 3,
         client_managers: int = 2, concurrency: int = 50, timeout: float = 120.0, time_scale: float = 0.0001,
         leaves: int = 2, model_dim: int = 64, kill_leaf_at_round: int | None = None,
         over_selection: float | None = None, round_timeout_s: float | None = None,
         kill: str | None = None, kill_at_round: int | None = None, stderr=subprocess.DEVNULL) -> dict:
    """Start the control plane and the parameter servers (a ``fl serve`` subprocess with ``leaves`` leaves), run
    the emulated clients (real federated rounds through the leaves when ``leaves`` > 0, see :class:`DataPlane`),
    report, stop everything. ``kill_leaf_at_round`` R: SIGKILL leaf 0 once it acknowledged a result of round
    >= R; the supervisor replaces it and the clients carry on against the replacement. ``kill`` (one of
    :data:`KILLABLE`) with ``kill_at_round`` R: SIGKILL that process once a result of round >= R was accepted
    (``leaf``: as ``kill_leaf_at_round``); the supervisor replaces it at the same address (PostgreSQL on its data
    directory) and ``model_exact`` must still hold; ``killed`` reports what was killed and whether it was replaced.
    SIGTERM/SIGINT stop the ``fl serve`` subprocess (every process, its temporary directory) before returning.

    Rounds run by :class:`~lightrail.fl.rounds.RoundRules` (``over_selection``, ``round_timeout_s``), as in the
    simulator (``over_selection`` 1.3 by default, as Propius's job profiles): a client uploads its update to its
    leaf only after the control plane called its result on time, so a late update never reaches the model.

    Data-plane keys of the result (when ``leaves`` > 0): ``model_downloads_root`` (model bodies the root sent),
    ``model_requests_clients`` (model requests the leaves answered, summed over the leaves alive at the end),
    ``downloads_saved_ratio`` (their ratio), ``results_forwarded`` (client results the root applied, reaching it
    in ``batches_forwarded`` batches), ``model_exact`` (each job's final model at the root equals the initial
    model plus every round's mean update, recomputed from the updates the clients sent), ``leaves_replaced``,
    ``leaf_killed`` and ``recovered_results``; the whole report is under ``data_plane``."""
    from lightrail.fl import store

    pol = Policy.parse(policy, field="--policy")
    if time_scale < 0:
        raise ScenarioError(f"{time_scale} is negative", field="--time-scale", fix="use 0 (instant) or more")
    for flag, v, lo in (("--clients", clients, 1), ("--jobs", jobs, 1), ("--rounds", rounds, 1),
                        ("--client-managers", client_managers, 1), ("--concurrency", concurrency, 1),
                        ("--leaves", leaves, 0), ("--model-dim", model_dim, 1)):
        if v < lo:
            raise ScenarioError(f"{v} is too few", field=flag, fix=f"use {lo} or more")
    if kill is not None or kill_at_round is not None:
        if kill not in KILLABLE:
            raise ScenarioError(f"{kill!r} is not a process of fl serve", field="--kill",
                                fix=f"one of {', '.join(KILLABLE)}, with --kill-at-round R")
        if kill_at_round is None or kill_at_round < 0:
            raise ScenarioError("no round given" if kill_at_round is None else f"round {kill_at_round}",
                                field="--kill-at-round",
                                fix="a round >= 0 (0-based) with --kill")
        if kill == "leaf":
            if kill_leaf_at_round is not None and kill_leaf_at_round != kill_at_round:
                raise ScenarioError("two rounds to kill leaf 0 at", field="--kill-leaf-at-round",
                                    fix="give --kill leaf --kill-at-round R only")
            kill_leaf_at_round = kill_at_round
    if kill_leaf_at_round is not None and (leaves < 1 or kill_leaf_at_round < 0):
        raise ScenarioError(f"round {kill_leaf_at_round} with {leaves} leaves", field="--kill-leaf-at-round",
                            fix="use a round >= 0 and --leaves 1 or more")
    rules = RoundRules(over_selection=over_selection if over_selection is not None else DEFAULT_OVER_SELECTION,
                       round_timeout_s=round_timeout_s)
    cl, jb = demo_population(clients, jobs, seed, rounds)
    t0 = time.perf_counter()
    stop_on = {}
    if threading.current_thread() is threading.main_thread():  # SIGTERM unwinds through the finally, as Ctrl-C
        stop_on = {signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupted)}
    proc, info = start_subprocess(policy=pol.value, client_managers=client_managers, leaves=leaves, seed=seed,
                                  stderr=stderr)
    startup = time.perf_counter() - t0
    plane = {"dim": model_dim, "seed": seed, "kill_leaf_at_round": kill_leaf_at_round} if leaves > 0 else None
    try:
        run = asyncio.run(emulate(info, cl, jb, concurrency=concurrency, timeout=timeout, time_scale=time_scale,
                                  data_plane=plane, rules=rules,
                                  kill=(kill, kill_at_round) if kill is not None else None))

        def counts(c):
            return (c.execute("SELECT count(*) FROM bindings").fetchone()[0],
                    c.execute("SELECT count(*) FROM job_rounds WHERE ended_at IS NOT NULL").fetchone()[0],
                    store.double_bookings(c))

        db_bindings, db_rounds, bad = _db_retry(info["db"], counts)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for sig, handler in stop_on.items():
            signal.signal(sig, handler)
    return {"policy": pol.value, "clients": len(cl), "jobs": len(jb), "seed": seed, "startup_s": round(startup, 3),
            "wall_s": run["wall_s"], "bindings": db_bindings,
            "bindings_per_s": round(db_bindings / run["wall_s"], 1) if run["wall_s"] > 0 else 0.0,
            "checkins": run["checkins"], "checkins_per_s": round(run["checkins"] / run["wall_s"], 1),
            "results": run["results"], "late_results": run["late_results"],
            "over_selection": rules.over_selection, "round_timeout_s": rules.round_timeout_s,
            "empty_checkins": run["empty"], "errors": run["errors"],
            "rounds_completed": db_rounds, "all_jobs_completed": all(j["done"] for j in run["jobs"]),
            "double_bookings": bad["total"], "double_booking_checks": bad, "per_job": run["jobs"],
            "client_managers": client_managers, "concurrency": concurrency, "supervisor_exit": proc.returncode,
            "killed": run["killed"],
            **_plane_keys(run.get("data_plane"), leaves)}


def _interrupted(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _plane_keys(plane: dict | None, leaves: int) -> dict:
    """The data-plane summary at the top of the demo's result (and the whole report under ``data_plane``)."""
    if plane is None:
        return {"leaves": leaves, "model_exact": None, "data_plane": None}
    top = ("model_downloads_root", "model_requests_clients", "downloads_saved_ratio", "results_forwarded",
           "batches_forwarded", "model_exact", "leaves_replaced", "leaf_killed", "recovered_results")
    return {"leaves": leaves, **{k: plane[k] for k in top}, "data_plane": plane}
