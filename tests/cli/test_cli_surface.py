"""The CLI surface is a contract: every verb and every flag (old spellings included) is pinned here.

A change to the surface fails this test; if it is meant, regenerate the snapshot with
``.venv/bin/python tests/cli/test_cli_surface.py > tests/cli/data/cli_surface.json`` and say in the
change why (a renamed flag keeps its old spelling as a hidden option; see ``cli/options.renamed``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

SNAPSHOT = Path(__file__).resolve().parent / "data" / "cli_surface.json"


def surface() -> dict[str, dict[str, list[str]]]:
    """Per verb (``"stragglar sweep"``), its arguments, visible flags and hidden (old) flags."""
    from lightrail.cli import app

    def walk(command, path):
        if hasattr(command, "commands"):
            found = {}
            for name, sub in sorted(command.commands.items()):
                found.update(walk(sub, [*path, name]))
            return found
        entry = {"arguments": [], "flags": [], "hidden": []}
        for p in command.params:
            if p.param_type_name == "argument":
                entry["arguments"].append(p.name.upper())
            else:
                names = [*p.opts, *p.secondary_opts]
                entry["hidden" if p.hidden else "flags"].extend(names)
        return {" ".join(path): {k: sorted(v) for k, v in entry.items()}}

    return walk(typer.main.get_command(app), [])


def test_every_verb_and_flag_is_pinned():
    pinned = json.loads(SNAPSHOT.read_text())
    now = surface()
    assert sorted(now) == sorted(pinned), "verbs added or removed"
    for verb, entry in pinned.items():
        assert now[verb] == entry, verb


OLD_SPELLINGS = {"--delay", "--delays", "--reconfig-delay", "--at-delay", "--kill-at", "--iters"}
"""Flags renamed to one spelling per idea, kept hidden so yesterday's commands still run."""


def test_one_spelling_per_idea():
    """The OCS delay is --ocs-delay(s) and the straggler's lateness --straggler-delay(s) wherever they are
    visible; --delay and --delays survive only as hidden old spellings. When a kill strikes is --kill-at-<unit>
    (step, round, epoch), and timed trials are --repeats (stragglar run, moe bench)."""
    for verb, entry in surface().items():
        assert not OLD_SPELLINGS & set(entry["flags"]), verb
        for old in entry["hidden"]:
            assert old in OLD_SPELLINGS, (verb, old)


if __name__ == "__main__":
    print(json.dumps(surface(), indent=1))
