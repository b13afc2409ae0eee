"""The HTML report: one file, plotly.js inline (nothing fetched), figures and tables from what the verbs
wrote, and the ``report`` verb's errors. (``test_html_browser.py`` opens it in Chromium.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.report.html import build_page

TINY = Path(__file__).resolve().parents[2] / "examples" / "debug-tiny.yaml"
runner = CliRunner()


def _offline(page: str) -> None:
    assert not re.search(r"<script[^>]+src=", page)  # no CDN: every script is inline
    assert "Plotly.newPlot" in page  # (the browser test checks that nothing is fetched)


def test_simulate_html_writes_the_report_with_the_trace_linked(tmp_path):
    result = runner.invoke(app, ["simulate", str(TINY), "--html", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # --json still prints one JSON object
    page = (tmp_path / "report.html").read_text()
    _offline(page)
    assert page.count('class="plotly-graph-div"') == 2
    assert 'href="trace.json"' in page and "&quot;debug-tiny&quot;" in page  # the trace, the scenario
    assert "data:image/png;base64," in page  # the static figures too


def test_a_sweep_folder_reports_one_heat_map_per_panel_and_every_cell(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"scenario": str(TINY), "grid": {"ocs.reconfig_delay": ["0", "1ms", "2ms"],
                                                                      "job.micro_batches": [4, 8]},
                                     "list": [{"ocs.mode": "on-demand"}, {"ocs.mode": "provisioned"}]}))
    out = tmp_path / "out"
    assert runner.invoke(app, ["sweep", str(sweep), "--local", "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["report", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["report"] == str(out / "report.html")
    page = (out / "report.html").read_text()
    _offline(page)
    assert page.count('class="plotly-graph-div"') == 2  # one heat map per OCS mode
    assert page.count("<tr>") - page.count("<thead><tr>") >= 12  # a row per cell
    headings = [h for h, _ in build_page(out).sections]
    assert headings[0].startswith("sweep:") and "scenario" in headings


def test_report_on_a_folder_without_output_is_one_line_and_exit_2(tmp_path):
    for folder in (tmp_path, tmp_path / "missing"):
        result = runner.invoke(app, ["report", str(folder)])
        assert result.exit_code == 2 and "OUT_DIR" in result.output
        assert result.output.strip().count("\n") == 0
    assert not (tmp_path / "report.html").exists()


def test_a_study_with_html_reports_its_tables_and_heat_maps(tmp_path):
    result = runner.invoke(app, ["study", "collectives", "--ops", "allreduce", "--ranks", "8,16", "--sizes",
                                 "1KiB,1MiB", "--ocs-delays", "0,1ms", "--out", str(tmp_path), "--html"])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report.html").read_text()
    _offline(page)
    assert page.count("<img alt=\"heatmap-allreduce.png\" src=\"data:image/png;base64,") == 1  # inline
    assert page.count('class="plotly-graph-div"') == 2  # a speedup heat map per rank count
    assert "findings" in page and "<table>" in page
