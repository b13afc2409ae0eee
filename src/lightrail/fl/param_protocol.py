"""What the parameter servers (root and leaf) share: their error type and its JSON body, job names, ETags, their
log, and the request bodies of the HTTP API (see ``param_server.py``'s docstring).
"""

from __future__ import annotations

import logging
import re

from pydantic import BaseModel, ConfigDict, Field

from lightrail.errors import LightrailError

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
