"""``lightrail pipswitch``: all-to-all rounds of matchings on a mesh of 2x2 photonic cells (PipSwitch).

The library checks the input; its errors name ``ports`` and ``mesh``, which ``@friendly`` shows as the flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import JsonOut, result_out
from lightrail.cli.output import print_json, save_result
from lightrail.defaults import MAX_PORTS, MESHES


@app.command("pipswitch")
@friendly
def pipswitch_cmd(
    ports: Annotated[int, typer.Option("--ports", help=f"Switch ports, 2 to {MAX_PORTS}.")] = 32,
    mesh: Annotated[str, typer.Option("--mesh", help="Mesh of 2x2 cells: " + ", ".join(MESHES) + ".")] = "crossbar",
    out_dir: Annotated[Path | None, result_out("pipswitch.json")] = None,
    as_json: JsonOut = False,
):
    """Rounds of matchings that connect every pair of ports (n-1 rounds for even n, n for odd), routed on
    a mesh of bar/cross cells and ordered for the fewest cell state changes."""
    from lightrail.control.pipswitch import plan_pipswitch
    from lightrail.report.pipswitch import print_pipswitch

    result = plan_pipswitch(ports, mesh=mesh)  # its errors name ports / mesh, shown as --ports / --mesh
    save_result(out_dir, "pipswitch.json", result.to_dict(), quiet=as_json)
    if as_json:
        print_json(result.to_dict())
    else:
        print_pipswitch(result, out)
