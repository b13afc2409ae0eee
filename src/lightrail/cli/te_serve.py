"""``lightrail te serve``: Symphony's slice controllers as real processes on loopback, live."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import friendly, out
from lightrail.cli.options import JsonOut, check_count, check_out, old_spelling, renamed, result_out
from lightrail.cli.output import print_json, save_result
from lightrail.cli.te import check_lambda, check_te_sizes, te_app
from lightrail.errors import ScenarioError

MAX_SERVE_SLICES = 64
"""Most slice controllers (one process each) te serve starts on one machine."""


def _stderr_json(obj: dict) -> None:
    from lightrail.report.files import dumps_json

    sys.stderr.write(dumps_json(obj, indent=None) + "\n")
    sys.stderr.flush()


@te_app.command("serve")
@friendly
def te_serve_cmd(
    topology: Annotated[str, typer.Option("--topology", help="geant, abilene, tatanld, geant2012, germany50, a "
                                          "topohub key (topozoo/Abilene) or a topology .json file.")] = "abilene",
    slices: Annotated[int, typer.Option("--slices", help="Slice controllers = processes.")] = 3,
    lam: Annotated[float | None, typer.Option("--lambda", show_default=False,
                                              help="Weight of the regularizer lambda * sum_e u_e^2 (0: none; "
                                                   "default: studies.te.DEFAULT_LAMBDA, 0.001).")] = None,
    perturbation: Annotated[float, typer.Option("--perturbation", help="Each controller's relative demand error, "
                                                "uniform in +-P.")] = 0.05,
    objective: Annotated[str, typer.Option("--objective", help="max-flow, max-concurrent or min-mlu.")] = "max-flow",
    paths: Annotated[int, typer.Option("--paths", help="Shortest paths per demand (k).")] = 4,
    load: Annotated[float, typer.Option("--load", help="Traffic scaled so its mean matrix needs this max link "
                                        "utilization at best.")] = 0.9,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the traffic, the views and the randomized slicer.")]
    = 0,
    slicer: Annotated[str, typer.Option("--slicer", help="contiguous, randomized or optimal.")] = "randomized",
    epochs: Annotated[int, typer.Option("--epochs", help="Traffic matrices to publish (0: until Ctrl-C / "
                                        "SIGTERM, cycling).")] = 20,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between epochs (the controllers' "
                                            "deadline).")] = 0.5,
    kill: Annotated[int | None, typer.Option("--kill", show_default=False,
                                             help="SIGKILL this slice's controller (0..slices-1) during the run: "
                                                  "its blast radius, live.")] = None,
    kill_at_epoch: Annotated[int | None, typer.Option("--kill-at-epoch", show_default=False,
                                                      help="Epoch at which --kill strikes (default: half way).")]
    = None,
    old_kill_at: Annotated[int | None, old_spelling("--kill-at", "--kill-at-epoch")] = None,
    port: Annotated[int, typer.Option("--port", help="Loopback port the controllers connect to (0: any free).")]
    = 0,
    allocations: Annotated[Path | None, typer.Option("--allocations", show_default=False,
                                                     help="Also write every allocation the network used to this "
                                                          "file (JSON lines: epoch, slice, paths, flows).")] = None,
    out_dir: Annotated[Path | None, result_out("te-serve.json")] = None,
    as_json: JsonOut = False,
):
    """Run one controller process per slice on 127.0.0.1: every epoch the network publishes the true
    demand, each controller solves the whole WAN's TE on its own perturbed view and publishes the
    allocation of the demands that start in its slice; the network realizes their sum. A killed
    controller leaves its slice's demands unprogrammed (the affected share); the others keep running.
    With --json, JSON lines on stderr as it runs (ready, epoch, dead) and one JSON object at the end."""
    from lightrail.report.te_serve import epoch_line, epoch_table, event_line, print_ready, print_serve
    from lightrail.studies.te import DEFAULT_LAMBDA, TeSetup
    from lightrail.te.formulations import Objective
    from lightrail.te.service import serve_te
    from lightrail.te.slicing import Slicer

    kill_at = renamed(kill_at_epoch, old_kill_at, old="--kill-at", new="--kill-at-epoch")  # as --kill-at-step
    check_te_sizes(paths=paths, load=load, matrices=epochs, matrices_field="--epochs")
    if lam is not None:
        check_lambda(lam)
    check_count(slices, field="--slices", hi=MAX_SERVE_SLICES, what="controller processes")
    if allocations is not None:
        if allocations.is_dir():
            raise ScenarioError(f"{str(allocations)!r} is a folder", field="--allocations",
                                fix="give a file path, e.g. out/allocations.jsonl")
        check_out(allocations.parent, field="--allocations")
    setup = TeSetup(topology=topology, slices=slices, lam=DEFAULT_LAMBDA if lam is None else lam,
                    perturbation=perturbation, objective=Objective.parse(objective), k=paths, load=load, seed=seed,
                    slicers=(Slicer.parse(slicer),))
    rows: list[dict] = []
    live = None
    if as_json:
        callbacks = {"on_ready": _stderr_json, "on_epoch": lambda row: _stderr_json({"event": "epoch", **row}),
                     "on_event": _stderr_json}
    else:
        from rich.live import Live

        live_ok = out.is_terminal

        def on_ready(info: dict) -> None:
            nonlocal live
            print_ready(info, out)
            if live_ok:
                live = Live(epoch_table(rows), console=out.console, auto_refresh=False)
                live.start()

        def on_epoch(row: dict) -> None:
            rows.append(row)
            if live is not None:
                live.update(epoch_table(rows), refresh=True)
            else:
                out.print(epoch_line(row), highlight=False, soft_wrap=True)

        def on_event(event: dict) -> None:
            (live.console if live is not None else out).print(event_line(event), highlight=False, soft_wrap=True)

        callbacks = {"on_ready": on_ready, "on_epoch": on_epoch, "on_event": on_event}
    try:
        run = serve_te(setup, slicer=slicer, epochs=epochs, interval=interval, kill=kill, kill_at=kill_at,
                       port=port, allocations=allocations, **callbacks)
    finally:
        if live is not None:
            with contextlib.suppress(Exception):
                live.stop()
    save_result(out_dir, "te-serve.json", run.to_dict(), quiet=as_json)
    if as_json:
        print_json(run.to_dict())
    else:
        print_serve(run, out)
