"""The rank <-> controller protocol: one JSON object per line over TCP, validated here.

Every request carries an ``id`` (echoed in its reply) and an ``op``; replies are
``{"id", "ok": true, ...}`` or ``{"id", "ok": false, "error": {"message", "field", "fix"}}``.
The controller also pushes one message unasked, :class:`Revoke` (no ``id``), on the connection of
each holder of a lease it takes back; the rank answers it with :class:`Ack`.
docs/controller.md is the full description; the models below are its source of truth.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from lightrail.errors import LightrailError, ScenarioError
from lightrail.validation import first_error

__all__ = ["Hello", "Group", "Acquire", "Release", "Ack", "Bye", "Revoke", "Request", "parse_request", "parse_push",
           "encode", "error_reply"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int = 0


class Hello(_Message):
    """A rank joins its job and claims its NIC's port on each rail device (input and output of that index)."""

    op: Literal["hello"]
    job: str = Field(min_length=1)
    rank: int = Field(ge=0)
    world: int = Field(ge=1)
    ports: dict[str, int]

    @field_validator("ports")
    @classmethod
    def _ports(cls, v):
        bad = {d: p for d, p in v.items() if p < 0}
        if bad:
            raise ValueError(f"port {next(iter(bad.values()))} on {next(iter(bad))} is negative")
        return v


class Group(_Message):
    """Declare a communicator's circuits: the ranks that use it and, per device, input -> output."""

    op: Literal["group"]
    job: str
    key: str = Field(min_length=1)
    phase: str = "other"
    members: list[int] = Field(min_length=1)
    circuits: dict[str, dict[int, int]] = {}

    @field_validator("members")
    @classmethod
    def _members(cls, v):
        if len(set(v)) != len(v):
            raise ValueError("members lists a rank twice")
        return sorted(v)


class Acquire(_Message):
    """Block until the group's circuits are lit and reserved for it (``prepare``: do not block).

    With ``lease``, the grant is a lease (when every member asked for one): the rank keeps the
    circuits across ops, with no further request, until the controller revokes it.
    """

    op: Literal["acquire", "prepare"]
    job: str
    rank: int
    key: str
    lease: bool = False


class Release(_Message):
    """The rank's traffic on the group is done; its ports may be reconfigured."""

    op: Literal["release"]
    job: str
    rank: int
    key: str


class Ack(_Message):
    """The answer to a :class:`Revoke`: the rank starts no new op under the lease.

    ``ops`` counts the ops the rank started under the lease; with ``inside`` the last of them is
    still running and the rank sends ``release`` when it completes. A member that ran fewer ops than
    another (a receiver behind its sender) runs the rest before the ports are freed: its next
    ``acquire`` is granted at once with ``until``.
    """

    op: Literal["ack"]
    job: str
    rank: int
    key: str
    lease: int = Field(ge=1)
    ops: int = Field(ge=0)
    inside: bool = False


class Revoke(BaseModel):
    """Pushed by the controller (no ``id``) to each holder of a lease that another group needs."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["revoke"]
    job: str
    rank: int
    key: str
    lease: int = Field(ge=1)


class Bye(_Message):
    """A rank leaves (its ports are freed), or with no rank the whole job ends; a job whose last rank
    left is gone, with its groups."""

    op: Literal["bye"]
    job: str
    rank: int | None = None


Request = Annotated[Hello | Group | Acquire | Release | Ack | Bye, Field(discriminator="op")]
_REQUEST = TypeAdapter(Request)
_BY_OP = {"hello": Hello, "group": Group, "acquire": Acquire, "prepare": Acquire, "release": Release, "ack": Ack,
          "bye": Bye}


def parse_request(line: bytes | str) -> Hello | Group | Acquire | Release | Ack | Bye:
    """One request line -> its model; a bad line raises ScenarioError naming the field."""
    try:
        data = json.loads(line)
    except ValueError as e:
        raise ScenarioError(f"not JSON: {e}", field="message", fix="send one JSON object per line") from None
    if not isinstance(data, dict):
        raise ScenarioError("a request must be a JSON object", field="message", fix='e.g. {"op": "hello", ...}')
    try:
        model = _BY_OP.get(data.get("op"))  # the hot path: straight to the op's model
        return model.model_validate(data) if model is not None else _REQUEST.validate_python(data)
    except ValidationError as e:
        raise first_error(e, source="message", hint="see docs/controller.md") from None


def parse_push(data: dict) -> Revoke:
    """A message the controller pushed (already decoded) -> its model; ScenarioError naming the field."""
    try:
        return Revoke.model_validate(data)
    except ValidationError as e:
        raise first_error(e, source="push", hint="see docs/controller.md") from None


def encode(reply: dict) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


def error_reply(request_id: int, error: LightrailError) -> dict:
    return {"id": request_id, "ok": False,
            "error": {"type": type(error).__name__, "message": error.message, "field": error.field, "fix": error.fix}}
