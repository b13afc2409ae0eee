"""Static figures: the format follows the file's suffix, axes carry titles with units, heat-map panel
titles stay clear of the ticks above them, and the symlog axis keeps small overheads off its linear band."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.errors import ScenarioError
from lightrail.report import plots


@pytest.fixture
def kept(monkeypatch):
    """The figures the plot functions make, kept open after they are written."""
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    yield figures
    for fig in figures:
        fig.clf()


DELAY_ROWS = [{"policy": p, "mode": "provisioned", "delay_s": d, "overhead": o}
              for p, scale in (("lightrail", 1.0), ("opus", 3.0))
              for d, o in ((0.0, 0.0), (1e-5, 0.0004 * scale), (1e-3, 0.003 * scale), (1e-2, 0.05 * scale))]


@pytest.mark.parametrize("suffix, magic", [("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_figures_are_written_in_their_suffix_format(tmp_path, suffix, magic):
    path = plots.plot_delay_sweep(DELAY_ROWS, tmp_path / f"overhead.{suffix}", title="t")
    assert path.read_bytes().startswith(magic)


def test_an_unknown_figure_format_names_the_flag(tmp_path):
    with pytest.raises(ScenarioError) as e:
        plots.plot_delay_sweep(DELAY_ROWS, tmp_path / "overhead.gif", title="t")
    assert e.value.field == "--format"


def test_symlog_band_ends_below_the_smallest_overhead(tmp_path, kept):
    plots.plot_delay_sweep(DELAY_ROWS, tmp_path / "o.png", title="t")
    ax = kept[-1].axes[0]
    smallest = min(r["overhead"] * 100 for r in DELAY_ROWS if r["overhead"] > 0)  # 0.04 %
    assert ax.yaxis.get_transform().linthresh <= smallest
    assert ax.xaxis.get_transform().linthresh <= 1e-5 * 1e3  # the 10 us delay is on the log part too
    # 0.04 % and 0.12 % are apart on screen (at least 5 % of the axis), not squashed together near zero
    y = ax.transData.transform([(0.01, 0.04), (0.01, 0.12)])[:, 1]
    assert (y[1] - y[0]) / ax.bbox.height > 0.05
    assert "(ms)" in ax.get_xlabel() and "(%)" in ax.get_ylabel()


def test_heat_map_titles_clear_the_ticks_of_the_panel_above(tmp_path, kept):
    ranks, sizes, delays = [8, 16, 32, 64, 128], [2.0**k for k in range(10, 31)], [0, 1e-6, 1e-5, 1e-3]
    speedup = {n: np.exp(np.random.default_rng(n).normal(size=(len(delays), len(sizes)))) for n in ranks}
    plots.plot_speedup_heatmaps("allreduce", ranks, sizes, delays, speedup, tmp_path / "h.png", title="t")
    fig = kept[-1]
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_images()]
    above, below = panels[0], panels[4]  # n = 8 (first row), n = 128 (second row)
    title = below.title.get_window_extent(renderer)
    for label in above.get_xticklabels():
        assert not title.overlaps(label.get_window_extent(renderer))
    assert not title.overlaps(above.xaxis.label.get_window_extent(renderer))
    assert "bytes" in below.get_xlabel() and "delay" in panels[0].get_ylabel()


def test_sweep_cells_heat_map_has_one_panel_per_other_value(tmp_path, kept):
    rows = [{"a": a, "b": b, "c": c, "overhead": a * b * (2 if c == "x" else 1)}
            for c in ("x", "y") for a in (1, 2, 3) for b in (1, 2)]
    plots.plot_sweep_cells(rows, ["a", "b", "c"], tmp_path / "s.png", title="t")
    panels = [ax for ax in kept[-1].axes if ax.get_images()]
    assert [ax.get_title() for ax in panels] == ["c = x", "c = y"]
    grid = panels[0].get_images()[0].get_array()
    assert grid.shape == (2, 3) and grid[1, 2] == pytest.approx(2 * 3 * 2 * 100)


def test_value_axes_are_titled_with_their_unit(tmp_path, kept):
    rows = [{"algorithm": a, "size_bytes": 2.0**k, "time_s": 1e-6 * k, "busbw_Bps": 1e9 * k}
            for a in ("ring", "direct") for k in range(10, 16)]
    plots.plot_sweep(rows, tmp_path / "s.png", title="t")
    parts = {k: 0.001 for k in ("compute_s", "communication_s", "reconfiguration_s", "control_s", "bubble_s")}
    plots.plot_breakdown({"electrical": {**parts, "iteration_time_s": 0.005}}, tmp_path / "b.png", title="t")
    for fig in kept:
        for ax in fig.axes:
            assert "(" in ax.get_xlabel() and ")" in ax.get_xlabel(), ax.get_xlabel()
    assert all("(" in ax.get_ylabel() for ax in kept[0].axes)
