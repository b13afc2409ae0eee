"""``lightrail te``: decentralized WAN traffic engineering (Symphony): slice controllers, regularized TE, slicers.

The options every ``te`` verb and ``study te`` share are defined here once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, friendly, out
from lightrail.cli.options import FigureFormat, JsonOut, check_out, figure_suffix
from lightrail.cli.output import print_json, progress_bar

te_app = LeanTyper(no_args_is_help=True,
                     help="Decentralized WAN traffic engineering (Symphony): slice controllers, regularized TE, "
                          "slicers.")
app.add_typer(te_app, name="te")

DEFAULT_LAMBDA = 0.001  # studies.te.DEFAULT_LAMBDA (kept literal so the CLI starts without numpy; a test pins it)

Topology = Annotated[str, typer.Option("--topology", help="geant, abilene, tatanld, geant2012, germany50, a topohub "
                                       "key (topozoo/Abilene) or a topology .json file.")]
Slices = Annotated[int, typer.Option("--slices", help="Slice controllers (each owns a set of nodes).")]
Lambda = Annotated[float, typer.Option("--lambda", help="Weight of the regularizer lambda * sum_e u_e^2 "
                                       "(0: none).")]
Perturbation = Annotated[float, typer.Option("--perturbation", help="Each controller's relative demand error, "
                                             "uniform in +-P (0.05: +-5%).")]
ObjectiveOpt = Annotated[str, typer.Option("--objective", help="max-flow, max-concurrent or min-mlu.")]
PathsOpt = Annotated[int, typer.Option("--paths", help="Shortest paths per demand (k).")]
Load = Annotated[float, typer.Option("--load", help="Generated traffic scaled so its mean matrix needs this max "
                                     "link utilization at best.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the traffic, the views and the randomized slicer.")]
SlicerOpt = Annotated[str, typer.Option("--slicer", help="contiguous, randomized or optimal.")]


def require_te(lam: float = 0.0) -> None:
    """What a TE run needs of the optional extra ``te``: HiGHS (``highspy``: every LP, and ``te.formulations``
    imports it) and, for a regularized run (``lam > 0``), Clarabel, the sparse QP's solver (``te/qp.py``; cvxpy is
    no longer used). ``topohub`` only for a named topology, which ``te.inputs`` asks for itself (a topology .json
    file needs none). Without one: one line naming the fix."""
    import importlib

    from lightrail.errors import LightrailError

    for name in ("highspy", "clarabel") if lam > 0 else ("highspy",):
        try:
            importlib.import_module(name)
        except ImportError:
            raise LightrailError(f"{name} is not installed; the TE wing needs lightrail's optional extra 'te'",
                                 field="te", fix="pip install 'lightrail[te]' (make setup installs it)") from None


MAX_PATHS = 64
"""Most shortest paths per demand (Symphony and SMORE use 4; each path is a variable of every solve)."""
MAX_MATRICES = 10_000
"""Most traffic matrices of one run (each is a solve of every slice controller; held as one array)."""
MAX_LAMBDA = 1e3
"""Largest regularizer weight read: beyond it lambda * sum u_e^2 overflows the solvers' problem data."""
MIN_LOAD, MAX_LOAD = 1e-6, 100.0
"""Target utilizations read: 10^-6 to 100x overload; beyond either, scaling the demands overflows the solvers."""


def check_lambda(lam: float, field: str = "--lambda") -> None:
    """A regularizer weight the solvers can take: 0 to :data:`MAX_LAMBDA`."""
    from lightrail.errors import ScenarioError

    if not 0 <= lam <= MAX_LAMBDA:
        raise ScenarioError(f"lambda {lam}", field=field, fix=f"use 0 (off) to {MAX_LAMBDA:g}; Symphony sweeps "
                                                            "1e-4..0.1")


def check_te_sizes(*, paths: int, load: float, matrices: int, matrices_field: str = "--matrices") -> None:
    """Bounds of the TE options, before any topology is read or matrix generated."""
    from lightrail.cli.options import check_count
    from lightrail.errors import ScenarioError

    check_count(paths, field="--paths", hi=MAX_PATHS, what="paths per demand")
    check_count(matrices, field=matrices_field, lo=0 if matrices_field == "--epochs" else 1, hi=MAX_MATRICES,
                what="traffic matrices")
    if not MIN_LOAD <= load <= MAX_LOAD:
        raise ScenarioError(f"load {load}", field="--load",
                            fix=f"a target utilization in [{MIN_LOAD:g}, {MAX_LOAD:g}], e.g. 0.9")


def te_setup(*, topology: str, slices: int, lam: float, perturbation: float, objective: str, paths: int,
             load: float, seed: int, matrices: int = 1, traffic: Path | None = None, slicers: str | None = None):
    """A checked TeSetup from the shared options (its errors name the flags)."""
    check_te_sizes(paths=paths, load=load, matrices=matrices)
    check_lambda(lam)
    require_te(lam)
    from lightrail.studies.te import TeSetup
    from lightrail.te.formulations import Objective
    from lightrail.te.slicing import Slicer

    chosen = TeSetup.slicers if slicers is None else tuple(Slicer.parse(s, field="--slicers")
                                                            for s in slicers.split(",") if s.strip())
    if not chosen:
        from lightrail.errors import ScenarioError

        raise ScenarioError(f"{slicers!r} lists no slicer", field="--slicers", fix="e.g. randomized,contiguous")
    setup = TeSetup(topology=topology, slices=slices, lam=lam, perturbation=perturbation,
                    objective=Objective.parse(objective), k=paths, matrices=matrices, load=load, seed=seed,
                    traffic=None if traffic is None else str(traffic), slicers=chosen)
    setup.check()
    return setup


@te_app.command("run")
@friendly
def te_run_cmd(
    topology: Topology = "geant",
    slices: Slices = 5,
    lam: Lambda = DEFAULT_LAMBDA,
    perturbation: Perturbation = 0.05,
    objective: ObjectiveOpt = "max-flow",
    paths: PathsOpt = 4,
    matrices: Annotated[int, typer.Option("--matrices", help="Traffic matrices (5 minutes apart) to average "
                                          "over.")] = 10,
    load: Load = 0.9,
    seed: Seed = 0,
    traffic: Annotated[Path | None, typer.Option("--traffic", help="Matrices in Gbps: .npy (T,n,n), text with "
                                                 "one n*n matrix per line, or a folder of one matrix per file; "
                                                 "default: the gravity model.", show_default=False)] = None,
    slicers: Annotated[str, typer.Option("--slicers", help="Slicers to compare, comma-separated; the first one "
                                         "gives the top-level keys.")] = "randomized,contiguous,optimal",
    out_dir: Annotated[Path | None, typer.Option("--out", help="Also write JSON, CSV and CDF plots here.",
                                                 show_default=False)] = None,
    fmt: FigureFormat = "png",
    as_json: JsonOut = False,
):
    """Slice controllers, each solving the whole WAN's TE on its own view of demand and programming the
    demands that start in its slice: overload, throughput and blast radius, regularized and not, per slicer."""
    from lightrail.report.te import print_run, write_run
    from lightrail.studies.te import run_te

    fmt = figure_suffix(fmt)
    check_out(out_dir)
    setup = te_setup(topology=topology, slices=slices, lam=lam, perturbation=perturbation, objective=objective,
                     paths=paths, load=load, seed=seed, matrices=matrices, traffic=traffic, slicers=slicers)
    progress, task = progress_bar(setup.matrices, f"te run: {topology}", as_json)
    with progress:
        run = run_te(setup, progress=lambda done, total: progress.update(task, completed=done))
    files = write_run(run, out_dir, fmt=fmt) if out_dir is not None else []
    if as_json:
        print_json(run.to_dict())
    else:
        print_run(run, out)
        for f in files:
            out.print(f"wrote {f}")
