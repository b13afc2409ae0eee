"""``lightrail calibrate nccl-tests``: fit the step-time model's alpha, latency and bandwidth to measurements."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly, given_on_command_line, out
from lightrail.cli.options import (
    LATENCY_DEFAULT,
    FigureFormat,
    GpusPerServer,
    HostsPerLeaf,
    JsonOut,
    KindOpt,
    Latency,
    Oversubscription,
    Ranks,
    Shape,
    TopologyOpt,
    check_collective_size,
    check_ranks,
    figure_suffix,
    parse_kind,
    parse_shape,
    print_json,
)
from lightrail.defaults import GPUS_PER_SERVER, HOSTS_PER_LEAF
from lightrail.errors import ScenarioError
from lightrail.units import parse_time

calibrate_app = typer.Typer(no_args_is_help=True, help="Fit the model's parameters to measurements.")
app.add_typer(calibrate_app, name="calibrate")


@calibrate_app.command("nccl-tests")
@friendly
def nccl_tests_cmd(
    file: Annotated[Path, typer.Argument(help="Output of an nccl-tests binary (all_reduce_perf, ...), as printed.")],
    ranks: Ranks = 8,
    topology: TopologyOpt = "switch",
    algo: Annotated[str, typer.Option("--algo", "-a", help="The algorithm NCCL ran (see `lightrail algorithms`), "
                                      "e.g. ring (NCCL_ALGO=Ring).")] = "ring",
    op: KindOpt = "allreduce",
    latency: Latency = LATENCY_DEFAULT,
    shape: Shape = None,
    gpus_per_server: GpusPerServer = GPUS_PER_SERVER,
    hosts_per_leaf: HostsPerLeaf = HOSTS_PER_LEAF,
    oversubscription: Oversubscription = 1.0,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for calibration.yaml (a scenario fragment), "
                                          "calibration.json and calibration.png.")] = Path("out/calibrate"),
    fmt: FigureFormat = "png",
    as_json: JsonOut = False,
):
    """Fit alpha (per step), latency (per hop) and bandwidth of the engine's time model for --algo on
    --topology to an nccl-tests table, by least squares on relative error; print the fit and residuals, write
    the parameters as a scenario fragment and plot measured vs model. --latency is held when the data cannot
    separate it from alpha (one schedule's steps all cross the same hops)."""
    from lightrail.calibrate import fit, parse_nccl_tests
    from lightrail.report.calibrate import print_calibration, write_calibration
    from lightrail.validation import read_bounded

    fmt = figure_suffix(fmt)
    check_ranks(ranks)
    check_collective_size(parse_kind(op), algo, ranks)  # bounded before the fit builds the schedule
    text = read_bounded(file, field="FILE", what="the saved output of all_reduce_perf (a regular file)")
    rows, listed = parse_nccl_tests(text, source=file.name)
    if listed is not None and listed != ranks:
        raise ScenarioError(f"the log's header lists {listed} ranks", field="--ranks", fix=f"use --ranks {listed}")
    cal = fit(rows, kind=parse_kind(op), algo=algo, topology=topology, ranks=ranks,
              latency_s=parse_time(latency, field="--latency"), shape=parse_shape(shape),
              gpus_per_server=gpus_per_server, hosts_per_leaf=hosts_per_leaf, oversubscription=oversubscription)
    writes = not as_json or given_on_command_line("out_dir")
    written = write_calibration(cal, out_dir, file.name, fmt=fmt) if writes else []
    if as_json:
        print_json(cal.to_dict())
    else:
        print_calibration(cal, out, written)
