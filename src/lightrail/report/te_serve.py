"""``lightrail te serve`` for people: the controllers it started, one line (or table row) per epoch, the
blast radius of each slice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from lightrail.te.service import ServeRun

__all__ = ["print_ready", "epoch_line", "epoch_table", "event_line", "print_serve"]

_COLUMNS = ("epoch", "alive", "fresh", "overload", "worst link", "throughput", "max util", "affected")


def print_ready(info: dict, console: Console) -> None:
    """Where the network listens and which process controls which slice."""
    console.print(f"network on {info['host']}:{info['port']}: {info['topology']}, {len(info['controllers'])} "
                  f"slice controllers ({info['slicer']} slicing)", highlight=False)
    for c in info["controllers"]:
        console.print(f"  slice {c['slice']}: pid {c['pid']}, nodes {', '.join(c['nodes'])}", highlight=False)


def _cells(row: dict) -> list[str]:
    return [str(row["epoch"]), str(row["alive"]), ",".join(map(str, row["fresh"])) or "-",
            f"{row['divergence_overload_fraction']:.4f}", f"{row['worst_link_overload'] * 100:.1f}%",
            f"{row['throughput'] * 100:.2f}%", f"{row['max_link_utilization']:.3f}",
            f"{row['affected_fraction'] * 100:.1f}%"]


def epoch_line(row: dict) -> str:
    """One epoch as a line: ``epoch 3  alive 2  fresh 0,2  overload ...  affected 31.2%``."""
    labels = ("epoch", "alive", "fresh", "overload", "worst", "throughput", "mlu", "affected")
    text = "  ".join(f"{k} {v}" for k, v in zip(labels, _cells(row), strict=True))
    return f"[red]{text}[/]" if row["affected_fraction"] > 0 else text


def epoch_table(rows: list[dict], *, title: str = "te serve: epochs") -> Table:
    """Every epoch so far, one row each (the live view in a terminal)."""
    table = Table(title=title)
    for col in _COLUMNS:
        table.add_column(col, justify="left" if col == "fresh" else "right")
    for row in rows:
        table.add_row(*_cells(row), style="red" if row["affected_fraction"] > 0 else None)
    return table


def event_line(event: dict) -> str:
    """A controller that died, or a solve that failed."""
    if event.get("event") == "dead":
        return (f"[bold red]slice {event['slice']} controller (pid {event['pid']}) {event['how']} at epoch "
                f"{event['epoch']}[/]: its demands are unprogrammed; the other controllers keep running")
    return f"[yellow]slice {event.get('slice')} epoch {event.get('epoch')}: {event.get('message')}[/]"


def print_serve(run: ServeRun, console: Console, *, table: bool = False) -> None:
    """The summary at the end (and the epoch table when it was not shown live)."""
    if table and run.epochs:
        console.print(epoch_table(run.epochs))
    summary = Table(title=f"te serve: {run.topology}, {run.slices} slices ({run.slicer}), port {run.port}")
    for col in ("slice", "pid", "nodes", "traffic share", "status"):
        summary.add_column(col, justify="right" if col in ("slice", "pid") else "left")
    for c in run.controllers:
        status = "ran to the end" if c["died_at_epoch"] is None else f"{c['how']} at epoch {c['died_at_epoch']}"
        summary.add_row(str(c["slice"]), str(c["pid"]), ", ".join(c["nodes"]),
                        f"{run.blast_radius[c['slice']] * 100:.1f}%", status)
    console.print(summary)
    if run.epochs:
        worst = max(r["affected_fraction"] for r in run.epochs)
        mean_tp = sum(r["throughput"] for r in run.epochs) / len(run.epochs)
        console.print(f"{len(run.epochs)} epochs; mean throughput {mean_tp * 100:.2f}%; worst affected share "
                      f"{worst * 100:.1f}% (blast radius of one slice: {max(run.blast_radius.values()) * 100:.1f}%)"
                      + ("; stopped early" if run.stopped else ""), highlight=False)
