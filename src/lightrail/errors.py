"""Errors that reach users: each names what is wrong (the field) and how to fix it.

The CLI prints ``str(error)`` without a traceback and exits with code 2.
"""

from __future__ import annotations

__all__ = [
    "LightrailError",
    "ScenarioError",
    "UnitError",
    "InfeasibleError",
    "UnsupportedError",
    "VerificationError",
]


class LightrailError(Exception):
    """Base of every error lightrail raises on purpose.

    Parameters
    ----------
    message : what is wrong, quoting the bad value.
    field : the option, scenario field or argument at fault (``--size``, ``job.tp``).
    fix : what the user can do instead (accepted values, an example).
    """

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        self.message = message
        self.field = field
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        return f"{text}; {self.fix}" if self.fix else text


class ScenarioError(LightrailError):
    """Malformed input: a scenario file, an option or an API message."""


class UnitError(ScenarioError):
    """A quantity without a unit, or with a unit of the wrong kind."""


class InfeasibleError(LightrailError):
    """Well-formed input that cannot be realised (a layout, a circuit configuration)."""


class UnsupportedError(LightrailError):
    """An algorithm or builder asked for a case it does not handle (names the valid cases)."""


class VerificationError(LightrailError):
    """A schedule does not compute its collective; names the first (step, rank, chunk) at fault."""

    def __init__(self, message: str, *, step: int | None = None, rank: int | None = None,
                 chunk: int | None = None, fix: str | None = None):
        self.step, self.rank, self.chunk = step, rank, chunk
        where = ", ".join(f"{k}={v}" for k, v in (("step", step), ("rank", rank), ("chunk", chunk))
                          if v is not None)
        super().__init__(message, field=f"schedule[{where}]" if where else "schedule", fix=fix)
