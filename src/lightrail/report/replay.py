"""Output of a replayed trace (``lightrail simulate`` on a ``workload: {chakra: DIR}`` scenario)."""

from __future__ import annotations

from pathlib import Path

from lightrail.report.files import write_json
from lightrail.sim.trace import lanes
from lightrail.studies.replay import TIMELINE_RANKS, TraceRun
from lightrail.units import format_time

__all__ = ["chrome_trace_of_replay", "write_replay", "print_replay"]


def chrome_trace_of_replay(run: TraceRun) -> dict:
    """The replay as Chrome trace events (Perfetto): per rank, its compute stream on thread ``rank`` and its
    communication on threads of their own, one more wherever ops overlap (:func:`lightrail.sim.trace.lanes`)."""
    shown = min(run.ranks, TIMELINE_RANKS)
    out: list[dict] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ranks"}}]
    events = run.result.events
    lane = lanes(events)
    tid: dict[tuple[str, int], int] = {(f"rank {r}", 0): r for r in range(shown)}
    for e, k in sorted(zip(events, lane, strict=True), key=lambda ek: (ek[0].track, ek[1])):
        tid.setdefault((e.track, k), len(tid))  # after the ranks: 0 .. shown - 1 are their compute streams
    for (track, k), t in sorted(tid.items(), key=lambda kv: kv[1]):
        rank = int(track.split()[1])
        stream = track[len(f"rank {rank}"):].strip()
        name = f"rank {rank}" + (f" {stream}" if stream else "") + (f" #{k + 1}" if k else "")
        out.append({"ph": "M", "pid": 1, "tid": t, "name": "thread_name", "args": {"name": name}})
        out.append({"ph": "M", "pid": 1, "tid": t, "name": "thread_sort_index",
                    "args": {"sort_index": rank * 1000 + (500 if stream else 0) + k}})
    for e, k in zip(events, lane, strict=True):
        out.append({"ph": "X", "pid": 1, "tid": tid[e.track, k], "name": e.name, "cat": e.category,
                    "ts": e.start * 1e6, "dur": e.duration * 1e6,
                    "args": {"stream": "comm" if e.track.endswith("comm") else "compute"}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "metadata": {"source": run.source, "iteration_time_s": run.result.iteration_time_s,
                         "ranks_shown": "all" if run.ranks <= TIMELINE_RANKS else f"the first {TIMELINE_RANKS}"}}


def write_replay(run: TraceRun, out_dir: Path) -> None:
    write_json(Path(out_dir) / "summary.json", run.to_dict())
    write_json(Path(out_dir) / "trace.json", chrome_trace_of_replay(run))


def print_replay(run: TraceRun, console, out_dir: Path | None) -> None:
    s = run.result.summary()
    ops = ", ".join(f"{v} {k}" for k, v in run.ops.items() if ":" not in k)
    where = "electrical rails" if run.fabric == "electrical" else f"a {run.topology}"
    console.print(f"{run.scenario}: Chakra trace {run.source}, {run.ranks} ranks ({ops}) on {where}")
    console.print(f"  iteration {format_time(s['iteration_time_s'])}: compute {format_time(s['compute_s'])}, "
                  f"communication {format_time(s['communication_s'])}, waiting {format_time(s['waiting_s'])} "
                  "(not computing: on communication or peers; mean per rank)")
    if out_dir is not None:
        console.print(f"  wrote {out_dir}/summary.json and trace.json (open in https://ui.perfetto.dev)")
