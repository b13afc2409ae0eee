"""Tables and files for photonic against electrical rails: ``simulate`` and the OCS delay ``sweep``."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_json
from lightrail.report.format import ZERO_TIME, format_percent, format_usd, format_watts
from lightrail.studies.rails import BREAKDOWN, DelaySweep, RailsComparison
from lightrail.units import format_time

__all__ = ["signed_time", "write_simulate", "print_simulate", "write_sweep", "print_sweep"]

_PARTS = (("compute_s", "compute"), ("communication_s", "exposed communication"),
          ("reconfiguration_s", "reconfiguration stall"), ("control_s", "controller round trips"),
          ("bubble_s", "pipeline bubble"))


def signed_time(seconds: float) -> str:
    """``+1.2ms``, ``-3us``, or ``0`` below half a nanosecond (a sum of differences is rarely exactly 0)."""
    if abs(seconds) < ZERO_TIME:
        return "0"
    return ("-" if seconds < 0 else "+") + format_time(abs(seconds))


def _time(seconds: float) -> str:
    """A time in a table: ``format_time``, or ``0`` below half a nanosecond (float rounding, not a stall)."""
    return "0" if abs(seconds) < ZERO_TIME else format_time(seconds)


def _delay(seconds: float) -> str:
    return format_time(seconds) if seconds else "0"


def write_simulate(result: RailsComparison, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """breakdown.<fmt>, overhead.<fmt>, trace.json (Perfetto), summary.json and scenario.json in ``out_dir``."""
    from lightrail.report.plots import plot_breakdown, plot_overhead_breakdown  # matplotlib: only to write

    built = result.built
    setting = f"OCS delay {format_time(built.fabric.ocs_delay)}, {built.policy.mode}"
    rows = {f"{name} rails" if name != "ideal" else "ideal rails (OCS, 0 delay)": summary
            for name, summary in result.breakdown.items()}
    return [plot_breakdown(rows, out_dir / f"breakdown.{fmt}",
                           title=f"{built.scenario.name}: {built.job.layout}, {setting}"),
            *([plot_overhead_breakdown(result.rows(), out_dir / f"overhead.{fmt}",
                                       title=f"{built.scenario.name}: where the photonic overhead goes, {setting}")]
              if result.ablation else []),  # none with --no-ablation
            write_json(out_dir / "trace.json", result.trace()),
            write_json(out_dir / "summary.json", result.to_dict()),
            write_json(out_dir / "scenario.json", built.scenario.model_dump(mode="json"))]


def print_simulate(result: RailsComparison, console: Console, out_dir: Path, *, fmt: str = "png") -> None:
    built = result.built
    e, p = result.breakdown["electrical"], result.breakdown["photonic"]
    ce, cp = result.costs["electrical"], result.costs["photonic"]
    table = Table(title=f"{built.scenario.name}: {built.model.name} on {result.gpus} x {built.gpu.name}, "
                        f"{result.layout}")
    table.add_column("")
    table.add_column("electrical rails", justify="right")
    table.add_column(f"photonic rails ({format_time(built.fabric.ocs_delay)})", justify="right")
    table.add_row("iteration time", format_time(e["iteration_time_s"]), format_time(p["iteration_time_s"]))
    table.add_row("overhead", "-", format_percent(result.overhead))
    for key, label in _PARTS:
        table.add_row(f"  {label}", _time(e[key]), _time(p[key]))
    table.add_row("reconfigurations / iteration / rail", "0", f"{result.reconfigurations_per_iteration:.1f}")
    table.add_row("controller round trips / iteration / rank", "0",
                  f"{result.controller_round_trips_per_iteration:.1f}")
    table.add_row("rail network power", format_watts(ce["power_w"]), format_watts(cp["power_w"]))
    table.add_row("rail network cost", format_usd(ce["capex_usd"]), format_usd(cp["capex_usd"]))
    table.add_row("electrical / photonic", "", f"power {result.power_ratio:.1f}x, cost {result.cost_ratio:.2f}x")
    console.print(table)
    mode = str(built.policy.mode)
    ablation = Table(title=f"policy ablation ({mode}): the published Opus policy, then lightrail's knobs")
    for col in ("policy", "iteration", "overhead", "reconfigs / rail", "round trips / rank"):
        ablation.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    split = Table(title=f"where the overhead goes ({mode}): {' + '.join(lbl for _, lbl in BREAKDOWN)}")
    for col in ("policy", *(lbl for _, lbl in BREAKDOWN)):
        split.add_column(col, justify="left" if col == "policy" else "right")
    for row in result.ablation:
        ablation.add_row(row.policy, format_time(row.iteration_time_s), format_percent(row.overhead),
                         f"{row.reconfigurations_per_iteration:.1f}",
                         f"{row.controller_round_trips_per_iteration:.1f}")
        split.add_row(row.policy, *(signed_time(row.overhead_breakdown_s[k]) for k, _ in BREAKDOWN))
    if result.ablation:  # none with --no-ablation
        console.print(ablation)
        console.print(split)
    b = result.overhead_breakdown_s
    console.print(f"photonic overhead {signed_time(result.iteration_time_s - result.baseline_iteration_time_s)} = "
                  + " + ".join(f"{lbl} {signed_time(b[k])}" for k, lbl in BREAKDOWN)
                  + f"; electrical rails routed by {result.routing.upper()}; controller round trip "
                  f"{format_time(result.check_in_rtt_s)}, command {format_time(result.command_latency_s)}; "
                  + ("collectives as NCCL runs them" if result.collectives == "nccl" else "textbook schedules")
                  + (", ops in flight sharing links" if result.sharing == "fair" else ", each op timed alone"),
                  highlight=False)
    if result.plan:
        phases = ", ".join(f"{phase}: {len(cfgs)} configuration{'s' if len(cfgs) > 1 else ''} "
                           f"({'/'.join(str(n) for n in cfgs.values())} circuits)"
                           for phase, cfgs in result.plan["phases"].items())
        console.print(f"plan: {phases}; switches {result.plan['trigger']}", highlight=False)
    console.print(f"ideal rail (zero-delay OCS): {format_time(result.ideal_iteration_time_s)}; wrote "
                  f"{out_dir / 'summary.json'}, {out_dir / 'trace.json'} (open in ui.perfetto.dev), "
                  f"{out_dir / f'breakdown.{fmt}'}" + (f", {out_dir / f'overhead.{fmt}'}" if result.ablation else ""))


def write_sweep(result: DelaySweep, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """overhead.<fmt>, sweep.json and scenario.json in ``out_dir``."""
    from lightrail.report.plots import plot_delay_sweep  # matplotlib: only to write

    built = result.built
    return [write_json(out_dir / "scenario.json", built.scenario.model_dump(mode="json")),
            plot_delay_sweep(result.rows(), out_dir / f"overhead.{fmt}",
                             title=f"{built.scenario.name}: {built.job.layout}, overhead of photonic rails"),
            write_json(out_dir / "sweep.json", result.to_dict())]


def print_sweep(result: DelaySweep, console: Console, out_dir: Path, *, fmt: str = "png") -> None:
    table = Table(title=f"{result.scenario}: overhead vs electrical rails "
                        f"({format_time(result.baseline_iteration_time_s)} per iteration)")
    table.add_column("delay", justify="right")
    columns = result.columns
    for policy, mode in columns:
        table.add_column(f"{policy} {mode}", justify="right")
    for d in result.delays:
        cells = []
        for policy, mode in columns:
            run = result.run(policy, mode, d)
            cells.append(f"{format_percent(run.overhead)} ({run.reconfigurations_per_iteration:.0f})")
        table.add_row(_delay(d), *cells)
    console.print(table)
    mode = str(result.built.policy.mode)
    split = Table(title=f"where the overhead goes ({mode}): {' + '.join(lbl for _, lbl in BREAKDOWN)}")
    split.add_column("delay", justify="right")
    split.add_column("policy")
    for _, lbl in BREAKDOWN:
        split.add_column(lbl, justify="right")
    for d in result.delays:
        for policy in ("opus", "lightrail"):
            run = result.run(policy, mode, d)
            split.add_row(_delay(d), policy, *(signed_time(run.overhead_breakdown_s[k]) for k, _ in BREAKDOWN),
                          end_section=policy == "lightrail" and d != result.delays[-1])
    console.print(split)
    console.print(f"in brackets: reconfigurations per rail per iteration; electrical rails routed by "
                  f"{result.routing.upper()}; every row's overhead_breakdown_s is in the JSON", highlight=False)
    console.print(f"wrote {out_dir / 'sweep.json'}, {out_dir / f'overhead.{fmt}'}")
