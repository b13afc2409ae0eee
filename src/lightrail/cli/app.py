"""The ``lightrail`` Typer app, its consoles, and the one error handler every verb wears.

Every ``LightrailError`` becomes one line on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import functools
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from lightrail import __version__
from lightrail.errors import LightrailError

app = typer.Typer(name="lightrail", no_args_is_help=True, add_completion=False,
                  help="Toolkit and control plane for reconfigurable photonic networks in ML clusters.")
out = Console()
err = Console(stderr=True)


_FLAGS = {"algo": "--algo", "op": "--op", "ranks": "--ranks", "root": "--root", "shape": "--shape",
          "oversubscription": "--oversubscription"}


def friendly(fn):
    """Turn a LightrailError into ``error: <field>: <message>; <fix>`` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LightrailError as e:
            if e.field in _FLAGS:  # errors from the library name its arguments; show the flag instead
                e.field = _FLAGS[e.field]
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


@app.callback(invoke_without_command=True)
def _root(version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False):
    if version:
        out.print(f"lightrail {__version__}")
        raise typer.Exit()
