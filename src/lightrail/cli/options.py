"""Options and parsers shared by the verbs: units, lists and ranges, bounds, the fabric, the scenario.

Every parser names the flag it reads in its errors, so a bad value exits 2 saying which flag to fix.
This module's top level stays cheap (typer and ``lightrail.defaults``, no numpy): every verb imports it
when the CLI starts, so parsers that need the library import it inside themselves. What the verbs print
and write (``--json``, ``--out``, ``--html``, progress bars) is :mod:`lightrail.cli.output`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from lightrail.cli.app import err, given_on_command_line
from lightrail.defaults import ALPHA, HOP_LATENCY, NIC_BANDWIDTH, NVLINK_BANDWIDTH, TOPOLOGIES, Kind, Mode
from lightrail.errors import ScenarioError, UnsupportedError
from lightrail.limits import (
    MAX_RANGE,
    MAX_VALUES,
    check_count,
    check_fits,
    check_values,
    memory_budget,
    range_values,
)
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
Ports = Annotated[int, typer.Option("--ports-per-gpu", "--ports", help="Optical ports per GPU (reconfigurable "
                                    "fabric; --ports is its old name: on controller serve and pipswitch --ports "
                                    "counts a switch's ports).")]
Propagation = Annotated[str, typer.Option("--propagation", help="Fibre delay per circuit hop.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table; writes no "
                                                    "files unless --out is given.")]
HtmlOut = Annotated[bool, typer.Option("--html", help="Also write report.html in the --out folder: one "
                                                      "self-contained page (interactive figures, tables, "
                                                      "scenario) that opens offline.")]
FigureFormat = Annotated[str, typer.Option("--format", help="Static figures as png, svg or pdf.")]
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


def _list_or_range(text: str, read: Callable[[str], T], *, field: str, fix: str, doubling: bool,
                   limit: int = MAX_VALUES) -> list[T]:
    """``lo..hi`` or a comma list, each item read by ``read``; a range steps by one (at most
    :data:`~lightrail.limits.MAX_RANGE` values) or doubles from ``lo``; a list, or a doubling range, holds at most
    ``limit`` values. Every count is checked before the list is made (``lightrail.limits``)."""
    if ".." in text:
        lo, hi = (read(x.strip()) for x in text.split("..", 1))
        if not 0 < lo <= hi or (isinstance(hi, float) and not math.isfinite(hi)):
            raise ScenarioError(f"{text!r} is not an increasing range", field=field, fix=fix)
        if doubling:
            count = int(math.floor(math.log2(hi) - math.log2(lo) + 1e-9)) + 1  # log2 of each: ints may be huge
            check_values(count, field=field, limit=limit, what="values in the range")
            return [lo * 2**k for k in range(count)]
        return list(range_values(lo, hi, field=field, fix=fix))
    items = [x.strip() for x in text.split(",") if x.strip()]
    check_values(len(items), field=field, limit=limit)
    values = [read(x) for x in items]
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
    ranks = _list_or_range(text, _whole(field, "a rank count", fix), field=field, fix=fix, doubling=False,
                           limit=MAX_RANGE)
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
    """A comma list of times, ``0,10ms,1s``, in the order given; at most :data:`~lightrail.limits.MAX_VALUES`."""
    items = [t for t in text.split(",") if t.strip()]
    check_values(len(items), field=field, what="times")
    times = [parse_time(t, field=field) for t in items]
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


# ---- bounds: checked before any work, so a request this machine cannot hold is refused up front ---------------

MAX_RANKS = 65_536
"""Most ranks a collective verb models: the largest fabric the compressed schedules are proven and timed on
(halving-doubling on a 65,536-port switch, tests/collectives); ring at 65,536 ranks takes ~2 s and 30 MB."""
EXPLICIT_BYTES_PER_RANK2 = 700
"""Peak bytes per rank² of an exact reconfiguration plan, or of an explicit schedule whose size cannot be
extrapolated: measured with ru_maxrss, 673 MiB for StragglAR at 1,024 ranks, the largest of the registry
(Bruck all-to-all 432 MiB, hierarchical 346 MiB)."""
BYTES_PER_TRANSFER = 350
"""Peak bytes per transfer of an explicit schedule (held, proven and timed): StragglAR at 1,024 ranks holds
2.1 M transfers in 673 MiB (ru_maxrss), the most per transfer in the registry (hierarchical 165, Bruck 100)."""
BYTES_PER_RANK = 2048
"""Peak bytes per rank of a schedule with few transfers (binomial and double binary trees: ~2 MB at 1,024)."""
FAT_TREE_BYTES_PER_RANK2 = 4
"""Peak bytes per rank² of a collective on a fat-tree (3.6 measured at 16,384 hosts, ru_maxrss)."""
BYTES_PER_RANK_CHUNK = 700
"""Peak bytes per rank x pipeline chunk of a pipelined tree: 4.2 GB for double-binary-tree at 64 ranks x
100,000 chunks (measured, ru_maxrss)."""


def check_collective_size(kind, name: str, n: int, *, pipeline: int = 1, field: str = "--ranks") -> None:
    """Refuse a collective whose schedule this machine cannot hold, before it is built: at most
    :data:`MAX_RANKS`; algorithms without a compressed form hold ~n² transfers (pipelined trees n x chunks)."""
    from lightrail.collectives import get
    from lightrail.collectives.compressed import compressed_builder

    check_count(n, field=field, lo=2, hi=MAX_RANKS, what="ranks")
    algorithm = get(kind, name)
    if not algorithm.supports(n):
        return  # refused (or skipped by a sweep) by the algorithm itself, before anything is built
    if "pipeline" in algorithm.parameters:
        limit = memory_budget() // (BYTES_PER_RANK_CHUNK * n)
        check_count(pipeline, field="--pipeline", hi=max(1, limit), what=f"chunks on {n} ranks")
        return
    if compressed_builder(algorithm.kind, algorithm.name) is not None and algorithm.supports(n):
        from lightrail.collectives.compressed import compressed_form

        if compressed_form(algorithm.kind, algorithm.name, n) is not None:
            return
    need, most = _explicit_bytes(algorithm, n)
    check_fits(need, field=field, value=f"{algorithm.kind} {algorithm.name} on {n} ranks",
               fix=f"use at most {most:,} ranks for {algorithm.name} (its schedule is held whole), or an algorithm "
                   "with a compressed form (e.g. ring)")


def _explicit_bytes(algorithm, n: int) -> tuple[float, int]:
    """Peak bytes of ``algorithm``'s explicit schedule at ``n`` ranks, and the most ranks the budget holds:
    :data:`BYTES_PER_TRANSFER` per transfer plus :data:`BYTES_PER_RANK`, the transfer count extrapolated from
    the schedules at 256 and 512 ranks (milliseconds to build); :data:`EXPLICIT_BYTES_PER_RANK2` x n² for an
    algorithm that builds at neither."""
    import math

    from lightrail.errors import LightrailError

    try:
        t1, t2 = (sum(len(step.src) for step in algorithm(m).steps) for m in (256, 512))
    except (LightrailError, AttributeError):
        t1 = t2 = 0
    budget = memory_budget()
    if not (t1 > 0 and t2 > 0):
        return EXPLICIT_BYTES_PER_RANK2 * n * n, int((budget / EXPLICIT_BYTES_PER_RANK2) ** 0.5)
    growth = max(1.0, math.log2(t2 / t1))

    def need(m: float) -> float:
        return BYTES_PER_TRANSFER * t2 * (m / 512) ** growth + BYTES_PER_RANK * m

    most = int(512 * (budget / (BYTES_PER_TRANSFER * t2)) ** (1 / growth))  # the transfers alone fill the budget
    while most > 2 and need(most) > budget:
        most = int(most * 0.99)
    return need(n), min(most, MAX_RANKS)


STRAGGLAR_WORK = 2**24
"""Most work of a StragglAR synthesis request, as the sum of n² over its rank counts: the greedy phase 2 costs
~n² (measured here: 9 s at n = 1,000, 33 s and 0.67 GB at n = 3,000), so 2^24 (one n = 4,096) is minutes,
not hours."""


def check_stragglar_work(ranks: list[int], *, field: str = "--ranks", repeat: int = 1) -> None:
    """Refuse StragglAR synthesis beyond :data:`STRAGGLAR_WORK` (``repeat``: times each n is synthesised)."""
    work = repeat * sum(n * n for n in ranks)
    if work > STRAGGLAR_WORK:
        most = int(STRAGGLAR_WORK**0.5)
        raise ScenarioError(f"{len(ranks):,} rank count(s) up to {max(ranks):,} is too much StragglAR synthesis "
                            f"(sum of n² {work:.3g}, the bound is {STRAGGLAR_WORK:,})", field=field,
                            fix=f"ask for fewer or smaller rank counts, e.g. one of at most {most:,} ranks")


def check_out(folder: Path | None, *, field: str = "--out") -> Path | None:
    """The output folder (None: nothing to write), proven writable before any work, so a verb that cannot
    write its files fails at once and writes nothing (:func:`lightrail.report.files.check_writable`)."""
    if folder is None:
        return None
    from lightrail.report.files import check_writable

    return check_writable(folder, field=field)


def result_out(name: str) -> typer.models.OptionInfo:
    """``--out`` of a verb that prints its result and writes nothing unless asked: the folder for ``name``."""
    return typer.Option("--out", show_default=False, help=f"Also write the result as {name} in this folder "
                        "(made if missing); without it nothing is written.")


def figure_suffix(fmt: str) -> str:
    """``--format``'s value checked: png, svg or pdf."""
    fmt = fmt.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise ScenarioError(f"cannot write figures as {fmt!r}", field="--format", fix="use png, svg or pdf")
    return fmt


# ---- fabrics and scenarios ----------------------------------------------------------------------------------

def build_fabric(topology: str, ranks: int, bandwidth: str, latency: str, shape: str | None, gpus_per_server: int,
                 nvlink_bandwidth: str, hosts_per_leaf: int, oversubscription: float):
    """A static fabric from the shared fabric flags."""
    from lightrail.fabric.builders import build_topology

    check_ranks(ranks)
    check_count(ranks, field="--ranks", lo=2, hi=MAX_RANKS, what="ranks")
    if topology == "fat-tree":  # its routes grow with n² (measured: 0.96 GB at 16,384 hosts)
        check_fits(FAT_TREE_BYTES_PER_RANK2 * ranks**2, field="--ranks", value=f"a fat-tree of {ranks} hosts",
                   fix=f"use at most {int((memory_budget() / FAT_TREE_BYTES_PER_RANK2) ** 0.5):,} ranks on a fat-tree")
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
                                propagation=parse_time(propagation, field="--propagation"), ocs_delay=delay,
                                alpha=parse_time(alpha, field="--alpha"))


Scenario = Annotated[Path | None, typer.Argument(help="Scenario file (.yaml/.json); default: the embedded "
                                                      "Llama-3 70B on 2,048 H200 scenario.", show_default=False)]
OcsDelayOverride = Annotated[str | None, typer.Option("--ocs-delay", help="Override the scenario's OCS "
                                                      "reconfiguration delay, e.g. 25ms.")]
ModeOpt = Annotated[str | None, typer.Option("--mode", help="Override the OCS mode: on-demand or provisioned.")]


MAX_SWEEP_POINTS = MAX_VALUES
"""Most values one list option may hold (``lightrail.limits.MAX_VALUES``, the bound every list parser applies)."""
MAX_GPUS = 65_536
"""Most GPUs a scenario may have: a Llama-3 70B job on 65,536 GPUs simulates in ~5 minutes here (measured:
16,384 GPUs 41 s, 65,536 GPUs 303 s and 1.4 GB, 16 micro-batches)."""
MAX_MICRO_BATCHES = 4096
"""Most micro-batches per pipeline per iteration: 128x the most of the shipped examples (32); every one is
simulated, op by op, on every pipeline stage."""
SIMULATION_WORK = 2**22
"""Most GPUs x micro-batches one iteration simulation may take (a sweep's delays multiply it): time grows with
both (measured: 2,048 GPUs x 16, 32, 64 micro-batches in 7, 13, 27 s; 65,536 x 16 in 303 s), so the bound is
tens of minutes; it is twice the largest shipped example (examples/llama3-405b-65536xh200.yaml, 2^21)."""


def check_simulation_size(scenario, *, runs: int = 1, runs_field: str | None = None) -> None:
    """Refuse a scenario whose simulation this machine would take hours over, before it is built:
    at most :data:`MAX_GPUS` GPUs and ``runs`` x GPUs x micro-batches at most :data:`SIMULATION_WORK`
    (``runs_field``: the option that multiplies the runs, e.g. ``--ocs-delays``)."""
    gpus = scenario.cluster.gpus
    check_count(gpus, field="cluster.gpus", hi=MAX_GPUS, what="GPUs")
    job = getattr(scenario, "job", None)
    if job is None:
        return
    check_count(job.micro_batches, field="job.micro_batches", hi=MAX_MICRO_BATCHES, what="micro-batches")
    one = gpus * job.micro_batches
    if one > SIMULATION_WORK:
        raise ScenarioError(f"{gpus:,} GPUs x {job.micro_batches:,} micro-batches is over the bound of "
                            f"{SIMULATION_WORK:,} GPU-micro-batches per simulation (hours of work)",
                            field="job.micro_batches",
                            fix=f"use at most {max(1, SIMULATION_WORK // gpus):,} micro-batches on {gpus:,} GPUs")
    if runs * one > SIMULATION_WORK:
        raise ScenarioError(f"{runs:,} simulations of {gpus:,} GPUs x {job.micro_batches:,} micro-batches is over "
                            f"the bound of {SIMULATION_WORK:,} GPU-micro-batches (hours of work)", field=runs_field,
                            fix=f"use at most {SIMULATION_WORK // one:,} values, or a smaller job")


def built_scenario(scenario: Path | None, ocs_delay: str | None = None, mode: str | None = None, *,
                   trace_ok: bool = False, runs: int = 1, runs_field: str | None = None):
    """Load and build a scenario file (None: the embedded default), then apply --ocs-delay and --mode.
    A scenario whose workload is a trace is refused unless the command runs traces (``trace_ok``)."""
    from dataclasses import replace

    from lightrail.cli.plain import load_scenario  # a plain file needs no pydantic (issue 33)

    loaded, base = load_scenario(scenario)
    check_simulation_size(loaded, runs=runs, runs_field=runs_field)
    built = loaded.build(base)
    if built.trace is not None and not trace_ok:
        raise ScenarioError("this command needs a model, and the scenario gives a trace", field="workload",
                            fix="run traces with `lightrail simulate` or `check`; give model and job here")
    if ocs_delay is not None:
        built = replace(built, fabric=replace(built.fabric, ocs_delay=parse_time(ocs_delay, field="--ocs-delay")))
    if mode is not None:
        built = replace(built, policy=replace(built.policy, mode=parse_mode(mode)))
    return built
