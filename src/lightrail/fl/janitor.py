"""The supervisor's janitor: cleans up after an ``fl serve`` that was killed without a chance to (SIGKILL, OOM).

``python -m lightrail.fl.janitor [--dir DIR]`` runs in its own session with its stdin a pipe from the supervisor,
which writes ``pid <pid> <start-time>`` for every child it starts and ``done`` once it stopped them itself. When
the pipe closes without ``done`` (the supervisor died), the children already got their death signal
(``PR_SET_PDEATHSIG``); the janitor waits up to ``--grace`` seconds for them, SIGKILLs those left (a process is
ours only if its start time is the one reported, so a reused pid is left alone) and removes ``DIR``, the
supervisor's temporary directory. Its only job is to make a killed supervisor leave nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

__all__ = ["start_time", "main"]


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (``/proc/<pid>/stat`` field 22); None if it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _alive(pids: dict[int, str]) -> list[int]:
    return [p for p, t in pids.items() if start_time(p) == t]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lightrail.fl.janitor")
    p.add_argument("--dir", default=None, help="the supervisor's temporary directory, removed at the end")
    p.add_argument("--grace", type=float, default=3.0, help="seconds the children get to stop on their own")
    a = p.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # a Ctrl-C meant for the supervisor is not ours
        signal.signal(sig, signal.SIG_IGN)
    pids: dict[int, str] = {}
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["done"]:
            return 0
        if len(words) == 3 and words[0] == "pid":
            pids[int(words[1])] = words[2]
    deadline = time.monotonic() + a.grace
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _alive(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    if a.dir:
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
