"""The root parameter server's state (in memory): per job the model, its version and round, and the leaf batches
it applied (deduplicated by (leaf, round, batch)); FedAvg once a round has its results.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from lightrail.fl.aggregate import WEIGHTINGS, Partial, apply_mean, as_vector
from lightrail.fl.param_protocol import Aggregate, ParamServerError, PutModel, SetRound, _check_job, _etag, _log


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
