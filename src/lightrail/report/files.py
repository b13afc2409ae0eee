"""Atomic output: every file is written beside its target and renamed into place (:func:`write_atomic`, the
house's one writer, from :mod:`lightrail.atomic`), JSON strict, folders proven writable before any work."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from lightrail.atomic import write_atomic
from lightrail.errors import ScenarioError

__all__ = ["check_writable", "dumps_json", "finite", "write_atomic", "write_json", "write_text"]


def finite(obj):
    """``obj`` with every non-finite float (inf, nan) replaced by None: JSON has no Infinity or NaN, and
    Python's ``json`` would print them anyway, which other parsers refuse."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps_json(obj, *, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (non-finite floats as null): the one way lightrail prints or writes JSON."""
    return json.dumps(finite(obj), indent=indent, allow_nan=False)


def check_writable(folder: str | Path, *, field: str = "--out") -> Path:
    """Prove, before any work, that files can be written in ``folder``, without writing anything there.

    The folder may not exist yet (it is made when the first file is written): then its nearest existing
    ancestor must be a writable folder. Writability is proven by a temporary file that is removed at once
    (``os.access`` says yes to root on a read-only file system)."""
    path = Path(folder)
    fix = "give a folder you can write to, e.g. --out out/run1"
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise ScenarioError(f"{str(path)!r} passes through a dangling link {str(probe)!r}", field=field, fix=fix)
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        what = "is a file" if probe == path else f"is inside {str(probe)!r}, which is not a folder"
        raise ScenarioError(f"{str(path)!r} {what}", field=field, fix=fix)
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ScenarioError(f"cannot write in {str(probe)!r}: {e.strerror or e}", field=field, fix=fix) from None
    return path


def write_text(path: Path, text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text))


def write_json(path: Path, obj) -> Path:
    return write_text(path, dumps_json(obj) + "\n")
