"""No silent rollback (issue 31 item 4): ``controller serve`` refuses, in one line with exit 2 and nothing written, a
state file older than the epoch the controller acknowledged (a missing or damaged WAL, a zero-length or restored
file) unless ``--accept-state-rollback``, and a state file that is not a regular file, is not a database, or sits
on a full disk."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import LightrailError
from lightrail.runtime.controller import store as store_module
from lightrail.runtime.controller.store import Store, check_state, epoch_path

runner = CliRunner()


@pytest.fixture
def no_serve(monkeypatch):
    """If the checks wrongly pass, record the call instead of serving forever."""
    calls = []
    monkeypatch.setattr("lightrail.runtime.controller.serve.serve", lambda cfg, state, **kw: calls.append(kw))
    return calls


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def _refused(state: Path, *extra: str, says: str):
    before = _files(state.parent) if state.parent.exists() else {}
    done = runner.invoke(app, ["controller", "serve", "--state", str(state), "--port", "0", "--admin-port", "0",
                               *extra])
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert done.exit_code == 2 and len(lines) == 1 and "--state" in lines[0] and says in lines[0], done.output
    assert "Traceback" not in done.output
    assert (_files(state.parent) if state.parent.exists() else {}) == before  # nothing written
    return lines[0]


def _written(state: Path, n: int) -> Store:
    """A store on ``state`` with ``n`` acknowledged writes, still open (its WAL not checkpointed)."""
    s = Store(state)
    for i in range(n):
        s.register_job(f"j{i}", 2, 0, "0" * 64)
    return s


def test_a_state_file_older_than_its_epoch_is_refused_naming_the_flag(tmp_path, no_serve):
    state = tmp_path / "c.db"
    s = _written(state, 1)
    s.close()  # checkpointed: the file holds epoch 1
    shutil.copy(state, tmp_path / "old.db")
    s = _written(state, 3)
    s.close()
    assert epoch_path(state).read_text().strip() == "4"
    shutil.copy(tmp_path / "old.db", state)  # restored from an older copy
    (tmp_path / "old.db").unlink()
    line = _refused(state, says="--accept-state-rollback")
    assert "epoch 1 < 4" in line and str(epoch_path(state)) in line
    done = runner.invoke(app, ["controller", "serve", "--state", str(state), "--port", "0", "--admin-port", "0",
                               "--accept-state-rollback"])
    assert done.exit_code == 0 and no_serve == [{"accept_rollback": True}], done.output


def test_a_lost_wal_a_zero_length_file_and_a_bad_epoch_file_are_refused(tmp_path, no_serve):
    state = tmp_path / "c.db"
    s = _written(state, 3)  # a crash: the writes live in the WAL only
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    shutil.copy(state, crashed / "c.db")  # the main file without its WAL
    shutil.copy(epoch_path(state), epoch_path(crashed / "c.db"))
    s.close()
    _refused(crashed / "c.db", says="--accept-state-rollback")
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "c.db").write_bytes(b"")
    epoch_path(zero / "c.db").write_text("5\n")
    _refused(zero / "c.db", says="epoch 0 < 5")
    epoch_path(zero / "c.db").write_text("five\n")
    _refused(zero / "c.db", says="holds no epoch")


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "corrupt"])
def test_non_regular_and_corrupt_state_files_are_one_line_exit_2(tmp_path, no_serve, kind):
    if kind == "dev-zero":
        _refused(Path("/dev/zero"), says="not a regular file")
        return
    state = tmp_path / "c.db"
    if kind == "fifo":
        os.mkfifo(state)
        _refused(state, says="not a regular file")
    else:
        state.write_bytes(b"this is not a database, " * 400)
        _refused(state, says="not a usable controller state")


def test_a_full_disk_at_start_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "_free_bytes", lambda directory: 4096)
    with pytest.raises(LightrailError) as e:
        check_state(tmp_path / "c.db")
    assert e.value.field == "--state" and "full" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_serve_on_a_rolled_back_state_exits_2_naming_the_flag(tmp_path):
    """The contract, through the real entry point."""
    state = tmp_path / "c.db"
    _written(state, 2).close()
    epoch_path(state).write_text("7\n")
    done = subprocess.run([sys.executable, "-m", "lightrail.cli", "controller", "serve", "--state", str(state),
                           "--port", "0", "--admin-port", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--accept-state-rollback" in done.stderr + done.stdout
    assert not Path(f"{state}.lock").exists()
