"""Lazy verbs (issue 33): ``lightrail <verb>`` imports only that verb's modules (``lightrail.cli.VERBS``), so a
missing import, or a verb left out of the table, would show only in a fresh process; these tests run one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

import lightrail.cli
from lightrail.cli import VERB_MODULES, VERBS, app

PROBE = """
import contextlib, io, json, sys
import lightrail.cli

found = {}
for argv in json.loads(sys.argv[1]):
    sys.argv = ["lightrail", *argv]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            lightrail.cli.main()
        except SystemExit as e:
            code = e.code
        else:
            code = 0
    found[" ".join(argv)] = [code, out.getvalue()]
found["modules"] = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("lightrail.cli."))
print(json.dumps(found))
"""


def _tree() -> dict[str, list[str]]:
    """Each verb of the whole app and the paths of its commands (``["te", "run"]``)."""
    root = typer.main.get_command(app)
    return {name: [[name, sub] for sub in getattr(cmd, "commands", {})] for name, cmd in root.commands.items()}


def test_the_table_names_every_verb_and_the_modules_that_register_it():
    """Each verb's commands are defined in the modules ``VERBS`` gives for it (a callback's module is where its
    command was registered), and every verb module appears in the table."""
    root = typer.main.get_command(app)
    assert sorted(VERBS) == sorted(root.commands)
    for name, command in root.commands.items():
        commands = list(getattr(command, "commands", {}).values()) or [command]
        defined = {c.callback.__module__.removeprefix("lightrail.cli.") for c in commands}
        assert defined <= set(VERBS[name]), name
    assert {m for modules in VERBS.values() for m in modules} == set(VERB_MODULES)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_s_help_in_a_fresh_process_is_the_whole_app_s(verb):
    """``lightrail <verb> --help`` (and each subcommand's) loads only the verb's modules and prints what the app
    with every verb loaded prints."""
    paths = [[verb], *_tree()[verb]]
    argvs = [[*path, "--help"] for path in paths]
    env = {"COLUMNS": "100", "TERM": "dumb"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          check=True, timeout=120, env={**os.environ, **env})
    found = json.loads(done.stdout.splitlines()[-1])
    runner = CliRunner()
    for argv in argvs:
        want = runner.invoke(app, argv, env=env)
        code, output = found[" ".join(argv)]
        assert (code or 0, output) == (want.exit_code, want.output), argv
        assert code in (0, None) and "Usage: lightrail" in output, argv
    loaded = set(found["modules"]) & set(VERB_MODULES)
    assert set(VERBS[verb]) <= loaded and len(loaded) < len(VERB_MODULES) / 2  # controller imports train_demo


def test_a_command_line_without_a_known_verb_loads_every_verb():
    """``--help``, an unknown verb (Typer suggests the near ones) and no verb at all see the whole app."""
    argvs = [["--help"], ["simulat"], []]
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          check=True, timeout=120)
    found = json.loads(done.stdout.splitlines()[-1])
    assert set(VERB_MODULES) <= set(found["modules"])
    assert "simulate" in found["--help"][1] and "train-demo" in found["--help"][1]
    assert found["simulat"][0] == 2


def test_reading_the_app_loads_every_verb_once():
    """What tests and ``CliRunner`` do: read the app's tree, which imports every verb module (this process did)."""
    assert lightrail.cli.app._loaded
    assert all(f"lightrail.cli.{m}" in sys.modules for m in VERB_MODULES)
    names = [c.name for c in app.registered_commands] + [g.name for g in app.registered_groups]
    assert sorted(names) == sorted(set(names)) == sorted(VERBS)  # each registered once
