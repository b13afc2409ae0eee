"""``lightrail simulate``, ``sweep``, ``cost``: photonic against electrical rails for a training job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, err, friendly, given_on_command_line, out
from lightrail.cli.options import (
    MAX_GPUS,
    MAX_SWEEP_POINTS,
    FigureFormat,
    GpusPerServer,
    HtmlOut,
    JsonOut,
    ModeOpt,
    OcsDelayOverride,
    OcsDelays,
    Scenario,
    built_scenario,
    check_count,
    check_out,
    figure_suffix,
    old_spelling,
    parse_gpu_counts,
    parse_times,
    renamed,
    result_out,
)
from lightrail.cli.output import html_report, output_folder, print_json, progress_bar, progress_steps, save_result
from lightrail.defaults import GPUS_PER_SERVER, OCS_DELAYS
from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.units import format_time

MAX_COST_GPUS = 2**24
"""Largest cluster the (analytic) cost model prices: 16.7 M GPUs, beyond any built or announced."""
DEFAULT_DELAYS = ",".join(format_time(d) if d else "0" for d in OCS_DELAYS)
"""``0,10ms,50ms,100ms,250ms,500ms,750ms,1s``: the delays Opus sweeps."""


@app.command("simulate")
@friendly
def simulate_cmd(
    scenario: Scenario = None,
    ocs_delay: OcsDelayOverride = None,
    old_delay: Annotated[str | None, old_spelling("--delay", "--ocs-delay")] = None,
    mode: ModeOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Folder for summary.json, scenario.json, trace.json, "
                                                 "breakdown and overhead figures [default: out/simulate]",
                                                 show_default=False)] = None,
    fmt: FigureFormat = "png",
    html: HtmlOut = False,
    ablation: Annotated[bool, typer.Option("--ablation/--no-ablation", help="Also run the six-policy ablation and "
                                           "its overhead breakdowns (most of the work on big jobs).")] = True,
    as_json: JsonOut = False,
):
    """Electrical vs photonic rails for one training job: iteration time, overhead, reconfigurations,
    power and cost, the policy ablation; writes a Perfetto trace and a breakdown plot."""
    from lightrail.studies.rails import ABLATION, compare_rails

    ocs_delay = renamed(ocs_delay, old_delay, old="--delay", new="--ocs-delay")
    check_out(output_folder(out_dir, "out/simulate", as_json=as_json, html=html))
    built = built_scenario(scenario, ocs_delay, mode, trace_ok=True)
    fmt = figure_suffix(fmt)
    if built.trace is not None:
        return _simulate_trace(built, output_folder(out_dir, "out/simulate", as_json=as_json, html=html), as_json,
                               html)
    with progress_steps(3 + len(ABLATION) * ablation, f"simulating {built.scenario.name}", as_json) as step:
        result = compare_rails(built, ablation=ablation, progress=step)
    out_dir = output_folder(out_dir, "out/simulate", as_json=as_json, html=html)
    if out_dir is not None:
        from lightrail.report.rails import write_simulate

        write_simulate(result, out_dir, fmt=fmt)
        html_report(out_dir, html, quiet=as_json)
    if as_json:
        print_json(result.to_dict())  # no table: rich is not imported
    else:
        from lightrail.report.rails import print_simulate

        print_simulate(result, out, out_dir, fmt=fmt)


def _simulate_trace(built, out_dir: Path | None, as_json: bool, html: bool) -> None:
    """A scenario naming a Chakra trace: replay it on the scenario's electrical rails (``out_dir`` None: write
    nothing, as ``--json`` without ``--out``)."""
    from lightrail.report.replay import print_replay, write_replay
    from lightrail.studies.replay import simulate_trace

    run = simulate_trace(built)
    if out_dir is not None:
        write_replay(run, out_dir)
        html_report(out_dir, html, quiet=as_json)
    if as_json:
        print_json(run.to_dict())
    else:
        print_replay(run, out, out_dir)


@app.command("cost")
@friendly
def cost_cmd(
    gpus: Annotated[str, typer.Option("--gpus", help="GPU counts: 256..16384 (powers of two) or a comma list.")]
    = "256..16384",
    gpus_per_server: GpusPerServer = GPUS_PER_SERVER,
    rail_speed: Annotated[str, typer.Option("--rail-speed", help="400G or 800G.")] = "400G",
    out_dir: Annotated[Path | None, result_out("cost.json")] = None,
    as_json: JsonOut = False,
):
    """Power and capital cost of electrical vs photonic rails across cluster sizes."""
    from lightrail.report.cost import print_cost
    from lightrail.studies.cost import cost_sweep

    counts = parse_gpu_counts(gpus)
    check_count(gpus_per_server, field="--gpus-per-server", hi=MAX_GPUS, what="GPUs per server")
    check_count(len(counts), field="--gpus", hi=MAX_SWEEP_POINTS, what="cluster sizes")
    for n in counts:  # checked here so the errors name the flags, not the scenario fields they fill
        check_count(n, field="--gpus", hi=MAX_COST_GPUS, what="GPUs")
        if n % gpus_per_server:
            raise ScenarioError(f"{n} GPUs do not fill servers of {gpus_per_server}", field="--gpus",
                                fix=f"use multiples of --gpus-per-server ({gpus_per_server}), e.g. 256..16384")
    result = cost_sweep(counts, gpus_per_server=gpus_per_server, rail_speed=rail_speed)
    save_result(out_dir, "cost.json", result.to_dict(), quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_cost(result, out)


@app.command("sweep")
@friendly
def sweep_cmd(
    file: Annotated[Path | None, typer.Argument(
        metavar="[FILE]", show_default=False,
        help="A sweep file (a grid or list over any scenario fields; see examples/sweeps/debug.yaml), or a "
             "scenario file whose OCS delay to sweep; default: the embedded scenario's OCS delay sweep.")] = None,
    ocs_delays: OcsDelays = DEFAULT_DELAYS,
    old_delays: Annotated[str | None, old_spelling("--delays", "--ocs-delays")] = None,
    local: Annotated[bool, typer.Option("--local", help="Sweep file: run the cells on this process, not on "
                                                        "Ray.")] = False,
    address: Annotated[str | None, typer.Option("--address", help="Sweep file: join this Ray cluster (e.g. "
                                                "auto, or ray://host:10001) instead of starting a local Ray.")]
    = None,
    cpus: Annotated[int | None, typer.Option("--cpus", help="Sweep file: CPUs of the local Ray [default: all]",
                                             show_default=False)] = None,
    allow_failures: Annotated[bool, typer.Option("--allow-failures", help="Sweep file: exit 0 even when some "
                                                 "cells failed (they are in the table either way; by default "
                                                 "the exit code is 1).")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Folder for the table (sweep.csv, sweep.parquet), "
                                                 "sweep.json and the overhead figure [default: out/sweep, or "
                                                 "out/delay-sweep without a sweep file]", show_default=False)] = None,
    fmt: FigureFormat = "png",
    html: HtmlOut = False,
    as_json: JsonOut = False,
):
    """Sweep any scenario fields from a sweep file (cells in parallel on Ray, or --local), or the OCS
    reconfiguration delay of a scenario in both modes (lightrail's policy and the original Opus)."""
    from lightrail.validation import read_mapping

    fmt = figure_suffix(fmt)
    if file is not None:
        from lightrail.studies.sweep import is_sweep_file

        if is_sweep_file(read_mapping(file, field="FILE")):
            for name, flag in (("ocs_delays", "--ocs-delays"), ("old_delays", "--delays")):
                if given_on_command_line(name):
                    raise ScenarioError("a sweep file says what to sweep", field=flag,
                                        fix="put ocs.reconfig_delay in the sweep file's grid")
            return _file_sweep(file, local=local, address=address, cpus=cpus, out_dir=out_dir, fmt=fmt, html=html,
                               as_json=as_json, allow_failures=allow_failures)
    for name, flag, what in (("local", "--local", "runs on Ray"), ("address", "--address", "runs on Ray"),
                             ("cpus", "--cpus", "runs on Ray"), ("allow_failures", "--allow-failures", "has cells")):
        if given_on_command_line(name):
            raise ScenarioError(f"only a sweep file {what}", field=flag,
                                fix="give a sweep file (see examples/sweeps/debug.yaml)")
    from lightrail.report.rails import print_sweep, write_sweep
    from lightrail.studies.rails import delay_sweep

    delays = parse_times(renamed(ocs_delays, old_delays, old="--delays", new="--ocs-delays"), "--ocs-delays")
    check_out(output_folder(out_dir, "out/delay-sweep", as_json=as_json, html=html))
    built = built_scenario(file, runs=len(delays), runs_field="--ocs-delays")
    with progress_steps(4 * len(delays), f"sweeping {built.scenario.name}", as_json) as step:
        result = delay_sweep(built, delays, progress=step)
    out_dir = output_folder(out_dir, "out/delay-sweep", as_json=as_json, html=html)
    if out_dir is not None:
        write_sweep(result, out_dir, fmt=fmt)
        html_report(out_dir, html, quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_sweep(result, out, out_dir, fmt=fmt)


def _file_sweep(file: Path, *, local: bool, address: str | None, cpus: int | None, out_dir: Path | None, fmt: str,
                html: bool, as_json: bool, allow_failures: bool = False) -> None:
    """Run a sweep file and write its table. Some cells failing exits 1 (after everything is written), so a
    script or CI job notices; ``--allow-failures`` exits 0. Every cell failing is an error (exit 2)."""
    from lightrail.report.sweep import print_file_sweep, write_file_sweep
    from lightrail.studies.sweep import load_sweep, run_sweep

    if cpus is not None and cpus < 1:
        raise ScenarioError(f"{cpus} CPUs is too few", field="--cpus", fix="use 1 or more")
    check_out(output_folder(out_dir, "out/sweep", as_json=as_json, html=html))
    sweep = load_sweep(file)
    progress, task = progress_bar(len(sweep.cells), f"sweeping {sweep.name} ({len(sweep.cells)} cells)", as_json)
    with progress:
        result = run_sweep(sweep, local=local, address=address, cpus=cpus,
                           progress=lambda k: progress.update(task, advance=k))
    if len(result.failed) == len(result.cells):
        first = result.cells[0]
        raise InfeasibleError(f"every cell failed; cell 0 ({first.values}): {first.error}", field="FILE",
                              fix="check the swept values against the scenario")
    out_dir = output_folder(out_dir, "out/sweep", as_json=as_json, html=html)
    written = write_file_sweep(result, out_dir, fmt=fmt) if out_dir is not None else []
    if out_dir is not None:
        html_report(out_dir, html, quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_file_sweep(result, out, written)
    if result.failed and not allow_failures:
        err.print(f"{len(result.failed)} of {len(result.cells)} cells failed (status and error in the table); "
                  "exit code 1 (--allow-failures: 0)", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
