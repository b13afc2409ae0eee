"""The habits users bring from their other tools (issue 33 item 5): ``-h`` wherever ``--help`` works, Typer's
shell completion, examples in the top-level help, one flag name per idea (old names hidden, with a note), a sweep
with failed cells exits 1 unless ``--allow-failures``, and ``--out`` on every verb that produces data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lightrail.cli import app

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "debug-tiny.yaml"
runner = CliRunner()


@pytest.mark.parametrize("argv", [[], ["stragglar"], ["stragglar", "run"], ["simulate"], ["te", "serve"]])
def test_dash_h_prints_the_same_help_as_dash_dash_help(argv):
    short, long = runner.invoke(app, [*argv, "-h"]), runner.invoke(app, [*argv, "--help"])
    assert short.exit_code == 0 and long.exit_code == 0, short.output
    assert "Usage:" in short.output and short.output == long.output


def test_the_top_level_help_has_completion_and_runnable_examples():
    result = runner.invoke(app, ["--help"])
    assert "--install-completion" in result.output and "--show-completion" in result.output
    assert "Examples:" in result.output
    examples = [line.strip().split("  #")[0].split() for line in result.output.splitlines()
                if line.strip().startswith("lightrail ")]
    assert 4 <= len(examples) <= 6
    for argv in examples:  # every example names a real verb with flags it has (each checked by its -h)
        words = [w for w in argv[1:] if not w.startswith("-") and "/" not in w and "." not in w]
        assert runner.invoke(app, [*words[:2], "-h"]).exit_code == 0, argv


def test_show_completion_prints_a_script():
    result = runner.invoke(app, ["--show-completion", "bash"])
    assert result.exit_code == 0 and "complete" in result.output, (result.output, result.exception)


def _sweep(tmp_path: Path, gpus: list[int]) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"scenario": str(TINY), "grid": {"cluster.gpus": gpus}}))
    return path


def test_a_sweep_with_failed_cells_exits_1_unless_failures_are_allowed(tmp_path):
    """32 GPUs fit the debug job's layout, 30 do not: one of two cells fails."""
    path = _sweep(tmp_path, [32, 30])
    failed = runner.invoke(app, ["sweep", str(path), "--local", "--json", "--out", str(tmp_path / "a")])
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["failed"] == 1  # the result is printed and written all the same
    assert (tmp_path / "a" / "sweep.json").is_file()
    assert "1 of 2 cells failed" in failed.stderr and "--allow-failures" in failed.stderr
    allowed = runner.invoke(app, ["sweep", str(path), "--local", "--json", "--allow-failures"])
    assert allowed.exit_code == 0 and json.loads(allowed.stdout)["failed"] == 1
    ok = runner.invoke(app, ["sweep", str(_sweep(tmp_path, [32])), "--local", "--json"])
    assert ok.exit_code == 0, ok.output


def test_allow_failures_needs_a_sweep_file():
    result = runner.invoke(app, ["sweep", str(TINY), "--allow-failures"])
    assert result.exit_code == 2 and "--allow-failures" in result.output


@pytest.mark.parametrize("argv, name", [
    (["stragglar", "compare", "-n", "4", "-s", "1MiB"], "stragglar-compare.json"),
    (["stragglar", "rounds", "-n", "4"], "stragglar-rounds.json"),
    (["collective", "-n", "8", "-s", "1MiB"], "collective.json"),
    (["cost", "--gpus", "256"], "cost.json"),
    (["pipswitch", "--ports", "8"], "pipswitch.json"),
])
def test_out_writes_the_json_that_json_prints(argv, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    printed = runner.invoke(app, [*argv, "--json"])
    assert printed.exit_code == 0, printed.output
    assert list(tmp_path.iterdir()) == []  # --json alone writes nothing
    table = runner.invoke(app, [*argv, "--out", "o"])
    assert table.exit_code == 0, table.output
    assert json.loads((tmp_path / "o" / name).read_text()) == json.loads(printed.stdout)


def test_fl_demo_out_writes_its_json(tmp_path, monkeypatch):
    """The demo itself (real services) is tests/fl's to check; here the verb's writing, before its verdict."""
    measured = {"double_bookings": 0, "model_exact": True, "clients": 2}
    monkeypatch.setattr("lightrail.fl.serve.demo", lambda **kw: measured)
    result = runner.invoke(app, ["fl", "demo", "--json", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "fl-demo.json").read_text()) == measured == json.loads(result.stdout)


def test_stragglar_run_out_writes_its_json(tmp_path, monkeypatch):
    """The measurement itself (gloo processes, ~10 s) is tests/studies' to check; here the verb's writing."""

    class Measured:
        def to_dict(self):
            return {"ranks": 2, "methods": {"stragglar": 0.5}}

    monkeypatch.setattr("lightrail.studies.stragglar_run.measure_stragglar", lambda *a, **k: Measured())
    monkeypatch.setattr("lightrail.report.stragglar.run_mismatch", lambda result: None)
    result = runner.invoke(app, ["stragglar", "run", "-n", "2", "--json", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o" / "stragglar-run.json").read_text()) == Measured().to_dict()
    assert json.loads(result.stdout) == Measured().to_dict()


def test_an_unwritable_out_fails_before_the_work(tmp_path):
    (tmp_path / "file").write_text("")
    result = runner.invoke(app, ["collective", "-n", "8", "--out", str(tmp_path / "file")])
    assert result.exit_code == 2 and "--out" in result.output and "Traceback" not in result.output


def test_renamed_flags_keep_their_old_spelling_with_a_note(monkeypatch):
    """``te serve --kill-at`` is ``--kill-at-epoch`` (as ``train-demo --kill-at-step``, ``fl demo
    --kill-at-round``); ``moe bench --iters`` is ``--repeats`` (as ``stragglar run``): the old spelling works,
    is hidden, and says so."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_surface", Path(__file__).with_name("test_cli_surface.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    verbs = module.surface()
    assert "--kill-at-epoch" in verbs["te serve"]["flags"] and "--kill-at" in verbs["te serve"]["hidden"]
    assert "--repeats" in verbs["moe bench"]["flags"] and "--iters" in verbs["moe bench"]["hidden"]
    seen = {}

    def serve_te(setup, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("lightrail.te.service.serve_te", serve_te)
    result = runner.invoke(app, ["te", "serve", "--kill", "0", "--kill-at", "3", "--json"])
    assert seen["kill_at"] == 3 and "--kill-at is now --kill-at-epoch" in result.stderr
    both = runner.invoke(app, ["te", "serve", "--kill", "0", "--kill-at", "3", "--kill-at-epoch", "3"])
    assert both.exit_code == 2 and "given twice" in both.output


def _readme_commands() -> list[list[str]]:
    """Every ``lightrail ...`` command in the README's bash blocks, as argv (comments and ``[optional]`` parts
    dropped, continuation lines joined)."""
    import re
    import shlex

    found = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                part = re.sub(r"\[[^\]]*\]", "", re.sub(r"\s+#.*$", "", part.strip()))
                if part.startswith("lightrail "):
                    found.append(shlex.split(part)[1:])
    return found


def test_the_readme_says_once_how_to_activate_the_venv_and_its_commands_parse():
    """README sections call bare ``lightrail`` (issue 33 item 6): the venv is activated once near the top, no
    section spells ``.venv/bin/lightrail``, and every command is one the CLI parses (verb and flags exist)."""
    import typer

    text = (ROOT / "README.md").read_text()
    assert text.index("source .venv/bin/activate") < text.index("## ")
    assert text.count(".venv/bin/lightrail") <= 1  # the note's own example of the alternative
    commands = _readme_commands()
    assert len(commands) > 30
    root = typer.main.get_command(app)
    for argv in commands:
        command, rest, path = root, list(argv), ["lightrail"]
        while hasattr(command, "commands") and rest and rest[0] in command.commands:
            path.append(rest[0])
            command = command.commands[rest.pop(0)]
        if rest == ["--help"]:
            continue
        command.make_context(" ".join(path), rest)  # raises on an unknown verb or flag


def test_ports_per_gpu_is_one_name_for_one_idea_and_the_old_name_still_works():
    """``collective --ports`` counted ports per GPU; ``controller serve``/``pipswitch --ports`` count a switch's."""
    new = runner.invoke(app, ["collective", "-n", "8", "--reconfigurable", "--ports-per-gpu", "1", "--json"])
    old = runner.invoke(app, ["collective", "-n", "8", "--reconfigurable", "--ports", "1", "--json"])
    assert new.exit_code == old.exit_code == 0 and json.loads(new.stdout) == json.loads(old.stdout)
    assert json.loads(new.stdout)["topology"].startswith("reconfigurable(ports=1")
    bad = runner.invoke(app, ["collective", "-n", "8", "--reconfigurable", "--ports-per-gpu", "0"])
    assert bad.exit_code == 2 and "--ports-per-gpu" in bad.output
