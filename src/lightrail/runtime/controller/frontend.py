"""The native front end (``controller serve --frontend native``): ``concentrator.c`` owns the rank connections and
carries their bytes over one stream, in batches. Each connection is a :class:`MuxTransport` here, feeding the same
protocol object a socket would (``RankServer.protocol``), so framing, limits, timeouts and identity are the one
server's. What it changes is who pays the kernel: at full rate the controller's loop makes a receive and a send
per request (7-9 of its 19-23 us at 1,024 ranks, issue 17); here it makes one of each per batch, and the
per-connection work runs in the concentrator, on another core."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

from lightrail.errors import ScenarioError

SOURCE = Path(__file__).with_name("concentrator.c")
HEADER = struct.Struct("<IBI")  # connection id, kind, payload length (concentrator.c)
OPEN, DATA, CLOSE = ord("O"), ord("D"), ord("C")
HIGH_WATER = 1 << 20  # bytes of unwritten replies after which the concentrator stops reading a connection
# Replies leave every 8: a batch of ~1,000 requests answered only at its end made its first requests wait for the
# whole batch (p50 18 ms at 1,024 ranks, against 12-13 ms this way; every 16 or 4 measured no better). Counted in
# entries of the output list, a header and a payload per reply.
FLUSH_EVERY = 2 * 8


def c_compiler() -> str | None:
    """The machine's C compiler: ``$CC``, else cc, gcc or clang on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def compile_c(source: Path, binary: Path, field: str, fix: str) -> Path:
    """``source`` built with :func:`c_compiler` (-O2) into ``binary``; a ScenarioError naming ``field`` if there is
    no compiler or it fails (the message names the compiler and ends with its last words)."""
    cc = c_compiler()
    if cc is None:
        raise ScenarioError("needs a C compiler (cc, gcc or clang on PATH, or CC=...)", field=field, fix=fix)
    try:
        done = subprocess.run([cc, "-O2", "-o", str(binary), str(source)], capture_output=True, text=True)
    except OSError as e:
        raise ScenarioError(f"could not run CC={cc} ({e.strerror})", field=field, fix=fix) from None
    if done.returncode != 0:
        tail = " ".join(done.stderr.split()[-12:])
        raise ScenarioError(f"compiling {source.name} with {cc} failed (exit {done.returncode}){tail and ': ' + tail}",
                            field=field, fix=fix)
    return binary


def compile_concentrator(directory: Path) -> Path:
    """concentrator.c built into ``directory``; a ScenarioError naming --frontend if it cannot be."""
    return compile_c(SOURCE, directory / "concentrator", "--frontend",
                     "install a C compiler (cc, gcc or clang, or set CC), or use --frontend loop")


class MuxTransport:
    """One rank connection as the protocol sees it: writes and a close become frames to the concentrator (which
    applies back-pressure itself, so reading is never paused from here)."""

    def __init__(self, mux: Mux, cid: int, peer: str):
        self.mux, self.cid, self.closing = mux, cid, False
        host, _, port = peer.rpartition(":")
        self.peername = (host, int(port) if port.isdigit() else 0)

    def write(self, data: bytes) -> None:
        if not self.closing:  # the frame is appended here, not by a call: this runs once per reply
            mux = self.mux
            mux.out += (HEADER.pack(self.cid, DATA, len(data)), data)
            if not mux.batch:
                mux.later()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            mux = self.mux
            mux.out.append(HEADER.pack(self.cid, CLOSE, 0))
            if not mux.batch:
                mux.later()

    abort = close

    def get_extra_info(self, name: str, default=None):
        return self.peername if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Mux(asyncio.Protocol):
    """The controller's end of the concentrator's stream: frames in, one protocol per connection id; the replies a
    batch produces leave 8 to a write (``FLUSH_EVERY``), the rest at its end, and those written outside a batch
    (a grant a timer completes, a push) on the next loop turn."""

    def __init__(self, protocol: Callable[[], asyncio.Protocol], lost: Callable[[], None]):
        self.protocol, self.lost = protocol, lost
        self.conns: dict[int, tuple[asyncio.Protocol, MuxTransport]] = {}
        self.buf = b""
        self.out: list[bytes] = []
        self.batch = False
        self.flushing = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        unpack, size, conns, out, at, end = HEADER.unpack_from, HEADER.size, self.conns, self.out, 0, len(buf)
        self.batch = True
        try:
            while end - at >= size:
                cid, kind, n = unpack(buf, at)
                if end - at - size < n:
                    break
                start = at + size
                at = start + n
                if kind == DATA:
                    entry = conns.get(cid)
                    if entry is not None:
                        entry[0].data_received(buf[start:at])
                        if len(out) >= FLUSH_EVERY:
                            self.flush()
                elif kind == OPEN:
                    transport = MuxTransport(self, cid, buf[start:at].decode(errors="replace"))
                    protocol = self.protocol()
                    conns[cid] = (protocol, transport)
                    protocol.connection_made(transport)
                elif kind == CLOSE:
                    entry = conns.pop(cid, None)
                    if entry is not None:
                        entry[1].closing = True
                        entry[0].connection_lost(None)
        finally:
            self.batch = False
            self.buf = buf[at:]
            self.flush()

    def later(self) -> None:
        """Frames written outside a batch (a grant a timer completes, a push) leave on the next loop turn."""
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        """The concentrator is gone (or stopped with the controller): the ranks lost their connections with it,
        but none of them failed, so no rank is failed over; the controller stops (``lost``) and its restart is
        what they reconnect to, as after a controller restart."""
        for _, transport in self.conns.values():
            transport.closing = True
        self.conns = {}
        self.lost()


class NativeFrontend:
    """The concentrator process on a listening socket bound here, and the stream to it."""

    def __init__(self, proc: subprocess.Popen, mux: Mux, port: int):
        self.proc, self.mux, self.port = proc, mux, port

    @classmethod
    async def start(cls, binary: Path, host: str, port: int, protocol: Callable[[], asyncio.Protocol],
                    lost: Callable[[], None]) -> NativeFrontend:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            listener = socket.create_server((host, port), family=family, backlog=1024)
        except OSError as e:
            raise ScenarioError(f"cannot listen on {host}:{port}: {e.strerror or e}", field="--port",
                                fix="pick a free port, or 0 for any") from None
        ours, theirs = socket.socketpair()
        with listener, theirs:
            listener.setblocking(False)
            proc = subprocess.Popen([str(binary), str(listener.fileno()), str(theirs.fileno()), str(HIGH_WATER)],
                                    pass_fds=(listener.fileno(), theirs.fileno()))
            bound = listener.getsockname()[1]
        _, mux = await asyncio.get_running_loop().connect_accepted_socket(lambda: Mux(protocol, lost), ours)
        return cls(proc, mux, bound)

    def close(self) -> None:
        if self.mux.transport is not None:
            self.mux.transport.close()
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
