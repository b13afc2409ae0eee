"""Chrome trace (Perfetto, chrome://tracing) of a simulated iteration: tracks per rank and one per OCS.

Ranks of a pipeline stage run identical timelines, so for large jobs (more than ``max_rank_tracks``
ranks) each stage is shown by its first rank and the trace's metadata says so. A rank's ops that really overlap
(a gradient bucket beside the backward, two communicators at once) sit on tracks of their own: Perfetto draws a
track's slices as a stack, so slices that overlap without nesting would be misdrawn (:func:`lanes`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from lightrail.sim.iteration import IterationResult, TraceEvent
from lightrail.workload.parallel import Layout

__all__ = ["chrome_trace", "lanes", "misdrawn"]


def lanes(events: Sequence[TraceEvent]) -> list[int]:
    """Per event, a lane of its track such that no two events of one lane overlap (interval partitioning: as
    few lanes as the most events that overlap at once; lane 0 keeps every event that overlaps nothing earlier).

    >>> ev = [TraceEvent("r", "a", "c", 0.0, 2.0), TraceEvent("r", "b", "c", 1.0, 2.0),
    ...       TraceEvent("r", "c", "c", 2.0, 1.0)]
    >>> lanes(ev)
    [0, 1, 0]
    """
    out = [0] * len(events)
    ends: dict[str, list[float]] = {}
    for i in sorted(range(len(events)), key=lambda i: (events[i].track, events[i].start, -events[i].duration)):
        e = events[i]
        track = ends.setdefault(e.track, [])
        tol = 1e-12 * max(1.0, abs(e.start))
        lane = next((k for k, end in enumerate(track) if end <= e.start + tol), len(track))
        if lane == len(track):
            track.append(0.0)
        track[lane] = e.start + e.duration
        out[i] = lane
    return out


def chrome_trace(result: IterationResult, layout: Layout, *, max_rank_tracks: int = 512) -> dict:
    """The iteration as a Chrome trace-event JSON object (times in microseconds from its start).

    A rank's main track is thread ``rank``; its other tracks (async communicators, overlapping ops) are threads
    numbered from ``world`` up, named after the rank and sorted beside it."""
    t0 = min((e.start for e in result.events), default=0.0)
    per_stage = layout.world // layout.pp
    all_ranks = layout.world <= max_rank_tracks
    ranks_of = {s: (list(range(s * per_stage, (s + 1) * per_stage)) if all_ranks else [s * per_stage])
                for s in range(layout.pp)}
    out: list[dict] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ranks"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "OCS (one per rail)"}},
    ]
    ranked = [e for e in result.events if not e.track.startswith("OCS rail ")]
    lane = dict(zip(map(id, ranked), lanes(ranked), strict=True))
    # per stage: its tracks (main first), each split into lanes; a rank's threads follow one another
    kinds: dict[int, list[tuple[str, int]]] = {}
    for e in ranked:
        stage = int(e.track.split()[1])
        key = (e.track, lane[id(e)])
        if key not in kinds.setdefault(stage, [(f"stage {stage}", 0)]):
            kinds[stage].append(key)
    tid: dict[tuple[int, str, int], int] = {}
    extra = layout.world
    for s, ranks in ranks_of.items():
        order = sorted(kinds.get(s, [(f"stage {s}", 0)]), key=lambda k: (k != (f"stage {s}", 0), k))
        for r in ranks:
            for n, (track, k) in enumerate(order):
                if n == 0:
                    tid[r, track, k] = r
                else:
                    tid[r, track, k] = extra
                    extra += 1
                stream = track[len(f"stage {s}"):].strip()
                name = f"rank {r} (stage {s})" + (f" {stream}" if stream else "") + (f" #{k + 1}" if k else "")
                out.append({"ph": "M", "pid": 1, "tid": tid[r, track, k], "name": "thread_name",
                            "args": {"name": name}})
                out.append({"ph": "M", "pid": 1, "tid": tid[r, track, k], "name": "thread_sort_index",
                            "args": {"sort_index": r * len(order) + n}})
    g = layout.gpus_per_server
    switching = [e for e in result.events if e.track.startswith("OCS rail ")]  # partial: ports switch apart
    ocs_lane = dict(zip(map(id, switching), lanes(switching), strict=True))
    for rail in range(g):
        for k in range(max((ocs_lane[id(e)] for e in switching if e.track == f"OCS rail {rail}"), default=0) + 1):
            out.append({"ph": "M", "pid": 2, "tid": rail + g * k, "name": "thread_name",
                        "args": {"name": f"rail {rail} OCS" + (f" #{k + 1}" if k else "")}})
            out.append({"ph": "M", "pid": 2, "tid": rail + g * k, "name": "thread_sort_index",
                        "args": {"sort_index": rail * 1000 + k}})
    for e in result.events:
        base = {"ph": "X", "name": e.name, "cat": e.category, "ts": (e.start - t0) * 1e6, "dur": e.duration * 1e6}
        if e.track.startswith("OCS rail "):
            out.append({**base, "pid": 2, "tid": int(e.track.split()[-1]) + g * ocs_lane[id(e)]})
            continue
        stage = int(e.track.split()[1])
        stream = "async" if "async" in e.track else "main"
        for r in ranks_of[stage]:
            out.append({**base, "pid": 1, "tid": tid[r, e.track, lane[id(e)]], "args": {"stream": stream}})
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "metadata": {"fabric": result.fabric, "policy": result.policy, "iteration_time_s": result.iteration_time_s,
                     "ranks_shown": "all" if all_ranks else "first rank of each pipeline stage (ranks of a stage "
                                                            "run identical timelines)"},
    }


def misdrawn(trace: dict) -> list[tuple]:
    """Pairs of slices on one (pid, tid) of a Chrome trace that overlap without one containing the other: what
    Perfetto cannot draw (the checker of :func:`chrome_trace`; empty when every slice is drawable)."""
    by_track: dict[tuple, list] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_track[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    bad = []
    for track, slices in by_track.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ = []  # a stack of slices that contain the current one
        for start, end, name in slices:
            tol = 1e-6 * max(1.0, abs(start))
            while open_ and open_[-1][1] <= start + tol:
                open_.pop()
            if open_ and end > open_[-1][1] + tol:
                bad.append((track, open_[-1], (start, end, name)))
            open_.append((start, end, name))
    return bad
