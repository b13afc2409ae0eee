"""The ``lightrail`` Typer app, its consoles, and the one error handler every verb wears.

Every ``LightrailError`` becomes one line on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import functools
import sys
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


def current_context():
    """The running command's context, or None.

    Typer 0.2x runs on its own copy of click (``typer._click``), whose context click's
    ``get_current_context`` cannot see; older Typer runs on click itself."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context
    return get_current_context(silent=True)


def given_on_command_line(name: str) -> bool:
    """Whether the running command's parameter ``name`` was typed (not left at its default)."""
    ctx = current_context()
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return source is not None and source.name == "COMMANDLINE"


def _flag(field: str | None) -> str | None:
    """The flag that sets a library argument: errors from the library name its arguments (``algo``,
    ``ranks``); when the running command has an option of that name, show the option (``--algo``)."""
    ctx = current_context()
    if ctx is None or not field or field.startswith("-"):
        return field
    for param in ctx.command.params:
        if param.name == field and param.param_type_name == "option":
            return max(param.opts, key=len)
    return field


def friendly(fn):
    """Turn a LightrailError into ``error: <field>: <message>; <fix>`` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LightrailError as e:
            e.field = _flag(e.field)
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def print_version() -> None:
    """``lightrail --version``'s one line (plain text: :func:`lightrail.cli.main` prints it before Typer runs)."""
    sys.stdout.write(f"lightrail {__version__}\n")


@app.callback(invoke_without_command=True)
def _root(version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False):
    if version:
        print_version()
        raise typer.Exit()
