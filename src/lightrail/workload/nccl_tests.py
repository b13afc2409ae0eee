"""nccl-tests output in: the tables of ``all_reduce_perf`` and its siblings, as people paste them.

The format is nccl-tests' ``src/common.cu`` and ``src/util.cu`` (``writeResultHeader``,
``writeBenchmarkLinePreamble``, ``writeBenchmarkLineBody``): one line per message size, ``size count type
redop root`` then, for the out-of-place and the in-place run, ``time`` (microseconds), ``algbw`` and ``busbw``
(GB/s) and ``#wrong`` (``N/A`` when validation is off); ``#`` lines around it (``# nThread ...``, one
``#  Rank  0 Group  0 Pid ... device  0 [0x..] NVIDIA H100 80GB HBM3`` per rank, the column titles,
``# Out of bounds values``, ``# Avg bus bandwidth``). Releases before 2.13 (and rccl-tests of that age) print
no ``root`` (or no ``redop``) column and an ``error`` column instead of ``#wrong``; a trace replay prints the
in-place half only.

Real logs come wrapped: a label on every line from the launcher (``0: `` from ``srun --label``,
``[1,0]<stdout>:`` from ``mpirun --tag-output``, ``host: `` from pdsh, a timestamp from ``kubectl logs
--timestamps``), NCCL_DEBUG lines, ``...`` where someone cut the middle, several runs in one file, the same
table printed by several ranks. :func:`read_nccl_tests` reads all of that and skips, with a warning naming
``source:line``, any line it cannot read. Pure: text in, data out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from lightrail.errors import ScenarioError

__all__ = ["NcclRow", "NcclTable", "NcclLog", "read_nccl_tests", "parse_nccl_tests"]

# ---- what a line can be ---------------------------------------------------------------------------------------
_TIMESTAMP = re.compile(r"^\s*\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?\s")
_RANK_LABEL = re.compile(r"^\s*(?:\[(\d+),(\d+)\]<std(?:out|err)>:|(\d+):(?=\s))")  # mpirun --tag-output, srun -l
_HOST_LABEL = re.compile(r"^\s*([A-Za-z][\w.-]*):\s+(?=[#\d])")  # pdsh, clush: only before output of the test
_NCCL_DEBUG = re.compile(r"\bNCCL (?:INFO|WARN|TRACE|ABORT)\b|^[NR]CCL version\b")
_RCCL_HEADER = re.compile(r"^(?:rccl-tests: Version\b|(?:HIP|ROCm) version\s*:|Hostname\s*:|Librccl path\s*:)")
_ELISION = re.compile(r"^(?:#\s*)?(?:\.{3,}|…|<snip>|--\s*\(?snip\)?\s*--|\[(?:\.\.\.|…|snip)\])$", re.IGNORECASE)
_RANK = re.compile(r"^Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$")
_RUN_START = re.compile(r"^(?:Collective test starting:|nThread\s+\d|Using devices\b|nccl-tests version\b)")
_TABLE_END = re.compile(r"^(?:Out of bounds values|Avg bus bandwidth|Collective test concluded)\b")
_OP_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_BINARY = re.compile(r"\b([a-z][a-z_]*?)_perf(?:_mpi)?\b")
_WRONG = re.compile(r"^(?:\d+(?:\.\d*)?(?:e[+-]?\d+)?\*?|N/A)$", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z_][\w]*$")
_DATE_OR_TIME = re.compile(r"^(?:\d{4}-\d{2}-\d{2}|\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)$")


@dataclass(frozen=True)
class NcclRow:
    """One message size of an nccl-tests table; times in seconds, bandwidths in GB/s as printed.

    A half the log does not have (``N/A``, or a table with only in-place or only out-of-place runs) is None.
    """

    line: int
    """Line number in the text (1-based)."""
    size: int
    count: int
    dtype: str
    redop: str
    """``none`` for operations without one (alltoall, sendrecv, broadcast, all_gather in old releases)."""
    root: int
    """-1 where the operation has none or the release prints no root column."""
    time_s: float | None
    """Out-of-place time."""
    algbw_GBps: float | None
    busbw_GBps: float | None
    in_place_time_s: float | None
    in_place_busbw_GBps: float | None
    in_place_algbw_GBps: float | None = None


@dataclass(frozen=True)
class NcclTable:
    """One run's table, with what its header says about the run."""

    op: str | None
    """The collective, e.g. ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall``, ``sendrecv`` (the
    binary's name without ``_perf``/``_mpi`` and underscores), from ``# Collective test starting:`` or a command
    line naming the binary; None when the log names neither."""
    rows: list[NcclRow]
    ranks: int | None
    """The ranks the header lists (one more than the highest ``# Rank`` number, so a list cut with ``...``
    still counts them all); None without ``# Rank`` lines."""
    devices: tuple[str, ...] = ()
    """GPU names of the listed ranks, in rank order (blank where the log prints none)."""
    nodes: tuple[str, ...] = ()
    """Distinct hosts of the listed ranks, in order of first appearance."""
    elided: bool = False
    """The table has a ``...`` (or ``<snip>``) line: rows are missing."""


@dataclass(frozen=True)
class NcclLog:
    """Every table of a log, and the lines skipped (``source:line: why: 'start of the line'``)."""

    tables: list[NcclTable]
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[NcclRow]:
        """The first table's rows (all rows when the log has one table)."""
        return self.tables[0].rows if self.tables else []

    @property
    def ranks(self) -> int | None:
        """The first table's :attr:`NcclTable.ranks`."""
        return self.tables[0].ranks if self.tables else None


# ---- one stream of output (one launcher label) ----------------------------------------------------------------
@dataclass
class _Header:
    """What the lines before a table said."""

    ranks: dict[int, tuple[str, str]] = field(default_factory=dict)  # rank -> (host, GPU name)
    group: int = 4  # fields per half: time algbw busbw #wrong (+ i_min i_max i_p99 i_cv% with per-iteration timing)
    timestamps: bool = False
    halves: tuple[int, int] | None = None  # columns of the "out-of-place" and "in-place" titles
    used: bool = False


@dataclass
class _Table:
    header: _Header
    first_line: int
    rows: list[NcclRow] = field(default_factory=list)
    seen: set[NcclRow] = field(default_factory=set)  # the rows with line 0, to drop a row printed twice
    elided: bool = False


class _Stream:
    """Tables of one launcher label; lines of other labels may interleave."""

    def __init__(self) -> None:
        self.header = _Header()
        self.current: _Table | None = None
        self.done: list[_Table] = []
        self.pending_elision = False

    def close(self) -> None:
        if self.current is not None and self.current.rows:
            self.done.append(self.current)
        self.current = None

    def fresh_header(self) -> None:
        """A header line: it ends the table being read, and after a table it starts the next run's header."""
        self.pending_elision = False  # a "..." before the header cut other output, not rows
        if self.current is not None and self.current.rows:
            self.close()
        if self.header.used:
            self.header = _Header()

    def table(self, number: int) -> _Table:
        if self.current is None:
            self.current = _Table(self.header, number, elided=self.pending_elision)
            self.pending_elision = False
            self.header.used = True
        return self.current


def _strip_labels(raw: str) -> tuple[str, str]:
    """The line without launcher labels and timestamps, and the label naming its stream ('' when none)."""
    label, body = "", raw
    for _ in range(3):
        if m := _TIMESTAMP.match(body):
            body = body[m.end():]
            continue
        if m := _RANK_LABEL.match(body):
            label = label or (f"[{m[1]},{m[2]}]" if m[1] is not None else f"{m[3]}:")
            body = body[m.end():]
            continue
        if m := _HOST_LABEL.match(body):
            label = label or f"{m[1]}:"
            body = body[m.end():]
            continue
        break
    return body, label


def _number(token: str) -> float | None:
    """A time or bandwidth cell: None for ``N/A``; ValueError for anything else that is not a finite number."""
    if token.upper() == "N/A":
        return None
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(token)
    return value


def _row(body: str, number: int, header: _Header) -> NcclRow:
    """One table row; ValueError (naming what is wrong) if the line is not one."""
    tokens = body.split()
    if header.timestamps:  # a trailing "yyyy-mm-dd hh:mm:ss" column
        while tokens and _DATE_OR_TIME.match(tokens[-1]):
            tokens.pop()
    if len(tokens) < 7:
        raise ValueError(f"{len(tokens)} columns, too few for size count type [redop] [root] time algbw busbw")
    try:
        size, count = int(tokens[0]), int(tokens[1])
    except ValueError:
        raise ValueError("size and count are not whole numbers") from None
    dtype, rest = tokens[2], tokens[3:]
    if not _NAME.match(dtype):
        raise ValueError(f"type {dtype!r} is not a data type name")
    redop = "none"
    if rest and _NAME.match(rest[0]):
        redop, rest = rest[0], rest[1:]
    width = header.group
    root = -1
    if len(rest) % width == 1:
        try:
            root, rest = int(rest[0]), rest[1:]
        except ValueError:
            raise ValueError(f"root {rest[0]!r} is not a whole number") from None
    halves = len(rest) // width
    if len(rest) % width or halves not in (1, 2):
        raise ValueError(f"{len(tokens)} columns do not make one or two runs of time algbw busbw #wrong")
    cells: list[tuple[float | None, float | None, float | None]] = []
    for h in range(halves):
        time, algbw, busbw, wrong = rest[h * width:h * width + 4]
        if not _WRONG.match(wrong):
            raise ValueError(f"#wrong {wrong!r} is not a count")
        try:
            t_us, alg, bus = _number(time), _number(algbw), _number(busbw)
        except ValueError:
            raise ValueError("a time or bandwidth is not a number") from None
        if t_us is not None and t_us <= 0:
            raise ValueError(f"time {time} is not positive")
        cells.append((None if t_us is None else t_us * 1e-6, alg, bus))
    if halves == 1:
        in_place = False
        if header.halves is not None:  # nccl-tests leaves the out-of-place columns blank in a replay
            at = [m.start() for m in re.finditer(r"\S+", body)][len(tokens) - len(rest)]
            out_col, in_col = header.halves
            in_place = abs(at - in_col) < abs(at - out_col)
        cells = [(None, None, None), cells[0]] if in_place else [cells[0], (None, None, None)]
    (t, alg, bus), (ti, algi, busi) = cells
    if size < 0 or count < 0:
        raise ValueError("a size or count is negative")
    if t is None and ti is None:
        raise ValueError("no time")
    return NcclRow(number, size, count, dtype, redop, root, t, alg, bus, ti, busi, algi)


def _header_line(content: str, body: str, stream: _Stream) -> str | None:
    """Take in a ``#`` line (or a header line that lost its ``#``); the op it names, if any."""
    if m := _OP_STARTING.search(content):
        stream.fresh_header()
        return m[1]
    if _RUN_START.match(content):
        stream.fresh_header()
        return None
    if m := _RANK.match(content):
        stream.fresh_header()
        rank, host, name = m[1], m[3], m[5]
        stream.header.ranks.setdefault(int(rank), (host, name.strip()))
        return None
    words = content.replace("#", " ").split()
    if _is_title(words):
        stream.fresh_header()
        stream.header.group = 8 if "i_min" in words else 4
        stream.header.timestamps = "timestamp" in words
        return None
    if "out-of-place" in content or "in-place" in content:
        out_col, in_col = body.find("out-of-place"), body.find("in-place")
        if out_col >= 0 and in_col >= 0:
            stream.header.halves = (out_col, in_col)
        return None
    if _TABLE_END.match(content):
        stream.close()
    return None


def _is_title(words: list[str]) -> bool:
    """The column titles: ``size count type redop root time algbw busbw #wrong ...``."""
    return "size" in words and "count" in words and ("time" in words or "cputime" in words)


def _is_header(content: str, text: str) -> bool:
    """A ``#`` line, or a header line that lost its ``#`` on the way into a web page."""
    if text.startswith("#") or _is_title(content.split()) or content.startswith("(B)") or "out-of-place" in content:
        return True
    return bool(_RUN_START.match(content) or _RANK.match(content) or _TABLE_END.match(content))


def _op_name(binary: str) -> str:
    name = re.sub(r"_perf(?:_mpi)?$", "", binary)
    return name.replace("_", "")


def _finish(table: _Table, op: str | None) -> NcclTable:
    ranks = table.header.ranks
    listed = sorted(ranks)
    hosts = [ranks[r][0] for r in listed]
    return NcclTable(op=op, rows=table.rows, ranks=(listed[-1] + 1) if listed else None,
                     devices=tuple(ranks[r][1] for r in listed), nodes=tuple(dict.fromkeys(hosts)),
                     elided=table.elided)


def read_nccl_tests(text: str, *, source: str = "FILE") -> NcclLog:
    """Every table of an nccl-tests (or rccl-tests) log, with the lines skipped as warnings.

    Lines are read after launcher labels (``0: ``, ``[1,0]<stdout>:``, ``host: ``) and a leading timestamp
    are taken off; lines of different labels are read as separate streams, so interleaved ranks do not mix,
    and a table that several ranks print alike is kept once (so are repeated identical rows). NCCL_DEBUG
    lines, rccl-tests' version lines, ``#`` comments and ``...`` are read without a warning; any other line
    that is not a table row is skipped with one.

    Raises
    ------
    ScenarioError : no table row is left (naming ``source`` and the first lines skipped).
    """
    streams: dict[str, _Stream] = {}
    hints: list[tuple[int, str]] = []  # (line, op) from "Collective test starting:" and command lines
    warnings: list[str] = []
    last: _Stream | None = None  # the stream of the last row
    for number, raw in enumerate(text.splitlines(), start=1):
        body, label = _strip_labels(raw)
        stream = streams.setdefault(label, _Stream())
        text_ = body.strip()
        if not text_:
            continue
        content = text_.lstrip("#").strip()
        if _NCCL_DEBUG.search(text_) or _RCCL_HEADER.match(text_):
            continue
        if _ELISION.match(text_):  # an unlabelled "..." between labelled rows cuts the stream last read
            target = last if stream.current is None and last is not None and not label else stream
            if target.current is not None:
                target.current.elided = True
            else:
                target.pending_elision = True
            continue
        if _is_header(content, text_):
            if (op := _header_line(content, body, stream)) is not None:
                hints.append((number, _op_name(op)))
            continue
        if not text_[0].isdigit():
            if m := _BINARY.search(text_):  # a command line: "$ mpirun ... ./build/all_reduce_perf -b 8"
                stream.fresh_header()
                hints.append((number, _op_name(m[0])))
            else:
                warnings.append(f"{source}:{number}: skipped, not a table row: {text_[:60]!r}")
            continue
        try:
            row = _row(body, number, stream.header)
        except ValueError as e:
            warnings.append(f"{source}:{number}: skipped, {e}: {text_[:60]!r}")
            continue
        table = stream.table(number)
        if (key := replace(row, line=0)) in table.seen:
            continue  # the same row printed twice
        table.seen.add(key)
        table.rows.append(row)
        last = stream
    for stream in streams.values():
        stream.close()
    tables, seen = [], set()
    for table in sorted((t for s in streams.values() for t in s.done), key=lambda t: t.first_line):
        op = next((o for line, o in reversed(hints) if line < table.first_line), None)
        signature = (op, tuple(replace(r, line=0) for r in table.rows))
        if signature in seen:
            continue  # another rank printed the same table
        seen.add(signature)
        tables.append(_finish(table, op))
    if not tables:
        skipped = f"; skipped {len(warnings)} line(s), first {warnings[0]}" if warnings else ""
        raise ScenarioError(f"no table rows (every line is a comment, blank or unreadable){skipped}", field=source,
                            fix="give the output of an nccl-tests binary such as all_reduce_perf")
    return NcclLog(tables, warnings)


def parse_nccl_tests(text: str, *, source: str = "FILE") -> tuple[list[NcclRow], int | None]:
    """The first table's rows of an nccl-tests log and the number of ranks its header lists (None if it lists
    none). :func:`read_nccl_tests` gives every table and the lines skipped."""
    log = read_nccl_tests(text, source=source)
    return log.rows, log.ranks
