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
no longer answered: the bye gives every lease back (see ``_pushed``). ``yield_lease(key)`` gives a lease with no
op in flight back unasked (``yield``, with the ops run under it: the ack of a revoke not yet sent), if the
controller's hello reply said it takes yields; the next op on the group acquires again.

The connection itself (the wire, the reader thread, heartbeats, reconnection after a controller restart or
pause, and what a reconnect restores) is :class:`~lightrail.runtime.controller.link.Link`, in ``link.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.link import BACKOFF, RETRY_S, STALL_TIMEOUT_S, ControllerError, Lease, Link, _Request

__all__ = ["BACKOFF", "RETRY_S", "STALL_TIMEOUT_S", "ControllerClient", "ControllerError", "Lease"]


class ControllerClient(Link):
    def __init__(self, host: str, port: int, *, job: str, rank: int, timeout: float | None = 300.0,
                 on_revoke: Callable[[str, bool], None] | None = None, token: str | None = None,
                 heartbeat_timeout: float | None = 2.0, reconnect_timeout: float = 30.0,
                 on_failover: Callable[[dict], None] | None = None, on_dead: Callable[[dict], None] | None = None,
                 stall_timeout: float = STALL_TIMEOUT_S):
        if heartbeat_timeout is not None and not heartbeat_timeout > 0:
            raise ScenarioError(f"heartbeat_timeout={heartbeat_timeout!r} must be positive (or None: off)",
                                field="heartbeat_timeout", fix="e.g. 2.0")
        if not reconnect_timeout >= 0:
            raise ScenarioError(f"reconnect_timeout={reconnect_timeout!r} must be >= 0", field="reconnect_timeout")
        if not stall_timeout >= 0:
            raise ScenarioError(f"stall_timeout={stall_timeout!r} must be >= 0", field="stall_timeout",
                                fix=f"e.g. {STALL_TIMEOUT_S:g} (seconds a stopped controller is waited for)")
        self.host, self.port = host, port
        self.job, self.rank, self.timeout = job, rank, timeout
        self.token = token  # the job's secret, from the operator's POST /jobs (sent in hello)
        self.heartbeat_timeout, self.reconnect_timeout = heartbeat_timeout, reconnect_timeout
        self.stall_timeout = stall_timeout  # a controller that accepts but answers nothing: waited for this long
        self.on_revoke = on_revoke  # (key, inside) after each revoke answered; called on the reader thread
        self.on_failover = on_failover  # the controller's ``failover`` push (a rank's identity moved to a spare)
        self.on_dead = on_dead  # its ``dead`` push (a rank failed, no spare left) and ``port_failed``
        self.leases: dict[str, Lease] = {}
        self.requests = 0  # requests sent (hello, bye, heartbeats and a reconnect's own aside)
        self.round_trips: list[float] = []  # seconds, requests answered at once (release, prepare, ack, group)
        self.reconnects = 0  # connections re-established after a loss
        self.reconnect_s: list[float] = []  # per reconnect, loss to the hello answered
        self.stalls = 0  # reconnects that found the controller stalled (accepting, silent), each logged once
        self.restore_errors: list[dict] = []  # re-declarations and holds a reconnected controller refused
        self.pushes: list[dict] = []  # failover / dead / port_failed messages, in order
        self._next = 0
        self._lock = threading.Lock()  # sending, ids, leases, the connection
        self._cond = threading.Condition(threading.Lock())
        self._replies: dict[int, dict] = {}  # logical id -> reply
        self._pending: dict[int, _Request] = {}  # wire id -> request
        self._failed: list[dict] = []  # errors of detached requests, raised at the next wait
        self._hello: dict | None = None  # the last hello's fields, said again on reconnect
        self._declared: dict[str, dict] = {}  # key -> the group's fields, declared again on reconnect
        self._inside: set[str] = set()  # groups granted per op, not yet released (held again on reconnect)
        self._resync: set[str] = set()  # groups whose lease acquires are holds, since the last reconnect
        self._op_no: dict[str, int] = {}  # key -> ops this rank started on it (``op_no`` of acquire and hold)
        self._news: dict | None = None  # the error of an interrupt (a failover) not yet followed by forget_holds
        self._closed = False
        self._dead: InfeasibleError | None = None
        self._done = False  # the bye was answered: a drop after it is the end, not a loss
        self._yields = False  # the controller takes ``yield`` (its hello reply says ``yields``)
        self._leaving = False  # bye sent (under _lock): no ack may follow it
        self._unknown = False  # a reconnect's hello was refused: the controller knows no job with our token
        self._up = False  # the current connection may be written to
        self._heard = time.monotonic()  # the last line read
        self._beat_out: float | None = None  # send time of the heartbeat in flight
        self._stop = threading.Event()
        try:
            self.sock = self._connect(timeout)
        except OSError as e:
            raise ScenarioError(f"cannot reach the controller at {host}:{port} ({e})", field="controller",
                                fix="start it with `lightrail controller serve` and pass its address") from None
        self.reader = self.sock.makefile("rb")
        self._up = True
        self._thread = threading.Thread(target=self._read, name=f"lightrail-controller-{rank}", daemon=True)
        self._thread.start()
        self._beater = None
        if heartbeat_timeout is not None:
            self._beater = threading.Thread(target=self._beat, name=f"lightrail-heartbeat-{rank}", daemon=True)
            self._beater.start()

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        with self._lock:
            self._up = False
            sock = self.sock
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
        if self._beater is not None and threading.current_thread() is not self._beater:
            self._beater.join(5)
        with self._cond:
            self._cond.notify_all()
        self.reader.close()
        self.sock.close()

    @property
    def connected(self) -> bool:
        """True while the connection is up (False while reconnecting, after close or giving up)."""
        return self._up and self._dead is None and not self._closed

    # -- the wire -------------------------------------------------------------------------------------
    def send(self, op: str, *, detached: bool = False, **fields) -> int:
        with self._lock:
            return self._send_locked(op, detached=detached, **fields)

    def wait(self, request_id: int) -> dict:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        with self._cond:
            while request_id not in self._replies:
                if self._dead is not None:
                    raise self._dead
                if self._closed:
                    raise InfeasibleError("the controller connection is closed", field="controller",
                                          fix="check the controller's log; restart it and the job")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    asked = next((f" to {r.op} {r.fields.get('key', '')}".rstrip() for r in self._pending.values()
                                  if r.logical == request_id), "")
                    raise InfeasibleError(f"no reply from the controller within {self.timeout} s{asked}",
                                          field="controller", fix="check the controller's log")
                self._cond.wait(left)
            reply = self._replies.pop(request_id)
            failed, self._failed = self._failed, []
        for bad in (reply, *failed):
            if not bad.get("ok"):
                raise ControllerError.of(bad.get("error", {}))
        return reply

    def call(self, op: str, **fields) -> dict:
        return self.wait(self.send(op, **fields))

    def _pushed(self, message: dict) -> None:
        """A revoke: answer it now, or once the op completes; failover, dead, port_failed: the callbacks."""
        from lightrail.runtime.controller.protocol import parse_push

        push = parse_push(message)
        if push.op != "revoke":
            self.pushes.append(message)
            callback = self.on_failover if push.op == "failover" else self.on_dead
            if callback is not None:
                callback(message)
            return
        with self._lock:
            if self._leaving:
                # The controller pushed this before it read our bye, which gives back every lease (the
                # rank's disconnect drops it from their holders). An ack sent now would reach the
                # controller after the bye, where the group may be gone: the job's last bye deletes its
                # groups, and the ack would be refused with "unknown group" (raised at the bye's wait).
                return
            lease = self.leases.get(push.key)
            if lease is None or lease.id != push.lease or lease.revoked:
                return  # already given back
            lease.revoked = True
            inside = lease.in_op
            if not inside:
                del self.leases[push.key]
            self._send_locked("ack", detached=True, job=self.job, rank=self.rank, key=push.key, lease=push.lease,
                              ops=lease.ops, inside=inside)
        if self.on_revoke is not None:
            self.on_revoke(push.key, inside)

    def interrupt(self, error: dict) -> None:
        """Answer every acquire and prepare a caller waits on with ``error`` (a reply's ``error`` object): news
        from a push (a failover) makes them moot, and a request the controller took after resetting the job's
        groups would wait for peers that are rebuilding. A caller waiting on a hold (after a reconnect) is
        answered too, and every acquire and hold already on the wire is followed by a ``release`` of its group:
        one the controller takes after the reset would otherwise make this rank a holder (or waiter) of the
        rebuilt job's first round, which it never releases, so its peer's acquire waits for ever. Until
        :meth:`forget_holds` (the rank has taken the news in), a new acquire fails at once with the same error: one
        sent by a caller that checked for news just before the push arrived would be that stale request again."""
        with self._lock:
            self._news = error
            sent: set[str] = set()
            with self._cond:
                for wire, request in list(self._pending.items()):
                    if request.op not in ("acquire", "prepare", "hold") or request.detached:
                        continue
                    if wire > 0 and request.op in ("acquire", "hold"):
                        sent.add(request.fields["key"])
                    if request.op == "hold":  # its reply, a grant or a refusal, must not send the acquire
                        request.stale = True
                        if request.then is not None and not request.retry:  # the caller waits on it alone
                            self._replies[request.logical] = {"id": wire, "ok": False, "error": error}
                    elif not request.internal:
                        del self._pending[wire]
                        self._replies[request.logical] = {"id": wire, "ok": False, "error": error}
                self._cond.notify_all()
            for key in sorted(sent) if self._dead is None else ():  # (a client that gave up sends nothing)
                self._send_locked("release", internal=True, job=self.job, rank=self.rank, key=key)

    def forget_holds(self) -> None:
        """The controller reset the job's groups (a failover: no holders, no lease): drop this rank's leases
        and per-op holds, and the errors of detached requests sent before it (stale). Op numbers start again
        (every rank, and the spare taking a rank over, counts the rebuilt job's ops from its checkpoint), and
        acquires are taken again after an :meth:`interrupt`."""
        with self._lock:
            self._news = None  # acquires are the rebuilt job's from now on
            self.leases.clear()
            self._inside.clear()
            self._resync.clear()  # the rebuilt job's first rounds are granted by this controller: acquire, not hold
            self._op_no.clear()
            with self._cond:
                self._failed.clear()

    # -- leases ---------------------------------------------------------------------------------------
    def enter(self, key: str) -> bool:
        """Start an op on ``key`` under this rank's lease if it still may (True: no request needed)."""
        with self._lock:
            lease = self.leases.get(key)
            if lease is None or lease.in_op or (lease.revoked and (lease.until is None or lease.ops >= lease.until)):
                return False
            lease.ops += 1
            lease.in_op = True
            self._op_no[key] = self._op_no.get(key, 0) + 1
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
                self._inside.discard(key)
                self._send_locked("release", detached=True, job=self.job, rank=self.rank, key=key)
                return True
            return False

    def yield_lease(self, key: str) -> bool:
        """Give this rank's lease on ``key`` back now, before any revoke (it is done with the group for now): the
        lease is dropped here and ``yield`` tells the controller the ops run under it, in one step (not waited
        for). Only a lease with no op in flight and not revoked, and only to a controller that takes yields;
        True if it was given back. The next op on ``key`` acquires again (at once while the lease stands)."""
        with self._lock:
            lease = self.leases.get(key)
            if lease is None or lease.in_op or lease.revoked or not self._yields or self._leaving:
                return False
            del self.leases[key]
            self._send_locked("yield", detached=True, job=self.job, rank=self.rank, key=key, lease=lease.id,
                              ops=lease.ops)
            return True

    def holds(self, key: str) -> bool:
        """True if an op on ``key`` would run under a lease now."""
        with self._lock:
            lease = self.leases.get(key)
            return lease is not None and not lease.revoked

    # -- the protocol's operations for this rank -------------------------------------------------------
    def hello(self, world: int, ports: dict[str, int], *, spare: bool = False) -> dict:
        """Join the job (remembered: a reconnect says it again, with ``self.rank`` as it is then)."""
        with self._lock:
            self._hello = {"world": world, "ports": dict(ports), **({"spare": True} if spare else {})}
            request_id = self._send_locked("hello", **self._hello_fields())
        reply = self.wait(request_id)
        with self._lock:
            self._yields = bool(reply.get("yields"))
        return reply

    def heartbeat(self) -> dict:
        return self.call("heartbeat")

    def declare(self, key: str, members, circuits: dict[str, dict[int, int]], phase: str = "other") -> dict:
        circuits = {d: {str(i): int(o) for i, o in c.items()} for d, c in circuits.items()}
        fields = {"job": self.job, "key": key, "phase": phase, "members": [int(m) for m in members],
                  "circuits": circuits}
        reply = self.call("group", **fields)
        with self._lock:
            self._declared[key] = fields
        return reply

    def acquire(self, key: str, *, lease: bool = False) -> dict:
        """Block until granted. With ``lease``, a reply carrying ``lease`` means the op about to run is
        the lease's first (``enter`` is not needed for it; ``leave`` is). After a reconnect, a lease acquire
        is a ``hold`` while the controller accepts one (a per-op grant: ``release`` after the op). Each call is
        this rank's next op on ``key`` (its ``op_no``)."""
        with self._lock:
            if self._news is not None:  # the job is rebuilding: an acquire now would join the rebuilt job's round
                raise ControllerError.of(self._news)
            op_no = self._op_no[key] = self._op_no.get(key, 0) + 1
            fields = {"job": self.job, "rank": self.rank, "key": key, **({"lease": True} if lease else {}),
                      "op_no": op_no}
            request_id = self._send_locked("acquire", hold_first=lease and key in self._resync, **fields)
        try:
            return self.wait(request_id)
        except ControllerError:
            with self._lock:  # refused: no op started; the caller's next acquire is for this op again
                if self._op_no.get(key) == op_no:
                    self._op_no[key] = op_no - 1
            raise

    def prepare(self, key: str, *, wait: bool = True) -> dict | None:
        if not wait:
            self.send("prepare", detached=True, job=self.job, rank=self.rank, key=key)
            return None
        return self.call("prepare", job=self.job, rank=self.rank, key=key)

    def release(self, key: str, *, then_prepare: str | None = None) -> None:
        with self._lock:
            self._inside.discard(key)
            first = self._send_locked("release", job=self.job, rank=self.rank, key=key)
            second = self._send_locked("prepare", job=self.job, rank=self.rank, key=then_prepare) \
                if then_prepare else None
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
            self._inside.clear()
            request_id = self._send_locked("bye", **fields)
        try:
            return self.wait(request_id)
        except InfeasibleError:
            # The controller refused our hello on a reconnect as it knows no job with our token: this rank is
            # registered nowhere, so it has left (its bye was taken before a restart, and the job's last rank
            # ended the job; or the operator ended it). Seen once in ~40 train-demo runs with back-to-back
            # controller kills, as an error from a rank that had finished training (issue 31).
            if self._unknown:
                return {"remaining": 0, "unknown": True}
            raise
