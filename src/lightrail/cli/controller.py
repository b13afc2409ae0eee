"""``lightrail controller serve``: the control plane's OCS controller service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly
from lightrail.cli.options import old_spelling, renamed
from lightrail.cli.runtime import DEFAULT_OCS_DELAY
from lightrail.defaults import GPUS_PER_SERVER
from lightrail.errors import ScenarioError
from lightrail.units import parse_time

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
    rails: Annotated[int, typer.Option("--rails", help="Without --config: emulated OCS devices rail0..")]
    = GPUS_PER_SERVER,
    ports: Annotated[int, typer.Option("--ports", help="Without --config: ports per OCS.")] = 64,
    ocs_delay: Annotated[str, typer.Option("--ocs-delay", help="Without --config: the emulated OCS "
                                           "reconfiguration delay, e.g. 10ms.")] = DEFAULT_OCS_DELAY,
    delay: Annotated[str | None, old_spelling("--delay", "--ocs-delay")] = None,
):
    """Run the controller: circuit state and port ownership in SQLite (WAL), the rank protocol on
    --port, the admin API (/state, /jobs, /metrics) on --admin-port. Prints one JSON `ready` line."""
    from lightrail.runtime.controller.config import default_config, load_config
    from lightrail.runtime.controller.server import serve

    ocs_delay = renamed(ocs_delay, delay, old="--delay", new="--ocs-delay")
    if config is not None:
        cfg = load_config(config)
    else:
        if rails < 1 or ports < 1:
            raise ScenarioError("must be at least 1", field="--rails" if rails < 1 else "--ports")
        cfg = default_config(rails=rails, ports=ports, delay=parse_time(ocs_delay, field="--ocs-delay"))
    overrides = {k: v for k, v in (("port", port), ("admin_port", admin_port)) if v is not None}
    for flag, v in overrides.items():
        if not 0 <= v <= 65535:
            raise ScenarioError(f"{v} is not a TCP port", field=f"--{flag.replace('_', '-')}", fix="use 0..65535")
    try:
        serve(cfg.model_copy(update=overrides), str(state))
    except OSError as e:
        raise ScenarioError(f"cannot listen: {e}", field="--port", fix="pick free ports or 0") from None
