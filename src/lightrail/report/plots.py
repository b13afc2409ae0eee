"""Plots (matplotlib, headless Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lightrail.report.files import write_atomic  # noqa: E402
from lightrail.units import format_size  # noqa: E402

__all__ = ["plot_sweep", "plot_breakdown", "plot_delay_sweep", "plot_speedup_heatmaps"]


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
        ax.set_xlabel("message size per rank")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time (s)")
    ax_bw.set_ylabel("bus bandwidth (GB/s)")
    ax_t.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return Path(path)


def plot_breakdown(rows: dict[str, dict], path: Path, *, title: str) -> Path:
    """Stacked bars of an iteration's time (compute, communication, reconfiguration, bubble) per fabric."""
    parts = [("compute_s", "compute", "#4C72B0"), ("communication_s", "exposed communication", "#55A868"),
             ("reconfiguration_s", "reconfiguration stall", "#C44E52"), ("bubble_s", "pipeline bubble", "#CCCCCC")]
    fig, ax = plt.subplots(figsize=(9, 3.6))
    names = list(rows)
    left = [0.0] * len(names)
    for key, label, color in parts:
        values = [rows[n][key] for n in names]
        ax.barh(names, values, left=left, label=label, color=color)
        left = [a + b for a, b in zip(left, values, strict=True)]
    for i, n in enumerate(names):
        ax.text(left[i], i, f"  {rows[n]['iteration_time_s']:.3f} s", va="center", fontsize=9)
    ax.set_xlabel("seconds per iteration (mean over pipeline stages)")
    ax.set_xlim(0, max(left) * 1.18)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return Path(path)


def plot_delay_sweep(rows: Sequence[dict], path: Path, *, title: str) -> Path:
    """Training overhead against OCS reconfiguration delay, one line per (policy, mode)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    keys = list(dict.fromkeys((r["policy"], r["mode"]) for r in rows))
    for policy, mode in keys:
        mine = sorted((r for r in rows if (r["policy"], r["mode"]) == (policy, mode)), key=lambda r: r["delay_s"])
        ax.plot([r["delay_s"] * 1e3 for r in mine], [r["overhead"] * 100 for r in mine], marker="o", ms=4,
                linestyle="-" if policy == "lightrail" else "--", label=f"{policy}, {mode}")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("OCS reconfiguration delay (ms)")
    ax.set_ylabel("iteration time overhead vs electrical rails (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return Path(path)


def plot_speedup_heatmaps(op: str, ranks: Sequence[int], sizes: Sequence[float], delays: Sequence[float],
                          speedup: dict, path: Path, *, title: str) -> Path:
    """Per rank count, a heat map of the reconfigurable fabric's speedup over the best algorithm on
    the static ring, against message size (x) and reconfiguration delay (y)."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    cols = min(4, len(ranks))
    rows = -(-len(ranks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows), squeeze=False)
    values = np.log2(np.concatenate([speedup[n].ravel() for n in ranks]))
    bound = max(1.0, float(np.nanmax(np.abs(values[np.isfinite(values)]))))
    norm = TwoSlopeNorm(vmin=-bound, vcenter=0.0, vmax=bound)
    image = None
    for ax, n in zip(axes.ravel(), ranks, strict=False):
        image = ax.imshow(np.log2(speedup[n]), aspect="auto", origin="lower", cmap="RdBu", norm=norm)
        ax.set_title(f"n = {n}", fontsize=9)
        ticks = list(range(0, len(sizes), 4))
        ax.set_xticks(ticks, [format_size(sizes[i]) for i in ticks], rotation=45, fontsize=7)
        ax.set_yticks(range(len(delays)), [f"{d * 1e6:g}us" if d < 1e-3 else f"{d * 1e3:g}ms" for d in delays],
                      fontsize=7)
    for ax in axes.ravel()[len(ranks):]:
        ax.axis("off")
    if image is not None:
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
        bar.set_label("log2 speedup (blue: reconfiguring wins)")
    fig.suptitle(title, fontsize=11, y=1.03)
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    plt.close(fig)
    return Path(path)
