"""``lightrail import chakra``: bring a recorded workload (Chakra execution traces) in."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, friendly, out
from lightrail.cli.options import JsonOut, result_out
from lightrail.cli.output import print_json, save_result

import_app = LeanTyper(no_args_is_help=True, help="Bring workloads in: Chakra execution traces.")
app.add_typer(import_app, name="import")


@import_app.command("chakra")
@friendly
def chakra_cmd(
    folder: Annotated[Path, typer.Argument(help="Folder of one PREFIX.RANK.et Chakra trace per rank (and "
                                                "PREFIX.json, ASTRA-sim's communicator groups, if any).")],
    out_dir: Annotated[Path | None, result_out("chakra.json")] = None,
    as_json: JsonOut = False,
):
    """Read a Chakra trace and report its ranks, ops by kind, bytes and process groups; name the folder in a
    scenario (workload: {chakra: DIR}) and `lightrail simulate` runs it."""
    from lightrail.units import format_size, format_time
    from lightrail.workload.chakra import read_chakra

    trace = read_chakra(folder)
    data = trace.to_dict()
    save_result(out_dir, "chakra.json", data, quiet=as_json)
    if as_json:
        print_json(data)
        return
    out.print(f"{folder}: {data['ranks']} ranks, {len(data['groups'])} process groups")
    for kind, count in data["ops"].items():
        size = data["bytes"].get(kind)
        out.print(f"  {kind:28} {count:8}" + (f"  {format_size(size)}" if size else ""))
    out.print(f"  compute per rank: {format_time(max(data['compute_s_per_rank'], default=0.0))} (largest)")
    out.print("  simulate it: a scenario with workload: {chakra: " + str(folder) + "} and cluster.gpus: "
              f"{data['ranks']}")
