"""The one place that bounds what a request may ask for, checked before anything is built.

Counts, ranges, value lists and grid products are refused here, from their sizes alone, so a request this
machine cannot hold never allocates: ``1..100000000`` is refused from its two ends, a 6-million-cell grid
from the lengths of its axes. Every bound is listed, with what it protects, in docs/limits.md. Standard
library only: the CLI imports this module when it starts, and the studies and the core may use it too.
"""

from __future__ import annotations

import math
import os

from lightrail.errors import ScenarioError

__all__ = ["MAX_RANGE", "MAX_VALUES", "MAX_CELLS", "memory_budget", "check_count", "check_fits", "check_values",
           "range_values", "check_grid", "show_count"]

MAX_RANGE = 65_536
"""Most values a ``lo..hi`` range may list (each is a case to compute); checked from its ends."""
MAX_VALUES = 1_000
"""Most values one list option may hold (delays, sizes, cluster sizes): each is a row of every table and a point
of every plot, and each costs a model evaluation or a simulation."""
MAX_CELLS = 100_000
"""Most cells of a sweep file (grid product x listed cells): each is a simulation of photonic against electrical
rails (50 ms for a 32-GPU debug scenario, seconds for real jobs: 1.4 h to days on one core), and each holds a dict
of its values."""


def show_count(n: int | float) -> str:
    """``n`` for a message: thousands separators, or its digit count when it is too long to read (a
    4,000-digit value would otherwise fill the terminal)."""
    if isinstance(n, int) and abs(n) >= 10**15:
        return f"a {len(str(abs(n))):,}-digit number" if abs(n) >= 10**30 else f"{n:.3g}"
    return f"{n:,}" if isinstance(n, int) else f"{n:g}"


def memory_budget() -> int:
    """Bytes one command may plan to hold: half of this machine's physical memory (the rest is the OS's,
    the interpreter's and other processes'), or ``LIGHTRAIL_MEMORY_BUDGET`` bytes if set (tests pin it, so
    what is refused does not depend on the machine)."""
    pinned = os.environ.get("LIGHTRAIL_MEMORY_BUDGET", "").strip()
    if pinned.isdigit():
        return int(pinned)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def check_count(n: int, *, field: str, lo: int = 1, hi: int, what: str = "", fix: str | None = None) -> int:
    """An integer within ``lo..hi``; the error names ``field`` and the range (the one bounds check every
    other helper here goes through)."""
    if not lo <= n <= hi:
        side = f"too few (at least {lo:,})" if n < lo else f"too many (at most {hi:,})"
        shown = show_count(n)
        if what:
            shown += f" of {what}" if shown.startswith("a ") else f" {what}"
        raise ScenarioError(f"{shown} is {side}",
                            field=field, fix=fix or f"use {lo:,}..{hi:,}")
    return n


def check_fits(nbytes: float, *, field: str, value, fix: str) -> None:
    """Refuse work whose estimated peak memory exceeds :func:`memory_budget`, naming the option to shrink."""
    budget = memory_budget()
    if nbytes > budget:
        raise ScenarioError(f"{value} needs about {nbytes / 2**30:,.1f} GiB, more than the memory budget of "
                            f"{budget / 2**30:,.0f} GiB (half this machine's memory; LIGHTRAIL_MEMORY_BUDGET sets "
                            "it)", field=field, fix=fix)


def check_values(n: int, *, field: str, limit: int = MAX_VALUES, what: str = "values", fix: str | None = None) -> int:
    """A list of ``n`` values: at most ``limit`` (:data:`MAX_VALUES`), counted before its values are read (an
    empty list is the caller's to refuse, with its own words)."""
    return check_count(n, field=field, lo=0, hi=limit, what=what, fix=fix or f"give at most {limit:,} {what}")


def range_values(lo: int, hi: int, *, field: str, fix: str, limit: int = MAX_RANGE) -> range:
    """The integers ``lo..hi`` (both included), refused from their ends if there are more than ``limit``."""
    if lo > hi:
        raise ScenarioError(f"{lo}..{hi} is not an increasing range", field=field, fix=fix)
    check_count(hi - lo + 1, field=field, hi=limit, what="values in the range", fix=fix)
    return range(lo, hi + 1)


def check_grid(lengths, *, field: str, limit: int = MAX_CELLS, what: str = "cells") -> int:
    """The product of ``lengths`` (a grid's axes), refused above ``limit`` before the grid is built."""
    cells = math.prod(int(n) for n in lengths)
    check_count(cells, field=field, hi=limit, what=what, fix="sweep fewer values per field, or split the sweep")
    return cells
