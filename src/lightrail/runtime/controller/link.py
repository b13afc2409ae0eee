"""The rank client's link to the controller: :class:`Link`, the half of ``client.ControllerClient`` that keeps
its connection (the wire and the requests awaiting replies, the reader thread, heartbeats, reconnection and what
a reconnect restores); ``client.py`` holds the rank's operations and leases.

Surviving the controller (issue 17): a heartbeat thread sends ``heartbeat`` every
``heartbeat_timeout / 4``; a connection that drops, or a heartbeat unanswered for ``heartbeat_timeout``
(a frozen controller: its socket still accepts), makes the reader thread reconnect with exponential
backoff (0.05 s doubling to 1 s) for up to ``reconnect_timeout`` while the controller refuses connections
(gone), or up to ``stall_timeout`` (10 min) while it accepts them and answers nothing (stopped, stalled: the
hello waits on the accepted connection; issue 31). A restarted controller knows the
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
import logging
import socket
import threading
import time
from dataclasses import dataclass

from lightrail.errors import InfeasibleError, LightrailError

BACKOFF = (0.05, 1.0)
"""Reconnect backoff: the first wait and the cap; it doubles in between (issue 17's protocol)."""
RETRY_S = 0.05
"""After a reconnect, a lease acquire that waits tries a hold again after this, doubling to 1 s (``_hold_first``)."""
STALL_TIMEOUT_S = 600.0
"""How long a client waits for a controller that accepts connections but answers nothing (stopped, stalled)."""

_log = logging.getLogger("lightrail.controller.client")


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



class Link:
    """The connection machinery of :class:`~lightrail.runtime.controller.client.ControllerClient` (a mixin: the
    client's ``__init__`` sets the state it uses)."""

    def _connect(self, timeout: float | None) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # the reader blocks; waits time out on their own
        return sock

    # -- the wire -------------------------------------------------------------------------------------
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
    _silent_at: float | None = None  # while reconnecting: the last time a stalled controller accepted and said nothing
    _stall_logged = False  # this reconnect's stall was logged
    _episode: tuple[float, float] | None = None  # after the last reconnect: the next backoff, when it was made

    def _recover(self, reason: str):
        """The connection ended without a bye: reconnect (backoff), say hello, restore this rank's view.
        Returns the new connection's reader, or None after giving up (every wait then raises).

        Two bounds (issue 31: a paused controller is not a dead job). A controller that refuses connections (or
        resets them) is gone once ``reconnect_timeout`` passes with no sign of it. One whose port still accepts
        but which answers nothing (SIGSTOP, a VM stall, a long GC pause: its kernel queues the connection) is
        stalled: the client keeps its hello waiting on that connection (one line logged) and gives up only after
        ``stall_timeout``. A connect that times out counts as stalled too: a stopped process's full accept queue
        drops new connections' SYNs."""
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
        stall_end = lost_at + max(self.stall_timeout, self.reconnect_timeout)
        self._silent_at, self._stall_logged = None, False  # signs of a stalled controller, this episode
        cap = BACKOFF[1]
        if flapping:
            self._stop.wait(delay)
            delay = min(cap, delay * 2)
        handshake = self.heartbeat_timeout or 5.0  # a hello not answered in this long: the controller is stalled
        last = reason
        while not self._closed:
            deadline = min(stall_end, (self._silent_at or lost_at) + self.reconnect_timeout)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock = reader = None
            try:
                sock = self._connect(max(0.05, min(handshake, left)))
                reader = sock.makefile("rb")
                reply = self._handshake(sock, reader, handshake, stall_end)
            except (OSError, ValueError) as e:
                if isinstance(e, TimeoutError):  # accepted (or queued) and silent: stalled, not gone
                    self._stalled(f"lets connections time out ({e})")
                last = f"{reason}; reconnecting: {e or type(e).__name__}"
                _Closer(sock, reader).close()
            except LightrailError as e:  # hello refused: trying again changes nothing
                _Closer(sock, reader).close()
                old.close()
                self._unknown = e.field == "token"  # the controller knows no job with this rank's secret
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
        if self._closed:
            return None
        if self._silent_at is not None and time.monotonic() >= stall_end:
            self._give_up(f"the controller at {self.host}:{self.port} is stalled: it accepts connections but "
                          f"answered nothing within stall_timeout {self.stall_timeout:g} s ({last})",
                          fix="check the controller's log and whether its process is stopped (SIGSTOP) or its "
                              "host overloaded; raise stall_timeout for longer pauses")
        else:
            self._give_up(f"the controller at {self.host}:{self.port} is gone: {last}; no answer within "
                          f"reconnect_timeout {self.reconnect_timeout:g} s")
        return None

    def _handshake(self, sock: socket.socket, reader, timeout: float, stall_end: float | None = None) -> dict | None:
        """Hello on a fresh connection, its reply read here (the reader loop is not running yet). The reply not
        begun within ``timeout``, the controller is stalled: the hello waits on this connection (its place in
        the controller's queue: a new connection per try would leave it a backlog of stale hellos) until
        ``stall_end``; past it, a ``TimeoutError``."""
        if self._hello is None:
            return None
        sock.settimeout(timeout)
        message = {"id": 0, "op": "hello", **self._hello_fields()}
        sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        if stall_end is not None:
            self._await_reply(sock, timeout, stall_end)
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

    def _await_reply(self, sock: socket.socket, timeout: float, stall_end: float) -> None:
        """Wait until ``sock`` has something to read (or its peer closed it); after ``timeout`` of silence, log one
        line (the controller is stalled) and go on waiting, up to ``stall_end``, then a ``TimeoutError``."""
        start = time.monotonic()
        while not self._closed:
            sock.settimeout(max(0.001, min(timeout, stall_end - time.monotonic())))
            try:
                sock.recv(1, socket.MSG_PEEK)  # a byte (left for the reader), or b"" at EOF
                return
            except TimeoutError:
                pass
            finally:
                sock.settimeout(timeout)
            now = time.monotonic()
            if now >= stall_end:
                raise TimeoutError(f"the controller accepted the connection but answered nothing for "
                                   f"{now - start:.1f} s")
            self._stalled(f"accepts connections but has not answered for {now - start:.1f} s")
        raise OSError("the client was closed")

    def _stalled(self, what: str) -> None:
        """A sign of a stalled controller while reconnecting: recorded (the gone bound restarts from it), and the
        episode's first logged."""
        self._silent_at = time.monotonic()
        if not self._stall_logged:
            self._stall_logged = True
            self.stalls += 1
            _log.warning("rank %s of job %r: the controller at %s:%s %s (stopped or stalled?); waiting up to "
                         "stall_timeout %g s", self.rank, self.job, self.host, self.port, what, self.stall_timeout)

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
            # After the holds: the controller may switch this rank's ports now (a rank inside an op would send
            # nothing else until the op ends, which may wait for a peer whose group needs them: issue 31)
            self._beat_out = time.monotonic()
            self._send_locked("heartbeat", internal=True)

    def _give_up(self, message: str, *, field: str | None = "controller", fix: str | None = None) -> None:
        error = InfeasibleError(f"rank {self.rank} of job {self.job!r}: {message}", field=field or "controller",
                                fix=fix or "check the controller's log; restart it on the same --state, --port and "
                                           "--admin-port within the bound")
        with self._cond:
            self._dead = error
            self._up = False
            self._cond.notify_all()
