"""Chrome trace (Perfetto, chrome://tracing) of a simulated iteration: one track per rank and per OCS.

Ranks of a pipeline stage run identical timelines, so for large jobs (more than ``max_rank_tracks``
ranks) each stage is shown by its first rank and the trace's metadata says so.
"""

from __future__ import annotations

from lightrail.sim.iteration import IterationResult
from lightrail.workload.parallel import Layout

__all__ = ["chrome_trace"]


def chrome_trace(result: IterationResult, layout: Layout, *, max_rank_tracks: int = 512) -> dict:
    """The iteration as a Chrome trace-event JSON object (times in microseconds from its start)."""
    t0 = min((e.start for e in result.events), default=0.0)
    per_stage = layout.world // layout.pp
    all_ranks = layout.world <= max_rank_tracks
    ranks_of = {s: (list(range(s * per_stage, (s + 1) * per_stage)) if all_ranks else [s * per_stage])
                for s in range(layout.pp)}
    out: list[dict] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ranks"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "OCS (one per rail)"}},
    ]
    for s, ranks in ranks_of.items():
        for r in ranks:
            out.append({"ph": "M", "pid": 1, "tid": r, "name": "thread_name",
                        "args": {"name": f"rank {r} (stage {s})"}})
    for rail in range(layout.gpus_per_server):
        out.append({"ph": "M", "pid": 2, "tid": rail, "name": "thread_name", "args": {"name": f"rail {rail} OCS"}})
    for e in result.events:
        base = {"ph": "X", "name": e.name, "cat": e.category, "ts": (e.start - t0) * 1e6, "dur": e.duration * 1e6}
        if e.track.startswith("OCS rail "):
            out.append({**base, "pid": 2, "tid": int(e.track.split()[-1])})
            continue
        stage = int(e.track.split()[1])
        lane = 0 if not e.track.endswith("async") else 1
        for r in ranks_of[stage]:
            out.append({**base, "pid": 1, "tid": r, "args": {"stream": "async" if lane else "main"}})
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "metadata": {"fabric": result.fabric, "policy": result.policy, "iteration_time_s": result.iteration_time_s,
                     "ranks_shown": "all" if all_ranks else "first rank of each pipeline stage (ranks of a stage "
                                                            "run identical timelines)"},
    }
