"""The rank <-> controller protocol: one JSON object per line over TCP, validated here.

Every request carries an ``id`` (echoed in its reply) and an ``op``; replies are
``{"id", "ok": true, ...}`` or ``{"id", "ok": false, "error": {"message", "field", "fix"}}``.
The controller also pushes messages unasked (no ``id``): :class:`Revoke` to each holder of a lease it
takes back (the rank answers with :class:`Ack`), and :class:`Failover`, :class:`Dead`, :class:`PortFailed`
to the connected ranks of a job that lost a rank or a port. A holder done with a group may give its lease
back before any revoke (:class:`Yield`), if the controller's hello reply says ``yields``.
docs/controller.md is the full description; the models below are its source of truth.

Hostile lines are refused before they can cost anything: nesting deeper than ``max_depth`` is found by
counting brackets (outside strings) before ``json.loads``, integers are checked against int64, and an ``op``
that is not a string is an error naming ``op`` (each was a dropped connection in issue 17).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from lightrail.errors import LightrailError, ScenarioError
from lightrail.validation import first_error

__all__ = ["Hello", "Heartbeat", "Group", "Acquire", "Release", "Ack", "Yield", "Hold", "Bye", "Revoke", "Failover",
           "Dead", "PortFailed", "Request", "parse_request", "parse_push", "encode", "error_reply", "request_id",
           "INT64", "MAX_DEPTH", "Fast", "fast_request", "encode_ok"]

INT64 = (-(1 << 63), (1 << 63) - 1)  # what a rank's ids, ranks and ports may be (SQLite's INTEGER)
MAX_DEPTH = 64  # JSON nesting levels a request may have (ours have 3)
MAX_NAME = 256
"""Characters in a name a job stores (job, group key, phase): bounded, so the controller's memory and ``GET /jobs``
are too (issue 31: 400 group keys of 1 MB took 370 MB of RSS and a 400 MB reply)."""
OP_NO = Field(default=None, ge=0, le=INT64[1])  # acquire's and hold's op number; absent (None): an older client


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int = 0


class Hello(_Message):
    """A rank joins its job and claims its NIC's port on each rail device (input and output of that index)."""

    op: Literal["hello"]
    job: str = Field(min_length=1, max_length=MAX_NAME)
    rank: int = Field(ge=0)
    world: int = Field(ge=1)
    ports: dict[str, int]
    token: str | None = None  # the job's secret from POST /jobs; the server refuses a hello without it
    spare: bool = False  # an idle spare: rank = world + i for the job's i-th spare

    @field_validator("ports")
    @classmethod
    def _ports(cls, v):
        bad = {d: p for d, p in v.items() if p < 0}
        if bad:
            raise ValueError(f"port {next(iter(bad.values()))} on {next(iter(bad))} is negative")
        return v


class Heartbeat(_Message):
    """A sign of life (any request is one); answered with the controller's clock, allowed before hello."""

    op: Literal["heartbeat"]


class Group(_Message):
    """Declare a communicator's circuits: the ranks that use it and, per device, input -> output."""

    op: Literal["group"]
    job: str
    key: str = Field(min_length=1, max_length=MAX_NAME)
    phase: str = Field("other", max_length=MAX_NAME)
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
    circuits across ops, with no further request, until the controller revokes it. ``rejoin``: sent
    before a controller restart and re-sent after it; it joins a round restored by ``hold`` at once, if that
    round is in op ``op_no`` (the n-th op this rank started on ``key``; members run the same ops in the same
    order, so equal numbers are the same op, and an acquire already for the next op waits for its round).
    A rank that gave its lease back with :class:`Yield` while the lease still stands, not revoked, is a holder
    again at once: the reply carries ``lease`` and ``ops`` (the ops it ran under the lease before the yield).
    """

    op: Literal["acquire", "prepare"]
    job: str
    rank: int
    key: str
    lease: bool = False
    rejoin: bool = False
    op_no: int | None = OP_NO


class Release(_Message):
    """The rank's traffic on the group is done; its ports may be reconfigured."""

    op: Literal["release"]
    job: str
    rank: int
    key: str


class _LeaseCount(_Message):
    """A holder's account of a lease: the ops it started under it (:class:`Ack`, :class:`Yield`)."""

    job: str
    rank: int
    key: str
    lease: int = Field(ge=1)
    ops: int = Field(ge=0)


class Ack(_LeaseCount):
    """The answer to a :class:`Revoke`: the rank starts no new op under the lease.

    ``ops`` counts the ops the rank started under the lease; with ``inside`` the last of them is
    still running and the rank sends ``release`` when it completes. A member that ran fewer ops than
    another (a receiver behind its sender) runs the rest before the ports are freed: its next
    ``acquire`` is granted at once with ``until``.
    """

    op: Literal["ack"]
    inside: bool = False


class Yield(_LeaseCount):
    """A holder gives its lease back before any revoke: it is done with the group for now (provisioned mode: it
    announced another group next) and inside no op on it. ``ops`` counts the ops it started under the lease, as
    in :class:`Ack`: the controller takes a yield as the ack of a revoke not yet sent (the lease ends once no
    holder is left and every member ran as many). Sent only to a controller whose hello reply carries ``yields``
    (an older one would refuse it and keep the rank a holder); a stale yield (another lease, or already given
    back) is answered ``stale`` and changes nothing."""

    op: Literal["yield"]


class Revoke(BaseModel):
    """Pushed by the controller (no ``id``) to each holder of a lease that another group needs."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["revoke"]
    job: str
    rank: int
    key: str
    lease: int = Field(ge=1)


class Hold(_Message):
    """After a reconnect: the rank is inside an op on ``key`` (granted before the controller restarted),
    its ``op_no``-th on it (see :class:`Acquire`). With ``first``, it is not inside yet: the hold stands in
    for a lease acquire and only joins a round restored by hold for that same op (a peer is inside it)."""

    op: Literal["hold"]
    job: str
    rank: int
    key: str
    op_no: int | None = OP_NO
    first: bool = False


class Failover(BaseModel):
    """Pushed to every connected rank of a job whose rank ``rank`` failed: spare ``spare`` takes its place."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["failover"]
    job: str
    rank: int
    spare: int
    epoch: int
    ports: dict[str, int]


class Dead(BaseModel):
    """Pushed to every connected rank of a job whose rank failed with no spare left."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["dead"]
    job: str
    rank: int
    reason: str = ""


class PortFailed(BaseModel):
    """Pushed to the connected ranks of the job owning a port the operator marked dead."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["port_failed"]
    job: str
    device: str
    port: int


class Bye(_Message):
    """A rank leaves (its ports are freed), or with no rank the whole job ends; a job whose last rank
    left is gone, with its groups."""

    op: Literal["bye"]
    job: str
    rank: int | None = None


Request = Annotated[Hello | Heartbeat | Group | Acquire | Release | Ack | Yield | Hold | Bye,
                    Field(discriminator="op")]
_REQUEST = TypeAdapter(Request)
_BY_OP = {"hello": Hello, "heartbeat": Heartbeat, "group": Group, "acquire": Acquire, "prepare": Acquire,
          "release": Release, "ack": Ack, "yield": Yield, "hold": Hold, "bye": Bye}
_PUSH = {"revoke": Revoke, "failover": Failover, "dead": Dead, "port_failed": PortFailed}
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_LONG_INT = re.compile(rb"\d{19,}")


def _depth(line: bytes) -> int:
    """Deepest bracket nesting of ``line`` outside its strings (no parsing)."""
    depth = deepest = 0
    for c in _STRING.sub(b"", line):
        if c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
    return deepest


def _int64(text: str) -> int:
    value = int(text) if len(text) <= 20 else None  # never convert a 5,000-digit string (CPython refuses)
    if value is None or not INT64[0] <= value <= INT64[1]:
        raise ScenarioError(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is outside int64",
                            field="message", fix="ids, ranks and ports are 64-bit integers")
    return value


def parse_request(line: bytes | str, *, max_depth: int = MAX_DEPTH) -> Request:
    """One request line -> its model; a bad line raises ScenarioError naming the field (never another
    exception: a deep, huge or odd line costs one error reply, not the connection)."""
    raw = line.encode() if isinstance(line, str) else bytes(line)
    if raw.count(b"[") + raw.count(b"{") > max_depth and _depth(raw) > max_depth:
        raise ScenarioError(f"JSON nested deeper than {max_depth} levels", field="message",
                            fix="send one flat JSON object per line (see docs/controller.md)")
    try:
        data = json.loads(raw, parse_int=_int64) if _LONG_INT.search(raw) else json.loads(raw)
    except (ValueError, RecursionError) as e:
        if isinstance(e, ScenarioError):
            raise
        raise ScenarioError(f"not JSON: {e}", field="message", fix="send one JSON object per line") from None
    if not isinstance(data, dict):
        raise ScenarioError("a request must be a JSON object", field="message", fix='e.g. {"op": "hello", ...}')
    op = data.get("op")
    if not isinstance(op, str):
        raise ScenarioError(f"op must be a string, not {type(op).__name__}", field="op",
                            fix=f"one of: {', '.join(sorted(_BY_OP))}")
    try:
        model = _BY_OP.get(op)  # the hot path: straight to the op's model
        return model.model_validate(data) if model is not None else _REQUEST.validate_python(data)
    except ValidationError as e:
        raise first_error(e, source="message", hint="see docs/controller.md") from None


class Fast:
    """A hot-path request (heartbeat, acquire, prepare, release) checked field by field, without pydantic: it
    holds exactly the values its model would (the same defaults), with the attributes the server and the
    core read. :func:`fast_request` returns one only for a line the model takes as it is."""

    __slots__ = ("id", "op", "job", "rank", "key", "lease", "rejoin", "op_no")

    def __init__(self, id_: int, op: str, job: str | None = None, rank: int | None = None, key: str | None = None,
                 lease: bool = False, rejoin: bool = False, op_no: int | None = None):
        self.id, self.op, self.job, self.rank, self.key, self.lease = id_, op, job, rank, key, lease
        self.rejoin, self.op_no = rejoin, op_no


# op -> (required fields, allowed fields) of the models on the fast path (kept equal to the models by a test)
_FAST = {"heartbeat": (frozenset({"op"}), frozenset({"id", "op"})),
         "acquire": (frozenset({"op", "job", "rank", "key"}),
                     frozenset({"id", "op", "job", "rank", "key", "lease", "rejoin", "op_no"})),
         "release": (frozenset({"op", "job", "rank", "key"}), frozenset({"id", "op", "job", "rank", "key"}))}
_FAST["prepare"] = _FAST["acquire"]
_scan = json.JSONDecoder().scan_once  # the C scanner: one value at an index, no whitespace handling


def _plain_int(v: object) -> bool:
    return type(v) is int and INT64[0] <= v <= INT64[1]


# The acquire, prepare and release lines ControllerClient writes (compact json.dumps, fields in its order, ASCII
# strings without escapes, non-negative ints of at most 18 digits: within int64), matched whole. Such a line decodes
# to exactly the groups (no escape, no duplicate field, no coercion), so it needs no JSON scan: ~1.3 µs, not ~2.7.
_CANONICAL = re.compile(rb'\{"id":(0|[1-9][0-9]{0,17}),"op":"(acquire|prepare|release)",'
                        rb'"job":"([\x20\x21\x23-\x5b\x5d-\x7e]*)","rank":(0|[1-9][0-9]{0,17}),'
                        rb'"key":"([\x20\x21\x23-\x5b\x5d-\x7e]*)"(,"lease":true)?(?:,"op_no":(0|[1-9][0-9]{0,17}))?\}')
_OPS = {b"acquire": "acquire", b"prepare": "prepare", b"release": "release"}


def fast_request(line: bytes) -> Fast | None:
    """The hot ops in ~1-2 µs instead of ~10: the client's own lines by :data:`_CANONICAL`, else a flat object
    (one ``{``, no ``[``: depth 1, whatever the strings hold) whose fields have exactly the model's types (no
    coercion, ints within int64), else None and the caller runs :func:`parse_request`, whose answer (a model or
    the error) is then the same as ever. Every check here only narrows what the models accept, so a line taken
    here is one the models take with the same values."""
    m = _CANONICAL.fullmatch(line)
    if m is not None:
        rid, op, job, rank, key, lease, op_no = m.groups()
        if op != b"release" or (lease is None and op_no is None):  # a release has neither: the models name them
            return Fast(int(rid), _OPS[op], job.decode(), int(rank), key.decode(), lease is not None, False,
                        None if op_no is None else int(op_no))
    if line.count(b"{") != 1 or b"[" in line:
        return None
    try:
        text = line.decode()
        data, end = _scan(text, 0)
    except (ValueError, StopIteration):  # not UTF-8, not JSON, an int too long to convert: the slow path names it
        return None
    if end != len(text) or type(data) is not dict:  # anything around the object (even spaces): the slow path
        return None
    op = data.get("op")
    spec = _FAST.get(op) if type(op) is str else None
    if spec is None or not (spec[0] <= data.keys() <= spec[1]):
        return None
    rid = data.get("id", 0)
    if not _plain_int(rid):
        return None
    if op == "heartbeat":
        return Fast(rid, op)
    job, rank, key, lease = data["job"], data["rank"], data["key"], data.get("lease", False)
    rejoin, op_no = data.get("rejoin", False), data.get("op_no")
    if type(job) is not str or type(key) is not str or not _plain_int(rank) or type(lease) is not bool \
            or type(rejoin) is not bool or (op_no is not None and not (_plain_int(op_no) and op_no >= 0)):
        return None
    return Fast(rid, op, job, rank, key, lease, rejoin, op_no)


def request_id(line: bytes) -> int:
    """The ``id`` of a line that failed to parse, if it has a plain one (so its error reply can echo it)."""
    m = re.search(rb'"id"\s*:\s*(-?\d{1,18})\b', line[:4096])
    return int(m.group(1)) if m else 0


def parse_push(data: dict) -> Revoke | Failover | Dead | PortFailed:
    """A message the controller pushed (already decoded) -> its model; ScenarioError naming the field."""
    model = _PUSH.get(data.get("op")) if isinstance(data.get("op"), str) else None
    try:
        return (model or Revoke).model_validate(data)
    except ValidationError as e:
        raise first_error(e, source="push", hint="see docs/controller.md") from None


def encode(reply: dict) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


def encode_ok(request_id: int, reply: dict | None = None) -> bytes:
    """``encode({"id": request_id, "ok": True, **reply})``, the common replies from byte templates."""
    if not reply:
        return b'{"id":%d,"ok":true}\n' % request_id
    if len(reply) == 1:
        if reply.get("granted") is True:
            return b'{"id":%d,"ok":true,"granted":true}\n' % request_id
        t = reply.get("t")
        if type(t) is float and t - t == 0.0:  # finite: repr is what json.dumps writes
            return b'{"id":%d,"ok":true,"t":%s}\n' % (request_id, repr(t).encode())
    return encode({"id": request_id, "ok": True, **reply})


def error_reply(request_id: int, error: LightrailError) -> dict:
    return {"id": request_id, "ok": False,
            "error": {"type": type(error).__name__, "message": error.message, "field": error.field, "fix": error.fix}}
