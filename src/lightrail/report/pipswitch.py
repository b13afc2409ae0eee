"""What ``lightrail pipswitch`` shows people: a summary, the rounds, and the cell states of small meshes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from lightrail.control.pipswitch import PipSwitchResult

__all__ = ["print_pipswitch", "MESH_PICTURE_PORTS"]

MESH_PICTURE_PORTS = 16
"""Up to this many ports the table draws each round's cells (``X`` cross, ``.`` bar)."""

PAIRS_SHOWN = 8


def _pairs(pairs: list[tuple[int, int]]) -> str:
    text = " ".join(f"{a}-{b}" for a, b in pairs[:PAIRS_SHOWN])
    return text + (f" ... (+{len(pairs) - PAIRS_SHOWN})" if len(pairs) > PAIRS_SHOWN else "")


def print_pipswitch(result: PipSwitchResult, console: Console) -> None:
    draw = result.ports <= MESH_PICTURE_PORTS
    table = Table(title=f"PipSwitch: {result.ports} ports on a {result.mesh} of {result.cells} cells")
    table.add_column("round", justify="right")
    table.add_column("matching (port pairs)")
    table.add_column("cross cells", justify="right")
    table.add_column("cells changed", justify="right")
    if draw:
        table.add_column("cells (X cross, . bar)", no_wrap=True)
    idle = result.idle_ports()
    for k, (pairs, changed) in enumerate(zip(result.rounds, result.changes_per_round, strict=True)):
        text = _pairs(pairs) + (f"  (idle {idle[k]})" if idle[k] is not None else "")
        row = [str(k), text, str(int(result.states[k].sum())), str(changed)]
        if draw:
            row.append("\n".join("".join("X" if c else "." for c in line) for line in result.states[k]))
        table.add_row(*row)
    console.print(table)
    console.print(f"rounds: {len(result.rounds)} (lower bound {result.lower_bound_rounds}); "
                  f"realizable: {'yes' if result.realizable else 'NO'}; "
                  f"cell changes: {result.cell_changes} (naive round order: {result.naive_cell_changes})")
