"""The distributed MoE layer against the single-process reference: outputs and gradients (float64).

One process group per world size (2, 4, 8 gloo processes) runs every case of that size, so the spawn cost is
paid three times; sizes are tiny (hidden 8) to keep 8 processes on 2 cores quick."""

from __future__ import annotations

import pytest
import torch

from lightrail.moe import traffic
from lightrail.moe.check import Case, compare, run_cases
from lightrail.moe.layer import ReferenceMoE, capacity_keep, route
from lightrail.runtime.launch import run_processes

STARVE = -60.0  # a gate bias that keeps an expert from ever being chosen

CASES = {
    2: [
        Case("payload", (5, 7), 4, 1, tags=("top1",)),
        Case("payload", (5, 7), 4, 2, tiles=3),
        Case("unpipelined", (6, 4), 4, 2),
        Case("padded", (5, 7), 4, 2, capacity_factor=8.0, tags=("no-drop",)),
        Case("padded", (9, 7), 4, 1, capacity_factor=0.6, tags=("drops",)),
        # rank 0 has no tokens at all, and rank 1's experts (2, 3) receive none
        Case("payload", (0, 9), 4, 2, tiles=4, gate_bias=(0, 0, STARVE, STARVE), tags=("uneven",)),
        Case("unpipelined", (0, 9), 4, 1, gate_bias=(0, 0, STARVE, STARVE), tags=("uneven",)),
        Case("padded", (0, 9), 4, 2, capacity_factor=4.0, gate_bias=(0, 0, STARVE, STARVE), tags=("uneven",)),
    ],
    4: [
        # rank 1 has no tokens; rank 2's experts (4, 5) and expert 7 receive none
        Case("payload", (6, 0, 5, 9), 8, 2, gate_bias=(0, 0, 0, 0, STARVE, STARVE, 0, STARVE), tags=("uneven",)),
        Case("padded", (6, 0, 5, 9), 8, 2, capacity_factor=1.0, gate_bias=(0, 0, 0, 0, STARVE, STARVE, 0, STARVE),
             tags=("uneven", "drops")),
        Case("unpipelined", (4, 4, 3, 5), 8, 1),
        Case("payload", (4, 4, 3, 5), 8, 1, tiles=2, tags=("top1",)),
    ],
    8: [
        Case("payload", (3, 4, 0, 5, 2, 6, 1, 4), 8, 2, tiles=2, gate_bias=(0, 0, 0, 0, 0, STARVE, 0, 0),
             tags=("uneven",)),
        Case("padded", (3, 4, 2, 5, 2, 6, 1, 4), 8, 1, capacity_factor=2.0),
        Case("unpipelined", (3, 4, 2, 5, 2, 6, 1, 4), 8, 2),
    ],
}


@pytest.fixture(scope="module")
def results():
    """Every case's per-rank results, computed once per world size."""
    return {n: run_processes(run_cases, n, cases) for n, cases in CASES.items()}


def _all_cases():
    return [pytest.param(n, i, id=f"{n}ranks-{c.variant}-top{c.topk}-{'-'.join(c.tags) or 'even'}")
            for n, cases in CASES.items() for i, c in enumerate(cases)]


@pytest.mark.parametrize(("n", "i"), _all_cases())
def test_outputs_and_gradients_match_reference(results, n, i):
    case = CASES[n][i]
    per_rank = [r[i] for r in results[n]]
    assert compare(case, per_rank) == []
    assert all(torch.isfinite(r["dw1"]).all() for r in per_rank)


@pytest.mark.parametrize(("n", "i"), _all_cases())
def test_bytes_on_wire_count_only_rows_to_other_ranks(results, n, i):
    """Payload: 2 x (assignments whose expert lives on another rank) x row bytes, routed here independently of
    the layer; padded: the remote experts' capacity slots (traffic.padded_bytes) whatever the routing."""
    case = CASES[n][i]
    stats = [r[i]["stats"] for r in results[n]]
    row = case.hidden * 8
    if case.variant == "padded":
        per_rank = 2 * traffic.padded_bytes(max(case.tokens), case.topk, case.hidden, 8, n, case.experts,
                                            case.capacity_factor)
        assert [s["bytes_on_wire"] for s in stats] == [per_rank] * n
        return
    ref = ReferenceMoE(case.hidden, case.ffn, case.experts, case.topk, seed=case.seed, dtype=torch.float64,
                       gate_bias=None if case.gate_bias is None else torch.tensor(case.gate_bias))
    from lightrail.moe.check import case_inputs

    local = case.experts // n
    for rank, s in enumerate(stats):
        x, _ = case_inputs(case, rank)
        _, experts_of = route(x, ref.gate_weight, ref.gate_bias, case.topk)
        remote = int((experts_of // local != rank).sum())
        assert s["bytes_on_wire"] == 2 * remote * row
        assert s["routed"] == case.tokens[rank] * case.topk


def test_uneven_cases_really_starve(results):
    """The uneven cases exercise what they claim: a rank with no tokens, a rank whose experts get none."""
    two = [r[5]["stats"] for r in results[2]]
    assert two[0]["routed"] == 0 and two[1]["rows_received"] == 0 and two[0]["rows_received"] == 18
    four = [r[0]["stats"] for r in results[4]]
    assert four[1]["routed"] == 0 and four[2]["rows_received"] == 0
    eight = [r[0]["stats"] for r in results[8]]
    assert eight[2]["routed"] == 0 and eight[5]["rows_received"] == 0


def test_padded_cases_drop_or_not_as_labelled(results):
    for n, cases in CASES.items():
        for i, case in enumerate(cases):
            dropped = sum(r[i]["stats"]["dropped"] for r in results[n])
            if "drops" in case.tags:
                assert dropped > 0, case
            elif case.variant == "padded":
                assert dropped == 0, case


def test_payload_variant_pipelines_and_unpipelined_does_not(results):
    for n, cases in CASES.items():
        for i, case in enumerate(cases):
            peak = max(r[i]["stats"]["max_in_flight"] for r in results[n])
            if case.variant == "payload" and case.tiles >= 2:
                assert peak >= 2, case  # a dispatch and a combine in flight together
            else:
                assert peak == 1, case


def test_compare_notices_a_wrong_gradient(results):
    """The checker is not vacuous: a tiny error in one rank's expert gradient is reported."""
    case = CASES[2][1]
    per_rank = [dict(r[1]) for r in results[2]]
    per_rank[1]["dw2"] = per_rank[1]["dw2"] + 1e-6
    assert [p.split(":")[0] for p in compare(case, per_rank)] == ["dw2"]


def test_capacity_drop_rule_by_hand():
    """Slot-major queues: all first choices in token order, then second choices; the first `cap` stay."""
    experts_of = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    keep, pos = capacity_keep(experts_of, 3, 2)
    # first choices: expert 0 <- tokens 0, 1, 2 (token 2 is third: dropped); expert 1 <- token 3
    # second choices: expert 1 <- token 0 (2nd in queue), token 2 (3rd: dropped); expert 2 <- token 1;
    # expert 0 <- token 3 (4th: dropped)
    assert pos.tolist() == [[0, 1], [1, 0], [2, 2], [0, 3]]
    assert keep.tolist() == [[True, True], [True, True], [False, False], [True, False]]


def test_reference_with_capacity_drops_exactly_the_dropped_assignments():
    ref = ReferenceMoE(4, 6, 3, 1, dtype=torch.float64, gate_bias=torch.tensor([30.0, 0, 0]))  # all to expert 0
    x = torch.randn(5, 4, dtype=torch.float64)
    full = ref(x)
    capped = ref(x, chunks=[3, 2], capacity=2)
    # each source chunk keeps its first 2 tokens: token 2 (chunk 0) is dropped, chunk 1 keeps both
    assert torch.equal(capped[2], torch.zeros(4, dtype=torch.float64))
    assert torch.allclose(capped[[0, 1, 3, 4]], full[[0, 1, 3, 4]])
