"""Options and parsers shared by the verbs: units, lists and ranges, the fabric, the scenario."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lightrail.cli.app import err
from lightrail.collectives import Kind
from lightrail.control.plan import Mode
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import TOPOLOGIES, build_topology
from lightrail.units import format_time, parse_rate, parse_size, parse_time

Op = Annotated[str, typer.Option("--op", help="Collective: " + ", ".join(k.value for k in Kind) + ".")]
Ranks = Annotated[int, typer.Option("--ranks", "-n", help="Number of ranks (GPUs), 2 or more.")]
TopologyOpt = Annotated[str, typer.Option("--topology", "-t", help="Fabric: " + ", ".join(TOPOLOGIES) + ".")]
Bandwidth = Annotated[str, typer.Option("--bandwidth", help="Per-GPU network link rate, e.g. 400Gbps or 50GBps.")]
Latency = Annotated[str, typer.Option("--latency", help="Latency per hop (link), e.g. 1us.")]
Alpha = Annotated[str, typer.Option("--alpha", help="Start-up cost per step, e.g. 3us.")]
Shape = Annotated[str | None, typer.Option("--shape", help="Torus sides, e.g. 32x32 (default: most square).")]
GpusPerServer = Annotated[int, typer.Option("--gpus-per-server",
                                            help="Servers' NVLink domain size (rails, hierarchical).")]
NvlinkBandwidth = Annotated[str, typer.Option("--nvlink-bandwidth", help="NVLink rate per GPU per direction (rails).")]
HostsPerLeaf = Annotated[int, typer.Option("--hosts-per-leaf", help="GPUs per leaf switch (fat-tree).")]
Oversubscription = Annotated[float, typer.Option("--oversubscription", help="Leaf down:up capacity ratio (fat-tree).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]
OcsDelay = Annotated[str, typer.Option("--ocs-delay", help="OCS (circuit switch) reconfiguration delay, e.g. 10ms.")]
OcsDelays = Annotated[str, typer.Option("--ocs-delays", help="Comma list of OCS reconfiguration delays.")]
StragglerDelay = Annotated[str, typer.Option("--straggler-delay", help="How late the straggler arrives, e.g. 5ms.")]
StragglerDelays = Annotated[str, typer.Option("--straggler-delays", help="Comma list of straggler delays.")]


def old_spelling(flag: str, new: str) -> typer.models.OptionInfo:
    """A hidden option for a flag's old spelling, so yesterday's commands keep working (see :func:`renamed`)."""
    return typer.Option(flag, hidden=True, help=f"Old spelling of {new}.", show_default=False)


def renamed(value, old_value, *, old: str, new: str):
    """The value of a renamed flag: the new spelling's, or the old one's with a note on stderr.

    Give the old spelling a ``None`` default (:func:`old_spelling`); both on one command line is an error."""
    if old_value is None:
        return value
    ctx = click.get_current_context(silent=True)
    name = new.lstrip("-").replace("-", "_")
    if ctx is not None and ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE:
        raise ScenarioError(f"{old} and {new} are one flag, given twice", field=new, fix=f"drop {old}")
    err.print(f"note: {old} is now {new}", highlight=False)
    return old_value


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sides = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise ScenarioError(f"cannot read {text!r} as torus sides", field="--shape",
                            fix="write e.g. 32x32 or 16x8x8") from None
    if any(s < 1 for s in sides):
        raise ScenarioError(f"torus sides must be positive, got {text!r}", field="--shape")
    return sides


def build_fabric(topology: str, ranks: int, bandwidth: str, latency: str, shape: str | None, gpus_per_server: int,
            nvlink_bandwidth: str, hosts_per_leaf: int, oversubscription: float):
    if ranks < 2:
        raise ScenarioError(f"{ranks} ranks is too few", field="--ranks", fix="use 2 or more ranks")
    if gpus_per_server < 1 or hosts_per_leaf < 1:
        field = "--gpus-per-server" if gpus_per_server < 1 else "--hosts-per-leaf"
        raise ScenarioError("must be at least 1", field=field)
    return build_topology(topology, ranks, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                          latency=parse_time(latency, field="--latency"), shape=parse_shape(shape),
                          gpus_per_server=gpus_per_server,
                          nvlink_bandwidth=parse_rate(nvlink_bandwidth, field="--nvlink-bandwidth"),
                          hosts_per_leaf=hosts_per_leaf, oversubscription=oversubscription)


def parse_sizes(text: str) -> list[float]:
    """``1KiB..4GiB`` (powers of two in between) or a comma list ``1MiB,64MiB``."""
    if ".." in text:
        lo_text, hi_text = text.split("..", 1)
        lo, hi = parse_size(lo_text, field="--sizes"), parse_size(hi_text, field="--sizes")
        if not 0 < lo <= hi:
            raise ScenarioError(f"{text!r} is not an increasing range", field="--sizes",
                                fix="write e.g. 1KiB..4GiB")
        return [lo * 2**k for k in range(int(math.floor(math.log2(hi / lo) + 1e-9)) + 1)]
    sizes = [parse_size(s, field="--sizes") for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) <= 0:
        raise ScenarioError(f"{text!r} lists no positive size", field="--sizes",
                            fix="write e.g. 1KiB..4GiB or 1MiB,1GiB")
    return sorted(sizes)


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


Scenario = Annotated[Path | None, typer.Argument(help="Scenario file (.yaml/.json); default: the embedded "
                                                      "Llama-3 70B on 2,048 H200 scenario.", show_default=False)]
Delay = Annotated[str | None, typer.Option("--delay", help="Override the OCS reconfiguration delay, e.g. 25ms.")]
ModeOpt = Annotated[str | None, typer.Option("--mode", help="Override the OCS mode: on-demand or provisioned.")]


def built_scenario(scenario: Path | None, delay: str | None = None, mode: str | None = None):
    from dataclasses import replace

    from lightrail.scenario import load_scenario

    loaded, base = load_scenario(scenario)
    built = loaded.build(base)
    if delay is not None:
        built = replace(built, fabric=replace(built.fabric, reconfig_delay=parse_time(delay, field="--delay")))
    if mode is not None:
        built = replace(built, params=replace(built.params, mode=Mode.parse(mode, field="--mode")))
    return built


def signed_time(seconds: float) -> str:
    if abs(seconds) < 5e-10:
        return "0"
    return ("-" if seconds < 0 else "+") + format_time(abs(seconds))


def progress_bar(total: int, label: str, quiet: bool):
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True, disable=quiet or not err.is_terminal)
    return progress, progress.add_task(label, total=total)


def parse_rank_range(text: str) -> list[int]:
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            ranks = list(range(lo, hi + 1))
        else:
            ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ScenarioError(f"cannot read {text!r} as rank counts", field="--ranks",
                            fix="e.g. 8, 2..64 or 4,8,16") from None
    if not ranks or min(ranks) < 2:
        raise ScenarioError(f"{text!r}: rank counts must be 2 or more", field="--ranks", fix="e.g. 2..64")
    return ranks


def parse_kind(op: str) -> Kind:
    from lightrail.collectives.registry import _parse_kind

    return _parse_kind(op)
