"""Registry of collective algorithms by (kind, name), the way a collective library selects one.

Each entry records what it needs (``supports(n)``), how many steps it takes and a one-line
summary; ``lightrail algorithms`` prints them. The registry refuses duplicate names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from lightrail.collectives.collective import Kind
from lightrail.collectives.schedule import Schedule
from lightrail.errors import UnsupportedError

__all__ = ["Algorithm", "register", "algorithms", "get", "generate"]


@dataclass(frozen=True)
class Algorithm:
    """A registered generator ``build(n, **params) -> Schedule``."""

    kind: Kind
    name: str
    build: Callable[..., Schedule]
    summary: str
    steps: str
    supports: Callable[[int], bool]

    @property
    def parameters(self) -> list[str]:
        """Keyword parameters the generator takes besides n."""
        return [p for p in inspect.signature(self.build).parameters if p != "n"]

    def __call__(self, n: int, **params) -> Schedule:
        if n < 2 or not self.supports(n):
            raise UnsupportedError(f"{self.kind} {self.name} does not support {n} ranks", field="ranks",
                                   fix="use 2 or more ranks")
        unknown = sorted(set(params) - set(self.parameters))
        if unknown:
            raise UnsupportedError(f"{self.kind} {self.name} takes no parameter {unknown[0]!r}", field=unknown[0],
                                   fix=f"its parameters are: {', '.join(self.parameters) or 'none'}")
        return self.build(n, **params)


_REGISTRY: dict[tuple[Kind, str], Algorithm] = {}


def register(kind: Kind | str, name: str, *, summary: str, steps: str,
             supports: Callable[[int], bool] = lambda n: n >= 2):
    """Decorator: register ``fn(n, **params) -> Schedule`` as algorithm ``name`` of ``kind``."""

    def wrap(fn):
        key = (Kind(kind), name)
        if key in _REGISTRY:
            raise ValueError(f"algorithm {name!r} is already registered for {kind}")
        _REGISTRY[key] = Algorithm(Kind(kind), name, fn, summary, steps, supports)
        return fn

    return wrap


def _load() -> None:
    # Importing the generator modules fills the registry (each registers itself).
    from lightrail.collectives import (  # noqa: F401
        alltoall,
        bruck,
        direct,
        doubling,
        hierarchical,
        ring,
        stragglar,
        tree,
    )


def algorithms(kind: Kind | str | None = None) -> list[Algorithm]:
    """Registered algorithms, optionally of one kind, in (kind, name) order."""
    _load()
    chosen = [a for (k, _), a in _REGISTRY.items() if kind is None or k == Kind(kind)]
    return sorted(chosen, key=lambda a: (list(Kind).index(a.kind), a.name))


def _parse_kind(kind: Kind | str) -> Kind:
    text = str(kind).lower().replace("-", "").replace("_", "")
    try:
        return Kind(text)
    except ValueError:
        raise UnsupportedError(f"unknown collective {kind!r}", field="op",
                               fix="use one of " + ", ".join(k.value for k in Kind)) from None


def get(kind: Kind | str, name: str) -> Algorithm:
    """The algorithm ``name`` of ``kind``; the error lists the names that exist."""
    kind = _parse_kind(kind)
    _load()
    try:
        return _REGISTRY[(kind, name)]
    except KeyError:
        names = ", ".join(a.name for a in algorithms(kind))
        raise UnsupportedError(f"no {kind} algorithm named {name!r}", field="algo",
                               fix=f"use one of {names}") from None


def generate(kind: Kind | str, name: str, n: int, **params) -> Schedule:
    """Build the schedule of algorithm ``name`` for collective ``kind`` on ``n`` ranks."""
    return get(kind, name)(n, **params)
