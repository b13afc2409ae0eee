"""Starting the controller process: start-up checks (nothing written), the state file's lock, the operator
token, and serving the rank protocol and the admin API in one event loop until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import secrets
import signal
import socket
import tempfile
import time
from pathlib import Path

from lightrail.errors import LightrailError, ScenarioError
from lightrail.runtime.controller.admin import admin_app, guarded_http
from lightrail.runtime.controller.config import ControllerConfig
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.metrics import _log, log
from lightrail.runtime.controller.ranks import RankServer
from lightrail.runtime.controller.store import Store, check_state
from lightrail.web import json_logging, require_service, start_web

TOKEN_ENV = "LIGHTRAIL_OPERATOR_TOKEN"


class StateLock:
    """An exclusive ``flock`` on ``<state>.lock`` for the controller's lifetime, holding its pid and ports: a
    second controller on the same state file is refused, naming the first (the kernel drops the lock when the
    process dies, even by SIGKILL)."""

    def __init__(self, state: str | Path):
        import fcntl

        self.path = Path(f"{state}.lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace").strip()
            os.close(self.fd)
            try:
                info = json.loads(holder)
                who = f"pid {info.get('pid')}, port {info.get('port')}, admin port {info.get('admin_port')}"
            except ValueError:
                who = holder or "a process that has not written its ports yet"
            raise ScenarioError(f"the state file {state} is in use by a running controller ({who})",
                                field="--state", fix="stop that controller, or give another --state") from None

    def write(self, **info) -> None:
        data = json.dumps({"pid": os.getpid(), **info}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def check_startup(config: ControllerConfig, state_path: str, *, accept_rollback: bool = False) -> None:
    """Everything that would make ``serve`` fail after it started work, checked first (nothing written): the
    state path is a file we can create, holding a usable state no older than it acknowledged (``check_state``),
    and the ports are free."""
    state = Path(state_path)
    if state.is_dir():
        raise ScenarioError(f"{state_path} is a directory", field="--state", fix="give a file, e.g. "
                            f"{state / 'lightrail-controller.db'}")
    parent = state.parent if str(state.parent) else Path(".")
    existing = next((p for p in [parent, *parent.parents] if p.exists()), Path("/"))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK) or (
            state.exists() and not os.access(state, os.R_OK | os.W_OK)):
        raise ScenarioError(f"cannot write the state file {state_path}", field="--state",
                            fix="give a path in a writable directory")
    check_state(state, accept_rollback=accept_rollback)
    for flag, port in (("--port", config.port), ("--admin-port", config.admin_port)):
        if port == 0:
            continue
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((config.host, port))
            except OSError as e:
                raise ScenarioError(f"cannot listen on {config.host}:{port}: {e.strerror or e}", field=flag,
                                    fix="pick a free port, or 0 for any") from None


def operator_token(config: ControllerConfig) -> tuple[str, bool]:
    """The operator token: the config's, else the environment's, else a new one (True: generated)."""
    if config.operator_token:
        return config.operator_token, False
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        if len(env) < 16:
            raise ScenarioError(f"{TOKEN_ENV} is shorter than 16 characters", field=TOKEN_ENV,
                                fix="use a long random secret, e.g. python -c 'import secrets; "
                                    "print(secrets.token_urlsafe(32))'")
        return env, False
    return secrets.token_urlsafe(32), True


async def _serve(config: ControllerConfig, state_path: str, ready, concentrator: Path | None = None) -> None:
    start = time.perf_counter()
    token, generated = operator_token(config)
    config = config.model_copy(update={"operator_token": token})
    lock = StateLock(state_path)
    store = Store(state_path)
    controller = Controller(config, store, log=_log)
    ranks = RankServer(controller, config)
    stop = asyncio.Event()
    lost: list[str] = []
    if config.frontend == "native":
        from lightrail.runtime.controller.frontend import NativeFrontend

        def frontend_lost() -> None:
            if not stop.is_set():
                lost.append("the native front end (concentrator) exited")
                _log("frontend_lost")
                stop.set()

        server = await NativeFrontend.start(concentrator, config.host, config.port, ranks.protocol, frontend_lost)
        port = server.port
    else:
        try:
            server = await asyncio.get_running_loop().create_server(ranks.protocol, config.host, config.port,
                                                                    backlog=1024)
        except OSError as e:
            raise ScenarioError(f"cannot listen on {config.host}:{config.port}: {e.strerror or e}", field="--port",
                                fix="pick a free port, or 0 for any") from None
        port = server.sockets[0].getsockname()[1]
    try:
        web, web_task, admin_port = await start_web(admin_app(controller, token=token, server=ranks), config.host,
                                                    config.admin_port, what="admin API", access_log=False,
                                                    http=guarded_http(), timeout_keep_alive=5,
                                                    h11_max_incomplete_event_size=16 * 1024)
    except (OSError, SystemExit) as e:
        raise ScenarioError(f"cannot listen on {config.host}:{config.admin_port} ({e})", field="--admin-port",
                            fix="pick a free port, or 0 for any") from None
    lock.write(port=port, admin_port=admin_port, host=config.host)
    sweeper = asyncio.create_task(ranks.sweeper())
    loop = asyncio.get_running_loop()
    info = {"host": config.host, "port": port, "admin_port": admin_port, "state": state_path,
            "devices": len(controller.devices), "max_connections": ranks.max_connections,
            "heartbeat_timeout": config.heartbeat_timeout, "startup_s": round(time.perf_counter() - start, 4),
            "event_loop": type(loop).__module__.split(".")[0], "frontend": config.frontend}  # loop: uvloop/asyncio
    if config.frontend == "native":
        info["frontend_pid"] = server.proc.pid
    # Everything allocated so far (modules, models, the web app: ~80k objects) lives as long as the process:
    # out of the collector's way, a full collection no longer walks it (measured at 1,024 ranks: one such
    # collection stalled the loop 41 ms, every outstanding acquire with it; issue 17).
    gc.freeze()
    info["gc_frozen_objects"] = gc.get_freeze_count()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before ready: a launcher may stop it the moment it reads the line
        loop.add_signal_handler(sig, stop.set)
    _log("ready", **info, operator_token="generated" if generated else "given")
    ready({**info, "operator_token": token} if generated else info)
    await stop.wait()
    _log("stopping")
    sweeper.cancel()
    web.should_exit = True
    server.close()
    await web_task
    ranks.flush()
    store.close()
    lock.release()
    if lost:
        raise LightrailError(lost[0], field="frontend", fix="see the controller's log; restart it (the state file "
                             "holds the circuits; ranks reconnect)")


def serve(config: ControllerConfig, state_path: str, *, ready=None, accept_rollback: bool = False) -> None:
    """Run the controller until SIGTERM/SIGINT; ``ready(info)`` is called once it listens (default:
    print the info as one JSON line on stdout). Without the extra ``service``, a LightrailError first;
    a state path or port that cannot work, a ScenarioError before anything is written."""
    require_service()  # before the log handler and the event loop: a missing extra is a one-line error
    check_startup(config, state_path, accept_rollback=accept_rollback)
    json_logging(log)
    ready = ready or (lambda info: print(json.dumps({"event": "ready", **info}), flush=True))
    native = config.frontend == "native"
    with tempfile.TemporaryDirectory(prefix="lightrail-frontend-") if native else contextlib.nullcontext() as build:
        concentrator = None
        if native:  # built before anything is written: no compiler is a one-line error
            from lightrail.runtime.controller.frontend import compile_concentrator

            concentrator = compile_concentrator(Path(build))
        event_loop_run()(_serve(config, state_path, ready, concentrator))


def event_loop_run():
    """uvloop's ``run`` where uvloop is installed (the extra ``service`` brings it), else asyncio's: the same
    asyncio API on libuv, measured here at half the CPU per request of the selector loop for a minimal
    request-reply server with 1,024 connections (issue 17; the ``floor`` of ``bench_controller.py --ranks``)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run
