"""``lightrail stragglar rounds|compare|sweep|run``: AllReduce with a persistent straggler."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lightrail.cli.app import app, err, friendly, out
from lightrail.cli.options import (
    Alpha,
    GpusPerServer,
    HostsPerLeaf,
    JsonOut,
    Latency,
    Ranks,
    TopologyOpt,
    build_fabric,
    parse_rank_range,
    print_json,
    progress_bar,
)
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import NVLINK_BANDWIDTH, TOPOLOGIES, build_topology
from lightrail.units import format_rate, format_size, format_time, parse_rate, parse_size, parse_time

stragglar_app = typer.Typer(no_args_is_help=True, help="StragglAR: AllReduce with a persistent straggler.")
app.add_typer(stragglar_app, name="stragglar")


@stragglar_app.command("rounds")
@friendly
def stragglar_rounds_cmd(
    ranks: Annotated[str, typer.Option("--ranks", "-n", help="A rank count, a range 2..64 or a comma list.")] = "8",
    as_json: JsonOut = False,
):
    """Phase-2 rounds of the synthesised StragglAR schedule against the lower bound, per rank count
    (met at every power of two; other n use a greedy, about a second each near n = 1,000)."""
    from lightrail.collectives.stragglar import lower_bound, phase2

    rows = []
    wanted = parse_rank_range(ranks)
    progress, task = progress_bar(len(wanted), "StragglAR rounds", as_json or len(wanted) < 32)
    with progress:
        for n in wanted:
            progress.update(task, description=f"StragglAR rounds, n={n}")
            # uncached: a long range would otherwise keep hundreds of large schedules in memory
            rows.append({"ranks": n, "rounds": phase2.__wrapped__(n).rounds, "lower_bound": lower_bound(n)})
            progress.advance(task)
    if as_json:
        print_json(rows[0] if len(rows) == 1 else {"rows": rows})
        return
    table = Table(title="StragglAR phase-2 rounds")
    for col in ("ranks", "rounds", "lower bound", "gap"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["ranks"]), str(r["rounds"]), str(r["lower_bound"]), str(r["rounds"] - r["lower_bound"]))
    out.print(table)


@stragglar_app.command("compare")
@friendly
def stragglar_compare_cmd(
    ranks: Ranks = 8,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank.")] = "64MiB",
    delay: Annotated[str, typer.Option("--delay", help="How late the straggler (rank n-1) arrives.")] = "5ms",
    topology: TopologyOpt = "switch",
    bandwidth: Annotated[str, typer.Option("--bandwidth", help="Per-GPU link rate (NVSwitch-style default).")]
    = "450GBps",
    latency: Latency = "1us",
    alpha: Alpha = "3us",
    as_json: JsonOut = False,
):
    """Time to finish with a straggler: StragglAR against Ring, halving-doubling, tree and
    "wait, then run the best algorithm" (in the model)."""
    from lightrail.studies.stragglar import straggler_comparison

    fabric = build_fabric(topology, ranks, bandwidth, latency, None, 8, f"{NVLINK_BANDWIDTH / 1e9:g}GBps", 32, 1.0)
    result = straggler_comparison(ranks, parse_size(size, field="--size"), parse_time(delay, field="--delay"), fabric,
                                  alpha=parse_time(alpha, field="--alpha"))
    if as_json:
        print_json(result)
        return
    table = Table(title=f"AllReduce of {size} on {result['topology']}, straggler {delay} late")
    table.add_column("algorithm")
    table.add_column("time to finish (from start)", justify="right")
    table.add_column("after straggler arrives", justify="right")
    for name, t in sorted(result["times_s"].items(), key=lambda kv: kv[1]):
        table.add_row(name, format_time(t), format_time(t - result["delay_s"]))
    out.print(table)
    out.print(f"StragglAR vs Ring: {result['speedup_over_ring']:.2f}x from start, "
              f"{result['speedup_over_ring_after_arrival']:.2f}x after straggler arrives")
    out.print(f"StragglAR vs waiting then running {result['wait_then_best']}: {result['speedup_over_best']:.2f}x "
              f"from start, {result['speedup_over_best_after_arrival']:.2f}x after straggler arrives")


@stragglar_app.command("run")
@friendly
def stragglar_run_cmd(
    ranks: Ranks = 8,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank, e.g. 64MiB.")] = "64MiB",
    delay: Annotated[str, typer.Option("--delay", help="How late the straggler arrives, e.g. 50ms.")] = "50ms",
    straggler: Annotated[int | None, typer.Option("--straggler", help="The late rank (default: ranks-1).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed trials per method; the median is shown.")] = 5,
    as_json: JsonOut = False,
):
    """Measure for real, on CPU gloo processes: StragglAR against lightrail's Ring and gloo's
    dist.all_reduce, with one rank arriving late."""
    from contextlib import nullcontext

    from lightrail.studies.straggler_run import METHODS, measure_straggler

    nbytes = parse_size(size, field="--size")
    delay_s = parse_time(delay, field="--delay")
    late = ranks - 1 if straggler is None else straggler
    busy = err.status(f"running {ranks} gloo processes") if err.is_terminal and not as_json else nullcontext()
    with busy:
        result = measure_straggler(ranks, int(nbytes), delay_s, late, repeats=repeats)
    if as_json:
        print_json(result)
    else:
        table = Table(title=f"AllReduce of {format_size(result['size_bytes'])} on {ranks} gloo processes, "
                            f"rank {late} {format_time(delay_s) if delay_s else '0 s'} late "
                            f"(median of {repeats})")
        table.add_column("method")
        table.add_column("time to finish", justify="right")
        table.add_column("StragglAR speedup over it", justify="right")
        names = {"stragglar": "StragglAR", "ring": "lightrail Ring", "native": "gloo dist.all_reduce"}
        for m in METHODS:
            table.add_row(names[m], format_time(result[f"{m}_s"]), f"{result[f'{m}_s'] / result['stragglar_s']:.2f}x")
        out.print(table)
        out.print("matches dist.all_reduce: " + ", ".join(
            f"{names[m]} {'yes' if result['correct'][m] else 'NO'}" for m in METHODS))
    wrong = [m for m in METHODS if not result["correct"][m]]
    if wrong:
        err.print(f"[bold red]error:[/] {', '.join(wrong)} did not match dist.all_reduce (max abs error "
                  + ", ".join(f"{result['max_abs_error'][m]:.3g}" for m in wrong) + ")", highlight=False)
        raise typer.Exit(1)


STRAGGLAR_DELAYS = "0,50us,100us,250us,500us,1ms,5ms"  # a 64 MiB AllReduce on NVLink takes 0.25-1.2 ms


@stragglar_app.command("sweep")
@friendly
def stragglar_sweep_cmd(
    ranks: Annotated[str, typer.Option("--ranks", "-n", help="Rank counts: a range 2..64 or a comma list.")]
    = "4,8,16,32,64",
    delays: Annotated[str, typer.Option("--delays", help="Comma list of straggler delays.")] = STRAGGLAR_DELAYS,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank.")] = "64MiB",
    topologies: Annotated[str, typer.Option("--topologies", help="Comma list of fabrics: " + ", ".join(TOPOLOGIES)
                                            + ".")] = ",".join(TOPOLOGIES),
    bandwidth: Annotated[str, typer.Option("--bandwidth", help="Per-GPU link rate (NVSwitch-style default).")]
    = "450GBps",
    latency: Latency = "1us",
    alpha: Alpha = "3us",
    gpus_per_server: GpusPerServer = 8,
    hosts_per_leaf: HostsPerLeaf = 32,
    at_delay: Annotated[str | None, typer.Option("--at-delay", help="Delay of the speedup-vs-ranks plot and "
                                                 "table, one of --delays (default: 250us if listed, else the last).")]
    = None,
    at_ranks: Annotated[int | None, typer.Option("--at-ranks", help="Rank count of the speedup-vs-delay plot, one "
                                                 "of --ranks (default: 8 if listed, else the smallest).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for sweep.json, speedup-vs-ranks.png and "
                                          "speedup-vs-delay.png.")] = Path("out/stragglar-sweep"),
    as_json: JsonOut = False,
):
    """StragglAR's speedup over Ring and over "wait, then the best algorithm" against the rank count
    and the straggler's delay, on several fabrics (in the model); skips (fabric, n) pairs a fabric
    cannot build."""
    from lightrail.report.files import write_json
    from lightrail.report.plots import plot_straggler_speedups
    from lightrail.studies.stragglar import straggler_sweep

    # validate everything before computing or writing anything
    rank_list = sorted(set(parse_rank_range(ranks)))
    delay_list = sorted({parse_time(d, field="--delays") for d in delays.split(",") if d.strip()})
    if not delay_list:
        raise ScenarioError(f"{delays!r} lists no delay", field="--delays", fix=f"e.g. {STRAGGLAR_DELAYS}")
    names = list(dict.fromkeys(t.strip() for t in topologies.split(",") if t.strip()))
    unknown = [t for t in names if t not in TOPOLOGIES]
    if unknown or not names:
        raise ScenarioError(f"unknown topology {', '.join(map(repr, unknown))}" if unknown else "no topology given",
                            field="--topologies", fix="use a comma list of " + ", ".join(TOPOLOGIES))
    nbytes = parse_size(size, field="--size")
    rate, hop, start = (parse_rate(bandwidth, field="--bandwidth"), parse_time(latency, field="--latency"),
                        parse_time(alpha, field="--alpha"))
    if gpus_per_server < 1 or hosts_per_leaf < 1:
        raise ScenarioError("must be at least 1", field="--gpus-per-server" if gpus_per_server < 1
                            else "--hosts-per-leaf")
    if at_delay is None:
        chosen_delay = 250e-6 if any(math.isclose(d, 250e-6) for d in delay_list) else delay_list[-1]
    else:
        wanted = parse_time(at_delay, field="--at-delay")
        chosen_delay = next((d for d in delay_list if math.isclose(d, wanted, rel_tol=1e-9, abs_tol=1e-15)), None)
        if chosen_delay is None:
            raise ScenarioError(f"{at_delay} is not one of --delays", field="--at-delay",
                                fix="use one of " + ", ".join(format_time(d) if d else "0" for d in delay_list))
    if at_ranks is None:
        chosen_ranks = 8 if 8 in rank_list else rank_list[0]
    elif at_ranks not in rank_list:
        raise ScenarioError(f"{at_ranks} is not one of --ranks", field="--at-ranks",
                            fix="use one of " + ", ".join(map(str, rank_list)))
    else:
        chosen_ranks = at_ranks

    def builder(name: str):
        return lambda n: build_topology(name, n, bandwidth=rate, latency=hop, gpus_per_server=gpus_per_server,
                                        nvlink_bandwidth=NVLINK_BANDWIDTH, hosts_per_leaf=hosts_per_leaf)

    progress, task = progress_bar(len(names) * len(rank_list), "StragglAR sweep", as_json)
    with progress:
        result = straggler_sweep(rank_list, delay_list, nbytes, {t: builder(t) for t in names}, alpha=start,
                                 progress=lambda label: progress.update(task, advance=1, description=label))
    if not result["cells"]:
        raise ScenarioError("no fabric supports any of these rank counts", field="--ranks",
                            fix="; ".join(f"{s['topology']} n={s['ranks']}: {s['reason']}" for s in result["skipped"]))
    if not any(c["ranks"] == chosen_ranks for c in result["cells"]):
        raise ScenarioError(f"no fabric supports {chosen_ranks} ranks", field="--at-ranks",
                            fix="use one of " + ", ".join(map(str, sorted({c["ranks"] for c in result["cells"]}))))
    result["settings"] = {"bandwidth_Bps": rate, "latency_s": hop, "gpus_per_server": gpus_per_server,
                          "nvlink_bandwidth_Bps": NVLINK_BANDWIDTH, "hosts_per_leaf": hosts_per_leaf,
                          "at_delay_s": chosen_delay, "at_ranks": chosen_ranks}
    files = out_dir / "sweep.json", out_dir / "speedup-vs-ranks.png", out_dir / "speedup-vs-delay.png"
    title = (f"StragglAR AllReduce of {format_size(nbytes)}, {format_rate(rate)} per GPU, "
             f"{format_time(hop) if hop else '0'} per hop, alpha {format_time(start) if start else '0'}")
    plot_straggler_speedups(result, files[1], files[2], at_delay=chosen_delay, at_ranks=chosen_ranks, title=title)
    write_json(files[0], result)
    if as_json:
        print_json(result)
        return
    table = Table(title=f"StragglAR AllReduce of {format_size(nbytes)}, straggler "
                        f"{format_time(chosen_delay) if chosen_delay else '0 s'} late")
    for col in ("topology", "n", "StragglAR", "Ring", "vs Ring (from start)", "vs Ring (after straggler arrives)",
                "wait-then-best", "vs it (from start)", "vs it (after straggler arrives)"):
        table.add_column(col, justify="left" if col in ("topology", "wait-then-best") else "right")
    shown = [c for c in result["cells"] if c["delay_s"] == chosen_delay]
    for c, after in zip(shown, shown[1:] + [None], strict=True):
        table.add_row(c["topology"], str(c["ranks"]), format_time(c["stragglar_s"]), format_time(c["ring_s"]),
                      f"{c['speedup_over_ring']:.3f}x", f"{c['speedup_over_ring_after_arrival']:.3f}x",
                      c["wait_then_best"], f"{c['speedup_over_best']:.3f}x",
                      f"{c['speedup_over_best_after_arrival']:.3f}x",
                      end_section=after is not None and after["topology"] != c["topology"])
    out.print(table)
    for s in result["skipped"]:
        out.print(f"skipped {s['topology']} n={s['ranks']}: {escape(s['reason'])}", highlight=False, soft_wrap=True)
    out.print(f"wrote {', '.join(map(str, files))}", highlight=False, soft_wrap=True)
