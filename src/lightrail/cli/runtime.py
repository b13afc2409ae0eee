"""``lightrail train-demo``, ``controller serve``: the control plane in the loop."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import (
    JsonOut,
    print_json,
    progress_bar,
)
from lightrail.errors import ScenarioError
from lightrail.units import format_time, parse_time


@app.command("train-demo")
@friendly
def train_demo_cmd(
    ranks: Annotated[int | None, typer.Option("--ranks", "-n", help="Processes (= tp * pp * dp).")] = 8,
    tp: Annotated[int, typer.Option("--tp", help="Tensor parallel degree (inside a server).")] = 2,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 2,
    dp: Annotated[int, typer.Option("--dp", help="Data parallel degree.")] = 2,
    steps: Annotated[int, typer.Option("--steps", help="Training steps per run.")] = 20,
    ocs_delay: Annotated[str, typer.Option("--ocs-delay", help="Emulated OCS reconfiguration delay.")] = "10ms",
    mode: Annotated[str, typer.Option("--mode", help="on-demand or provisioned.")] = "provisioned",
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
    from lightrail.studies.photonic_demo import run_photonic_demo
    from lightrail.studies.train_demo import DemoConfig

    config = DemoConfig(tp=tp, pp=pp, dp=dp, steps=steps, ranks=ranks)
    delay = parse_time(ocs_delay, field="--ocs-delay")
    progress, task = progress_bar(2, "train-demo", as_json)
    with progress:
        result = run_photonic_demo(config, ocs_delay_s=delay, mode=mode, gpus_per_server=gpus_per_server,
                                   progress=lambda what: progress.update(task, advance=1, description=what))
    write_json(out_dir / "train-demo.json", result)
    plot_train_demo(result, out_dir / "iterations.png",
                    title=f"{config.world} ranks TP{tp} PP{pp} DP{dp}, OCS {ocs_delay}, {mode}")
    if as_json:
        print_json(result)
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
