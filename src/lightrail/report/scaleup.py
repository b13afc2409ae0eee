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
            "spare_coverage", "free_capacity_coverage", "mean_servers_out", "elapsed_s")
_RECOVERY = ("failures", "hit", "spliced", "spliced_from_spare", "spliced_from_free", "migrated", "degraded", "lost",
             "uncovered", "lost_accelerator_hours", "mean_bandwidth_ratio_after", "mean_allreduce_slowdown")


def summary_csv(result: ScaleupStudy) -> str:
    """One row per fabric: the headline figures and the failure costs."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["fabric", *_SUMMARY, *(f"failure_{k}" for k in _RECOVERY)])
    d = result.to_dict()
    for row in result.fabrics():
        f = d[row.fabric]
        w.writerow([row.fabric, *(f[k] for k in _SUMMARY), *(f["failure_recovery"][k] for k in _RECOVERY)])
    return buf.getvalue()


def _plot(result: ScaleupStudy, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    width = 0.38
    for k, row in enumerate(result.fabrics()):
        sizes = sorted(row.acceptance_by_size)
        x = [i + (k - 0.5) * width for i in range(len(sizes))]
        axes[0].bar(x, [row.acceptance_by_size[s] for s in sizes], width, label=row.fabric)
        axes[1].bar(x, [row.bandwidth_by_size_Bps.get(s, 0) / 1e9 for s in sizes], width, label=row.fabric)
        axes[2].bar(x, [row.allreduce_by_size_s.get(s, 0) * 1e3 for s in sizes], width, label=row.fabric)
    sizes = sorted(result.electrical.acceptance_by_size)
    for row in result.fabrics():
        pts = [(b["t_end_s"] / 3600, b["fragmentation"]) for b in row.fragmentation_over_time if b["requests"]]
        axes[3].plot([t for t, _ in pts], [f for _, f in pts], marker=".", label=row.fabric)
    axes[3].set_xlabel("time (h)")
    axes[3].set_ylabel("fragmentation (refused with room)")
    axes[3].grid(True, alpha=0.3)
    for ax, label in zip(axes[:3], ("acceptance (fraction of requests)", "slice bandwidth (GB/s per accelerator)",
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


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.2f}%"


def print_study(result: ScaleupStudy, console: Console, files: list[Path]) -> None:
    table = Table(title=f"Scale-up slicing: {result.racks} racks x 64 accelerators, {result.requests} requests "
                        f"(seed {result.seed}{', trace ' + result.trace if result.trace else ''})")
    table.add_column("figure")
    for row in result.fabrics():
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
        ("covered by spares / other free capacity", f"{_pct(e.spare_coverage)} / {_pct(e.free_capacity_coverage)}",
         f"{_pct(p.spare_coverage)} / {_pct(p.free_capacity_coverage)}"),
        ("servers out for repair (mean per rack)", f"{e.mean_servers_out:.3f}", f"{p.mean_servers_out:.3f}"),
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
    refusals = result.electrical_refusals
    console.print(f"Of {refusals['refused']:,} requests the electrical torus refused, the photonic rack would have "
                  f"placed {refusals['photonic_would_place']:,} on the same free servers "
                  f"({_pct(refusals['share_photonic_would_place'])}); its own run placed "
                  f"{refusals['placed_in_photonic_run']:,}.", highlight=False)
    if result.rows:
        sweep = Table(title="Spare servers per rack (photonic; share of failures that hit a slice)")
        for col in ("spares", "per accelerators", "failures hit", "from spares", "from other free", "not covered"):
            sweep.add_column(col, justify="right")
        for row in result.rows:
            sweep.add_row(str(row["spare_servers"]), str(row["accelerators_per_rack"]), str(row["failures_hit"]),
                          _pct(row["spare_coverage"]), _pct(row["free_capacity_coverage"]), _pct(row["uncovered"]))
        console.print(sweep)
    console.print(f"wrote {', '.join(map(str, files))}", highlight=False, soft_wrap=True)
