"""Signals (issue 31 item 6): SIGTERM to ``train-demo`` mid-training stops the controller and every rank and removes
the controller's temporary state (before: the controller and 8 ranks trained on for ~100 s); SIGTERM to
``controller serve`` stops it with status 0. Processes are found by session (the test starts each in its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def _session(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``sid``."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_to_train_demo_leaves_no_process_and_no_state(tmp_path, until):
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-m", "lightrail.cli", "train-demo", "--steps", "200", "--spares", "1",
                             "--json", "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, cwd=tmp_path)
    try:
        # 8 ranks and a spare, forked by the launcher's fork server (whose command line they carry)
        until(lambda: sum("forkserver" in c for c in _session(proc.pid).values()) >= 1 + 9, "the ranks to start",
              timeout=120)
        controller = next(c for c in _session(proc.pid).values() if "controller serve" in c)
        state = Path(controller.split("--state ")[1].split()[0])
        assert state.exists()
        time.sleep(1.0)  # training
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
        until(lambda: not _session(proc.pid), "every process of the run to end", timeout=10)
        assert not state.parent.exists()  # the temporary state is gone
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("extra", [[], ["--spares", "1"]], ids=["processes", "elastic"])
def test_sigkill_of_train_demo_takes_every_process_along(tmp_path, until, extra):
    """A launcher killed outright runs no handler: its workers (whose parent is the fork server, not the
    launcher) watch it and die with it, as do the results' manager and the controller; the fork server, its
    keep-alive pipe closed by them all, ends too. Both launchers: ``run_processes`` (train-demo alternating
    replicas) and ``run_elastic`` (with a spare)."""
    pytest.importorskip("torch")
    proc = subprocess.Popen([sys.executable, "-m", "lightrail.cli", "train-demo", "--steps", "200", *extra,
                             "--json", "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, cwd=tmp_path)
    try:
        until(lambda: sum("forkserver" in c for c in _session(proc.pid).values()) >= 1 + 8, "the ranks to start",
              timeout=120)
        time.sleep(1.0)  # training
        proc.kill()
        assert proc.wait(10) == -signal.SIGKILL
        until(lambda: not _session(proc.pid), "every process of the run to end", timeout=15)
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_the_controller_cleanly(spawn, tmp_path):
    proc, _ = spawn(tmp_path / "c.db")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert (tmp_path / "c.db").exists() and Path(f"{tmp_path / 'c.db'}.epoch").exists()
