"""Output of the verbs: ``--json`` on stdout, where files go (``--out``, ``--html``), the result files of the
verbs that write only when asked, and progress bars on stderr.

Like :mod:`lightrail.cli.options`, the top level stays cheap (typer's console, no numpy, no rich.progress):
every verb imports it when the CLI starts; the report writers are imported inside the functions that call them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lightrail.cli.app import err, given_on_command_line

__all__ = ["html_report", "output_folder", "print_json", "progress_bar", "progress_steps", "save_result",
           "writes_files"]


def print_json(obj) -> None:
    """Every ``--json`` goes through here: strict JSON (non-finite floats as null, never ``Infinity``)."""
    from lightrail.report.files import dumps_json

    sys.stdout.write(dumps_json(obj) + "\n")


def output_folder(out_dir: Path | None, default: str, *, as_json: bool, html: bool = False) -> Path | None:
    """Where a verb writes its files: ``--out`` if given; else ``default``, except under ``--json`` (which
    prints and writes nothing) unless ``--html`` asks for a page."""
    if out_dir is not None:
        return out_dir
    return None if as_json and not html else Path(default)


def writes_files(as_json: bool, html: bool = False) -> bool:
    """Whether a verb with a default ``--out`` writes its files: always, except under ``--json`` (which prints
    and writes nothing) unless ``--out`` was typed or ``--html`` asks for a page."""
    return not as_json or html or given_on_command_line("out_dir")


def save_result(out_dir: Path | None, name: str, data: dict, *, quiet: bool = False) -> Path | None:
    """``--out`` of a :func:`result_out` verb: ``out_dir/name`` holds the same JSON ``--json`` prints (written
    atomically); ``None`` writes nothing. The folder was proven writable before the work (``@friendly``)."""
    if out_dir is None:
        return None
    from lightrail.report.files import write_json

    path = write_json(Path(out_dir) / name, data)
    if not quiet:
        err.print(f"wrote {path}", highlight=False)
    return path


def html_report(out_dir: Path | None, html: bool, *, quiet: bool = False) -> Path | None:
    """``--html``: ``out_dir/report.html``, from the files the verb has just written there."""
    if not html or out_dir is None:
        return None
    from lightrail.report.html import write_report

    path = write_report(out_dir)
    if not quiet:
        err.print(f"report: {path}", highlight=False)
    return path


class _NoProgress:
    """What a quiet run (``--json``) gets for a progress bar: the same calls, doing nothing, with no rich import."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, task, **kwargs) -> None:
        return None


def progress_bar(total: int, label: str, quiet: bool):
    """A rich progress bar on stderr (hidden when ``quiet`` or stderr is no terminal) and its task."""
    if quiet:
        return _NoProgress(), None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err.console, transient=True, disable=quiet or not err.is_terminal)
    return progress, progress.add_task(label, total=total)


@contextmanager
def progress_steps(total: int, label: str, quiet: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr for ``total`` steps; yields ``step(description)``, the ``progress`` callback
    the studies take (one call per finished step)."""
    progress, task = progress_bar(total, label, quiet)
    with progress:
        yield lambda description: progress.update(task, advance=1, description=description)
