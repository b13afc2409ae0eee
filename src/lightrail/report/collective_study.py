"""Heat maps, summary.csv, study.json and the tables of the collective study."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_json, write_text
from lightrail.report.plots import plot_speedup_heatmaps
from lightrail.studies.collective_study import CSV_COLUMNS, CollectiveStudy
from lightrail.units import format_size, format_time

__all__ = ["study_csv", "write_study", "print_study"]


def study_csv(study: CollectiveStudy) -> str:
    """One line per cell: the best algorithm and time per static fabric, the best reconfigurable one, speedups."""
    lines = [",".join(CSV_COLUMNS)]
    for r in study.rows():
        lines.append(",".join(str(x) for x in (
            r["op"], r["ranks"], int(r["size_bytes"]), r["delay_s"], r["static_ring"], f"{r['static_ring_s']:.6g}",
            r["static_torus"], f"{r['static_torus_s']:.6g}", r["switch"], f"{r['switch_s']:.6g}",
            r["reconfigurable"], f"{r['reconfigurable_s']:.6g}", r["reconfigurations"],
            f"{r['speedup_vs_static_ring']:.4g}", f"{r['speedup_vs_best_static']:.4g}")))
    return "\n".join(lines) + "\n"


def write_study(study: CollectiveStudy, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """heatmap-<op>.<fmt> per op, summary.csv and study.json in ``out_dir``."""
    grid = study.grid
    written = [plot_speedup_heatmaps(op, list(grid.ranks), grid.sizes, grid.delays, study.speedups(op),
                                     out_dir / f"heatmap-{op}.{fmt}",
                                     title=f"{op}: reconfigurable ({grid.ports} ports) vs the best algorithm on a "
                                           f"static ring")
               for op in grid.ops]
    return [*written, write_text(out_dir / "summary.csv", study_csv(study)),
            write_json(out_dir / "study.json", study.to_dict())]


def _size(nbytes) -> str:
    return format_size(nbytes) if nbytes else "none"


def print_study(study: CollectiveStudy, console: Console, out_dir: Path, *, fmt: str = "png") -> None:
    table = Table(title="reconfigurable vs static ring: best speedup per (op, ranks), and where")
    for col in ("op", "ranks", "max speedup", "at size", "at delay", "algorithm", "reconfigs"):
        table.add_column(col, justify="right" if col not in ("op", "algorithm") else "left")
    for best in study.best_cells():
        rc = best["best_reconfigurable"]
        table.add_row(best["op"], str(best["ranks"]), f"{best['speedup_vs_static_ring']:.2f}x",
                      format_size(best["size_bytes"]), format_time(best["delay_s"]) if best["delay_s"] else "0",
                      rc["algorithm"], str(rc["reconfigurations"]))
    console.print(table)
    for f in study.findings:
        if f["finding"].startswith("static ring"):
            console.print(f"n={f['ranks']:>5}: on a static ring, Ring AllReduce beats recursive doubling from "
                          f"{format_size(f['ring_wins_from_bytes']) if f['ring_wins_from_bytes'] else 'no size'} up"
                          f" (at the smallest size recursive doubling takes {f['ratio_rd_over_ring_at_smallest']:.2f}x"
                          f" Ring's time)")
        elif f["finding"].startswith("short-circuited"):
            reach = ", ".join(f"{format_time(float(d)) if float(d) else '0'}: {_size(s)}"
                              for d, s in f["wins_up_to_size_by_delay"].items())
            console.print(f"n={f['ranks']:>5}: short-circuited recursive doubling beats Ring on the static ring up "
                          f"to (delay: size) {reach}; static recursive doubling only up to "
                          f"{_size(f['static_wins_up_to_size'])}")
    console.print(f"wrote {out_dir / 'study.json'}, {out_dir / 'summary.csv'}, heat maps {out_dir}/heatmap-*.{fmt}")
