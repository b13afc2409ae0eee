"""A leaf parameter server's state: the cached model (revalidated with the root), the running partial and sealed
batches per (job, round), persisted under ``--state`` before each reply, and forwarding batches to the root.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lightrail.atomic import write_bytes
from lightrail.fl.aggregate import Partial, as_vector, result_weight
from lightrail.fl.param_protocol import ParamServerError, Result, _check_job, _etag, _log


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
        write_bytes(path, json.dumps({"leaf_id": leaf_id}).encode(), durable=True)
        return leaf_id

    def _persist(self, buf: RoundBuffer) -> None:
        if self.state is None:
            return
        folder = self.state / buf.job
        folder.mkdir(exist_ok=True)
        write_bytes(folder / f"round-{buf.round}.json", json.dumps(buf.to_json()).encode(), durable=True)

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
