"""``lightrail check FILE``: validate a scenario or a sweep file without simulating.

A sweep file (it has ``grid`` or ``list``) is recognised as one: its base scenario and every cell are built, so a
bad cell is found before a sweep runs. ``--json`` prints one object; scripts read ``ok``, ``parameters`` and
``tokens_per_iteration`` (a sweep adds ``cells``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import JsonOut, built_scenario
from lightrail.cli.output import print_json
from lightrail.errors import LightrailError, ScenarioError

MAX_CHECKED_CELLS = 1000
"""Cells ``check`` builds one by one (the sweep runner's own cap on a file's cells is larger; past this many the
count is reported and the cells are left to the run)."""

FileArg = Annotated[Path | None, typer.Argument(help="Scenario or sweep file (.yaml/.json); default: the embedded "
                                             "Llama-3 70B on 2,048 H200 scenario.", show_default=False)]


def _job_facts(built) -> dict:
    """What a model scenario will simulate: the keys ``check --json`` promises, and the rest of its one line."""
    job, model = built.job, built.model
    return {"name": built.scenario.name, "model": model.name, "gpus": job.layout.world, "gpu": built.gpu.name,
            "layout": str(job.layout), "micro_batches": job.micro_batches, "seq_len": model.seq_len,
            "tokens_per_iteration": job.tokens_per_iteration, "parameters": model.total_params(),
            "active_parameters": model.active_params()}


def _check_sweep(path) -> dict:
    """Build the sweep's base scenario and each of its cells; the first bad cell is the error, named by cell."""
    from copy import deepcopy

    from lightrail.scenario import parse_scenario
    from lightrail.studies.sweep import _set, load_sweep

    sweep = load_sweep(path)
    base = parse_scenario(deepcopy(sweep.scenario), source="scenario").build(sweep.base)
    for i, values in enumerate(sweep.cells[:MAX_CHECKED_CELLS]):
        data = deepcopy(sweep.scenario)
        for field, value in values.items():
            _set(data, field, value)
        try:
            parse_scenario(data, source="scenario").build(sweep.base)
        except LightrailError as e:
            where = ", ".join(f"{k}={v}" for k, v in values.items())
            raise type(e)(f"cell {i} ({where}): {e.message}", field=e.field, fix=e.fix) from None
    facts = _job_facts(base)
    return {"ok": True, "kind": "sweep", **facts, "name": sweep.name, "scenario": facts["name"],
            "cells": len(sweep.cells), "cells_checked": min(len(sweep.cells), MAX_CHECKED_CELLS),
            "fields": list(sweep.fields)}


def _is_sweep(path) -> bool:
    from lightrail.studies.sweep import is_sweep_file
    from lightrail.validation import read_mapping

    return path is not None and is_sweep_file(read_mapping(path, field="FILE"))


@app.command("check")
@friendly
def check_cmd(file: FileArg = None, as_json: JsonOut = False):
    """Validate a scenario or sweep file without simulating (exit 2 and the field at fault if it is wrong);
    prints the sequence length, tokens per iteration and parameter count the simulation will use (a sweep: its
    cells, each one built). With --json a bad file prints ``{"ok": false, "field": ..., "error": ...}`` too."""
    try:
        _check(file, as_json)
    except LightrailError as e:
        if as_json:
            print_json({"ok": False, "field": e.field, "error": e.message, "fix": e.fix})
        raise


def _check(file: Path | None, as_json: bool) -> None:
    if _is_sweep(file):
        facts = _check_sweep(file)
        if as_json:
            print_json(facts)
            return
        out.print(f"ok: sweep {facts['name']}: {facts['cells']:,} cells over {', '.join(facts['fields'])}, "
                  f"each built; base scenario {facts['scenario']}: {facts['model']} on {facts['gpus']:,} "
                  f"{facts['gpu']}, {facts['layout']}")
        out.print(f"  sequence length {facts['seq_len']} tokens, {facts['tokens_per_iteration']:,} tokens per "
                  f"iteration, {facts['parameters']:,} parameters (base scenario)")
        return
    built = built_scenario(file, trace_ok=True)
    if built.trace is not None:
        ops = {k: v for k, v in built.trace.ops().items() if ":" not in k}
        network = built.topology.name if built.topology is not None else "one GPU"
        f = built.fabric
        if as_json:
            print_json({"ok": True, "kind": "trace", "name": built.scenario.name, "ranks": built.trace.world,
                        "ops": ops, "network": network, "sharing": f.sharing, "collectives": f.collectives,
                        "parameters": None, "tokens_per_iteration": None})
            return
        out.print(f"ok: {built.scenario.name}: Chakra trace {built.trace.source}, {built.trace.world} ranks "
                  f"({', '.join(f'{v} {k}' for k, v in ops.items())}) on {built.trace.world} {built.gpu.name}, "
                  f"{network}; sharing {f.sharing}, collectives {f.collectives}")
        return
    if built.job is None:
        raise ScenarioError("the scenario has neither a model nor a trace", field="model", fix="give model: NAME")
    facts = _job_facts(built)
    if as_json:
        print_json({"ok": True, "kind": "scenario", **facts})
        return
    out.print(f"ok: {facts['name']}: {facts['model']} on {facts['gpus']} {facts['gpu']}, {facts['layout']}, "
              f"{facts['micro_batches']} micro-batches")
    out.print(f"  sequence length {facts['seq_len']} tokens, {facts['tokens_per_iteration']:,} tokens per iteration, "
              f"{facts['parameters']:,} parameters")
