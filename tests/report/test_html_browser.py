"""The HTML report opened in a real browser (headless Debian Chromium over the DevTools protocol): every
figure renders, nothing goes to the console as an error, and nothing is fetched from the network; a
screenshot is kept in out/browser-test/ (its path is printed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lightrail.cli import app

from .cdp import Browser, find_chromium

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "debug-tiny.yaml"
SCREENSHOT = ROOT / "out" / "browser-test" / "report.png"
"""Kept after the run (out/ is not tracked), so a person can look at what the browser drew."""
CHROMIUM = find_chromium()
runner = CliRunner()


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    """``simulate --html`` and ``sweep FILE --html`` (a 2 x 2 grid in both OCS modes), on the tiny job."""
    out = tmp_path_factory.mktemp("reports")
    result = runner.invoke(app, ["simulate", str(TINY), "--html", "--out", str(out / "simulate")])
    assert result.exit_code == 0, result.output
    sweep = out / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"scenario": str(TINY), "grid": {"ocs.reconfig_delay": ["0", "1ms"],
                                                                     "job.micro_batches": [4, 8]},
                                     "list": [{"ocs.mode": "on-demand"}, {"ocs.mode": "provisioned"}]}))
    result = runner.invoke(app, ["sweep", str(sweep), "--local", "--html", "--out", str(out / "sweep")])
    assert result.exit_code == 0, result.output
    return {"simulate": out / "simulate" / "report.html", "sweep": out / "sweep" / "report.html"}


def _open(browser: Browser, page: Path) -> int:
    """Load ``page``; wait until plotly has drawn every figure it holds; return how many."""
    browser.send("Page.navigate", url=page.as_uri())
    browser.wait_event("Page.loadEventFired")
    expected = page.read_text().count('class="plotly-graph-div"')
    deadline = time.monotonic() + 30
    while browser.evaluate("document.querySelectorAll('.js-plotly-plot .main-svg').length") < expected:
        assert time.monotonic() < deadline, f"plotly did not draw every figure of {page}"
        time.sleep(0.2)
    browser.events = [e for e in browser.events if e.get("method") != "Page.loadEventFired"]
    return expected


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (make test installs Debian's chromium)")
def test_reports_render_in_chromium_offline_without_console_errors(reports, tmp_path):
    browser = Browser(CHROMIUM, tmp_path / "profile")
    try:
        for domain in ("Runtime", "Log", "Page", "Network"):
            browser.send(f"{domain}.enable")
        assert _open(browser, reports["sweep"]) == 2  # a heat map per OCS mode
        cells = browser.evaluate("document.querySelectorAll('.js-plotly-plot .heatmaplayer image, "
                                 ".js-plotly-plot .hm image').length")
        sweep_rows = browser.evaluate("document.querySelectorAll('table tbody tr').length")

        assert _open(browser, reports["simulate"]) == 2  # the time breakdown, the ablation's overhead parts
        bars = browser.evaluate("document.querySelectorAll('.js-plotly-plot .barlayer .point').length")
        titles = browser.evaluate("[...document.querySelectorAll('.js-plotly-plot .xtitle')].map(e => e.textContent)")
        tables = browser.evaluate("document.querySelectorAll('table').length")
        link = browser.evaluate("document.querySelector('a[href=\"trace.json\"]') !== null")
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shot = browser.screenshot(SCREENSHOT)
        print(f"\nscreenshot of the report in chromium: {shot}")
        errors = browser.errors()
        requests = [e["params"]["request"]["url"] for e in browser.events
                    if e.get("method") == "Network.requestWillBeSent"]
    finally:
        browser.close()
    assert cells >= 2 and sweep_rows >= 8  # both heat maps drew their cells; a table row per cell
    assert bars >= 3 * 5  # three fabrics x five time parts in the first figure alone
    assert any("ms" in t for t in titles)  # axes are titled with their unit
    assert tables >= 2 and link
    assert errors == []
    assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests  # offline: no CDN
    assert shot.stat().st_size > 10_000
