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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from lightrail.errors import LightrailError, ScenarioError
from lightrail.fl.aggregate import WEIGHTINGS, Partial, apply_mean, as_vector, result_weight
from lightrail.web import json_logging, start_web

__all__ = ["RootState", "LeafState", "root_app", "leaf_app", "serve", "start_param_server", "stop_param_server",
           "main"]

log = logging.getLogger("lightrail.fl.param_server")
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ParamServerError(LightrailError):
    """A refused request, with its HTTP status."""

    def __init__(self, status: int, message: str, *, field: str | None = None, fix: str | None = None):
        self.status = status
        super().__init__(message, field=field, fix=fix)


def _error_body(e: LightrailError) -> dict:
    return {"type": type(e).__name__, "message": e.message, "field": e.field, "fix": e.fix}


def _log(what: str, /, **fields) -> None:
    log.info(what, extra={"fields": fields})


def _check_job(job: str) -> str:
    if not JOB_NAME.match(job):
        raise ParamServerError(422, f"{job!r} is not a job name", field="job",
                               fix="letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit")
    return job


def _etag(version: int) -> str:
    return f'"v{version}"'


# --- request bodies ---------------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PutModel(_Body):
    model: list[float]
    round: int = Field(default=0, ge=0)
    expected: int | None = Field(default=None, ge=1)
    weighting: str = "uniform"


class SetRound(_Body):
    round: int = Field(ge=0)
    expected: int = Field(ge=1)


class Aggregate(_Body):
    round: int = Field(ge=0)
    leaf: str = Field(min_length=1, max_length=256)
    batch: int = Field(ge=0)
    sum: list[float]
    weight: float = Field(gt=0)
    count: int = Field(ge=1)
    client_ids: list[str] | None = None


class Result(_Body):
    client_id: str = Field(min_length=1, max_length=256)
    round: int = Field(ge=0)
    update: list[float]
    samples: int | None = Field(default=None, ge=0)


# --- the root ---------------------------------------------------------------------------------------------------------


@dataclass
class RootJob:
    model: np.ndarray  # float32
    round: int
    version: int
    expected: int | None
    weighting: str
    body: bytes = b""
    total: Partial | None = None
    batches: set = field(default_factory=set)  # (leaf, round, batch) ever received
    model_downloads: int = 0
    aggregates_received: int = 0
    results_applied: int = 0
    rounds_applied: int = 0

    def encode(self, job: str) -> None:
        self.body = json.dumps({"job": job, "round": self.round, "version": self.version, "dim": len(self.model),
                                "weighting": self.weighting, "expected": self.expected,
                                "model": self.model.tolist()}).encode()


class RootState:
    """The root's jobs and counters (all mutation on the event loop: no awaits inside a change)."""

    def __init__(self):
        self.jobs: dict[str, RootJob] = {}
        self.versions = 0  # one counter across jobs: an ETag is never reused, even by a replaced job
        self.counters = {"model_downloads": 0, "aggregates_received": 0, "duplicate_aggregates": 0,
                         "stale_aggregates": 0, "results_applied": 0, "rounds_applied": 0}

    def job(self, job: str) -> RootJob:
        _check_job(job)
        if job not in self.jobs:
            raise ParamServerError(404, f"unknown job {job!r}", field="job",
                                   fix="its owner puts the initial model with POST /jobs/{job}/model")
        return self.jobs[job]

    def put_model(self, job: str, body: PutModel) -> dict:
        _check_job(job)
        if body.weighting not in WEIGHTINGS:
            raise ParamServerError(422, f"unknown weighting {body.weighting!r}", field="weighting",
                                   fix=f"one of: {', '.join(WEIGHTINGS)}")
        model = as_vector(body.model, dim=None, field="model").astype(np.float32)
        self.versions += 1
        j = RootJob(model=model, round=body.round, version=self.versions, expected=body.expected,
                    weighting=body.weighting, total=Partial.empty(len(model)))
        j.encode(job)
        self.jobs[job] = j
        _log("model_put", job=job, round=j.round, dim=len(model), expected=j.expected, version=j.version)
        return self.version(job)

    def version(self, job: str) -> dict:
        j = self.job(job)
        return {"job": job, "round": j.round, "version": j.version, "etag": _etag(j.version), "dim": len(j.model),
                "expected": j.expected, "pending": j.total.count}

    def set_round(self, job: str, body: SetRound) -> dict:
        j = self.job(job)
        self._open(j, body.round)
        j.expected = body.expected
        self._maybe_apply(job, j)
        return self.version(job)

    def _open(self, j: RootJob, round_: int) -> None:
        if round_ != j.round:
            raise ParamServerError(409, f"round {round_} is {'closed' if round_ < j.round else 'not started'}; "
                                   f"the current round is {j.round}", field="round",
                                   fix="fetch the current model (GET /jobs/{job}/model) and use its round")

    def aggregate(self, job: str, body: Aggregate) -> dict:
        j = self.job(job)
        key = (body.leaf, body.round, body.batch)
        if key in j.batches:
            self.counters["duplicate_aggregates"] += 1
            return {"ok": True, "duplicate": True, "applied": False, "round": j.round}
        try:
            self._open(j, body.round)
        except ParamServerError:
            self.counters["stale_aggregates"] += 1
            raise
        s = as_vector(body.sum, dim=len(j.model), field="sum")
        if body.client_ids is not None and len(body.client_ids) != body.count:
            raise ParamServerError(422, f"names {len(body.client_ids)} clients for count {body.count}",
                                   field="client_ids")
        j.batches.add(key)
        j.total = j.total.merge(Partial(s, body.weight, body.count))
        j.aggregates_received += 1
        self.counters["aggregates_received"] += 1
        applied = self._maybe_apply(job, j)
        return {"ok": True, "duplicate": False, "applied": applied, "round": j.round, "pending": j.total.count}

    def _maybe_apply(self, job: str, j: RootJob) -> bool:
        if j.expected is None or j.total.count < j.expected:
            return False
        j.model = apply_mean(j.model, j.total)
        results = j.total.count
        j.results_applied += results
        j.rounds_applied += 1
        self.counters["results_applied"] += results
        self.counters["rounds_applied"] += 1
        j.round += 1
        self.versions += 1
        j.version = self.versions
        j.total = Partial.empty(len(j.model))
        j.encode(job)
        _log("round_applied", job=job, results=results, round=j.round, version=j.version)
        return True

    def stats(self) -> dict:
        return {"role": "root", **self.counters,
                "jobs": {name: {"round": j.round, "version": j.version, "expected": j.expected,
                                "pending": j.total.count, "model_downloads": j.model_downloads,
                                "aggregates_received": j.aggregates_received, "results_applied": j.results_applied,
                                "rounds_applied": j.rounds_applied} for name, j in self.jobs.items()}}


# --- the leaf ---------------------------------------------------------------------------------------------------------


@dataclass
class CachedModel:
    body: bytes
    etag: str
    round: int
    version: int
    dim: int
    weighting: str
    checked: float  # time.monotonic() of the last check with the root


@dataclass
class Batch:
    partial: Partial | None  # None once forwarded (the sum is no longer needed)
    clients: list[str]
    forwarded: bool = False
    dropped: str | None = None  # why the root refused it for good (a closed round)


@dataclass
class RoundBuffer:
    job: str
    round: int
    dim: int
    pending: Partial
    pending_clients: list[str]
    batches: dict[int, Batch] = field(default_factory=dict)
    seen: set = field(default_factory=set)

    def to_json(self) -> dict:
        def partial(p: Partial | None):
            return None if p is None else {"sum": p.sum.tolist(), "weight": p.weight, "count": p.count}
        return {"job": self.job, "round": self.round, "dim": self.dim,
                "pending": partial(self.pending), "pending_clients": self.pending_clients,
                "batches": {str(i): {"partial": partial(b.partial), "clients": b.clients, "forwarded": b.forwarded,
                                     "dropped": b.dropped} for i, b in self.batches.items()}}

    @classmethod
    def from_json(cls, d: dict) -> RoundBuffer:
        def partial(p):
            return None if p is None else Partial(np.asarray(p["sum"], np.float64), float(p["weight"]), int(p["count"]))
        buf = cls(job=d["job"], round=int(d["round"]), dim=int(d["dim"]), pending=partial(d["pending"]),
                  pending_clients=list(d["pending_clients"]),
                  batches={int(i): Batch(partial(b["partial"]), list(b["clients"]), bool(b["forwarded"]),
                                         b.get("dropped")) for i, b in d["batches"].items()})
        buf.seen = set(buf.pending_clients).union(*(b.clients for b in buf.batches.values()))
        return buf

    def unforwarded(self) -> list[int]:
        return sorted(i for i, b in self.batches.items() if not b.forwarded and b.dropped is None)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LeafState:
    """A leaf's model cache and round buffers. ``state``: the directory that makes acknowledged results durable
    (None: memory only). Changes happen on the event loop without awaits, each persisted before it is visible."""

    def __init__(self, root_url: str, *, state: Path | None = None, leaf_id: str | None = None,
                 revalidate_s: float = 0.2, flush_every: int = 0, http=None):
        self.root = root_url.rstrip("/")
        self.state = Path(state) if state is not None else None
        self.revalidate_s = revalidate_s
        self.flush_every = flush_every
        self.http = http  # an httpx.AsyncClient, set by serve
        self.cache: dict[str, CachedModel] = {}
        self.buffers: dict[tuple[str, int], RoundBuffer] = {}
        self.fetch_locks: dict[str, asyncio.Lock] = {}
        self.flush_locks: dict[str, asyncio.Lock] = {}
        self.tasks: set[asyncio.Task] = set()
        self.counters = {"model_requests": 0, "root_downloads": 0, "root_revalidations": 0, "results_received": 0,
                         "duplicate_results": 0, "forwards": 0, "duplicate_forwards": 0, "dropped_batches": 0,
                         "forward_errors": 0, "recovered_results": 0, "recovered_batches": 0}
        self.leaf_id = leaf_id or self._load_id()

    # -- persistence --------------------------------------------------------------------------------------------
    def _load_id(self) -> str:
        if self.state is None:
            return f"leaf-{uuid.uuid4().hex[:12]}"
        self.state.mkdir(parents=True, exist_ok=True)
        path = self.state / "leaf.json"
        if path.exists():
            return json.loads(path.read_text())["leaf_id"]
        leaf_id = f"leaf-{uuid.uuid4().hex[:12]}"
        _atomic_write(path, json.dumps({"leaf_id": leaf_id}).encode())
        return leaf_id

    def _persist(self, buf: RoundBuffer) -> None:
        if self.state is None:
            return
        folder = self.state / buf.job
        folder.mkdir(exist_ok=True)
        _atomic_write(folder / f"round-{buf.round}.json", json.dumps(buf.to_json()).encode())

    def recover(self) -> list[str]:
        """Load every round buffer of the state directory; the jobs with something to forward."""
        if self.state is None:
            return []
        jobs = set()
        for path in sorted(self.state.glob("*/round-*.json")):
            buf = RoundBuffer.from_json(json.loads(path.read_bytes()))
            self.buffers[(buf.job, buf.round)] = buf
            self.counters["recovered_results"] += buf.pending.count + sum(
                b.partial.count for b in buf.batches.values() if b.partial is not None and not b.forwarded)
            self.counters["recovered_batches"] += len(buf.unforwarded())
            if buf.pending.count or buf.unforwarded():
                jobs.add(buf.job)
        if jobs:
            _log("recovered", leaf=self.leaf_id, jobs=sorted(jobs), results=self.counters["recovered_results"],
                 batches=self.counters["recovered_batches"])
        return sorted(jobs)

    # -- the model cache ----------------------------------------------------------------------------------------
    async def model(self, job: str, *, newer_than: int | None = None, force: bool = False) -> CachedModel:
        """The job's model: from the cache when it was checked within ``revalidate_s`` (and is at least round
        ``newer_than``), else after one conditional GET to the root shared by every concurrent caller."""
        _check_job(job)
        asked = time.monotonic()
        entry = self.cache.get(job)
        if entry is not None and not force and self._fresh(entry, asked, newer_than):
            return entry
        async with self.fetch_locks.setdefault(job, asyncio.Lock()):
            entry = self.cache.get(job)
            if entry is not None and entry.checked >= asked and (newer_than is None or entry.round >= newer_than):
                return entry  # another request revalidated while this one waited
            headers = {"If-None-Match": entry.etag} if entry is not None else {}
            try:
                r = await self.http.get(f"{self.root}/jobs/{job}/model", headers=headers)
            except Exception as e:  # noqa: BLE001 - the root is down: serve what the leaf has
                if entry is not None:
                    _log("root_unreachable", job=job, error=repr(e), serving_version=entry.version)
                    return entry
                raise ParamServerError(503, f"the root {self.root} is unreachable ({e!r})", field="root",
                                       fix="retry later") from None
            now = time.monotonic()
            if r.status_code == 304 and entry is not None:
                self.counters["root_revalidations"] += 1
                entry.checked = now
                return entry
            if r.status_code != 200:
                self.cache.pop(job, None)
                _raise_from(r)
            meta = json.loads(r.content)
            entry = CachedModel(body=r.content, etag=r.headers.get("etag", _etag(meta["version"])),
                                round=meta["round"], version=meta["version"], dim=meta["dim"],
                                weighting=meta["weighting"], checked=now)
            self.cache[job] = entry
            self.counters["root_downloads"] += 1
            _log("model_downloaded", job=job, round=entry.round, version=entry.version)
            return entry

    def _fresh(self, entry: CachedModel, now: float, newer_than: int | None) -> bool:
        return now - entry.checked < self.revalidate_s and (newer_than is None or entry.round >= newer_than)

    # -- results ------------------------------------------------------------------------------------------------
    async def result(self, job: str, body: Result) -> dict:
        m = await self.model(job, newer_than=body.round)
        if body.round == m.round and time.monotonic() - m.checked >= self.revalidate_s:
            m = await self.model(job, force=True)
        if body.round != m.round:
            raise ParamServerError(409, f"round {body.round} is {'closed' if body.round < m.round else 'not started'}"
                                   f"; the current round is {m.round}", field="round",
                                   fix="fetch the current model and train on it")
        update = as_vector(body.update, dim=m.dim, field="update")
        weight = result_weight(m.weighting, body.samples)
        # from here to the reply: no await, so the change is atomic on the loop
        key = (job, body.round)
        buf = self.buffers.get(key) or RoundBuffer(job, body.round, m.dim, Partial.empty(m.dim), [])
        if buf.dim != m.dim:
            raise ParamServerError(409, f"round {body.round} was collected for a model of length {buf.dim}; the job's "
                                   f"model now has length {m.dim}", field="update",
                                   fix="the owner replaced the model: put it with a new round number")
        if body.client_id in buf.seen:
            self.counters["duplicate_results"] += 1
            return {"ok": True, "duplicate": True, "round": body.round, "pending": buf.pending.count}
        new = RoundBuffer(job, buf.round, buf.dim, buf.pending.add(update, weight),
                          buf.pending_clients + [body.client_id], buf.batches, buf.seen | {body.client_id})
        self._persist(new)  # durable before acknowledged
        self.buffers[key] = new
        self.counters["results_received"] += 1
        if self.flush_every and new.pending.count >= self.flush_every:
            self.spawn(self.flush(job))
        return {"ok": True, "duplicate": False, "round": body.round, "pending": new.pending.count}

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- forwarding ---------------------------------------------------------------------------------------------
    def _seal(self, buf: RoundBuffer) -> None:
        if buf.pending.count == 0:
            return
        batch_id = max(buf.batches, default=-1) + 1
        batches = {**buf.batches, batch_id: Batch(buf.pending, buf.pending_clients)}
        new = RoundBuffer(buf.job, buf.round, buf.dim, Partial.empty(buf.dim), [], batches, buf.seen)
        self._persist(new)
        self.buffers[(buf.job, buf.round)] = new

    async def flush(self, job: str) -> dict:
        """Seal the job's running partials into batches and forward every batch not yet forwarded, in order."""
        _check_job(job)
        out = {"job": job, "forwarded": 0, "duplicates": 0, "dropped": 0, "unforwarded": 0, "errors": []}
        async with self.flush_locks.setdefault(job, asyncio.Lock()):
            for key in sorted(k for k in self.buffers if k[0] == job):
                self._seal(self.buffers[key])
            for key in sorted(k for k in self.buffers if k[0] == job):
                for batch_id in self.buffers[key].unforwarded():
                    await self._forward(key, batch_id, out)
            out["unforwarded"] = sum(len(b.unforwarded()) for k, b in self.buffers.items() if k[0] == job)
        return out

    async def _forward(self, key: tuple[str, int], batch_id: int, out: dict) -> None:
        job, round_ = key
        batch = self.buffers[key].batches[batch_id]
        p = batch.partial
        body = {"round": round_, "leaf": self.leaf_id, "batch": batch_id, "sum": p.sum.tolist(), "weight": p.weight,
                "count": p.count, "client_ids": batch.clients}
        try:
            r = await self.http.post(f"{self.root}/jobs/{job}/aggregate", json=body)
        except Exception as e:  # noqa: BLE001 - kept for the next flush
            self.counters["forward_errors"] += 1
            out["errors"].append(f"batch {batch_id} of round {round_}: {e!r}")
            return
        if r.status_code == 200:
            reply = r.json()
            done = Batch(None, batch.clients, forwarded=True)
            self.counters["duplicate_forwards" if reply.get("duplicate") else "forwards"] += 1
            out["duplicates" if reply.get("duplicate") else "forwarded"] += 1
            if reply.get("round", round_) > round_ and job in self.cache:
                self.cache[job].checked = float("-inf")  # the round closed: the next request revalidates
        elif r.status_code == 409:  # the round closed before this batch came: a straggler, dropped for good
            done = Batch(None, batch.clients, dropped=_error_text(r))
            self.counters["dropped_batches"] += 1
            out["dropped"] += 1
            _log("batch_dropped", job=job, round=round_, batch=batch_id, reason=done.dropped)
        else:
            self.counters["forward_errors"] += 1
            out["errors"].append(f"batch {batch_id} of round {round_}: HTTP {r.status_code} {_error_text(r)}")
            return
        buf = self.buffers[key]
        new = RoundBuffer(buf.job, buf.round, buf.dim, buf.pending, buf.pending_clients,
                          {**buf.batches, batch_id: done}, buf.seen)
        self._persist(new)
        self.buffers[key] = new
        _log("forwarded", job=job, round=round_, batch=batch_id, results=p.count, status=r.status_code)

    def jobs_to_flush(self) -> list[str]:
        return sorted({k[0] for k, b in self.buffers.items() if b.pending.count or b.unforwarded()})

    async def flush_all(self) -> list[dict]:
        return [await self.flush(job) for job in self.jobs_to_flush()]

    def stats(self) -> dict:
        return {"role": "leaf", "leaf": self.leaf_id, **self.counters,
                "jobs": {job: {"round": c.round, "version": c.version} for job, c in self.cache.items()},
                "buffers": {f"{j}/{r}": {"pending": b.pending.count, "batches": len(b.batches),
                                         "unforwarded": len(b.unforwarded())} for (j, r), b in self.buffers.items()}}


def _error_text(r) -> str:
    try:
        e = r.json()
        return f"{e.get('field')}: {e.get('message')}" if isinstance(e, dict) else r.text
    except ValueError:
        return r.text


def _raise_from(r) -> None:
    try:
        e = r.json()
    except ValueError:
        e = {}
    raise ParamServerError(r.status_code if 400 <= r.status_code < 500 else 502,
                           str(e.get("message") or f"the root answered HTTP {r.status_code}"),
                           field=e.get("field") or "root", fix=e.get("fix"))


# --- the HTTP apps ----------------------------------------------------------------------------------------------------


def _base_app(title: str):
    from lightrail.web import require_service

    fastapi, _ = require_service("fastapi", "uvicorn")
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    app = fastapi.FastAPI(title=title, version="1")

    @app.exception_handler(ParamServerError)
    async def _refused(_, e: ParamServerError):
        return JSONResponse(_error_body(e), status_code=e.status)

    @app.exception_handler(LightrailError)
    async def _bad(_, e: LightrailError):
        return JSONResponse(_error_body(e), status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path")]
        if first.get("type") == "json_invalid":
            name, message = "body", f"is not valid JSON ({first.get('ctx', {}).get('error', first.get('msg'))})"
        else:
            name = loc[0] if loc else "body"
            message = first.get("msg", "invalid") + (f" (at {'.'.join(loc)})" if len(loc) > 1 else "")
        return JSONResponse({"type": "ScenarioError", "message": message, "field": name, "fix": None},
                            status_code=422)

    @app.get("/healthz")
    async def healthz():
        return {"ok": True}

    return app


def root_app(state: RootState):
    from fastapi import Header, Response

    app = _base_app("lightrail fl root parameter server")

    @app.post("/jobs/{job}/model")
    async def put_model(job: str, body: PutModel):
        return state.put_model(job, body)

    @app.get("/jobs/{job}/model")
    async def get_model(job: str, if_none_match: str | None = Header(default=None)):
        j = state.job(job)
        etag = _etag(j.version)
        headers = {"ETag": etag, "X-Round": str(j.round), "X-Version": str(j.version)}
        if if_none_match == etag:
            return Response(status_code=304, headers=headers)
        j.model_downloads += 1
        state.counters["model_downloads"] += 1
        return Response(j.body, media_type="application/json", headers=headers)

    @app.get("/jobs/{job}/version")
    async def version(job: str):
        return state.version(job)

    @app.post("/jobs/{job}/round")
    async def set_round(job: str, body: SetRound):
        return state.set_round(job, body)

    @app.post("/jobs/{job}/aggregate")
    async def aggregate(job: str, body: Aggregate):
        return state.aggregate(job, body)

    @app.get("/stats")
    async def stats():
        return state.stats()

    return app


def leaf_app(state: LeafState):
    from fastapi import Header, Response

    app = _base_app("lightrail fl leaf parameter server")

    @app.get("/jobs/{job}/model")
    async def get_model(job: str, round: int | None = None,  # noqa: A002 - the query's name
                        if_none_match: str | None = Header(default=None)):
        state.counters["model_requests"] += 1
        m = await state.model(job, newer_than=round)
        headers = {"ETag": m.etag, "X-Round": str(m.round), "X-Version": str(m.version)}
        if if_none_match == m.etag:
            return Response(status_code=304, headers=headers)
        return Response(m.body, media_type="application/json", headers=headers)

    @app.post("/jobs/{job}/result")
    async def result(job: str, body: Result):
        return await state.result(job, body)

    @app.post("/jobs/{job}/flush")
    async def flush(job: str):
        return await state.flush(job)

    @app.post("/flush")
    async def flush_all():
        return {"flushed": await state.flush_all()}

    @app.get("/stats")
    async def stats():
        return state.stats()

    return app


# --- the process ------------------------------------------------------------------------------------------------------


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


# --- for tests and supervisors ----------------------------------------------------------------------------------------


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
