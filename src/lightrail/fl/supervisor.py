"""The supervisor of the federated-learning control plane (``lightrail fl serve``).

It starts PostgreSQL (:mod:`lightrail.fl.postgres`, in ``--data`` or a temporary directory) and creates the schema,
then the services, each its own process on loopback (``python -m lightrail.fl.services.<role> --db URI --fd N``):
the job manager, the scheduler (``--policy``), ``--client-managers`` client managers and the load balancer, plus the
parameter servers (``python -m lightrail.fl.param_server --role root|leaf``, root first, then ``--leaves`` leaves
pointing at it) when that module exists. Each child prints one JSON ready line with its port; the supervisor
records every child (and PostgreSQL, role ``postgres``) in the ``services`` table and prints ONE line::

    {"event": "ready", "db": uri, "job_manager": port, "scheduler": port, "client_managers": [ports],
     "load_balancer": port, "parameter_servers": {"root": port, "leaves": [ports]}, "pids": {...}, ...}

**Addresses never move.** The supervisor opens every service's listening socket itself, once, and hands it down
(``--fd``); a replacement serves on the same socket, so it listens where its predecessor did, and connections
made while no process serves it wait in the socket's queue instead of being refused. PostgreSQL listens on a Unix
socket in its data directory (the same URI after a restart).

Then it watches the children: one that dies is REPLACED (same role, index and address; a JSON ``replaced`` line on
stderr). PostgreSQL is restarted on its data directory; the services reconnect by themselves (their requests wait
for the database, :meth:`lightrail.fl.services.Pool.run`). On SIGTERM/SIGINT it stops every child (SIGTERM, then
SIGKILL after a grace period), then PostgreSQL, and removes its temporary directory. If the supervisor itself dies
(even by SIGKILL), every child gets SIGTERM (PostgreSQL SIGQUIT) from the kernel (``PR_SET_PDEATHSIG``) and the
janitor (:mod:`lightrail.fl.janitor`) kills what is left and removes the temporary directory.

What a replacement keeps:

* job manager, scheduler, client managers, load balancer: everything (bindings, rounds, the order) lives in
  PostgreSQL.
* PostgreSQL: every acknowledged commit (``synchronous_commit`` is on).
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
  set. The supervisor then restarts every leaf (same ``--state``: acknowledged results are kept and re-forwarded,
  refused with 404 until the job's owner puts the model again; results for a round before the re-put round are
  dropped as stragglers, 409). The job owner must re-put the model (its last known one, with its round) after a
  root replacement.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lightrail.errors import LightrailError, ScenarioError
from lightrail.fl.janitor import start_time
from lightrail.fl.policies import Policy
from lightrail.fl.postgres import pdeathsig

__all__ = ["Supervisor", "Child", "PARAM_SERVER", "HOST", "READY_TIMEOUT_S", "main", "stop_procs"]

PARAM_SERVER = "lightrail.fl.param_server"
READY_TIMEOUT_S = 60.0
HOST = "127.0.0.1"
STOP_GRACE_S = 3.0
"""Seconds a child gets to stop after SIGTERM before SIGKILL (the whole stop stays under 5 s)."""


def log(what: str, /, **fields) -> None:
    """A JSON log line on stderr."""
    entry = {"ts": round(time.time(), 6), "level": "info", "event": what, "role": "supervisor", "pid": os.getpid()}
    entry.update(fields)
    print(json.dumps(entry, default=str), file=sys.stderr, flush=True)


@dataclass
class Child:
    role: str
    idx: int
    argv: list[str]
    proc: subprocess.Popen | None = None
    port: int = 0
    info: dict = field(default_factory=dict)
    sock: socket.socket | None = None

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


def _listen() -> socket.socket:
    """A listening socket on loopback, any free port; kept by the supervisor for the life of the service."""
    s = socket.create_server((HOST, 0), backlog=1024)
    s.set_inheritable(True)
    return s


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
        self.janitor: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.replacements = 0
        self.params_note: str | None = None

    # ---- children ----------------------------------------------------------------------------------------------

    def _argv(self, child: Child) -> list[str]:
        role, idx = child.role, child.idx
        fd = ["--fd", str(child.sock.fileno())]
        if role in ("root", "leaf"):
            argv = [sys.executable, "-m", self.param_server, "--role", role, *fd]
            if role == "leaf":
                root = next(c for c in self.children if c.role == "root")
                argv += ["--root", root.url, "--state", str(self.leaf_state(idx))]
                if self.leaf_flush_interval_ms is not None:
                    argv += ["--flush-interval-ms", str(self.leaf_flush_interval_ms)]
            return argv
        argv = [sys.executable, "-m", f"lightrail.fl.services.{role}", "--db", self.pg.uri, *fd,
                "--name", f"{role}-{idx}"]
        if role == "scheduler":
            argv += ["--policy", self.policy.value, "--interval", str(self.interval)]
            if self.seed is not None:
                argv += ["--seed", str(self.seed)]
        return argv

    def leaf_state(self, idx: int) -> Path:
        """Leaf ``idx``'s ``--state`` directory: the same for every replacement of that leaf."""
        return self.params / f"leaf-{idx}"

    def _tell_janitor(self, pid: int) -> None:
        if self.janitor is not None and self.janitor.poll() is None and (t := start_time(pid)):
            with contextlib.suppress(OSError):
                self.janitor.stdin.write(f"pid {pid} {t}\n")
                self.janitor.stdin.flush()

    def _spawn(self, child: Child) -> None:
        if child.sock is None:
            child.sock = _listen()
            child.port = child.sock.getsockname()[1]
        child.argv = self._argv(child)
        child.proc = subprocess.Popen(child.argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                      pass_fds=(child.sock.fileno(),), preexec_fn=pdeathsig(signal.SIGTERM))
        self._tell_janitor(child.proc.pid)

    def _await_ready(self, child: Child, timeout: float = READY_TIMEOUT_S) -> None:
        """Read the child's ready line; then drain its stdout in a thread."""
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
                        child.info = msg
                        break
        finally:
            sel.close()
        threading.Thread(target=_drain, args=(child.proc.stdout,), daemon=True).start()
        self._record(child.role, child.idx, child.pid, child.port, child.url)

    def _record(self, role: str, idx: int, pid: int, port: int, url: str) -> None:
        """The ``services`` row, written while the database may be restarting (retried)."""
        import psycopg

        from lightrail.fl import store

        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                with store.connect(self.pg.uri, connect_timeout=5) as c:
                    store.set_service(c, role, idx, pid, port, url)
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
                time.sleep(0.1)

    def _start_batch(self, children: list[Child]) -> None:
        for c in children:
            self._spawn(c)
            self.children.append(c)
        for c in children:
            self._await_ready(c)

    def _start_janitor(self) -> None:
        argv = [sys.executable, "-m", "lightrail.fl.janitor", *(["--dir", self.tmp] if self.tmp else [])]
        self.janitor = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                        start_new_session=True)

    def start(self) -> dict:
        """Postgres, then every service; the ready info."""
        from lightrail.fl import store

        if self.data is None:
            self.tmp = tempfile.mkdtemp(prefix="lightrail-fl-")
        self._start_janitor()
        if self.tmp:
            self.pg = store.start_postgres(Path(self.tmp) / "pg", delete=True)
        else:
            self.pg = store.start_postgres(self.data, delete=False)
        self._tell_janitor(self.pg.pid)
        self.params = Path(self.tmp) / "params" if self.tmp else self.pg.data.with_name(self.pg.data.name + "-params")
        log("postgres_ready", db=self.pg.uri, postgres_pid=self.pg.pid)
        with store.connect(self.pg.uri) as c:
            c.execute("DELETE FROM services")
        self._record("postgres", 0, self.pg.pid, 0, self.pg.uri)
        batch = [Child("job_manager", 0, []), Child("scheduler", 0, []),
                 *[Child("client_manager", i, []) for i in range(self.n_managers)], Child("load_balancer", 0, [])]
        with_params = self.n_leaves > 0 and _find(self.param_server)
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
                "data": str(self.pg.data), **({"tmp": self.tmp} if self.tmp else {}),
                **({"param_state": str(self.params)} if params.get("root") else {})}

    # ---- watching ----------------------------------------------------------------------------------------------

    def _check_postgres(self) -> bool:
        """Restart PostgreSQL if it died (same data directory and socket); True if it was restarted."""
        if self.pg is None or self.pg.alive() or self.stopping.is_set():
            return False
        old, code = self.pg.pid, self.pg.proc.returncode
        try:
            self.pg.restart()
        except LightrailError as e:
            log("replace_failed", service="postgres", idx=0, error=str(e))
            return False
        self._tell_janitor(self.pg.pid)
        self.replacements += 1
        self._record("postgres", 0, self.pg.pid, 0, self.pg.uri)
        log("replaced", service="postgres", idx=0, old_pid=old, exit_code=code, new_pid=self.pg.pid, url=self.pg.uri)
        return True

    def check(self) -> list[Child]:
        """Restart PostgreSQL and replace every child that died; the replaced children."""
        self._check_postgres()
        replaced = []
        for child in list(self.children):
            if self.stopping.is_set() or child.proc.poll() is None:
                continue
            time.sleep(0.05)  # a stop signal that killed the child reaches us too
            if self.stopping.is_set():
                return replaced
            old_pid, code = child.pid, child.proc.returncode
            try:
                self._spawn(child)
                self._await_ready(child)
            except LightrailError as e:
                log("replace_failed", service=child.role, idx=child.idx, error=str(e))
                continue
            self.replacements += 1
            log("replaced", service=child.role, idx=child.idx, old_pid=old_pid, old_port=child.port, exit_code=code,
                new_pid=child.pid, port=child.port, url=child.url)
            replaced.append(child)
            if child.role == "root":  # the root lost its state: leaves restart and re-forward what they hold
                for leaf in (c for c in self.children if c.role == "leaf"):
                    stop_procs([leaf.proc])
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
        """Every child, then PostgreSQL, then the temporary directory; the janitor is told it has nothing to do."""
        self.stopping.set()
        procs = [c.proc for c in self.children if c.proc is not None]
        stop_procs(procs)
        for c in self.children:
            if c.sock is not None:
                c.sock.close()
        if self.pg is not None:
            self.pg.stop()
            log("stopped", children=len(procs), postgres_pid=self.pg.pid)
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self.janitor is not None:
            with contextlib.suppress(OSError, ValueError):
                self.janitor.stdin.write("done\n")
                self.janitor.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.janitor.wait(5)


def _find(module: str) -> bool:
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None and importlib.util.find_spec(module) \
            is not None
    except (ImportError, ValueError):
        return False


def stop_procs(procs: list[subprocess.Popen], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to each, then SIGKILL to those still running after ``grace`` seconds."""
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
