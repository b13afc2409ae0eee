"""StragglAR, Ring and gloo's AllReduce measured for real with a late rank: results match dist.all_reduce,
nobody finishes before the straggler arrives, and bad input exits 2 before any process starts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from lightrail.cli import app  # noqa: E402
from lightrail.errors import ScenarioError  # noqa: E402
from lightrail.studies import stragglar_run  # noqa: E402
from lightrail.studies.stragglar_run import METHODS, measure_stragglar  # noqa: E402

runner = CliRunner()
DELAY = 0.02
KEYS = {"ranks", "size_bytes", "delay_s", "straggler", "repeats", "stragglar_s", "ring_s", "native_s",
        "speedup_over_ring", "speedup_over_native", "trials_s", "correct", "backend"}


def _check(result: dict, repeats: int) -> None:
    assert KEYS <= set(result)
    assert result["backend"] == "gloo"
    assert result["correct"] == dict.fromkeys(METHODS, True)
    for m in METHODS:
        assert len(result["trials_s"][m]) == repeats
        # the straggler sleeps DELAY after the barrier before joining: no method can be done sooner
        assert min(result["trials_s"][m]) >= result["delay_s"]
        assert result[f"{m}_s"] >= result["delay_s"]
    assert result["speedup_over_ring"] == pytest.approx(result["ring_s"] / result["stragglar_s"])
    assert result["speedup_over_native"] == pytest.approx(result["native_s"] / result["stragglar_s"])


def test_measure_matches_all_reduce_and_waits_for_the_straggler():
    # 1003 float32 elements: not a multiple of 4 ranks nor of StragglAR's 3 chunks
    result = measure_stragglar(4, 4 * 1003 + 3, DELAY, 1, repeats=2).to_dict()
    _check(result, 2)
    assert (result["ranks"], result["straggler"], result["size_bytes"]) == (4, 1, 4015)


def test_cli_json_runs_three_ranks_with_rank_0_late():
    result = runner.invoke(app, ["stragglar", "run", "--ranks", "3", "--straggler", "0", "--size", "4099B",
                                 "--straggler-delay", "20ms", "--repeats", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    _check(out, 2)
    assert (out["ranks"], out["straggler"], out["delay_s"]) == (3, 0, pytest.approx(DELAY))


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("processes were launched for bad input")

    monkeypatch.setattr(stragglar_run, "run_processes", refuse)


@pytest.mark.parametrize("args, flag", [
    (["--ranks", "8", "--straggler", "8"], "--straggler"),
    (["--straggler", "-1"], "--straggler"),
    (["--size", "0"], "--size"),
    (["--size", "2B"], "--size"),
    (["--straggler-delay", "-1ms"], "--straggler-delay"),
    (["--straggler-delay", "abc"], "--straggler-delay"),
    (["--delay", "abc"], "--straggler-delay"),  # the old spelling: its value is read as the new flag's
    (["--delay", "1ms", "--straggler-delay", "2ms"], "--straggler-delay"),  # both spellings at once
    (["--ranks", "1"], "--ranks"),
    (["--repeats", "0"], "--repeats"),
])
def test_cli_bad_input_exits_2_naming_the_flag(no_launch, args, flag):
    result = runner.invoke(app, ["stragglar", "run", *args])
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("kwargs, field", [
    ({"n": 1, "straggler": 0}, "--ranks"),
    ({"straggler": 4}, "--straggler"),
    ({"size_bytes": 3}, "--size"),
    ({"delay_s": float("nan")}, "--straggler-delay"),
    ({"repeats": 0}, "--repeats"),
])
def test_measure_rejects_bad_input_before_launching(no_launch, kwargs, field):
    args = {"n": 4, "size_bytes": 4096, "delay_s": 0.0, "straggler": 3} | kwargs
    with pytest.raises(ScenarioError) as info:
        measure_stragglar(**args)
    assert info.value.field == field and info.value.fix


def test_the_old_delay_spelling_still_works_with_a_note(monkeypatch):
    def fake(_main, n, elements, delay_s, straggler, repeats, warmup, schedules, threads):
        return [{"elapsed": {m: [delay_s] * repeats for m in METHODS},
                 "correct": dict.fromkeys(METHODS, True), "max_abs_error": dict.fromkeys(METHODS, 0.0)}] * n

    monkeypatch.setattr(stragglar_run, "run_processes", fake)
    old = runner.invoke(app, ["stragglar", "run", "--ranks", "2", "--delay", "20ms", "--repeats", "1", "--json"])
    assert old.exit_code == 0, old.output
    assert json.loads(old.stdout)["delay_s"] == pytest.approx(DELAY)
    assert "note: --delay is now --straggler-delay" in old.stderr
    new = runner.invoke(app, ["stragglar", "run", "--ranks", "2", "--straggler-delay", "20ms", "--repeats", "1",
                              "--json"])
    assert json.loads(new.stdout) == json.loads(old.stdout) and "note:" not in new.stderr
