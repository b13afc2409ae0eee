"""``lightrail collective``, ``collective-sweep``, ``algorithms``: one collective on a fabric."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import (
    ALPHA_DEFAULT,
    EXPLICIT_BYTES_PER_RANK2,
    LATENCY_DEFAULT,
    NIC_DEFAULT,
    NVLINK_DEFAULT,
    Alpha,
    Bandwidth,
    FigureFormat,
    GpusPerServer,
    HostsPerLeaf,
    JsonOut,
    KindOpt,
    Latency,
    NvlinkBandwidth,
    OcsDelay,
    Oversubscription,
    Ports,
    Propagation,
    Ranks,
    Shape,
    Sizes,
    TopologyOpt,
    build_fabric,
    build_reconfigurable_fabric,
    check_collective_size,
    check_fits,
    check_out,
    check_ranks,
    figure_suffix,
    memory_budget,
    old_spelling,
    parse_kind,
    parse_sizes,
    renamed,
    result_out,
)
from lightrail.cli.output import print_json, progress_steps, save_result, writes_files
from lightrail.defaults import GPUS_PER_SERVER, HOSTS_PER_LEAF
from lightrail.errors import ScenarioError
from lightrail.units import parse_rate, parse_size, parse_time


@app.command("collective")
@friendly
def collective_cmd(
    op: KindOpt = "allreduce",
    algo: Annotated[str, typer.Option("--algo", "-a", help="Algorithm name; see `lightrail algorithms`.")] = "ring",
    ranks: Ranks = 64,
    size: Annotated[str, typer.Option("--size", "-s", help="Buffer size per rank, e.g. 1GiB.")] = "1GiB",
    topology: TopologyOpt = "switch",
    bandwidth: Bandwidth = NIC_DEFAULT,
    latency: Latency = LATENCY_DEFAULT,
    alpha: Alpha = ALPHA_DEFAULT,
    shape: Shape = None,
    gpus_per_server: GpusPerServer = GPUS_PER_SERVER,
    nvlink_bandwidth: NvlinkBandwidth = NVLINK_DEFAULT,
    hosts_per_leaf: HostsPerLeaf = HOSTS_PER_LEAF,
    oversubscription: Oversubscription = 1.0,
    root: Annotated[int, typer.Option("--root", help="Root rank (broadcast, reduce).")] = 0,
    pipeline: Annotated[int, typer.Option("--pipeline", help="Chunks per tree (double-binary-tree).")] = 1,
    splits: Annotated[int, typer.Option("--splits", help="Cut the buffer into K chunks that run the whole "
                                        "algorithm one after another: K x the time of size/K (ASTRA-sim's "
                                        "preferred-dataset-splits, one active chunk).")] = 1,
    reconfigurable: Annotated[bool, typer.Option("--reconfigurable", help="Plan on a reconfigurable circuit "
                                                 "fabric instead of --topology (see --ports-per-gpu, --ocs-delay).")]
    = False,
    ports: Ports = 2,
    ocs_delay: OcsDelay = "10us",
    old_reconfig_delay: Annotated[str | None, old_spelling("--reconfig-delay", "--ocs-delay")] = None,
    base: Annotated[str, typer.Option("--base", help="Static links under the circuits: none, ring, torus.")]
    = "none",
    propagation: Propagation = "0",
    out_dir: Annotated[Path | None, result_out("collective.json")] = None,
    as_json: JsonOut = False,
):
    """Simulate one collective: time, algorithm and bus bandwidth, steps, and the verifier's proof;
    with --reconfigurable, the exact reconfiguration plan on a circuit fabric."""
    from lightrail.collectives import get
    from lightrail.studies.collective import evaluate, reconfigurable_collective

    ocs_delay = renamed(ocs_delay, old_reconfig_delay, old="--reconfig-delay", new="--ocs-delay")
    algorithm = get(op, algo)  # validates --op and --algo first
    nbytes = parse_size(size, field="--size")
    check_ranks(ranks)
    if not 0 <= root < ranks:
        raise ScenarioError(f"root {root} is not a rank of {ranks}", field="--root", fix=f"use 0..{ranks - 1}")
    if pipeline < 1:
        raise ScenarioError("must be at least 1", field="--pipeline")
    check_splits(splits, nbytes, reconfigurable=reconfigurable)
    check_collective_size(algorithm.kind, algo, ranks, pipeline=pipeline)
    if reconfigurable:  # the exact plan holds the explicit schedule, compressed form or not
        check_fits(EXPLICIT_BYTES_PER_RANK2 * ranks**2, field="--ranks", value=f"a plan on {ranks} ranks",
                   fix=f"use at most {int((memory_budget() / EXPLICIT_BYTES_PER_RANK2) ** 0.5):,} ranks with "
                       "--reconfigurable")
    params = {"gpus_per_server": gpus_per_server, "root": root, "pipeline": pipeline}
    if reconfigurable:
        fabric = build_reconfigurable_fabric(ranks, ports=ports, base=base, bandwidth=bandwidth, latency=latency,
                                             alpha=alpha, propagation=propagation, ocs_delay=ocs_delay)
        result = reconfigurable_collective(algorithm.kind, algo, nbytes, fabric, **params)
    else:
        fabric = build_fabric(topology, ranks, bandwidth, latency, shape, gpus_per_server, nvlink_bandwidth,
                              hosts_per_leaf, oversubscription)
        result = in_splits(evaluate(algorithm.kind, algo, ranks, nbytes / splits, fabric,
                                    alpha=parse_time(alpha, field="--alpha"), **params), nbytes, splits)
    data = {**result.to_dict(), "splits": splits}
    save_result(out_dir, "collective.json", data, quiet=as_json)
    if as_json:
        print_json(data)  # no table: rich is not imported
    else:
        from lightrail.report.collective import print_collective, print_reconfigurable

        (print_reconfigurable if reconfigurable else print_collective)(result, out)


def check_splits(splits: int, nbytes: float, *, reconfigurable: bool = False) -> None:
    """Refuse a ``--splits`` that is not 1 or more, cuts chunks below a byte, or meets ``--reconfigurable``."""
    if splits < 1:
        raise ScenarioError(f"{splits} is not a number of chunks", field="--splits",
                            fix="use 1 (the whole buffer at once) or more")
    if splits > max(1.0, nbytes):
        raise ScenarioError(f"{splits:,} chunks of a {nbytes:,.0f}-byte buffer are under a byte each",
                            field="--splits", fix=f"use at most {max(1, int(nbytes)):,}")
    if splits > 1 and reconfigurable:
        raise ScenarioError("--splits times a fixed --topology; the reconfiguration plan takes the whole buffer",
                            field="--splits", fix="drop --splits or --reconfigurable")


def in_splits(result, size: float, splits: int):
    """``result``, one chunk of ``size / splits`` bytes, as the whole buffer run in ``splits`` chunks one after
    another: ``splits`` x its time and steps, bandwidths of ``size``. The same number as
    ``Engine.time(schedule, size, splits=splits)`` (tests/test_splits.py checks it)."""
    if splits == 1:
        return result
    from dataclasses import replace

    from lightrail.collectives import bus_factor

    time_s = splits * result.time_s
    algbw = size / time_s if time_s > 0 else float("inf")
    return replace(result, schedule=f"{result.schedule} in {splits} chunks", size_bytes=float(size), time_s=time_s,
                   steps=splits * result.steps, algbw_Bps=algbw, busbw_Bps=algbw * bus_factor(result.op, result.ranks))


@app.command("algorithms")
@friendly
def algorithms_cmd(
    op: Annotated[str | None, typer.Option("--op", help="Only this collective.")] = None,
    as_json: JsonOut = False,
):
    """List the collective algorithms lightrail can generate and verify."""
    list_algorithms(op, as_json=as_json)


def list_algorithms(op: str | None = None, *, as_json: bool = False) -> None:
    """``lightrail algorithms``: also called straight from ``main`` for the bare verb, before Typer builds
    its command tree and imports pydantic to coerce the flags (~0.13 s of a 0.27 s run)."""
    from lightrail.catalog import listing  # the registry's entries, read without importing numpy
    from lightrail.catalog import parse_kind as kind_of
    from lightrail.report.collective import algorithm_rows, print_algorithms

    listed = listing(kind_of(op, field="--op")) if op else listing()
    if as_json:
        print_json({"algorithms": algorithm_rows(listed)})
    else:
        print_algorithms(listed, out)


@app.command("collective-sweep")
@friendly
def collective_sweep_cmd(
    op: KindOpt = "allreduce",
    ranks: Ranks = 64,
    sizes: Sizes = "1KiB..4GiB",
    topology: TopologyOpt = "rails",
    bandwidth: Bandwidth = NIC_DEFAULT,
    latency: Latency = LATENCY_DEFAULT,
    alpha: Alpha = ALPHA_DEFAULT,
    shape: Shape = None,
    gpus_per_server: GpusPerServer = GPUS_PER_SERVER,
    nvlink_bandwidth: NvlinkBandwidth = NVLINK_DEFAULT,
    hosts_per_leaf: HostsPerLeaf = HOSTS_PER_LEAF,
    oversubscription: Oversubscription = 1.0,
    algo: Annotated[list[str] | None, typer.Option("--algo", "-a", help="Only these algorithms (repeatable).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the sweep's JSON, CSV and PNG plot.")]
    = Path("out/sweep"),
    fmt: FigureFormat = "png",
    as_json: JsonOut = False,
):
    """Compare every algorithm of an op over message sizes: table, JSON, CSV and a PNG plot."""
    from lightrail.collectives import algorithms, get
    from lightrail.report.collective import print_collective_sweep, write_collective_sweep
    from lightrail.studies.collective import collective_sweep

    check_out(out_dir if writes_files(as_json) else None)
    fmt = figure_suffix(fmt)
    listed = [get(op, a) for a in algo] if algo else algorithms(parse_kind(op))
    kind = listed[0].kind if listed else parse_kind(op)
    size_list = parse_sizes(sizes)
    check_ranks(ranks)
    for a in listed:
        check_collective_size(a.kind, a.name, ranks)
    fabric = build_fabric(topology, ranks, bandwidth, latency, shape, gpus_per_server, nvlink_bandwidth,
                          hosts_per_leaf, oversubscription)
    with progress_steps(len(listed), f"{kind} on {fabric.name}", as_json) as step:
        result = collective_sweep(kind, ranks, size_list, fabric, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                                  latency=parse_time(latency, field="--latency"),
                                  alpha=parse_time(alpha, field="--alpha"), names=[a.name for a in listed],
                                  progress=lambda name: step(f"{kind}: {name}"),
                                  gpus_per_server=gpus_per_server)
    if writes_files(as_json):
        write_collective_sweep(result, out_dir, fmt=fmt)
    if as_json:
        print_json(result.to_dict())
    else:
        print_collective_sweep(result, out, out_dir, fmt=fmt)
