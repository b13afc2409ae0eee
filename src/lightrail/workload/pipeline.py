"""The order in which a pipeline stage runs its micro-batches' forwards and backwards: 1F1B, GPipe, and
Megatron-LM's interleaved 1F1B (what :func:`lightrail.workload.program.build_program` compiles from)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["PipelineSchedule", "pipeline_order"]


class PipelineSchedule(StrEnum):
    """The order of a pipeline stage's forwards and backwards (a job's ``schedule``)."""

    ONE_F_ONE_B = "1f1b"
    """PipeDream-flush, Megatron's default: warm-up forwards, then one forward and one backward in turn."""
    GPIPE = "gpipe"
    """All forwards, then all backwards from the last micro-batch down, as autograd frees them."""
    INTERLEAVED = "interleaved"
    """Megatron's interleaved 1F1B (virtual pipeline stages, ``forward_backward_pipelining_with_interleaving``):
    each stage holds ``virtual_stages`` model chunks and runs 1F1B over (micro-batch, chunk) pairs, which cuts
    the bubble by the number of chunks (Narayanan et al., SC'21, sec. 2.2.2)."""


def pipeline_order(schedule: PipelineSchedule, m: int, pp: int, v: int, stage: int) -> list[tuple[int, bool, int]]:
    """The order of (micro-batch, is_backward, model chunk) of ``stage`` of ``pp``, for ``m`` micro-batches and ``v``
    model chunks per stage: 1F1B, GPipe (all forwards, then all backwards from the last micro-batch down, as
    autograd frees them), or interleaved 1F1B."""
    if schedule is PipelineSchedule.GPIPE:
        return [(j, False, 0) for j in range(m)] + [(j, True, 0) for j in reversed(range(m))]
    if schedule is PipelineSchedule.INTERLEAVED:
        return _interleaved(m, pp, v, stage)
    return [(j, backward, 0) for j, backward in _one_f_one_b(m, pp, stage)]


def _interleaved(m: int, pp: int, v: int, stage: int) -> list[tuple[int, bool, int]]:
    """Megatron-LM's interleaved 1F1B order of (micro-batch, is_backward, chunk) for a stage, as
    ``forward_backward_pipelining_with_interleaving`` (megatron/core/pipeline_parallel/schedules.py, main of
    August 2026) runs it with its default ``microbatch_group_size_per_vp_stage`` = pp:

    - ``get_schedule_table``: virtual micro-batch k runs (micro-batch, chunk) from groups of pp micro-batches,
      each group through chunk 0, then chunk 1, ... (``get_model_chunk_id`` / ``get_microbatch_id_in_model_chunk``);
    - ``get_pp_rank_microbatches``: warm-up ``(pp - rank - 1) * 2 + (v - 1) * pp`` forwards, capped at the total
      m x v; then forward k + warm-up and backward k in turn; then the remaining backwards;
    - backward k runs chunk v - 1 - (table's chunk of k) (``get_model_chunk_id(k, forward=False)``) on the oldest
      micro-batch that chunk holds (``input_tensors[chunk].pop(0)``): the table's micro-batch of k.
    """
    table = [(j, c) for first in range(0, m, pp) for c in range(v) for j in range(first, min(first + pp, m))]
    total = m * v
    warmup = min((pp - stage - 1) * 2 + (v - 1) * pp, total)

    def forward(k: int) -> tuple[int, bool, int]:
        return table[k][0], False, table[k][1]

    def backward(k: int) -> tuple[int, bool, int]:
        return table[k][0], True, v - 1 - table[k][1]

    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(k + warmup), backward(k)]
    order += [backward(k) for k in range(total - warmup, total)]
    return order


def _one_f_one_b(m: int, p: int, stage: int) -> list[tuple[int, bool]]:
    """PipeDream-flush / Megatron 1F1B order of (micro-batch, is_backward) for a stage."""
    warmup = min(p - stage - 1, m)
    order = [(j, False) for j in range(warmup)]
    for k in range(m - warmup):
        order += [(warmup + k, False), (k, True)]
    order += [(j, True) for j in range(m - warmup, m)]
    return order
