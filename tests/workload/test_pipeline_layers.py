"""Uneven pipeline stages: Llama 3 405B's 126 layers on 16 stages (7 + 14 x 8 + 7), explicit counts, and the
errors that name ``job.pipeline_layers`` / ``parallel.pp``."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError
from lightrail.scenario import load_scenario
from lightrail.workload.program import stage_layer_counts

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3-405b-65536xh200.yaml"


def test_llama3_405b_on_16_stages_is_meta_s_split():
    assert stage_layer_counts(126, 16, "balanced") == [7] + [8] * 14 + [7]


@given(layers=st.integers(1, 300), pp=st.integers(1, 64))
def test_balanced_fills_every_stage_and_differs_by_at_most_one(layers, pp):
    if pp > layers:
        with pytest.raises(InfeasibleError):
            stage_layer_counts(layers, pp, "balanced")
        return
    counts = stage_layer_counts(layers, pp, "balanced")
    assert len(counts) == pp and sum(counts) == layers and max(counts) - min(counts) <= 1
    assert counts == counts[::-1] or abs(sum(counts[: pp // 2]) - sum(counts[-(pp // 2):])) <= 1  # ends first
    if layers % pp == 0:
        assert counts == stage_layer_counts(layers, pp, "even")


def test_even_refuses_a_remainder_and_points_at_balanced():
    with pytest.raises(InfeasibleError) as e:
        stage_layer_counts(126, 16)
    assert e.value.field == "parallel.pp" and "balanced" in e.value.fix


@pytest.mark.parametrize("counts", [[1, 2], [0, 3, 3], [2, 2, 2, 2], [1.5, 1.5, 3]])
def test_explicit_counts_must_fit(counts):
    with pytest.raises(InfeasibleError) as e:
        stage_layer_counts(6, 3, counts)
    assert e.value.field == "job.pipeline_layers"


def test_the_65536_gpu_example_builds_with_its_stages():
    scenario, _ = load_scenario(EXAMPLE)
    built = scenario.build()
    job = built.job
    assert job.layout.world == 65_536 and job.layout.pp == 16
    sizes = [len(job.stage_layers(s)) for s in range(16)]
    assert sizes == [7] + [8] * 14 + [7]
    assert [job.stage_layers(s).start for s in range(16)] == [0] + [7 + 8 * i for i in range(15)]
