"""Numbers as people read them in terminal and HTML tables: a unit per column, a few significant digits, no
scientific notation, thousands separators, and tables that never cut a number short.

JSON and CSV keep full-precision numbers; only presentation goes through here. Column keys follow the JSON's
naming (``iteration_time_s``, ``capex_usd``, ``power_w``, ``overhead`` as a fraction), which picks the unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

__all__ = ["ZERO_TIME", "format_seconds", "format_percent", "format_usd", "format_watts", "format_number",
           "time_unit", "column_label", "format_column", "readable", "TableConsole"]

ZERO_TIME = 5e-10
"""Times below half a nanosecond print as 0: a sum of float differences is rarely exactly 0 (a stall of
1.5e-16 s is rounding, not a stall)."""
_TIME_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def _digits(x: float, sig: int = 3) -> str:
    """``x`` to ``sig`` significant digits in positional notation, with thousands separators: 10781500 ->
    '10,781,500', 0.000123 -> '0.000123', 4556.04 -> '4,556'."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(x))))
    text = f"{x:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def time_unit(values: Sequence[float]) -> tuple[float, str]:
    """The one unit a column of times is shown in: the largest that keeps its biggest value >= 1."""
    biggest = max((abs(v) for v in values if isinstance(v, int | float) and math.isfinite(v)), default=0.0)
    if biggest < ZERO_TIME:  # all zero: seconds, rather than a unit chosen by rounding noise
        return _TIME_UNITS[0]
    for scale, unit in _TIME_UNITS:
        if biggest >= scale:
            return scale, unit
    return _TIME_UNITS[-1]


def format_seconds(seconds: float, *, signed: bool = False, unit: tuple[float, str] | None = None) -> str:
    """``-9.1e-05 -> '-91 µs'``, ``1.23456 -> '1.23 s'``, below :data:`ZERO_TIME` ``'0'``; ``unit`` fixes the
    unit (a column's, :func:`time_unit`)."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "" if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)) else str(seconds)
    if abs(seconds) < ZERO_TIME:
        return "0"
    scale, name = unit or time_unit([seconds])
    sign = "+" if signed and seconds > 0 else ""
    return f"{sign}{_digits(seconds / scale)} {name}"


def format_percent(fraction: float, *, signed: bool = True) -> str:
    """A fraction as a percentage: ``355.69 -> '+35,569%'``, ``0.0456 -> '+4.56%'``, ``0 -> '0%'``."""
    if not isinstance(fraction, int | float) or not math.isfinite(fraction):
        return ""
    pct = fraction * 100
    if abs(pct) < 0.005:
        return "0%"
    text = f"{pct:,.0f}" if abs(pct) >= 100 else f"{pct:.2f}"
    return f"{'+' if signed and pct > 0 else ''}{text}%"


def format_usd(usd: float) -> str:
    """``10781500 -> '$10.8M'``, ``879 -> '$879'``, ``37299 -> '$37.3k'``."""
    if not isinstance(usd, int | float) or not math.isfinite(usd):
        return ""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(usd) >= scale:
            return f"{'-' if usd < 0 else ''}${_digits(abs(usd) / scale)}{suffix}"
    return f"{'-' if usd < 0 else ''}${_digits(abs(usd))}"


def format_watts(watts: float) -> str:
    """``2524 -> '2.52 kW'``, ``1.3e6 -> '1.3 MW'``."""
    if not isinstance(watts, int | float) or not math.isfinite(watts):
        return ""
    for scale, unit in ((1e6, "MW"), (1e3, "kW")):
        if abs(watts) >= scale:
            return f"{_digits(watts / scale)} {unit}"
    return f"{_digits(watts)} W"


def format_number(value) -> str:
    """Any other cell: integers with separators, floats to 4 significant digits, never ``e+07``."""
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return _digits(value, 4)
    return str(value)


_SUFFIXES = (("_usd", "USD"), ("_w", "W"), ("_s", "s"), ("_bytes", "bytes"), ("_%", "%"))
_WORDS = {"per_iteration": "/ iteration", "capex": "cost", "iteration_time": "iteration time"}


def _kind(key: str) -> str:
    k = key.lower()
    if k == "overhead" or k.endswith("overhead") or k.endswith("_fraction"):
        return "fraction"
    for suffix, kind in _SUFFIXES:
        if k.endswith(suffix):
            return kind
    return "number"


def column_label(key: str) -> str:
    """A JSON key as a column name: ``iteration_time_s -> 'iteration time'``, ``capex_usd -> 'cost'``,
    ``reconfigurations_per_iteration -> 'reconfigurations / iteration'``, ``overhead_% -> 'overhead'``."""
    k = str(key)
    if "." in k:  # a scenario field's path (a swept field): as the user wrote it
        return k
    for suffix, _ in _SUFFIXES:
        if k.lower().endswith(suffix) and len(k) > len(suffix):
            k = k[: -len(suffix)]
            break
    for word, label in _WORDS.items():
        k = k.replace(word, label)
    return k.replace("_", " ").strip()


def format_column(key: str, values: Sequence) -> tuple[str, list[str]]:
    """A table column's heading and cells in one unit: times in the unit of the column's largest value (in the
    heading), fractions as %, money in $, power in W/kW/MW, counts with separators."""
    kind = _kind(str(key))
    label = column_label(key)
    numeric = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if kind == "s" and numeric:
        unit = time_unit(numeric)
        return f"{label} ({unit[1]})", [_digits_or(v, lambda x: "0" if abs(x) < ZERO_TIME else _digits(x / unit[0]))
                                        for v in values]
    if kind == "fraction":
        return f"{label} (%)", [_digits_or(v, lambda x: format_percent(x)[:-1]) for v in values]
    if kind == "%":  # already a percentage
        return f"{label} (%)", [_digits_or(v, lambda x: format_percent(x / 100)[:-1]) for v in values]
    if kind == "USD":
        return label, [_digits_or(v, format_usd) for v in values]
    if kind == "W":
        return label, [_digits_or(v, format_watts) for v in values]
    return label, [format_number(v) for v in values]


def _digits_or(value, fmt) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return fmt(value) if math.isfinite(value) else ""
    return format_number(value)


def readable(table: Table) -> Table:
    """Let every column fold rather than cut a value short with an ellipsis (``+4556.0…``)."""
    for column in table.columns:
        if column.overflow == "ellipsis":
            column.overflow = "fold"
    return table


class TableConsole(Console):
    """A console that never truncates a table: columns fold, and when the output is not a terminal (piped to a
    file, 80 columns by default) a table wider than the console is printed at its natural width instead."""

    def print(self, *objects, **kwargs):  # noqa: A003 -- Console's own name
        tables = [o for o in objects if isinstance(o, Table)]
        for table in tables:
            readable(table)
        if not tables or self.is_terminal:
            return super().print(*objects, **kwargs)
        wide = self.options.update_width(10_000)
        need = max(Measurement.get(self, wide, t).maximum for t in tables)
        if need <= self.width:
            return super().print(*objects, **kwargs)
        saved = self._width
        self._width = need
        try:
            return super().print(*objects, **kwargs)
        finally:
            self._width = saved
