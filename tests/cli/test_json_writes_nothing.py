"""``--json`` prints one JSON object and writes no files unless ``--out`` is given; with ``--out`` the files
are written as without ``--json``. Every verb that has both flags is either run here or, when it needs
processes (torch, gloo), checked to route its writes through the same rule."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from lightrail.cli import app

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "debug-tiny.yaml")
runner = CliRunner()

CHEAP = {
    "simulate": ["simulate", TINY],
    "sweep": ["sweep", TINY, "--ocs-delays", "0,1ms"],
    "collective-sweep": ["collective-sweep", "--ranks", "8", "--sizes", "1KiB,1MiB", "--algo", "ring"],
    "study collectives": ["study", "collectives", "--ops", "allreduce", "--ranks", "8", "--sizes", "1KiB,1MiB",
                          "--ocs-delays", "0,1ms"],
    "study scaleup": ["study", "scaleup", "--racks", "2", "--requests", "50"],
    "study fl": ["study", "fl", "--clients", "200", "--jobs", "3"],
    "stragglar sweep": ["stragglar", "sweep", "--ranks", "4,8", "--straggler-delays", "0,1ms",
                        "--topologies", "switch,ring"],
}
"""Small runs of every cheap verb that writes files; the sweep file's case is in tests/studies/test_sweep.py."""
HEAVY = {"moe bench", "train-demo"}
"""Verbs that start processes; their command must still go through ``writes_files``."""
EXPORTERS = {"export astra-sim"}
"""Verbs whose output is the files themselves (their JSON lists what they wrote)."""


def _commands(group: typer.Typer, prefix: str = ""):
    for info in group.registered_commands:
        yield (prefix + (info.name or info.callback.__name__)).strip(), info.callback
    for sub in group.registered_groups:
        yield from _commands(sub.typer_instance, prefix + sub.name + " ")


def _has(callback, flag: str) -> bool:
    source = inspect.getsource(callback)
    return f'"{flag}"' in source or (flag == "--json" and "JsonOut" in source) or (
        flag == "--out" and "result_out(" in source)  # options.result_out: an --out that writes only when given


@pytest.mark.parametrize("verb", sorted(CHEAP))
def test_json_alone_writes_no_file_and_json_with_out_does(verb, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*CHEAP[verb], "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert list(tmp_path.rglob("*")) == []
    result = runner.invoke(app, [*CHEAP[verb], "--json", "--out", "given"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert any((tmp_path / "given").iterdir())


def test_every_verb_with_json_and_out_follows_the_rule():
    verbs = {name: cb for name, cb in _commands(app) if _has(cb, "--out") and "JsonOut" in str(
        inspect.signature(cb).parameters.get("as_json", ""))}
    rule = ("writes_files(", "output_folder(", 'given_on_command_line("out_dir")', "if out_dir is not None",
            "save_result(")
    for name, cb in verbs.items():
        if name in EXPORTERS:
            continue
        source = inspect.getsource(cb)
        helpers = "".join(inspect.getsource(f) for f in vars(inspect.getmodule(cb)).values()
                          if inspect.isfunction(f) and f.__module__ == cb.__module__ and f.__name__.startswith("_"))
        assert any(r in source + helpers for r in rule), f"{name}: --json must write nothing without --out"
    assert set(CHEAP) | HEAVY <= set(verbs) | {"sweep"}
