"""What ``lightrail study fl`` shows people (a rich table and a headline) and writes (JSON, CSV, plots)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_json, write_text

if TYPE_CHECKING:
    from lightrail.studies.fl import FlStudy

__all__ = ["FL_FILES", "write_study", "print_study", "summary_csv"]

FL_FILES = ("study-fl.json", "study-fl.csv", "study-fl.png")
_COLUMNS = ("utilization", "bindings_per_s", "mean_jct_s", "double_bookings", "jobs_completed", "jobs",
            "makespan_s", "median_jct_s", "bindings", "results", "lost", "cut", "events", "elapsed_s",
            "late_results", "discarded_results", "failed_rounds", "jobs_unfinished", "busy_utilization")


def summary_csv(result: FlStudy) -> str:
    """One row per policy."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["policy", *_COLUMNS])
    for row in result.to_dict()["rows"]:
        w.writerow([row["policy"], *(row[k] for k in _COLUMNS)])
    return buf.getvalue()


def _plot(result: FlStudy, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = result.rows()
    names = [r.policy for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].bar(names, [r.utilization for r in rows], color="tab:blue")
    axes[0].set_ylabel("utilization (busy / online client-s)")
    axes[1].bar(names, [r.mean_jct_s / 3600 for r in rows], color="tab:orange")
    axes[1].set_ylabel("mean JCT (h)")
    for r in rows:
        x = np.sort(np.array(r.jct_s, dtype=float))
        x = x[np.isfinite(x)] / 3600  # unfinished jobs have no JCT
        axes[2].step(x, np.arange(1, x.size + 1) / max(x.size, 1), where="post", label=r.policy)
    for ax in axes[:2]:
        ax.set_xlabel("scheduling policy")
    axes[2].set_xlabel("job completion time (h)")
    axes[2].set_ylabel("fraction of jobs (CDF, 0-1)")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"Collaborative ML scheduling: {result.clients} clients, {result.jobs} jobs, seed {result.seed}"
                 f" ({result.source})")
    fig.tight_layout()
    from lightrail.report.plots import _write

    return _write(fig, path, dpi=110)


def write_study(result: FlStudy, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """The plot (as ``fmt``), the CSV, then ``study-fl.json`` (each atomically); returns the paths."""
    from lightrail.report.plots import figure_files

    files = [Path(out_dir) / name for name in figure_files(FL_FILES, fmt)]
    _plot(result, files[2])
    write_text(files[1], summary_csv(result))
    write_json(files[0], result.to_dict())
    return files


def _hours(s: float) -> str:
    return "-" if s is None or not math.isfinite(s) else f"{s / 3600:.2f} h"


def _x(v: float) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.2f}x"


def print_study(result: FlStudy, console: Console, files: list[Path]) -> None:
    table = Table(title=f"FL scheduling: {result.clients} clients, {result.jobs} jobs (seed {result.seed})")
    for col in ("policy", "util.", "bind/s", "mean JCT", "done", "makespan", "late", "dbl"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in result.rows():
        table.add_row(r.policy, f"{100 * r.utilization:.1f}%", f"{r.bindings_per_s:.3f}", _hours(r.mean_jct_s),
                      f"{r.jobs_completed}/{r.jobs}", _hours(r.makespan_s), str(r.late_results),
                      str(r.double_bookings))
    console.print(table)
    for key, v in result.headline().items():
        p, b = key.split("_vs_")
        console.print(f"{p.upper()} vs {b}: JCT speedup {_x(v['jct_speedup'])}, "
                      f"utilization ratio {_x(v['utilization_ratio'])}", highlight=False)
    unfinished = [r.policy for r in result.rows() if r.jobs_completed < r.jobs]
    if unfinished:
        console.print(f"not every job finished by the horizon under {', '.join(unfinished)}: the mean JCT is "
                      f"over the finished jobs only", highlight=False)
    console.print(f"wrote {', '.join(map(str, files))}", highlight=False, soft_wrap=True)
