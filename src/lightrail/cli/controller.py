"""``lightrail controller serve``: the control plane's OCS controller service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, friendly
from lightrail.cli.options import old_spelling, renamed
from lightrail.cli.train_demo import DEFAULT_OCS_DELAY
from lightrail.defaults import GPUS_PER_SERVER
from lightrail.errors import ScenarioError
from lightrail.units import parse_time

controller_app = LeanTyper(no_args_is_help=True, help="The control plane: OCS controller service.")
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
    operator_token_file: Annotated[Path | None, typer.Option(
        "--operator-token-file", help="File holding the admin API's operator token (else $LIGHTRAIL_OPERATOR_TOKEN, "
        "else a new one, printed in the ready line).")] = None,
    heartbeat_timeout: Annotated[str | None, typer.Option(
        "--heartbeat-timeout", help="A rank silent this long is failed, e.g. 2s (default: the config's, 2s).")]
    = None,
    hello_timeout: Annotated[str | None, typer.Option(
        "--hello-timeout", help="A connection that says no hello this long is closed (default 5s).")] = None,
    rejoin_timeout: Annotated[str | None, typer.Option(
        "--rejoin-timeout", help="A rank whose connection closed without bye is failed if it says no hello again "
        "this long (default: the heartbeat timeout + 2s); a close alone may be a rank reconnecting.")] = None,
    max_connections: Annotated[int | None, typer.Option(
        "--max-connections", help="Rank connections at once (default 4096, capped by the fd limit).")] = None,
    accept_state_rollback: Annotated[bool, typer.Option(
        "--accept-state-rollback", help="Start on a state file older than the epoch the controller acknowledged "
        "(<state>.epoch): its lost changes stay lost.")] = False,
    frontend: Annotated[str | None, typer.Option(
        "--frontend", help="Who owns the rank connections: loop (the event loop) or native (a C concentrator, "
        "compiled with cc at start-up: the kernel's per-connection work on another core).")] = None,
):
    """Run the controller: circuit state and port ownership in SQLite (WAL), the rank protocol on
    --port, the admin API (/state, /jobs, /metrics) on --admin-port. Prints one JSON `ready` line.
    The state file is locked to this controller: a second one on it exits 2, naming the first."""
    from lightrail.runtime.controller.config import (
        MAX_DEVICES,
        MAX_PORTS,
        MAX_TOTAL_PORTS,
        default_config,
        load_config,
    )
    from lightrail.runtime.controller.serve import check_startup, serve

    ocs_delay = renamed(ocs_delay, delay, old="--delay", new="--ocs-delay")
    if config is not None:
        cfg = load_config(config)
    else:
        for flag, value, most in (("--rails", rails, MAX_DEVICES), ("--ports", ports, MAX_PORTS)):
            if not 1 <= value <= most:
                raise ScenarioError(f"{flag} {value} is out of range", field=flag, fix=f"use 1..{most}")
        if rails * ports > MAX_TOTAL_PORTS:
            raise ScenarioError(f"--rails {rails} x --ports {ports} = {rails * ports} ports, more than "
                                f"{MAX_TOTAL_PORTS}", field="--ports", fix="fewer rails or ports per rail")
        cfg = default_config(rails=rails, ports=ports, delay=parse_time(ocs_delay, field="--ocs-delay"))
    overrides = {k: v for k, v in (("port", port), ("admin_port", admin_port)) if v is not None}
    for flag, v in overrides.items():
        if not 0 <= v <= 65535:
            raise ScenarioError(f"{v} is not a TCP port", field=f"--{flag.replace('_', '-')}", fix="use 0..65535")
    for flag, name, text in (("--heartbeat-timeout", "heartbeat_timeout", heartbeat_timeout),
                             ("--hello-timeout", "hello_timeout", hello_timeout),
                             ("--rejoin-timeout", "rejoin_timeout", rejoin_timeout)):
        if text is not None:
            seconds = parse_time(text, field=flag)
            if not 0 < seconds <= 3600:
                raise ScenarioError(f"{text} is out of range", field=flag, fix="give a time in (0, 1h], e.g. 2s")
            overrides[name] = seconds
    if max_connections is not None:
        if not 1 <= max_connections <= 1 << 20:
            raise ScenarioError(f"{max_connections} is out of range", field="--max-connections", fix="use 1..1048576")
        overrides["max_connections"] = max_connections
    if frontend is not None:
        if frontend not in ("loop", "native"):
            raise ScenarioError(f"{frontend!r} is not a front end", field="--frontend", fix="use loop or native")
        overrides["frontend"] = frontend
    if operator_token_file is not None:
        try:
            with open(operator_token_file, "rb") as f:  # bounded: a token is short (and /dev/zero never ends)
                token = f.read(4097).decode().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ScenarioError(f"cannot read {operator_token_file}: {e}", field="--operator-token-file",
                                fix="give a readable file holding the token") from None
        if not 16 <= len(token) <= 4096 or any(c.isspace() for c in token):
            raise ScenarioError("the operator token must be 16..4096 characters without spaces",
                                field="--operator-token-file",
                                fix="use a long random secret, e.g. python -c 'import secrets; "
                                    "print(secrets.token_urlsafe(32))'")
        overrides["operator_token"] = token
    cfg = cfg.model_copy(update=overrides)
    # a directory, an unwritable, corrupt or rolled-back state, a full disk or a port in use: one line, nothing written
    check_startup(cfg, str(state), accept_rollback=accept_state_rollback)
    try:
        serve(cfg, str(state), accept_rollback=accept_state_rollback)
    except OSError as e:
        raise ScenarioError(f"cannot listen: {e}", field="--port", fix="pick free ports or 0") from None
