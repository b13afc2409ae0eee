"""``--format png|svg|pdf`` on every other verb that draws a static figure (issue 18 part 4): the figures come
in the asked format under their usual stems, nothing is left as png, and a format nobody draws is one line
naming ``--format`` before any work or any file. tests/report/test_formats.py covers simulate, sweep,
collective-sweep and study collectives."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError

runner = CliRunner()
TESTS = Path(__file__).resolve().parents[1]


def _nccl_log(tmp_path: Path) -> str:
    """An all_reduce_perf log of a ring on a switch, made by test_calibrate's generator (nccl-tests' format)."""
    spec = importlib.util.spec_from_file_location("_calibrate_log", TESTS / "test_calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(mod.nccl_log(mod.engine_times("switch", "ring", 4, mod.SIZES, 5e-6, 1e-6, 48e9), mod.SIZES, 4))
    return str(path)


# verb -> (arguments given tmp_path, figure stems); the smallest inputs each verb takes
VERBS = {
    "stragglar sweep": (lambda tmp: ["stragglar", "sweep", "--ranks", "4", "--straggler-delays", "0,1ms",
                                     "--topologies", "switch"], ["speedup-vs-ranks", "speedup-vs-delay"]),
    "study scaleup": (lambda tmp: ["study", "scaleup", "--racks", "2", "--requests", "20"], ["by-size"]),
    "study fl": (lambda tmp: ["study", "fl", "--clients", "100", "--jobs", "2"], ["study-fl"]),
    "te run": (lambda tmp: ["te", "run", "--topology", "abilene", "--slices", "3", "--matrices", "1"],
               ["te-run-cdf"]),
    "study te": (lambda tmp: ["study", "te", "--topologies", "abilene", "--lambdas", "0.001", "--perturbations",
                              "0.05", "--slice-counts", "3", "--matrices", "1"],
                 ["study-te-cdf", "study-te-sweep", "study-te-blast"]),
    "calibrate nccl-tests": (lambda tmp: ["calibrate", "nccl-tests", _nccl_log(tmp), "--ranks", "4"],
                             ["calibration"]),
    # these two start processes (~7 s and ~9 s here): one format each; moe's other format is drawn from its JSON
    "moe bench": (lambda tmp: ["moe", "bench", "--ranks", "2", "--tokens", "16", "--experts", "2", "--topk", "1",
                               "--hidden", "8", "--repeats", "1", "--warmup", "0", "--no-backward"], ["moe-bench"]),
    "train-demo": (lambda tmp: ["train-demo", "--ranks", "2", "--tp", "1", "--pp", "1", "--dp", "2", "--steps", "2"],
                   ["iterations"]),
}
FAST = [v for v in VERBS if v not in ("moe bench", "train-demo")]


def assert_figures(out: Path, stems: list[str], fmt: str) -> None:
    """Every figure is ``<stem>.<fmt>`` in that format, and no figure of another format is left."""
    for stem in stems:
        data = (out / f"{stem}.{fmt}").read_bytes()
        assert data.startswith(b"%PDF") if fmt == "pdf" else b"<svg" in data[:4096], stem
    strays = [p.name for p in out.iterdir() if p.suffix in (".png", ".svg", ".pdf") and p.suffix != f".{fmt}"]
    assert not strays


@pytest.mark.parametrize("verb, fmt", [(v, f) for v in FAST for f in ("svg", "pdf")]
                         + [("moe bench", "svg"), ("train-demo", "pdf")])
def test_figures_come_in_the_asked_format(verb, fmt, tmp_path):
    args, stems = VERBS[verb]
    out = tmp_path / "out"
    result = runner.invoke(app, [*args(tmp_path), "--format", fmt, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert_figures(out, stems, fmt)
    if verb == "moe bench":  # the other format from the same result, without a second run
        from lightrail.report.moe import write_moe_bench

        pdf = tmp_path / "pdf"
        write_moe_bench(json.loads((out / "summary.json").read_text()), pdf, fmt="pdf")
        assert_figures(pdf, stems, "pdf")


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_unknown_format_is_one_line_naming_the_flag(verb, tmp_path):
    args, _ = VERBS[verb]
    out = tmp_path / "o"
    result = runner.invoke(app, [*args(tmp_path), "--format", "gif", "--out", str(out)])
    assert result.exit_code == 2 and "--format" in result.output
    assert result.output.strip().count("\n") == 0
    assert not out.exists()


def test_png_keeps_every_old_file_name():
    from lightrail.report.fl import FL_FILES
    from lightrail.report.plots import figure_files
    from lightrail.report.scaleup import SCALEUP_FILES
    from lightrail.report.stragglar import SWEEP_FILES
    from lightrail.report.te import RUN_FILES, STUDY_FILES

    for names in (FL_FILES, SCALEUP_FILES, SWEEP_FILES, RUN_FILES, STUDY_FILES):
        assert figure_files(names) == names
        svg = figure_files(names, "SVG")
        assert [Path(n).stem for n in svg] == [Path(n).stem for n in names]
        assert [n for n in svg if n.endswith(".svg")] and not [n for n in svg if n.endswith(".png")]
        assert [n for n in svg if not n.endswith(".svg")] == [n for n in names if not n.endswith(".png")]
    with pytest.raises(ScenarioError) as e:
        figure_files(FL_FILES, "gif")
    assert e.value.field == "--format"


CATEGORIES = {"scheduling policy", "slicer", "topology", "dispatch variant"}  # x axes of named bars: no unit


@pytest.mark.parametrize("verb", FAST)
def test_png_by_default_and_every_axis_titled_with_its_unit(verb, tmp_path, monkeypatch):
    import lightrail.report.plots as plots

    labels, write = [], plots._write

    def recording(fig, path, **kwargs):
        for ax in (a for a in fig.axes if a.has_data()):  # a shared x axis is titled once, under the lowest plot
            x = " ".join(sib.get_xlabel() for sib in ax.get_shared_x_axes().get_siblings(ax)).strip()
            labels.append((Path(path).name, x, ax.get_ylabel()))
        return write(fig, path, **kwargs)

    monkeypatch.setattr(plots, "_write", recording)
    args, stems = VERBS[verb]
    out = tmp_path / "out"
    result = runner.invoke(app, [*args(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert all((out / f"{stem}.png").read_bytes().startswith(b"\x89PNG") for stem in stems)
    assert {name for name, _, _ in labels} == {f"{stem}.png" for stem in stems}
    for name, x, y in labels:
        assert "(" in y, (name, y)
        assert x in CATEGORIES or "(" in x, (name, x)
