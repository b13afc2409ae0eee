"""One self-contained HTML report of an output folder: interactive plotly figures (plotly.js inlined, so
the file opens offline and can be mailed), the tables, the scenario, the static figures, and a link to
the Perfetto trace. Built from the files the verbs write (``summary.json``, ``sweep.json``, ...), so
``lightrail report OUT_DIR`` and ``--html`` give the same page."""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightrail.errors import ScenarioError
from lightrail.report.files import write_text
from lightrail.report.format import (
    format_column,
    format_percent,
    format_seconds,
    format_usd,
    format_watts,
    time_unit,
)

__all__ = ["REPORT", "Page", "build_page", "render", "write_page", "write_report"]

REPORT = "report.html"
"""The report's file name in its folder (``lightrail simulate --html --out DIR`` writes ``DIR/report.html``)."""

_MAX_ROWS = 1000
_IMAGES = {".png": "image/png", ".svg": "image/svg+xml"}
_PARTS = (("compute_s", "compute", "#4C72B0"), ("communication_s", "exposed communication", "#55A868"),
          ("reconfiguration_s", "reconfiguration stall", "#C44E52"), ("control_s", "controller round trips", "#8172B2"),
          ("bubble_s", "pipeline bubble", "#CCCCCC"))
_OVERHEAD = (("switching_delay_s", "switching", "#C44E52"), ("drain_wait_s", "drain wait", "#DD8452"),
             ("control_plane_s", "control", "#8172B2"), ("lost_overlap_s", "lost overlap", "#937860"))
"""Parts and colours as the static figures draw them (report/plots.py)."""
_FABRICS = ("electrical", "photonic", "ideal (0-delay OCS)")


@dataclass
class Page:
    """What a report shows, in order: sections of figures (plotly figure objects), tables (rows of dicts)
    and free HTML."""

    title: str
    sections: list[tuple[str, list]] = field(default_factory=list)

    def add(self, heading: str, *items) -> None:
        self.sections.append((heading, [i for i in items if i is not None]))


@dataclass(frozen=True)
class _Table:
    rows: Sequence[dict]
    caption: str = ""


@dataclass(frozen=True)
class _Html:
    text: str


# ---- figures from the verbs' JSON -----------------------------------------------------------------------------

def _simulate(page: Page, summary: dict) -> None:
    import plotly.graph_objects as go

    names = list(summary["breakdown"])
    fig = go.Figure()
    for key, label, colour in _PARTS:
        fig.add_bar(name=label, y=names, x=[summary["breakdown"][n].get(key, 0.0) * 1e3 for n in names],
                    orientation="h", marker_color=colour)
    fig.update_layout(barmode="stack", title=f"{summary['scenario']}: {summary['layout']}, one iteration",
                      xaxis_title="time per iteration (ms, mean over pipeline stages)", yaxis_title="fabric",
                      yaxis_autorange="reversed", height=320)
    policies = [r["policy"] for r in summary["ablation"]]
    over = go.Figure()
    for key, label, colour in _OVERHEAD:
        over.add_bar(name=label, y=policies, x=[r["overhead_breakdown_s"][key] * 1e3 for r in summary["ablation"]],
                     orientation="h", marker_color=colour)
    over.update_layout(barmode="relative", title=f"policy ablation ({summary['mode']}): where the overhead goes",
                       xaxis_title="overhead over electrical rails per iteration (ms)", yaxis_title="policy",
                       yaxis_autorange="reversed", height=120 + 40 * len(policies))
    times = [summary["baseline_iteration_time_s"], summary["iteration_time_s"], summary["ideal_iteration_time_s"]]
    unit = time_unit(times)
    ideal = summary["ideal_iteration_time_s"] / summary["baseline_iteration_time_s"] - 1
    costs = summary["costs"]
    # rows of different quantities: each row is formatted in its own unit (the row's name says which)
    headline = [{"": f"iteration time ({unit[1]})", **dict(zip(_FABRICS, (format_seconds(t, unit=unit).split()[0]
                                                                           for t in times), strict=True))},
                {"": "overhead vs electrical rails", **dict(zip(_FABRICS, ("0%", format_percent(summary["overhead"]),
                                                                           format_percent(ideal)), strict=True))},
                {"": "rail network power", _FABRICS[0]: format_watts(costs["electrical"]["power_w"]),
                 _FABRICS[1]: format_watts(costs["photonic"]["power_w"]), _FABRICS[2]: ""},
                {"": "rail network cost", _FABRICS[0]: format_usd(costs["electrical"]["capex_usd"]),
                 _FABRICS[1]: format_usd(costs["photonic"]["capex_usd"]), _FABRICS[2]: ""}]
    ablation = [{"policy": r["policy"], "iteration_time_s": r["iteration_time_s"], "overhead": r["overhead"],
                 "reconfigurations / rail": r["reconfigurations_per_iteration"],
                 "round trips / rank": r["controller_round_trips_per_iteration"],
                 **{f"{label}_s": r["overhead_breakdown_s"][k] for k, label, _ in _OVERHEAD}}
                for r in summary.get("ablation") or []]
    delay = summary["reconfig_delay_s"]
    page.add(f"simulate: {summary['scenario']}", fig,
             _Table(headline, f"OCS delay {format_seconds(delay) if delay else 0}, {summary['policy']}"),
             over, _Table(ablation, "policy ablation"))


def _delay_sweep(page: Page, sweep: dict) -> None:
    import plotly.graph_objects as go

    rows = sweep["rows"]
    fig = go.Figure()
    for policy, mode in dict.fromkeys((r["policy"], r["mode"]) for r in rows):
        mine = sorted((r for r in rows if (r["policy"], r["mode"]) == (policy, mode)), key=lambda r: r["delay_s"])
        fig.add_scatter(x=[r["delay_s"] * 1e3 for r in mine], y=[r["overhead"] * 100 for r in mine],
                        mode="lines+markers", name=f"{policy}, {mode}",
                        line_dash="solid" if policy == "lightrail" else "dash")
    fig.update_layout(title=f"{sweep['scenario']}: overhead of photonic rails against the OCS delay",
                      xaxis_title="OCS reconfiguration delay (ms)",
                      yaxis_title="iteration time overhead vs electrical rails (%)", height=420)
    table = [{k: v for k, v in r.items() if k != "overhead_breakdown_s"} | r["overhead_breakdown_s"] for r in rows]
    page.add("OCS delay sweep", fig, _Table(table))


def _file_sweep(page: Page, sweep: dict) -> None:
    import plotly.graph_objects as go

    fields_ = sweep["fields"]
    defaults = sweep.get("defaults", {})
    cells = [c | {"values": {f: c["values"].get(f, defaults.get(f)) for f in fields_}} for c in sweep["rows"]]
    ok = [c for c in cells if c["ok"]]
    figs = []
    if ok and len(fields_) == 1:
        f = fields_[0]
        fig = go.Figure(go.Scatter(x=[str(c["values"][f]) for c in ok],
                                   y=[c["metrics"]["overhead"] * 100 for c in ok], mode="lines+markers"))
        fig.update_layout(title=f"{sweep['name']}: overhead per cell", xaxis_title=f,
                          yaxis_title="overhead vs electrical rails (%)", height=420)
        figs.append(fig)
    elif ok:
        xf, yf, rest = fields_[0], fields_[1], fields_[2:]
        panels = list(dict.fromkeys(tuple(c["values"][f] for f in rest) for c in ok))[:6]
        xs = list(dict.fromkeys(c["values"][xf] for c in cells))
        ys = list(dict.fromkeys(c["values"][yf] for c in cells))
        for panel in panels:
            z = [[None] * len(xs) for _ in ys]
            for c in ok:
                if tuple(c["values"][f] for f in rest) == panel:
                    z[ys.index(c["values"][yf])][xs.index(c["values"][xf])] = c["metrics"]["overhead"] * 100
            fig = go.Figure(go.Heatmap(x=[str(x) for x in xs], y=[str(y) for y in ys],
                                       **percent_heatmap(z, title="overhead (%)")))
            where = ", ".join(f"{f} = {v}" for f, v in zip(rest, panel, strict=True))
            fig.update_layout(title=f"{sweep['name']}: overhead vs electrical rails{f' ({where})' if where else ''}",
                              xaxis_title=xf, yaxis_title=yf, xaxis_type="category", yaxis_type="category",
                              height=460)
            figs.append(fig)
    table = [{"cell": c["cell"], **c["values"], "status": "ok" if c["ok"] else "failed", "error": c["error"],
              **c["metrics"]} for c in cells]
    page.add(f"sweep: {sweep['name']} ({sweep['cells']} cells, {sweep['failed']} failed, {sweep['runner']}, "
             f"{sweep['wall_s']:.1f} s)", *figs, _Table(table))


def _collective_study(page: Page, study: dict) -> None:
    """Per op and rank count, the reconfigurable fabric's speedup over the static ring (log2, blue: switching
    circuits wins) against message size and OCS delay, as the static heat maps."""
    import plotly.graph_objects as go

    from lightrail.units import format_size

    cells = study["cells"]
    figs = []
    for op in study["grid"]["ops"]:
        for n in study["grid"]["ranks"]:
            mine = [c for c in cells if c["op"] == op and c["ranks"] == n]
            if not mine:
                continue
            sizes = sorted({c["size_bytes"] for c in mine})
            delays = sorted({c["delay_s"] for c in mine})
            z = [[None] * len(sizes) for _ in delays]
            for c in mine:
                speedup = c["speedup_vs_static_ring"]
                z[delays.index(c["delay_s"])][sizes.index(c["size_bytes"])] = (
                    math.log2(speedup) if speedup and speedup > 0 else None)
            fig = go.Figure(go.Heatmap(z=z, x=[format_size(x) for x in sizes], y=[f"{d * 1e3:g} ms" for d in delays],
                                       colorscale="RdBu", zmid=0, colorbar_title="log2 speedup"))
            fig.update_layout(title=f"{op}, {n} ranks: reconfigurable fabric vs the static ring",
                              xaxis_title="message size per rank (bytes)", yaxis_title="OCS reconfiguration delay",
                              xaxis_type="category", yaxis_type="category", height=380)
            figs.append(fig)
    page.add("collective study", *figs, _Table(study.get("findings", []), "findings"),
             _Table([{k: v for k, v in c.items() if not isinstance(v, dict)} for c in cells], "cells"))


def _generic(page: Page, name: str, data) -> None:
    """Any other JSON output: its scalars as one table, and every list of records as a table."""
    if not isinstance(data, dict):
        return
    scalars = [{"field": k, "value": v} for k, v in data.items() if isinstance(v, str | int | float | bool)]
    tables = [_Table(v, k) for k, v in data.items()
              if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
    if scalars or tables:
        page.add(name, _Table(scalars) if scalars else None, *tables)


def percent_heatmap(z: list[list[float | None]], *, title: str) -> dict:
    """Heatmap arguments for percentages: a diverging scale centred on 0 (red: photonic slower), and where the
    values span more than two decades a signed log scale (``sign(v) log10(1 + |v|)``, ticks in %) so that one
    +35,569% cell does not wash the others out. The hover text shows each cell's own value."""
    flat = [abs(v) for row in z for v in row if v is not None and math.isfinite(v)]
    small = min((v for v in flat if v > 0), default=0.0)
    text = [[format_percent(v / 100) if v is not None else "" for v in row] for row in z]
    args = {"colorscale": "RdBu", "reversescale": True, "zmid": 0, "text": text,
            "hovertemplate": "%{x}, %{y}: %{text}<extra></extra>"}
    if not flat or max(flat) <= 100 * max(small, 0.01):
        return args | {"z": z, "colorbar": {"title": title}}
    log = [[None if v is None else math.copysign(math.log10(1 + abs(v)), v) for v in row] for row in z]
    top = math.ceil(math.log10(1 + max(flat)))
    ticks = [0.0] + [float(10**k) for k in range(0, top + 1)]
    signed = sorted({t for t in ticks} | {-t for t in ticks if any(v is not None and v < 0 for r in z for v in r)})
    return args | {"z": log, "colorbar": {"title": f"{title}, log scale",
                                          "tickvals": [math.copysign(math.log10(1 + abs(t)), t) for t in signed],
                                          "ticktext": [format_percent(t / 100) for t in signed]}}


# ---- the page -----------------------------------------------------------------------------------------------

def build_page(out_dir: Path) -> Page:
    """Read an output folder into a :class:`Page`; a folder without any output is an error."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ScenarioError(f"no folder {str(out_dir)!r}", field="OUT_DIR", fix="give the --out folder of a verb")
    docs = {}
    for path in sorted(out_dir.glob("*.json")):
        if path.name in ("trace.json",):
            continue
        try:
            docs[path.name] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # not ours, or half-written by someone else: leave it out
    images = sorted(p for p in out_dir.iterdir() if p.suffix in _IMAGES)
    trace = out_dir / "trace.json"
    if not docs and not images:
        raise ScenarioError(f"{str(out_dir)!r} holds no lightrail output", field="OUT_DIR",
                            fix="run e.g. lightrail simulate --out DIR first")
    scenario = docs.pop("scenario.json", None)
    summary = docs.get("summary.json")
    name = (summary or {}).get("scenario") or (docs.get("sweep.json") or {}).get("name") or out_dir.name
    page = Page(title=f"lightrail report: {name}")
    for fname, data in docs.items():
        if fname == "summary.json" and isinstance(data, dict) and "ablation" in data:
            _simulate(page, data)
        elif fname == "sweep.json" and isinstance(data, dict) and "fields" in data and "cells" in data:
            _file_sweep(page, data)
        elif fname == "sweep.json" and isinstance(data, dict) and data.get("rows") and "delay_s" in data["rows"][0]:
            _delay_sweep(page, data)
        elif fname == "study.json" and isinstance(data, dict) and data.get("cells") and \
                "speedup_vs_static_ring" in data["cells"][0]:
            _collective_study(page, data)
        else:
            _generic(page, fname, data)
    if trace.is_file():
        page.add("trace", _Html(f'<p>The simulated iteration as a Chrome trace: <a href="{trace.name}">'
                                f'{trace.name}</a> (open it in <a href="https://ui.perfetto.dev">ui.perfetto.dev</a> '
                                f'or chrome://tracing; it stays beside this file).</p>'))
    if scenario is not None:
        page.add("scenario", _Html(f"<pre>{html.escape(json.dumps(scenario, indent=2))}</pre>"))
    if images:
        page.add("static figures", *(_Html(_img(p)) for p in images))
    return page


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure><img alt="{html.escape(path.name)}" src="data:{_IMAGES[path.suffix]};base64,{data}">'
            f"<figcaption>{html.escape(path.name)}</figcaption></figure>")


def _table(t: _Table) -> str:
    """Rows of dicts as an HTML table, each column in one unit named in its heading (:func:`format_column`)."""
    rows = list(t.rows)[:_MAX_ROWS]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    note = f" (first {_MAX_ROWS} of {len(t.rows)} rows; all are in the JSON)" if len(t.rows) > _MAX_ROWS else ""
    shown = []
    for c in columns:
        values = [r.get(c, "") for r in rows]
        label, cells = format_column(str(c), [json.dumps(v) if isinstance(v, dict | list) else v for v in values])
        shown.append((label, cells))
    head = "".join(f"<th>{html.escape(label)}</th>" for label, _ in shown)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cells[i])}</td>" for _, cells in shown) + "</tr>"
                   for i in range(len(rows)))
    caption = f"<caption>{html.escape(t.caption)}{note}</caption>" if t.caption or note else ""
    return f'<div class="table"><table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
.table{overflow-x:auto;max-height:32em;overflow-y:auto}table{border-collapse:collapse;font-size:.85em;margin:1em 0}
th,td{border:1px solid #ddd;padding:.2em .5em;text-align:right}th{background:#f4f4f4;position:sticky;top:0}
caption{text-align:left;font-style:italic}pre{background:#f8f8f8;padding:1em;overflow-x:auto}
img{max-width:100%}figure{margin:1em 0}"""


def render(page: Page) -> str:
    """The page as one HTML document with plotly.js inline."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from lightrail import __version__

    parts = []
    n = 0
    for heading, items in page.sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        for item in items:
            if isinstance(item, _Table):
                parts.append(_table(item))
            elif isinstance(item, _Html):
                parts.append(item.text)
            else:
                n += 1
                parts.append(pio.to_html(item, full_html=False, include_plotlyjs=False, div_id=f"figure-{n}",
                                         config={"displaylogo": False, "responsive": True}))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(page.title)}</title>'
            f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h1>{html.escape(page.title)}</h1><p>lightrail {__version__}; self-contained: opens offline.</p>"
            + "\n".join(parts) + "</body></html>\n")


def write_page(page: Page, out_dir: Path) -> Path:
    return write_text(Path(out_dir) / REPORT, render(page))


def write_report(out_dir: Path) -> Path:
    """``out_dir/report.html`` from what ``out_dir`` holds."""
    return write_page(build_page(out_dir), out_dir)
