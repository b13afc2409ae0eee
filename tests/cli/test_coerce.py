"""The direct coercion of plain option values (``lightrail.cli.coerce``) gives what Typer's pydantic coercion gives:
the same value and type, or the same error."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.cli.app import LeanCommand
from lightrail.cli.coerce import _Direct, lighten

pytest.importorskip("typer._coercion")

VALUES = ["0", "7", "-3", "007", "+3", " 3", "3 ", "1_000", "12345678901234567890", "1.5", "-0.25", "1.", ".5",
          "1e3", "inf", "-inf", "nan", "abc", "", "-", "x/y", "~/a", "a b", "3.0", "1.2.3", "٣", "0x10", "true"]


def _command(annotation, got: list):
    """A command of one option ``--value`` of type ``annotation | None`` (as a verb's), recording what it gets."""

    def command(value=None):
        got.append(value)

    command.__annotations__["value"] = annotation | None
    return command


def _runner_values(annotation, raw):
    """Run a one-option command (Typer's coercion, then the lean one) on ``raw``; what the option received."""
    outcomes = []
    for cls in (None, LeanCommand):
        got = []
        cmd_app = typer.Typer()
        cmd_app.command(cls=cls)(_command(annotation, got))
        result = CliRunner().invoke(cmd_app, ["--value", raw])
        outcomes.append((result.exit_code, repr(got), [type(v).__name__ for v in got], result.output))
    return outcomes


@pytest.mark.parametrize("annotation", [str, int, float, Path])
@pytest.mark.parametrize("raw", VALUES)
def test_a_value_from_the_command_line_coerces_as_typer_coerces_it(annotation, raw):
    typer_way, lean_way = _runner_values(annotation, raw)
    assert lean_way == typer_way


def test_defaults_and_flags_coerce_as_typer_coerces_them():
    """Defaults are coerced too (an int default of a float option becomes a float); a bool flag stays a bool."""
    seen = []

    def cmd(ratio: float = 1, count: int = 2, name: str = "x", where: Path = Path("a"), flag: bool = False):
        seen.append([(v, type(v)) for v in (ratio, count, name, where, flag)])

    for cls in (None, LeanCommand):
        cmd_app = typer.Typer()
        cmd_app.command(cls=cls)(cmd)
        assert CliRunner().invoke(cmd_app, []).exit_code == 0
    assert seen[0] == seen[1]
    assert [t for _, t in seen[1]] == [float, int, str, type(Path("a")), bool]


def test_only_plain_options_get_the_direct_coercion():
    """Options with bounds, a parser or path checks keep Typer's coercion; the verbs' plain ones get the direct."""
    cmd_app = typer.Typer()

    @cmd_app.command(cls=LeanCommand)
    def cmd(a: Annotated[int, typer.Option(min=0)] = 1, b: Annotated[Path | None, typer.Option(exists=True)] = None,
            c: int = 1, d: Annotated[str, typer.Option(parser=str.upper)] = "x"):
        pass

    params = {p.name: p for p in lighten(typer.main.get_command(cmd_app).params)}
    assert {name for name in "abcd" if isinstance(params[name]._runtime_param, _Direct)} == {"c"}
    simulate = typer.main.get_command(app).commands["simulate"]
    lighten(simulate.params)
    assert all(isinstance(p._runtime_param, _Direct) for p in simulate.params)


def test_bounds_still_refuse_through_typer():
    cmd_app = typer.Typer()

    @cmd_app.command(cls=LeanCommand)
    def cmd(a: Annotated[int, typer.Option(min=0)] = 1):
        pass

    result = CliRunner().invoke(cmd_app, ["--a", "-1"])
    assert result.exit_code == 2 and "greater than or equal to 0" in result.output
