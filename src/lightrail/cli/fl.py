"""``lightrail fl serve`` and ``lightrail fl demo``: the federated-learning control plane (Propius) as real
processes on loopback, its state in an embedded PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, err, friendly, out
from lightrail.cli.options import JsonOut, print_json

fl_app = typer.Typer(no_args_is_help=True, help="Federated / collaborative ML resource manager (Propius).")
app.add_typer(fl_app, name="fl")

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
):
    """Run the control plane in the foreground: PostgreSQL, job manager, scheduler, client managers, load balancer
    and parameter servers. Prints one JSON `ready` line, then JSON log lines on stderr; a service that dies is
    replaced; Ctrl-C / SIGTERM stops everything."""
    from lightrail.fl.serve import Supervisor

    Supervisor(policy=policy, client_managers=client_managers, leaves=leaves, data=data, seed=seed).run()


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
    json_out: JsonOut = False,
):
    """Start the control plane, emulate clients checking in through the load balancer until every job ran all
    its rounds, report bindings/s, rounds, per-job completion and double bookings (from the DB), stop."""
    from lightrail.fl.policies import Policy
    from lightrail.fl.serve import demo

    Policy.parse(policy, field="--policy")
    result = demo(clients=clients, jobs=jobs, policy=policy, seed=seed, rounds=rounds,
                  client_managers=client_managers, concurrency=concurrency, time_scale=time_scale)
    if json_out:
        print_json(result)
    else:
        from lightrail.report.fl_serve import print_demo

        print_demo(result, out)
    if result["double_bookings"]:
        err.print("[bold red]double bookings found[/]")
        raise typer.Exit(1)
