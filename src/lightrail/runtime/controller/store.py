"""The controller's durable state in SQLite (WAL): lit circuits per device and port ownership per job.

Every change is committed before the controller acknowledges it, so a controller killed mid-job and
started again on the same file reports the same circuits and owners. WAL keeps a commit to one
fsync-free append (``synchronous=NORMAL``): well under a millisecond on loopback-scale workloads.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS circuits (device TEXT NOT NULL, input INTEGER NOT NULL, output INTEGER NOT NULL,
                                     PRIMARY KEY (device, input));
CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, world INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ranks (job TEXT NOT NULL, rank INTEGER NOT NULL, device TEXT NOT NULL, port INTEGER NOT NULL,
                                  PRIMARY KEY (job, rank, device), UNIQUE (device, port));
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value REAL NOT NULL);
"""


class Store:
    """SQLite file (or ``:memory:``) holding circuits, jobs, rank ports and counters."""

    def __init__(self, path: str | Path = ":memory:"):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    # -- circuits -------------------------------------------------------------------------------------
    def circuits(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for device, i, o in self.db.execute("SELECT device, input, output FROM circuits ORDER BY device, input"):
            out.setdefault(device, {})[i] = o
        return out

    def set_circuits(self, device: str, state: dict[int, int]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM circuits WHERE device = ?", (device,))
            self.db.executemany("INSERT INTO circuits VALUES (?, ?, ?)", [(device, i, o) for i, o in state.items()])

    # -- jobs and ports -------------------------------------------------------------------------------
    def jobs(self) -> dict[str, dict]:
        out = {job: {"world": world, "ranks": {}} for job, world in self.db.execute("SELECT job, world FROM jobs")}
        for job, rank, device, port in self.db.execute("SELECT job, rank, device, port FROM ranks"):
            out[job]["ranks"].setdefault(rank, {})[device] = port
        return out

    def add_rank(self, job: str, world: int, rank: int, ports: dict[str, int]) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("INSERT OR IGNORE INTO jobs VALUES (?, ?)", (job, world))
            self.db.execute("DELETE FROM ranks WHERE job = ? AND rank = ?", (job, rank))
            self.db.executemany("INSERT INTO ranks VALUES (?, ?, ?, ?)",
                                [(job, rank, d, p) for d, p in ports.items()])

    def remove_rank(self, job: str, rank: int) -> None:
        self.db.execute("DELETE FROM ranks WHERE job = ? AND rank = ?", (job, rank))

    def remove_job(self, job: str) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM ranks WHERE job = ?", (job,))
            self.db.execute("DELETE FROM jobs WHERE job = ?", (job,))

    # -- counters (metrics that survive a restart) ----------------------------------------------------
    def counters(self) -> dict[str, float]:
        return dict(self.db.execute("SELECT name, value FROM counters"))

    def add(self, name: str, value: float = 1.0) -> None:
        self.db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + ?",
                        (name, value, value))
