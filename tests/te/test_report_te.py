"""The TE report: tables and headline lines against figures computed by hand from fabricated runs, and the files
(JSON round trip, CSV rows, PNGs) of real small runs on Abilene."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import numpy as np
import pytest
from rich.console import Console

from lightrail.report.te import (
    ROW_COLUMNS,
    RUN_FILES,
    STUDY_FILES,
    blast_change,
    divergence_ratio,
    factor_series,
    print_run,
    print_study,
    write_run,
    write_study,
)
from lightrail.studies.te import CONTROLLERS, TeRun, TeSetup, TeSweep, run_te, sweep_te
from lightrail.te.decentral import METRICS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fabricated(setup: TeSetup, divergence: dict[tuple[str, str], list[float]], blast: dict[str, float],
               slicings: dict[str, list[int]] | None = None) -> TeRun:
    """A TeRun with chosen divergence per (slicer, controller) and a constant blast radius per slicer; the
    other metrics are fixed, distinct numbers."""
    slicings = slicings or {s: [0, 1, 0, 1] for s in blast}
    per_matrix = {}
    for (s, c), div in divergence.items():
        t = len(div)
        per_matrix[s, c] = {
            "divergence_overload_fraction": np.array(div, dtype=float),
            "worst_link_overload": np.full(t, 0.0125),
            "throughput": np.full(t, 0.98766),
            "max_link_utilization": np.full(t, 1.0126),
            "blast_radius": np.full(t, blast[s]),
        }
    network = {"name": setup.topology, "nodes": 4, "links": 5, "capacity_gbps": 500.0, "demands": 12, "paths": 30}
    return TeRun(setup, network, {s: np.array(v) for s, v in slicings.items()}, per_matrix)


TOY = TeSetup(topology="toy", slices=2, lam=0.01, matrices=4, slicers=("contiguous", "randomized"))
TOY_DIV = {("contiguous", "regularized"): [0.0, 0.0002, 0.0004, 0.0002],      # mean 0.0002
           ("contiguous", "unregularized"): [0.001, 0.0, 0.002, 0.0014],      # mean 0.0011: 5.5x
           ("randomized", "regularized"): [0.0, 0.0, 0.0, 0.0],
           ("randomized", "unregularized"): [0.0001, 0.0, 0.0, 0.0003]}
TOY_BLAST = {"contiguous": 0.6, "randomized": 0.45}                          # 25% smaller, -15 points


def printed(show, *args) -> str:
    buf = io.StringIO()
    show(*args, Console(file=buf, width=240, color_system=None))
    return buf.getvalue()


def check_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # axes, lines and text, not an empty canvas


def check_csv(path, rows: list[dict]) -> None:
    lines = path.read_text().splitlines()
    assert len(lines) == len(rows) + 1
    read = list(csv.DictReader(io.StringIO(path.read_text())))
    assert tuple(read[0]) == ROW_COLUMNS
    for got, want in zip(read, rows, strict=True):
        assert (got["topology"], got["slicer"], got["controller"]) == (want["topology"], want["slicer"],
                                                                     want["controller"])
        for m in METRICS:
            assert float(got[m]) == want[m]  # written at full precision


def test_print_run_table_and_headline_from_known_arrays():
    run = fabricated(TOY, TOY_DIV, TOY_BLAST)
    ratio = divergence_ratio(run)
    assert ratio == pytest.approx(0.0011 / 0.0002)
    assert blast_change(run) == pytest.approx(0.45 / 0.6 - 1)
    out = printed(print_run, run)
    assert "toy: 4 nodes, 5 links; 12 demands on 30 paths" in out
    assert "2 slices; lambda 0.01; perturbation +-5%; objective max-flow; 4 traffic matrices" in out
    for slicer in ("contiguous", "randomized"):
        assert slicer in out
    assert "0.0200%" in out and "0.1100%" in out  # contiguous divergence means
    assert "98.77%" in out and "1.25%" in out and "1.013" in out  # throughput, worst overload, max utilization
    assert "60.0%" in out and "45.0%" in out  # blast radius per slicer
    assert f"= {ratio:.2f}x" in out and "= 5.50x" in out
    assert "randomized 45.0% vs contiguous 60.0%: 25.0% smaller (relative; -15.0 points)" in out
    assert out.count("regularized") >= 4


def test_print_run_says_na_when_regularized_divergence_is_zero():
    zero = {k: ([0.0] * 4 if k[1] == "regularized" else v) for k, v in TOY_DIV.items()}
    run = fabricated(TOY, zero, TOY_BLAST)
    assert divergence_ratio(run) is None
    out = printed(print_run, run)
    assert "n/a (regularized is 0)" in out
    assert "regularized 0% of capacity" in out  # exactly 0 is 0, not 0.0000%


def test_tiny_positive_overload_is_not_shown_as_zero():
    tiny = {**TOY_DIV, ("contiguous", "regularized"): [1e-9] * 4}
    out = printed(print_run, fabricated(TOY, tiny, TOY_BLAST))
    assert "<0.0001%" in out


def test_run_without_randomized_and_contiguous_has_no_blast_line():
    setup = replace(TOY, slicers=("optimal",))
    run = fabricated(setup, {("optimal", c): [0.0001] * 4 for c in CONTROLLERS}, {"optimal": 0.5})
    assert blast_change(run) is None
    out = printed(print_run, run)
    assert "blast radius (worst share" not in out
    assert "= 1.00x" in out


def toy_sweep() -> TeSweep:
    """Two topologies: base points, single-factor variations, and one point varying two factors at once."""
    runs = []
    for topology, scale, slicers in (("toy", 1.0, ("contiguous", "randomized")),
                                     ("ring", 2.0, ("contiguous", "randomized", "optimal"))):
        base = TeSetup(topology=topology, slices=2, lam=0.01, matrices=4, slicers=slicers)
        blast = {"contiguous": 0.6, "randomized": 0.45, "optimal": 0.4}
        variants = [base, replace(base, lam=0.001), replace(base, lam=0.1), replace(base, perturbation=0.1),
                    replace(base, slices=3), replace(base, lam=0.1, slices=3)]
        for i, s in enumerate(variants):
            div = {(sl, c): [scale * (i + 1) * (1e-4 if c == "regularized" else 4e-4)] * 4
                   for sl in slicers for c in CONTROLLERS}
            runs.append(fabricated(s, div, {sl: blast[sl] for sl in slicers}))
    return TeSweep(tuple(runs))


def test_factor_series_takes_runs_varying_only_that_factor():
    sweep = toy_sweep()
    lam = factor_series(sweep, "lam")
    assert list(lam) == ["toy", "ring"]
    # base is run 0 (lam 0.01), lam 0.001 run 1, lam 0.1 run 2; run 5 (lam 0.1 and 3 slices) is left out
    assert lam["toy"] == [(0.001, pytest.approx(2e-4), pytest.approx(8e-4)), (0.01, 1e-4, 4e-4),
                          (0.1, pytest.approx(3e-4), pytest.approx(12e-4))]
    assert [p[0] for p in factor_series(sweep, "slices")["ring"]] == [2, 3]
    assert factor_series(sweep, "slices")["ring"][1][1] == pytest.approx(2 * 5e-4)
    assert [p[0] for p in factor_series(sweep, "perturbation")["toy"]] == [0.05, 0.1]
    assert factor_series(sweep, "k") == {}


def test_print_and_write_study_of_fabricated_sweep(tmp_path):
    sweep = toy_sweep()
    files = write_study(sweep, tmp_path)
    assert files == [tmp_path / name for name in STUDY_FILES]
    assert json.loads(files[0].read_text()) == sweep.to_dict()
    check_csv(files[1], sweep.rows())
    for png in files[2:]:
        check_png(png)
    out = printed(lambda c: print_study(sweep, c, files))
    assert out.index("toy") < out.index("ring")
    assert "toy at its base point (2 slices, lambda 0.01, perturbation +-5%)" in out
    assert "ring at its base point" in out
    assert out.count("= 4.00x") == 2  # unregularized / regularized at each base point
    assert "randomized 45.0% vs contiguous 60.0%: 25.0% smaller" in out
    assert "randomized 45.0% vs optimal 40.0%: 12.5% larger (relative; +5.0 points)" in out  # ring only
    assert out.count("vs optimal") == 1
    assert str(files[-1]) in out


def test_real_run_files(tmp_path):
    run = run_te(TeSetup(topology="abilene", slices=3, matrices=2))
    files = write_run(run, tmp_path)
    assert files == [tmp_path / name for name in RUN_FILES]
    assert all(f.exists() for f in files)
    assert json.loads(files[0].read_text()) == run.to_dict()
    check_csv(files[1], run.rows())
    check_png(files[2])
    out = printed(print_run, run)
    assert "abilene: 12 nodes, 30 links" in out
    for slicer in run.slicings:
        assert slicer in out
    ratio = divergence_ratio(run)
    assert (f"= {ratio:.2f}x" if ratio is not None else "n/a (regularized is 0)") in out
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_real_sweep_files_and_single_run_sweeps(tmp_path):
    sweep = sweep_te(TeSetup(topology="abilene", lam=0.01, matrices=2), {"topology": ("abilene",), "lam": (0.001, 0.1)})
    assert len(sweep.runs) == 3
    files = write_study(sweep, tmp_path / "sweep")
    assert json.loads(files[0].read_text()) == sweep.to_dict()
    check_csv(files[1], sweep.rows())
    for png in files[2:]:
        check_png(png)
    # one run, and one run without the optimal slicer: every file still written
    single = run_te(TeSetup(topology="abilene", slices=2, matrices=2, slicers=("contiguous", "randomized")))
    for sw, where in ((TeSweep((single,)), "single"), (TeSweep(sweep.runs[:1]), "base")):
        files = write_study(sw, tmp_path / where)
        assert json.loads(files[0].read_text()) == sw.to_dict()
        for png in files[2:]:
            check_png(png)
        out = printed(lambda c, sw=sw, files=files: print_study(sw, c, files))
        assert "abilene at its base point" in out
    assert "vs optimal" not in printed(lambda c: print_study(TeSweep((single,)), c, []))


def test_empty_sweep_writes_files(tmp_path):
    files = write_study(TeSweep(()), tmp_path)
    assert files[1].read_text().splitlines() == [",".join(ROW_COLUMNS)]
    assert json.loads(files[0].read_text()) == {"rows": []}
    for png in files[2:]:
        assert png.read_bytes()[:8] == PNG_MAGIC
