"""``lightrail study collectives``: when does reconfiguring the fabric per step pay?"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, friendly, out
from lightrail.cli.options import (
    ALPHA_DEFAULT,
    LATENCY_DEFAULT,
    MAX_SWEEP_POINTS,
    NIC_DEFAULT,
    Alpha,
    Bandwidth,
    FigureFormat,
    HtmlOut,
    JsonOut,
    Latency,
    OcsDelays,
    Ports,
    Propagation,
    Sizes,
    check_collective_size,
    check_count,
    check_out,
    figure_suffix,
    old_spelling,
    parse_kinds,
    parse_rank_range,
    parse_sizes,
    parse_times,
    renamed,
)
from lightrail.cli.output import html_report, print_json, progress_bar, progress_steps, writes_files
from lightrail.errors import LightrailError, ScenarioError
from lightrail.units import parse_rate, parse_time

STUDY_WORK = 2**26
"""Most work of a collective study, as ops x the sum of n² over its rank counts (algorithms without a compressed
form hold ~n² transfers): the default grid (4 ops, 8..1,024 ranks) is 2^22.5."""
MAX_GRID = 100_000
"""Most sizes x OCS delays of a collective study (the default is 23 x 6)."""
MAX_RACKS = 10_000
"""Most racks of a scale-up study: 640,000 accelerators, 100x the default."""
MAX_REQUESTS = 1_000_000
"""Most slice requests of a scale-up study, 100x the default."""
MAX_SCALEUP_WORK = 10**8
"""Most racks x requests (each request scans the racks): 100x the default study."""
MIN_MTBF_HOURS = 0.01
"""Shortest accelerator MTBF read (36 s; real ones are ~50,000 h): shorter ones overflow the failure draws."""
MAX_TRACE_BYTES = 1 << 30
"""Largest trace file read (CSV): 1 GiB."""
MAX_CLIENTS = 1_000_000
"""Most emulated clients of an FL study, 100x the default."""
MAX_JOBS = 10_000
"""Most jobs of an FL study, 500x the default."""
MAX_MATRICES = 10_000
"""Most traffic matrices per point of a TE study (each is a solve of every slice controller)."""


def _check_study_size(kinds, ranks: list[int], sizes: list[float], delays: list[float], ports: int) -> None:
    """Refuse a collective study this machine cannot hold or finish, before any of it runs."""
    from lightrail.collectives import algorithms

    check_count(len(sizes) * len(delays), field="--sizes", hi=MAX_GRID, what="sizes x delays")
    check_count(ports, field="--ports-per-gpu", hi=max(ranks), what="optical ports per GPU")
    for kind in kinds:
        for algorithm in algorithms(kind):
            check_collective_size(kind, algorithm.name, max(ranks))
    work = len(kinds) * sum(n * n for n in ranks)
    if work > STUDY_WORK:
        raise ScenarioError(f"{len(kinds)} ops x {len(ranks):,} rank counts up to {max(ranks):,} is over the study's "
                            f"bound (ops x sum of n² = {work:.3g} > {STUDY_WORK:,})", field="--ranks",
                            fix="ask for fewer or smaller rank counts, e.g. 8,16,32,64,128,256,1024")


study_app = LeanTyper(no_args_is_help=True, help="Studies over grids of cases.")
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
    fmt: FigureFormat = "png",
    html: HtmlOut = False,
    as_json: JsonOut = False,
):
    """When does reconfiguring the fabric per step pay? Static ring, torus and switch against a
    reconfigurable fabric, every algorithm planned exactly, over ops x ranks x sizes x delays."""
    from lightrail.report.collective_study import print_study, write_study
    from lightrail.studies.collective_study import StudyGrid, collective_study

    check_out(out_dir if writes_files(as_json, html) else None)
    fmt = figure_suffix(fmt)
    delays = renamed(ocs_delays, old_delays, old="--delays", new="--ocs-delays")
    kinds, rank_list = parse_kinds(ops), parse_rank_range(ranks)
    size_list, delay_list = parse_sizes(sizes), parse_times(delays, "--ocs-delays")
    _check_study_size(kinds, rank_list, size_list, delay_list, ports)
    grid = StudyGrid(ops=tuple(k.value for k in kinds), ranks=tuple(rank_list),
                     sizes=tuple(size_list), delays=tuple(delay_list),
                     ports=ports, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                     latency=parse_time(latency, field="--latency"), alpha=parse_time(alpha, field="--alpha"),
                     propagation=parse_time(propagation, field="--propagation"))
    with progress_steps(len(grid.ops) * len(grid.ranks), "collective study", as_json) as step:
        result = collective_study(grid, progress=step)
    if writes_files(as_json, html):
        write_study(result, out_dir, fmt=fmt)
        html_report(out_dir, html, quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, out_dir, fmt=fmt)


@study_app.command("scaleup")
@friendly
def study_scaleup_cmd(
    racks: Annotated[int, typer.Option("--racks", help="Racks of 64 accelerators (4x4x4 torus) each.")] = 100,
    requests: Annotated[int, typer.Option("--requests", help="Slice requests to replay (ignored with --trace).")]
    = 10_000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the request stream and the failures.")] = 0,
    load: Annotated[float, typer.Option("--load", help="Offered load, a fraction of the accelerators.")] = 0.9,
    mtbf_hours: Annotated[float, typer.Option("--mtbf-hours", help="Mean time between failures of one "
                                              "accelerator, hours (inf: no failures).")] = 50_000.0,
    spare_servers: Annotated[str, typer.Option("--spare-servers", help="Spare servers per rack, outside the torus "
                                               "(Morphlux: 2 per 64 accelerators); a list such as 0,1,2,4 "
                                               "sweeps them and adds rows.")] = "2",
    trace: Annotated[Path | None, typer.Option("--trace", help="CSV of requests: arrival_s,size,duration_s[,shape] "
                                               "(shape like 4x4x2), or Alibaba's openb_pod_list CSV.",
                                               show_default=False)] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the study's JSON, CSV summary and plot.")]
    = Path("out/study-scaleup"),
    fmt: FigureFormat = "png",
    html: HtmlOut = False,
    as_json: JsonOut = False,
):
    """Slices on scale-up racks: contiguous sub-torus boxes on an electrical torus against any free servers
    joined by photonic circuits, for counts and torus shapes; acceptance, fragmentation over time, bandwidth,
    AllReduce time, failure recovery and how much of it spares cover."""
    from dataclasses import replace

    from lightrail.errors import ScenarioError
    from lightrail.fabric.scaleup import RackSpec
    from lightrail.report.scaleup import print_study, write_study
    from lightrail.studies.scaleup import ScaleupParams, parse_trace, spare_sweep
    from lightrail.validation import read_bounded

    fmt = figure_suffix(fmt)
    check_out(out_dir if writes_files(as_json, html) else None)
    if not mtbf_hours >= MIN_MTBF_HOURS:
        raise ScenarioError(f"{mtbf_hours} hours", field="--mtbf-hours",
                            fix=f"use {MIN_MTBF_HOURS} hours or more, or inf (no failures)")
    check_count(racks, field="--racks", hi=MAX_RACKS, what="racks")
    if not 1e-6 <= load <= 100:  # a vanishing load divides the arrival rate by zero
        raise ScenarioError(f"load {load}", field="--load",
                            fix="a fraction of the accelerators in [1e-06, 100], e.g. 0.9")
    spares = _spare_list(spare_servers, RackSpec())
    requests_given = None
    if trace is not None:
        text = read_bounded(trace, field="--trace", what="a CSV file with the header arrival_s,size,duration_s",
                            limit=MAX_TRACE_BYTES)
        requests_given = parse_trace(text)
        requests = len(requests_given)
    check_count(requests, field="--trace" if trace is not None else "--requests", hi=MAX_REQUESTS,
                what="requests")
    if racks * requests * len(spares) > MAX_SCALEUP_WORK:
        raise ScenarioError(f"{racks:,} racks x {requests:,} requests x {len(spares)} spare counts is over the bound "
                            f"of {MAX_SCALEUP_WORK:,} (each request scans the racks)", field="--requests",
                            fix=f"use at most {MAX_SCALEUP_WORK // (racks * len(spares)):,} requests on {racks:,} "
                            "racks")
    params = ScaleupParams(racks=racks, requests=requests, seed=seed, load=load, mtbf_s=mtbf_hours * 3600.0,
                           spec=RackSpec(spare_servers=spares[0]))
    phases: dict[str, int] = {}
    progress, task = progress_bar((1 + len(spares)) * params.requests, "scale-up study", as_json)

    def advance(phase: str, done: int) -> None:
        phases[phase] = done
        progress.update(task, completed=sum(phases.values()), description=f"scale-up: {phase}")

    with progress:
        result = spare_sweep(params, spares, requests=requests_given, trace=str(trace) if trace else None,
                             progress=advance)
    if len(spares) == 1:
        result = replace(result, rows=None)  # one value is a run, not a sweep
    files = write_study(result, out_dir, fmt=fmt) if writes_files(as_json, html) else []
    html_report(out_dir if files else None, html, quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, files)


def _spare_list(text: str, spec) -> list[int]:
    """``--spare-servers``: one count or a comma-separated list, each 0..(32 - torus servers), no repeats."""
    from lightrail.errors import ScenarioError

    hi = 32 - spec.servers  # a rack's servers are one 32-bit mask (fabric/scaleup.py)
    fix = f"whole numbers in 0..{hi}, e.g. 2 or 0,1,2,4"
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ScenarioError(f"cannot read {text!r}", field="--spare-servers", fix=fix) from None
    if not values or len(set(values)) != len(values):
        raise ScenarioError(f"{text!r}", field="--spare-servers", fix=fix + ", each once")
    for v in values:
        check_count(v, field="--spare-servers", lo=0, hi=hi, what="spare servers per rack")
    check_count(len(values), field="--spare-servers", hi=MAX_SWEEP_POINTS, what="values")
    return values


@study_app.command("te")
@friendly
def study_te_cmd(
    topologies: Annotated[str, typer.Option("--topologies", help="Topologies, comma-separated (geant, abilene, "
                                            "tatanld, a topohub key or a .json file).")] = "geant,abilene",
    lambdas: Annotated[str, typer.Option("--lambdas", help="Regularizer weights to sweep, comma-separated.")]
    = "0.0001,0.001,0.01,0.1",
    perturbations: Annotated[str, typer.Option("--perturbations", help="Demand errors to sweep, comma-separated.")]
    = "0.02,0.05,0.1",
    slice_counts: Annotated[str, typer.Option("--slice-counts", help="Slice counts to sweep, comma-separated.")]
    = "2,5,8",
    matrices: Annotated[int, typer.Option("--matrices", help="Traffic matrices per point.")] = 20,
    objective: Annotated[str, typer.Option("--objective", help="max-flow, max-concurrent or min-mlu.")]
    = "max-flow",
    load: Annotated[float, typer.Option("--load", help="Generated traffic's best max link utilization.")] = 0.9,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the traffic, views and randomized slicer.")] = 0,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the study's JSON, CSV and plots.")]
    = Path("out/study-te"),
    fmt: FigureFormat = "png",
    html: HtmlOut = False,
    as_json: JsonOut = False,
):
    """Decentralized WAN TE (Symphony): overload of regularized vs unregularized slice controllers and blast
    radius of each slicer, one factor at a time around 5 slices, lambda 0.001 and +-5% views."""
    from lightrail.cli.te import DEFAULT_LAMBDA, check_lambda, te_setup
    from lightrail.errors import ScenarioError
    from lightrail.report.te import print_study, write_study
    from lightrail.studies.te import sweep_setups, sweep_te

    def floats(text: str, flag: str) -> tuple[float, ...]:
        try:
            values = tuple(float(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise ScenarioError(f"cannot read {text!r}", field=flag, fix="numbers separated by commas") from None
        if not values:
            raise ScenarioError("no values", field=flag, fix="give at least one number")
        if not all(math.isfinite(v) for v in values):
            raise ScenarioError(f"{text!r} holds a non-finite number", field=flag, fix="finite numbers only")
        check_count(len(values), field=flag, hi=MAX_SWEEP_POINTS, what="values")
        return values

    fmt = figure_suffix(fmt)
    check_out(out_dir if writes_files(as_json, html) else None)
    check_count(matrices, field="--matrices", hi=MAX_MATRICES, what="traffic matrices")
    names = tuple(t.strip() for t in topologies.split(",") if t.strip())
    if not names:
        raise ScenarioError("no topology", field="--topologies", fix="e.g. geant,abilene")
    counts = floats(slice_counts, "--slice-counts")
    if any(c != int(c) or c < 1 for c in counts):
        raise ScenarioError(f"{slice_counts!r}", field="--slice-counts", fix="whole numbers >= 1, e.g. 2,5,8")
    for lam in floats(lambdas, "--lambdas"):
        check_lambda(lam, "--lambdas")
    sweep = {"topology": names, "lam": floats(lambdas, "--lambdas"),
             "perturbation": floats(perturbations, "--perturbations"), "slices": tuple(int(c) for c in counts)}
    base = te_setup(topology=names[0], slices=5, lam=DEFAULT_LAMBDA, perturbation=0.05, objective=objective,
                    paths=4, load=load, seed=seed, matrices=matrices)
    setups = sweep_setups(base, sweep)
    swept = {"--lambda": "--lambdas", "--perturbation": "--perturbations", "--slices": "--slice-counts",
             "--topology": "--topologies"}  # a setup's errors name te run's flags; here the lists set them
    try:
        for s in setups:
            s.check()
        from lightrail.te.inputs import load_topology
        from lightrail.te.slicing import check_slices

        for name in names:  # every topology with the most slices, before any solve
            check_slices(load_topology(name).n, max(sweep["slices"]))
    except LightrailError as e:
        e.field = swept.get(e.field, e.field)
        raise
    total = sum(s.matrices for s in setups)
    progress, task = progress_bar(total, "te study", as_json)
    with progress:
        result = sweep_te(base, sweep, progress=lambda done, _total: progress.update(task, completed=done))
    files = write_study(result, out_dir, fmt=fmt) if writes_files(as_json, html) else []
    html_report(out_dir if files else None, html, quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, files)


def _fl_time(text: str | None, flag: str, example: str) -> float | None:
    """A positive duration from a flag of ``study fl`` (``400s``, ``30d``); None when not given."""
    if text is None:
        return None
    from lightrail.fl.population import DAY

    t = text.strip().lower()
    scale = {"d": DAY, "h": 3600.0}.get(t[-1:]) if t[-2:-1].isdigit() or t[-2:-1] == "." else None
    try:
        seconds = float(t[:-1]) * scale if scale else parse_time(t, field=flag)
    except ValueError:
        raise ScenarioError(f"cannot read {text!r}", field=flag, fix=f"a time with a unit, e.g. {example}") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ScenarioError(f"{text!r} is not a positive time", field=flag, fix=f"a positive time, e.g. {example}")
    return seconds


@study_app.command("fl")
@friendly
def study_fl_cmd(
    clients: Annotated[int, typer.Option("--clients", help="Emulated edge clients (synthetic population).")]
    = 10_000,
    jobs: Annotated[int, typer.Option("--jobs", help="Collaborative-ML jobs (synthetic population).")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the population and the check-ins.")] = 0,
    clients_trace: Annotated[Path | None, typer.Option(
        "--clients-trace", help="CSV of clients: client_id,cpu_ghz,memory_gb,os,speed[,fp16_mem] (os may carry its "
        "version: android13; replaces --clients).", show_default=False)] = None,
    availability_trace: Annotated[Path | None, typer.Option(
        "--availability-trace", help="CSV of online sessions: client_id,start_s,end_s (needs --clients-trace).",
        show_default=False)] = None,
    jobs_trace: Annotated[Path | None, typer.Option(
        "--jobs-trace", help="CSV of jobs: arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work[,min_fp16_mem] "
        "(os e.g. android>=7|ios; replaces --jobs).", show_default=False)] = None,
    over_selection: Annotated[float, typer.Option(
        "--over-selection", help="Clients bound per round, a multiple of its demand (ceil; Propius, FedScale: "
        "1.3); a round ends at demand results, later ones are late.")] = 1.3,
    round_timeout: Annotated[str | None, typer.Option(
        "--round-timeout", help="A round not complete this long after it opened fails and runs again, e.g. 400s "
        "(default: none).", show_default=False)] = None,
    horizon: Annotated[str | None, typer.Option(
        "--horizon", help="Stop here at the latest, e.g. 30d (default: when every job is done, capped at 30d).",
        show_default=False)] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the study's JSON, CSV and plot.")]
    = Path("out/study-fl"),
    fmt: FigureFormat = "png",
    html: HtmlOut = False,
    as_json: JsonOut = False,
):
    """Multi-tenant scheduling of collaborative ML (Propius): edge clients checking in, jobs with client
    requirements, rounds with over-selection and a timeout, under fifo, random, srsf, irs and static; utilization,
    bindings/s, mean JCT, jobs done, late results, double bookings."""
    import dataclasses

    import numpy as np

    from lightrail.errors import ScenarioError
    from lightrail.fl.policies import POLICIES
    from lightrail.fl.population import (
        parse_availability,
        parse_clients,
        parse_jobs,
        synthetic_clients,
        synthetic_jobs,
        trace_population,
    )
    from lightrail.report.fl import print_study, write_study
    from lightrail.studies.fl import FlParams, fl_study

    def read(path: Path, flag: str, header: str) -> str:
        from lightrail.validation import read_bounded

        return read_bounded(path, field=flag, what=f"a CSV file with the header {header}", limit=MAX_TRACE_BYTES)

    fmt = figure_suffix(fmt)
    check_out(out_dir if writes_files(as_json, html) else None)
    check_count(clients, field="--clients", hi=MAX_CLIENTS, what="clients")
    check_count(jobs, field="--jobs", hi=MAX_JOBS, what="jobs")
    horizon_s = _fl_time(horizon, "--horizon", "30d")
    if not (math.isfinite(over_selection) and 1 <= over_selection <= 100):
        raise ScenarioError(f"{over_selection:g}", field="--over-selection",
                            fix="a multiple of demand from 1 (none) to 100, e.g. 1.3")
    params = FlParams(clients=clients, jobs=jobs, seed=seed, horizon_s=horizon_s, over_selection=over_selection,
                      round_timeout_s=_fl_time(round_timeout, "--round-timeout", "400s"))
    if availability_trace is not None and clients_trace is None:
        raise ScenarioError("an availability trace names clients of a clients trace", field="--availability-trace",
                            fix="give --clients-trace too")
    population = None
    if clients_trace is not None or jobs_trace is not None:
        rng = np.random.default_rng([seed, 0xF1])
        if clients_trace is not None:
            cl, ids = parse_clients(read(clients_trace, "--clients-trace", "client_id,cpu_ghz,memory_gb,os,speed"),
                                    name=clients_trace.name)
        else:
            cl = synthetic_clients(clients, rng)
            ids = tuple(f"c{i}" for i in range(clients))
        sessions = None
        if availability_trace is not None:
            sessions = parse_availability(read(availability_trace, "--availability-trace",
                                               "client_id,start_s,end_s"), ids, name=availability_trace.name)
        if jobs_trace is not None:
            jb = parse_jobs(read(jobs_trace, "--jobs-trace",
                                 "arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work"), name=jobs_trace.name)
        else:
            jb = synthetic_jobs(jobs, cl, rng)
        source = ", ".join(f"{flag} {p.name}" for flag, p in (("clients", clients_trace),
                                                                ("availability", availability_trace),
                                                                ("jobs", jobs_trace)) if p is not None)
        population = trace_population(cl, ids, jb, sessions, seed=seed, source=source, horizon_s=params.horizon)
        params = dataclasses.replace(params, clients=len(population.clients), jobs=len(population.jobs))
    with progress_steps(len(POLICIES), "fl study", as_json) as step:
        result = fl_study(params, POLICIES, population=population, progress=step)
    files = write_study(result, out_dir, fmt=fmt) if writes_files(as_json, html) else []
    html_report(out_dir if files else None, html, quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, files)
