"""What ``lightrail stragglar`` shows people (rich tables) and writes (the sweep's JSON and plots)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lightrail.report.files import write_json
from lightrail.units import format_rate, format_size, format_time

if TYPE_CHECKING:  # only types: showing a result should not import the gloo launcher
    from lightrail.studies.stragglar import StragglarComparison, StragglarRounds, StragglarSweep
    from lightrail.studies.stragglar_run import StragglarRun

__all__ = ["print_rounds", "print_comparison", "print_run", "run_mismatch", "write_sweep", "print_sweep",
           "SWEEP_FILES"]

SWEEP_FILES = ("sweep.json", "speedup-vs-ranks.png", "speedup-vs-delay.png")
METHOD_NAMES = {"stragglar": "StragglAR", "ring": "lightrail Ring", "native": "gloo dist.all_reduce"}


def _late(seconds: float) -> str:
    return format_time(seconds) if seconds else "0 s"


def print_rounds(result: StragglarRounds, console: Console) -> None:
    table = Table(title="StragglAR phase-2 rounds")
    for col in ("ranks", "rounds", "lower bound", "gap"):
        table.add_column(col, justify="right")
    for r in result.rows():
        table.add_row(str(r.ranks), str(r.rounds), str(r.lower_bound), str(r.gap))
    console.print(table)


def print_comparison(result: StragglarComparison, console: Console) -> None:
    table = Table(title=f"AllReduce of {format_size(result.size_bytes)} on {result.topology}, "
                        f"straggler {_late(result.delay_s)} late")
    table.add_column("algorithm")
    table.add_column("time to finish (from start)", justify="right")
    table.add_column("after straggler arrives", justify="right")
    for row in result.rows():
        table.add_row(row.algorithm, format_time(row.time_s), format_time(row.after_arrival_s))
    console.print(table)
    console.print(f"StragglAR vs Ring: {result.speedup_over_ring:.2f}x from start, "
                  f"{result.speedup_over_ring_after_arrival:.2f}x after straggler arrives")
    console.print(f"StragglAR vs waiting then running {result.wait_then_best}: {result.speedup_over_best:.2f}x "
                  f"from start, {result.speedup_over_best_after_arrival:.2f}x after straggler arrives")


def print_run(result: StragglarRun, console: Console) -> None:
    table = Table(title=f"AllReduce of {format_size(result.size_bytes)} on {result.ranks} gloo processes, "
                        f"rank {result.straggler} {_late(result.delay_s)} late (median of {result.repeats})")
    table.add_column("method")
    table.add_column("time to finish", justify="right")
    table.add_column("StragglAR speedup over it", justify="right")
    rows = result.rows()
    for row in rows:
        table.add_row(METHOD_NAMES[row.method], format_time(row.time_s), f"{row.stragglar_speedup:.2f}x")
    console.print(table)
    console.print("matches dist.all_reduce: " + ", ".join(
        f"{METHOD_NAMES[row.method]} {'yes' if row.correct else 'NO'}" for row in rows))


def run_mismatch(result: StragglarRun) -> str | None:
    """The error line when a method's result differed from ``dist.all_reduce``, else None."""
    wrong = [row for row in result.rows() if not row.correct]
    if not wrong:
        return None
    return (f"[bold red]error:[/] {', '.join(row.method for row in wrong)} did not match dist.all_reduce "
            "(max abs error " + ", ".join(f"{row.max_abs_error:.3g}" for row in wrong) + ")")


def _sweep_title(result: StragglarSweep) -> str:
    title = f"StragglAR AllReduce of {format_size(result.size_bytes)}"
    if result.settings is not None:
        hop = result.settings.latency_s
        title += (f", {format_rate(result.settings.bandwidth_Bps)} per GPU, "
                  f"{format_time(hop) if hop else '0'} per hop")
    return title + f", alpha {format_time(result.alpha_s) if result.alpha_s else '0'}"


def write_sweep(result: StragglarSweep, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """Both plots (as ``fmt``), then ``sweep.json`` (each written atomically); returns the three paths."""
    from lightrail.report.plots import figure_files, plot_straggler_speedups

    files = [Path(out_dir) / name for name in figure_files(SWEEP_FILES, fmt)]
    plot_straggler_speedups(result.to_dict(), files[1], files[2], at_delay=result.at_delay_s,
                            at_ranks=result.at_ranks, title=_sweep_title(result))
    write_json(files[0], result.to_dict())
    return files


def print_sweep(result: StragglarSweep, files: list[Path], console: Console) -> None:
    table = Table(title=f"StragglAR AllReduce of {format_size(result.size_bytes)}, straggler "
                        f"{_late(result.at_delay_s)} late")
    for col in ("topology", "n", "StragglAR", "Ring", "vs Ring (from start)", "vs Ring (after straggler arrives)",
                "wait-then-best", "vs it (from start)", "vs it (after straggler arrives)"):
        table.add_column(col, justify="left" if col in ("topology", "wait-then-best") else "right")
    shown = result.rows()
    for c, after in zip(shown, shown[1:] + [None], strict=True):
        table.add_row(c.topology, str(c.ranks), format_time(c.stragglar_s), format_time(c.ring_s),
                      f"{c.speedup_over_ring:.3f}x", f"{c.speedup_over_ring_after_arrival:.3f}x",
                      c.wait_then_best, f"{c.speedup_over_best:.3f}x", f"{c.speedup_over_best_after_arrival:.3f}x",
                      end_section=after is not None and after.topology != c.topology)
    console.print(table)
    for s in result.skipped:
        console.print(f"skipped {s.topology} n={s.ranks}: {escape(s.reason)}", highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(map(str, files))}", highlight=False, soft_wrap=True)
