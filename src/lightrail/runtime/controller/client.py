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

Surviving the controller (issue 17): a heartbeat thread sends ``heartbeat`` every
``heartbeat_timeout / 4``; a connection that drops, or a heartbeat unanswered for ``heartbeat_timeout``
(a frozen controller: its socket still accepts), makes the reader thread reconnect with exponential
backoff (0.05 s doubling to 1 s) for up to ``reconnect_timeout``. A restarted controller knows the
job, its ports and lit circuits from SQLite but not the groups nor who is inside an op, so the
client tells it: ``hello`` again, ``group`` for every group it declared, ``hold`` for every group it
is inside an op of, then every request still unanswered (fresh ids; the caller waiting on the old id
gets the new reply). Leases not in use are forgotten; one in use becomes a held op, released when it
ends. The restarted controller knows no lease, and a peer may already be inside the op this rank is about
to start (its grant came before the kill; this rank's did not): an acquire would wait for a round that
peer never starts. So every re-sent acquire carries ``rejoin`` (the controller grants it at once inside a
round restored by a peer's ``hold``), and, after a reconnect, a lease acquire (one waiting, or a new one)
is sent as a ``first`` hold (granted at once, per op, only to join a round a peer restored by hold for that
same op: ``release`` after it) until a round of the restarted controller grants the group; one answered
``held: false`` (or refused) sends the acquire (and tries the hold again while it waits). Past the bound,
every wait raises one ``InfeasibleError`` naming the controller (field ``controller``), never a hang.

Op numbers: every ``acquire`` and ``hold`` carries ``op_no``, the n-th op this rank started on the key (an
``acquire`` call, or an op ``enter`` let run under a lease; a re-send keeps its number, a refused acquire gives
its number back). Members run the same ops in the same order, so the controller lets a re-sent acquire join a
restored round only if a holder is inside that same op: one whose release and next acquire were both lost in
the kill is for the next op, and joining early would deadlock the peer's own acquire for it.
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

BACKOFF = (0.05, 1.0)
"""Reconnect backoff: the first wait and the cap; it doubles in between (issue 17's protocol)."""
RETRY_S = 0.05
"""After a reconnect, a lease acquire that waits tries a hold again after this, doubling to 1 s (``_hold_first``)."""


class ControllerError(LightrailError):
    """The controller refused a request (its message, field and fix are passed through); ``kind`` is the
    error's type (``Failover``, ``RankFailed``, ``Superseded``, ``ScenarioError``...)."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None, kind: str | None = None):
        super().__init__(message, field=field, fix=fix)
        self.kind = kind

    @classmethod
    def of(cls, error: dict) -> ControllerError:
        """The error of a reply (its ``error`` object: type, message, field, fix)."""
        return cls(error.get("message", "refused"), field=error.get("field"), fix=error.get("fix"),
                   kind=error.get("type"))


@dataclass
class Lease:
    """This rank's view of a lease on one group."""

    id: int
    ops: int = 0  # ops started under it
    in_op: bool = False  # the last of them is still running
    revoked: bool = False  # answered a revoke: no new op under it, except up to ``until``
    until: int | None = None  # a member behind in a revoked lease may start ops up to this count


@dataclass
class _Request:
    """A request until its reply: the caller waits on ``logical`` whatever wire id carries it."""

    logical: int
    op: str
    fields: dict
    sent: float = 0.0
    detached: bool = False  # nobody waits: an error is raised at the next wait
    internal: bool = False  # the client's own (heartbeat, re-declarations): errors only recorded
    then: _Request | None = None  # a hold standing in for this lease acquire (after a reconnect; see acquire)
    retry: bool = False  # such a hold sent while the acquire waits
    backoff: float = 0.0  # an acquire's wait before its next such hold
    stale: bool = False  # a hold sent before a failover push: its reply is ignored (``interrupt`` released it)


class _Closer:
    """A connection's socket and its reader file: the socket closes only once its file is closed too."""

    def __init__(self, sock: socket.socket, reader):
        self.sock, self.reader = sock, reader

    def close(self) -> None:
        for part in (self.reader, self.sock):
            try:
                if part is not None:
                    part.close()
            except OSError:
                pass


class ControllerClient:
    def __init__(self, host: str, port: int, *, job: str, rank: int, timeout: float | None = 300.0,
                 on_revoke: Callable[[str, bool], None] | None = None, token: str | None = None,
                 heartbeat_timeout: float | None = 2.0, reconnect_timeout: float = 30.0,
                 on_failover: Callable[[dict], None] | None = None, on_dead: Callable[[dict], None] | None = None):
        if heartbeat_timeout is not None and not heartbeat_timeout > 0:
            raise ScenarioError(f"heartbeat_timeout={heartbeat_timeout!r} must be positive (or None: off)",
                                field="heartbeat_timeout", fix="e.g. 2.0")
        if not reconnect_timeout >= 0:
            raise ScenarioError(f"reconnect_timeout={reconnect_timeout!r} must be >= 0", field="reconnect_timeout")
        self.host, self.port = host, port
        self.job, self.rank, self.timeout = job, rank, timeout
        self.token = token  # the job's secret, from the operator's POST /jobs (sent in hello)
        self.heartbeat_timeout, self.reconnect_timeout = heartbeat_timeout, reconnect_timeout
        self.on_revoke = on_revoke  # (key, inside) after each revoke answered; called on the reader thread
        self.on_failover = on_failover  # the controller's ``failover`` push (a rank's identity moved to a spare)
        self.on_dead = on_dead  # its ``dead`` push (a rank failed, no spare left) and ``port_failed``
        self.leases: dict[str, Lease] = {}
        self.requests = 0  # requests sent (hello, bye, heartbeats and a reconnect's own aside)
        self.round_trips: list[float] = []  # seconds, requests answered at once (release, prepare, ack, group)
        self.reconnects = 0  # connections re-established after a loss
        self.reconnect_s: list[float] = []  # per reconnect, loss to the hello answered
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

    def _connect(self, timeout: float | None) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # the reader blocks; waits time out on their own
        return sock

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

    def _send_locked(self, op: str, *, detached: bool = False, internal: bool = False, hold_first: bool = False,
                      **fields) -> int:
        if self._dead is not None:
            raise self._dead
        self._next += 1
        request = _Request(self._next, op, fields, detached=detached, internal=internal)
        if op not in ("hello", "bye", "heartbeat") and not internal:
            self.requests += 1
        if self._up and hold_first:
            self._hold_first(request)
        elif self._up:  # else it waits in _pending for the reconnect, which sends it
            self._write_locked(request, request.logical)
        else:
            with self._cond:
                self._pending[-request.logical] = request  # not on the wire yet (negative: never a reply's id)
        return request.logical

    def _hold_first(self, acquire: _Request, *, retry: bool = False) -> None:
        """Send a hold in place of the lease ``acquire`` (under ``_lock``); a refusal sends the acquire and,
        while it waits, the hold again after ``RETRY_S``, doubling to 1 s (a peer's hold may light the round
        this rank must join: the hold then answers the caller, and the controller drops the acquire)."""
        fields = {k: acquire.fields[k] for k in ("job", "rank", "key", "op_no") if k in acquire.fields}
        self._write_locked(_Request(acquire.logical, "hold", {**fields, "first": True}, then=acquire, retry=retry))

    def _retry_later(self, acquire: _Request) -> None:
        acquire.backoff = min(BACKOFF[1], acquire.backoff * 2) if acquire.backoff else RETRY_S
        timer = threading.Timer(acquire.backoff, self._retry_hold, args=(acquire,))
        timer.daemon = True
        timer.start()

    def _retry_hold(self, acquire: _Request) -> None:
        with self._lock:
            if self._closed or self._dead is not None:
                return
            with self._cond:
                waiting = any(r is acquire for r in self._pending.values())
            if not waiting:
                return  # answered (or queued for a reconnect, which holds first again)
            if not self._up:
                self._retry_later(acquire)
                return
            self._hold_first(acquire, retry=True)

    def _write_locked(self, request: _Request, wire: int | None = None) -> None:
        """Put ``request`` on the current connection, with a fresh wire id unless given (under ``_lock``)."""
        if wire is None:
            self._next += 1
            wire = self._next
        request.sent = time.perf_counter()
        with self._cond:
            self._pending[wire] = request
        message = {"id": wire, "op": request.op, **request.fields}
        try:
            self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        except OSError:
            pass  # the reader sees the loss, reconnects and sends it again

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
                    raise InfeasibleError(f"no reply from the controller within {self.timeout} s", field="controller",
                                          fix="check the controller's log")
                self._cond.wait(left)
            reply = self._replies.pop(request_id)
            failed, self._failed = self._failed, []
        for bad in (reply, *failed):
            if not bad.get("ok"):
                raise ControllerError.of(bad.get("error", {}))
        return reply

    def call(self, op: str, **fields) -> dict:
        return self.wait(self.send(op, **fields))

    def _read(self) -> None:
        reader = self.reader
        while True:
            reason = self._serve(reader)
            if self._closed or self._done:
                break
            reader = self._recover(reason)
            if reader is None:
                break
        with self._cond:
            self._up = False
            self._cond.notify_all()

    def _serve(self, reader) -> str:
        """Read one connection's lines until it ends; returns why it ended."""
        try:
            while line := reader.readline():
                self._heard = time.monotonic()
                message = json.loads(line)
                if "id" not in message:
                    self._pushed(message)
                else:
                    self._answered(message)
            return "the controller closed the connection"
        except (OSError, ValueError) as e:
            return f"the connection failed ({e})"

    def _answered(self, message: dict) -> None:
        now = time.perf_counter()
        with self._cond:
            request = self._pending.pop(message["id"], None)
        if request is None or request.stale:
            return
        op, key, ok = request.op, request.fields.get("key"), message.get("ok")
        if request.then is not None:  # a hold in place of a lease acquire: granted per op, or acquire after all
            acquire = request.then
            with self._lock:
                if not ok or message.get("held") is False:  # refused (not lit), or no peer's op to join
                    if request.retry:  # the acquire still waits; try again soon
                        self._retry_later(acquire)
                    elif self._up:
                        self._write_locked(acquire)
                        self._retry_later(acquire)
                    else:
                        with self._cond:
                            self._pending[-acquire.logical] = acquire
                    return
                if request.retry:  # the hold won: the acquire it stood beside is answered by it (Superseded)
                    with self._cond:
                        wire = next((w for w, r in self._pending.items() if r is acquire), None)
                        if wire is None:
                            return  # the acquire was granted first: its reply already woke the caller
                        del self._pending[wire]
                self._inside.add(key)
            message = {**message, "granted": True, "held": True}
            op = "acquire"
        if op == "heartbeat":
            self._beat_out = None
            if request.internal:
                return
        if op == "bye" and ok:
            self._done = True
        if op == "acquire" and ok:
            with self._lock:  # recorded before the caller wakes (a revoke may follow at once)
                if not message.get("held") and not message.get("rejoined"):
                    self._resync.discard(key)  # a round of the restarted controller: acquires are acquires again
                if "lease" in message:
                    # the op the caller is about to run is the lease's next (its first, or the next it is behind)
                    self.leases[key] = Lease(message["lease"], ops=message.get("ops", 0) + 1, in_op=True,
                                             revoked="until" in message, until=message.get("until"))
                else:
                    self._inside.add(key)
        if request.internal and not ok:
            self.restore_errors.append({"op": op, "key": key, **message.get("error", {})})
        with self._cond:
            if op != "acquire" and not request.internal:
                self.round_trips.append(now - request.sent)
            if request.internal:
                pass
            elif request.detached:
                if not ok:
                    self._failed.append(message)
            else:
                self._replies[request.logical] = message
            self._cond.notify_all()

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

    # -- liveness and reconnection ----------------------------------------------------------------------
    def _beat(self) -> None:
        """Every heartbeat_timeout / 4: a heartbeat; one unanswered for heartbeat_timeout ends the connection
        (the reader then reconnects), as a dropped one would."""
        limit = self.heartbeat_timeout
        while not self._stop.wait(limit / 4):
            with self._lock:
                if not self._up or self._dead is not None:
                    continue
                now = time.monotonic()
                out = self._beat_out
                if out is not None and now - out > limit and now - self._heard > limit:
                    self._up = False
                    self._lost = f"no heartbeat reply within {limit:g} s"
                    try:  # ends the reader's wait but not the connection: a hello on a new one takes it over,
                        # so a controller that was only slow does not see this rank fail (and fail it over)
                        self.sock.shutdown(socket.SHUT_RD)
                    except OSError:
                        pass
                    continue
                if out is None:
                    self._beat_out = now
                    self._send_locked("heartbeat", internal=True)

    _lost: str | None = None
    _episode: tuple[float, float] | None = None  # after the last reconnect: the next backoff, when it was made

    def _recover(self, reason: str):
        """The connection ended without a bye: reconnect (backoff), say hello, restore this rank's view.
        Returns the new connection's reader, or None after giving up (every wait then raises)."""
        lost_at = time.monotonic()
        # A connection lost soon after it was restored keeps the backoff growing (a controller that drops every
        # connection after its hello is not hammered); the bound restarts, as a quick restart looks the same.
        stable = max(1.0, self.heartbeat_timeout or 0.0)
        flapping = self._episode is not None and lost_at - self._episode[1] < stable
        delay = self._episode[0] if flapping else BACKOFF[0]
        with self._lock:
            self._up = False
            reason, self._lost = self._lost or reason, None
            self._beat_out = None
            old = _Closer(self.sock, self.reader)  # closed once a new connection took over (or at the end)
        deadline = lost_at + self.reconnect_timeout
        cap = BACKOFF[1]
        if flapping:
            self._stop.wait(delay)
            delay = min(cap, delay * 2)
        handshake = self.heartbeat_timeout or 5.0  # a hello not answered in this long: frozen, try again
        last = reason
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock = reader = None
            try:
                sock = self._connect(max(0.05, min(handshake, left)))
                reader = sock.makefile("rb")
                reply = self._handshake(sock, reader, max(0.05, min(handshake, left)))
            except (OSError, ValueError) as e:
                last = f"{reason}; reconnecting: {e or type(e).__name__}"
                _Closer(sock, reader).close()
            except LightrailError as e:  # hello refused: trying again changes nothing
                _Closer(sock, reader).close()
                old.close()
                self._give_up(f"the restarted controller at {self.host}:{self.port} refused rank {self.rank}'s "
                              f"hello: {e.message}", field=e.field, fix=e.fix)
                return None
            else:
                if self._closed:  # closed meanwhile: this connection is nobody's
                    _Closer(sock, reader).close()
                    old.close()
                    return None
                self._restore(sock, reader, reply)
                old.close()
                self.reconnects += 1
                self.reconnect_s.append(time.monotonic() - lost_at)
                self._episode = (delay, time.monotonic())
                return reader
            if time.monotonic() + delay > deadline:
                break
            self._stop.wait(delay)
            delay = min(cap, delay * 2)
        old.close()
        if not self._closed:
            self._give_up(f"the controller at {self.host}:{self.port} is gone: {last}; no answer within "
                          f"reconnect_timeout {self.reconnect_timeout:g} s")
        return None

    def _handshake(self, sock: socket.socket, reader, timeout: float) -> dict | None:
        """Hello on a fresh connection, its reply read here (the reader loop is not running yet)."""
        if self._hello is None:
            return None
        sock.settimeout(timeout)
        message = {"id": 0, "op": "hello", **self._hello_fields()}
        sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        while True:
            line = reader.readline()
            if not line:
                raise OSError("closed during hello")
            reply = json.loads(line)
            if reply.get("id") == 0 and "ok" in reply:
                break
        sock.settimeout(None)
        if not reply["ok"]:
            raise ControllerError.of(reply.get("error", {}))
        return reply

    def _hello_fields(self) -> dict:
        fields = {"job": self.job, "rank": self.rank, **self._hello}
        if self.token is not None:
            fields["token"] = self.token
        return fields

    def _restore(self, sock: socket.socket, reader, hello: dict | None) -> None:
        """Install the new connection and tell the controller what this rank declared, holds and awaits."""
        with self._lock:
            self.sock, self.reader = sock, reader
            if hello is not None:
                self._yields = bool(hello.get("yields"))  # the controller may have been replaced by another version
            with self._cond:
                waiting = sorted(self._pending.values(), key=lambda r: r.logical)
                self._pending.clear()
            self._up = True
            self._heard = time.monotonic()
            for fields in self._declared.values():
                self._send_locked("group", internal=True, **fields)
            for key, lease in list(self.leases.items()):
                if lease.in_op:  # the op runs on: held, and released when it ends (not a lease any more)
                    lease.id, lease.revoked, lease.until = 0, True, None
                    self._inside.add(key)
                else:
                    del self.leases[key]  # forgotten: the next op asks again
            # The restarted controller knows no lease: a peer may be inside the op this rank is about to start
            # (an acquire would wait for a round that peer never starts). Until a round of the new controller
            # grants the group, a lease acquire of it is a hold first (see _hold_first).
            self._resync = set(self._declared)
            for key in sorted(self._inside):
                number = {"op_no": self._op_no[key]} if key in self._op_no else {}
                self._send_locked("hold", internal=True, job=self.job, rank=self.rank, key=key, **number)
            seen: set[int] = set()
            for request in waiting:
                if (request.internal and request.op != "release") or request.stale or request.op in ("ack", "yield"):
                    continue  # a heartbeat or a re-declaration of the lost connection; an ack or yield of a lease gone
                # (an internal release is interrupt's, of an acquire the old connection carried: the controller
                # may still have it waiting, if the connection was only slow, and would make this rank a holder)
                if request.then is not None:  # a hold standing in for an acquire: send (for) the acquire
                    request = request.then
                if request.logical in seen:
                    continue
                seen.add(request.logical)
                if request.op == "acquire":  # sent before the restart: it may join a round a peer restores by hold
                    request.fields["rejoin"] = True
                if request.op == "acquire" and request.fields.get("lease") and request.fields["key"] in self._resync:
                    self._hold_first(request)
                    continue
                if request.op == "hello" and hello is not None:
                    with self._cond:  # said again already: the caller gets that reply
                        if not request.detached:
                            self._replies[request.logical] = hello
                        self._cond.notify_all()
                    continue
                self._write_locked(request)

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

    def _give_up(self, message: str, *, field: str | None = "controller", fix: str | None = None) -> None:
        error = InfeasibleError(f"rank {self.rank} of job {self.job!r}: {message}", field=field or "controller",
                                fix=fix or "check the controller's log; restart it on the same --state, --port and "
                                           "--admin-port within the bound")
        with self._cond:
            self._dead = error
            self._up = False
            self._cond.notify_all()

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
        return self.wait(request_id)
