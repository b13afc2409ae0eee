"""``lightrail``: the command line. Parses units and options at the edge, prints tables or JSON.

Every ``LightrailError`` becomes one line on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lightrail import __version__
from lightrail.collectives import Kind, algorithms, get
from lightrail.errors import LightrailError, ScenarioError
from lightrail.fabric.builders import NVLINK_BANDWIDTH, TOPOLOGIES, build_topology
from lightrail.units import format_rate, format_size, format_time, parse_rate, parse_size, parse_time

app = typer.Typer(name="lightrail", no_args_is_help=True, add_completion=False,
                  help="Toolkit and control plane for reconfigurable photonic networks in ML clusters.")
out = Console()
err = Console(stderr=True)


_FLAGS = {"algo": "--algo", "op": "--op", "ranks": "--ranks", "root": "--root", "shape": "--shape",
          "oversubscription": "--oversubscription"}


def friendly(fn):
    """Turn a LightrailError into ``error: <field>: <message>; <fix>`` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LightrailError as e:
            if e.field in _FLAGS:  # errors from the library name its arguments; show the flag instead
                e.field = _FLAGS[e.field]
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


# -- shared options -------------------------------------------------------------------------------
Op = Annotated[str, typer.Option("--op", help="Collective: " + ", ".join(k.value for k in Kind) + ".")]
Ranks = Annotated[int, typer.Option("--ranks", "-n", help="Number of ranks (GPUs), 2 or more.")]
TopologyOpt = Annotated[str, typer.Option("--topology", "-t", help="Fabric: " + ", ".join(TOPOLOGIES) + ".")]
Bandwidth = Annotated[str, typer.Option("--bandwidth", help="Per-GPU network link rate, e.g. 400Gbps or 50GBps.")]
Latency = Annotated[str, typer.Option("--latency", help="Latency per hop (link), e.g. 1us.")]
Alpha = Annotated[str, typer.Option("--alpha", help="Start-up cost per step, e.g. 3us.")]
Shape = Annotated[str | None, typer.Option("--shape", help="Torus sides, e.g. 32x32 (default: most square).")]
GpusPerServer = Annotated[int, typer.Option("--gpus-per-server",
                                            help="Servers' NVLink domain size (rails, hierarchical).")]
NvlinkBandwidth = Annotated[str, typer.Option("--nvlink-bandwidth", help="NVLink rate per GPU per direction (rails).")]
HostsPerLeaf = Annotated[int, typer.Option("--hosts-per-leaf", help="GPUs per leaf switch (fat-tree).")]
Oversubscription = Annotated[float, typer.Option("--oversubscription", help="Leaf down:up capacity ratio (fat-tree).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]


def _shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sides = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise ScenarioError(f"cannot read {text!r} as torus sides", field="--shape",
                            fix="write e.g. 32x32 or 16x8x8") from None
    if any(s < 1 for s in sides):
        raise ScenarioError(f"torus sides must be positive, got {text!r}", field="--shape")
    return sides


def _fabric(topology: str, ranks: int, bandwidth: str, latency: str, shape: str | None, gpus_per_server: int,
            nvlink_bandwidth: str, hosts_per_leaf: int, oversubscription: float):
    if ranks < 2:
        raise ScenarioError(f"{ranks} ranks is too few", field="--ranks", fix="use 2 or more ranks")
    if gpus_per_server < 1 or hosts_per_leaf < 1:
        field = "--gpus-per-server" if gpus_per_server < 1 else "--hosts-per-leaf"
        raise ScenarioError("must be at least 1", field=field)
    return build_topology(topology, ranks, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                          latency=parse_time(latency, field="--latency"), shape=_shape(shape),
                          gpus_per_server=gpus_per_server,
                          nvlink_bandwidth=parse_rate(nvlink_bandwidth, field="--nvlink-bandwidth"),
                          hosts_per_leaf=hosts_per_leaf, oversubscription=oversubscription)


def _sizes(text: str) -> list[float]:
    """``1KiB..4GiB`` (powers of two in between) or a comma list ``1MiB,64MiB``."""
    if ".." in text:
        lo_text, hi_text = text.split("..", 1)
        lo, hi = parse_size(lo_text, field="--sizes"), parse_size(hi_text, field="--sizes")
        if not 0 < lo <= hi:
            raise ScenarioError(f"{text!r} is not an increasing range", field="--sizes",
                                fix="write e.g. 1KiB..4GiB")
        return [lo * 2**k for k in range(int(math.floor(math.log2(hi / lo) + 1e-9)) + 1)]
    sizes = [parse_size(s, field="--sizes") for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) <= 0:
        raise ScenarioError(f"{text!r} lists no positive size", field="--sizes",
                            fix="write e.g. 1KiB..4GiB or 1MiB,1GiB")
    return sorted(sizes)


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


# -- verbs ----------------------------------------------------------------------------------------
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
    from lightrail.sim.collective import evaluate

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
    fabric = _fabric(topology, ranks, bandwidth, latency, shape, gpus_per_server, nvlink_bandwidth,
                     hosts_per_leaf, oversubscription)
    result = evaluate(algorithm.kind, algo, ranks, nbytes, fabric, alpha=parse_time(alpha, field="--alpha"),
                      gpus_per_server=gpus_per_server, root=root, pipeline=pipeline)
    if as_json:
        _print_json(result.to_dict())
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
    from lightrail.control.pccl import Planner, ReconfigurableFabric
    from lightrail.sim.collective import _params

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
        _print_json(result)
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
    listed = algorithms(_kind(op)) if op else algorithms()
    rows = [{"op": str(a.kind), "algorithm": a.name, "steps": a.steps, "summary": a.summary} for a in listed]
    if as_json:
        _print_json({"algorithms": rows})
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
    from lightrail.sim.collective import sweep

    listed = [get(op, a) for a in algo] if algo else algorithms(_kind(op))
    kind = listed[0].kind if listed else _kind(op)
    size_list = _sizes(sizes)
    fabric = _fabric(topology, ranks, bandwidth, latency, shape, gpus_per_server, nvlink_bandwidth,
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
        _print_json(result)
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


Scenario = Annotated[Path | None, typer.Argument(help="Scenario file (.yaml/.json); default: the embedded "
                                                      "Llama-3 70B on 2,048 H200 scenario.", show_default=False)]
Delay = Annotated[str | None, typer.Option("--delay", help="Override the OCS reconfiguration delay, e.g. 25ms.")]
ModeOpt = Annotated[str | None, typer.Option("--mode", help="Override the OCS mode: on-demand or provisioned.")]


def _built(scenario: Path | None, delay: str | None = None, mode: str | None = None):
    from dataclasses import replace

    from lightrail.scenario import load_scenario

    loaded, base = load_scenario(scenario)
    built = loaded.build(base)
    if delay is not None:
        built = replace(built, fabric=replace(built.fabric, reconfig_delay=parse_time(delay, field="--delay")))
    if mode is not None:
        m = mode.replace("-", "_")
        if m not in ("on_demand", "provisioned"):
            raise ScenarioError(f"unknown mode {mode!r}", field="--mode", fix="use on-demand or provisioned")
        built = replace(built, params=replace(built.params, mode=m))
    return built


def _signed_time(seconds: float) -> str:
    if abs(seconds) < 5e-10:
        return "0"
    return ("-" if seconds < 0 else "+") + format_time(abs(seconds))


def _progress(total: int, label: str, quiet: bool):
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True, disable=quiet or not err.is_terminal)
    return progress, progress.add_task(label, total=total)


@app.command("check")
@friendly
def check_cmd(scenario: Scenario = None):
    """Validate a scenario file without simulating (exit 2 and the field at fault if it is wrong)."""
    built = _built(scenario)
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
    from lightrail.sim.photonic_rails import ABLATION, BREAKDOWN, compare_rails
    from lightrail.sim.trace import chrome_trace

    built = _built(scenario, delay, mode)
    progress, task = _progress(3 + len(ABLATION), f"simulating {built.scenario.name}", as_json)
    with progress:
        result = compare_rails(built, progress=lambda name: progress.update(task, advance=1, description=name))
    runs = result.pop("_results")
    trace = chrome_trace(runs["photonic"], built.job.layout)
    rows = {f"{name} rails" if name != "ideal" else "ideal rails (OCS, 0 delay)": summary
            for name, summary in result["breakdown"].items()}
    plot_breakdown(rows, out_dir / "breakdown.png",
                   title=f"{built.scenario.name}: {built.job.layout}, OCS delay "
                         f"{format_time(built.fabric.reconfig_delay)}, {built.params.mode.replace('_', '-')}")
    plot_overhead_breakdown(result["ablation"], out_dir / "overhead.png",
                            title=f"{built.scenario.name}: where the photonic overhead goes, OCS delay "
                                  f"{format_time(built.fabric.reconfig_delay)}, {built.params.mode.replace('_', '-')}")
    trace["metadata"].update(overhead_breakdown_s=result["overhead_breakdown_s"],
                             controller_round_trips_per_iteration=result["controller_round_trips_per_iteration"])
    write_json(out_dir / "trace.json", trace)
    write_json(out_dir / "summary.json", result)
    if as_json:
        _print_json(result)
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
    mode_name = built.params.mode.replace("_", "-")
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
        split.add_row(row["policy"], *(_signed_time(row["overhead_breakdown_s"][k]) for k, _ in parts))
    out.print(ablation)
    out.print(split)
    b = result["overhead_breakdown_s"]
    out.print(f"photonic overhead {_signed_time(result['iteration_time_s'] - result['baseline_iteration_time_s'])} = "
              + " + ".join(f"{lbl} {_signed_time(b[k])}" for k, lbl in parts)
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
    from lightrail.sim.cost import compare

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
        _print_json({"rail_speed": rail_speed, "rows": rows})
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


study_app = typer.Typer(no_args_is_help=True, help="Studies over grids of cases.")
app.add_typer(study_app, name="study")


@study_app.command("collectives")
@friendly
def study_collectives_cmd(
    ops: Annotated[str, typer.Option("--ops", help="Comma list of collectives.")] =
    "allreduce,reducescatter,allgather,alltoall",
    ranks: Annotated[str, typer.Option("--ranks", help="Comma list of rank counts.")] = "8,16,32,64,128,256,1024",
    sizes: Annotated[str, typer.Option("--sizes", help="1KiB..4GiB (powers of two) or a comma list.")]
    = "1KiB..4GiB",
    delays: Annotated[str, typer.Option("--delays", help="Comma list of reconfiguration delays.")]
    = "0,1us,10us,100us,1ms,10ms",
    ports: Annotated[int, typer.Option("--ports", help="Optical ports per GPU.")] = 2,
    bandwidth: Bandwidth = "400Gbps",
    latency: Latency = "1us",
    alpha: Alpha = "3us",
    propagation: Annotated[str, typer.Option("--propagation", help="Fibre delay per circuit hop.")] = "0",
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for study.json, summary.csv and heat maps.")]
    = Path("out/study-collectives"),
    as_json: JsonOut = False,
):
    """When does reconfiguring the fabric per step pay? Static ring, torus and switch against a
    reconfigurable fabric, every algorithm planned exactly, over ops x ranks x sizes x delays."""
    import numpy as np

    from lightrail.report.files import write_json, write_text
    from lightrail.report.plots import plot_speedup_heatmaps
    from lightrail.sim.collective_study import StudyGrid, collective_study

    op_list = [_kind(o).value for o in ops.split(",") if o.strip()]
    try:
        rank_list = [int(r) for r in ranks.split(",") if r.strip()]
    except ValueError:
        raise ScenarioError(f"{ranks!r} is not a list of rank counts", field="--ranks", fix="e.g. 8,64,1024") from None
    if not rank_list or min(rank_list) < 2:
        raise ScenarioError("rank counts must be 2 or more", field="--ranks", fix="e.g. 8,64,1024")
    if ports < 1:
        raise ScenarioError(f"{ports} ports", field="--ports", fix="use 1 or more")
    grid = StudyGrid(ops=tuple(op_list), ranks=tuple(rank_list), sizes=tuple(_sizes(sizes)),
                     delays=tuple(parse_time(d, field="--delays") for d in delays.split(",") if d.strip()),
                     ports=ports, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                     latency=parse_time(latency, field="--latency"), alpha=parse_time(alpha, field="--alpha"),
                     propagation=parse_time(propagation, field="--propagation"))
    progress, task = _progress(len(op_list) * len(rank_list), "collective study", as_json)
    with progress:
        result = collective_study(grid, progress=lambda name: progress.update(task, advance=1, description=name))
    tables = result.pop("_tables")
    for op in op_list:
        speedup = {}
        for n in rank_list:
            t = tables[(op, n)]
            best_ring = np.min(list(t["static"]["ring"].values()), axis=0)
            best_reconf = np.min([v[0] for v in t["reconfigurable"].values()], axis=0)
            speedup[n] = best_ring[None, :] / best_reconf
        plot_speedup_heatmaps(op, rank_list, grid.sizes, grid.delays, speedup, out_dir / f"heatmap-{op}.png",
                              title=f"{op}: reconfigurable ({ports} ports) vs the best algorithm on a static ring")
    lines = ["op,ranks,size_bytes,delay_s,static_ring,static_ring_s,static_torus,static_torus_s,switch,switch_s,"
             "reconfigurable,reconfigurable_s,reconfigurations,speedup_vs_static_ring,speedup_vs_best_static"]
    for c in result["cells"]:
        st, rc = c["best_static"], c["best_reconfigurable"]
        lines.append(",".join(str(x) for x in (
            c["op"], c["ranks"], int(c["size_bytes"]), c["delay_s"], st["ring"]["algorithm"],
            f"{st['ring']['time_s']:.6g}", st["torus"]["algorithm"], f"{st['torus']['time_s']:.6g}",
            st["switch"]["algorithm"], f"{st['switch']['time_s']:.6g}", rc["algorithm"], f"{rc['time_s']:.6g}",
            rc["reconfigurations"], f"{c['speedup_vs_static_ring']:.4g}", f"{c['speedup_vs_best_static']:.4g}")))
    write_text(out_dir / "summary.csv", "\n".join(lines) + "\n")
    write_json(out_dir / "study.json", result)
    if as_json:
        _print_json(result)
        return
    table = Table(title="reconfigurable vs static ring: best speedup per (op, ranks), and where")
    for col in ("op", "ranks", "max speedup", "at size", "at delay", "algorithm", "reconfigs"):
        table.add_column(col, justify="right" if col not in ("op", "algorithm") else "left")
    for op in op_list:
        for n in rank_list:
            mine = [c for c in result["cells"] if c["op"] == op and c["ranks"] == n]
            best = max(mine, key=lambda c: c["speedup_vs_static_ring"])
            rc = best["best_reconfigurable"]
            table.add_row(op, str(n), f"{best['speedup_vs_static_ring']:.2f}x", format_size(best["size_bytes"]),
                          format_time(best["delay_s"]) if best["delay_s"] else "0", rc["algorithm"],
                          str(rc["reconfigurations"]))
    out.print(table)
    for f in result["findings"]:
        if f["finding"].startswith("static ring"):
            out.print(f"n={f['ranks']:>5}: on a static ring, Ring AllReduce beats recursive doubling from "
                      f"{format_size(f['ring_wins_from_bytes']) if f['ring_wins_from_bytes'] else 'no size'} up"
                      f" (at the smallest size recursive doubling takes {f['ratio_rd_over_ring_at_smallest']:.2f}x"
                      f" Ring's time)")
        elif f["finding"].startswith("short-circuited"):
            reach = ", ".join(f"{format_time(float(d)) if float(d) else '0'}: "
                              f"{format_size(s) if s else 'none'}" for d, s in f["wins_up_to_size_by_delay"].items())
            out.print(f"n={f['ranks']:>5}: short-circuited recursive doubling beats Ring on the static ring up to "
                      f"(delay: size) {reach}; static recursive doubling only up to "
                      f"{format_size(f['static_wins_up_to_size']) if f['static_wins_up_to_size'] else 'none'}")
    out.print(f"wrote {out_dir / 'study.json'}, {out_dir / 'summary.csv'}, heat maps {out_dir}/heatmap-*.png")


stragglar_app = typer.Typer(no_args_is_help=True, help="StragglAR: AllReduce with a persistent straggler.")
app.add_typer(stragglar_app, name="stragglar")


def _rank_range(text: str) -> list[int]:
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            ranks = list(range(lo, hi + 1))
        else:
            ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ScenarioError(f"cannot read {text!r} as rank counts", field="--ranks",
                            fix="e.g. 8, 2..64 or 4,8,16") from None
    if not ranks or min(ranks) < 2:
        raise ScenarioError(f"{text!r}: rank counts must be 2 or more", field="--ranks", fix="e.g. 2..64")
    return ranks


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
    wanted = _rank_range(ranks)
    progress, task = _progress(len(wanted), "StragglAR rounds", as_json or len(wanted) < 32)
    with progress:
        for n in wanted:
            progress.update(task, description=f"StragglAR rounds, n={n}")
            # uncached: a long range would otherwise keep hundreds of large schedules in memory
            rows.append({"ranks": n, "rounds": phase2.__wrapped__(n).rounds, "lower_bound": lower_bound(n)})
            progress.advance(task)
    if as_json:
        _print_json(rows[0] if len(rows) == 1 else {"rows": rows})
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
    from lightrail.sim.collective import straggler_comparison

    fabric = _fabric(topology, ranks, bandwidth, latency, None, 8, f"{NVLINK_BANDWIDTH / 1e9:g}GBps", 32, 1.0)
    result = straggler_comparison(ranks, parse_size(size, field="--size"), parse_time(delay, field="--delay"), fabric,
                                  alpha=parse_time(alpha, field="--alpha"))
    if as_json:
        _print_json(result)
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

    from lightrail.runtime.straggler_run import METHODS, measure_straggler

    nbytes = parse_size(size, field="--size")
    delay_s = parse_time(delay, field="--delay")
    late = ranks - 1 if straggler is None else straggler
    busy = err.status(f"running {ranks} gloo processes") if err.is_terminal and not as_json else nullcontext()
    with busy:
        result = measure_straggler(ranks, int(nbytes), delay_s, late, repeats=repeats)
    if as_json:
        _print_json(result)
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
    from lightrail.fabric.builders import build_topology
    from lightrail.report.files import write_json
    from lightrail.report.plots import plot_straggler_speedups
    from lightrail.sim.collective import straggler_sweep

    # validate everything before computing or writing anything
    rank_list = sorted(set(_rank_range(ranks)))
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

    progress, task = _progress(len(names) * len(rank_list), "StragglAR sweep", as_json)
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
        _print_json(result)
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
    from lightrail.sim.photonic_rails import BREAKDOWN, delay_sweep

    values = [parse_time(d, field="--delays") for d in delays.split(",") if d.strip()]
    if not values:
        raise ScenarioError(f"{delays!r} lists no delay", field="--delays", fix=f"e.g. {DEFAULT_DELAYS}")
    built = _built(scenario)
    progress, task = _progress(4 * len(values), f"sweeping {built.scenario.name}", as_json)
    with progress:
        result = delay_sweep(built, values, progress=lambda name: progress.update(task, advance=1, description=name))
    plot_delay_sweep(result["rows"], out_dir / "overhead.png",
                     title=f"{built.scenario.name}: {built.job.layout}, overhead of photonic rails")
    write_json(out_dir / "sweep.json", result)
    if as_json:
        _print_json(result)
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
    mode = built.params.mode.replace("_", "-")
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
                          *(_signed_time(row["overhead_breakdown_s"][k]) for k, _ in parts),
                          end_section=policy == "lightrail" and d != values[-1])
    out.print(split)
    out.print(f"in brackets: reconfigurations per rail per iteration; electrical rails routed by "
              f"{result['routing'].upper()}; every row's overhead_breakdown_s is in the JSON", highlight=False)
    out.print(f"wrote {out_dir / 'sweep.json'}, {out_dir / 'overhead.png'}")


def _kind(op: str) -> Kind:
    from lightrail.collectives.registry import _parse_kind

    return _parse_kind(op)


@app.callback(invoke_without_command=True)
def _root(version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False):
    if version:
        out.print(f"lightrail {__version__}")
        raise typer.Exit()


@app.command("train-demo")
@friendly
def train_demo_cmd(
    ranks: Annotated[int | None, typer.Option("--ranks", "-n", help="Processes (= tp * pp * dp).")] = 8,
    tp: Annotated[int, typer.Option("--tp", help="Tensor parallel degree (inside a server).")] = 2,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 2,
    dp: Annotated[int, typer.Option("--dp", help="Data parallel degree.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Training steps per run.")] = 20,
    ocs_delay: Annotated[str, typer.Option("--ocs-delay", help="Emulated OCS reconfiguration delay.")] = "10ms",
    mode: Annotated[str, typer.Option("--mode", help="on_demand or provisioned.")] = "provisioned",
    gpus_per_server: Annotated[int | None, typer.Option("--gpus-per-server",
                                                        help="Ranks per server = rails (default: --tp).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for train-demo.json and iterations.png.")]
    = Path("out/train-demo"),
    as_json: JsonOut = False,
):
    """Train a small GPT (TP x PP x DP, CPU processes) on plain gloo and on emulated photonic rails
    (the lightrail backend + a controller process); compare, and set beside `simulate`'s prediction
    for the same job (GPipe, compute calibrated on the gloo run). LIGHTRAIL_LEASES=0 turns leases off."""
    from lightrail.report.files import write_json
    from lightrail.report.plots import plot_train_demo
    from lightrail.runtime.photonic_demo import run_photonic_demo
    from lightrail.runtime.train_demo import DemoConfig

    config = DemoConfig(tp=tp, pp=pp, dp=dp, steps=steps, ranks=ranks)
    delay = parse_time(ocs_delay, field="--ocs-delay")
    progress, task = _progress(2, "train-demo", as_json)
    with progress:
        result = run_photonic_demo(config, ocs_delay_s=delay, mode=mode, gpus_per_server=gpus_per_server,
                                   progress=lambda what: progress.update(task, advance=1, description=what))
    write_json(out_dir / "train-demo.json", result)
    plot_train_demo(result, out_dir / "iterations.png",
                    title=f"{config.world} ranks TP{tp} PP{pp} DP{dp}, OCS {ocs_delay}, {mode}")
    if as_json:
        _print_json(result)
    else:
        p = result["predicted"]
        table = Table(title=f"train-demo: {config.world} CPU ranks (TP{tp} PP{pp} DP{dp}), {result['rails']} rails, "
                            f"OCS {ocs_delay}, {mode}")
        for col in ("", "gloo", "lightrail backend", "simulate (same job)"):
            table.add_column(col, justify="right" if col else "left")
        table.add_row("iteration (median)", format_time(result["gloo_iteration_s"]),
                      format_time(result["lightrail_iteration_s"]), format_time(p["iteration_s"]))
        table.add_row("overhead per iteration", "", f"{format_time(result['overhead_s'])} "
                      f"({result['overhead'] * 100:+.1f}%)", format_time(p["overhead_s"]))
        table.add_row("reconfigurations / rail / iteration", "",
                      f"{result['reconfigurations_per_rail_per_iteration']:.1f}",
                      f"{p['reconfigurations_per_rail_per_iteration']:.1f}")
        trips = p.get("controller_round_trips_per_iteration")
        table.add_row("controller requests / rank / iteration", "",
                      f"{result['controller_requests_per_iteration']:.1f}", "" if trips is None else f"{trips:.1f}")
        ratio = result["model_to_measured_ratio"]
        out.print(table)
        lat = result["request_latency_p99_s"]
        out.print(f"measured / predicted overhead: {'n/a' if ratio is None else f'{ratio:.2f}x'} (model computes at "
                  f"this CPU's rate, {p['peak_tflops'] * 1e3:.2f} GFLOP/s peak, measured on gloo); leases "
                  f"{'on' if result['leases'] else 'off'}")
        out.print(f"controller request latency p99 {format_time(lat) if lat else 'n/a'}; losses identical: "
                  f"{'yes' if result['losses_identical'] else 'NO'}; unsafe reconfigurations: "
                  f"{int(result['unsafe_reconfigurations'])}")
        out.print(f"measurement: {result['measurement']}", highlight=False)
        out.print(f"wrote {out_dir / 'train-demo.json'}, {out_dir / 'iterations.png'}")
    if not result["losses_identical"]:
        raise typer.Exit(1)


controller_app = typer.Typer(no_args_is_help=True, help="The control plane: OCS controller service.")
app.add_typer(controller_app, name="controller")


@controller_app.command("serve")
@friendly
def controller_serve_cmd(
    config: Annotated[Path | None, typer.Option("--config", help="YAML/JSON controller config (devices, ports). "
                                                "Default: one emulated OCS per rail.")] = None,
    state: Annotated[Path, typer.Option("--state", help="SQLite file holding circuits and port owners.")]
    = Path("lightrail-controller.db"),
    port: Annotated[int | None, typer.Option("--port", help="Rank protocol port (0: any free port).")] = None,
    admin_port: Annotated[int | None, typer.Option("--admin-port", help="HTTP admin API port (0: any free).")] = None,
    rails: Annotated[int, typer.Option("--rails", help="Without --config: emulated OCS devices rail0..")] = 8,
    ports: Annotated[int, typer.Option("--ports", help="Without --config: ports per OCS.")] = 64,
    delay: Annotated[str, typer.Option("--delay", help="Without --config: reconfiguration delay.")] = "10ms",
):
    """Run the controller: circuit state and port ownership in SQLite (WAL), the rank protocol on
    --port, the admin API (/state, /jobs, /metrics) on --admin-port. Prints one JSON `ready` line."""
    from lightrail.runtime.controller.config import default_config, load_config
    from lightrail.runtime.controller.server import serve

    if config is not None:
        cfg = load_config(config)
    else:
        if rails < 1 or ports < 1:
            raise ScenarioError("must be at least 1", field="--rails" if rails < 1 else "--ports")
        cfg = default_config(rails=rails, ports=ports, delay=parse_time(delay, field="--delay"))
    overrides = {k: v for k, v in (("port", port), ("admin_port", admin_port)) if v is not None}
    for flag, v in overrides.items():
        if not 0 <= v <= 65535:
            raise ScenarioError(f"{v} is not a TCP port", field=f"--{flag.replace('_', '-')}", fix="use 0..65535")
    try:
        serve(cfg.model_copy(update=overrides), str(state))
    except OSError as e:
        raise ScenarioError(f"cannot listen: {e}", field="--port", fix="pick free ports or 0") from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
