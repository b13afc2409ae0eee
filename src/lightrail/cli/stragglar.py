"""``lightrail stragglar rounds|compare|sweep|run``: AllReduce with a persistent straggler.

The straggler's lateness is ``--straggler-delay`` (``--straggler-delays`` for a list); the old ``--delay``,
``--delays`` and ``--at-delay`` are still accepted, with a note, so older commands keep working."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, err, friendly, out
from lightrail.cli.options import (
    ALPHA_DEFAULT,
    LATENCY_DEFAULT,
    MAX_SWEEP_POINTS,
    NVLINK_DEFAULT,
    Alpha,
    FigureFormat,
    GpusPerServer,
    HostsPerLeaf,
    JsonOut,
    Latency,
    Ranks,
    StragglerDelay,
    StragglerDelays,
    TopologyOpt,
    build_fabric,
    check_collective_size,
    check_count,
    check_fits,
    check_out,
    check_ranks,
    check_stragglar_work,
    figure_suffix,
    old_spelling,
    parse_rank_range,
    parse_times,
    renamed,
    result_out,
)
from lightrail.cli.output import print_json, progress_bar, progress_steps, save_result, writes_files
from lightrail.defaults import GPUS_PER_SERVER, HOSTS_PER_LEAF, TOPOLOGIES
from lightrail.errors import ScenarioError
from lightrail.units import parse_rate, parse_size, parse_time

stragglar_app = LeanTyper(no_args_is_help=True, help="StragglAR: AllReduce with a persistent straggler.")
app.add_typer(stragglar_app, name="stragglar")

OldDelay = Annotated[str | None, old_spelling("--delay", "--straggler-delay")]
NodeBandwidth = Annotated[str, typer.Option("--bandwidth", help="Per-GPU link rate (NVSwitch-style default).")]


@stragglar_app.command("rounds")
@friendly
def stragglar_rounds_cmd(
    ranks: Annotated[str, typer.Option("--ranks", "-n", help="A rank count, a range 2..64 or a comma list.")] = "8",
    out_dir: Annotated[Path | None, result_out("stragglar-rounds.json")] = None,
    as_json: JsonOut = False,
):
    """Phase-2 rounds of the synthesised StragglAR schedule against the lower bound, per rank count
    (met at every power of two; other n use a greedy, about a second each near n = 1,000)."""
    from lightrail.report.stragglar import print_rounds
    from lightrail.studies.stragglar import stragglar_rounds

    wanted = parse_rank_range(ranks)
    check_stragglar_work(wanted)
    progress, task = progress_bar(len(wanted), "StragglAR rounds", as_json or len(wanted) < 32)
    with progress:
        result = stragglar_rounds(wanted, progress=lambda n: progress.update(
            task, advance=1, description=f"StragglAR rounds, n={n}"))
    save_result(out_dir, "stragglar-rounds.json", result.to_dict(), quiet=as_json)
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
    out_dir: Annotated[Path | None, result_out("stragglar-compare.json")] = None,
    as_json: JsonOut = False,
):
    """Time to finish with a straggler (rank n-1): StragglAR against Ring, halving-doubling, tree and
    "wait, then run the best algorithm" (in the model)."""
    from lightrail.report.stragglar import print_comparison
    from lightrail.studies.stragglar import stragglar_comparison

    late = renamed(straggler_delay, delay, old="--delay", new="--straggler-delay")
    check_ranks(ranks)
    check_collective_size("allreduce", "stragglar", ranks)
    check_stragglar_work([ranks])
    fabric = build_fabric(topology, ranks, bandwidth, latency, None, GPUS_PER_SERVER, NVLINK_DEFAULT, HOSTS_PER_LEAF,
                          1.0)
    result = stragglar_comparison(ranks, parse_size(size, field="--size"),
                                  _study_delay(parse_time(late, field="--straggler-delay"), "--straggler-delay"),
                                  fabric, alpha=parse_time(alpha, field="--alpha"))
    save_result(out_dir, "stragglar-compare.json", result.to_dict(), quiet=as_json)
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
    out_dir: Annotated[Path | None, result_out("stragglar-run.json")] = None,
    as_json: JsonOut = False,
):
    """Measure for real, on CPU gloo processes: StragglAR against lightrail's Ring and gloo's
    dist.all_reduce, with one rank arriving late."""
    from contextlib import nullcontext

    late = renamed(straggler_delay, delay, old="--delay", new="--straggler-delay")
    nbytes = parse_size(size, field="--size")
    delay_s = parse_time(late, field="--straggler-delay")
    # real processes: a few per core, each a Python + torch (~0.35 GB) holding ~3 buffers of --size
    check_count(ranks, field="--ranks", lo=2, hi=MAX_RUN_RANKS, what="gloo processes")
    check_fits(ranks * (0.35e9 + 3 * nbytes), field="--size", value=f"{ranks} processes x {size}",
               fix="use a smaller --size or fewer --ranks")
    check_count(repeats, field="--repeats", hi=MAX_REPEATS, what="repeats")
    if delay_s * (repeats + 1) > MAX_RUN_SECONDS:
        raise ScenarioError(f"{late} late on each of {repeats + 1} trials is over {MAX_RUN_SECONDS // 60} minutes "
                            "of waiting", field="--straggler-delay", fix="use a delay of seconds at most")
    from lightrail.report.stragglar import print_run, run_mismatch  # torch, after the checks
    from lightrail.studies.stragglar_run import measure_stragglar

    busy = err.status(f"running {ranks} gloo processes") if err.is_terminal and not as_json else nullcontext()
    with busy:
        result = measure_stragglar(ranks, nbytes, delay_s, straggler, repeats=repeats)
    save_result(out_dir, "stragglar-run.json", result.to_dict(), quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_run(result, out)
    mismatch = run_mismatch(result)
    if mismatch:
        err.print(mismatch, highlight=False)
        raise typer.Exit(1)


MAX_RUN_RANKS = 64
"""Most gloo processes ``stragglar run`` starts (the largest StragglAR run the paper measures is 8 GPUs)."""
MAX_REPEATS = 1000
MAX_RUN_SECONDS = 600


def _study_delay(seconds: float, field: str) -> float:
    """A modelled straggler delay of at most :data:`MAX_RUN_SECONDS` (longer ones lose the AllReduce's
    microseconds to rounding: 1e300 s divided time after arrival by zero)."""
    if seconds > MAX_RUN_SECONDS:
        raise ScenarioError(f"{seconds:g} s is longer than a straggler study means (at most {MAX_RUN_SECONDS} s; "
                            "an AllReduce takes milliseconds)", field=field, fix="e.g. 0,50us,1ms,5ms")
    return seconds


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
                                          "speedup-vs-delay.png (or .svg/.pdf, see --format).")]
    = Path("out/stragglar-sweep"),
    fmt: FigureFormat = "png",
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
    fmt = figure_suffix(fmt)
    check_out(out_dir if writes_files(as_json) else None)
    check_collective_size("allreduce", "stragglar", rank_list[-1])
    check_stragglar_work(rank_list, repeat=max(1, len(names)))
    check_count(len(delay_list), field="--straggler-delays", hi=MAX_SWEEP_POINTS, what="delays")
    _study_delay(max(delay_list), "--straggler-delays")
    nbytes = parse_size(size, field="--size")
    rate, hop, start = (parse_rate(bandwidth, field="--bandwidth"), parse_time(latency, field="--latency"),
                        parse_time(alpha, field="--alpha"))
    with progress_steps(len(names) * len(rank_list), "StragglAR sweep", as_json) as step:
        result = fabric_sweep(rank_list, delay_list, nbytes, names, bandwidth=rate, latency=hop, alpha=start,
                              gpus_per_server=gpus_per_server, hosts_per_leaf=hosts_per_leaf, at_delay=at_s,
                              at_ranks=at_ranks, progress=step)
    files = write_sweep(result, out_dir, fmt=fmt) if writes_files(as_json) else []
    if as_json:
        print_json(result.to_dict())
    else:
        print_sweep(result, files, out)
