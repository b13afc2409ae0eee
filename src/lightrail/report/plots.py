"""Plots (matplotlib, headless Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lightrail.report.files import write_atomic  # noqa: E402
from lightrail.units import format_size  # noqa: E402

__all__ = ["FORMATS", "figure_format", "figure_files", "plot_sweep", "plot_breakdown", "plot_delay_sweep",
           "plot_speedup_heatmaps", "plot_straggler_run", "plot_straggler_speedups", "plot_train_demo",
           "plot_sweep_cells"]

FORMATS = ("png", "svg", "pdf")
"""Static figure formats; a figure's format is its file's suffix."""


def figure_format(path) -> str:
    """The format a figure is written in: its file's suffix (png, svg or pdf)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    if fmt not in FORMATS:
        from lightrail.errors import ScenarioError

        raise ScenarioError(f"cannot write a figure as {fmt!r}", field="--format", fix=f"use {', '.join(FORMATS)}")
    return fmt


def figure_files(names: Sequence[str], fmt: str = "png") -> tuple[str, ...]:
    """``names`` with each figure's ``.png`` swapped for ``.<fmt>``: the stem stays, so png outputs keep their names."""
    fmt = figure_format(f"x.{fmt.lower().lstrip('.')}")
    return tuple(n[:-4] + f".{fmt}" if n.endswith(".png") else n for n in names)


def _write(fig, path, **kwargs) -> Path:
    """Write ``fig`` atomically in its file's format (raster formats at 120 dpi), then free it."""
    fmt = figure_format(path)
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, format=fmt, **({"dpi": 120} | kwargs)))
    plt.close(fig)
    return Path(path)


def _save(fig, path) -> Path:
    """Lay out, write atomically in the file's format, free the figure."""
    if not fig.get_constrained_layout():
        fig.tight_layout()
    return _write(fig, path)

def plot_sweep(rows: Sequence[dict], path: Path, *, title: str) -> Path:
    """Time and bus bandwidth against message size, one line per algorithm (log-log)."""
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    for name in names:
        mine = [r for r in rows if r["algorithm"] == name]
        sizes = [r["size_bytes"] for r in mine]
        ax_t.plot(sizes, [r["time_s"] for r in mine], marker="o", ms=3, label=name)
        ax_bw.plot(sizes, [r["busbw_Bps"] / 1e9 for r in mine], marker="o", ms=3, label=name)
    ticks = sorted({r["size_bytes"] for r in rows})[::3]
    for ax in (ax_t, ax_bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [format_size(t) for t in ticks], rotation=45, fontsize=8)
        ax.set_xlabel("message size per rank (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (s)")
    ax_bw.set_ylabel("bus bandwidth (GB/s)")
    ax_t.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


def plot_breakdown(rows: dict[str, dict], path: Path, *, title: str) -> Path:
    """Stacked bars of an iteration's time (compute, communication, reconfiguration, bubble) per fabric."""
    parts = [("compute_s", "compute", "#4C72B0"), ("communication_s", "exposed communication", "#55A868"),
             ("reconfiguration_s", "reconfiguration stall", "#C44E52"), ("control_s", "controller round trips",
                                                                         "#8172B2"),
             ("bubble_s", "pipeline bubble", "#CCCCCC")]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    names = list(rows)
    left = [0.0] * len(names)
    for key, label, color in parts:
        values = [rows[n].get(key, 0.0) for n in names]
        ax.barh(names, values, left=left, label=label, color=color)
        left = [a + b for a, b in zip(left, values, strict=True)]
    for i, n in enumerate(names):
        ax.text(left[i], i, f"  {rows[n]['iteration_time_s']:.3f} s", va="center", fontsize=9)
    ax.set_xlabel("seconds per iteration (mean over pipeline stages)")
    ax.set_xlim(0, max(left) * 1.18)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


_OVERHEAD_COLOURS = {"switching_delay_s": "#C44E52", "drain_wait_s": "#DD8452", "control_plane_s": "#8172B2",
                     "lost_overlap_s": "#937860"}


def plot_overhead_breakdown(rows: Sequence[dict], path: Path, *, title: str) -> Path:
    """Per policy (ablation row), its overhead over electrical rails split into its parts; negative parts
    (a cost whose removal reorders the pipeline to the worse) stack to the left of zero."""
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.8))
    names = [r["policy"] for r in rows]
    pos, neg = [0.0] * len(rows), [0.0] * len(rows)
    from lightrail.studies.rails import BREAKDOWN

    for key, label in BREAKDOWN:
        color = _OVERHEAD_COLOURS[key]
        values = [r["overhead_breakdown_s"][key] * 1e3 for r in rows]
        lefts = [p if v >= 0 else n + v for v, p, n in zip(values, pos, neg, strict=True)]
        ax.barh(names, [abs(v) for v in values], left=lefts, label=label, color=color)
        pos = [p + max(v, 0.0) for v, p in zip(values, pos, strict=True)]
        neg = [n + min(v, 0.0) for v, n in zip(values, neg, strict=True)]
    for i, r in enumerate(rows):
        total = sum(r["overhead_breakdown_s"].values()) * 1e3
        ax.text(max(pos[i], 0.0), i, f"  {total:+.1f} ms ({r['overhead'] * 100:+.2f}%)", va="center", fontsize=8)
    ax.axvline(0, color="black", lw=0.6)
    ax.set_xlabel("overhead over electrical rails per iteration (ms)")
    ax.set_xlim(min(neg) * 1.1 if min(neg) < 0 else 0, max(max(pos), 1e-9) * 1.35)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, frameon=False)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def _decade_below(values) -> float:
    """The power of ten at or below the smallest positive ``|value|`` (1 if there is none): a symlog axis's
    linear band ends there, so the smallest value still sits on the log part, not squashed near zero."""
    import math

    positive = [abs(v) for v in values if v and math.isfinite(v)]
    return 10.0 ** math.floor(math.log10(min(positive))) if positive else 1.0


def plot_delay_sweep(rows: Sequence[dict], path: Path, *, title: str) -> Path:
    """Training overhead against OCS reconfiguration delay, one line per (policy, mode).

    Both axes are symlog (0 delay and zero overhead must show) with the linear band below the smallest
    non-zero value, so overheads of a fraction of a percent are as readable as hundreds of percent."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    keys = list(dict.fromkeys((r["policy"], r["mode"]) for r in rows))
    for policy, mode in keys:
        mine = sorted((r for r in rows if (r["policy"], r["mode"]) == (policy, mode)), key=lambda r: r["delay_s"])
        ax.plot([r["delay_s"] * 1e3 for r in mine], [r["overhead"] * 100 for r in mine], marker="o", ms=4,
                linestyle="-" if policy == "lightrail" else "--", label=f"{policy}, {mode}")
    ax.set_xscale("symlog", linthresh=_decade_below([r["delay_s"] * 1e3 for r in rows]), linscale=0.5)
    ax.set_yscale("symlog", linthresh=_decade_below([r["overhead"] * 100 for r in rows]), linscale=0.5)
    ax.set_xlabel("OCS reconfiguration delay (ms)")
    ax.set_ylabel("iteration time overhead vs electrical rails (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def plot_speedup_heatmaps(op: str, ranks: Sequence[int], sizes: Sequence[float], delays: Sequence[float],
                          speedup: dict, path: Path, *, title: str) -> Path:
    """Per rank count, a heat map of the reconfigurable fabric's speedup over the best algorithm on
    the static ring, against message size (x) and reconfiguration delay (y). Constrained layout keeps
    each panel's title clear of the rotated size ticks of the panel above."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    cols = min(4, len(ranks))
    rows = -(-len(ranks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows + 0.6), squeeze=False, layout="constrained")
    values = np.log2(np.concatenate([speedup[n].ravel() for n in ranks]))
    bound = max(1.0, float(np.nanmax(np.abs(values[np.isfinite(values)]))))
    norm = TwoSlopeNorm(vmin=-bound, vcenter=0.0, vmax=bound)
    image = None
    for k, (ax, n) in enumerate(zip(axes.ravel(), ranks, strict=False)):
        image = ax.imshow(np.log2(speedup[n]), aspect="auto", origin="lower", cmap="RdBu", norm=norm)
        ax.set_title(f"n = {n} ranks", fontsize=9)
        ticks = list(range(0, len(sizes), 4))
        ax.set_xticks(ticks, [format_size(sizes[i]) for i in ticks], rotation=45, fontsize=7)
        ax.set_yticks(range(len(delays)), [_delay_label(d) for d in delays], fontsize=7)
        if k // cols == rows - 1 or k + cols >= len(ranks):
            ax.set_xlabel("message size per rank (bytes)", fontsize=8)
        if k % cols == 0:
            ax.set_ylabel("OCS reconfiguration delay", fontsize=8)
    for ax in axes.ravel()[len(ranks):]:
        ax.axis("off")
    if image is not None:
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
        bar.set_label("log2 speedup (blue: reconfiguring wins)")
    fig.suptitle(title, fontsize=11)
    return _write(fig, path, dpi=110)


def _percent_norm(values):
    """A colour norm for percentages: diverging around 0 (red: photonic slower); symmetric-log when they span
    more than two decades, so that one +35,569% cell does not wash out the rest. Returns it and a label suffix."""
    import numpy as np
    from matplotlib.colors import SymLogNorm, TwoSlopeNorm

    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    bound = max(abs(lo), abs(hi), 1e-9)
    positive = np.abs(values[np.abs(values) > 0])
    small = float(positive.min()) if positive.size else bound
    if bound > 100 * max(small, 0.01):
        return SymLogNorm(linthresh=max(small, 0.01), vmin=-bound if lo < 0 else 0.0, vmax=bound), ", log scale"
    if lo < 0 < hi:
        return TwoSlopeNorm(vcenter=0.0, vmin=lo, vmax=hi), ""
    return TwoSlopeNorm(vcenter=0.0, vmin=min(lo, -bound), vmax=max(hi, bound)), ""


def plot_sweep_cells(rows: Sequence[dict], fields: Sequence[str], path: Path, *, title: str) -> Path:
    """A sweep file's overhead per cell: against the one swept field, or a heat map over the first two
    fields (one panel per combination of the others, at most six; the rest are left to the table)."""
    import numpy as np

    def axis(field):
        return list(dict.fromkeys(r[field] for r in rows))

    if len(fields) == 1:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = axis(fields[0])
        numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs)
        pos = xs if numeric else list(range(len(xs)))
        ys = [next(r["overhead"] for r in rows if r[fields[0]] == x) * 100 for x in xs]
        ax.plot(pos, ys, marker="o", ms=4)
        if not numeric:
            ax.set_xticks(pos, [str(x) for x in xs], rotation=45, fontsize=8)
        ax.set_xlabel(fields[0])
        ax.set_ylabel("iteration time overhead vs electrical rails (%)")
        ax.grid(True, alpha=0.3)
        ax.set_title(title, fontsize=10)
        return _save(fig, path)
    xf, yf, rest = fields[0], fields[1], list(fields[2:])
    xs, ys = axis(xf), axis(yf)
    panels = list(dict.fromkeys(tuple(r[f] for f in rest) for r in rows))[:6]
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols + 1.2, 3.6 * nrows + 0.6), squeeze=False,
                             layout="constrained")
    grids = []
    for panel in panels:
        grid = np.full((len(ys), len(xs)), np.nan)
        for r in rows:
            if tuple(r[f] for f in rest) == panel:
                grid[ys.index(r[yf]), xs.index(r[xf])] = r["overhead"] * 100
        grids.append(grid)
    finite = np.concatenate([g[np.isfinite(g)] for g in grids]) if grids else np.array([0.0])
    norm, label = _percent_norm(finite)
    image = None
    for ax, panel, grid in zip(axes.ravel(), panels, grids, strict=False):
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="RdBu_r", norm=norm)
        every_x, every_y = max(1, len(xs) // 10), max(1, len(ys) // 12)
        ax.set_xticks(range(0, len(xs), every_x), [str(x) for x in xs[::every_x]], rotation=45, fontsize=7)
        ax.set_yticks(range(0, len(ys), every_y), [str(y) for y in ys[::every_y]], fontsize=7)
        ax.set_xlabel(xf, fontsize=8)
        ax.set_ylabel(yf, fontsize=8)
        if rest:
            ax.set_title(", ".join(f"{f} = {v}" for f, v in zip(rest, panel, strict=True)), fontsize=9)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.85).set_label(f"overhead vs electrical rails (%{label})")
    fig.suptitle(title, fontsize=11)
    return _write(fig, path)


def plot_straggler_run(rows: Sequence[dict], path: Path, title: str) -> Path:
    """Measured time to finish per AllReduce method against size (log-log), and StragglAR's speedup
    over gloo's native AllReduce and over lightrail's Ring (rows as ``StragglarRun.to_dict()`` gives them)."""
    rows = sorted(rows, key=lambda r: r["size_bytes"])
    sizes = [r["size_bytes"] for r in rows]
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(12, 4.5))
    for key, label, style in (("stragglar_s", "StragglAR", "-"), ("ring_s", "lightrail Ring", "--"),
                              ("native_s", "gloo dist.all_reduce", ":")):
        ax_t.plot(sizes, [r[key] for r in rows], marker="o", ms=4, linestyle=style, label=label)
    delays = {r["delay_s"] for r in rows}
    if len(delays) == 1 and min(delays) > 0:
        ax_t.axhline(min(delays), color="grey", lw=0.8, linestyle="-.", label="straggler delay")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time to finish, slowest rank (s)")
    ax_t.legend(fontsize=8)
    for key, label in (("speedup_over_native", "over gloo dist.all_reduce"), ("speedup_over_ring", "over Ring")):
        ax_s.plot(sizes, [r[key] for r in rows], marker="o", ms=4, label=label)
    ax_s.axhline(1.0, color="grey", lw=0.8)
    ax_s.set_ylabel("StragglAR speedup (x, >1: StragglAR faster)")
    ax_s.legend(fontsize=8)
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [format_size(s) for s in sizes], fontsize=8)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("buffer size per rank (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def _delay_label(seconds: float) -> str:
    if seconds == 0:
        return "0"
    return f"{seconds * 1e6:g}us" if seconds < 1e-3 else f"{seconds * 1e3:g}ms" if seconds < 1 else f"{seconds:g}s"


def _speedup_lines(ax, series: list[tuple[str, list, list, list]], colours: dict[str, str],
                   points: dict[str, tuple[list, list, list]] | None = None) -> None:
    """Per fabric ``(name, xs, over Ring, over wait-then-best)``: a solid and a dotted line in the fabric's
    colour; fabrics with identical curves share one pair of lines (and one legend entry).
    ``points`` optionally marks the swept values on dense curves."""
    import numpy as np

    groups: list[tuple[list[str], list, list, list]] = []
    for name, xs, ring_ys, best_ys in series:
        same = next((g for g in groups if len(g[1]) == len(xs) and np.allclose(g[1], xs, rtol=1e-12, atol=0)
                     and np.allclose(g[2], ring_ys, rtol=1e-9, atol=0)
                     and np.allclose(g[3], best_ys, rtol=1e-9, atol=0)), None)
        if same:
            same[0].append(name)
        else:
            groups.append(([name], xs, ring_ys, best_ys))
    for names, xs, ring_ys, best_ys in groups:
        colour, label = colours[names[0]], " = ".join(names)
        marks = {} if points else {"marker": "o", "ms": 4}
        ring_is_best = np.allclose(ring_ys, best_ys, rtol=1e-9, atol=0)
        ax.plot(xs, ring_ys, color=colour, **marks,
                label=f"{label}: over Ring" + (" (= wait-then-best)" if ring_is_best else ""))
        if not ring_is_best:  # Ring is not the best waiting algorithm everywhere
            ax.plot(xs, best_ys, color=colour, linestyle=":", **({} if points else {"marker": ".", "ms": 4}),
                    label=f"{label}: over wait-then-best")
        if points:
            px, pr, pb = points[names[0]]
            ax.plot(px, pr, "o", ms=4, color=colour)
            if not ring_is_best:
                ax.plot(px, pb, ".", ms=5, color=colour)
    ax.axhline(1.0, color="grey", lw=0.9, linestyle="--")
    ax.set_ylabel("StragglAR speedup (x, >1: StragglAR faster)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def plot_straggler_speedups(result: dict, path_vs_ranks: Path, path_vs_delay: Path, *, title: str,
                            at_delay: float | None = None, at_ranks: int | None = None) -> tuple[Path, Path]:
    """StragglAR's speedup over Ring (solid) and over "wait, then the best algorithm" (dotted, same
    colour) per fabric: against the rank count at one delay, and against the delay at one rank count.

    ``result`` is :meth:`lightrail.studies.stragglar.StragglarSweep.to_dict`'s output; ``at_delay`` defaults
    to its largest delay and ``at_ranks`` to 8 if swept, else its smallest rank count. Time is affine
    in the delay, so the curves against it are drawn exactly from ``result["profiles"]`` between the
    swept delays (marked), peaks at D = StragglAR's phase 1 included.
    """
    import numpy as np

    cells, profiles = result["cells"], result.get("profiles", [])
    delays, ranks = result["delays_s"], result["ranks"]
    at_delay = max(delays) if at_delay is None else at_delay
    at_ranks = (8 if 8 in ranks else min(ranks)) if at_ranks is None else at_ranks
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = list(result["topologies"])
    colours = {name: cycle[i % len(cycle)] for i, name in enumerate(names)}

    def pick(name, keep, x_of):
        mine = sorted((c for c in cells if c["topology"] == name and keep(c)), key=x_of)
        return ([x_of(c) for c in mine], [c["speedup_over_ring"] for c in mine],
                [c["speedup_over_best"] for c in mine])

    # against n, at one delay
    fig, ax = plt.subplots(figsize=(10.5, 4.8))
    series = [(name, *pick(name, lambda c: c["delay_s"] == at_delay, lambda c: c["ranks"])) for name in names]
    _speedup_lines(ax, [s for s in series if s[1]], colours)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks], fontsize=8)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("ranks n (rank n-1 is the straggler)")
    ax.set_title(f"{title}\nstraggler {_delay_label(at_delay)} late", fontsize=10)
    _save(fig, path_vs_ranks)

    # against the delay, at one n: exact curves from the phase times, swept delays marked
    fig, ax = plt.subplots(figsize=(10.5, 4.8))
    positive = [d for d in delays if d > 0]
    scale = 1e3  # plot in ms, label with units
    points = {name: pick(name, lambda c: c["ranks"] == at_ranks, lambda c: c["delay_s"] * scale) for name in names}
    mine = {p["topology"]: p for p in profiles if p["ranks"] == at_ranks}
    series = []
    for name in names:
        if not points[name][0]:
            continue
        prof = mine.get(name)
        if prof is None or not positive:
            series.append((name, *points[name]))
            continue
        grid = np.unique(np.concatenate([np.linspace(0, min(positive), 50) if min(delays) == 0 else [],
                                         np.geomspace(min(positive), max(delays), 200), delays,
                                         [prof["stragglar_phase1_s"]] if prof["stragglar_phase1_s"] <= max(delays)
                                         else []]))
        ours = np.maximum(grid, prof["stragglar_phase1_s"]) + prof["stragglar_phase2_s"]
        ring = grid + prof["waiting_s"].get("ring", np.nan)
        best = grid + min(prof["waiting_s"].values())
        series.append((name, list(grid * scale), list(ring / ours), list(best / ours)))
    dense = bool(positive) and all(p in mine for p in names if points[p][0])
    _speedup_lines(ax, series, colours, points if dense else None)
    if positive and min(delays) == 0:
        ax.set_xscale("symlog", linthresh=min(positive) * scale, linscale=0.5)
        ax.set_xlim(-0.15 * min(positive) * scale, max(delays) * scale * 1.15)
    elif positive:
        ax.set_xscale("log")
    ax.set_xticks([d * scale for d in delays], [_delay_label(d) for d in delays], fontsize=8)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("straggler delay D (time; speedup over Ring peaks where D = StragglAR's phase 1)")
    ax.set_title(f"{title}\n{at_ranks} ranks", fontsize=10)
    _save(fig, path_vs_delay)
    return Path(path_vs_ranks), Path(path_vs_delay)


def plot_train_demo(result, path: Path, *, title: str) -> Path:
    """Per-iteration time of the demo job (a ``studies.train_demo.measure.PhotonicDemoResult``) on plain gloo
    and on emulated photonic rails."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for series, label in ((result.gloo_iteration_series_s, "gloo"),
                          (result.lightrail_iteration_series_s, "lightrail backend")):
        ax.plot(range(len(series)), [t * 1e3 for t in series], marker="o", ms=3, label=label)
    ax.set_xlabel("iteration (count)")
    ax.set_ylabel("iteration time, slowest rank (ms)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def plot_controller_load(points: Sequence[dict], path: Path, target_s: float, title: str) -> Path:
    """The controller's acquire latency (p50, p99) against the acquire rate it served, one point per offered load
    (``bench_controller.py --sweep``), with the p99 target: where the curve turns up is the controller's capacity."""
    points = sorted((p for p in points if p.get("p99_s") is not None), key=lambda p: p["rate_per_s"])
    rates = [p["rate_per_s"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(rates, [p["p99_s"] * 1e3 for p in points], marker="o", ms=4, label="p99")
    ax.plot(rates, [p["p50_s"] * 1e3 for p in points], marker="o", ms=4, linestyle="--", label="p50")
    ax.axhline(target_s * 1e3, color="grey", lw=0.8, linestyle="-.", label=f"target p99 {target_s * 1e3:g} ms")
    for p in points:
        ax.annotate("full rate" if p["pace_s"] == 0 else f"pace {p['pace_s'] * 1e3:g} ms",
                    (p["rate_per_s"], p["p99_s"] * 1e3), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("acquires served per second")
    ax.set_ylabel("acquire latency, request to grant (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)
