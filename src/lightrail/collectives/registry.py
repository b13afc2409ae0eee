"""Registry of collective algorithms by (kind, name), the way a collective library selects one.

Each entry records what it needs (``supports(n)``), how many steps it takes and a one-line
summary; ``lightrail algorithms`` prints them (read from the ``@register`` decorators' source by
``lightrail.catalog``, so listing them imports no numpy). The registry refuses duplicate names. One entry
per kind is marked ``auto``: what a program's collective runs when it names no algorithm
(:func:`resolve`), so a new algorithm reaches planners and simulators by name, without edits there.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from lightrail.catalog import INFRASTRUCTURE as _INFRASTRUCTURE
from lightrail.catalog import parse_kind
from lightrail.collectives.collective import Kind
from lightrail.collectives.schedule import Schedule
from lightrail.errors import UnsupportedError

__all__ = ["AUTO", "Algorithm", "register", "algorithms", "get", "generate", "parse_kind", "resolve"]

AUTO = "auto"
"""The algorithm name that leaves the choice to the registry (:func:`resolve`)."""


@dataclass(frozen=True)
class Algorithm:
    """A registered generator ``build(n, **params) -> Schedule``."""

    kind: Kind
    name: str
    build: Callable[..., Schedule]
    summary: str
    steps: str
    supports: Callable[[int], bool]
    auto: bool = False
    """The kind's choice for :data:`AUTO`."""

    @property
    def parameters(self) -> list[str]:
        """Keyword parameters the generator takes besides n."""
        return [p for p in inspect.signature(self.build).parameters if p != "n"]

    @property
    def compressed(self) -> Callable | None:
        """The compressed builder ``fn(n) -> CompressedSchedule | None`` of this algorithm, if it has one
        (``collectives.compressed``)."""
        from lightrail.collectives.compressed import compressed_builder

        return compressed_builder(self.kind, self.name)

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
             supports: Callable[[int], bool] = lambda n: n >= 2, auto: bool = False):
    """Decorator: register ``fn(n, **params) -> Schedule`` as algorithm ``name`` of ``kind``;
    ``auto`` makes it the kind's choice for :data:`AUTO` (one per kind)."""

    def wrap(fn):
        key = (Kind(kind), name)
        if name == AUTO:
            raise ValueError(f"{AUTO!r} names the registry's choice, not an algorithm")
        if key in _REGISTRY:
            raise ValueError(f"algorithm {name!r} is already registered for {kind}")
        if auto and any(a.auto for (k, _), a in _REGISTRY.items() if k == key[0]):
            raise ValueError(f"{kind} already has an auto algorithm")
        _REGISTRY[key] = Algorithm(Kind(kind), name, fn, summary, steps, supports, auto)
        return fn

    return wrap


@functools.cache
def _load() -> None:
    """Import every generator module of the package, which fills the registry (each registers itself):
    a new algorithm is one new module, with nothing to list here."""
    import lightrail.collectives as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _INFRASTRUCTURE:
            importlib.import_module(f"{package.__name__}.{info.name}")


def algorithms(kind: Kind | str | None = None) -> list[Algorithm]:
    """Registered algorithms, optionally of one kind, in (kind, name) order."""
    _load()
    chosen = [a for (k, _), a in _REGISTRY.items() if kind is None or k == Kind(kind)]
    return sorted(chosen, key=lambda a: (list(Kind).index(a.kind), a.name))


def get(kind: Kind | str, name: str) -> Algorithm:
    """The algorithm ``name`` of ``kind``; the error lists the names that exist."""
    kind = parse_kind(kind)
    _load()
    try:
        return _REGISTRY[(kind, name)]
    except KeyError:
        names = ", ".join(a.name for a in algorithms(kind))
        raise UnsupportedError(f"no {kind} algorithm named {name!r}", field="algo",
                               fix=f"use one of {names}") from None


def resolve(kind: Kind | str, name: str, n: int) -> Algorithm:
    """The algorithm a collective named ``name`` runs on ``n`` ranks: that one, or for :data:`AUTO` the
    kind's ``auto`` entry (else, if that does not support ``n``, the first one in name order that does).

    >>> resolve("allreduce", "auto", 8).name, resolve("alltoall", "auto", 8).name
    ('ring', 'pairwise')
    """
    if name != AUTO:
        return get(kind, name)
    listed = algorithms(parse_kind(kind))
    for algorithm in sorted(listed, key=lambda a: not a.auto):  # stable: the auto entry, then name order
        if algorithm.supports(n):
            return algorithm
    raise UnsupportedError(f"no {parse_kind(kind)} algorithm supports {n} ranks", field="ranks",
                           fix="use 2 or more ranks")


def generate(kind: Kind | str, name: str, n: int, **params) -> Schedule:
    """Build the schedule of algorithm ``name`` (or :data:`AUTO`) for collective ``kind`` on ``n`` ranks.

    >>> s = generate("allreduce", "ring", 4)
    >>> s.name, s.nsteps
    ('ring_allreduce(n=4)', 6)
    """
    return resolve(kind, name, n)(n, **params)
