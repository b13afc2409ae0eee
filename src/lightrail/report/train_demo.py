"""The control plane in the loop, for people and for files: the train-demo's table, summary and outputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_json
from lightrail.units import format_time

if TYPE_CHECKING:
    from lightrail.studies.train_demo.measure import PhotonicDemoResult, Row

__all__ = ["train_demo_title", "train_demo_table", "print_train_demo", "write_train_demo"]


def train_demo_title(result: PhotonicDemoResult) -> str:
    """``8 ranks TP2 PP2 DP2, OCS 10ms, provisioned``: the job and fabric, for the plot and the table."""
    return (f"{result.ranks} ranks TP{result.tp} PP{result.pp} DP{result.dp}, OCS {format_time(result.ocs_delay_s)}, "
            f"{result.mode}")


def _cell(row: Row, value: float | None, *, relative: float | None = None) -> str:
    if value is None:
        return ""
    text = format_time(value) if row.unit == "s" else f"{value:.1f}"
    return text if relative is None else f"{text} ({relative * 100:+.1f}%)"


def train_demo_table(result: PhotonicDemoResult) -> Table:
    """Gloo, the lightrail backend and ``simulate``'s prediction side by side, one row per quantity."""
    table = Table(title=f"train-demo: {result.ranks} CPU ranks (TP{result.tp} PP{result.pp} DP{result.dp}), "
                        f"{result.rails} rails, OCS {format_time(result.ocs_delay_s)}, {result.mode}")
    for col in ("", "gloo", "lightrail backend", "simulate (same job)"):
        table.add_column(col, justify="right" if col else "left")
    for row in result.rows():
        table.add_row(row.what, _cell(row, row.gloo), _cell(row, row.lightrail, relative=row.relative),
                      _cell(row, row.simulate))
    return table


def print_train_demo(result: PhotonicDemoResult, console: Console, *, wrote: Sequence[Path] = ()) -> None:
    """The table, then how far the model is from the measurement and whether the run was sound."""
    console.print(train_demo_table(result))
    ratio, p = result.model_to_measured_ratio, result.predicted
    console.print(f"measured / predicted overhead: {'n/a' if ratio is None else f'{ratio:.2f}x'} (model computes "
                  f"at this CPU's rate, {p.peak_tflops * 1e3:.2f} GFLOP/s peak, measured on gloo); leases "
                  f"{'on' if result.leases else 'off'}")
    if result.wrapper_overhead_s is not None:
        fabric = result.fabric_model_to_measured_ratio
        console.print(f"of the overhead, the lightrail process group itself (no controller) "
                      f"{format_time(result.wrapper_overhead_s)}; circuits and controller "
                      f"{format_time(result.fabric_overhead_s)}, {'n/a' if fabric is None else f'{fabric:.2f}x'} "
                      f"the model's", highlight=False)
    if p.host_cores:
        work, lag = p.host_work_s, p.switch_grant_latency_s
        console.print(f"the model's emulation: compute on {p.host_cores} shared cores (processor sharing); the control "
                      f"plane's CPU on them {'n/a' if work is None else format_time(work)} per iteration; "
                      f"{'n/a' if lag is None else format_time(lag)} from a switch's end to its grant", highlight=False)
    lat = result.request_latency_p99_s
    console.print(f"controller request latency p99 {format_time(lat) if lat else 'n/a'}; losses identical: "
                  f"{'yes' if result.losses_identical else 'NO'}; unsafe reconfigurations: "
                  f"{int(result.unsafe_reconfigurations)}")
    restarts = result.controller_restarts
    if restarts:
        console.print(f"controller killed (SIGKILL) and restarted {restarts} time{'s' if restarts > 1 else ''} "
                      f"mid-training; the ranks reconnected and finished", highlight=False)
    rec = result.recovery
    if rec:
        console.print(f"rank {rec['rank']} killed (SIGKILL), spare {rec['spare']} took its place "
                      f"({rec['detected_by']} detected it): detect {format_time(rec['detect_s'])}, rewire "
                      f"{format_time(rec['rewire_s'])}, rebuild {format_time(rec['rebuild_s'])}, restore "
                      f"{format_time(rec['restore_s'])}, first step after {format_time(rec['first_step_s'])}; "
                      f"resumed after step {rec['checkpoint_step']}, {rec['steps_lost']} steps lost; losses match "
                      f"an uninterrupted run: {'yes' if rec['losses_match_uninterrupted'] else 'NO'}",
                      highlight=False)
    console.print(f"measurement: {result.measurement}", highlight=False)
    if wrote:
        console.print(f"wrote {', '.join(map(str, wrote))}")


def write_train_demo(result: PhotonicDemoResult, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """``train-demo.json`` (``result.to_dict()``) and ``iterations.<fmt>`` in ``out_dir``, each written atomically."""
    from lightrail.report.plots import plot_train_demo

    out_dir = Path(out_dir)
    return [write_json(out_dir / "train-demo.json", result.to_dict()),
            plot_train_demo(result, out_dir / f"iterations.{fmt}", title=train_demo_title(result))]
