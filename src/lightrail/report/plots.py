"""Plots (matplotlib, headless Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lightrail.report.files import write_atomic  # noqa: E402
from lightrail.units import format_size  # noqa: E402

__all__ = ["plot_sweep"]


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
