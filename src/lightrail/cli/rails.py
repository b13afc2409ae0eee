"""``lightrail simulate``, ``sweep``, ``check``, ``cost``: photonic against electrical rails for a training job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import (
    GpusPerServer,
    JsonOut,
    ModeOpt,
    OcsDelayOverride,
    OcsDelays,
    Scenario,
    built_scenario,
    old_spelling,
    parse_gpu_counts,
    parse_times,
    print_json,
    progress_steps,
    renamed,
)
from lightrail.defaults import GPUS_PER_SERVER, OCS_DELAYS
from lightrail.units import format_time

DEFAULT_DELAYS = ",".join(format_time(d) if d else "0" for d in OCS_DELAYS)
"""``0,10ms,50ms,100ms,250ms,500ms,750ms,1s``: the delays Opus sweeps."""


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
    ocs_delay: OcsDelayOverride = None,
    old_delay: Annotated[str | None, old_spelling("--delay", "--ocs-delay")] = None,
    mode: ModeOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for summary.json, trace.json, breakdown.png and "
                                          "overhead.png.")] = Path("out/simulate"),
    as_json: JsonOut = False,
):
    """Electrical vs photonic rails for one training job: iteration time, overhead, reconfigurations,
    power and cost, the policy ablation; writes a Perfetto trace and a breakdown plot."""
    from lightrail.report.rails import print_simulate, write_simulate
    from lightrail.studies.rails import ABLATION, compare_rails

    ocs_delay = renamed(ocs_delay, old_delay, old="--delay", new="--ocs-delay")
    built = built_scenario(scenario, ocs_delay, mode)
    with progress_steps(3 + len(ABLATION), f"simulating {built.scenario.name}", as_json) as step:
        result = compare_rails(built, progress=step)
    write_simulate(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_simulate(result, out, out_dir)


@app.command("cost")
@friendly
def cost_cmd(
    gpus: Annotated[str, typer.Option("--gpus", help="GPU counts: 256..16384 (powers of two) or a comma list.")]
    = "256..16384",
    gpus_per_server: GpusPerServer = GPUS_PER_SERVER,
    rail_speed: Annotated[str, typer.Option("--rail-speed", help="400G or 800G.")] = "400G",
    as_json: JsonOut = False,
):
    """Power and capital cost of electrical vs photonic rails across cluster sizes."""
    from lightrail.report.cost import print_cost
    from lightrail.studies.cost import cost_sweep

    result = cost_sweep(parse_gpu_counts(gpus), gpus_per_server=gpus_per_server, rail_speed=rail_speed)
    if as_json:
        print_json(result.to_dict())
    else:
        print_cost(result, out)


@app.command("sweep")
@friendly
def sweep_cmd(
    scenario: Scenario = None,
    ocs_delays: OcsDelays = DEFAULT_DELAYS,
    old_delays: Annotated[str | None, old_spelling("--delays", "--ocs-delays")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for sweep.json and overhead.png.")]
    = Path("out/delay-sweep"),
    as_json: JsonOut = False,
):
    """Sweep the OCS reconfiguration delay in both modes (lightrail's policy and the original Opus)."""
    from lightrail.report.rails import print_sweep, write_sweep
    from lightrail.studies.rails import delay_sweep

    delays = parse_times(renamed(ocs_delays, old_delays, old="--delays", new="--ocs-delays"), "--ocs-delays")
    built = built_scenario(scenario)
    with progress_steps(4 * len(delays), f"sweeping {built.scenario.name}", as_json) as step:
        result = delay_sweep(built, delays, progress=step)
    write_sweep(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_sweep(result, out, out_dir)
