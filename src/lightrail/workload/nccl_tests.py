"""nccl-tests output in: the table rows of ``all_reduce_perf`` and its siblings, as people paste them.

``all_reduce_perf`` and its siblings print one line per message size (nccl-tests ``src/common.cu``,
``printf`` of ``size count type redop root`` then, for the out-of-place and in-place runs, ``time``
(microseconds), ``algbw`` and ``busbw`` (GB/s) and ``#wrong``); comment lines start with ``#``. Older
releases have no ``root`` column; ``#wrong`` is ``N/A`` when validation is off.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from lightrail.errors import ScenarioError

__all__ = ["NcclRow", "parse_nccl_tests"]

_RANK_LINE = re.compile(r"^#\s+Rank\s+\d+\s")
_NCCL_LOG = re.compile(r"\bNCCL (INFO|WARN)\b")


@dataclass(frozen=True)
class NcclRow:
    """One message size of an nccl-tests table; times in seconds."""

    line: int
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    time_s: float
    """Out-of-place time."""
    algbw_GBps: float
    busbw_GBps: float
    in_place_time_s: float
    in_place_busbw_GBps: float


def parse_nccl_tests(text: str, *, source: str = "FILE") -> tuple[list[NcclRow], int | None]:
    """The table rows of an nccl-tests log and the number of ``# Rank`` lines in its header (None if it
    lists none). NCCL_DEBUG lines are skipped; any other line that is neither a comment nor a row raises naming
    ``source:line``."""
    rows: list[NcclRow] = []
    rank_lines = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            rank_lines += bool(_RANK_LINE.match(line))
            continue
        if _NCCL_LOG.search(line):  # NCCL_DEBUG=INFO lines interleaved with the table
            continue
        where = f"{source}:{number}"
        parts = line.split()
        if len(parts) == 13:
            size, count, dtype, redop, root, *rest = parts
        elif len(parts) == 12:  # releases before 2.13 print no root column
            (size, count, dtype, redop, *rest), root = parts, "-1"
        else:
            raise ScenarioError(f"expected 12 or 13 columns (size count type redop [root] time algbw busbw #wrong, "
                                f"twice), found {len(parts)}: {line[:60]!r}", field=where,
                                fix="give the output of an nccl-tests binary such as all_reduce_perf")
        try:
            row = NcclRow(number, int(size), int(count), dtype, redop, int(root), float(rest[0]) * 1e-6,
                          float(rest[1]), float(rest[2]), float(rest[4]) * 1e-6, float(rest[6]))
        except ValueError:
            raise ScenarioError(f"a size, count, root, time or bandwidth is not a number: {line[:60]!r}",
                                field=where, fix="give nccl-tests' table unchanged") from None
        if row.size < 0 or not (row.time_s > 0 and row.in_place_time_s > 0) or not all(
                math.isfinite(v) for v in (row.time_s, row.in_place_time_s)):
            raise ScenarioError("a size is negative or a time is not positive", field=where,
                                fix="give nccl-tests' table unchanged")
        rows.append(row)
    if not rows:
        raise ScenarioError("no table rows (every line is a comment or blank)", field=source,
                            fix="give the output of an nccl-tests binary such as all_reduce_perf")
    return rows, rank_lines or None
