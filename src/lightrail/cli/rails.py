"""``lightrail simulate``, ``sweep``, ``check``, ``cost``: photonic against electrical rails for a training job."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import (
    Delay,
    GpusPerServer,
    JsonOut,
    ModeOpt,
    Scenario,
    built_scenario,
    print_json,
    progress_bar,
    signed_time,
)
from lightrail.errors import ScenarioError
from lightrail.units import format_time, parse_time


@app.command("check")
@friendly
def check_cmd(scenario: Scenario = None):
    """Validate a scenario file without simulating (exit 2 and the field at fault if it is wrong)."""
    built = built_scenario(scenario)
    out.print(f"ok: {built.scenario.name}: {built.model.name} on {built.job.layout.world} {built.gpu.name}, "
              f"{built.job.layout}, {built.job.micro_batches} micro-batches")


@app.command("simulate")
@friendly
def simulate_cmd(
    scenario: Scenario = None,
    delay: Delay = None,
    mode: ModeOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for summary.json, trace.json, breakdown.png and "
                                          "overhead.png.")] = Path("out/simulate"),
    as_json: JsonOut = False,
):
    """Electrical vs photonic rails for one training job: iteration time, overhead, reconfigurations,
    power and cost, the policy ablation; writes a Perfetto trace and a breakdown plot."""
    from lightrail.report.files import write_json
    from lightrail.report.plots import plot_breakdown, plot_overhead_breakdown
    from lightrail.sim.trace import chrome_trace
    from lightrail.studies.rails import ABLATION, BREAKDOWN, compare_rails

    built = built_scenario(scenario, delay, mode)
    progress, task = progress_bar(3 + len(ABLATION), f"simulating {built.scenario.name}", as_json)
    with progress:
        result = compare_rails(built, progress=lambda name: progress.update(task, advance=1, description=name))
    runs = result.pop("_results")
    trace = chrome_trace(runs["photonic"], built.job.layout)
    rows = {f"{name} rails" if name != "ideal" else "ideal rails (OCS, 0 delay)": summary
            for name, summary in result["breakdown"].items()}
    plot_breakdown(rows, out_dir / "breakdown.png",
                   title=f"{built.scenario.name}: {built.job.layout}, OCS delay "
                         f"{format_time(built.fabric.reconfig_delay)}, {built.params.mode}")
    plot_overhead_breakdown(result["ablation"], out_dir / "overhead.png",
                            title=f"{built.scenario.name}: where the photonic overhead goes, OCS delay "
                                  f"{format_time(built.fabric.reconfig_delay)}, {built.params.mode}")
    trace["metadata"].update(overhead_breakdown_s=result["overhead_breakdown_s"],
                             controller_round_trips_per_iteration=result["controller_round_trips_per_iteration"])
    write_json(out_dir / "trace.json", trace)
    write_json(out_dir / "summary.json", result)
    if as_json:
        print_json(result)
        return
    e, p = result["breakdown"]["electrical"], result["breakdown"]["photonic"]
    ce, cp = result["costs"]["electrical"], result["costs"]["photonic"]
    table = Table(title=f"{built.scenario.name}: {built.model.name} on {result['gpus']} x {built.gpu.name}, "
                        f"{result['layout']}")
    table.add_column("")
    table.add_column("electrical rails", justify="right")
    table.add_column(f"photonic rails ({format_time(built.fabric.reconfig_delay)})", justify="right")
    table.add_row("iteration time", format_time(e["iteration_time_s"]), format_time(p["iteration_time_s"]))
    table.add_row("overhead", "-", f"{result['overhead'] * 100:+.2f}%")
    for key, label in (("compute_s", "compute"), ("communication_s", "exposed communication"),
                       ("reconfiguration_s", "reconfiguration stall"), ("control_s", "controller round trips"),
                       ("bubble_s", "pipeline bubble")):
        table.add_row(f"  {label}", format_time(e[key]), format_time(p[key]))
    table.add_row("reconfigurations / iteration / rail", "0", f"{result['reconfigurations_per_iteration']:.1f}")
    table.add_row("controller round trips / iteration / rank", "0",
                  f"{result['controller_round_trips_per_iteration']:.1f}")
    table.add_row("rail network power", f"{ce['power_w'] / 1e3:,.1f} kW", f"{cp['power_w'] / 1e3:,.1f} kW")
    table.add_row("rail network cost", f"${ce['capex_usd'] / 1e6:,.2f}M", f"${cp['capex_usd'] / 1e6:,.2f}M")
    table.add_row("electrical / photonic", "", f"power {result['power_ratio']:.1f}x, cost {result['cost_ratio']:.2f}x")
    out.print(table)
    parts = BREAKDOWN
    mode_name = str(built.params.mode)
    ablation = Table(title=f"policy ablation ({mode_name}): the published Opus policy, then lightrail's knobs")
    for col in ("policy", "iteration", "overhead", "reconfigs / rail", "round trips / rank"):
        ablation.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    split = Table(title=f"where the overhead goes ({mode_name}): {' + '.join(lbl for _, lbl in parts)}")
    for col in ("policy", *(lbl for _, lbl in parts)):
        split.add_column(col, justify="left" if col == "policy" else "right")
    for row in result["ablation"]:
        ablation.add_row(row["policy"], format_time(row["iteration_time_s"]), f"{row['overhead'] * 100:+.2f}%",
                         f"{row['reconfigurations_per_iteration']:.1f}",
                         f"{row['controller_round_trips_per_iteration']:.1f}")
        split.add_row(row["policy"], *(signed_time(row["overhead_breakdown_s"][k]) for k, _ in parts))
    out.print(ablation)
    out.print(split)
    b = result["overhead_breakdown_s"]
    out.print(f"photonic overhead {signed_time(result['iteration_time_s'] - result['baseline_iteration_time_s'])} = "
              + " + ".join(f"{lbl} {signed_time(b[k])}" for k, lbl in parts)
              + f"; electrical rails routed by {result['routing'].upper()}; controller round trip "
              f"{format_time(result['check_in_rtt_s'])}, command {format_time(result['command_latency_s'])}",
              highlight=False)
    plan = result["plan"]
    if plan:
        phases = ", ".join(f"{phase}: {len(cfgs)} configuration{'s' if len(cfgs) > 1 else ''} "
                           f"({'/'.join(str(n) for n in cfgs.values())} circuits)"
                           for phase, cfgs in plan["phases"].items())
        out.print(f"plan: {phases}; switches {plan['trigger']}", highlight=False)
    out.print(f"ideal rail (zero-delay OCS): {format_time(result['ideal_iteration_time_s'])}; wrote "
              f"{out_dir / 'summary.json'}, {out_dir / 'trace.json'} (open in ui.perfetto.dev), "
              f"{out_dir / 'breakdown.png'}, {out_dir / 'overhead.png'}")


@app.command("cost")
@friendly
def cost_cmd(
    gpus: Annotated[str, typer.Option("--gpus", help="GPU counts: 256..16384 (powers of two) or a comma list.")]
    = "256..16384",
    gpus_per_server: GpusPerServer = 8,
    rail_speed: Annotated[str, typer.Option("--rail-speed", help="400G or 800G.")] = "400G",
    as_json: JsonOut = False,
):
    """Power and capital cost of electrical vs photonic rails across cluster sizes."""
    from lightrail.studies.cost import compare

    if ".." in gpus:
        lo, hi = (int(x) for x in gpus.split("..", 1)) if all(x.strip().isdigit() for x in gpus.split("..", 1)) \
            else (0, 0)
        if not 0 < lo <= hi:
            raise ScenarioError(f"{gpus!r} is not a range of GPU counts", field="--gpus", fix="e.g. 256..16384")
        counts = [lo * 2**k for k in range(int(math.log2(hi / lo)) + 1)]
    else:
        try:
            counts = [int(x) for x in gpus.split(",") if x.strip()]
        except ValueError:
            raise ScenarioError(f"{gpus!r} lists no GPU counts", field="--gpus", fix="e.g. 1024,2048") from None
    rows = []
    for n in counts:
        c = compare(n, gpus_per_server=gpus_per_server, rail_speed=rail_speed)
        rows.append({"gpus": n, "electrical_power_w": c.electrical.power_w, "photonic_power_w": c.photonic.power_w,
                     "electrical_capex_usd": c.electrical.capex_usd, "photonic_capex_usd": c.photonic.capex_usd,
                     "electrical_tiers": c.electrical.tiers, "electrical_switches": c.electrical.switches,
                     "ocs_ports": c.photonic.ocs_ports, "power_ratio": c.power_ratio, "cost_ratio": c.cost_ratio})
    if as_json:
        print_json({"rail_speed": rail_speed, "rows": rows})
        return
    table = Table(title=f"rail networks at {rail_speed}, {gpus_per_server} GPUs per server (electrical / photonic)")
    for col in ("GPUs", "EPS tiers", "EPS switches", "OCS ports", "power (kW)", "cost ($M)", "power ratio",
                "cost ratio"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["gpus"]), str(r["electrical_tiers"]), str(r["electrical_switches"]), str(r["ocs_ports"]),
                      f"{r['electrical_power_w'] / 1e3:,.1f} / {r['photonic_power_w'] / 1e3:,.1f}",
                      f"{r['electrical_capex_usd'] / 1e6:,.2f} / {r['photonic_capex_usd'] / 1e6:,.2f}",
                      f"{r['power_ratio']:.1f}x", f"{r['cost_ratio']:.2f}x")
    out.print(table)


DEFAULT_DELAYS = "0,10ms,50ms,100ms,250ms,500ms,750ms,1s"


@app.command("sweep")
@friendly
def sweep_cmd(
    scenario: Scenario = None,
    delays: Annotated[str, typer.Option("--delays", help="Comma list of OCS delays.")] = DEFAULT_DELAYS,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for sweep.json and overhead.png.")]
    = Path("out/delay-sweep"),
    as_json: JsonOut = False,
):
    """Sweep the OCS reconfiguration delay in both modes (lightrail's policy and the original Opus)."""
    from lightrail.report.files import write_json
    from lightrail.report.plots import plot_delay_sweep
    from lightrail.studies.rails import BREAKDOWN, delay_sweep

    values = [parse_time(d, field="--delays") for d in delays.split(",") if d.strip()]
    if not values:
        raise ScenarioError(f"{delays!r} lists no delay", field="--delays", fix=f"e.g. {DEFAULT_DELAYS}")
    built = built_scenario(scenario)
    progress, task = progress_bar(4 * len(values), f"sweeping {built.scenario.name}", as_json)
    with progress:
        result = delay_sweep(built, values, progress=lambda name: progress.update(task, advance=1, description=name))
    plot_delay_sweep(result["rows"], out_dir / "overhead.png",
                     title=f"{built.scenario.name}: {built.job.layout}, overhead of photonic rails")
    write_json(out_dir / "sweep.json", result)
    if as_json:
        print_json(result)
        return
    table = Table(title=f"{built.scenario.name}: overhead vs electrical rails "
                        f"({format_time(result['baseline_iteration_time_s'])} per iteration)")
    table.add_column("delay", justify="right")
    keys = list(dict.fromkeys((r["policy"], r["mode"]) for r in result["rows"]))
    for policy, m in keys:
        table.add_column(f"{policy} {m}", justify="right")
    for d in values:
        cells = [next(f"{r['overhead'] * 100:+.2f}% ({r['reconfigurations_per_iteration']:.0f})" for r in result["rows"]
                      if (r["policy"], r["mode"], r["delay_s"]) == (policy, m, d)) for policy, m in keys]
        table.add_row(format_time(d) if d else "0", *cells)
    out.print(table)
    mode = str(built.params.mode)
    parts = BREAKDOWN
    split = Table(title=f"where the overhead goes ({mode}): {' + '.join(lbl for _, lbl in parts)}")
    split.add_column("delay", justify="right")
    split.add_column("policy")
    for _, lbl in parts:
        split.add_column(lbl, justify="right")
    for d in values:
        for policy in ("opus", "lightrail"):
            row = next(r for r in result["rows"] if (r["policy"], r["mode"], r["delay_s"]) == (policy, mode, d))
            split.add_row(format_time(d) if d else "0", policy,
                          *(signed_time(row["overhead_breakdown_s"][k]) for k, _ in parts),
                          end_section=policy == "lightrail" and d != values[-1])
    out.print(split)
    out.print(f"in brackets: reconfigurations per rail per iteration; electrical rails routed by "
              f"{result['routing'].upper()}; every row's overhead_breakdown_s is in the JSON", highlight=False)
    out.print(f"wrote {out_dir / 'sweep.json'}, {out_dir / 'overhead.png'}")
