"""Sweeps over any scenario field: a sweep file names a base scenario and the fields to vary (a grid, a list
of cells, or both); every cell is one simulation of photonic against electrical rails.

A sweep file (YAML or JSON)::

    name: delay-x-micro-batches
    scenario: debug-tiny.yaml        # relative to the sweep file; omitted: the default scenario
    grid:                            # every combination of these values
      ocs.reconfig_delay: [0, 1ms, 10ms]
      job.micro_batches: 2..16       # integers lo..hi, every one in between
    list:                            # cells given one by one; each is combined with every grid cell
      - {ocs.mode: on-demand}
      - {ocs.mode: provisioned, ocs.partial: false}

Cells run on Ray (a local Ray by default, or an existing cluster) or on this process; a cell that fails is
recorded with its error and the others finish. The table is the same either way (ordered by cell).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from lightrail.errors import ScenarioError
from lightrail.limits import check_grid, range_values

__all__ = ["METRICS", "Sweep", "CellResult", "SweepResult", "parse_sweep", "load_sweep", "is_sweep_file",
           "run_cell", "run_cells", "run_sweep"]

METRICS = ("baseline_iteration_time_s", "iteration_time_s", "overhead", "reconfigurations_per_iteration",
           "controller_round_trips_per_iteration", "switching_delay_s", "drain_wait_s", "control_plane_s",
           "lost_overlap_s")
"""Columns every cell reports: the electrical baseline, photonic rails with the scenario's policy, and the
overhead split into the parts of ``studies.rails.overhead_breakdown``."""

_KEYS = {"name", "scenario", "grid", "list"}
_FIX = "see examples/sweeps/debug.yaml"

Value = str | int | float | bool


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: the base scenario (as a mapping, so cells can change any field) and its cells."""

    name: str
    scenario: dict
    base: Path | None
    """Folder that relative paths inside the scenario (``model.hf_config``) are read from."""
    fields: tuple[str, ...]
    cells: tuple[dict[str, Value], ...]
    defaults: dict[str, Value | None] = field(default_factory=dict)
    """The base scenario's value of each swept field, for the cells that do not set it."""


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """One cell: its values, and either its metrics or the error that stopped it."""

    cell: int
    values: dict[str, Value]
    ok: bool
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)

    def row(self, fields: Sequence[str], defaults: dict) -> dict:
        return {"cell": self.cell, **{f: self.values.get(f, defaults.get(f)) for f in fields},
                "status": "ok" if self.ok else "failed", "error": self.error,
                **{m: self.metrics.get(m, math.nan) for m in METRICS}}


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    name: str
    scenario: dict
    fields: tuple[str, ...]
    cells: tuple[CellResult, ...]
    defaults: dict[str, Value | None]
    runner: str
    """``local`` or ``ray`` (with the CPUs it had)."""
    wall_s: float = field(compare=False)

    @property
    def failed(self) -> list[CellResult]:
        return [c for c in self.cells if not c.ok]

    def rows(self) -> list[dict]:
        """One tidy row per cell: ``cell``, the swept fields (the base scenario's value where a listed cell
        does not set one), ``status``, ``error``, then :data:`METRICS` (NaN where the cell failed)."""
        return [c.row(self.fields, self.defaults) for c in self.cells]

    def to_dict(self) -> dict:
        return {"name": self.name, "scenario": self.scenario, "fields": list(self.fields),
                "defaults": dict(self.defaults), "runner": self.runner,
                "wall_s": self.wall_s, "cells": len(self.cells), "failed": len(self.failed),
                "rows": [asdict(c) for c in self.cells]}


# ---- the sweep file ---------------------------------------------------------------------------------------

def _scenario_field(path: str, where: str) -> Any:
    """The annotation of a scenario field; refuses a path that is no field (checked against the scenario's
    pydantic model, so a typo is a bad sweep file rather than a column of failed cells)."""
    from lightrail.scenario import Scenario

    model: Any = Scenario
    annotation: Any = Any
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields_ = model.model_fields if isinstance(model, type) and issubclass(model, BaseModel) else None
        if fields_ is None:
            return Any  # a free mapping (costs, model.overrides): any key
        if part not in fields_:
            raise ScenarioError(f"{path!r} is no scenario field", field=where,
                                fix=f"use one of {', '.join('.'.join([*parts[:i], f]) for f in fields_)}")
        annotation = fields_[part].annotation
        models = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if models:
            model = models[0]
        elif i < len(parts) - 1 and not (annotation is dict or getattr(annotation, "__origin__", None) is dict):
            raise ScenarioError(f"{'.'.join(parts[: i + 1])} has no sub-fields", field=where,
                                fix=f"sweep {'.'.join(parts[: i + 1])} itself")
        else:
            model = None
    return annotation


def _coerce(annotation: Any, value: Value) -> Value:
    """Quantities with units are strings in scenarios (``10ms``); a bare number in a sweep (``0``) is
    read as one. The OCS mode is spelled ``on-demand``."""
    kinds = {annotation, *get_args(annotation)}
    if str in kinds and not kinds & {int, float} and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}"
    if value == "on_demand" and "on-demand" in get_args(annotation):
        return "on-demand"  # one spelling in tables and JSON; the old one is read
    return value


def _values(raw: Any, where: str) -> list[Value] | range:
    """A list of scalars, or ``lo..hi`` (integers, every one in between: a ``range``, bounded from its ends by
    ``limits.MAX_RANGE`` and made into values only once the whole grid is known to be within bounds)."""
    if isinstance(raw, str) and ".." in raw:
        lo, _, hi = raw.partition("..")
        try:
            lo_i, hi_i = int(lo), int(hi)
        except ValueError:
            raise ScenarioError(f"cannot read {raw!r} as an integer range", field=where, fix="e.g. 1..25") from None
        return range_values(lo_i, hi_i, field=where, fix="e.g. 1..25")
    if not isinstance(raw, list) or not raw:
        raise ScenarioError(f"{raw!r} is not a list of values", field=where, fix="e.g. [0, 1ms, 10ms] or 1..25")
    for v in raw:
        if not isinstance(v, Value):
            raise ScenarioError(f"{v!r} is not a single value", field=where, fix="list numbers, strings or booleans")
    return list(raw)


def parse_sweep(data: Any, *, base: Path | None = None, source: str = "sweep") -> Sweep:
    """Validate a sweep mapping; errors name the sweep file's field (``grid.ocs.reconfig_delay``)."""
    from lightrail.scenario import DEFAULT_SCENARIO, parse_scenario
    from lightrail.validation import read_mapping

    if not isinstance(data, dict):
        raise ScenarioError(f"{source} must be a mapping", field=source, fix=_FIX)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ScenarioError(f"unknown key {unknown[0]!r}", field=unknown[0], fix=f"use {', '.join(sorted(_KEYS))}")
    if not data.get("grid") and not data.get("list"):
        raise ScenarioError("a sweep needs a grid or a list of cells", field="grid", fix=_FIX)
    scenario_base = base
    ref = data.get("scenario")
    if ref is None:
        scenario = deepcopy(DEFAULT_SCENARIO)
    elif isinstance(ref, dict):
        scenario = deepcopy(ref)
    elif isinstance(ref, str):
        path = Path(ref) if base is None or Path(ref).is_absolute() else base / ref
        scenario = read_mapping(path, field="scenario")
        scenario_base = path.parent
    else:
        raise ScenarioError(f"{ref!r} is neither a file nor a scenario mapping", field="scenario", fix=_FIX)
    parsed = parse_scenario(scenario, source="scenario")  # the base must be sound
    if parsed.workload is not None:
        raise ScenarioError("a sweep's cells need a model, and the scenario gives a workload trace",
                            field="scenario", fix="sweep a scenario with model and job; replay traces with simulate")
    dumped = parsed.model_dump(mode="json")

    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise ScenarioError("grid must map fields to lists of values", field="grid", fix=_FIX)
    raw_axes = []
    for path, raw in grid.items():
        raw_axes.append((str(path), _scenario_field(str(path), f"grid.{path}"), _values(raw, f"grid.{path}")))
    listed = data.get("list") or [{}]
    if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
        raise ScenarioError("list must be a list of mappings {field: value}", field="list", fix=_FIX)
    # the whole grid is bounded from its axes' lengths before any cell (or any range's values) is made
    check_grid([len(v) for _, _, v in raw_axes] + [len(listed)], field="grid" if grid else "list",
               what="sweep cells (grid product x listed cells)")
    axes = [(path, [_coerce(annotation, v) for v in values]) for path, annotation, values in raw_axes]
    for i, cell in enumerate(listed):
        for path, v in cell.items():
            annotation = _scenario_field(str(path), f"list[{i}].{path}")
            if not isinstance(v, Value):
                raise ScenarioError(f"{v!r} is not a single value", field=f"list[{i}].{path}",
                                    fix="give one number, string or boolean")
            cell[path] = _coerce(annotation, v)
    fields_ = tuple(dict.fromkeys([p for p, _ in axes] + [str(p) for c in listed for p in c]))
    clash = [p for p, _ in axes if any(p in c for c in listed)]
    if clash:
        raise ScenarioError(f"{clash[0]} is in both the grid and the list", field=f"grid.{clash[0]}",
                            fix="sweep a field in one of them")
    cells = tuple({**dict(zip([p for p, _ in axes], combo, strict=True)), **{str(k): v for k, v in extra.items()}}
                  for combo in itertools.product(*(vals for _, vals in axes)) for extra in listed)
    name = data.get("name") or (scenario.get("name", "scenario") + "-sweep")
    return Sweep(name=str(name), scenario=scenario, base=scenario_base, fields=fields_, cells=cells,
                 defaults={f: _get(dumped, f) for f in fields_})


def _get(data: dict, path: str) -> Value | None:
    node: Any = data
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, Value) else None


def load_sweep(path: str | Path) -> Sweep:
    from lightrail.validation import read_mapping

    path = Path(path)
    return parse_sweep(read_mapping(path, field="FILE"), base=path.parent, source=path.name)


def is_sweep_file(data: Any) -> bool:
    """Whether a parsed file is a sweep (it has a grid or a list) rather than a scenario."""
    return isinstance(data, dict) and ("grid" in data or "list" in data)


# ---- cells ------------------------------------------------------------------------------------------------

def _set(scenario: dict, path: str, value: Value) -> None:
    node = scenario
    parts = path.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if isinstance(child, str) and part == "model":  # a preset name becomes a model section
            child = {"preset": child}
        node[part] = child = dict(child or {})
        node = child
    node[parts[-1]] = value


def run_cell(scenario: dict, base: Path | None, values: dict[str, Value]) -> dict[str, float]:
    """Electrical and photonic rails (the scenario's policy) for one cell, with the overhead's parts."""
    from lightrail.scenario import parse_scenario
    from lightrail.studies.rails import JobRuns, overhead_breakdown

    data = deepcopy(scenario)
    for path, value in values.items():
        _set(data, path, value)
    built = parse_scenario(data, source="scenario").build(base)
    runs = JobRuns(built.job)
    electrical = runs.electrical(built.fabric).iteration_time_s
    photonic = runs(built.fabric, built.params)
    parts = overhead_breakdown(runs, built.fabric, built.params, photonic.iteration_time_s, electrical)
    return {"baseline_iteration_time_s": electrical, "iteration_time_s": photonic.iteration_time_s,
            "overhead": photonic.iteration_time_s / electrical - 1,
            "reconfigurations_per_iteration": photonic.reconfigurations_per_iteration,
            "controller_round_trips_per_iteration": photonic.controller_round_trips_per_iteration, **parts}


def run_cells(scenario: dict, base: Path | None, cells: Sequence[tuple[int, dict]]) -> list[CellResult]:
    """A batch of cells (one Ray task); a failing cell is recorded with its error and the batch goes on."""
    out = []
    for index, values in cells:
        try:
            out.append(CellResult(cell=index, values=values, ok=True, metrics=run_cell(scenario, base, values)))
        except Exception as e:  # noqa: BLE001 -- any failure is the cell's result, the sweep goes on
            out.append(CellResult(cell=index, values=values, ok=False, error=f"{type(e).__name__}: {e}"))
    return out


def _batches(n: int, workers: int) -> list[range]:
    """About four batches per worker (enough to balance uneven cells, few enough that a task's overhead
    stays small against its cells), at most 32 cells each so progress moves."""
    size = max(1, min(32, math.ceil(n / (4 * max(workers, 1)))))
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def run_sweep(sweep: Sweep, *, local: bool = False, address: str | None = None, cpus: int | None = None,
              progress: Callable[[int], None] | None = None) -> SweepResult:
    """Every cell of ``sweep``: on this process (``local``), or on Ray: the running Ray if this process
    has one, else the cluster at ``address``, else a local Ray of ``cpus`` CPUs (default: all) started
    without its dashboard and shut down afterwards. ``progress(k)`` is told of each ``k`` finished cells."""
    step = progress or (lambda k: None)
    cells = list(enumerate(sweep.cells))
    start = time.perf_counter()
    if local:
        results = []
        for c in cells:
            results.extend(run_cells(sweep.scenario, sweep.base, [c]))
            step(1)
        runner = "local"
    else:
        results, runner = _on_ray(sweep, cells, address=address, cpus=cpus, step=step)
    results.sort(key=lambda r: r.cell)
    return SweepResult(name=sweep.name, scenario=sweep.scenario, fields=sweep.fields, cells=tuple(results),
                       defaults=sweep.defaults, runner=runner, wall_s=time.perf_counter() - start)


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a ``host:port`` (or ``ray://host:port``) nobody answers: Ray itself retries for minutes."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and friends: Ray finds the cluster itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ScenarioError(f"no Ray cluster answers at {address!r} ({e.strerror or e})", field="--address",
                            fix="give the address `ray start --head` printed, or drop --address for a local Ray") \
            from None


def _on_ray(sweep: Sweep, cells: list, *, address: str | None, cpus: int | None,
            step: Callable[[int], None]) -> tuple[list[CellResult], str]:
    if address:
        _check_reachable(address)
        # Ray's clusters use token authentication by default, but a client joining one sends its token only in
        # token mode, read when Ray is imported: turn it on when a token is there for Ray to read.
        if "RAY_AUTH_MODE" not in os.environ and (
                {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ)
                or (Path.home() / ".ray" / "auth_token").is_file()):
            os.environ["RAY_AUTH_MODE"] = "token"
    try:
        import ray
    except ImportError:
        raise ScenarioError("Ray is not installed", field="--local",
                            fix="pip install 'lightrail[sweep]', or run on one process with --local") from None
    started = not ray.is_initialized()
    if started:
        try:
            # "local": a new Ray of our own, never a cluster someone else left running on this machine
            ray.init(address=address or "local", num_cpus=None if address else (cpus or os.cpu_count()),
                     include_dashboard=False, log_to_driver=False, configure_logging=False,
                     **({} if address else {"object_store_memory": 128 * 2**20}))
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ScenarioError(f"cannot start or join Ray: {str(e).splitlines()[0]}", field="--address",
                                fix="give a running cluster's address (ray start --head prints it), or --local") \
                from None
    try:
        workers = int(ray.cluster_resources().get("CPU", 1))
        task = ray.remote(num_cpus=1)(run_cells)
        scenario = ray.put(sweep.scenario)
        batches = [[cells[i] for i in batch] for batch in _batches(len(cells), workers)]
        pending = {task.remote(scenario, sweep.base, batch): batch for batch in batches}
        results: list[CellResult] = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                batch = pending.pop(ref)
                try:
                    results.extend(ray.get(ref))
                except Exception as e:  # noqa: BLE001 -- a lost worker fails its cells, not the sweep
                    reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    results.extend(CellResult(cell=i, values=v, ok=False, error=reason) for i, v in batch)
                step(len(batch))
        return results, f"ray ({workers} CPUs)"
    finally:
        if started:
            ray.shutdown()
