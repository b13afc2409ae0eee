"""The controller as a child process, for launchers and tests: start ``lightrail controller serve`` and read its
ready line (``start_controller``), register a job and read metrics through the admin API, and kill or pause it
at chosen training steps (``ControllerKiller``, ``ControllerPauser``, with the gate a rank failure shares).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from lightrail.errors import InfeasibleError
from lightrail.runtime.launch import die_with_parent
from lightrail.web import require_service

__all__ = ["start_controller", "register_job", "ControllerKiller", "ControllerPauser", "IDLE", "RESTARTING", "FAILING",
           "RECOVERED"]


def start_controller(state: Path, *, rails: int, ports: int, ocs_delay: float, timeout: float = 30.0, port: int = 0,
                     admin_port: int = 0, operator_token: str | None = None, restart: bool = False):
    """Start ``lightrail controller serve``, on free ports unless given (a restart passes the first start's
    ports, state file and ``operator_token``; its log is appended to); returns (process, ready info)."""
    cmd = [sys.executable, "-m", "lightrail.cli", "controller", "serve", "--port", str(port), "--admin-port",
           str(admin_port), "--state", str(state), "--rails", str(rails), "--ports", str(ports), "--ocs-delay",
           f"{ocs_delay}s"]
    env = None if operator_token is None else {**os.environ, "LIGHTRAIL_OPERATOR_TOKEN": operator_token}
    log = open(state.with_suffix(".log"), "a" if restart else "w")  # noqa: SIM115 (the process owns it until it exits)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                            # a launcher killed outright takes its controller along; not a restart from a
                            # thread: PR_SET_PDEATHSIG fires when the starting *thread* ends (launch.die_with_parent)
                            preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread()
                            else None)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout)
        log.close()
        last = (Path(log.name).read_text().strip().splitlines() or [""])[-1]
        raise InfeasibleError(f"the controller did not start (exit {proc.returncode}){': ' + last if last else ''}",
                              field="controller", fix=f"see {log.name}")
    return proc, json.loads(line)


def _metrics(admin_port: int) -> dict[str, float]:
    (httpx,) = require_service("httpx")
    text = httpx.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(lightrail_[a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def register_job(admin_port: int, operator_token: str, job: str, world: int, spares: int = 0) -> str:
    """Register ``job`` with the controller's admin API (``POST /jobs``, as the operator); returns the job's
    token, which its ranks send in their hello."""
    (httpx,) = require_service("httpx")
    reply = httpx.post(f"http://127.0.0.1:{admin_port}/jobs", json={"job": job, "world": world, "spares": spares},
                       headers={"Authorization": f"Bearer {operator_token}"}, timeout=10)
    if reply.status_code != 200:
        raise InfeasibleError(f"the controller refused to register job {job!r} (HTTP {reply.status_code}: "
                              f"{reply.text[:200]})", field="controller", fix="see the controller's log")
    return reply.json()["token"]


def _reached(value, rank: int, step: int) -> None:
    """``train_worker``'s ``on_step`` in the train-demo: rank 0 publishes how many steps it completed."""
    if rank == 0:
        value.value = step + 1


IDLE, RESTARTING, FAILING, RECOVERED = 0, 1, 2, 3
"""States of the gate a controller restart and a rank failure take turns through (``--spares`` runs): the
controller must see the rank die (a rank dying while it is down is never failed over: the restarted
controller never hears from it), and a restart must not cut a failover short."""


def _before_failure(gate, agent, timeout_s: float = 120.0) -> None:
    """The failing rank, just before it dies: wait until no restart is under way (the killer sets IDLE only
    once every process reconnected), claim the gate (no restart until the failover is over), and check its
    own connection is up, so the controller sees it go."""
    deadline = time.monotonic() + timeout_s
    while True:
        with gate.get_lock():
            if gate.value == IDLE:
                gate.value = FAILING
                break
        if time.monotonic() > deadline:
            raise InfeasibleError(f"the controller restart did not settle within {timeout_s:g} s",
                                  field="--kill-controller-at-step", fix="see the controller's log")
        time.sleep(0.002)
    client = getattr(agent, "client", None)
    while client is not None and not client.connected and time.monotonic() < deadline:
        time.sleep(0.002)


class ControllerKiller:
    """Kills the controller (SIGKILL) once rank 0 completed ``at[i]`` steps (plus ``after_s[i]`` seconds), then
    starts it again on the same state file, ports and operator token: the ranks reconnect and carry on.

    A thread of the launcher (the parent); ``reached`` is a shared integer the ranks' ``on_step`` sets.

    With ``gate`` (a shared integer, see IDLE...RECOVERED; runs with spares), a kill and a rank failure
    take turns: a kill waits until every one of ``processes`` is connected, for a failover under way to end
    (rank 0 completed ``failure_step``), and after the restart until every live process reconnected."""

    def __init__(self, proc, info: dict, start, at: tuple[int, ...], after_s: tuple[float, ...], reached, *,
                 gate=None, failure_step: int | None = None, processes: int = 0):
        self.proc, self.info, self._start = proc, info, start
        self.at, self.after_s, self.reached = at, after_s, reached
        self.gate, self.failure_step, self.processes = gate, failure_step, processes
        self.restarts = 0
        self.restart_s: list[float] = []  # kill to the restarted controller's ready line
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller-killer", daemon=True)

    def __enter__(self) -> ControllerKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            for step, after in zip(self.at, self.after_s, strict=True):
                while self.reached.value < step:
                    if self._stop.wait(0.002):
                        return
                if after > 0 and self._stop.wait(after):
                    return
                before = None
                if self.gate is not None:
                    if not self._connected():
                        return
                    before = self._claim()
                    if before is None:
                        return
                killed = time.perf_counter()
                self.proc.kill()
                self.proc.wait(30)
                self.proc.stdout.close()
                self.proc, self.info = self._start(port=self.info["port"], admin_port=self.info["admin_port"])
                self.restart_s.append(time.perf_counter() - killed)
                self.restarts += 1
                if before is not None:
                    self._connected(recovered=before == RECOVERED)
                    with self.gate.get_lock():
                        self.gate.value = before
        except BaseException as e:  # noqa: BLE001 (raised by the launcher once training ends)
            self.error = e

    def _claim(self) -> int | None:
        """Set the gate to RESTARTING once no failover is under way; returns what it was (None: training ended)."""
        while True:
            with self.gate.get_lock():
                state = self.gate.value
                if state in (IDLE, RECOVERED):
                    self.gate.value = RESTARTING
                    return state
                if state == FAILING and self.reached.value > self.failure_step:
                    self.gate.value = RECOVERED  # rank 0 completed the failed step: every rank recovered
                    continue
            if self._stop.wait(0.002):
                return None

    def _connected(self, recovered: bool | None = None) -> bool:
        """Wait until every live process (ranks and idle spares; one fewer once a rank failed, or, given,
        once ``recovered``) is bound on the controller; False if training ended meanwhile."""
        while True:
            failed = self.gate.value in (FAILING, RECOVERED) if recovered is None else recovered
            want = self.processes - (1 if failed else 0)
            try:
                if _metrics(self.info["admin_port"]).get("lightrail_ranks_connected", 0) >= want:
                    return True
            except Exception:  # noqa: BLE001 (a controller still starting: ask again)
                pass
            if self._stop.wait(0.01):
                return False


class ControllerPauser:
    """Freezes the controller (SIGSTOP) once rank 0 completed ``at[i]`` steps, for ``pause_s`` seconds, then lets
    it run on (SIGCONT): a GC pause, a VM stall or a brief partition, which must not fail any rank (issue 31).

    A thread of the launcher, like :class:`ControllerKiller`; ``proc`` returns the controller process now (the
    killer's, when both run). The controller is always continued on exit, so a stop never outlives the run."""

    def __init__(self, proc, at: tuple[int, ...], pause_s: float, reached):
        self.proc, self.at, self.pause_s, self.reached = proc, at, pause_s, reached
        self.pauses = 0
        self.error: BaseException | None = None
        self._stopped = None  # the process under SIGSTOP now
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller-pauser", daemon=True)

    def __enter__(self) -> ControllerPauser:
        if self.at:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.at:
            self._thread.join(60)
        self._resume()

    def _resume(self) -> None:
        with self._lock:
            proc, self._stopped = self._stopped, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)

    def _run(self) -> None:
        try:
            for step in self.at:
                while self.reached.value < step:
                    if self._stop.wait(0.002):
                        return
                with self._lock:
                    proc = self.proc()
                    if proc.poll() is not None:
                        return
                    os.kill(proc.pid, signal.SIGSTOP)
                    self._stopped = proc
                self.pauses += 1
                self._stop.wait(self.pause_s)
                self._resume()
        except BaseException as e:  # noqa: BLE001 (raised by the launcher once training ends)
            self.error = e
            self._resume()
