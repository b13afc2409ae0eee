"""``lightrail collective``, ``collective-sweep``, ``algorithms``: one collective on a fabric."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lightrail.cli.app import app, err, friendly, out
from lightrail.cli.options import (
    Alpha,
    Bandwidth,
    GpusPerServer,
    HostsPerLeaf,
    JsonOut,
    Latency,
    NvlinkBandwidth,
    Op,
    Oversubscription,
    Ranks,
    Shape,
    TopologyOpt,
    build_fabric,
    parse_kind,
    parse_sizes,
    print_json,
)
from lightrail.collectives import algorithms, get
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import NVLINK_BANDWIDTH
from lightrail.units import format_rate, format_size, format_time, parse_rate, parse_size, parse_time


@app.command("collective")
@friendly
def collective_cmd(
    op: Op = "allreduce",
    algo: Annotated[str, typer.Option("--algo", "-a", help="Algorithm name; see `lightrail algorithms`.")] = "ring",
    ranks: Ranks = 64,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank, e.g. 1GiB.")] = "1GiB",
    topology: TopologyOpt = "switch",
    bandwidth: Bandwidth = "400Gbps",
    latency: Latency = "1us",
    alpha: Alpha = "3us",
    shape: Shape = None,
    gpus_per_server: GpusPerServer = 8,
    nvlink_bandwidth: NvlinkBandwidth = f"{NVLINK_BANDWIDTH / 1e9:g}GBps",
    hosts_per_leaf: HostsPerLeaf = 32,
    oversubscription: Oversubscription = 1.0,
    root: Annotated[int, typer.Option("--root", help="Root rank (broadcast, reduce).")] = 0,
    pipeline: Annotated[int, typer.Option("--pipeline", help="Chunks per tree (double-binary-tree).")] = 1,
    reconfigurable: Annotated[bool, typer.Option("--reconfigurable", help="Plan on a reconfigurable circuit "
                                                 "fabric instead of --topology (see --ports, --reconfig-delay).")]
    = False,
    ports: Annotated[int, typer.Option("--ports", help="Optical ports per GPU (reconfigurable).")] = 2,
    reconfig_delay: Annotated[str, typer.Option("--reconfig-delay", help="Circuit reconfiguration delay.")] = "10us",
    base: Annotated[str, typer.Option("--base", help="Static links under the circuits: none, ring, torus.")]
    = "none",
    propagation: Annotated[str, typer.Option("--propagation", help="Fibre delay per circuit hop.")] = "0",
    as_json: JsonOut = False,
):
    """Simulate one collective: time, algorithm and bus bandwidth, steps, and the verifier's proof;
    with --reconfigurable, the exact reconfiguration plan on a circuit fabric."""
    from lightrail.studies.collective import evaluate

    algorithm = get(op, algo)  # validates --op and --algo first
    nbytes = parse_size(size, field="--size")
    if not 0 <= root < ranks:
        raise ScenarioError(f"root {root} is not a rank of {ranks}", field="--root", fix=f"use 0..{ranks - 1}")
    if pipeline < 1:
        raise ScenarioError("must be at least 1", field="--pipeline")
    if reconfigurable:
        delay = parse_time(reconfig_delay, field="--reconfig-delay")
        _reconfigurable_collective(algorithm, ranks, nbytes, ports, delay, base,
                                   parse_time(propagation, field="--propagation"),
                                   parse_rate(bandwidth, field="--bandwidth"), parse_time(latency, field="--latency"),
                                   parse_time(alpha, field="--alpha"),
                                   {"gpus_per_server": gpus_per_server, "root": root, "pipeline": pipeline}, as_json)
        return
    fabric = build_fabric(topology, ranks, bandwidth, latency, shape, gpus_per_server, nvlink_bandwidth,
                     hosts_per_leaf, oversubscription)
    result = evaluate(algorithm.kind, algo, ranks, nbytes, fabric, alpha=parse_time(alpha, field="--alpha"),
                      gpus_per_server=gpus_per_server, root=root, pipeline=pipeline)
    if as_json:
        print_json(result.to_dict())
        return
    table = Table(title=f"{result.op} / {result.algorithm} on {result.topology}", show_header=False)
    for key, value in (("schedule", result.schedule), ("ranks", str(result.ranks)),
                       ("size per rank", format_size(result.size_bytes)), ("time", format_time(result.time_s)),
                       ("steps", str(result.steps)), ("algorithm bandwidth", format_rate(result.algbw_Bps)),
                       ("bus bandwidth", format_rate(result.busbw_Bps)),
                       ("verified", f"yes ({result.verification})")):
        table.add_row(key, value)
    out.print(table)


def _reconfigurable_collective(algorithm, ranks, nbytes, ports, delay, base, propagation, bandwidth, latency, alpha,
                               params, as_json) -> None:
    from lightrail.collectives import bus_factor, verify
    from lightrail.control.pccl import Planner
    from lightrail.fabric.params import ReconfigurableFabric
    from lightrail.studies.collective import generator_params as _params

    if ranks < 2:
        raise ScenarioError(f"{ranks} ranks is too few", field="--ranks", fix="use 2 or more ranks")
    if base not in ("none", "ring", "torus"):
        raise ScenarioError(f"unknown base {base!r}", field="--base", fix="use none, ring or torus")
    if ports < 1:
        raise ScenarioError(f"{ports} ports", field="--ports", fix="use 1 or more optical ports per GPU")
    fabric = ReconfigurableFabric(n=ranks, ports=ports, base=base, bandwidth=bandwidth, latency=latency,
                                  propagation=propagation, reconfig_delay=delay, alpha=alpha)
    schedule = algorithm(ranks, **_params(algorithm.kind, algorithm.name, params))
    proof = verify(schedule)
    planner = Planner(schedule, fabric)
    plan, static, greedy = planner.plan(nbytes), planner.plan_static(nbytes), planner.plan_threshold(nbytes)
    algbw = nbytes / plan.total_s
    result = {"op": str(algorithm.kind), "algorithm": algorithm.name, "schedule": schedule.name, "ranks": ranks,
              "size_bytes": nbytes, "topology": f"reconfigurable(ports={ports},base={base})",
              "time_s": plan.total_s, "static_time_s": static.total_s, "threshold_time_s": greedy.total_s,
              "steps": schedule.nsteps,
              "algbw_Bps": algbw, "busbw_Bps": algbw * bus_factor(algorithm.kind, ranks), "verified": True,
              "verification": proof.method, "reconfig_delay_s": delay, "reconfigurations": plan.reconfigurations,
              "exact": planner.exact, "plan": plan.to_dict()["plan"]}
    if as_json:
        print_json(result)
        return
    table = Table(title=f"{result['op']} / {algorithm.name} on a reconfigurable fabric ({ports} ports, "
                        f"delay {format_time(delay) if delay else '0'})", show_header=False)
    for key, value in (("time", format_time(plan.total_s)),
                       ("on the initial circuits only", format_time(static.total_s)),
                       ("threshold heuristic (short-circuiting)", format_time(greedy.total_s)),
                       ("reconfigurations", str(plan.reconfigurations)), ("steps", str(schedule.nsteps)),
                       ("bus bandwidth", format_rate(result["busbw_Bps"])),
                       ("verified", f"yes ({proof.method})"), ("plan", "exact" if planner.exact else "windowed")):
        table.add_row(key, value)
    out.print(table)
    steps = Table(title="plan")
    for col in ("step", "action", "configuration", "time"):
        steps.add_column(col, justify="right")
    for row in result["plan"]:
        steps.add_row(str(row["step"]), "reconfigure" if row["reconfigure"] else "stay", str(row["configuration"]),
                      format_time(row["time_s"]))
    out.print(steps)


@app.command("algorithms")
@friendly
def algorithms_cmd(
    op: Annotated[str | None, typer.Option("--op", help="Only this collective.")] = None,
    as_json: JsonOut = False,
):
    """List the collective algorithms lightrail can generate and verify."""
    listed = algorithms(parse_kind(op)) if op else algorithms()
    rows = [{"op": str(a.kind), "algorithm": a.name, "steps": a.steps, "summary": a.summary} for a in listed]
    if as_json:
        print_json({"algorithms": rows})
        return
    table = Table(title="collective algorithms")
    for col in ("op", "algorithm", "steps", "summary"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["op"], r["algorithm"], r["steps"], r["summary"])
    out.print(table)


@app.command("collective-sweep")
@friendly
def collective_sweep_cmd(
    op: Op = "allreduce",
    ranks: Ranks = 64,
    sizes: Annotated[str, typer.Option("--sizes", help="1KiB..4GiB (powers of two) or a comma list.")] = "1KiB..4GiB",
    topology: TopologyOpt = "rails",
    bandwidth: Bandwidth = "400Gbps",
    latency: Latency = "1us",
    alpha: Alpha = "3us",
    shape: Shape = None,
    gpus_per_server: GpusPerServer = 8,
    nvlink_bandwidth: NvlinkBandwidth = f"{NVLINK_BANDWIDTH / 1e9:g}GBps",
    hosts_per_leaf: HostsPerLeaf = 32,
    oversubscription: Oversubscription = 1.0,
    algo: Annotated[list[str] | None, typer.Option("--algo", "-a", help="Only these algorithms (repeatable).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for sweep.json, sweep.csv and sweep.png.")] = Path(
        "out/sweep"),
    as_json: JsonOut = False,
):
    """Compare every algorithm of an op over message sizes: table, JSON, CSV and a PNG plot."""
    from lightrail.report.files import write_json, write_text
    from lightrail.report.plots import plot_sweep
    from lightrail.studies.collective import sweep

    listed = [get(op, a) for a in algo] if algo else algorithms(parse_kind(op))
    kind = listed[0].kind if listed else parse_kind(op)
    size_list = parse_sizes(sizes)
    fabric = build_fabric(topology, ranks, bandwidth, latency, shape, gpus_per_server, nvlink_bandwidth,
                     hosts_per_leaf, oversubscription)
    seconds = parse_time(alpha, field="--alpha")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=as_json or not err.is_terminal) as progress:
        task = progress.add_task(f"{kind} on {fabric.name}", total=len(listed))
        rows = sweep(kind, ranks, size_list, fabric, alpha=seconds, names=[a.name for a in listed],
                     progress=lambda name: progress.update(task, advance=1, description=f"{kind}: {name}"),
                     gpus_per_server=gpus_per_server)
    records = [r.to_dict() for r in rows]
    names = list(dict.fromkeys(r["algorithm"] for r in records))
    best = {}
    for r in records:
        if r["size_bytes"] not in best or r["time_s"] < best[r["size_bytes"]]["time_s"]:
            best[r["size_bytes"]] = r
    result = {
        "op": str(kind), "ranks": ranks, "topology": fabric.name,
        "settings": {"bandwidth_Bps": parse_rate(bandwidth, field="--bandwidth"),
                     "latency_s": parse_time(latency, field="--latency"), "alpha_s": seconds},
        "best": [{"size_bytes": s, "algorithm": r["algorithm"], "time_s": r["time_s"]}
                 for s, r in sorted(best.items())],
        "rows": records,
    }
    csv = ["size_bytes," + ",".join(f"{n}_time_s" for n in names) + ",best"]
    for s in size_list:
        times = {r["algorithm"]: r["time_s"] for r in records if r["size_bytes"] == s}
        csv.append(f"{s:.0f}," + ",".join(f"{times[n]:.9g}" for n in names) + f",{best[s]['algorithm']}")
    plot_sweep(records, out_dir / "sweep.png", title=f"{kind} on {fabric.name}, {ranks} ranks")
    write_json(out_dir / "sweep.json", result)
    write_text(out_dir / "sweep.csv", "\n".join(csv) + "\n")
    if as_json:
        print_json(result)
        return
    table = Table(title=f"{kind}, {ranks} ranks on {fabric.name}: time per collective")
    table.add_column("size", justify="right")
    for n in names:
        table.add_column(n, justify="right")
    for s in size_list:
        times = {r["algorithm"]: r["time_s"] for r in records if r["size_bytes"] == s}
        cells = [(f"[bold green]{format_time(times[n])}[/]" if n == best[s]["algorithm"] else format_time(times[n]))
                 for n in names]
        table.add_row(format_size(s), *cells)
    out.print(table)
    out.print(f"wrote {out_dir / 'sweep.json'}, {out_dir / 'sweep.csv'}, {out_dir / 'sweep.png'}")
