"""``lightrail stragglar rounds|compare|sweep|run``: AllReduce with a persistent straggler.

The straggler's lateness is ``--straggler-delay`` (``--straggler-delays`` for a list); the old ``--delay``,
``--delays`` and ``--at-delay`` are still accepted, with a note, so older commands keep working."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, err, friendly, out
from lightrail.cli.options import (
    ALPHA_DEFAULT,
    LATENCY_DEFAULT,
    NVLINK_DEFAULT,
    Alpha,
    GpusPerServer,
    HostsPerLeaf,
    JsonOut,
    Latency,
    Ranks,
    StragglerDelay,
    StragglerDelays,
    TopologyOpt,
    build_fabric,
    old_spelling,
    parse_rank_range,
    parse_times,
    print_json,
    progress_bar,
    progress_steps,
    renamed,
)
from lightrail.defaults import GPUS_PER_SERVER, HOSTS_PER_LEAF, TOPOLOGIES
from lightrail.units import parse_rate, parse_size, parse_time

stragglar_app = typer.Typer(no_args_is_help=True, help="StragglAR: AllReduce with a persistent straggler.")
app.add_typer(stragglar_app, name="stragglar")

OldDelay = Annotated[str | None, old_spelling("--delay", "--straggler-delay")]
NodeBandwidth = Annotated[str, typer.Option("--bandwidth", help="Per-GPU link rate (NVSwitch-style default).")]


@stragglar_app.command("rounds")
@friendly
def stragglar_rounds_cmd(
    ranks: Annotated[str, typer.Option("--ranks", "-n", help="A rank count, a range 2..64 or a comma list.")] = "8",
    as_json: JsonOut = False,
):
    """Phase-2 rounds of the synthesised StragglAR schedule against the lower bound, per rank count
    (met at every power of two; other n use a greedy, about a second each near n = 1,000)."""
    from lightrail.report.stragglar import print_rounds
    from lightrail.studies.stragglar import stragglar_rounds

    wanted = parse_rank_range(ranks)
    progress, task = progress_bar(len(wanted), "StragglAR rounds", as_json or len(wanted) < 32)
    with progress:
        result = stragglar_rounds(wanted, progress=lambda n: progress.update(
            task, advance=1, description=f"StragglAR rounds, n={n}"))
    if as_json:
        print_json(result.to_dict())
    else:
        print_rounds(result, out)


@stragglar_app.command("compare")
@friendly
def stragglar_compare_cmd(
    ranks: Ranks = 8,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank.")] = "64MiB",
    straggler_delay: StragglerDelay = "5ms",
    delay: OldDelay = None,
    topology: TopologyOpt = "switch",
    bandwidth: NodeBandwidth = NVLINK_DEFAULT,
    latency: Latency = LATENCY_DEFAULT,
    alpha: Alpha = ALPHA_DEFAULT,
    as_json: JsonOut = False,
):
    """Time to finish with a straggler (rank n-1): StragglAR against Ring, halving-doubling, tree and
    "wait, then run the best algorithm" (in the model)."""
    from lightrail.report.stragglar import print_comparison
    from lightrail.studies.stragglar import straggler_comparison

    late = renamed(straggler_delay, delay, old="--delay", new="--straggler-delay")
    fabric = build_fabric(topology, ranks, bandwidth, latency, None, GPUS_PER_SERVER, NVLINK_DEFAULT, HOSTS_PER_LEAF,
                          1.0)
    result = straggler_comparison(ranks, parse_size(size, field="--size"),
                                  parse_time(late, field="--straggler-delay"), fabric,
                                  alpha=parse_time(alpha, field="--alpha"))
    if as_json:
        print_json(result.to_dict())
    else:
        print_comparison(result, out)


@stragglar_app.command("run")
@friendly
def stragglar_run_cmd(
    ranks: Ranks = 8,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank, e.g. 64MiB.")] = "64MiB",
    straggler_delay: StragglerDelay = "50ms",
    delay: OldDelay = None,
    straggler: Annotated[int | None, typer.Option("--straggler", help="The late rank (default: ranks-1).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed trials per method; the median is shown.")] = 5,
    as_json: JsonOut = False,
):
    """Measure for real, on CPU gloo processes: StragglAR against lightrail's Ring and gloo's
    dist.all_reduce, with one rank arriving late."""
    from contextlib import nullcontext

    from lightrail.report.stragglar import print_run, run_mismatch
    from lightrail.studies.straggler_run import measure_straggler

    late = renamed(straggler_delay, delay, old="--delay", new="--straggler-delay")
    nbytes = parse_size(size, field="--size")
    delay_s = parse_time(late, field="--straggler-delay")
    busy = err.status(f"running {ranks} gloo processes") if err.is_terminal and not as_json else nullcontext()
    with busy:
        result = measure_straggler(ranks, nbytes, delay_s, straggler, repeats=repeats)
    if as_json:
        print_json(result.to_dict())
    else:
        print_run(result, out)
    mismatch = run_mismatch(result)
    if mismatch:
        err.print(mismatch, highlight=False)
        raise typer.Exit(1)


STRAGGLAR_DELAYS = "0,50us,100us,250us,500us,1ms,5ms"  # a 64 MiB AllReduce on NVLink takes 0.25-1.2 ms


@stragglar_app.command("sweep")
@friendly
def stragglar_sweep_cmd(
    ranks: Annotated[str, typer.Option("--ranks", "-n", help="Rank counts: a range 2..64 or a comma list.")]
    = "4,8,16,32,64",
    straggler_delays: StragglerDelays = STRAGGLAR_DELAYS,
    delays: Annotated[str | None, old_spelling("--delays", "--straggler-delays")] = None,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank.")] = "64MiB",
    topologies: Annotated[str, typer.Option("--topologies", help="Comma list of fabrics: " + ", ".join(TOPOLOGIES)
                                            + ".")] = ",".join(TOPOLOGIES),
    bandwidth: NodeBandwidth = NVLINK_DEFAULT,
    latency: Latency = LATENCY_DEFAULT,
    alpha: Alpha = ALPHA_DEFAULT,
    gpus_per_server: GpusPerServer = GPUS_PER_SERVER,
    hosts_per_leaf: HostsPerLeaf = HOSTS_PER_LEAF,
    at_straggler_delay: Annotated[str | None, typer.Option(
        "--at-straggler-delay", help="Straggler delay of the speedup-vs-ranks plot and the table, one of "
        "--straggler-delays (default: 250us if listed, else the largest).")] = None,
    at_delay: Annotated[str | None, old_spelling("--at-delay", "--at-straggler-delay")] = None,
    at_ranks: Annotated[int | None, typer.Option("--at-ranks", help="Rank count of the speedup-vs-delay plot, one "
                                                 "of --ranks (default: 8 if listed, else the smallest).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for sweep.json, speedup-vs-ranks.png and "
                                          "speedup-vs-delay.png.")] = Path("out/stragglar-sweep"),
    as_json: JsonOut = False,
):
    """StragglAR's speedup over Ring and over "wait, then the best algorithm" against the rank count
    and the straggler's delay, on several fabrics (in the model); skips (fabric, n) pairs a fabric
    cannot build."""
    from lightrail.report.stragglar import print_sweep, write_sweep
    from lightrail.studies.stragglar import fabric_sweep

    # read every flag before computing or writing anything
    delay_list = parse_times(renamed(straggler_delays, delays, old="--delays", new="--straggler-delays"),
                             "--straggler-delays")
    at = renamed(at_straggler_delay, at_delay, old="--at-delay", new="--at-straggler-delay")
    at_s = None if at is None else parse_time(at, field="--at-straggler-delay")
    rank_list = sorted(set(parse_rank_range(ranks)))
    names = list(dict.fromkeys(t.strip() for t in topologies.split(",") if t.strip()))
    nbytes = parse_size(size, field="--size")
    rate, hop, start = (parse_rate(bandwidth, field="--bandwidth"), parse_time(latency, field="--latency"),
                        parse_time(alpha, field="--alpha"))
    with progress_steps(len(names) * len(rank_list), "StragglAR sweep", as_json) as step:
        result = fabric_sweep(rank_list, delay_list, nbytes, names, bandwidth=rate, latency=hop, alpha=start,
                              gpus_per_server=gpus_per_server, hosts_per_leaf=hosts_per_leaf, at_delay=at_s,
                              at_ranks=at_ranks, progress=step)
    files = write_sweep(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_sweep(result, files, out)
