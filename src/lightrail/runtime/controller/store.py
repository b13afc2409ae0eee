"""The controller's durable state in SQLite (WAL): lit circuits per device, jobs (world, spares, epoch,
hashed token), port ownership per rank, ports still switching, dead ports and counters.

Every change is committed before the controller changes its memory or a switch (write first), so a
failed write leaves both as they were and a controller killed mid-job and started again on the same
file reports the same circuits, owners and tokens, and still waits for a reconfiguration that was
under way (its deadline is stored in wall-clock time, ``time.time()``). WAL keeps a commit to one
fsync-free append (``synchronous=NORMAL``): well under a millisecond on loopback-scale workloads.

Another process holding the write lock must not stall the controller's event loop: each write waits
at most ``busy_timeout`` (SQLite's own retry loop) per attempt, ``attempts`` times, then raises an
:class:`~lightrail.errors.InfeasibleError` naming ``state`` (issue 17 saw a 5 s stall, then memory and
disk disagreeing).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from lightrail.errors import InfeasibleError

__all__ = ["Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS circuits (device TEXT NOT NULL, input INTEGER NOT NULL, output INTEGER NOT NULL,
                                     PRIMARY KEY (device, input));
CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, world INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ranks (job TEXT NOT NULL, rank INTEGER NOT NULL, device TEXT NOT NULL, port INTEGER NOT NULL,
                                  PRIMARY KEY (job, rank, device), UNIQUE (device, port));
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS switching (device TEXT NOT NULL, port INTEGER NOT NULL, until REAL NOT NULL,
                                      PRIMARY KEY (device, port));
CREATE TABLE IF NOT EXISTS dead_ports (device TEXT NOT NULL, port INTEGER NOT NULL, PRIMARY KEY (device, port));
"""

# Columns added to ``jobs`` by issue 17 (a state file from before gets them with these defaults).
_JOB_COLUMNS = {"spares": "INTEGER NOT NULL DEFAULT 0", "epoch": "INTEGER NOT NULL DEFAULT 0", "token": "TEXT"}


class Store:
    """SQLite file (or ``:memory:``) holding the controller's durable state (module doc).

    ``busy_timeout`` (seconds) and ``attempts`` bound how long one write may wait for another process's
    lock; ``wall`` is the wall clock that switching deadlines are stored in.
    """

    def __init__(self, path: str | Path = ":memory:", *, busy_timeout: float = 0.05, attempts: int = 3,
                 wall: Callable[[], float] = time.time):
        self.path = str(path)
        self.attempts, self.wall = max(1, attempts), wall
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                  timeout=busy_timeout)
        self.db.execute(f"PRAGMA busy_timeout={max(0, int(busy_timeout * 1000))}")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        have = {row[1] for row in self.db.execute("PRAGMA table_info(jobs)")}
        for column, kind in _JOB_COLUMNS.items():
            if column not in have:
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")

    def close(self) -> None:
        self.db.close()

    def _write(self, statements: Iterable[tuple[str, tuple | list]]) -> None:
        """Run ``statements`` (sql, params; params a list of tuples runs executemany) in one transaction,
        or none of them: after ``attempts`` lock timeouts, InfeasibleError naming ``state``."""
        statements = list(statements)
        error = None
        for _ in range(self.attempts):
            try:
                self.db.execute("BEGIN IMMEDIATE")  # take the write lock now, not at the first write
            except sqlite3.OperationalError as e:
                error = e
                continue
            try:
                for sql, params in statements:
                    if isinstance(params, list):
                        self.db.executemany(sql, params)
                    else:
                        self.db.execute(sql, params)
                self.db.execute("COMMIT")
                return
            except sqlite3.OperationalError as e:
                error = e
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
        raise InfeasibleError(f"the state file {self.path} could not be written ({error})", field="state",
                              fix="another process holds its lock or the disk is full; nothing changed, retry")

    # -- circuits -------------------------------------------------------------------------------------
    def circuits(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for device, i, o in self.db.execute("SELECT device, input, output FROM circuits ORDER BY device, input"):
            out.setdefault(device, {})[i] = o
        return out

    @staticmethod
    def _circuit_statements(device: str, state: dict[int, int]) -> list[tuple[str, tuple | list]]:
        return [("DELETE FROM circuits WHERE device = ?", (device,)),
                ("INSERT INTO circuits VALUES (?, ?, ?)", [(device, i, o) for i, o in state.items()])]

    def set_circuits(self, device: str, state: dict[int, int]) -> None:
        self._write(self._circuit_statements(device, state))

    def switch(self, states: dict[str, dict[int, int]], until: dict[tuple[str, int], float],
               counters: dict[str, float] | None = None) -> None:
        """One reconfiguration: the devices' new circuits, the ports that go dark until ``until`` (wall
        clock), and counters to add, in one transaction (expired deadlines are dropped)."""
        self._write(self._switch_statements(states, until, counters))

    def _switch_statements(self, states, until, counters) -> list[tuple[str, tuple | list]]:
        statements: list[tuple[str, tuple | list]] = [("DELETE FROM switching WHERE until <= ?", (self.wall(),))]
        for device, state in states.items():
            statements += self._circuit_statements(device, state)
        statements.append(("INSERT INTO switching VALUES (?, ?, ?) ON CONFLICT(device, port) DO UPDATE SET "
                           "until = max(until, excluded.until)", [(d, p, t) for (d, p), t in until.items()]))
        return statements + self._counter_statements(counters or {})

    def switching(self) -> dict[tuple[str, int], float]:
        """Ports still switching: (device, port) -> wall-clock time the switch completes."""
        return {(d, p): t for d, p, t in self.db.execute("SELECT device, port, until FROM switching WHERE until > ?",
                                                          (self.wall(),))}

    # -- dead ports -----------------------------------------------------------------------------------
    def dead_ports(self) -> set[tuple[str, int]]:
        return {(d, p) for d, p in self.db.execute("SELECT device, port FROM dead_ports")}

    def set_dead(self, device: str, port: int, dead: bool) -> None:
        sql = "INSERT OR IGNORE INTO dead_ports VALUES (?, ?)" if dead else \
            "DELETE FROM dead_ports WHERE device = ? AND port = ?"
        self._write([(sql, (device, port))])

    # -- jobs and ports -------------------------------------------------------------------------------
    def jobs(self) -> dict[str, dict]:
        out = {job: {"world": world, "spares": spares, "epoch": epoch, "ranks": {}}
               for job, world, spares, epoch in self.db.execute("SELECT job, world, spares, epoch FROM jobs")}
        for job, rank, device, port in self.db.execute("SELECT job, rank, device, port FROM ranks"):
            out[job]["ranks"].setdefault(rank, {})[device] = port
        return out

    def tokens(self) -> dict[str, str]:
        """Job -> sha256 hex digest of its token (registered jobs only)."""
        return dict(self.db.execute("SELECT job, token FROM jobs WHERE token IS NOT NULL"))

    def register_job(self, job: str, world: int, spares: int, token_hash: str) -> None:
        """A new job, or a job registered again once its ranks are gone: its old ranks are dropped."""
        self._write([("DELETE FROM ranks WHERE job = ?", (job,)),
                     ("INSERT INTO jobs (job, world, spares, epoch, token) VALUES (?, ?, ?, 0, ?) ON CONFLICT(job) "
                      "DO UPDATE SET world = excluded.world, spares = excluded.spares, epoch = 0, "
                      "token = excluded.token", (job, world, spares, token_hash))])

    def add_rank(self, job: str, world: int, rank: int, ports: dict[str, int]) -> None:
        self._write([("INSERT OR IGNORE INTO jobs (job, world) VALUES (?, ?)", (job, world)),
                     ("DELETE FROM ranks WHERE job = ? AND rank = ?", (job, rank)),
                     ("INSERT INTO ranks VALUES (?, ?, ?, ?)", [(job, rank, d, p) for d, p in ports.items()])])

    def remove_rank(self, job: str, rank: int) -> None:
        self._write([("DELETE FROM ranks WHERE job = ? AND rank = ?", (job, rank))])

    def remove_job(self, job: str) -> None:
        self._write([("DELETE FROM ranks WHERE job = ?", (job,)), ("DELETE FROM jobs WHERE job = ?", (job,))])

    def failover(self, job: str, rank: int, spare: int, epoch: int, states: dict[str, dict[int, int]],
                 until: dict[tuple[str, int], float], counters: dict[str, float] | None = None) -> None:
        """Spare ``spare`` becomes ``rank`` (its ports are the rank's now), the job's epoch, and the
        rewired circuits, in one transaction."""
        self._write([("DELETE FROM ranks WHERE job = ? AND rank = ?", (job, rank)),
                     ("UPDATE ranks SET rank = ? WHERE job = ? AND rank = ?", (rank, job, spare)),
                     ("UPDATE jobs SET epoch = ? WHERE job = ?", (epoch, job)),
                     *self._switch_statements(states, until, counters)])

    # -- counters (metrics that survive a restart) ----------------------------------------------------
    def counters(self) -> dict[str, float]:
        return dict(self.db.execute("SELECT name, value FROM counters"))

    @staticmethod
    def _counter_statements(counters: dict[str, float]) -> list[tuple[str, tuple | list]]:
        if not counters:
            return []
        return [("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                 list(counters.items()))]

    def add(self, name: str, value: float = 1.0) -> None:
        self._write(self._counter_statements({name: value}))
