"""The policy ablation of ``simulate``: run in forked workers on big jobs, the rows must be the ones one process
computes, in the same order."""

from __future__ import annotations

from pathlib import Path

import lightrail.studies.rails as rails
from lightrail.scenario import load_scenario

TINY = Path(__file__).resolve().parents[2] / "examples" / "debug-tiny.yaml"


def test_forked_workers_give_the_serial_ablation(monkeypatch):
    scenario, base = load_scenario(TINY)
    built = scenario.build(base)
    serial = rails.compare_rails(built)
    monkeypatch.setattr(rails, "PARALLEL_GPUS", 1)  # the tiny job takes the big jobs' path
    seen: list[str] = []
    forked = rails.compare_rails(built, progress=seen.append)
    assert forked.to_dict() == serial.to_dict()
    assert [row.policy for row in forked.ablation] == [label for label, _ in rails.ABLATION]
    assert sorted(seen) == sorted(["electrical", "photonic", "ideal", *(label for label, _ in rails.ABLATION)])
    assert rails._FORKED == {}  # nothing left for a later pool


def test_twins_differing_only_in_skip_present_go_to_one_worker():
    assert rails._tasks([0, 1, 2, 3]) == [(0, 1), (2,), (3,)]  # opus (original) and + skip if present together
    assert rails._tasks([2, 3]) == [(2,), (3,)]
    assert rails._tasks([]) == []
