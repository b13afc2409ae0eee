"""Tables and files for one collective, the algorithm list and the collective sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_json, write_text
from lightrail.units import format_rate, format_size, format_time

if TYPE_CHECKING:  # not at run time: `lightrail algorithms` imports this module and needs neither
    from lightrail.collectives import Algorithm
    from lightrail.studies.collective import CollectiveResult, CollectiveSweep, ReconfigurableResult

__all__ = ["print_collective", "print_reconfigurable", "algorithm_rows", "print_algorithms", "sweep_csv",
           "write_collective_sweep", "print_collective_sweep"]


def print_collective(result: CollectiveResult, console: Console) -> None:
    table = Table(title=f"{result.op} / {result.algorithm} on {result.topology}", show_header=False)
    for key, value in (("schedule", result.schedule), ("ranks", str(result.ranks)),
                       ("size per rank", format_size(result.size_bytes)), ("time", format_time(result.time_s)),
                       ("steps", str(result.steps)), ("algorithm bandwidth", format_rate(result.algbw_Bps)),
                       ("bus bandwidth", format_rate(result.busbw_Bps)),
                       ("verified", f"yes ({result.verification})")):
        table.add_row(key, value)
    console.print(table)


def print_reconfigurable(result: ReconfigurableResult, console: Console) -> None:
    delay = result.reconfig_delay_s
    table = Table(title=f"{result.op} / {result.algorithm} on a reconfigurable fabric ({result.ports} ports, "
                        f"delay {format_time(delay) if delay else '0'})", show_header=False)
    for key, value in (("time", format_time(result.time_s)),
                       ("on the initial circuits only", format_time(result.static_time_s)),
                       ("threshold heuristic (short-circuiting)", format_time(result.threshold_time_s)),
                       ("reconfigurations", str(result.reconfigurations)), ("steps", str(result.steps)),
                       ("bus bandwidth", format_rate(result.busbw_Bps)),
                       ("verified", f"yes ({result.verification})"), ("plan", "exact" if result.exact else "windowed")):
        table.add_row(key, value)
    console.print(table)
    steps = Table(title="plan")
    for col in ("step", "action", "configuration", "time"):
        steps.add_column(col, justify="right")
    for row in result.rows():
        steps.add_row(str(row["step"]), "reconfigure" if row["reconfigure"] else "stay", str(row["configuration"]),
                      format_time(row["time_s"]))
    console.print(steps)


def algorithm_rows(listed: Sequence[Algorithm]) -> list[dict]:
    """One row per algorithm; ``auto`` marks what a program's collective runs when it names none."""
    return [{"op": str(a.kind), "algorithm": a.name, "steps": a.steps, "summary": a.summary, "auto": a.auto}
            for a in listed]


def print_algorithms(listed: Sequence[Algorithm], console: Console) -> None:
    table = Table(title="collective algorithms")
    for col in ("op", "algorithm", "steps", "summary"):
        table.add_column(col)
    for r in algorithm_rows(listed):
        table.add_row(r["op"], r["algorithm"] + (" (auto)" if r["auto"] else ""), r["steps"], r["summary"])
    console.print(table)


def sweep_csv(sweep: CollectiveSweep) -> str:
    """One line per size: each algorithm's time, then the fastest algorithm's name."""
    names, best = sweep.algorithms, sweep.best()
    lines = ["size_bytes," + ",".join(f"{n}_time_s" for n in names) + ",best"]
    for s in sweep.sizes:
        times = sweep.times(s)
        lines.append(f"{s:.0f}," + ",".join(f"{times[n]:.9g}" for n in names) + f",{best[s].algorithm}")
    return "\n".join(lines) + "\n"


def write_collective_sweep(sweep: CollectiveSweep, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """sweep.<fmt>, sweep.json and sweep.csv in ``out_dir``."""
    from lightrail.report.plots import plot_sweep  # matplotlib, only when a sweep is written

    return [plot_sweep(sweep.rows(), out_dir / f"sweep.{fmt}",
                       title=f"{sweep.op} on {sweep.topology}, {sweep.ranks} ranks"),
            write_json(out_dir / "sweep.json", sweep.to_dict()),
            write_text(out_dir / "sweep.csv", sweep_csv(sweep))]


def print_collective_sweep(sweep: CollectiveSweep, console: Console, out_dir: Path, *, fmt: str = "png") -> None:
    names, best = sweep.algorithms, sweep.best()
    table = Table(title=f"{sweep.op}, {sweep.ranks} ranks on {sweep.topology}: time per collective")
    table.add_column("size", justify="right")
    for n in names:
        table.add_column(n, justify="right")
    for s in sweep.sizes:
        times = sweep.times(s)
        cells = [(f"[bold green]{format_time(times[n])}[/]" if n == best[s].algorithm else format_time(times[n]))
                 for n in names]
        table.add_row(format_size(s), *cells)
    console.print(table)
    console.print(f"wrote {out_dir / 'sweep.json'}, {out_dir / 'sweep.csv'}, {out_dir / f'sweep.{fmt}'}")
