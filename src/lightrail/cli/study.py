"""``lightrail study collectives``: when does reconfiguring the fabric per step pay?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import (
    ALPHA_DEFAULT,
    LATENCY_DEFAULT,
    NIC_DEFAULT,
    Alpha,
    Bandwidth,
    JsonOut,
    Latency,
    OcsDelays,
    Ports,
    Propagation,
    Sizes,
    old_spelling,
    parse_kinds,
    parse_rank_range,
    parse_sizes,
    parse_times,
    print_json,
    progress_bar,
    renamed,
)
from lightrail.units import parse_rate, parse_time

study_app = typer.Typer(no_args_is_help=True, help="Studies over grids of cases.")
app.add_typer(study_app, name="study")


@study_app.command("collectives")
@friendly
def study_collectives_cmd(
    ops: Annotated[str, typer.Option("--ops", help="Comma list of collectives.")] =
    "allreduce,reducescatter,allgather,alltoall",
    ranks: Annotated[str, typer.Option("--ranks", help="Rank counts: a comma list, or a range 8..16.")]
    = "8,16,32,64,128,256,1024",
    sizes: Sizes = "1KiB..4GiB",
    ocs_delays: OcsDelays = "0,1us,10us,100us,1ms,10ms",
    old_delays: Annotated[str | None, old_spelling("--delays", "--ocs-delays")] = None,
    ports: Ports = 2,
    bandwidth: Bandwidth = NIC_DEFAULT,
    latency: Latency = LATENCY_DEFAULT,
    alpha: Alpha = ALPHA_DEFAULT,
    propagation: Propagation = "0",
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the study's JSON, CSV summary and heat maps.")]
    = Path("out/study-collectives"),
    as_json: JsonOut = False,
):
    """When does reconfiguring the fabric per step pay? Static ring, torus and switch against a
    reconfigurable fabric, every algorithm planned exactly, over ops x ranks x sizes x delays."""
    from lightrail.report.collective_study import print_study, write_study
    from lightrail.studies.collective_study import StudyGrid, collective_study

    delays = renamed(ocs_delays, old_delays, old="--delays", new="--ocs-delays")
    grid = StudyGrid(ops=tuple(k.value for k in parse_kinds(ops)), ranks=tuple(parse_rank_range(ranks)),
                     sizes=tuple(parse_sizes(sizes)), delays=tuple(parse_times(delays, "--ocs-delays")),
                     ports=ports, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                     latency=parse_time(latency, field="--latency"), alpha=parse_time(alpha, field="--alpha"),
                     propagation=parse_time(propagation, field="--propagation"))
    progress, task = progress_bar(len(grid.ops) * len(grid.ranks), "collective study", as_json)
    with progress:
        result = collective_study(grid, progress=lambda name: progress.update(task, advance=1, description=name))
    write_study(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, out_dir)
