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

No silent rollback (issue 31): every write also bumps an *epoch* in the file, and once committed the epoch is
written to ``<state>.epoch`` and fsynced, outside the database. A state file older than what was acknowledged (a
lost or damaged WAL, a zero-length or restored file) has a smaller epoch than that file: :func:`check_state`
refuses it before anything is written, naming ``--accept-state-rollback``; it also refuses non-regular,
unreadable and corrupt files and a full disk, in one line.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from lightrail.errors import InfeasibleError, ScenarioError

__all__ = ["Store", "check_state", "epoch_path"]

MIN_FREE_BYTES = 1 << 20
"""Free space the state file's file system must have at start (SQLite's WAL and the epoch file grow into it)."""
ROLLBACK_FLAG = "--accept-state-rollback"

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
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
_BUMP = ("INSERT INTO meta VALUES ('epoch', 1) ON CONFLICT(name) DO UPDATE SET value = value + 1", ())


def epoch_path(state: str | Path) -> Path:
    """Where the acknowledged epoch of ``state`` is kept (beside it, outside the database)."""
    return Path(f"{state}.epoch")


def _read_epoch(path: Path) -> int | None:
    """The epoch file's value (None: no file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > 64:
        raise ScenarioError(f"{path} is not an epoch file", field="--state",
                            fix=f"remove it, or pass {ROLLBACK_FLAG} to rewrite it from the state file")
    text = path.read_text(errors="replace").strip()
    if not text.isdigit():
        raise ScenarioError(f"{path} holds no epoch ({text[:20]!r})", field="--state",
                            fix=f"pass {ROLLBACK_FLAG} to rewrite it from the state file")
    return int(text)


def check_state(path: str | Path, *, accept_rollback: bool = False) -> None:
    """Refuse, before anything is written, a state file the controller must not start on: not a regular file
    (``/dev/zero``, a FIFO), unreadable, not a database or damaged, on a full disk, or older than the epoch it
    acknowledged (unless ``accept_rollback``). One :class:`~lightrail.errors.LightrailError` naming ``--state``."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise ScenarioError(f"cannot read the state file {path}: {e.strerror or e}", field="--state",
                            fix="give a readable file") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ScenarioError(f"the state file {path} is not a regular file", field="--state",
                            fix="give the path of a file (it is created if missing)")
    parent = path.parent if str(path.parent) else Path(".")
    free = _free_bytes(parent)
    if free is not None and free < MIN_FREE_BYTES:
        raise ScenarioError(f"the disk holding {path} is full ({free} bytes free)", field="--state",
                            fix="free some space, or give a --state on another disk")
    acknowledged = None if accept_rollback else _read_epoch(epoch_path(path))  # first: it never passes the file's
    have = 0 if st is None else _file_epoch(path)
    if acknowledged is not None and have < acknowledged:
        raise InfeasibleError(f"the state file {path} is older than the controller acknowledged (epoch {have} < "
                              f"{acknowledged} in {epoch_path(path)}): changes were lost (a missing or damaged WAL, "
                              f"a truncated or restored file)", field="--state",
                              fix=f"restore the newer file, or pass {ROLLBACK_FLAG} to start from this one")


def _free_bytes(directory: Path) -> int | None:
    """Bytes free to us on the file system of ``directory`` (or its nearest existing parent); None if unknown."""
    existing = next((p for p in [directory, *directory.parents] if p.exists()), Path("."))
    try:
        fs = os.statvfs(existing)
    except OSError:
        return None
    return fs.f_bavail * fs.f_frsize


def _file_epoch(path: Path) -> int:
    """The epoch a state file holds (0 before any write, or in a file from before epochs), read without writing;
    a file SQLite cannot read or check is a ScenarioError."""
    wal = Path(f"{path}-wal")
    with tempfile.TemporaryDirectory(prefix="lightrail-state-check-") as tmp:
        if wal.exists():  # read with its WAL, on a copy: SQLite would write the -shm index beside the original
            copy = Path(tmp) / "state.db"
            shutil.copyfile(path, copy)
            shutil.copyfile(wal, Path(f"{copy}-wal"))
            return _epoch_of(f"file:{copy}", path)
        return _epoch_of(f"file:{path}?immutable=1", path)  # no WAL: the file is the whole state


def _epoch_of(uri: str, path: Path) -> int:
    """The epoch in the database at ``uri`` (``path`` names it in errors), after SQLite's quick check."""
    try:
        db = sqlite3.connect(uri, uri=True, timeout=0.5)
        try:
            bad = db.execute("PRAGMA quick_check(1)").fetchone()[0]
            if bad != "ok":
                raise sqlite3.DatabaseError(bad)
            known = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
            row = db.execute("SELECT value FROM meta WHERE name = 'epoch'").fetchone() if known else None
            return int(row[0]) if row else 0
        finally:
            db.close()
    except sqlite3.Error as e:
        raise ScenarioError(f"the state file {path} is not a usable controller state ({e})", field="--state",
                            fix="restore it from a backup, or give a new --state (the controller starts empty)"
                            ) from None


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
        row = self.db.execute("SELECT value FROM meta WHERE name = 'epoch'").fetchone()
        self.epoch = int(row[0]) if row else 0
        self._epoch_fd = None
        if self.path != ":memory:":  # what this file holds now is what the controller acknowledges from here on
            self._epoch_fd = os.open(epoch_path(self.path), os.O_RDWR | os.O_CREAT, 0o644)
            self._save_epoch()

    def _save_epoch(self) -> None:
        """The epoch, written over the file and fsynced (fixed width: one write, never a shorter tail)."""
        os.pwrite(self._epoch_fd, f"{self.epoch:>20}\n".encode(), 0)
        os.fdatasync(self._epoch_fd)

    def close(self) -> None:
        self.db.close()
        if self._epoch_fd is not None:
            os.close(self._epoch_fd)
            self._epoch_fd = None

    def _write(self, statements: Iterable[tuple[str, tuple | list]]) -> None:
        """Run ``statements`` (sql, params; params a list of tuples runs executemany) in one transaction,
        or none of them: after ``attempts`` lock timeouts, InfeasibleError naming ``state``."""
        statements = [*statements, _BUMP]
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
                self.epoch += 1
                if self._epoch_fd is not None:
                    self._save_epoch()
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

    def add_counters(self, counters: dict[str, float]) -> None:
        """Add to several counters in one transaction."""
        self._write(self._counter_statements(counters))
