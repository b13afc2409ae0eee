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
    progress_steps,
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
    with progress_steps(len(grid.ops) * len(grid.ranks), "collective study", as_json) as step:
        result = collective_study(grid, progress=step)
    write_study(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, out_dir)


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
    spare_servers: Annotated[int, typer.Option("--spare-servers", help="Spare servers per rack, outside the torus "
                                               "(Morphlux: 2 per 64 accelerators).")] = 2,
    trace: Annotated[Path | None, typer.Option("--trace", help="CSV of requests: arrival_s,size,duration_s.",
                                               show_default=False)] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the study's JSON, CSV summary and plot.")]
    = Path("out/study-scaleup"),
    as_json: JsonOut = False,
):
    """Slices on scale-up racks: contiguous TPU-style blocks on an electrical torus against any free servers
    joined by photonic circuits; acceptance, fragmentation, bandwidth, AllReduce time and failure recovery."""
    from lightrail.errors import ScenarioError
    from lightrail.fabric.scaleup import RackSpec
    from lightrail.report.scaleup import print_study, write_study
    from lightrail.studies.scaleup import ScaleupParams, parse_trace, scaleup_study

    if mtbf_hours <= 0:
        raise ScenarioError(f"{mtbf_hours} hours", field="--mtbf-hours", fix="use a positive number, or inf")
    requests_given = None
    if trace is not None:
        try:
            text = trace.read_text()
        except OSError as e:
            raise ScenarioError(f"cannot read {str(trace)!r}: {e.strerror}", field="--trace",
                                fix="give a CSV file with the header arrival_s,size,duration_s") from None
        requests_given = parse_trace(text)
        requests = len(requests_given)
    params = ScaleupParams(racks=racks, requests=requests, seed=seed, load=load, mtbf_s=mtbf_hours * 3600.0,
                           spec=RackSpec(spare_servers=spare_servers))
    progress, task = progress_bar(2 * params.requests, "scale-up study", as_json)
    with progress:
        result = scaleup_study(params, requests=requests_given, trace=str(trace) if trace else None,
                               progress=lambda fab, done: progress.update(
                                   task, completed=done + (params.requests if fab == "photonic" else 0),
                                   description=f"scale-up: {fab}"))
    files = write_study(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, files)


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
    as_json: JsonOut = False,
):
    """Decentralized WAN TE (Symphony): overload of regularized vs unregularized slice controllers and blast
    radius of each slicer, one factor at a time around 5 slices, lambda 0.001 and +-5% views."""
    from lightrail.cli.te import DEFAULT_LAMBDA, te_setup
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
        return values

    names = tuple(t.strip() for t in topologies.split(",") if t.strip())
    if not names:
        raise ScenarioError("no topology", field="--topologies", fix="e.g. geant,abilene")
    counts = floats(slice_counts, "--slice-counts")
    if any(c != int(c) or c < 1 for c in counts):
        raise ScenarioError(f"{slice_counts!r}", field="--slice-counts", fix="whole numbers >= 1, e.g. 2,5,8")
    sweep = {"topology": names, "lam": floats(lambdas, "--lambdas"),
             "perturbation": floats(perturbations, "--perturbations"), "slices": tuple(int(c) for c in counts)}
    base = te_setup(topology=names[0], slices=5, lam=DEFAULT_LAMBDA, perturbation=0.05, objective=objective,
                    paths=4, load=load, seed=seed, matrices=matrices)
    setups = sweep_setups(base, sweep)
    for s in setups:
        s.check()
    total = sum(s.matrices for s in setups)
    progress, task = progress_bar(total, "te study", as_json)
    with progress:
        result = sweep_te(base, sweep, progress=lambda done, _total: progress.update(task, completed=done))
    files = write_study(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, files)


@study_app.command("fl")
@friendly
def study_fl_cmd(
    clients: Annotated[int, typer.Option("--clients", help="Emulated edge clients (synthetic population).")]
    = 10_000,
    jobs: Annotated[int, typer.Option("--jobs", help="Collaborative-ML jobs (synthetic population).")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the population and the check-ins.")] = 0,
    clients_trace: Annotated[Path | None, typer.Option(
        "--clients-trace", help="CSV of clients: client_id,cpu_ghz,memory_gb,os,speed (replaces --clients).",
        show_default=False)] = None,
    availability_trace: Annotated[Path | None, typer.Option(
        "--availability-trace", help="CSV of online sessions: client_id,start_s,end_s (needs --clients-trace).",
        show_default=False)] = None,
    jobs_trace: Annotated[Path | None, typer.Option(
        "--jobs-trace", help="CSV of jobs: arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work "
        "(replaces --jobs).", show_default=False)] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the study's JSON, CSV and plot.")]
    = Path("out/study-fl"),
    as_json: JsonOut = False,
):
    """Multi-tenant scheduling of collaborative ML (Propius): edge clients checking in, jobs with client
    requirements, under fifo, random, srsf, irs and static; utilization, bindings/s, mean JCT, double bookings."""
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
        try:
            return path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise ScenarioError(f"cannot read {str(path)!r}: {getattr(e, 'strerror', None) or e}", field=flag,
                                fix=f"give a CSV file with the header {header}") from None

    if clients < 1:
        raise ScenarioError(f"{clients}", field="--clients", fix="use 1 or more")
    if jobs < 1:
        raise ScenarioError(f"{jobs}", field="--jobs", fix="use 1 or more")
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
        population = trace_population(cl, ids, jb, sessions, seed=seed, source=source)
    params = FlParams(clients=len(population.clients) if population else clients,
                      jobs=len(population.jobs) if population else jobs, seed=seed)
    with progress_steps(len(POLICIES), "fl study", as_json) as step:
        result = fl_study(params, POLICIES, population=population, progress=step)
    files = write_study(result, out_dir)
    if as_json:
        print_json(result.to_dict())
    else:
        print_study(result, out, files)
