"""Atomic files, the one way lightrail writes a file whole: beside its target, then renamed into place.

A reader sees the old file or the new one, never half of one (``rename(2)`` replaces its target atomically, POSIX).
Reports (:mod:`lightrail.report.files`) and the services' own state (the FL leaf's round buffers, ...) both write
through :func:`write_atomic`; a service passes ``durable=True``, which also fsyncs the file before the rename and
its folder after it, so a write that was acknowledged survives a crash of the machine, not only of the process
(the rename is durable only once the directory is synced: Linux ``fsync(2)``, "Calling fsync() does not
necessarily ensure that the entry in the directory containing the file has also reached disk").
Floor 0 of the house (``tests/test_layers.py``): it imports nothing of lightrail.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["write_atomic", "write_bytes"]


def _fsync(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, write: Callable[[Path], None], *, durable: bool = False) -> Path:
    """Call ``write(tmp)`` on a temporary file in ``path``'s folder (made if missing), then rename it to ``path``.

    The temporary file is hidden (``.name.XXXX``), gets the usual permissions (0666 less the umask) and is removed
    if ``write`` fails. ``durable``: fsync the file before the rename and the folder after it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix or ".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes owner-only files; give the usual permissions
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync(path.parent)
    return path


def write_bytes(path: str | Path, data: bytes, *, durable: bool = False) -> Path:
    """``data`` as the whole of ``path``, atomically (see :func:`write_atomic`)."""
    return write_atomic(path, lambda tmp: tmp.write_bytes(data), durable=durable)
