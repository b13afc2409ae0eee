"""Input at the edge: read a YAML/JSON file into a mapping, and turn a pydantic ValidationError into a
ScenarioError naming the first bad field (scenario files, controller configs and API messages all
report bad input the same way)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from lightrail.errors import ScenarioError

if TYPE_CHECKING:  # reading a file needs no pydantic (~20 ms of a small job's start, issue 33)
    from pydantic import ValidationError

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NODES", "first_error", "read_bounded", "read_mapping"]

MAX_FILE_BYTES = 16 << 20
"""Largest input file read (scenario, config.json, controller config): ours are a few KB; a 16 MiB cap keeps
``/dev/zero`` or a stray log from filling memory."""
MAX_DEPTH = 64
"""Deepest nesting of a YAML/JSON input (scenario files have 3 levels): deeper ones are refused before the
recursive parts of the parsers (PyYAML's composer, ``json``) overflow the stack."""
MAX_NODES = 1_000_000
"""Most values a YAML file may expand to, aliases counted in full (a "billion laughs" file is refused)."""

_FIXES = {"extra_forbidden": "remove it or check its spelling", "missing": "add it"}


def first_error(e: ValidationError, *, source: str, hint: str = "") -> ScenarioError:
    """The first error of ``e`` as a ScenarioError whose field is the dotted location."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("str", "ModelSection"))) or source
    fix = _FIXES.get(err["type"], "see the expected form")
    return ScenarioError(err["msg"].lower(), field=where, fix=f"{fix}{f' ({hint})' if hint else ''}")


def read_bounded(path: str | Path, *, field: str, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The text of a regular file of at most ``limit`` bytes; devices, FIFOs, folders and larger files are
    refused naming ``field`` (reading stops at ``limit + 1`` bytes, so ``/dev/zero`` cannot fill memory)."""
    path = Path(path)
    fix = f"give the path of {what}"
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise ScenarioError(f"no file {str(path)!r} ({e.strerror})", field=field, fix=fix) from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise ScenarioError(f"{str(path)!r} is {kind}", field=field, fix=fix)
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ScenarioError(f"cannot read {str(path)!r}: {e.strerror or e}", field=field, fix=fix) from None
    if len(data) > limit:
        raise ScenarioError(f"{str(path)!r} is over {limit >> 20} MiB", field=field, fix=fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{str(path)!r} is not UTF-8 text (byte {e.start})", field=field, fix=fix) from None


def _too_deep(field: str, where: list) -> ScenarioError:
    path = ".".join(str(k) for k in where[:4] if k is not None) or "the top level"
    return ScenarioError(f"nested more than {MAX_DEPTH} levels deep under {path}", field=field,
                         fix=f"at most {MAX_DEPTH} levels (scenario files have 3)")


def _check_yaml_shape(text: str, field: str) -> None:
    """Walk the YAML event stream (iterative, no recursion) and refuse a file nested deeper than
    :data:`MAX_DEPTH` or expanding (aliases counted in full) to more than :data:`MAX_NODES` values."""
    sizes: dict[str, int] = {}  # anchor -> values its node expands to
    open_: list[dict] = []  # open collections: anchor, count when opened, the key it sits under, mapping state
    total = 0

    def placed(value) -> object:
        """Account for a value (or key) in the innermost mapping; returns the key a collection sits under."""
        if not open_ or not open_[-1]["mapping"]:
            return None
        top = open_[-1]
        if top["want_key"]:
            top["key"] = value
        top["want_key"] = not top["want_key"]
        return top["key"]

    for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor:
                sizes[event.anchor] = 1
            placed(event.value)
        elif isinstance(event, yaml.AliasEvent):
            total += sizes.get(event.anchor, 1)
            placed(None)
        elif isinstance(event, yaml.CollectionStartEvent):
            under = placed(None)
            total += 1
            open_.append({"anchor": event.anchor, "start": total, "under": under,
                          "mapping": isinstance(event, yaml.MappingStartEvent), "want_key": True, "key": None})
            if len(open_) > MAX_DEPTH:
                raise _too_deep(field, [c["under"] for c in open_[1:]])
        elif isinstance(event, yaml.CollectionEndEvent):
            done = open_.pop()
            if done["anchor"]:
                sizes[done["anchor"]] = total - done["start"] + 1
        if total > MAX_NODES:
            raise ScenarioError(f"expands to more than {MAX_NODES:,} values", field=field,
                                fix="write the values out, without aliases that multiply them")


def _check_depth(data, field: str) -> None:
    """Refuse parsed data nested deeper than :data:`MAX_DEPTH` (an iterative walk)."""
    todo = [(data, 1, [])]  # the top level is level 1, as in _check_yaml_shape
    while todo:
        node, depth, where = todo.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(field, where)
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            if isinstance(child, (dict, list)):
                todo.append((child, depth + 1, [*where, key] if len(where) < 4 else where))


def read_mapping(path: str | Path, *, field: str, what: str = "a .yaml or .json file"):
    """The parsed content of a YAML (or ``.json``) file; a missing, unreadable, oversized or too deeply
    nested file names ``field``."""
    path = Path(path)
    text = read_bounded(path, field=field, what=what)
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            _check_yaml_shape(text, field)
            data = yaml.safe_load(text)
    except RecursionError:
        raise _too_deep(field, []) from None
    except (ValueError, yaml.YAMLError) as e:
        if "flow level" in str(e):  # LibYAML's own nesting limit, met while scanning ahead of our count
            raise _too_deep(field, []) from None
        raise ScenarioError(f"cannot read {path.name}: {str(e).splitlines()[0]}", field=field) from None
    _check_depth(data, field)
    return data
