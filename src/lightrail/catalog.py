"""The collective algorithms' listing, read from the generator modules' source without importing them.

``lightrail algorithms`` prints what every ``@register(...)`` in ``lightrail/collectives/`` declares: kind,
name, summary, steps, whether it is the kind's ``auto`` choice, and its parameters. Importing the generators
would import numpy for each of them (about 0.1 s of a 0.3 s start); reading their decorators does not. The
registry (``collectives.registry``) stays the authority: a test checks that both list the same entries, so a
new algorithm is still one new module with nothing to list here. Standard library and ``lightrail.defaults``
only (``tests/cli/test_lean_start.py`` pins it).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

from lightrail.defaults import Kind
from lightrail.errors import UnsupportedError

__all__ = ["Entry", "INFRASTRUCTURE", "listing", "parse_kind"]

INFRASTRUCTURE = frozenset({"collective", "registry", "schedule", "verify"})
"""Modules of ``lightrail.collectives`` that define no algorithm."""


class Entry(NamedTuple):
    """One ``@register(...)``: what ``lightrail algorithms`` shows (``report.collective.algorithm_rows``)."""

    kind: Kind
    name: str
    summary: str
    steps: str
    auto: bool
    parameters: tuple[str, ...]


def parse_kind(kind: Kind | str, *, field: str = "op") -> Kind:
    """A collective kind from its name, ignoring case, dashes and underscores.

    >>> parse_kind("Reduce-Scatter")
    <Kind.REDUCESCATTER: 'reducescatter'>
    """
    text = str(kind).lower().replace("-", "").replace("_", "")
    try:
        return Kind(text)
    except ValueError:
        raise UnsupportedError(f"unknown collective {kind!r}", field=field,
                               fix="use one of " + ", ".join(k.value for k in Kind)) from None


def _kind(node: ast.expr) -> Kind:
    if isinstance(node, ast.Attribute):  # Kind.ALLREDUCE
        return Kind[node.attr]
    return parse_kind(ast.literal_eval(node))


def _decorated(text: str) -> list[str]:
    """The top-level statements of a module's source that start with ``@register(``: parsing only those is a
    fraction of parsing the module (a statement runs to the next line that starts in column 0)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line[:1] not in ("", " ", "\t", "\n", "#", ")", "]", "}")]
    chunks = []
    for k, a in enumerate(starts):
        if lines[a].startswith("@register("):
            body = next((i for i, j in enumerate(starts[k:], k) if lines[j].startswith("def ")), len(starts) - 1)
            end = starts[body + 1] if body + 1 < len(starts) else len(lines)
            chunks.append("".join(lines[a:end]))
    return chunks


def _entries(path: Path):
    text = path.read_text(encoding="utf-8")
    if "@register(" not in text:
        return
    try:
        trees = [ast.parse(chunk) for chunk in _decorated(text)]
    except SyntaxError:  # a statement the column-0 rule cut short: parse the whole module
        trees = [ast.parse(text, filename=str(path))]
    for tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == "register":
                    kw = {k.arg: ast.literal_eval(k.value) for k in dec.keywords
                          if k.arg in ("summary", "steps", "auto")}
                    args = node.args
                    params = tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg != "n")
                    yield Entry(_kind(dec.args[0]), ast.literal_eval(dec.args[1]), kw["summary"], kw["steps"],
                                bool(kw.get("auto", False)), params)


@functools.cache
def _all() -> tuple[Entry, ...]:
    folder = Path(__file__).with_name("collectives")
    found = [e for path in sorted(folder.glob("*.py"))
             if not path.stem.startswith("_") and path.stem not in INFRASTRUCTURE for e in _entries(path)]
    return tuple(sorted(found, key=lambda e: (list(Kind).index(e.kind), e.name)))


def listing(kind: Kind | str | None = None) -> list[Entry]:
    """The registered algorithms, optionally of one kind, in (kind, name) order, as
    ``collectives.algorithms()`` lists them."""
    chosen = None if kind is None else parse_kind(kind)
    return [e for e in _all() if chosen is None or e.kind == chosen]
