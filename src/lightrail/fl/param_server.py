"""Propius's data plane as processes: a root parameter server and leaf servers that cache the model and
pre-aggregate client results, so one model download from the root serves every client of a leaf.

Run ``python -m lightrail.fl.param_server --role root --port 0`` and
``python -m lightrail.fl.param_server --role leaf --port 0 --root http://127.0.0.1:PORT [--state DIR]``; each
prints one JSON line ``{"event": "ready", "role": ..., "port": ...}`` on stdout, then serves HTTP on 127.0.0.1
(JSON logs on stderr) until SIGTERM/SIGINT. ``start_param_server`` does this for tests and supervisors.

Root (in memory), per job:

* ``POST /jobs/{job}/model`` ``{model, round=0, expected=null, weighting="uniform"}``: the owner puts (or
  replaces) the model; the job's round restarts at ``round`` with nothing accumulated.
* ``GET /jobs/{job}/model``: ``{job, round, version, dim, weighting, expected, model}`` with ``ETag`` (the
  version); ``If-None-Match`` with the current ETag answers 304 without a body (not counted as a download).
* ``GET /jobs/{job}/version``: ``{round, version, etag}``, cheap.
* ``POST /jobs/{job}/round`` ``{round, expected}``: how many client results close the current round.
* ``POST /jobs/{job}/aggregate`` ``{round, leaf, batch, sum, weight, count, client_ids}``: a leaf's batch;
  deduplicated by ``(leaf, round, batch)``. Once the round has ``count >= expected`` results (the batch that
  crosses the threshold counts whole), the model becomes ``float32(model + sum / weight)`` (FedAvg, see
  ``lightrail.fl.aggregate``) and the round advances. A batch for a closed round is refused (409): stragglers.
* ``GET /stats``: ``model_downloads``, ``aggregates_received``, ``duplicate_aggregates``, ``results_applied``,
  ``rounds_applied``, and per job.

Leaf, per job:

* ``GET /jobs/{job}/model[?round=N]``: the root's model body, byte for byte, from the leaf's cache. The leaf
  revalidates with the root (a conditional GET: 304 costs no download) at most once per ``--revalidate-ms``,
  at once when a client names a newer ``round``, or after its forward closed a round; concurrent requests
  share one revalidation, so N clients cost one download from the root per model version.
* ``POST /jobs/{job}/result`` ``{client_id, round, update, samples=null}``: added to the leaf's running sum
  for (job, round) unless ``client_id`` was already counted in that round (a retry: ``duplicate: true``).
  The result is persisted in ``--state`` *before* the reply, so an acknowledged result survives kill -9.
* ``POST /jobs/{job}/flush``, ``POST /flush``: seal the running sum into a numbered batch and forward every
  batch not yet forwarded; also every ``--flush-every`` results and every ``--flush-interval-ms``.
* ``GET /stats``: ``results_received``, ``duplicate_results``, ``forwards``, ``root_downloads``,
  ``root_revalidations``, ``model_requests``, ``recovered_results``, ``recovered_batches``.

Persistence (leaf): ``--state DIR`` holds ``leaf.json`` (the leaf's id, so a replacement leaf is the same
leaf to the root) and one ``<job>/round-<r>.json`` per (job, round): the running partial (float64 sum,
weight, count, client ids) and every sealed batch (its partial, client ids, forwarded or not). Every change
is written whole to a temporary file, fsynced and renamed over the old one (atomic), before the request that
caused it is answered. A leaf started on the same DIR loads them and forwards what is unforwarded (sealing the
running partial first); the root's dedup by (leaf, round, batch) makes a batch forwarded twice count once.
The root keeps its state in memory only.

Errors are JSON ``{type, message, field, fix}``: 422 for bad input (``field`` names it: ``update``, ``model``,
``body`` for malformed JSON), 404 for an unknown job (``field: job``), 409 for a round that is not open.

Rooms: ``param_protocol`` (errors, request bodies), ``param_root`` and ``param_leaf`` (the two states),
``param_apps`` (the HTTP apps); this module is the process (``serve``, ``main``, ``start_param_server``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from lightrail.errors import LightrailError, ScenarioError
from lightrail.fl.param_apps import leaf_app, root_app
from lightrail.fl.param_leaf import LeafState
from lightrail.fl.param_protocol import _log, log
from lightrail.fl.param_root import RootState
from lightrail.web import json_logging, start_web

__all__ = ["RootState", "LeafState", "root_app", "leaf_app", "serve", "start_param_server", "stop_param_server",
           "main"]


async def _serve(args, ready) -> None:
    from lightrail.web import require_service

    httpx = require_service("httpx", "uvicorn")[0]
    start = time.perf_counter()
    background: list[asyncio.Task] = []
    client = None
    if args.role == "root":
        state = RootState()
        app = root_app(state)
        extra = {}
    else:
        client = httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=httpx.Limits(max_connections=32))
        state = LeafState(args.root, state=args.state, leaf_id=args.leaf_id, revalidate_s=args.revalidate_ms / 1e3,
                          flush_every=args.flush_every, http=client)
        recovered = state.recover()
        app = leaf_app(state)
        extra = {"root": state.root, "leaf": state.leaf_id, "state": str(args.state) if args.state else None,
                 "recovered_jobs": recovered}
    sock = None
    if args.fd is not None:  # the supervisor's socket: a replacement listens where its predecessor did
        import socket

        sock = socket.socket(fileno=args.fd)
    web, web_task, port = await start_web(app, args.host, args.port, what=f"the {args.role} parameter server",
                                          sock=sock)
    info = {"role": args.role, "host": args.host, "port": port, **extra,
            "startup_s": round(time.perf_counter() - start, 4)}
    _log("ready", **info)
    ready(info)
    if args.role == "leaf":
        if recovered:
            background.append(asyncio.create_task(_forward_recovered(state)))
        if args.flush_interval_ms > 0:
            background.append(asyncio.create_task(_flush_timer(state, args.flush_interval_ms / 1e3)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    _log("stopping", role=args.role)
    for task in background:
        task.cancel()
    web.should_exit = True
    await web_task
    if client is not None:
        await client.aclose()


async def _forward_recovered(state: LeafState) -> None:
    """Forward what a previous leaf on this state directory acknowledged, retrying until the root takes it."""
    delay = 0.1
    while state.jobs_to_flush():
        errors = [e for out in await state.flush_all() for e in out["errors"]]
        if not errors:
            return
        _log("recovery_retry", errors=errors[:3], delay_s=delay)
        await asyncio.sleep(delay)
        delay = min(2.0, delay * 2)


async def _flush_timer(state: LeafState, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            await state.flush_all()
        except Exception as e:  # noqa: BLE001 - the timer keeps going
            _log("flush_failed", error=repr(e))


def serve(args, *, ready=None) -> None:
    """Run a parameter server (``args`` from ``main``'s parser) until SIGTERM/SIGINT."""
    from lightrail.web import require_service

    require_service("fastapi", "uvicorn", "httpx")
    json_logging(log)
    ready = ready or (lambda info: print(json.dumps({"event": "ready", **info}), flush=True))
    asyncio.run(_serve(args, ready))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightrail.fl.param_server", description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("root", "leaf"), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    p.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket instead of --port")
    p.add_argument("--root", help="leaf: the root's URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--state", type=Path, help="leaf: directory making acknowledged results durable")
    p.add_argument("--leaf-id", help="leaf: its name at the root (default: kept in --state, else random)")
    p.add_argument("--revalidate-ms", type=float, default=200.0,
                   help="leaf: serve the cached model this long before checking the root again")
    p.add_argument("--flush-every", type=int, default=0,
                   help="leaf: forward once this many results are pending (0: only on flush or the timer)")
    p.add_argument("--flush-interval-ms", type=float, default=1000.0,
                   help="leaf: forward pending results this often (0: never on a timer)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    try:
        if not 0 <= args.port <= 65535:
            raise ScenarioError(f"{args.port} is not a TCP port", field="--port", fix="use 0..65535")
        if args.role == "leaf" and not args.root:
            raise ScenarioError("a leaf needs its root", field="--root", fix="--root http://127.0.0.1:PORT")
        if args.flush_every < 0 or args.revalidate_ms < 0 or args.flush_interval_ms < 0:
            raise ScenarioError("must be >= 0", field="--flush-every/--revalidate-ms/--flush-interval-ms")
        serve(args)
    except LightrailError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def start_param_server(role: str, root_url: str | None = None, state: str | os.PathLike | None = None, *,
                       port: int = 0, args: list[str] | tuple[str, ...] = (), stderr=None,
                       timeout: float = 30.0) -> tuple[subprocess.Popen, int]:
    """Start ``python -m lightrail.fl.param_server`` and wait (at most ``timeout`` s) for its ready line:
    ``(process, port)``. ``args``: more flags (``["--flush-every", "10"]``); ``stderr``: where its JSON logs go
    (default: this process's stderr). The caller stops it (``stop_param_server`` or ``kill``)."""
    cmd = [sys.executable, "-m", "lightrail.fl.param_server", "--role", role, "--port", str(port)]
    if root_url is not None:
        cmd += ["--root", root_url]
    if state is not None:
        cmd += ["--state", str(state)]
    proc = subprocess.Popen([*cmd, *args], stdout=subprocess.PIPE, stderr=stderr, text=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(timeout=left):
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the {role} parameter server exited ({proc.wait()}) before it was ready")
                try:
                    info = json.loads(line)
                except ValueError:
                    continue
                if info.get("event") == "ready":
                    return proc, int(info["port"])
        raise TimeoutError(f"the {role} parameter server printed no ready line within {timeout} s")
    except BaseException:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise
    finally:
        sel.close()


def stop_param_server(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout`` s; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    code = proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
