"""``lightrail calibrate iterations``: fit mfu and the control plane's costs to measured iteration times."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import friendly, given_on_command_line, out
from lightrail.cli.calibrate import calibrate_app
from lightrail.cli.options import MAX_SWEEP_POINTS, FigureFormat, JsonOut, built_scenario, figure_suffix
from lightrail.cli.output import print_json, progress_bar
from lightrail.errors import ScenarioError
from lightrail.units import parse_time


def _fit_delays(text: str | None) -> list[float] | None:
    """``--fit-delays``: a comma list of OCS delays with units (None: every row)."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise ScenarioError(f"{text!r} is not a list of delays", field="--fit-delays",
                            fix="give OCS delays of the table with units, e.g. 10ms,1s (or leave it out: every row)")
    if len(items) > MAX_SWEEP_POINTS:
        raise ScenarioError(f"{len(items)} delays", field="--fit-delays", fix=f"give at most {MAX_SWEEP_POINTS}")
    return [parse_time(t, field="--fit-delays") for t in items]


@calibrate_app.command("iterations")
@friendly
def iterations_cmd(
    table: Annotated[Path, typer.Argument(help="CSV of measured iterations: mode,ocs_delay,iteration_s per line "
                                          "(mode electrical, provisioned or on-demand; ocs_delay empty on "
                                          "electrical rows, with a unit otherwise, e.g. 10ms; # comments; the "
                                          "header is optional).", show_default=False)],
    scenario: Annotated[Path, typer.Argument(help="Scenario file (.yaml/.json) of the measured job: model, "
                                             "layout, hardware and OCS policy.", show_default=False)],
    fit_delays: Annotated[str | None, typer.Option("--fit-delays", help="OCS delays whose rows the fit uses, e.g. "
                                                   "10ms,1s (default: every row); electrical rows are always "
                                                   "used. The other rows test the model.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for calibration.yaml (a scenario fragment), "
                                          "calibration.json and calibration.png.")]
    = Path("out/calibrate-iterations"),
    fmt: FigureFormat = "png",
    as_json: JsonOut = False,
):
    """Fit the parameters hardware facts cannot give to iteration times measured on a testbed: job.mfu from the
    electrical rows, then ocs.check_in_rtt and ocs.command_latency from the photonic rows at --fit-delays, by least
    squares on relative error with the iteration simulator in the loop; then predict every row. Rows outside the
    fit are the model's honest test. Writes the fit as a scenario fragment, a plot of measured vs predicted
    against the OCS delay, and JSON; warns when a parameter is not identified by the rows (it keeps the
    scenario's value)."""
    from lightrail.report.calibrate_iterations import print_iterations, write_iterations
    from lightrail.studies.calibrate_iterations import fit_iterations, parse_iteration_table
    from lightrail.validation import read_bounded

    fmt = figure_suffix(fmt)
    delays = _fit_delays(fit_delays)
    text = read_bounded(table, field="TABLE", what="a CSV of mode,ocs_delay,iteration_s rows (a regular file)")
    rows = parse_iteration_table(text, source="TABLE")
    built = built_scenario(scenario, runs=len(rows), runs_field="TABLE")
    progress, task = progress_bar(None, f"calibrating {built.scenario.name}", as_json)
    with progress:
        cal = fit_iterations(built, rows, fit_delays=delays, source=table.name,
                             progress=lambda what: progress.update(task, advance=1, description=what))
    writes = not as_json or given_on_command_line("out_dir")
    written = write_iterations(cal, out_dir, fmt=fmt) if writes else []
    if as_json:
        print_json(cal.to_dict())
    else:
        print_iterations(cal, out, written)
