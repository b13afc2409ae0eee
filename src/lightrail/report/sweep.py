"""Files and tables of a sweep file's run (``lightrail sweep FILE``): one tidy table (CSV, and Parquet when
pyarrow is installed), the run's JSON, and the overhead plot."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_atomic, write_json, write_text
from lightrail.report.format import format_percent
from lightrail.report.plots import plot_sweep_cells
from lightrail.studies.sweep import SweepResult
from lightrail.units import format_time

__all__ = ["sweep_csv", "write_file_sweep", "print_file_sweep"]


def sweep_csv(result: SweepResult) -> str:
    """The tidy table: one row per cell (failed cells keep their values and error, metrics empty)."""
    rows = result.rows()
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()})
    return buf.getvalue()


def _parquet(result: SweepResult, path: Path) -> Path | None:
    """The same table as Parquet, or None without pyarrow. A swept column of mixed types is written as text."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    rows = result.rows()
    columns = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        kinds = {type(v) for v in values}
        columns[key] = [str(v) for v in values] if len(kinds) > 1 and not kinds <= {int, float} else values
    table = pa.table(columns)
    return write_atomic(path, lambda tmp: pq.write_table(table, tmp))


def write_file_sweep(result: SweepResult, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """sweep.csv, sweep.parquet (with pyarrow), sweep.json, scenario.json and overhead.<fmt> in ``out_dir``."""
    written = [write_text(out_dir / "sweep.csv", sweep_csv(result))]
    parquet = _parquet(result, out_dir / "sweep.parquet")
    if parquet:
        written.append(parquet)
    written += [write_json(out_dir / "sweep.json", result.to_dict()),
                write_json(out_dir / "scenario.json", result.scenario)]
    ok = [r for r in result.rows() if r["status"] == "ok"]
    if ok:
        written.append(plot_sweep_cells(ok, list(result.fields), out_dir / f"overhead.{fmt}",
                                        title=f"{result.name}: overhead of photonic rails"))
    return written


def print_file_sweep(result: SweepResult, console: Console, written: list[Path]) -> None:
    ok = [c for c in result.cells if c.ok]
    table = Table(title=f"{result.name}: {len(result.cells)} cells over {', '.join(result.fields)} "
                        f"({result.runner}, {result.wall_s:.1f} s)")
    for col in ("", *result.fields, "photonic", "electrical", "overhead"):
        table.add_column(col, justify="right" if col else "left")
    if ok:
        for label, cell in (("lowest overhead", min(ok, key=lambda c: c.metrics["overhead"])),
                            ("highest overhead", max(ok, key=lambda c: c.metrics["overhead"]))):
            m = cell.metrics
            table.add_row(label, *(str(cell.values.get(f, "")) for f in result.fields),
                          format_time(m["iteration_time_s"]), format_time(m["baseline_iteration_time_s"]),
                          format_percent(m["overhead"]))
    console.print(table)
    for cell in result.failed[:5]:
        console.print(f"cell {cell.cell} failed ({', '.join(f'{k}={v}' for k, v in cell.values.items())}): "
                      f"{cell.error}", highlight=False, soft_wrap=True)
    if len(result.failed) > 5:
        console.print(f"... and {len(result.failed) - 5} more failed cells (status and error in the table)")
    console.print(f"{len(ok)} of {len(result.cells)} cells ran; wrote {', '.join(str(p) for p in written)}",
                  highlight=False)
