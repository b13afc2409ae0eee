"""Hostile input to every verb (issue 17, item 7): each ends in exit 0 or 2, never 1; no traceback; on exit 2
nothing is written; every ``--json`` is strict JSON (no ``Infinity``/``NaN``).

The verbs are walked from the Typer app (the CLI surface snapshot lists the same ones), so a new verb is driven
without an edit here. Verbs that start services or processes are left to the regression table below, which
replays the issue's cases one by one. Everything runs in-process (CliRunner) in a scratch folder."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import typing
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from lightrail.cli import app

runner = CliRunner()

SERVICES = {"controller serve", "train-demo", "fl serve", "fl demo", "te serve", "moe bench", "stragglar run"}
"""Verbs that start services or worker processes: their bounds are checked in the table below instead."""

SMALL_SCENARIO = """name: tiny
model: {preset: debug, overrides: {layers: 8}}
cluster: {gpus: 32, gpus_per_server: 4, gpu: h100}
parallel: {tp: 4, pp: 4, dp: 2}
job: {micro_batches: 6, mfu: 0.5}
"""

PROPIUS = Path(__file__).resolve().parents[1] / "data" / "propius"
"""Propius's evaluation inputs, a real sample (its PROVENANCE.md), for ``fl import-propius``."""

BASE = {
    "collective": ["--ranks", "8", "--size", "1MiB"],
    "collective-sweep": ["--ranks", "8", "--sizes", "1KiB,1MiB", "--algo", "ring"],
    "check": ["tiny.yaml"],
    "simulate": ["tiny.yaml"],
    "sweep": ["tiny.yaml", "--ocs-delays", "0,10ms"],
    "cost": ["--gpus", "256,512"],
    "pipswitch": ["--ports", "8"],
    "stragglar rounds": ["--ranks", "8"],
    "stragglar compare": ["--ranks", "8", "--size", "1MiB"],
    "stragglar sweep": ["--ranks", "4,8", "--straggler-delays", "0,1ms", "--topologies", "switch"],
    "study collectives": ["--ops", "allreduce", "--ranks", "8", "--sizes", "1KiB,1MiB", "--ocs-delays", "0,1ms"],
    "study scaleup": ["--racks", "2", "--requests", "50"],
    "study fl": ["--clients", "100", "--jobs", "2"],
    "study te": ["--topologies", "abilene", "--lambdas", "0.001", "--perturbations", "0.05", "--slice-counts", "2",
                 "--matrices", "1"],
    "te run": ["--topology", "abilene", "--matrices", "1", "--slicers", "contiguous"],
    "calibrate nccl-tests": ["nccl.txt", "--ranks", "8"],
    "calibrate iterations": ["iter.csv", "tiny.yaml"],
    "export astra-sim": ["tiny.yaml"],
    "fl import-propius": ["--profiles", str(PROPIUS / "profile_mobilenet_large"), "--trace",
                          str(PROPIUS / "job_trace_20.txt"), "--devices", str(PROPIUS / "devices_sample.json"),
                          "--clients", "20"],
}
"""Small, valid settings per verb, so a hostile value that happens to be valid still runs in moments."""

INTS = ["-1", "0", "1", "1000000000000", str(2**63), str(10**30), "-" + str(10**30)]
FLOATS = ["nan", "inf", "-inf", "-1", "0", "1e308", "-1e308", "1e-320"]
TEXTS = ["", " ", ",", "nan", "inf", "-1", "0", "10", "abc", "1e-300bps", "1e300GiB", "1e300s", "-5ms", "5", "0x0",
         "2..100000000", "1..1e30", "1KiB..1e30GiB", "0..0", "nan,1", "1e999", "ring,", "../"]
PATHS = ["missing/file.yaml", "/dev/zero", "/proc/lightrail-hostile", "afile", "afile/sub", ".", "deep.yaml",
         "bomb.yaml", "/"]


def _verbs() -> dict:
    def walk(command, path):
        if hasattr(command, "commands"):
            found = {}
            for name, sub in sorted(command.commands.items()):
                found.update(walk(sub, [*path, name]))
            return found
        return {" ".join(path): command}

    return walk(typer.main.get_command(app), [])


VERBS = _verbs()
DRIVEN = sorted(v for v in VERBS if v not in SERVICES)


def _kind(param) -> type:
    """The Python type a parameter reads (``int | None`` -> int, ``list[str] | None`` -> str)."""
    annotation = param.type_descriptor.annotation
    while typing.get_args(annotation):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def _options(verb: str) -> list[tuple[str | None, list[str]]]:
    """(flag, or None for the positional argument; hostile values of its type) of each of a verb's inputs."""
    found = []
    for p in VERBS[verb].params:
        kind = _kind(p)
        if p.hidden or kind is bool:
            continue
        values = {int: INTS, float: FLOATS, Path: PATHS}.get(kind, TEXTS)
        found.append((None if p.param_type_name == "argument" else max(p.opts, key=len), values))
    return found


NCCL_LOG = "".join(f"{size:12d}  {size // 4:12d}     float     sum      -1  {t:8.2f}    0.10    0.18       0  "
                   f"{t:8.2f}    0.10    0.18       0\n" for size, t in ((1024, 10.0), (4096, 12.0), (65536, 30.0),
                                                                          (1 << 20, 200.0)))
"""An all_reduce_perf table (nccl-tests' columns) for ``calibrate nccl-tests``."""


def _scratch(root: Path) -> None:
    """The files hostile paths point at (relative to the scratch folder, the command's cwd)."""
    (root / "tiny.yaml").write_text(SMALL_SCENARIO)
    (root / "nccl.txt").write_text(NCCL_LOG)
    (root / "iter.csv").write_text("mode,ocs_delay,iteration_s\nelectrical,,0.02\nprovisioned,1ms,0.021\n")
    (root / "afile").write_text("not a folder\n")
    (root / "deep.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    (root / "bomb.yaml").write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)))


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def check_run(verb: str, args: list[str], root: Path) -> None:
    """Run ``verb args`` in ``root`` and assert the contract."""
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    command = verb.split()
    has = {o for p in VERBS[verb].params for o in p.opts}
    if "--json" in has:
        args = [*args, "--json"]
    if "--out" in has and "--out" not in args:
        args = [*args, "--out", "out"]
    with contextlib.chdir(root):
        result = runner.invoke(app, [*command, *args])
    shown = f"lightrail {verb} {' '.join(args)}\n{result.output}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{shown}\nraised {result.exception!r}") from result.exception
    assert result.exit_code in (0, 2), shown
    assert "Traceback" not in result.output, shown
    if result.exit_code == 2:
        assert sorted(p.relative_to(root) for p in root.rglob("*")) == before, f"wrote files on exit 2: {shown}"
        if "Usage:" not in result.output:  # a usage error is Click's own; ours are one line naming the field
            assert result.output.strip().startswith("error:"), shown
    elif "--json" in args:
        json.loads(result.stdout, parse_constant=_refuse_constant)


@st.composite
def hostile(draw):
    verb = draw(st.sampled_from(DRIVEN))
    options = _options(verb)
    args = list(BASE.get(verb, []))
    chosen = draw(st.lists(st.sampled_from(options), min_size=1, max_size=2, unique_by=lambda o: o[0])) \
        if options else []
    for flag, values in chosen:
        value = draw(st.sampled_from(values))
        if flag is None:  # the positional argument: BASE gives it first, if at all
            args = [value, *args[1:]] if args and not args[0].startswith("-") else [value, *args]
        elif flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return verb, args


@settings(max_examples=int(os.environ.get("LIGHTRAIL_HOSTILE_EXAMPLES", "120")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(hostile())
def test_every_verb_survives_hostile_values(case):
    verb, args = case
    if verb.startswith(("te ", "study te")):
        pytest.importorskip("highspy")  # the optional extra 'te'
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIGHTRAIL_MEMORY_BUDGET", str(8 << 30))  # the same refusals on every machine
        root = Path(tmp)
        _scratch(root)
        check_run(verb, args, root)


def test_every_driven_verb_has_small_settings():
    """A verb without small settings would run its (long) defaults whenever a hostile value is benign."""
    missing = [v for v in DRIVEN if v not in BASE and any(_kind(p) in (int, float) for p in VERBS[v].params)]
    assert not missing, f"add small settings for {missing} to BASE"


def test_a_memory_error_in_a_verb_is_one_line_and_exit_2(monkeypatch, tmp_path):
    """A size no bound caught (issue 31): the verb's MemoryError is one line naming the likely cause, exit 2."""
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("lightrail.cli.check.built_scenario", exhausted)
    _scratch(tmp_path)
    with contextlib.chdir(tmp_path):
        result = runner.invoke(app, ["check", "tiny.yaml"])
    assert result.exit_code == 2 and not isinstance(result.exception, MemoryError), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of memory") and "docs/limits.md" in lines[0], lines
    assert "Traceback" not in result.output
