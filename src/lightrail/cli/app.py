"""The ``lightrail`` Typer app, its consoles, and the one error handler every verb wears.

Every ``LightrailError`` becomes one line on stderr and exit code 2, with no traceback.

Lean start (issue 33): the app imports its verbs' modules only when its command tree is first read (all of
them: ``--help``, ``CliRunner``), unless :func:`lightrail.cli.main` loaded just the one verb a command line names;
the consoles import rich on their first use, so a ``--json`` run never does.
"""

from __future__ import annotations

import functools
import importlib
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from lightrail import __version__
from lightrail.cli.coerce import lighten
from lightrail.errors import LightrailError, ScenarioError

EXAMPLES = """Examples:

lightrail simulate examples/debug-tiny.yaml      # electrical vs photonic

lightrail sweep examples/sweeps/debug.yaml --local  # a grid of scenarios

lightrail collective --op allreduce -n 64 -s 64MiB  # one collective, timed

lightrail stragglar run -n 4 --out out/straggler  # measured on gloo

lightrail check examples/debug-tiny.yaml --json  # validate a scenario

lightrail simulate -h                            # a verb's flags
"""
"""The top-level help's epilog (Typer keeps the blank lines; each line stays one line in the help)."""

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
"""``-h`` as well as ``--help``, as most command-line tools have; click hands it down to every verb."""


class LeanCommand(TyperCommand):
    """A verb whose plain options Typer coerces without pydantic (:mod:`lightrail.cli.coerce`)."""

    def get_params(self, ctx):
        return lighten(super().get_params(ctx))


class LeanGroup(TyperGroup):
    """A verb group (or the root) whose plain options Typer coerces without pydantic."""

    def get_params(self, ctx):
        return lighten(super().get_params(ctx))


class LeanTyper(typer.Typer):
    """A Typer app whose groups and commands are :class:`LeanGroup` and :class:`LeanCommand` (unless told
    otherwise): every verb group's app is one."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("cls", LeanGroup)
        super().__init__(*args, **kwargs)

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", LeanCommand)
        return super().command(*args, **kwargs)


class VerbApp(LeanTyper):
    """The root Typer app, whose verbs register themselves when their modules (``lightrail.cli.<module>``) are
    imported. Reading the command tree (``registered_commands``, as Typer does to build it) imports every verb
    module first, unless :meth:`load` already imported the ones a command line needs."""

    def __init__(self, *args, **kwargs):
        self._loaded = self._registering = False
        super().__init__(*args, **kwargs)

    def command(self, *args, **kwargs):
        decorator = super().command(*args, **kwargs)

        def register(fn):
            with self._registration():
                return decorator(fn)

        return register

    def add_typer(self, *args, **kwargs) -> None:
        with self._registration():
            super().add_typer(*args, **kwargs)

    @contextmanager
    def _registration(self):
        """A verb registering itself adds to the tree without reading it (which would import every verb)."""
        self._registering = True
        try:
            yield
        finally:
            self._registering = False

    def load(self, modules: Iterable[str] | None = None) -> None:
        """Import the verb modules ``modules`` (names under ``lightrail.cli``; None: all of them); from then on
        reading the tree imports no more."""
        self._loaded = True
        if modules is None:
            from lightrail.cli import VERB_MODULES

            modules = VERB_MODULES
        for name in modules:
            importlib.import_module(f"lightrail.cli.{name}")

    def _read(self, value: list) -> list:
        if not self._loaded and not self._registering:
            self.load()
        return value

    registered_commands = property(lambda self: self._read(self._commands),
                                   lambda self, value: setattr(self, "_commands", value))
    registered_groups = property(lambda self: self._read(self._groups),
                                 lambda self, value: setattr(self, "_groups", value))


class _StartEnviron(Mapping):
    """``os.environ`` for a console made on first use, which reads the environment while it is made as it was when
    the CLI started (its size, colours) and live afterwards, as a console made at start would (``CliRunner``
    changes ``COLUMNS`` for one invocation in a test process)."""

    AT_START = dict(os.environ)

    def __init__(self):
        self.making = True

    def _now(self) -> Mapping:
        return self.AT_START if self.making else os.environ

    def __getitem__(self, key: str) -> str:
        return self._now()[key]

    def __iter__(self):
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


class _LazyConsole:
    """A rich console made on first use (rich costs ~15 ms to import, and ``--json`` prints none): attributes
    are the console's; :attr:`console` is the console itself, for rich objects that take one."""

    def __init__(self, make):
        self._make = make
        self._console = None

    @property
    def console(self):
        if self._console is None:
            environ = _StartEnviron()
            self._console = self._make(_environ=environ)
            environ.making = False
        return self._console

    def __getattr__(self, name: str):
        return getattr(self.console, name)


def _table_console(**kwargs):
    from lightrail.report.format import TableConsole

    return TableConsole(**kwargs)


def _stderr_console(**kwargs):
    from rich.console import Console

    return Console(stderr=True, **kwargs)


app = VerbApp(name="lightrail", no_args_is_help=True, context_settings=HELP_OPTIONS, epilog=EXAMPLES,
              help="Toolkit and control plane for reconfigurable photonic networks in ML clusters.")
out = _LazyConsole(_table_console)
"""stdout: tables are never cut short (folded in a terminal, printed at full width when piped)."""
err = _LazyConsole(_stderr_console)
"""stderr: errors, notes and progress bars."""


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


def _check_finite(kwargs: dict) -> None:
    """Refuse a NaN in any float option, and an infinity unless the option's help says what ``inf`` means
    (``--mtbf-hours``: no failures); Typer reads both from ``nan`` and ``inf`` without complaint. A ``--seed``
    must be one numpy takes."""
    ctx = current_context()
    params = {p.name: p for p in ctx.command.params} if ctx is not None else {}
    for name, value in kwargs.items():
        if not isinstance(value, float) or math.isfinite(value):
            continue
        help_text = getattr(params.get(name), "help", None) or ""
        if math.isinf(value) and re.search(r"\binf\b", help_text):
            continue
        raise ScenarioError(f"{value} is not a finite number", field=_flag(name), fix="give a finite number")
    seed = kwargs.get("seed")
    if isinstance(seed, int) and not 0 <= seed < 2**63:  # numpy's generators take non-negative 64-bit seeds
        raise ScenarioError(f"seed {seed}", field=_flag("seed"), fix="use a seed in 0..2^63-1, e.g. 0")


def friendly(fn):
    """Turn a LightrailError into ``error: <field>: <message>; <fix>`` and exit code 2. Before the command
    runs, float options are checked finite (:func:`_check_finite`) and a ``--out`` folder given on the command
    line is proven writable, so no verb discovers it after its work."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            _check_finite(kwargs)
            if kwargs.get("out_dir") is not None and given_on_command_line("out_dir"):
                from lightrail.report.files import check_writable  # a --out given must take files: say so first

                check_writable(kwargs["out_dir"], field=_flag("out_dir"))
            return fn(*args, **kwargs)
        except LightrailError as e:
            from rich.markup import escape

            e.field = _flag(e.field)
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except MemoryError:  # a size no bound caught yet: one line, not a traceback (issue 31)
            err.print("[bold red]error:[/] out of memory: the input is too large for this machine (a topology, "
                      "grid, range or model size); make it smaller (docs/limits.md lists the bounds)", highlight=False,
                      soft_wrap=True)
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
