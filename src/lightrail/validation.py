"""Input at the edge: read a YAML/JSON file into a mapping, and turn a pydantic ValidationError into a
ScenarioError naming the first bad field (scenario files, controller configs and API messages all
report bad input the same way)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import ValidationError

from lightrail.errors import ScenarioError

__all__ = ["first_error", "read_mapping"]

_FIXES = {"extra_forbidden": "remove it or check its spelling", "missing": "add it"}


def first_error(e: ValidationError, *, source: str, hint: str = "") -> ScenarioError:
    """The first error of ``e`` as a ScenarioError whose field is the dotted location."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("str", "ModelSection"))) or source
    fix = _FIXES.get(err["type"], "see the expected form")
    return ScenarioError(err["msg"].lower(), field=where, fix=f"{fix}{f' ({hint})' if hint else ''}")


def read_mapping(path: str | Path, *, field: str, what: str = "a .yaml or .json file"):
    """The parsed content of a YAML (or ``.json``) file; a missing or unreadable file names ``field``."""
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(f"no file {str(path)!r}", field=field, fix=f"give the path of {what}")
    try:
        text = path.read_text()
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise ScenarioError(f"cannot read {path.name}: {str(e).splitlines()[0]}", field=field) from None
