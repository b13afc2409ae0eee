"""Typer's coercion of plain option values without pydantic (issue 33: ~30-60 ms of a small job's start).

Typer 0.2x coerces every option value, defaults included, through a pydantic ``TypeAdapter`` it builds per
option. For the plain annotations the verbs use (``bool``, ``str``, ``int``, ``float``, ``Path``, with no parser,
bounds or path checks), :func:`lighten` gives each such option a coercion that computes the same value directly; a
value it is not sure of (``+3``, ``1e3``, ``inf``, bytes, anything that would fail) goes to Typer's own coercion,
so every result and every error message is Typer's (``tests/cli/test_coerce.py`` compares them). With a Typer whose
internals differ, :func:`lighten` changes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

try:
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # another Typer: its own coercion throughout
    RuntimeParam = None

__all__ = ["lighten"]

_INT = re.compile(r"-?(0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?")
_NOT_PLAIN = ("parser", "click_type", "min", "max", "clamp", "exists", "writable", "resolve_path", "allow_dash",
              "path_type")
_PLAIN_PATH = {"file_okay": True, "dir_okay": True, "readable": True}


def _plain(info) -> bool:
    """No option setting that Typer's coercion would apply beyond the type."""
    return (all(getattr(info, name, None) is None or getattr(info, name) is False for name in _NOT_PLAIN)
            and all(getattr(info, name, value) == value for name, value in _PLAIN_PATH.items()))


def _direct(annotation, value: Any, info, param, ctx) -> Any:
    """The coerced value, or ``NotImplemented`` where Typer's coercion must decide."""
    if annotation is bool:
        return value if isinstance(value, bool) else NotImplemented
    if annotation is str:
        return value if isinstance(value, str) else NotImplemented
    if annotation is int:
        if type(value) is int:
            return value
        return int(value) if isinstance(value, str) and _INT.fullmatch(value) else NotImplemented
    if annotation is float:
        if type(value) in (int, float):
            return float(value)
        return float(value) if isinstance(value, str) and _FLOAT.fullmatch(value) else NotImplemented
    if annotation is Path and isinstance(value, str | Path) and str(value) not in ("", "-"):
        return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
    return NotImplemented


if RuntimeParam is not None:
    class _Direct(RuntimeParam):
        """Coerces what :func:`_direct` knows; Typer's adapter (built on first need) does the rest."""

        def _coerce_value(self, value: Any, param, ctx) -> Any:
            result = _direct(self.annotation, value, self.parameter_info, param, ctx)
            if result is NotImplemented:
                result = build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)
            return result


def lighten(params: list) -> list:
    """``params`` (a command's options and arguments), the plain ones given the direct coercion."""
    if RuntimeParam is None:
        return params
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if (descriptor is None or getattr(param, "_runtime_param", 0) is not None
                or descriptor.file_annotation is not None
                or descriptor.annotation not in (bool, str, int, float, Path) or not _plain(descriptor.parameter_info)):
            continue
        param._runtime_param = _Direct(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)
    return params
