"""Turn a pydantic ValidationError into a ScenarioError naming the first bad field (scenario files,
controller configs and API messages all report bad input the same way)."""

from __future__ import annotations

from pydantic import ValidationError

from lightrail.errors import ScenarioError

__all__ = ["first_error"]

_FIXES = {"extra_forbidden": "remove it or check its spelling", "missing": "add it"}


def first_error(e: ValidationError, *, source: str, hint: str = "") -> ScenarioError:
    """The first error of ``e`` as a ScenarioError whose field is the dotted location."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("str", "ModelSection"))) or source
    fix = _FIXES.get(err["type"], "see the expected form")
    return ScenarioError(err["msg"].lower(), field=where, fix=f"{fix}{f' ({hint})' if hint else ''}")
