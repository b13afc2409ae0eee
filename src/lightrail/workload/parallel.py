"""Rank layout of a hybrid-parallel job: Megatron order, groups per dimension, servers and rails.

Ranks are numbered with tp fastest, then cp, ep, dp and pp slowest (Megatron-LM's order), so a
tensor-parallel group sits inside a server and pipeline stages are the coarsest blocks. GPU g
sits on server ``g // gpus_per_server`` and rail ``g % gpus_per_server``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from math import prod

import numpy as np

from lightrail.errors import InfeasibleError
from lightrail.fabric.builders import GPUS_PER_SERVER

__all__ = ["Dim", "ORDER", "Layout"]


class Dim(StrEnum):
    """Parallelism dimensions; a group's dimension names its communication phase."""

    TP = "tp"
    CP = "cp"
    EP = "ep"
    DP = "dp"
    PP = "pp"


ORDER = (Dim.TP, Dim.CP, Dim.EP, Dim.DP, Dim.PP)
"""Rank order, fastest-varying first."""


_GROUPS: dict = {}
"""(layout, dims) -> :meth:`Layout.groups_over`'s answer (equal layouts have equal groups)."""
_GROUPS_KEPT = 64
"""Answers kept before they are all forgotten (a sweep's layouts come and go)."""


@dataclass(frozen=True)
class Layout:
    """Degrees of every dimension on ``world`` GPUs in servers of ``gpus_per_server``."""

    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    gpus_per_server: int = GPUS_PER_SERVER

    @classmethod
    def from_degrees(cls, world: int, *, tp: int = 1, cp: int = 1, ep: int = 1, dp: int = -1, pp: int = 1,
                     gpus_per_server: int = GPUS_PER_SERVER) -> Layout:
        """Check and build a layout; one degree may be -1 ("the rest", usually dp).

        >>> lay = Layout.from_degrees(64, tp=8, pp=2)
        >>> str(lay), lay.dp, lay.servers
        ('TP8 x DP4 x PP2', 4, 8)

        Raises
        ------
        InfeasibleError : naming the field, with the arithmetic, when degrees do not multiply to
            ``world``, tp exceeds a server, or pipeline stages do not fill whole servers.
        """
        degrees = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
        rest = [k for k, v in degrees.items() if v == -1]
        if len(rest) > 1:
            raise InfeasibleError(f"only one degree may be -1, got {', '.join(rest)}", field=f"parallel.{rest[1]}")
        for k, v in degrees.items():
            if v != -1 and v < 1:
                raise InfeasibleError(f"{k}={v} must be at least 1", field=f"parallel.{k}")
        if world < 1:
            raise InfeasibleError(f"{world} GPUs", field="cluster.gpus", fix="use 1 or more")
        known = prod(v for v in degrees.values() if v != -1)
        if rest:
            if world % known:
                raise InfeasibleError(f"{world} GPUs are not divisible by the other degrees' product {known}",
                                      field=f"parallel.{rest[0]}")
            degrees[rest[0]] = world // known
        if prod(degrees.values()) != world:
            arithmetic = " * ".join(f"{k}({v})" for k, v in degrees.items())
            raise InfeasibleError(f"{arithmetic} = {prod(degrees.values())} != GPUs({world})", field="parallel",
                                  fix="choose degrees whose product is the GPU count, or set one to -1")
        g = gpus_per_server
        if g < 1:
            raise InfeasibleError(f"gpus_per_server={g}", field="cluster.gpus_per_server", fix="use 1 or more")
        if world % g and world > g:
            raise InfeasibleError(f"{world} GPUs do not fill servers of {g}", field="cluster.gpus",
                                  fix=f"use a multiple of {g}")
        if degrees["tp"] > g or g % degrees["tp"]:
            raise InfeasibleError(f"tp={degrees['tp']} does not fit servers of {g} GPUs", field="parallel.tp",
                                  fix=f"use a divisor of {g}: tensor parallelism stays inside the NVLink domain")
        stage = world // degrees["pp"]
        if stage % g and stage > 0 and world > g:
            raise InfeasibleError(f"a pipeline stage of {stage} GPUs does not fill whole servers of {g}",
                                  field="parallel.pp", fix=f"make world/pp a multiple of {g}")
        return cls(gpus_per_server=g, **degrees)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.ep * self.dp * self.pp

    def degree(self, dim: Dim | str) -> int:
        return getattr(self, Dim(dim).value)

    def stride(self, dim: Dim | str) -> int:
        """Rank distance between neighbours along ``dim``."""
        dim = Dim(dim)
        return prod(self.degree(d) for d in ORDER[: ORDER.index(dim)])

    def coords(self, ranks) -> dict[Dim, np.ndarray]:
        """Coordinate of each rank along every dimension."""
        ranks = np.asarray(ranks)
        return {d: (ranks // self.stride(d)) % self.degree(d) for d in ORDER}

    def groups(self, dim: Dim | str) -> np.ndarray:
        """All groups of ``dim`` as an array (num_groups, degree): row i lists a group's ranks in order."""
        dim = Dim(dim)
        k, stride = self.degree(dim), self.stride(dim)
        base = np.arange(self.world)
        base = base[(base // stride) % k == 0]  # ranks at coordinate 0 along dim
        return base[:, None] + stride * np.arange(k)[None, :]

    def groups_over(self, dims) -> np.ndarray:
        """Groups spanning several dimensions: ranks that share every other coordinate, one row each.

        Members are ordered by their coordinates along ``dims`` (the first varies fastest), so
        ``groups_over([d])`` equals ``groups(d)``. Read-only, computed once per (layout, dims): planners ask for
        the same few groups op after op (a 65,536-rank sort each).
        """
        dims = tuple(Dim(d) for d in dims)
        key = (self, dims)
        found = _GROUPS.get(key)
        if found is None:
            if len(_GROUPS) >= _GROUPS_KEPT:
                _GROUPS.clear()
            found = _GROUPS[key] = self._groups_over(dims)
            found.setflags(write=False)
        return found

    def _groups_over(self, dims: tuple[Dim, ...]) -> np.ndarray:
        """:meth:`groups_over`, worked out."""
        ranks = np.arange(self.world)
        coords = self.coords(ranks)
        others = [d for d in ORDER if d not in dims]
        key = np.zeros(self.world, np.int64)
        for d in reversed(others):
            key = key * self.degree(d) + coords[d]
        inner = np.zeros(self.world, np.int64)
        for d in reversed([d for d in ORDER if d in dims]):
            inner = inner * self.degree(d) + coords[d]
        order = np.lexsort((inner, key))
        return ranks[order].reshape(-1, prod(self.degree(d) for d in dims))

    def stage_ranks(self, stage: int) -> np.ndarray:
        """Ranks of pipeline stage ``stage``."""
        size = self.world // self.pp
        return np.arange(stage * size, (stage + 1) * size)

    def server(self, ranks) -> np.ndarray:
        return np.asarray(ranks) // self.gpus_per_server

    def rail(self, ranks) -> np.ndarray:
        return np.asarray(ranks) % self.gpus_per_server

    @property
    def servers(self) -> int:
        return max(1, self.world // self.gpus_per_server)

    def __str__(self) -> str:
        parts = [f"{d.value.upper()}{self.degree(d)}" for d in ORDER if self.degree(d) > 1]
        return " x ".join(parts) or "single GPU"
