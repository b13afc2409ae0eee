"""Blocking client of the controller's rank protocol (what each rank process uses).

One TCP connection per rank, Nagle off. A background thread reads every line: it hands each reply
to the request that waits for it (by ``id``, so requests may be pipelined: ``send`` then ``wait``)
and answers the controller's pushed ``revoke`` messages itself, while the rank computes or waits
in another request.

Leases (see docs/controller.md): ``acquire(key, lease=True)`` may return a lease, which the client
records before it wakes the caller. Around every op the caller asks ``enter(key)``: True means the
op runs under the lease, with no request; ``leave(key)`` after it. A revoke for a lease with no op
in flight is acknowledged at once (the next op re-acquires); one inside an op is acknowledged as
such, and ``leave`` sends the ``release`` when that op completes. Once ``bye`` is sent, revokes are
no longer answered: the bye gives every lease back (see ``_pushed``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lightrail.errors import InfeasibleError, LightrailError, ScenarioError

__all__ = ["ControllerClient", "ControllerError", "Lease"]


class ControllerError(LightrailError):
    """The controller refused a request (its message, field and fix are passed through)."""


@dataclass
class Lease:
    """This rank's view of a lease on one group."""

    id: int
    ops: int = 0  # ops started under it
    in_op: bool = False  # the last of them is still running
    revoked: bool = False  # answered a revoke: no new op under it, except up to ``until``
    until: int | None = None  # a member behind in a revoked lease may start ops up to this count


class ControllerClient:
    def __init__(self, host: str, port: int, *, job: str, rank: int, timeout: float | None = 300.0,
                 on_revoke: Callable[[str, bool], None] | None = None, token: str | None = None):
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ScenarioError(f"cannot reach the controller at {host}:{port} ({e})", field="controller",
                                fix="start it with `lightrail controller serve` and pass its address") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(None)  # the reader blocks; waits time out on their own
        self.reader = self.sock.makefile("rb")
        self.job, self.rank, self.timeout = job, rank, timeout
        self.token = token  # the job's secret, from the operator's POST /jobs (sent in hello)
        self.on_revoke = on_revoke  # (key, inside) after each revoke answered; called on the reader thread
        self.leases: dict[str, Lease] = {}
        self.requests = 0  # requests sent (hello and bye excluded)
        self.round_trips: list[float] = []  # seconds, requests answered at once (release, prepare, ack, group)
        self._next = 0
        self._lock = threading.Lock()  # sending, ids, leases
        self._cond = threading.Condition(threading.Lock())
        self._replies: dict[int, dict] = {}
        self._pending: dict[int, tuple[float, str, str | None]] = {}  # id -> (sent at, op, key)
        self._detached: set[int] = set()  # replies nobody waits for (acks, fire-and-forget prepares)
        self._failed: list[dict] = []  # errors of detached requests, raised at the next wait
        self._closed = False
        self._leaving = False  # bye sent (under _lock): no ack may follow it
        self._thread = threading.Thread(target=self._read, name=f"lightrail-controller-{rank}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(5)
        self.reader.close()
        self.sock.close()

    # -- the wire -------------------------------------------------------------------------------------
    def send(self, op: str, *, detached: bool = False, **fields) -> int:
        with self._lock:
            return self._send_locked(op, detached=detached, **fields)

    def _send_locked(self, op: str, *, detached: bool = False, **fields) -> int:
        self._next += 1
        request_id = self._next
        with self._cond:
            self._pending[request_id] = (time.perf_counter(), op, fields.get("key"))
            if detached:
                self._detached.add(request_id)
        if op not in ("hello", "bye"):
            self.requests += 1
        message = {"id": request_id, "op": op, **fields}
        self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        return request_id

    def wait(self, request_id: int) -> dict:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self._cond:
            while request_id not in self._replies:
                if self._closed:
                    raise InfeasibleError("the controller closed the connection", field="controller",
                                          fix="check the controller's log; restart it and the job")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise InfeasibleError(f"no reply from the controller within {self.timeout} s", field="controller",
                                          fix="check the controller's log")
                self._cond.wait(left)
            reply = self._replies.pop(request_id)
            failed, self._failed = self._failed, []
        for bad in (reply, *failed):
            if not bad.get("ok"):
                e = bad.get("error", {})
                raise ControllerError(e.get("message", "refused"), field=e.get("field"), fix=e.get("fix"))
        return reply

    def call(self, op: str, **fields) -> dict:
        return self.wait(self.send(op, **fields))

    def _read(self) -> None:
        try:
            while line := self.reader.readline():
                message = json.loads(line)
                if "id" not in message:
                    self._pushed(message)
                    continue
                now = time.perf_counter()
                with self._cond:
                    sent, op, key = self._pending.pop(message["id"], (now, "", None))
                if op == "acquire" and message.get("ok") and "lease" in message:
                    with self._lock:  # recorded before the caller wakes (a revoke may follow at once)
                        # the op the caller is about to run is the lease's next (its first, or the next it is behind)
                        self.leases[key] = Lease(message["lease"], ops=message.get("ops", 0) + 1, in_op=True,
                                                 revoked="until" in message, until=message.get("until"))
                with self._cond:
                    if op and op != "acquire":
                        self.round_trips.append(now - sent)
                    if message["id"] in self._detached:
                        self._detached.discard(message["id"])
                        if not message.get("ok"):
                            self._failed.append(message)
                    else:
                        self._replies[message["id"]] = message
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _pushed(self, message: dict) -> None:
        """A revoke (the only message the controller pushes): answer it now, or once the op completes."""
        from lightrail.runtime.controller.protocol import parse_push

        revoke = parse_push(message)
        with self._lock:
            if self._leaving:
                # The controller pushed this before it read our bye, which gives back every lease (the
                # rank's disconnect drops it from their holders). An ack sent now would reach the
                # controller after the bye, where the group may be gone: the job's last bye deletes its
                # groups, and the ack would be refused with "unknown group" (raised at the bye's wait).
                return
            lease = self.leases.get(revoke.key)
            if lease is None or lease.id != revoke.lease or lease.revoked:
                return  # already given back
            lease.revoked = True
            inside = lease.in_op
            if not inside:
                del self.leases[revoke.key]
            self._send_locked("ack", detached=True, job=self.job, rank=self.rank, key=revoke.key, lease=revoke.lease,
                              ops=lease.ops, inside=inside)
        if self.on_revoke is not None:
            self.on_revoke(revoke.key, inside)

    # -- leases ---------------------------------------------------------------------------------------
    def enter(self, key: str) -> bool:
        """Start an op on ``key`` under this rank's lease if it still may (True: no request needed)."""
        with self._lock:
            lease = self.leases.get(key)
            if lease is None or lease.in_op or (lease.revoked and (lease.until is None or lease.ops >= lease.until)):
                return False
            lease.ops += 1
            lease.in_op = True
            return True

    def leave(self, key: str) -> bool:
        """The op on ``key`` that ran under the lease completed; returns True if that ended the lease
        (it had been revoked: the release is sent, not waited for)."""
        with self._lock:
            lease = self.leases.get(key)
            if lease is None or not lease.in_op:
                return False
            lease.in_op = False
            if lease.revoked and (lease.until is None or lease.ops >= lease.until):
                del self.leases[key]
                self._send_locked("release", detached=True, job=self.job, rank=self.rank, key=key)
                return True
            return False

    def holds(self, key: str) -> bool:
        """True if an op on ``key`` would run under a lease now."""
        with self._lock:
            lease = self.leases.get(key)
            return lease is not None and not lease.revoked

    # -- the protocol's operations for this rank -------------------------------------------------------
    def hello(self, world: int, ports: dict[str, int], *, spare: bool = False) -> dict:
        extra = {"token": self.token} if self.token is not None else {}
        if spare:
            extra["spare"] = True
        return self.call("hello", job=self.job, rank=self.rank, world=world, ports=ports, **extra)

    def heartbeat(self) -> dict:
        return self.call("heartbeat")

    def declare(self, key: str, members, circuits: dict[str, dict[int, int]], phase: str = "other") -> dict:
        circuits = {d: {str(i): int(o) for i, o in c.items()} for d, c in circuits.items()}
        return self.call("group", job=self.job, key=key, phase=phase, members=[int(m) for m in members],
                         circuits=circuits)

    def acquire(self, key: str, *, lease: bool = False) -> dict:
        """Block until granted. With ``lease``, a reply carrying ``lease`` means the op about to run is
        the lease's first (``enter`` is not needed for it; ``leave`` is)."""
        if lease:
            return self.call("acquire", job=self.job, rank=self.rank, key=key, lease=True)
        return self.call("acquire", job=self.job, rank=self.rank, key=key)

    def prepare(self, key: str, *, wait: bool = True) -> dict | None:
        if not wait:
            self.send("prepare", detached=True, job=self.job, rank=self.rank, key=key)
            return None
        return self.call("prepare", job=self.job, rank=self.rank, key=key)

    def release(self, key: str, *, then_prepare: str | None = None) -> None:
        first = self.send("release", job=self.job, rank=self.rank, key=key)
        second = self.send("prepare", job=self.job, rank=self.rank, key=then_prepare) if then_prepare else None
        self.wait(first)
        if second is not None:
            self.wait(second)

    def bye(self, *, whole_job: bool = False) -> dict:
        """Leave (free this rank's ports and its leases); ``whole_job`` ends the job for every rank.

        The reader thread sends acks on its own, so the bye and the end of acks are one step under the
        send lock: every ack goes out before the bye (the controller handles it while the group still
        exists) or not at all (see ``_pushed``)."""
        fields = {"job": self.job} if whole_job else {"job": self.job, "rank": self.rank}
        with self._lock:
            self._leaving = True
            self.leases.clear()  # the bye ends them
            request_id = self._send_locked("bye", **fields)
        return self.wait(request_id)
