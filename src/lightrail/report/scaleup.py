"""What ``lightrail study scaleup`` shows people (rich tables) and writes (JSON, CSV summary, plots)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_json, write_text
from lightrail.units import format_rate, format_size, format_time

if TYPE_CHECKING:
    from lightrail.studies.scaleup import ScaleupStudy

__all__ = ["SCALEUP_FILES", "write_study", "print_study", "summary_csv"]

SCALEUP_FILES = ("scaleup.json", "summary.csv", "by-size.png")

_SUMMARY = ("acceptance", "fragmentation", "stranded_fraction", "mean_slice_bandwidth_Bps", "mean_allreduce_s",
            "elapsed_s")
_RECOVERY = ("failures", "hit", "spliced", "migrated", "degraded", "lost", "lost_accelerator_hours",
             "mean_bandwidth_ratio_after", "mean_allreduce_slowdown")


def summary_csv(result: ScaleupStudy) -> str:
    """One row per fabric: the headline figures and the failure costs."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["fabric", *_SUMMARY, *(f"failure_{k}" for k in _RECOVERY)])
    d = result.to_dict()
    for row in result.rows():
        f = d[row.fabric]
        w.writerow([row.fabric, *(f[k] for k in _SUMMARY), *(f["failure_recovery"][k] for k in _RECOVERY)])
    return buf.getvalue()


def _plot(result: ScaleupStudy, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    width = 0.38
    for k, row in enumerate(result.rows()):
        sizes = sorted(row.acceptance_by_size)
        x = [i + (k - 0.5) * width for i in range(len(sizes))]
        axes[0].bar(x, [row.acceptance_by_size[s] for s in sizes], width, label=row.fabric)
        axes[1].bar(x, [row.bandwidth_by_size_Bps.get(s, 0) / 1e9 for s in sizes], width, label=row.fabric)
        axes[2].bar(x, [row.allreduce_by_size_s.get(s, 0) * 1e3 for s in sizes], width, label=row.fabric)
    sizes = sorted(result.electrical.acceptance_by_size)
    for ax, label in zip(axes, ("acceptance (fraction of requests)", "slice bandwidth (GB/s per accelerator)",
                                f"ring AllReduce of {format_size(result.allreduce_bytes)} (ms)"), strict=True):
        ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set_xlabel("slice size (accelerators)")
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Scale-up slices: {result.racks} racks, {result.requests} requests, seed {result.seed}")
    fig.tight_layout()
    from lightrail.report.plots import _write

    return _write(fig, path)


def write_study(result: ScaleupStudy, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """The plot (as ``fmt``), the CSV summary, then ``scaleup.json`` (each atomically); returns the paths."""
    from lightrail.report.plots import figure_files

    files = [Path(out_dir) / name for name in figure_files(SCALEUP_FILES, fmt)]
    _plot(result, files[2])
    write_text(files[1], summary_csv(result))
    write_json(files[0], result.to_dict())
    return files


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def print_study(result: ScaleupStudy, console: Console, files: list[Path]) -> None:
    table = Table(title=f"Scale-up slicing: {result.racks} racks x 64 accelerators, {result.requests} requests "
                        f"(seed {result.seed}{', trace ' + result.trace if result.trace else ''})")
    table.add_column("figure")
    for row in result.rows():
        table.add_column(row.fabric, justify="right")
    e, p = result.electrical, result.photonic
    fe, fp = e.failure_recovery, p.failure_recovery
    lines = [
        ("acceptance", _pct(e.acceptance), _pct(p.acceptance)),
        ("fragmentation (refused with room)", _pct(e.fragmentation), _pct(p.fragmentation)),
        ("stranded free accelerators", _pct(e.stranded_fraction), _pct(p.stranded_fraction)),
        ("mean slice bandwidth", format_rate(e.mean_slice_bandwidth_Bps), format_rate(p.mean_slice_bandwidth_Bps)),
        ("mean ring AllReduce", format_time(e.mean_allreduce_s), format_time(p.mean_allreduce_s)),
        ("failures / on a slice", f"{fe.failures} / {fe.hit}", f"{fp.failures} / {fp.hit}"),
        ("spliced / migrated / degraded / lost", f"{fe.spliced} / {fe.migrated} / {fe.degraded} / {fe.lost}",
         f"{fp.spliced} / {fp.migrated} / {fp.degraded} / {fp.lost}"),
        ("bandwidth after recovery (ratio)", f"{fe.mean_bandwidth_ratio_after:.3f}",
         f"{fp.mean_bandwidth_ratio_after:.3f}"),
        ("simulated in", format_time(e.elapsed_s), format_time(p.elapsed_s)),
    ]
    for line in lines:
        table.add_row(*line)
    console.print(table)
    sizes = Table(title="Per slice size")
    for col in ("size", "acceptance el.", "acceptance ph.", "bandwidth el.", "bandwidth ph.", "AllReduce speedup"):
        sizes.add_column(col, justify="right")
    speed = result.allreduce_speedup_by_size
    for s in sorted(e.acceptance_by_size):
        sizes.add_row(str(s), _pct(e.acceptance_by_size[s]), _pct(p.acceptance_by_size.get(s, 0.0)),
                      format_rate(e.bandwidth_by_size_Bps.get(s, 0.0)),
                      format_rate(p.bandwidth_by_size_Bps.get(s, 0.0)),
                      f"{speed[s]:.2f}x" if s in speed else "-")
    console.print(sizes)
    console.print(f"wrote {', '.join(map(str, files))}", highlight=False, soft_wrap=True)
