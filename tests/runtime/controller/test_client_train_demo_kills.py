"""The train-demo survives its controller being killed (SIGKILL) at random moments, 20 times, and trains
to the same losses as plain gloo (issue 17): the ranks reconnect, say hello, declare their groups again,
hold the ones they are inside an op of and re-send their acquires, and the restarted controller (same
state file, ports and operator token) lights the circuits again.

20 full runs would take minutes on two cores (each spawns the ranks and imports torch), so one run of 16
steps takes the 20 kills: each at a seeded random step (some steps twice: the second kill then lands while
the ranks are still reconnecting) plus a random fraction of a step. DP=2 x PP=2 keeps both kinds of group:
leased DP rings and PP pairs that revoke each other on the one rail every step."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("httpx")  # the optional extra "service": the controller's admin API
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from lightrail.studies.train_demo import DemoConfig  # noqa: E402
from lightrail.studies.train_demo.measure import run_photonic_demo  # noqa: E402

KILLS = 20


@pytest.mark.slow
def test_train_demo_killing_the_controller_20_times_keeps_the_losses(tmp_path):
    rng = random.Random(17)
    config = DemoConfig(tp=1, pp=2, dp=2, steps=16, layers=2, d_model=16, heads=2, microbatches=2, seq=8,
                        micro_batch=2)
    at = sorted(rng.randrange(1, config.steps) for _ in range(KILLS))
    after_s = [rng.uniform(0.0, 0.05) for _ in range(KILLS)]
    result = run_photonic_demo(config, ocs_delay=0.002, workdir=tmp_path, kill_controller_at_step=at,
                               kill_controller_after_s=after_s)
    assert result.controller_restarts == KILLS, (at, after_s)
    assert result.losses_identical, (at, after_s)
    assert result.lightrail_losses == result.losses and len(result.losses) == config.steps
    assert result.unsafe_reconfigurations == 0  # the last controller's count
    assert result.to_dict()["controller_restarts"] == KILLS
    log = (tmp_path / "controller.log").read_text()
    assert log.count('"event": "ready"') == KILLS + 1  # every restart appended to the one log
