"""lightrail/atomic.py: a file is written whole or not at all, with the usual permissions; ``durable`` syncs the
file before the rename and its folder after; reports and the FL leaf's state go through the same helper."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightrail import atomic
from lightrail.atomic import write_atomic, write_bytes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_writes_the_whole_file_with_the_usual_permissions_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "new" / "a.json"  # the folder is made
    assert write_bytes(target, b"{}\n") == target
    assert target.read_bytes() == b"{}\n"
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def half(tmp: Path) -> None:
        tmp.write_text("ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


@pytest.mark.parametrize("durable", [False, True])
def test_durable_syncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch, durable):
    target = tmp_path / "state.json"
    target.write_text("old")
    synced = []
    monkeypatch.setattr(atomic, "_fsync", lambda path: synced.append((Path(path), target.read_text())))
    write_bytes(target, b"new", durable=durable)
    assert target.read_text() == "new"
    if not durable:
        assert synced == []
        return
    (file, seen_then), (folder, seen_after) = synced
    assert file.parent == tmp_path and file.name.startswith(".state.json.") and seen_then == "old"
    assert folder == tmp_path and seen_after == "new"


def test_reports_and_the_fl_leafs_state_use_the_same_helper(tmp_path, monkeypatch):
    from lightrail.fl.param_leaf import LeafState
    from lightrail.report import files

    assert files.write_atomic is write_atomic
    synced = []
    monkeypatch.setattr(atomic, "_fsync", lambda path: synced.append(Path(path)))
    leaf = LeafState("http://127.0.0.1:1", state=tmp_path / "leaf")
    assert (tmp_path / "leaf" / "leaf.json").exists() and leaf.leaf_id.startswith("leaf-")
    assert synced[-1] == tmp_path / "leaf"  # durable: its folder synced after the rename
    files.write_text(tmp_path / "r.txt", "report")
    assert (tmp_path / "r.txt").read_text() == "report" and len(synced) == 2  # a report is not synced
