"""Blocking client of the controller's rank protocol (what each rank process uses).

One TCP connection per rank, Nagle off; requests may be pipelined (``send`` then ``wait``) so a
release and the next phase's prepare cost one round trip between them.
"""

from __future__ import annotations

import json
import socket

from lightrail.errors import InfeasibleError, LightrailError, ScenarioError

__all__ = ["ControllerClient", "ControllerError"]


class ControllerError(LightrailError):
    """The controller refused a request (its message, field and fix are passed through)."""


class ControllerClient:
    def __init__(self, host: str, port: int, *, job: str, rank: int, timeout: float | None = 300.0):
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ScenarioError(f"cannot reach the controller at {host}:{port} ({e})", field="controller",
                                fix="start it with `lightrail controller serve` and pass its address") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")
        self.job, self.rank = job, rank
        self._next = 0
        self._replies: dict[int, dict] = {}

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def send(self, op: str, **fields) -> int:
        self._next += 1
        message = {"id": self._next, "op": op, **fields}
        self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        return self._next

    def wait(self, request_id: int) -> dict:
        while request_id not in self._replies:
            line = self.reader.readline()
            if not line:
                raise InfeasibleError("the controller closed the connection", field="controller",
                                      fix="check the controller's log; restart it and the job")
            reply = json.loads(line)
            self._replies[reply["id"]] = reply
        reply = self._replies.pop(request_id)
        if not reply.get("ok"):
            e = reply.get("error", {})
            raise ControllerError(e.get("message", "refused"), field=e.get("field"), fix=e.get("fix"))
        return reply

    def call(self, op: str, **fields) -> dict:
        return self.wait(self.send(op, **fields))

    # -- the protocol's operations for this rank -------------------------------------------------------
    def hello(self, world: int, ports: dict[str, int]) -> dict:
        return self.call("hello", job=self.job, rank=self.rank, world=world, ports=ports)

    def declare(self, key: str, members, circuits: dict[str, dict[int, int]], phase: str = "other") -> dict:
        circuits = {d: {str(i): int(o) for i, o in c.items()} for d, c in circuits.items()}
        return self.call("group", job=self.job, key=key, phase=phase, members=[int(m) for m in members],
                         circuits=circuits)

    def acquire(self, key: str) -> dict:
        return self.call("acquire", job=self.job, rank=self.rank, key=key)

    def prepare(self, key: str) -> dict:
        return self.call("prepare", job=self.job, rank=self.rank, key=key)

    def release(self, key: str, *, then_prepare: str | None = None) -> None:
        first = self.send("release", job=self.job, rank=self.rank, key=key)
        second = self.send("prepare", job=self.job, rank=self.rank, key=then_prepare) if then_prepare else None
        self.wait(first)
        if second is not None:
            self.wait(second)

    def bye(self, *, whole_job: bool = False) -> dict:
        """Leave (free this rank's ports); ``whole_job`` ends the job for every rank."""
        return self.call("bye", job=self.job) if whole_job else self.call("bye", job=self.job, rank=self.rank)
