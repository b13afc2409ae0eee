"""The rank protocol's server: JSON lines over TCP (or the native front end), one ``Conn`` per connection, tenancy
(a connection speaks for the (job, rank) its ``hello`` bound it to) and liveness (see ``server.py``'s docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from lightrail.errors import LightrailError, ScenarioError
from lightrail.runtime.controller.config import ControllerConfig
from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.metrics import Metrics, RateLog, _log
from lightrail.runtime.controller.protocol import (
    Acquire,
    Bye,
    Hello,
    encode,
    encode_ok,
    error_reply,
    fast_request,
    parse_request,
    request_id,
)

FD_RESERVE = 64  # file descriptors kept for the admin API, SQLite and logs when capping connections


REJOIN_MARGIN_S = 2.0
"""Added to ``heartbeat_timeout`` for the default ``rejoin_timeout``: the client's reconnect backoff cap (1 s,
``client.BACKOFF``) plus a hello's round trip, with room to spare."""


@dataclass(eq=False)
class Conn:
    """One rank-protocol connection: who it speaks for once it said hello, and when it was last heard."""

    writer: asyncio.Transport  # the connection's transport (or anything with write, is_closing, close)
    peer: str
    opened: float
    last_seen: float
    bound: tuple[str, int] | None = None  # (job, rank) after a good hello
    token: str | None = None
    waits: dict[str, int] = field(default_factory=dict)  # group key -> id of the acquire waiting on it
    failed: bool = False  # the server closed it (silence, no hello, a newer connection for its rank)
    left: bool = False  # its rank said bye: closing it is no failure
    seq: int = 0  # accept order: a hello on a connection older than its rank's bound one is stale

    def send(self, message: dict) -> None:
        if not self.writer.is_closing():
            self.writer.write(encode(message))

    def write(self, data: bytes) -> None:
        """An encoded reply (the hot path's byte templates)."""
        if not self.writer.is_closing():
            self.writer.write(data)


def _refusal(message: str, field_: str, fix: str) -> ScenarioError:
    return ScenarioError(message, field=field_, fix=fix)


class RankServer:
    """The JSON-lines rank protocol over asyncio streams (one :class:`Conn` per connection)."""

    def __init__(self, controller: Controller, config: ControllerConfig, *, clock=time.monotonic):
        self.controller, self.config, self.clock = controller, config, clock
        self.open: set[Conn] = set()
        self.bound: dict[tuple[str, int], Conn] = {}  # (job, rank) -> its connection (where pushes go)
        self.counters = {"refused": 0, "connections_refused": 0, "timeouts": 0, "rank_failures": 0, "superseded": 0,
                         "pauses": 0}
        # (job, rank) -> (when, peer): its connection closed without bye; failed unless it says hello again in time
        self.absent: dict[tuple[str, int], tuple[float, str]] = {}
        self.swept: float | None = None  # when the sweeper last ran (a late run: this process was not running)
        self.accepted = 0  # connections accepted (Conn.seq)
        self.max_connections = _connection_cap(config.max_connections)
        self.rlog = RateLog()
        self.metrics = Metrics(controller, self)
        controller.metrics = self.metrics  # metrics_text(controller) finds it
        controller.notify = self.push

    # -- pushes and failures ------------------------------------------------------------------------------------
    def push(self, job: str, rank: int, message: dict) -> None:
        """The controller's ``notify``: write a pushed message on the rank's connection (if it still has one)."""
        conn = self.bound.get((job, rank))
        if conn is not None:
            conn.send(message)

    def fail(self, conn: Conn, reason: str) -> None:
        """The rank on ``conn`` failed (silent while others were heard): unbind it and fail it (:meth:`_failed`)."""
        if conn.bound is None:
            return
        job, rank = conn.bound
        conn.bound = None
        if self.bound.get((job, rank)) is conn:
            del self.bound[(job, rank)]
        self._failed(job, rank, conn.peer, reason)

    def lost(self, conn: Conn) -> None:
        """``conn`` closed without bye: not a failure yet (the rank may be reconnecting, e.g. after a pause of this
        process), so the rank is *absent*: its holds, leases and waits go (``Controller.connection_lost``, as
        the client forgets them too) and it is failed if it says no hello within ``heartbeat_timeout``."""
        if conn.bound is None:
            return
        job, rank = conn.bound
        conn.bound = None
        if self.bound.get((job, rank)) is not conn:
            return  # a newer connection speaks for it
        del self.bound[(job, rank)]
        if job not in self.controller.jobs or rank not in self.controller.jobs[job]["ranks"]:
            return  # it already left (bye), or its job ended
        self.absent[(job, rank)] = (self.clock(), conn.peer)
        self.rlog("rank_absent", job=job, rank=rank, peer=conn.peer)
        lost = getattr(self.controller, "connection_lost", None)
        try:
            if lost is not None:
                lost(job, rank)
        except LightrailError as e:
            _log("rank_failed_error", job=job, rank=rank, error=str(e))

    def _failed(self, job: str, rank: int, peer: str, reason: str) -> None:
        """Tell the controller the rank is gone: it fails it over to a spare (the spare's connection is re-bound
        here) or ends its holds."""
        self.absent.pop((job, rank), None)
        if job not in self.controller.jobs or rank not in self.controller.jobs[job]["ranks"]:
            return  # it already left (bye), or its job ended
        self.counters["rank_failures"] += 1
        self.rlog("rank_failed", job=job, rank=rank, peer=peer, reason=reason)
        rank_failed = getattr(self.controller, "rank_failed", None)
        try:
            if rank_failed is None:
                self.controller.disconnect(job, rank)
                return
            result = rank_failed(job, rank) or {}
        except LightrailError as e:  # e.g. the state file is busy: logged, the connection is gone anyway
            _log("rank_failed_error", job=job, rank=rank, error=str(e))
            return
        if result.get("failover"):
            spare = self.bound.pop((job, result["spare"]), None)
            if spare is not None:  # the spare now speaks for the failed rank (it says hello again as it)
                spare.bound = (job, rank)
                self.bound[(job, rank)] = spare
            _log("failover", job=job, rank=rank, spare=result["spare"], epoch=result.get("epoch"),
                 rewire_s=result.get("rewire_s"))

    def sweep(self) -> None:
        """Close connections that never said hello within ``hello_timeout``; fail bound ranks silent longer than
        ``heartbeat_timeout`` while others were heard, and absent ranks that said no hello again in that long.
        A sweep that comes late (by more than ``heartbeat_timeout / 2``) means this process did not run: that
        time is nobody's silence, so every clock of silence and absence moves on by it."""
        now = self.clock()
        period = self.period()
        if self.swept is not None and now - self.swept > period + self.config.heartbeat_timeout / 2:
            stalled = now - self.swept - period
            self.counters["pauses"] += 1
            _log("paused", seconds=round(stalled, 3))
            for conn in self.open:
                conn.last_seen = min(now, conn.last_seen + stalled)
            self.absent = {k: (min(now, t + stalled), peer) for k, (t, peer) in self.absent.items()}
        self.swept = now
        hb = self.config.heartbeat_timeout
        rejoin = self.rejoin_timeout()
        for (job, rank), (t, peer) in list(self.absent.items()):
            if now - t > rejoin:
                self._failed(job, rank, peer, f"connection closed without bye, no hello again within "
                                              f"{rejoin:g} s (rejoin_timeout)")
        bound = [c for c in self.open if c.bound is not None]
        heard = min((now - c.last_seen for c in bound), default=0.0)  # since the last rank was heard
        for conn in list(self.open):
            if conn.bound is None and not conn.failed and now - conn.opened > self.config.hello_timeout:
                self.counters["timeouts"] += 1
                self.rlog("hello_timeout", peer=conn.peer)
                conn.send({"id": 0, "ok": False, "error": {
                    "type": "ScenarioError", "message": f"no hello within {self.config.hello_timeout} s",
                    "field": "hello_timeout", "fix": "say hello first, with the job's token"}})
                conn.failed = True
                conn.writer.close()
            elif conn.bound is not None and now - conn.last_seen > self.config.heartbeat_timeout:
                if _unread(conn.writer):  # it did speak: the loop is behind (overload), not the rank silent
                    conn.last_seen = now
                    continue
                if len(bound) > 1 and heard > hb:
                    continue  # nobody was heard: this process's network (or clock) is the suspect, not the rank
                self.counters["timeouts"] += 1
                conn.failed = True
                self.fail(conn, f"silent for {now - conn.last_seen:.3f} s (heartbeat_timeout "
                                f"{self.config.heartbeat_timeout} s)")
                conn.writer.close()
        self.rlog.flush()

    def rejoin_timeout(self) -> float:
        """How long a rank whose connection closed without bye may take to say hello again: the config's, else
        ``heartbeat_timeout`` + :data:`REJOIN_MARGIN_S` (a client's next try after a pause comes within its
        backoff cap and one hello round trip)."""
        c = self.config
        return c.rejoin_timeout or c.heartbeat_timeout + REJOIN_MARGIN_S

    def period(self) -> float:
        """Seconds between sweeps."""
        c = self.config
        return min(c.heartbeat_timeout, c.hello_timeout, self.rejoin_timeout()) / 4

    async def sweeper(self) -> None:
        self.swept = self.clock()
        while True:
            await asyncio.sleep(self.period())
            self.sweep()
            self.flush()

    def flush(self) -> None:
        """Persist the controller's safety counters (a busy state file: next time)."""
        flush = getattr(self.controller, "flush_counters", None)
        if flush is not None:
            with contextlib.suppress(LightrailError):
                flush()

    # -- one connection -----------------------------------------------------------------------------------------
    def protocol(self) -> _RankProtocol:
        """A protocol for one new connection (``loop.create_server(server.protocol, ...)``)."""
        return _RankProtocol(self)

    def _bad(self, conn: Conn, rid: int, e: LightrailError, **claimed) -> None:
        self.controller.counters["errors"] += 1
        self.rlog("bad_request", peer=conn.peer, error=str(e), **claimed)
        conn.send(error_reply(rid, e))

    def _refuse(self, conn: Conn, rid: int, e: LightrailError, **claimed) -> None:
        """A request speaking for someone else: refused, logged with the identity it claimed and the peer."""
        self.counters["refused"] += 1
        self.controller.counters["errors"] += 1
        self.rlog("refused", peer=conn.peer, bound=list(conn.bound) if conn.bound else None, field=e.field,
                  **claimed)
        conn.send(error_reply(rid, e))

    def request(self, conn: Conn, line: bytes) -> None:
        c = self.controller
        c.counters["requests"] += 1
        t0 = time.perf_counter()
        m = fast_request(line)  # heartbeat, acquire, prepare, release: no pydantic (issue 17: 1,024 ranks)
        if m is None:
            try:
                m = parse_request(line, max_depth=self.config.max_depth)
            except LightrailError as e:
                self._bad(conn, request_id(line), e)
                return
        rid, op = m.id, m.op
        try:
            if op == "heartbeat":
                conn.write(encode_ok(rid, {"t": c.clock()}))
                if c.unsynced and conn.bound is not None:  # sent after its holds: its ports may be switched
                    c.resumed(*conn.bound)
                self.metrics.request(op, time.perf_counter() - t0)
                return
            if op == "hello":
                reply = self._hello(conn, m)
                if reply is None:
                    return
            else:
                bound = conn.bound
                if (bound is None or m.job != bound[0] or getattr(m, "rank", bound[1]) not in (None, bound[1])) \
                        and not self._allowed(conn, m):
                    return
                if op == "acquire" or op == "prepare":
                    self._acquire(conn, m, t0)
                    return
                if op == "release":
                    reply = c.release(m)
                elif op == "group":
                    reply = c.declare(m)
                elif op == "ack":
                    reply = c.ack(m)
                elif op == "yield":
                    reply = c.yield_lease(m)
                elif op == "hold":
                    hold = getattr(c, "hold", None)
                    if hold is None:
                        raise ScenarioError("this controller does not take hold", field="op", fix="acquire again")
                    reply = hold(m)
                else:  # bye (the models admit no other op)
                    reply = self._bye(conn, m)
            conn.write(encode_ok(rid, reply))
        except LightrailError as e:
            self._bad(conn, rid, e, job=getattr(m, "job", None), rank=getattr(m, "rank", None), op=op)
        self.metrics.request(op, time.perf_counter() - t0)

    def _allowed(self, conn: Conn, m) -> bool:
        """A request after hello must speak for the connection's (job, rank)."""
        claimed = {"op": m.op, "job": m.job, "rank": getattr(m, "rank", None)}
        if conn.bound is None:
            self._refuse(conn, m.id, _refusal(f"{m.op} before hello", "op", "say hello first"), **claimed)
            return False
        job, rank = conn.bound
        if m.job != job:
            self._refuse(conn, m.id, _refusal(f"this connection speaks for job {job!r}, not {m.job!r}", "job",
                                              "a rank only speaks for its own job"), **claimed)
            return False
        mine = getattr(m, "rank", rank)
        if mine is not None and mine != rank:
            self._refuse(conn, m.id, _refusal(f"this connection speaks for rank {rank} of {job!r}, not rank {mine}",
                                              "rank", "a connection only speaks for the rank that said hello on it"),
                         **claimed)
            return False
        return True

    def _hello(self, conn: Conn, m: Hello) -> dict | None:
        claimed = {"op": "hello", "job": m.job, "rank": m.rank}
        if conn.bound is not None and conn.bound != (m.job, m.rank):
            job, rank = conn.bound
            self._refuse(conn, m.id, _refusal(f"this connection speaks for rank {rank} of {job!r}",
                                              "job" if m.job != job else "rank",
                                              "one connection per rank: open another one"), **claimed)
            return None
        if not m.token or not self.controller.authenticate(m.job, m.token):
            self._refuse(conn, m.id, _refusal(f"wrong or missing token for job {m.job!r}", "token",
                                              "pass the token POST /jobs returned for this job"), **claimed)
            return None
        other = self.bound.get((m.job, m.rank))
        if other is not None and other is not conn and other.seq > conn.seq:
            # A stale hello: the rank's client gave this connection up for a newer one that already speaks for it
            # (both queued while this process was paused, read in either order): closed, not taken over, so the
            # newer one is not closed and its close is no failure.
            self.rlog("stale_hello", job=m.job, rank=m.rank, peer=conn.peer, bound=other.peer)
            conn.send(error_reply(m.id, _refusal(f"a newer connection speaks for rank {m.rank} of {m.job!r}", "rank",
                                                 "use the newest connection")))
            conn.failed = True
            return None
        if other is not None and other is not conn:
            # The rank's old connection is still open (a reconnect before the server noticed the drop, e.g. this
            # process was paused and reads the new hello before the old connection's close): the newest connection
            # with the right token wins; the old one is closed without failing the rank, and what it held goes as
            # if its close had been read first. The client forgot it when it reconnected (it holds again the op it
            # is inside; a lease not in use is gone): a lease kept here would be revoked on the new connection and
            # never acked, and the group waiting for its ports would wait for ever (issue 31).
            other.failed = True
            other.writer.close()
            self.lost(other)  # absent until the hello below succeeds (logged: rank_absent, then hello)
        reply = self.controller.hello(m)
        conn.bound, conn.token, conn.left = (m.job, m.rank), m.token, False
        self.bound[(m.job, m.rank)] = conn
        self.absent.pop((m.job, m.rank), None)  # back: re-admitted
        return reply

    def _bye(self, conn: Conn, m: Bye) -> dict:
        reply = self.controller.bye(m)
        job, rank = conn.bound
        if m.rank is None:  # the whole job ended: nobody speaks for it any more
            for (j, r), other in list(self.bound.items()):
                if j == job:
                    other.bound = None
                    del self.bound[(j, r)]
        else:
            conn.bound = None
            self.bound.pop((job, rank), None)
        conn.left = conn.bound is None  # closing after bye is not a failure
        return reply

    def _acquire(self, conn: Conn, m: Acquire, t0: float) -> None:
        c = self.controller
        fut = c.acquire(m)
        if fut is None:
            reply = {"granted": m.op == "acquire"}
            lease = c.lease_of(m.job, m.key, m.rank)
            if lease is not None and m.op == "acquire":
                reply["lease"] = lease
            conn.write(encode_ok(m.id, reply))
            t1 = time.perf_counter()
            if m.op == "acquire":
                self.metrics.granted(t1 - t0)
            self.metrics.request(m.op, t1 - t0)
            return
        old = conn.waits.get(m.key)
        if old is not None:  # a repeated acquire replaces the wait: the old request is answered, never orphaned
            self.counters["superseded"] += 1
            conn.send({"id": old, "ok": False, "error": {
                "type": "Superseded", "message": f"acquire {old} of {m.key!r} was replaced by acquire {m.id}",
                "field": "key", "fix": "wait for the newer request"}})
        conn.waits[m.key] = m.id
        rid, key = m.id, m.key

        def granted(f: asyncio.Future) -> None:
            if conn.waits.get(key) != rid:
                return  # superseded: already answered
            del conn.waits[key]
            if f.cancelled():
                conn.send({"id": rid, "ok": False, "error": {"type": "Cancelled", "message": "request dropped",
                                                             "field": "key", "fix": "acquire again"}})
                return
            e = f.exception()
            if e is not None:
                err = e if isinstance(e, LightrailError) else LightrailError(str(e), field="key")
                conn.send(error_reply(rid, err))
                return
            result = f.result()
            if result and "error" in result:
                conn.send({"id": rid, "ok": False, "error": result["error"]})
                return
            self.metrics.granted(time.perf_counter() - t0)
            conn.write(encode_ok(rid, {"granted": True, **result} if result else _GRANTED))

        if fut.done():  # granted (or failed) by this very request: the last member of a lit group
            granted(fut)
        else:
            fut.on_done = granted  # the grant is written as it happens (see Waiter)
        self.metrics.request(m.op, time.perf_counter() - t0)


_GRANTED = {"granted": True}


class _RankProtocol(asyncio.Protocol):
    """One rank-protocol connection, as an asyncio Protocol: requests are handled in ``data_received``, straight
    from the selector (a StreamReader would wake a task per read: ~2 loop callbacks a request more, a third of
    the controller's CPU at 1,024 ranks, issue 17). Requests in order; acquires may complete out of order. Lines
    are framed here (not readline) so a line over ``max_line`` gets an error reply and the rest of it is
    skipped, the connection staying open. While the transport's write buffer is over its high-water mark
    (a rank not reading its replies), reading from it pauses."""

    def __init__(self, server: RankServer):
        self.server = server
        self.conn: Conn | None = None
        self.buf = bytearray()
        self.skipping = False
        self.max_line = server.config.max_line

    def connection_made(self, transport: asyncio.Transport) -> None:
        server = self.server
        peer = _peer(transport)
        if len(server.open) >= server.max_connections:
            server.counters["connections_refused"] += 1
            server.rlog("connection_refused", peer=peer, open=len(server.open), max_connections=server.max_connections)
            transport.write(encode({"id": 0, "ok": False, "error": {
                "type": "InfeasibleError", "message": f"the controller serves at most {server.max_connections} "
                f"connections", "field": "max_connections", "fix": "retry later, or raise max_connections"}}))
            transport.close()  # after the reply is written
            return
        now = server.clock()
        server.accepted += 1
        self.conn = Conn(transport, peer, now, now, seq=server.accepted)
        server.open.add(self.conn)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or conn.failed:
            return  # refused at the cap, or closed by the server: the rest is not read
        server, max_line, buf = self.server, self.max_line, self.buf
        conn.last_seen = server.clock()
        if not buf and not self.skipping and data.find(b"\n") == len(data) - 1 and len(data) <= max_line + 1:
            if len(data) > 1 and not data.isspace():  # the common read: one whole request line
                server.request(conn, data[:-1])
        else:
            buf += data
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                line = bytes(buf[start:nl])
                start = nl + 1
                if self.skipping:
                    self.skipping = False
                elif len(line) > max_line:
                    server._bad(conn, request_id(line[:4096]), _too_long(max_line))
                elif line.strip():
                    server.request(conn, line)
                if conn.failed:
                    break
            del buf[:start]
            if len(buf) > max_line:
                if not self.skipping:
                    server._bad(conn, request_id(bytes(buf[:4096])), _too_long(max_line))
                buf.clear()
                self.skipping = True
        if conn.failed:
            conn.writer.close()

    def pause_writing(self) -> None:
        if self.conn is not None and not self.conn.writer.is_closing():
            self.conn.writer.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None and not self.conn.writer.is_closing():
            self.conn.writer.resume_reading()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        self.server.open.discard(conn)
        if not conn.failed and not conn.left:
            self.server.lost(conn)
        conn.writer.close()


def _unread(writer: asyncio.StreamWriter) -> bool:
    """Bytes (or an EOF) wait in the connection's socket that the event loop has not read yet."""
    import select

    sock = writer.get_extra_info("socket")
    try:
        return bool(sock is not None and select.select([sock.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _too_long(max_line: int) -> ScenarioError:
    return ScenarioError(f"request line over {max_line} bytes", field="message",
                         fix="one request per line, under max_line bytes")


def _peer(writer: asyncio.StreamWriter) -> str:
    p = writer.get_extra_info("peername")
    return f"{p[0]}:{p[1]}" if isinstance(p, tuple) and len(p) >= 2 else str(p)


def _connection_cap(configured: int) -> int:
    """``max_connections``, but never more than the process may open files (minus a reserve): past the fd
    limit, accept() fails and the admin API with it (issue 17: 1,100 half-open connections at 1,024 fds)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return configured
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, soft - FD_RESERVE))
