"""Numbers people read: units, sensible precision, no scientific notation, nothing cut short at 80 columns."""

from __future__ import annotations

import io
import json
import re

from rich.console import Console
from rich.table import Table

from lightrail.report.format import (
    TableConsole,
    column_label,
    format_column,
    format_percent,
    format_seconds,
    format_usd,
    format_watts,
)
from lightrail.report.html import Page, _Table, _table, percent_heatmap
from lightrail.units import format_time

SCI = re.compile(r"\d[eE][+-]?\d")


def test_money_time_and_percent_read_as_people_write_them():
    assert format_usd(1.07815e7) == "$10.8M" and format_usd(879) == "$879" and format_usd(37_299) == "$37.3k"
    assert format_seconds(-9.1e-05) == "-91 µs" and format_seconds(1.23456) == "1.23 s"
    assert format_seconds(1.522e-16) == "0"  # a stall of float rounding is no stall
    assert format_percent(355.69) == "+35,569%" and format_percent(0.0456) == "+4.56%" and format_percent(0) == "0%"
    assert format_watts(2524) == "2.52 kW"
    assert format_time(1.522e-16) == "0ns" and format_time(123_456.7) == "123457s"  # never 1.522e-07ns


def test_columns_have_one_unit_and_readable_names():
    label, cells = format_column("iteration_time_s", [0.0123, 0.5, 1e-5])
    assert label == "iteration time (ms)" and cells == ["12.3", "500", "0.01"]
    label, cells = format_column("overhead", [0.0123, 355.69, float("nan")])  # a fraction, shown in %
    assert label == "overhead (%)" and cells == ["+1.23", "+35,569", ""]
    assert format_column("overhead_%", [4556.04])[0] == "overhead (%)"
    assert format_column("capex_usd", [1.07815e7]) == ("capex", ["$10.8M"]) or \
        format_column("capex_usd", [1.07815e7])[1] == ["$10.8M"]
    assert column_label("reconfigurations_per_iteration") == "reconfigurations / iteration"
    assert column_label("ocs.reconfig_delay") == "ocs.reconfig_delay"


def test_html_tables_have_no_scientific_notation_and_no_raw_keys():
    rows = [{"policy": "opus", "iteration_time_s": 0.0507, "overhead": 355.69, "capex_usd": 1.07815e7,
             "drain_wait_s": -9.1e-05, "power_w": 324_000.0}]
    text = _table(_Table(rows))
    cells = re.findall(r"<t[dh]>(.*?)</t[dh]>", text)
    assert not [c for c in cells if SCI.search(c)], cells
    assert "overhead_%" not in text and "iteration_time_s" not in text
    assert "$10.8M" in cells and "-91" in cells and "+35,569" in cells and "324 kW" in cells
    assert Page("t").sections == []


def test_a_heat_map_spanning_decades_uses_a_signed_log_scale():
    z = [[1.0, 2.0], [5.0, 35_569.0]]
    args = percent_heatmap(z, title="overhead (%)")
    assert args["zmid"] == 0 and "log scale" in args["colorbar"]["title"]
    assert max(args["z"][1]) < 5 and "+35,569%" in json.dumps(args["text"], ensure_ascii=False)
    linear = percent_heatmap([[1.0, 2.0], [5.0, 9.0]], title="overhead (%)")
    assert linear["z"] == [[1.0, 2.0], [5.0, 9.0]] and linear["zmid"] == 0


def _wide_table() -> Table:
    table = Table(title="sweep")
    for col in ("policy", "delay", "lightrail-provisioned", "lightrail-on-demand", "opus-provisioned",
                "opus-on-demand", "electrical-baseline"):
        table.add_column(col, justify="right")
    table.add_row("lightrail", "10ms", "+4,556.04%", "+486.72%", "+35,569.12%", "+1,234.56%", "1,234.567ms")
    return table


def test_tables_piped_at_80_columns_are_never_cut_short():
    plain = Console(file=io.StringIO(), width=80)
    plain.print(_wide_table())
    assert "…" in plain.file.getvalue()  # what rich does by itself: the bug
    piped = TableConsole(file=io.StringIO(), width=80)
    piped.print(_wide_table())
    text = piped.file.getvalue()
    assert "…" not in text and "+35,569.12%" in text and not SCI.search(text)
    terminal = TableConsole(file=io.StringIO(), width=80, force_terminal=True)
    terminal.print(_wide_table())
    assert "…" not in terminal.file.getvalue()  # folded, not cut


def test_simulate_table_prints_a_zero_stall_as_0():
    from lightrail.report.rails import _time, signed_time

    assert _time(1.522e-16) == "0" and _time(0.0) == "0"  # was 1.522e-07ns
    assert _time(3.982e-3) == "3.982ms" and signed_time(-1.5e-16) == "0"
