"""MoE jobs in the fabric model: a scenario's EP all-to-all phases carry the MoE layer's traffic formulas."""

from __future__ import annotations

import copy

import pytest

from lightrail.errors import LightrailError
from lightrail.moe import traffic
from lightrail.scenario import DEFAULT_SCENARIO, parse_scenario
from lightrail.studies.rails import JobRuns
from lightrail.workload.parallel import Dim
from lightrail.workload.program import CollectiveOp, build_program

# a small MoE job: 4 servers x 4 GPUs, EP4 across servers, the debug model with 8 experts (top-2)
MOE = {
    "name": "moe-small",
    "model": {"preset": "debug", "overrides": {"experts": 8, "top_k": 2, "moe_ffn": 512}},
    "cluster": {"gpus": 16, "gpus_per_server": 4, "gpu": "h100"},
    "parallel": {"tp": 1, "ep": 4, "dp": 4, "pp": 1},
    "job": {"micro_batches": 2},
}


def _built(**job):
    data = copy.deepcopy(MOE)
    data["job"].update(job)
    return parse_scenario(data).build()


def _ep_bytes(built) -> set[float]:
    prog = build_program(built.job)
    return {op.nbytes for ops in prog.stages for op in ops if isinstance(op, CollectiveOp) and op.dim is Dim.EP}


def test_ep_phase_bytes_equal_the_formula_and_padded_exceeds_payload():
    payload, padded = _built(), _built(moe_dispatch="padded", capacity_factor=1.25)
    tokens, hidden = 256, 256  # debug: seq_len 256, hidden 256, bf16; tp 1
    assert payload.job.moe_dispatch == "payload"  # the default
    assert _ep_bytes(payload) == {traffic.alltoall_buffer_bytes("payload", tokens, 2, hidden, 2, 4, 8)}
    assert _ep_bytes(payload) == {tokens * 2 * hidden * 2}
    assert _ep_bytes(padded) == {8 * traffic.capacity(tokens, 2, 8, 1.25) * hidden * 2}
    assert min(_ep_bytes(padded)) > max(_ep_bytes(payload))


def test_padded_moe_job_spends_more_time_communicating_on_both_fabrics():
    payload, padded = _built(), _built(moe_dispatch="padded", capacity_factor=2.0)
    runs = [(JobRuns(b.job), b) for b in (payload, padded)]
    el = [r.electrical(b.fabric) for r, b in runs]
    ph = [r(b.fabric, b.params) for r, b in runs]
    assert el[1].iteration_time_s > el[0].iteration_time_s
    assert ph[1].iteration_time_s > ph[0].iteration_time_s


@pytest.mark.parametrize(("job", "field"), [({"moe_dispatch": "dense"}, "job.moe_dispatch"),
                                            ({"capacity_factor": 0}, "job.capacity_factor"),
                                            ({"moe_imbalance": 0.9}, "job.moe_imbalance")])
def test_bad_moe_options_name_the_field(job, field):
    with pytest.raises(LightrailError) as e:
        _built(**job)
    assert field in str(e.value)


def test_default_scenario_is_dense_and_untouched_by_moe_options():
    built = parse_scenario(DEFAULT_SCENARIO).build()
    assert built.model.experts == 0 and built.job.moe_dispatch == "payload"
    assert _ep_bytes(built) == set()
