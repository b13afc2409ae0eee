"""``lightrail report OUT_DIR``: one self-contained HTML page of what a verb wrote to its folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import JsonOut
from lightrail.cli.output import print_json


@app.command("report")
@friendly
def report_cmd(
    out_dir: Annotated[Path, typer.Argument(metavar="OUT_DIR", help="A verb's --out folder (simulate, sweep, a "
                                                                    "study); report.html is written into it.")],
    as_json: JsonOut = False,
):
    """Write OUT_DIR/report.html: interactive figures (plotly.js inline, opens offline), the tables, the
    scenario, the static figures and a link to the Perfetto trace."""
    from lightrail.report.html import build_page, write_page

    page = build_page(out_dir)
    path = write_page(page, out_dir)
    if as_json:
        print_json({"report": str(path), "sections": [heading for heading, _ in page.sections]})
    else:
        out.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; open it in a browser, no network needed)",
                  highlight=False)
