"""A rank that gives up on its controller (or any LightrailError in a worker) ends the launcher with that one
error, not a worker's traceback: the train-demo's one line and exit 2 (issue 17)."""

from __future__ import annotations

import pytest

from lightrail.errors import ScenarioError
from lightrail.runtime.launch import run_processes
from lightrail.studies.train_demo import DemoConfig, train_worker


def test_a_workers_lightrail_error_reaches_the_launcher_as_itself():
    # two ranks for a one-rank layout: every worker raises ScenarioError naming --ranks
    with pytest.raises(ScenarioError) as e:
        run_processes(train_worker, 2, DemoConfig(tp=1, pp=1, dp=1, steps=1))
    assert e.value.field == "--ranks" and "\n" not in str(e.value)
    assert str(e.value).startswith("--ranks: 2 ranks run a layout of tp(1) * pp(1) * dp(1) = 1")


@pytest.mark.parametrize(("steps", "at"), [("5", "5"), ("5", "0"), ("5", "-1"), ("1", "1")])
def test_a_kill_step_outside_the_run_is_one_line_before_any_work(steps, at, tmp_path):
    from typer.testing import CliRunner

    from lightrail.cli import app

    r = CliRunner().invoke(app, ["train-demo", "--ranks", "4", "--tp", "1", "--pp", "2", "--dp", "2", "--steps", steps,
                                 "--kill-controller-at-step", at, "--out", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    line = " ".join(r.output.split())
    assert line.startswith("error: --kill-controller-at-step: cannot kill the controller at step") and "Traceback" \
        not in r.output
    assert not (tmp_path / "out").exists()  # nothing written
