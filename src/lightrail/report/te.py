"""What ``lightrail te run`` and ``lightrail study te`` show people (rich tables, headline lines) and write
(JSON, CSV of the rows, plots): decentralized TE with and without Symphony's regularizer, per slicer."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lightrail.report.files import write_json, write_text
from lightrail.studies.te import CONTROLLERS, TeRun, TeSweep
from lightrail.te.decentral import METRICS

__all__ = ["RUN_FILES", "STUDY_FILES", "ROW_COLUMNS", "FACTORS", "rows_csv", "divergence_ratio", "blast_change",
           "base_runs", "factor_series", "print_run", "write_run", "print_study", "write_study"]

RUN_FILES = ("te-run.json", "te-run.csv", "te-run-cdf.png")
STUDY_FILES = ("study-te.json", "study-te.csv", "study-te-cdf.png", "study-te-sweep.png", "study-te-blast.png")

#: The columns of ``TeRun.rows()`` / ``TeSweep.rows()``, in order: the CSV header.
ROW_COLUMNS = ("topology", "slices", "lambda", "perturbation", "slicer", "controller", *METRICS)

#: The factors a study varies one at a time (TeSetup field, label for people).
FACTORS = (("lam", "lambda"), ("perturbation", "perturbation"), ("slices", "slices"))

#: Per metric: its column heading and how a mean is shown.
_HEADINGS = {
    "divergence_overload_fraction": "overload",
    "worst_link_overload": "worst link",
    "throughput": "throughput",
    "max_link_utilization": "max util.",
    "blast_radius": "blast radius",
}

_CAPTION = ("divergence overload: load above capacity summed over links, % of total capacity; worst link overload: "
            "max load/capacity - 1; blast radius: worst share of traffic one slice controller programs")


def _pct(x: float, digits: int) -> str:
    """``x`` as a percentage to ``digits`` decimals; exactly 0 is ``0%`` and a positive value that would
    round to zero is ``<0.01%`` (so that rounding never shows an overload as none)."""
    if x == 0:
        return "0%"
    text = f"{100 * x:.{digits}f}"
    if x > 0 and float(text) == 0:
        return f"<{10 ** -digits:.{digits}f}%"
    return f"{text}%"


_FORMATS = {
    "divergence_overload_fraction": lambda x: _pct(x, 4),
    "worst_link_overload": lambda x: _pct(x, 2),
    "throughput": lambda x: _pct(x, 2),
    "max_link_utilization": lambda x: f"{x:.3f}",
    "blast_radius": lambda x: _pct(x, 1),
}


def _fmt(metric: str, value: float) -> str:
    return _FORMATS[metric](value)


def rows_csv(rows: Sequence[dict]) -> str:
    """One line per (run point, slicer, controller): the factors, then each metric's mean over the matrices."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=ROW_COLUMNS, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for row in rows:
        w.writerow(row)
    return buf.getvalue()


# ---- headline figures ------------------------------------------------------------------------------------------


def _first_slicer(run: TeRun) -> str:
    return next(iter(run.slicings))


def divergence_ratio(run: TeRun, slicer: str | None = None) -> float | None:
    """Mean divergence overload of unregularized over regularized controllers (``slicer`` defaults to the
    run's first); None when the regularized mean is 0 (no finite ratio)."""
    slicer = slicer or _first_slicer(run)
    reg = run.mean(slicer, "regularized")["divergence_overload_fraction"]
    unreg = run.mean(slicer, "unregularized")["divergence_overload_fraction"]
    return None if reg <= 0 else unreg / reg


def _blast(run: TeRun, slicer: str) -> float:
    """A slicer's mean blast radius (it depends on the slicing and the demand, not on the controller)."""
    return run.mean(slicer, CONTROLLERS[0])["blast_radius"]


def blast_change(run: TeRun, slicer: str = "randomized", against: str = "contiguous") -> float | None:
    """Relative change of ``slicer``'s mean blast radius against ``against``'s (-0.25: 25% smaller); None when
    either slicer is missing from the run or ``against``'s blast radius is 0."""
    if slicer not in run.slicings or against not in run.slicings:
        return None
    base = _blast(run, against)
    return None if base <= 0 else _blast(run, slicer) / base - 1.0


def _divergence_line(run: TeRun) -> str:
    slicer = _first_slicer(run)
    reg = run.mean(slicer, "regularized")["divergence_overload_fraction"]
    unreg = run.mean(slicer, "unregularized")["divergence_overload_fraction"]
    ratio = divergence_ratio(run, slicer)
    said = f"{ratio:.2f}x" if ratio is not None else "n/a (regularized is 0)"
    return (f"divergence overload ({slicer} slicing, mean over matrices): unregularized "
            f"{_fmt('divergence_overload_fraction', unreg)} / regularized "
            f"{_fmt('divergence_overload_fraction', reg)} of capacity = {said}")


def _blast_phrase(run: TeRun, slicer: str, against: str) -> str | None:
    change = blast_change(run, slicer, against)
    if slicer not in run.slicings or against not in run.slicings:
        return None
    ours, theirs = _blast(run, slicer), _blast(run, against)
    if change is None:
        how = "n/a"
    elif abs(change) < 5e-4:
        how = "the same"
    else:
        how = f"{abs(change) * 100:.1f}% {'smaller' if change < 0 else 'larger'}"
    return (f"{slicer} {_fmt('blast_radius', ours)} vs {against} {_fmt('blast_radius', theirs)}: {how} "
            f"(relative; {100 * (ours - theirs):+.1f} points)")


def _blast_line(run: TeRun, with_optimal: bool = False) -> str | None:
    phrases = [_blast_phrase(run, "randomized", "contiguous")]
    if with_optimal:
        phrases.append(_blast_phrase(run, "randomized", "optimal"))
    phrases = [p for p in phrases if p]
    if not phrases:
        return None
    return "blast radius (worst share of traffic one controller programs): " + "; ".join(phrases)


# ---- one run -----------------------------------------------------------------------------------------------------


def _matrices(run: TeRun) -> int:
    """How many traffic matrices the run evaluated (a matrix file may hold fewer than ``setup.matrices``)."""
    return len(next(iter(run.per_matrix.values()))["throughput"]) if run.per_matrix else 0


def _header(run: TeRun) -> str:
    s, n = run.setup, run.network
    traffic = f"gravity model at load {s.load:g}" if s.traffic is None else f"from {s.traffic}"
    return (f"{s.topology}: {n.get('nodes', '?')} nodes, {n.get('links', '?')} links; "
            f"{n.get('demands', '?')} demands on {n.get('paths', '?')} paths (up to {s.k} per demand); "
            f"{s.slices} slices; lambda {s.lam:g}; perturbation +-{100 * s.perturbation:g}%; "
            f"objective {getattr(s.objective, 'value', s.objective)}; {_matrices(run)} traffic matrices ({traffic}, "
            f"seed {s.seed})")


def _metric_columns(table: Table) -> None:
    for m in METRICS:
        table.add_column(_HEADINGS[m], justify="right", no_wrap=True)


def print_run(run: TeRun, console: Console) -> None:
    """The setup, one row per (slicer, controller) of metric means, and the headline ratios."""
    console.print(escape(_header(run)), highlight=False, soft_wrap=True)
    table = Table(title=f"Decentralized TE: mean over {_matrices(run)} traffic matrices", caption=_CAPTION,
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=0)
    table.add_column("slicer", no_wrap=True)
    table.add_column("controller", no_wrap=True)
    _metric_columns(table)
    slicers = list(dict.fromkeys(s for s, _ in run.per_matrix))
    for i, slicer in enumerate(slicers):
        controllers = [c for s, c in run.per_matrix if s == slicer]
        for j, c in enumerate(controllers):
            mean = run.mean(slicer, c)
            table.add_row(slicer, c, *(_fmt(m, mean[m]) for m in METRICS),
                          end_section=j == len(controllers) - 1 and i < len(slicers) - 1)
    console.print(table)
    if not run.per_matrix:
        return
    lines = [_divergence_line(run), _blast_line(run)]
    console.print(escape("; ".join(line for line in lines if line)), highlight=False, soft_wrap=True)


# ---- plots -------------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    """Lay out, write atomically in the file's format (png, svg or pdf), free the figure."""
    from lightrail.report.plots import _write

    fig.tight_layout()
    return _write(fig, path)


def _cdf(ax, values: np.ndarray, **style) -> None:
    """Empirical CDF of ``values`` as a step line from 0 to 1."""
    xs = np.sort(np.asarray(values, dtype=float))
    if not len(xs):
        return
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.step(np.concatenate([[xs[0]], xs]), np.concatenate([[0.0], ys]), where="post", **style)


_STYLE = {"regularized": {"linestyle": "-"}, "unregularized": {"linestyle": "--"}}


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _plot_run(run: TeRun, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    if run.per_matrix:
        slicer = _first_slicer(run)
        for ax, metric, label in ((axes[0], "divergence_overload_fraction", "divergence overload (% of capacity)"),
                                  (axes[1], "worst_link_overload", "worst link overload (%)")):
            for c in CONTROLLERS:
                if (slicer, c) in run.per_matrix:
                    _cdf(ax, 100 * run.per_matrix[slicer, c][metric], label=c, **_STYLE.get(c, {}))
            ax.set_xlabel(label)
            ax.set_ylabel("fraction of traffic matrices (CDF, 0-1)")
            ax.set_ylim(0, 1.02)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
            ax.set_title(f"CDF over traffic matrices ({slicer} slicing)", fontsize=9)
        slicers = list(run.slicings)
        values = [100 * _blast(run, s) for s in slicers]
        bars = axes[2].bar(slicers, values, color=["#4C72B0", "#55A868", "#C44E52", "#8172B2"][: len(slicers)])
        for bar, v in zip(bars, values, strict=True):
            axes[2].text(bar.get_x() + bar.get_width() / 2, v, f"{v:.1f}%", ha="center", va="bottom", fontsize=8)
        axes[2].set_xlabel("slicer")
        axes[2].set_ylabel("blast radius (% of traffic, mean)")
        axes[2].set_ylim(0, max(values + [1.0]) * 1.15)
        axes[2].grid(True, axis="y", alpha=0.3)
        axes[2].set_title(f"{run.setup.slices} slices: one controller's failure", fontsize=9)
    else:
        for ax in axes:
            _empty(ax, "no results")
    s = run.setup
    fig.suptitle(f"Decentralized TE on {s.topology}: {s.slices} slices, lambda {s.lam:g}, "
                 f"perturbation +-{100 * s.perturbation:g}%", fontsize=11)
    return _save(fig, path)


# ---- one run: files ----------------------------------------------------------------------------------------------


def write_run(run: TeRun, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """te-run-cdf.<fmt>, te-run.csv, then te-run.json (each atomically); returns them as RUN_FILES orders them."""
    from lightrail.report.plots import figure_files

    files = [Path(out_dir) / name for name in figure_files(RUN_FILES, fmt)]
    _plot_run(run, files[2])
    write_text(files[1], rows_csv(run.rows()))
    write_json(files[0], run.to_dict())
    return files


# ---- a study -----------------------------------------------------------------------------------------------------


def base_runs(sweep: TeSweep) -> dict[str, TeRun]:
    """Each topology's base point: its first run in the sweep."""
    out: dict[str, TeRun] = {}
    for run in sweep.runs:
        out.setdefault(run.setup.topology, run)
    return out


def factor_series(sweep: TeSweep, factor: str) -> dict[str, list[tuple[float, float, float]]]:
    """Per topology, ``(value of factor, mean divergence regularized, unregularized)`` (first slicer) over the
    runs that differ from that topology's base point in ``factor`` alone (the base point included), sorted by
    the value; topologies whose runs never vary ``factor`` are left out."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for topology, base in base_runs(sweep).items():
        points: dict[float, tuple[float, float, float]] = {}
        for run in sweep.runs:
            if run.setup.topology != topology or not run.per_matrix:
                continue
            if replace(run.setup, **{factor: getattr(base.setup, factor)}) != base.setup:
                continue
            x = float(getattr(run.setup, factor))
            slicer = _first_slicer(run)
            points.setdefault(x, (x, *(run.mean(slicer, c)["divergence_overload_fraction"] for c in CONTROLLERS)))
        if len(points) > 1:
            out[topology] = [points[x] for x in sorted(points)]
    return out


def print_study(sweep: TeSweep, console: Console, files: Sequence[Path]) -> None:
    """The rows grouped by topology, each topology's headline figures at its base point, the files written."""
    # 80 columns fit when piped: factors abbreviated (k slices, lambda, +-P), controllers as reg / unreg
    table = Table(title=f"Decentralized TE study: {len(sweep.runs)} points, means over traffic matrices",
                  caption=_CAPTION + "; k: slices; P: demand error; reg / unreg: regularized / unregularized",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=0)
    for col in ("topology", "k", "lambda", "+-P", "slicer", "ctrl"):
        table.add_column(col, justify="right" if col in ("k", "lambda", "+-P") else "left", no_wrap=True)
    study_metrics = [m for m in METRICS if m != "max_link_utilization"]
    short = {"worst_link_overload": "worst", "blast_radius": "blast"}
    for m in study_metrics:
        table.add_column(short.get(m, _HEADINGS[m]), justify="right", no_wrap=True)
    topologies = list(dict.fromkeys(r.setup.topology for r in sweep.runs))
    for t, topology in enumerate(topologies):
        rows = [row for run in sweep.runs if run.setup.topology == topology for row in run.rows()]
        for i, row in enumerate(rows):
            table.add_row(row["topology"], str(row["slices"]), f"{row['lambda']:g}",
                          f"{100 * row['perturbation']:g}%", row["slicer"],
                          "reg" if row["controller"] == "regularized" else "unreg",
                          *(_fmt(m, row[m]) for m in study_metrics),
                          end_section=i == len(rows) - 1 and t < len(topologies) - 1)
    console.print(table)
    for topology, base in base_runs(sweep).items():
        s = base.setup
        console.print(escape(f"{topology} at its base point ({s.slices} slices, lambda {s.lam:g}, perturbation "
                             f"+-{100 * s.perturbation:g}%):"), highlight=False, soft_wrap=True)
        if not base.per_matrix:
            console.print("  no results", highlight=False)
            continue
        for line in (_divergence_line(base), _blast_line(base, with_optimal=True)):
            if line:
                console.print(escape(f"  {line}"), highlight=False, soft_wrap=True)
    if files:
        console.print(escape(f"wrote {', '.join(map(str, files))}"), highlight=False, soft_wrap=True)


def _plot_study_cdf(sweep: TeSweep, path: Path) -> Path:
    plt = _pyplot()
    bases = base_runs(sweep)
    fig, axes = plt.subplots(1, max(1, len(bases)), figsize=(5 * max(1, len(bases)), 4), squeeze=False)
    for ax, (topology, run) in zip(axes.ravel(), bases.items(), strict=False):
        if not run.per_matrix:
            _empty(ax, f"{topology}: no results")
            continue
        slicer = _first_slicer(run)
        for c in CONTROLLERS:
            if (slicer, c) in run.per_matrix:
                _cdf(ax, 100 * run.per_matrix[slicer, c]["divergence_overload_fraction"], label=c,
                     **_STYLE.get(c, {}))
        s = run.setup
        ax.set_title(f"{topology}: {s.slices} slices, lambda {s.lam:g}, +-{100 * s.perturbation:g}% "
                     f"({slicer} slicing)", fontsize=9)
        ax.set_xlabel("divergence overload (% of capacity)")
        ax.set_ylabel("fraction of traffic matrices (CDF, 0-1)")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    if not bases:
        _empty(axes[0, 0], "no runs")
    fig.suptitle("Divergence overload over traffic matrices at each topology's base point", fontsize=11)
    return _save(fig, path)


_FACTOR_AXES = {"lam": "lambda (regularizer weight, dimensionless)",
                "perturbation": "perturbation (demand view error, % of demand)", "slices": "slices (count)"}
"""Each swept factor's x-axis title, with its unit."""


def _plot_study_sweep(sweep: TeSweep, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(FACTORS), figsize=(5 * len(FACTORS), 4))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {t: cycle[i % len(cycle)] for i, t in enumerate(base_runs(sweep))}
    for ax, (factor, label) in zip(axes, FACTORS, strict=True):
        series = factor_series(sweep, factor)
        if not series:
            _empty(ax, f"{label} not varied")
            ax.set_title(f"against {label}", fontsize=9)
            continue
        for topology, points in series.items():
            xs = [p[0] for p in points]
            for i, c in enumerate(CONTROLLERS):
                ax.plot(xs, [100 * p[1 + i] for p in points], marker="o", ms=4, color=colours[topology],
                        label=f"{topology}, {c}", **_STYLE.get(c, {}))
        xs = sorted({p[0] for points in series.values() for p in points})
        if factor == "lam" and xs[-1] > 0:
            positive = [x for x in xs if x > 0]
            if xs[0] > 0:
                ax.set_xscale("log")
            else:
                ax.set_xscale("symlog", linthresh=min(positive))
        ax.set_xticks(xs, [f"+-{100 * x:g}%" if factor == "perturbation" else f"{x:g}" for x in xs], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel(_FACTOR_AXES[factor])
        ax.set_ylabel("mean divergence overload (% of capacity)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"against {label} (others at the base point)", fontsize=9)
    fig.suptitle("Divergence overload: regularized (solid) vs unregularized (dashed)", fontsize=11)
    return _save(fig, path)


def _plot_study_blast(sweep: TeSweep, path: Path) -> Path:
    plt = _pyplot()
    bases = {t: r for t, r in base_runs(sweep).items() if r.per_matrix}
    slicers = list(dict.fromkeys(s for r in bases.values() for s in r.slicings))
    fig, ax = plt.subplots(figsize=(max(5.0, 2.2 * len(bases) + 2), 4))
    width = 0.8 / max(1, len(slicers))
    for k, slicer in enumerate(slicers):
        xs = [i + (k - (len(slicers) - 1) / 2) * width for i, r in enumerate(bases.values()) if slicer in r.slicings]
        ys = [100 * _blast(r, slicer) for r in bases.values() if slicer in r.slicings]
        bars = ax.bar(xs, ys, width, label=slicer)
        for bar, v in zip(bars, ys, strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    if bases:
        ax.set_xticks(range(len(bases)), [f"{t}\n({r.setup.slices} slices)" for t, r in bases.items()])
        ax.legend(fontsize=8)
    else:
        _empty(ax, "no runs")
    ax.set_xlabel("topology")
    ax.set_ylabel("blast radius (% of traffic, mean)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title("Blast radius per slicer at each topology's base point", fontsize=10)
    return _save(fig, path)


def write_study(sweep: TeSweep, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """The three plots (as ``fmt``), study-te.csv, then study-te.json (each atomically); returns them as
    STUDY_FILES orders them."""
    from lightrail.report.plots import figure_files

    files = [Path(out_dir) / name for name in figure_files(STUDY_FILES, fmt)]
    _plot_study_cdf(sweep, files[2])
    _plot_study_sweep(sweep, files[3])
    _plot_study_blast(sweep, files[4])
    write_text(files[1], rows_csv(sweep.rows()))
    write_json(files[0], sweep.to_dict())
    return files
