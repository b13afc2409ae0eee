"""``lightrail calibrate nccl-tests``: fit NCCL's algorithm x protocol model (or one engine schedule) to a log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, friendly, given_on_command_line, out
from lightrail.cli.options import (
    LATENCY_DEFAULT,
    FigureFormat,
    GpusPerServer,
    HostsPerLeaf,
    JsonOut,
    Latency,
    Oversubscription,
    Ranks,
    Shape,
    TopologyOpt,
    check_collective_size,
    check_ranks,
    figure_suffix,
    parse_kind,
    parse_shape,
)
from lightrail.cli.output import print_json
from lightrail.defaults import GPUS_PER_SERVER, HOSTS_PER_LEAF, Kind
from lightrail.errors import LightrailError, ScenarioError
from lightrail.units import parse_rate, parse_time

calibrate_app = LeanTyper(no_args_is_help=True, help="Fit the model's parameters to measurements.")
app.add_typer(calibrate_app, name="calibrate")

MODELS = ("nccl", "engine")
NCCL_TOPOLOGIES = ("rails", "switch", "fat-tree")
"""Fabrics NCCL's model describes: NVLink servers whose GPUs each have a NIC on a (rail or switched) network."""
P2P_OPS = ("alltoall", "sendrecv")


def _op(op: str | None, tables, model: str) -> tuple[str, object]:
    """The collective to fit and the log's table of it: ``--op`` or the first table's op (allreduce if the log
    names none); with several tables, the first of that op."""
    def norm(name):
        return None if name is None else name.replace("_", "").replace("-", "").lower()

    wanted = norm(op) if op is not None else norm(tables[0].op) or "allreduce"
    kind = wanted if (model == "nccl" and wanted == "sendrecv") else parse_kind(wanted).value
    named = [t for t in tables if norm(t.op) == kind]
    unnamed = [t for t in tables if t.op is None]
    if named or unnamed:
        return kind, (named or unnamed)[0]
    ops = ", ".join(dict.fromkeys(t.op for t in tables))
    raise ScenarioError(f"the log has no {kind} table (it has {ops})", field="--op", fix=f"use --op with one of {ops}")


def _read(file: Path):
    """(tables, warnings) of the log: ``read_nccl_tests`` where the reader has it, else the first table."""
    from lightrail.validation import read_bounded
    from lightrail.workload import nccl_tests

    text = read_bounded(file, field="FILE", what="the saved output of all_reduce_perf (a regular file)")
    reader = getattr(nccl_tests, "read_nccl_tests", None)
    if reader is not None:
        log = reader(text, source=file.name)
        return list(log.tables), list(log.warnings)
    from types import SimpleNamespace

    rows, listed = nccl_tests.parse_nccl_tests(text, source=file.name)
    return [SimpleNamespace(op=None, rows=rows, ranks=listed, devices=())], []


def fit_log(file: Path, *, ranks: int = 8, topology: str = "switch", algo: str = "auto", op: str | None = None,
            model: str = "nccl", gpu: str | None = None, arch: str | None = None, nvlink_bandwidth: str | None = None,
            rail_bandwidth: str | None = None, nics_per_server: int | None = None, nvls: bool | None = None,
            collnet: bool = False, latency: str = LATENCY_DEFAULT, shape: str | None = None,
            gpus_per_server: int = GPUS_PER_SERVER, hosts_per_leaf: int = HOSTS_PER_LEAF,
            oversubscription: float = 1.0):
    """The calibration of ``calibrate nccl-tests`` (its options, as keywords): NCCL's model (or, ``model="engine"``,
    one lightrail schedule) fitted to the log in ``file``; what ``lightrail.calibrate`` returns too."""
    check_ranks(ranks)
    if model not in MODELS:
        raise ScenarioError(f"unknown model {model!r}", field="--model", fix="use nccl or engine")
    tables, warnings = _read(file)
    kind, table = _op(op, tables, model)
    listed = table.ranks
    if listed is not None and listed != ranks:
        raise ScenarioError(f"the log's header lists {listed} ranks", field="--ranks", fix=f"use --ranks {listed}")
    rows = table.rows
    if model == "engine":
        from lightrail.collectives.registry import resolve
        from lightrail.studies.calibrate_nccl import fit

        name = resolve(kind, algo, ranks).name if algo == "auto" else algo
        check_collective_size(parse_kind(kind), name, ranks)  # bounded before the fit builds the schedule
        cal = fit(rows, kind=parse_kind(kind), algo=name, topology=topology, ranks=ranks,
                  latency_s=parse_time(latency, field="--latency"), shape=parse_shape(shape),
                  gpus_per_server=gpus_per_server, hosts_per_leaf=hosts_per_leaf, oversubscription=oversubscription)
    else:
        from lightrail.nccl import ARCHS, parse_algorithm
        from lightrail.studies.calibrate_nccl import fit_nccl, nccl_communicator

        if topology not in NCCL_TOPOLOGIES:
            raise ScenarioError(f"NCCL's model describes NVLink servers with a NIC per GPU, not {topology!r}",
                                field="--topology", fix=f"use one of {', '.join(NCCL_TOPOLOGIES)}, or --model engine")
        if arch is not None and arch not in ARCHS:
            raise ScenarioError(f"unknown GPU class {arch!r}", field="--arch", fix=f"use one of {', '.join(ARCHS)}")
        if gpus_per_server < 1 or ranks % min(gpus_per_server, ranks):
            raise ScenarioError(f"{ranks} ranks do not fill servers of {gpus_per_server} GPUs",
                                field="--gpus-per-server", fix="give the GPUs per server the job used")
        forced = None if algo == "auto" else parse_algorithm(algo, field="--algo")
        comm, nominal, more = nccl_communicator(
            ranks, gpus_per_server, gpu=gpu, arch=arch, nvls=nvls, collnet=collnet,
            nvlink_Bps=parse_rate(nvlink_bandwidth, field="--nvlink-bandwidth") if nvlink_bandwidth else None,
            nic_Bps=parse_rate(rail_bandwidth, field="--rail-bandwidth") if rail_bandwidth else None,
            devices=getattr(table, "devices", ()), nics_per_server=nics_per_server)
        try:
            cal = fit_nccl(rows, kind=kind, comm=comm, algorithm=forced, topology=topology, nominal=nominal,
                           warnings=warnings + more)
        except LightrailError as e:
            e.field = "--algo" if e.field == "algorithm" else e.field
            raise
    return cal


@calibrate_app.command("nccl-tests")
@friendly
def nccl_tests_cmd(
    file: Annotated[Path, typer.Argument(help="Output of an nccl-tests binary (all_reduce_perf, ...), as printed.")],
    ranks: Ranks = 8,
    topology: TopologyOpt = "switch",
    algo: Annotated[str, typer.Option("--algo", "-a", help="auto: NCCL's choice per size; or force one algorithm "
                                      "(NCCL_ALGO): ring, tree, nvls, nvls-tree, collnet-direct, collnet-chain, "
                                      "pat; with --model engine a lightrail schedule (see `lightrail "
                                      "algorithms`).")] = "auto",
    op: Annotated[str | None, typer.Option("--op", help="Collective: " + ", ".join(k.value for k in Kind)
                                           + ", sendrecv (default: the log's).")] = None,
    model: Annotated[str, typer.Option("--model", help="nccl: NCCL's algorithm x protocol model; engine: one "
                                       "lightrail schedule's alpha, latency and bandwidth (the old fit).")] = "nccl",
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU preset for the nominal rates: h100, h200, b200, a100 "
                                            "(default: the log's device names).")] = None,
    arch: Annotated[str | None, typer.Option("--arch", help="NCCL's GPU class: volta, ampere, hopper, blackwell "
                                             "(default: the GPU's).")] = None,
    nvlink_bandwidth: Annotated[str | None, typer.Option("--nvlink-bandwidth", help="Nominal NVLink rate per GPU "
                                                         "per direction (default: the GPU's).")] = None,
    rail_bandwidth: Annotated[str | None, typer.Option("--rail-bandwidth", help="Nominal NIC rate per GPU "
                                                       "(the server's NICs / its GPUs; default: the GPU's).")] = None,
    nics_per_server: Annotated[int | None, typer.Option("--nics-per-server", help="NICs per server as NCCL sees "
                                                        "them (default: one per GPU); sets the ring's channels "
                                                        "across servers.")] = None,
    nvls: Annotated[bool | None, typer.Option("--nvls/--no-nvls", help="NVSwitch multicast (NVLS) available "
                                              "(default: on for Hopper and Blackwell).")] = None,
    collnet: Annotated[bool, typer.Option("--collnet", help="The network reduces (SHARP, CollNet).")] = False,
    latency: Latency = LATENCY_DEFAULT,
    shape: Shape = None,
    gpus_per_server: GpusPerServer = GPUS_PER_SERVER,
    hosts_per_leaf: HostsPerLeaf = HOSTS_PER_LEAF,
    oversubscription: Oversubscription = 1.0,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for calibration.yaml (a scenario fragment), "
                                          "calibration.json and calibration.png.")] = Path("out/calibrate"),
    fmt: FigureFormat = "png",
    as_json: JsonOut = False,
):
    """Fit NCCL's cost model to an nccl-tests log: per size NCCL picks an algorithm (ring, tree, NVLS, CollNet)
    and a protocol (LL, LL128, Simple), each with its own latency and bandwidth; the fit corrects the base latency
    per protocol, the per-hop latency and the bandwidth of NVLink and of the NICs, and the protocol efficiencies,
    by least squares on relative error, re-picking algorithm and protocol per size. It prints the fit, the picks
    and the residuals, warns when the rms error is above 10% or a fitted bandwidth above the nominal rate, writes
    the parameters as a scenario fragment and plots measured vs model. --model engine fits alpha (per step),
    latency (per hop) and bandwidth of one lightrail schedule (--algo) on --topology instead; --latency is held
    when the data cannot separate it from alpha."""
    from lightrail.report.calibrate import print_calibration, write_calibration

    fmt = figure_suffix(fmt)
    cal = fit_log(file, ranks=ranks, topology=topology, algo=algo, op=op, model=model, gpu=gpu, arch=arch,
                  nvlink_bandwidth=nvlink_bandwidth, rail_bandwidth=rail_bandwidth, nics_per_server=nics_per_server,
                  nvls=nvls, collnet=collnet, latency=latency, shape=shape, gpus_per_server=gpus_per_server,
                  hosts_per_leaf=hosts_per_leaf, oversubscription=oversubscription)
    writes = not as_json or given_on_command_line("out_dir")
    written = write_calibration(cal, out_dir, file.name, fmt=fmt) if writes else []
    if as_json:
        print_json(cal.to_dict())
    else:
        print_calibration(cal, out, written)
