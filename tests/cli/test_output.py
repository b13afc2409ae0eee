"""cli/output.py: ``--json`` is strict JSON on stdout, ``--out``/``--json``/``--html`` decide where files go,
a result file is the JSON ``--json`` prints, and progress callbacks count steps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from lightrail.cli.output import output_folder, print_json, progress_steps, save_result


def test_print_json_is_strict(capsys):
    print_json({"a": math.inf, "b": [1.5, math.nan], "c": "x"})
    text = capsys.readouterr().out
    assert text.endswith("}\n") and "Infinity" not in text and "NaN" not in text
    assert json.loads(text) == {"a": None, "b": [1.5, None], "c": "x"}


def test_output_folder_follows_out_json_and_html():
    assert output_folder(Path("given"), "out/x", as_json=True) == Path("given")  # --out always wins
    assert output_folder(None, "out/x", as_json=False) == Path("out/x")  # a table writes to the default
    assert output_folder(None, "out/x", as_json=True) is None  # --json alone writes nothing
    assert output_folder(None, "out/x", as_json=True, html=True) == Path("out/x")  # unless --html asks for a page


def test_save_result_writes_what_json_prints(tmp_path, capsys):
    data = {"ranks": 8, "t": math.inf}
    assert save_result(None, "r.json", data) is None and not list(tmp_path.iterdir())
    path = save_result(tmp_path / "o", "r.json", data, quiet=True)
    assert path == tmp_path / "o" / "r.json"
    print_json(data)
    assert path.read_text() == capsys.readouterr().out


def test_progress_steps_advances_the_bar_once_per_call(monkeypatch):
    from lightrail.cli import output

    bars = []

    def spy(total, label, quiet):
        bars.append(made := real(total, label, quiet))
        return made

    real = output.progress_bar
    monkeypatch.setattr(output, "progress_bar", spy)
    with progress_steps(3, "steps", quiet=False) as step:  # stderr is no terminal here: the bar stays hidden
        for name in ("a", "b", "c"):
            step(name)
    (progress, task), = bars
    done = progress.tasks[0]
    assert (done.id, done.completed, done.total, done.description) == (task, 3, 3, "c")


def test_a_quiet_progress_bar_is_a_no_op_without_rich():
    """``--json`` runs get a bar that takes the same calls and imports no rich (issue 33: rich is ~15 ms)."""
    code = ("import sys; from lightrail.cli.output import progress_steps\n"
            "with progress_steps(3, 'steps', quiet=True) as step:\n    step('a')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_a_console_made_on_first_use_sees_the_environment_the_cli_started_with():
    """The consoles are made when first printed to (no rich for ``--json``), yet size themselves as consoles made
    at start do: ``COLUMNS`` set later (``CliRunner``'s per-invocation env) is read live, not frozen in."""
    code = ("import os; os.environ.pop('COLUMNS', None)\n"
            "from lightrail.cli.app import err, out\n"
            "os.environ['COLUMNS'] = '55'; widths = [out.width, err.width]\n"
            "os.environ['COLUMNS'] = '77'; widths += [out.width, err.width]\n"
            "print(widths, out.console._width, 'rich' in __import__('sys').modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split("]")[0] == "[55, 55, 77, 77" and done.stdout.split()[-2:] == ["None", "True"]
