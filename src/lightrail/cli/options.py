"""Options and parsers shared by the verbs: units, lists and ranges, the fabric, the scenario.

Every parser names the flag it reads in its errors, so a bad value exits 2 saying which flag to fix.
This module's top level stays cheap (typer and ``lightrail.defaults``, no numpy): every verb imports it
when the CLI starts, so parsers that need the library import it inside themselves.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from lightrail.cli.app import err, given_on_command_line
from lightrail.defaults import ALPHA, HOP_LATENCY, NIC_BANDWIDTH, NVLINK_BANDWIDTH, TOPOLOGIES, Kind, Mode
from lightrail.errors import ScenarioError, UnsupportedError
from lightrail.units import format_time, parse_rate, parse_size, parse_time

if TYPE_CHECKING:
    from lightrail.fabric.params import ReconfigurableFabric

KindOpt = Annotated[str, typer.Option("--op", help="Collective: " + ", ".join(k.value for k in Kind) + ".")]
Ranks = Annotated[int, typer.Option("--ranks", "-n", help="Number of ranks (GPUs), 2 or more.")]
TopologyOpt = Annotated[str, typer.Option("--topology", "-t", help="Fabric: " + ", ".join(TOPOLOGIES) + ".")]
Bandwidth = Annotated[str, typer.Option("--bandwidth", help="Per-GPU network link rate, e.g. 400Gbps or 50GBps.")]
Latency = Annotated[str, typer.Option("--latency", help="Latency per hop (link), e.g. 1us.")]
Alpha = Annotated[str, typer.Option("--alpha", help="Start-up cost per step, e.g. 3us.")]
LATENCY_DEFAULT = format_time(HOP_LATENCY)
"""``--latency``'s default, the fabric's (``defaults.HOP_LATENCY``)."""
NIC_DEFAULT = f"{NIC_BANDWIDTH * 8 / 1e9:g}Gbps"
"""``--bandwidth``'s default for fabrics of NICs (``defaults.NIC_BANDWIDTH``)."""
NVLINK_DEFAULT = f"{NVLINK_BANDWIDTH / 1e9:g}GBps"
"""``--nvlink-bandwidth``'s default and StragglAR's NVSwitch-style link rate (``defaults.NVLINK_BANDWIDTH``)."""
ALPHA_DEFAULT = format_time(ALPHA)
"""``--alpha``'s default, the fabric's (``defaults.ALPHA``)."""
Shape = Annotated[str | None, typer.Option("--shape", help="Torus sides, e.g. 32x32 (default: most square).")]
GpusPerServer = Annotated[int, typer.Option("--gpus-per-server",
                                            help="Servers' NVLink domain size (rails, hierarchical).")]
NvlinkBandwidth = Annotated[str, typer.Option("--nvlink-bandwidth", help="NVLink rate per GPU per direction (rails).")]
HostsPerLeaf = Annotated[int, typer.Option("--hosts-per-leaf", help="GPUs per leaf switch (fat-tree).")]
Oversubscription = Annotated[float, typer.Option("--oversubscription", help="Leaf down:up capacity ratio (fat-tree).")]
Sizes = Annotated[str, typer.Option("--sizes", help="1KiB..4GiB (powers of two) or a comma list.")]
Ports = Annotated[int, typer.Option("--ports", help="Optical ports per GPU (reconfigurable fabric).")]
Propagation = Annotated[str, typer.Option("--propagation", help="Fibre delay per circuit hop.")]
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
    if given_on_command_line(new.lstrip("-").replace("-", "_")):
        raise ScenarioError(f"{old} and {new} are one flag, given twice", field=new, fix=f"drop {old}")
    err.print(f"note: {old} is now {new}", highlight=False)
    return old_value


# ---- numbers, lists and ranges ------------------------------------------------------------------------------

T = TypeVar("T", int, float)


def check_ranks(n: int, *, field: str = "--ranks") -> int:
    """The one rank-count check: a collective needs two ranks or more."""
    if n < 2:
        raise ScenarioError(f"{n} ranks is too few", field=field, fix="use 2 or more ranks")
    return n


def _list_or_range(text: str, read: Callable[[str], T], *, field: str, fix: str, doubling: bool) -> list[T]:
    """``lo..hi`` or a comma list, each item read by ``read``; a range steps by one, or doubles from ``lo``."""
    if ".." in text:
        lo, hi = (read(x.strip()) for x in text.split("..", 1))
        if not 0 < lo <= hi:
            raise ScenarioError(f"{text!r} is not an increasing range", field=field, fix=fix)
        if doubling:
            return [lo * 2**k for k in range(int(math.floor(math.log2(hi / lo) + 1e-9)) + 1)]
        return list(range(lo, hi + 1))
    values = [read(x.strip()) for x in text.split(",") if x.strip()]
    if not values:
        raise ScenarioError(f"{text!r} lists nothing", field=field, fix=fix)
    return values


def _whole(field: str, what: str, fix: str) -> Callable[[str], int]:
    def read(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ScenarioError(f"cannot read {text!r} as {what}", field=field, fix=fix) from None

    return read


def parse_rank_range(text: str, *, field: str = "--ranks") -> list[int]:
    """Rank counts: ``8``, ``2..64`` (every count in between) or ``4,8,16``; each 2 or more."""
    fix = "e.g. 8, 2..64 or 4,8,16"
    ranks = _list_or_range(text, _whole(field, "a rank count", fix), field=field, fix=fix, doubling=False)
    for n in ranks:
        check_ranks(n, field=field)
    return ranks


def parse_gpu_counts(text: str, *, field: str = "--gpus") -> list[int]:
    """Cluster sizes: ``256..16384`` (powers of two times 256) or ``1024,2048``."""
    fix = "e.g. 256..16384 or 1024,2048"
    counts = _list_or_range(text, _whole(field, "a GPU count", fix), field=field, fix=fix, doubling=True)
    if min(counts) < 2:
        raise ScenarioError(f"{text!r}: a cluster needs 2 GPUs or more", field=field, fix=fix)
    return counts


def parse_sizes(text: str, *, field: str = "--sizes") -> list[float]:
    """``1KiB..4GiB`` (powers of two in between) or a comma list ``1MiB,64MiB``, smallest first."""
    fix = "write e.g. 1KiB..4GiB or 1MiB,1GiB"
    sizes = _list_or_range(text, lambda s: parse_size(s, field=field), field=field, fix=fix, doubling=True)
    if min(sizes) <= 0:
        raise ScenarioError(f"{text!r} lists no positive size", field=field, fix=fix)
    return sorted(sizes)


def parse_times(text: str, field: str) -> list[float]:
    """A comma list of times, ``0,10ms,1s``, in the order given."""
    times = [parse_time(t, field=field) for t in text.split(",") if t.strip()]
    if not times:
        raise ScenarioError(f"{text!r} lists no time", field=field, fix="e.g. 0,10ms,100ms")
    return times


def parse_kind(text: str, *, field: str = "--op") -> Kind:
    """A collective's name (the registry's :func:`~lightrail.collectives.parse_kind`), errors naming ``field``."""
    from lightrail import collectives

    try:
        return collectives.parse_kind(text)
    except UnsupportedError as e:
        e.field = field
        raise


def parse_mode(text: str, *, field: str = "--mode") -> Mode:
    """``on-demand`` or ``provisioned``; the old ``on_demand`` is read with a note."""
    mode = Mode.parse(text, field=field)
    if text != mode.value:
        err.print(f"note: {field} {text} is now {field} {mode.value}", highlight=False)
    return mode


def parse_kinds(text: str, *, field: str = "--ops") -> list[Kind]:
    kinds = [parse_kind(o.strip(), field=field) for o in text.split(",") if o.strip()]
    if not kinds:
        raise ScenarioError(f"{text!r} lists no collective", field=field, fix="e.g. allreduce,alltoall")
    return kinds


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


# ---- fabrics and scenarios ----------------------------------------------------------------------------------

def build_fabric(topology: str, ranks: int, bandwidth: str, latency: str, shape: str | None, gpus_per_server: int,
                 nvlink_bandwidth: str, hosts_per_leaf: int, oversubscription: float):
    """A static fabric from the shared fabric flags."""
    from lightrail.fabric.builders import build_topology

    check_ranks(ranks)
    if gpus_per_server < 1 or hosts_per_leaf < 1:
        field = "--gpus-per-server" if gpus_per_server < 1 else "--hosts-per-leaf"
        raise ScenarioError("must be at least 1", field=field)
    return build_topology(topology, ranks, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                          latency=parse_time(latency, field="--latency"), shape=parse_shape(shape),
                          gpus_per_server=gpus_per_server,
                          nvlink_bandwidth=parse_rate(nvlink_bandwidth, field="--nvlink-bandwidth"),
                          hosts_per_leaf=hosts_per_leaf, oversubscription=oversubscription)


def build_reconfigurable_fabric(ranks: int, *, ports: int, base: str, bandwidth: str, latency: str, alpha: str,
                                propagation: str, ocs_delay: str) -> ReconfigurableFabric:
    """A circuit fabric (``ports`` optical ports per GPU over a static ``base``) from the flags."""
    from lightrail.fabric.params import ReconfigurableFabric

    delay = parse_time(ocs_delay, field="--ocs-delay")
    return ReconfigurableFabric(n=check_ranks(ranks), ports=ports, base=base,
                                bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                                latency=parse_time(latency, field="--latency"),
                                propagation=parse_time(propagation, field="--propagation"), reconfig_delay=delay,
                                alpha=parse_time(alpha, field="--alpha"))


Scenario = Annotated[Path | None, typer.Argument(help="Scenario file (.yaml/.json); default: the embedded "
                                                      "Llama-3 70B on 2,048 H200 scenario.", show_default=False)]
OcsDelayOverride = Annotated[str | None, typer.Option("--ocs-delay", help="Override the scenario's OCS "
                                                      "reconfiguration delay, e.g. 25ms.")]
ModeOpt = Annotated[str | None, typer.Option("--mode", help="Override the OCS mode: on-demand or provisioned.")]


def built_scenario(scenario: Path | None, ocs_delay: str | None = None, mode: str | None = None):
    """Load and build a scenario file (None: the embedded default), then apply --ocs-delay and --mode."""
    from dataclasses import replace

    from lightrail.scenario import load_scenario

    loaded, base = load_scenario(scenario)
    built = loaded.build(base)
    if ocs_delay is not None:
        built = replace(built, fabric=replace(built.fabric, reconfig_delay=parse_time(ocs_delay, field="--ocs-delay")))
    if mode is not None:
        built = replace(built, params=replace(built.params, mode=parse_mode(mode)))
    return built


# ---- output to the terminal ---------------------------------------------------------------------------------

def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def progress_bar(total: int, label: str, quiet: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True, disable=quiet or not err.is_terminal)
    return progress, progress.add_task(label, total=total)


@contextmanager
def progress_steps(total: int, label: str, quiet: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr for ``total`` steps; yields ``step(description)``, the ``progress`` callback
    the studies take (one call per finished step)."""
    progress, task = progress_bar(total, label, quiet)
    with progress:
        yield lambda description: progress.update(task, advance=1, description=description)
