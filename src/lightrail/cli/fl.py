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
    leaf_flush_interval_ms: Annotated[float | None, typer.Option(
        "--leaf-flush-interval-ms", help="Leaves forward pending results this often (0: only on POST /flush; "
        "default: the leaf's own, 1000).")] = None,
):
    """Run the control plane in the foreground: PostgreSQL, job manager, scheduler, client managers, load balancer
    and parameter servers. Prints one JSON `ready` line, then JSON log lines on stderr; a service that dies is
    replaced (a leaf with the same --state directory, so its acknowledged results survive); Ctrl-C / SIGTERM
    stops everything."""
    from lightrail.fl.serve import Supervisor

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
    json_out: JsonOut = False,
):
    """Start the control plane and parameter servers, emulate clients checking in through the load balancer and
    running real federated rounds through the leaves (model download, update, pre-aggregation) until every job ran
    all its rounds; report bindings/s, rounds, per-job completion, double bookings (from the DB), root downloads
    vs. client model requests and whether each job's final model is exactly FedAvg of what the clients sent."""
    from lightrail.fl.policies import Policy
    from lightrail.fl.serve import demo

    Policy.parse(policy, field="--policy")
    result = demo(clients=clients, jobs=jobs, policy=policy, seed=seed, rounds=rounds,
                  client_managers=client_managers, concurrency=concurrency, time_scale=time_scale, leaves=leaves,
                  model_dim=model_dim, kill_leaf_at_round=kill_leaf_at_round)
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
