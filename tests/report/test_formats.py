"""``--format png|svg|pdf`` on the verbs that draw static figures: the files come in that format, and a
format nobody draws is one line naming the flag, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lightrail.cli import app

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "debug-tiny.yaml")
runner = CliRunner()
MAGIC = {"png": b"\x89PNG", "svg": b"<?xml", "pdf": b"%PDF"}

VERBS = {
    "simulate": (["simulate", TINY], ["breakdown", "overhead"]),
    "sweep": (["sweep", TINY, "--ocs-delays", "0,1ms"], ["overhead"]),
    "collective-sweep": (["collective-sweep", "--ranks", "8", "--sizes", "1KiB,1MiB", "--algo", "ring"], ["sweep"]),
    "study collectives": (["study", "collectives", "--ops", "allreduce", "--ranks", "8", "--sizes", "1KiB,1MiB",
                           "--ocs-delays", "0,1ms"], ["heatmap-allreduce"]),
}


@pytest.mark.parametrize("verb, fmt", [("simulate", "pdf"), ("sweep", "svg"), ("collective-sweep", "pdf"),
                                       ("study collectives", "svg")])
def test_figures_come_in_the_asked_format(verb, fmt, tmp_path):
    args, figures = VERBS[verb]
    result = runner.invoke(app, [*args, "--format", fmt, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in figures:
        assert (tmp_path / f"{name}.{fmt}").read_bytes().startswith(MAGIC[fmt])
        assert not (tmp_path / f"{name}.png").exists()


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_unknown_format_is_one_line_naming_the_flag(verb, tmp_path):
    args, _ = VERBS[verb]
    result = runner.invoke(app, [*args, "--format", "gif", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--format" in result.output
    assert result.output.strip().count("\n") == 0
    assert not (tmp_path / "o").exists()
