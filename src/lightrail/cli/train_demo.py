"""``lightrail train-demo``: the control plane in the loop."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, err, friendly, out
from lightrail.cli.options import FigureFormat, JsonOut, OcsDelay, figure_suffix, parse_mode
from lightrail.cli.output import print_json, progress_steps, writes_files
from lightrail.defaults import RECONFIG_DELAY, Mode
from lightrail.errors import ScenarioError
from lightrail.units import parse_time

DEFAULT_OCS_DELAY = f"{RECONFIG_DELAY * 1e3:g}ms"
"""The flags' default OCS delay, from the one default, ``defaults.RECONFIG_DELAY`` (``fabric.params``)."""


def _leases(flag: bool | None) -> bool:
    """``--leases/--no-leases``; when neither is given, the old ``LIGHTRAIL_LEASES=0`` still turns leases
    off (read here, at the edge: the library takes the flag's value, never the environment)."""
    if flag is not None:
        return flag
    if os.environ.get("LIGHTRAIL_LEASES", "").strip() == "0":
        err.print("note: LIGHTRAIL_LEASES=0 is now --no-leases", highlight=False)
        return False
    return True


@contextlib.contextmanager
def end_on_signals():
    """While inside, SIGTERM and SIGINT end a long run within seconds (issue 31 item 6: the controller and 8 ranks
    trained on for ~100 s): every worker process is killed at once, and the exit unwinds through the run's clean-up,
    which stops the controller and removes its temporary state. Exit status 128 + the signal's number, as a shell
    reports. The handlers before are restored on the way out."""
    import multiprocessing
    import signal

    def stop(signum, _frame) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        for child in multiprocessing.active_children():
            child.kill()
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return
    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def parse_kill_steps(values: list[str] | None, flag: str = "--kill-controller-at-step") -> tuple[int, ...]:
    """``--kill-controller-at-step`` (or ``flag``), given several times or as a comma list, as whole steps; the
    range and order are the library's to check (``train_demo.measure._kills``), against the run's ``--steps``."""
    steps = []
    for value in values or ():
        for part in value.split(","):
            try:
                steps.append(int(part.strip()))
            except ValueError:
                raise ScenarioError(f"{part.strip()!r} is not a step", field=flag,
                                    fix=f"give whole steps, e.g. {flag} 3 {flag} 9 (or 3,9)") from None
    return tuple(steps)


@app.command("train-demo")
@friendly
def train_demo_cmd(
    ranks: Annotated[int | None, typer.Option("--ranks", "-n", help="Processes (= tp * pp * dp).")] = 8,
    tp: Annotated[int, typer.Option("--tp", help="Tensor parallel degree (inside a server).")] = 2,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 2,
    dp: Annotated[int, typer.Option("--dp", help="Data parallel degree.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Training steps per run.")] = 20,
    ocs_delay: OcsDelay = DEFAULT_OCS_DELAY,
    mode: Annotated[str, typer.Option("--mode", help="on-demand or provisioned.")] = Mode.PROVISIONED.value,
    leases: Annotated[bool | None, typer.Option("--leases/--no-leases", show_default=False,
                                                help="Let phases of one configuration hold their circuits "
                                                     "across ops (default), or check in around every op.")] = None,
    gpus_per_server: Annotated[int | None, typer.Option("--gpus-per-server",
                                                        help="Ranks per server = rails (default: --tp).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for train-demo.json and iterations.png.")]
    = Path("out/train-demo"),
    fmt: FigureFormat = "png",
    kill_controller_at_step: Annotated[list[str] | None, typer.Option(
        "--kill-controller-at-step", metavar="STEP[,STEP...]",
        help="Kill the controller (SIGKILL) once training completed this many steps and start it again on the "
             "same state and ports; the ranks reconnect (JSON: controller_restarts). Repeatable, or a comma "
             "list, ascending; combines with --spares and --kill-rank, before or after --kill-at-step.")] = None,
    spares: Annotated[int, typer.Option("--spares", help="Idle spare worker processes attached to the fabric; "
                                                         "one takes a failed rank's place (LUMION).")] = 0,
    kill_rank: Annotated[int | None, typer.Option("--kill-rank", help="Kill this rank's process (SIGKILL) at "
                                                                      "--kill-at-step (JSON: recovery).")] = None,
    kill_at_step: Annotated[int | None, typer.Option("--kill-at-step", help="The step at whose start "
                                                                            "--kill-rank dies.")] = None,
    pause_controller_at_step: Annotated[list[str] | None, typer.Option(
        "--pause-controller-at-step", metavar="STEP[,STEP...]",
        help="Freeze the controller (SIGSTOP) for --pause-for once training completed this many steps, then let "
             "it run on (SIGCONT): no rank may fail for it (JSON: controller_pauses, failovers). Repeatable, or a "
             "comma list, ascending.")] = None,
    pause_for: Annotated[str, typer.Option("--pause-for", help="How long each --pause-controller-at-step "
                                                                "freezes the controller, e.g. 5s.")] = "5s",
    as_json: JsonOut = False,
):
    """Train a small GPT (TP x PP x DP, CPU processes) on plain gloo and on emulated photonic rails
    (the lightrail backend + a controller process); compare, and set beside `simulate`'s prediction
    for the same job (GPipe, compute calibrated on the gloo run). --no-leases turns leases off."""
    from dataclasses import replace

    from lightrail.report.train_demo import print_train_demo, write_train_demo
    from lightrail.studies.train_demo import DemoConfig
    from lightrail.studies.train_demo.measure import DEMO_POLICY, run_photonic_demo

    fmt = figure_suffix(fmt)
    config = DemoConfig(tp=tp, pp=pp, dp=dp, steps=steps, ranks=ranks)
    delay = parse_time(ocs_delay, field="--ocs-delay")
    policy = replace(DEMO_POLICY, mode=parse_mode(mode), leases=_leases(leases))  # the mode is parsed here, once
    kill_steps = parse_kill_steps(kill_controller_at_step)
    pause_steps = parse_kill_steps(pause_controller_at_step, "--pause-controller-at-step")
    pause_s = parse_time(pause_for, field="--pause-for")
    with end_on_signals(), progress_steps(2, "train-demo", as_json) as step:
        result = run_photonic_demo(config, ocs_delay=delay, policy=policy, gpus_per_server=gpus_per_server,
                                   progress=step,
                                   kill_controller_at_step=kill_steps, spares=spares, kill_rank=kill_rank,
                                   kill_at_step=kill_at_step, pause_controller_at_step=pause_steps,
                                   pause_for_s=pause_s)
    wrote = write_train_demo(result, out_dir, fmt=fmt) if writes_files(as_json) else []
    if as_json:
        print_json(result.to_dict())
    else:
        print_train_demo(result, out, wrote=wrote)
    if not result.losses_identical:
        raise typer.Exit(1)
