"""``lightrail fl serve`` and ``lightrail fl demo``: the federated-learning control plane (Propius) as real
processes on loopback, its state in an embedded PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, err, friendly, out
from lightrail.cli.options import JsonOut, check_count, check_out, result_out
from lightrail.cli.output import print_json, save_result
from lightrail.errors import ScenarioError

fl_app = LeanTyper(no_args_is_help=True, help="Federated / collaborative ML resource manager (Propius).")
app.add_typer(fl_app, name="fl")

MAX_SERVICES = 16
"""Most client managers or parameter-server leaves (one process each) started on one machine."""
MAX_CLIENTS = 100_000
"""Most emulated clients of the demo (each checks in over HTTP: 200x the default)."""
MAX_JOBS = 1_000
MAX_ROUNDS = 1_000
MAX_CONCURRENCY = 512
"""Most clients checking in at once: each holds a connection, and a process has 1,024 descriptors by default."""
MAX_MODEL_DIM = 10_000_000
"""Longest model vector (80 MB in float64 per copy; the leaves and the root each hold several)."""
MAX_TIME_SCALE = 1.0


def _check_services(client_managers: int, leaves: int) -> None:
    check_count(client_managers, field="--client-managers", hi=MAX_SERVICES, what="client managers")
    check_count(leaves, field="--leaves", lo=0, hi=MAX_SERVICES, what="leaves")


PolicyOpt = Annotated[str, typer.Option("--policy", help="Job order: fifo, random, srsf, irs, static.")]


@fl_app.command("serve")
@friendly
def fl_serve_cmd(
    policy: PolicyOpt = "irs",
    client_managers: Annotated[int, typer.Option("--client-managers", help="Client manager processes.")] = 2,
    leaves: Annotated[int, typer.Option("--leaves", help="Parameter-server leaves (0: no parameter servers).")] = 2,
    data: Annotated[Path | None, typer.Option("--data", help="PostgreSQL data directory (kept; default: a "
                                              "temporary one, deleted at exit).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of the random policy.")] = None,
    leaf_flush_interval_ms: Annotated[float | None, typer.Option(
        "--leaf-flush-interval-ms", help="Leaves forward pending results this often (0: only on POST /flush; "
        "default: the leaf's own, 1000).")] = None,
):
    """Run the control plane in the foreground: PostgreSQL, job manager, scheduler, client managers, load balancer
    and parameter servers. Prints one JSON `ready` line, then JSON log lines on stderr; a service that dies is
    replaced (a leaf with the same --state directory, so its acknowledged results survive); Ctrl-C / SIGTERM
    stops everything."""
    from lightrail.fl.serve import Supervisor

    _check_services(client_managers, leaves)
    if data is not None:
        check_out(data, field="--data")
    if leaf_flush_interval_ms is not None and not 0 <= leaf_flush_interval_ms <= 3_600_000:
        raise ScenarioError(f"{leaf_flush_interval_ms} ms", field="--leaf-flush-interval-ms",
                            fix="use 0 (only on POST /flush) up to an hour, 3600000")
    Supervisor(policy=policy, client_managers=client_managers, leaves=leaves, data=data, seed=seed,
               leaf_flush_interval_ms=leaf_flush_interval_ms).run()


@fl_app.command("demo")
@friendly
def fl_demo_cmd(
    clients: Annotated[int, typer.Option("--clients", help="Emulated clients.")] = 500,
    jobs: Annotated[int, typer.Option("--jobs", help="Synthetic jobs.")] = 4,
    policy: PolicyOpt = "irs",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the synthetic population.")] = 0,
    rounds: Annotated[int, typer.Option("--rounds", help="Cap on each job's rounds.")] = 3,
    client_managers: Annotated[int, typer.Option("--client-managers", help="Client manager processes.")] = 2,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Clients checking in at once.")] = 50,
    time_scale: Annotated[float, typer.Option("--time-scale", help="Seconds of emulated training per second "
                                              "of a client's work / speed (0: instant).")] = 0.0001,
    leaves: Annotated[int, typer.Option("--leaves", help="Parameter-server leaves (0: control plane only, no "
                                        "model traffic).")] = 2,
    model_dim: Annotated[int, typer.Option("--model-dim", help="Length of each job's model vector.")] = 64,
    kill_leaf_at_round: Annotated[int | None, typer.Option(
        "--kill-leaf-at-round", help="SIGKILL leaf 0 once it acknowledged a result of this round (0-based); the "
        "supervisor replaces it and the demo carries on.")] = None,
    over_selection: Annotated[float | None, typer.Option(
        "--over-selection", help="Clients bound per round, a multiple of demand (default 1.3; a round ends at demand "
        "results, and late clients never upload their update).", show_default=False)] = None,
    round_timeout: Annotated[str | None, typer.Option(
        "--round-timeout", help="A round not complete this long after it opened fails and runs again, e.g. 5s.",
        show_default=False)] = None,
    kill: Annotated[str | None, typer.Option(
        "--kill", help="SIGKILL this process of fl serve mid-run (with --kill-at-round): job_manager, load_balancer, "
        "scheduler, client_manager, leaf, postgres, postgres_backend; it is replaced at the same address.",
        show_default=False)] = None,
    kill_at_round: Annotated[int | None, typer.Option(
        "--kill-at-round", help="Round (0-based) whose first accepted result triggers --kill.",
        show_default=False)] = None,
    out_dir: Annotated[Path | None, result_out("fl-demo.json")] = None,
    json_out: JsonOut = False,
):
    """Start the control plane and parameter servers, emulate clients checking in through the load balancer and
    running real federated rounds through the leaves (model download, update, pre-aggregation) until every job ran
    all its rounds; report bindings/s, rounds, per-job completion, double bookings (from the DB), root downloads
    vs. client model requests and whether each job's final model is exactly FedAvg of what the clients sent."""
    from lightrail.fl.policies import Policy
    from lightrail.fl.serve import demo

    Policy.parse(policy, field="--policy")
    _check_services(client_managers, leaves)
    for value, flag, lo, hi in ((clients, "--clients", 1, MAX_CLIENTS), (jobs, "--jobs", 1, MAX_JOBS),
                                (rounds, "--rounds", 1, MAX_ROUNDS), (concurrency, "--concurrency", 1, MAX_CONCURRENCY),
                                (model_dim, "--model-dim", 1, MAX_MODEL_DIM)):
        check_count(value, field=flag, lo=lo, hi=hi)
    if not 0 <= time_scale <= MAX_TIME_SCALE:
        raise ScenarioError(f"{time_scale}", field="--time-scale",
                            fix=f"use 0 (instant) up to {MAX_TIME_SCALE:g} (a client's work then takes seconds)")
    from lightrail.cli.study import _fl_time

    if over_selection is not None and not 1 <= over_selection <= 100:
        raise ScenarioError(f"{over_selection:g}", field="--over-selection",
                            fix="a multiple of demand from 1 (none) to 100, e.g. 1.3")
    result = demo(clients=clients, jobs=jobs, policy=policy, seed=seed, rounds=rounds,
                  client_managers=client_managers, concurrency=concurrency, time_scale=time_scale, leaves=leaves,
                  model_dim=model_dim, kill_leaf_at_round=kill_leaf_at_round, over_selection=over_selection,
                  round_timeout_s=_fl_time(round_timeout, "--round-timeout", "5s"), kill=kill,
                  kill_at_round=kill_at_round)
    save_result(out_dir, "fl-demo.json", result, quiet=json_out)
    if json_out:
        print_json(result)
    else:
        from lightrail.report.fl_serve import print_demo

        print_demo(result, out)
    if result["double_bookings"]:
        err.print("[bold red]double bookings found[/]")
        raise typer.Exit(1)
    if result["model_exact"] is False:
        err.print("[bold red]a job's final model differs from FedAvg of the updates its clients sent[/]")
        raise typer.Exit(1)


@fl_app.command("import-propius")
@friendly
def fl_import_propius_cmd(
    profiles: Annotated[Path, typer.Option("--profiles", help="Propius's job profile folder (job_<k>.yml), e.g. "
                                           "evaluation/job/profile_mobilenet_large.")],
    trace: Annotated[Path, typer.Option("--trace", help="Propius's job trace, e.g. "
                                        "evaluation/job/trace/job_trace_20.txt ('<gap s> <k>' per line).")],
    devices: Annotated[Path, typer.Option("--devices", help="Device profiles: Propius's "
                                          "datasets/device_info/client_spec_speed (pickle, plain data only) or JSON.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for clients.csv, jobs.csv (and availability.csv).")]
    = Path("out/propius"),
    clients: Annotated[int, typer.Option("--clients", help="Clients drawn from the device profiles (Propius: "
                                         "15,000).")] = 15_000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the draw.")] = 0,
    always_online: Annotated[str | None, typer.Option(
        "--always-online", help="Also write availability.csv with every client online from 0 for this long, e.g. "
        "30d (Propius's ideal_client mode).", show_default=False)] = None,
    json_out: JsonOut = False,
):
    """Turn Propius's evaluation inputs (job profiles, job trace, device profiles) into `study fl` trace files, and
    print the `study fl` command that replays them (over-selection and round timeout from the profiles)."""
    from lightrail.cli.study import MAX_TRACE_BYTES, _fl_time
    from lightrail.fl.propius import convert, load_devices, parse_profile, parse_trace
    from lightrail.report.files import write_text
    from lightrail.validation import read_bounded

    check_count(clients, field="--clients", hi=MAX_CLIENTS * 10, what="clients")
    check_out(out_dir)
    if not profiles.is_dir():
        raise ScenarioError(f"{profiles} is not a folder", field="--profiles", fix="the folder holding job_<k>.yml")
    online = _fl_time(always_online, "--always-online", "30d")
    found = {}
    for p in sorted(profiles.glob("job_*.yml")):
        k = p.stem.removeprefix("job_")
        if k.isdigit():
            found[int(k)] = parse_profile(read_bounded(p, field="--profiles", what="a job profile",
                                                       limit=1 << 20), name=p.name)
    if not found:
        raise ScenarioError(f"no job_<k>.yml in {profiles}", field="--profiles", fix="Propius's profile folder")
    arrivals = parse_trace(read_bounded(trace, field="--trace", what="a job trace", limit=1 << 20))
    if not devices.is_file():
        raise ScenarioError(f"{devices} is not a file", field="--devices", fix="Propius's client_spec_speed")
    try:
        raw = devices.read_bytes()
    except OSError as e:
        raise ScenarioError(f"cannot read {devices}: {e.strerror}", field="--devices", fix="an existing file") from None
    if len(raw) > MAX_TRACE_BYTES:
        raise ScenarioError(f"{devices} is over 1 GiB", field="--devices", fix="Propius's client_spec_speed")
    res = convert(load_devices(raw), found, arrivals, clients=clients, seed=seed, always_online_s=online)
    files = [write_text(out_dir / "clients.csv", res["clients"]), write_text(out_dir / "jobs.csv", res["jobs"])]
    if res["availability"] is not None:
        files.append(write_text(out_dir / "availability.csv", res["availability"]))
    command = (f"lightrail study fl --clients-trace {files[0]} --jobs-trace {files[1]}"
               + (f" --availability-trace {files[2]}" if len(files) > 2 else "")
               + f" --over-selection {res['over_selection']:g} --round-timeout {res['round_timeout_s']:g}s")
    summary = {"files": [str(f) for f in files], "clients": res["clients_count"], "jobs": res["jobs_count"],
               "devices": res["devices"], "over_selection": res["over_selection"],
               "round_timeout_s": res["round_timeout_s"], "command": command}
    if json_out:
        print_json(summary)
    else:
        out.print(f"{res['clients_count']:,} clients from {res['devices']} device profiles, {res['jobs_count']} jobs; "
                  f"wrote {', '.join(summary['files'])}", highlight=False, soft_wrap=True)
        out.print(f"replay: {command}", highlight=False, soft_wrap=True)
