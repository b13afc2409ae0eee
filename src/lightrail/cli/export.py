"""``lightrail export astra-sim``: a scenario's job as ASTRA-sim network/system configs and Chakra traces."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, friendly, out
from lightrail.cli.options import JsonOut, Scenario, built_scenario
from lightrail.cli.output import print_json, progress_steps

export_app = LeanTyper(no_args_is_help=True, help="Write lightrail's workloads for other simulators.")
app.add_typer(export_app, name="export")


@export_app.command("astra-sim")
@friendly
def astra_sim_cmd(
    scenario: Scenario = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for network.yml, system.json, remote_memory.json, "
                                          "workload.RANK.et, workload.json and a README.")] = Path("out/astra-sim"),
    as_json: JsonOut = False,
):
    """Write the scenario's job (the electrical baseline's program, or the trace it names) as ASTRA-sim inputs:
    the analytical network (NVLink and rail switches), the system config and one Chakra trace per rank, so the
    same job runs in both simulators."""
    from lightrail.collectives.registry import resolve
    from lightrail.report.export import astra_network, astra_system, write_astra_sim
    from lightrail.workload.chakra import program_to_trace
    from lightrail.workload.program import CollectiveOp, build_program

    built = built_scenario(scenario, trace_ok=True)
    algorithms: dict[str, str] = {}
    if built.trace is not None:
        trace = built.trace
    else:
        program = build_program(built.job)
        trace = program_to_trace(program)
        lay = built.job.layout
        for ops in program.stages:
            for op in ops:
                if isinstance(op, CollectiveOp):
                    n = 1
                    for d in op.group_dims:
                        n *= lay.degree(d)
                    algorithms.setdefault(op.kind.value, resolve(op.kind, op.algorithm, n).name)
    fab = built.fabric
    network = astra_network(trace.world, built.scenario.cluster.gpus_per_server, fab.nvlink_bandwidth,
                            fab.nic_bandwidth, fab.latency)
    system = astra_system(len(network["topology"]), algorithms, fab.alpha)
    with progress_steps(trace.world, f"exporting {built.scenario.name}", as_json) as step:
        written = write_astra_sim(trace, out_dir, name=built.scenario.name, network=network, system=system,
                                  progress=step)
    result = {"scenario": built.scenario.name, "out": str(out_dir), "ranks": trace.world, "ops": trace.ops(),
              "bytes": trace.bytes_by_kind(), "algorithms": algorithms, "network": network,
              "files": [str(p) for p in written]}
    if as_json:
        print_json(result)
    else:
        out.print(f"{built.scenario.name}: {trace.world} Chakra traces and ASTRA-sim configs in {out_dir}")
        for path in written:
            out.print(f"  wrote {path}")
        out.print(f"  run it: see {out_dir}/README.md")
