"""The network state at one moment: a directed graph stored as arrays.

Nodes ``0 .. num_endpoints-1`` are the GPUs (endpoints); the rest are switches. Each directed
link has a bandwidth (bytes/s) and a latency (s). A builder may attach ``hops``, the closed-form
hop distance of its topology; otherwise distances come from breadth-first search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from lightrail.errors import InfeasibleError

if TYPE_CHECKING:  # scipy is imported where BFS runs: builders with closed-form hops never pay its ~0.1 s
    import scipy.sparse as sp

__all__ = ["NodeKind", "Topology"]


class NodeKind(IntEnum):
    GPU = 0
    NVSWITCH = 1
    EPS = 2
    OCS = 3


HopsFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

UNKNOWN_HOPS = -2
"""What a builder's hop function returns for a pair it has no closed form for: :meth:`Topology.hops` asks BFS."""


@dataclass(frozen=True, eq=False)
class Topology:
    """Directed links ``src[e] -> dst[e]`` with ``bandwidth[e]`` B/s and ``latency[e]`` s."""

    name: str
    num_endpoints: int
    node_kind: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    bandwidth: np.ndarray
    latency: np.ndarray
    hops_fn: HopsFn | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        v = self.num_nodes
        for name, arr in (("src", self.src), ("dst", self.dst)):
            if len(arr) and (arr.min() < 0 or arr.max() >= v):
                raise InfeasibleError(f"a link {name} is not a node of {v}", field=f"topology.{name}")
        if np.any(self.bandwidth <= 0) or np.any(self.latency < 0):
            raise InfeasibleError("links need positive bandwidth and non-negative latency",
                                  field="topology.bandwidth")

    @property
    def num_nodes(self) -> int:
        return len(self.node_kind)

    @property
    def num_links(self) -> int:
        return len(self.src)

    @cached_property
    def out_links(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of outgoing links: links of node u are ``order[indptr[u]:indptr[u+1]]``."""
        order = np.argsort(self.src, kind="stable")
        indptr = np.concatenate([[0], np.cumsum(np.bincount(self.src, minlength=self.num_nodes))])
        return indptr, order

    @cached_property
    def _reverse(self) -> sp.csr_matrix:
        import scipy.sparse as sp

        v = self.num_nodes
        return sp.csr_matrix((np.ones(self.num_links), (self.dst, self.src)), shape=(v, v))

    @cached_property
    def _bfs(self) -> dict:
        """Hop counts to destinations found so far by BFS: row index per destination and the rows."""
        return {"row": np.full(self.num_nodes, -1, np.int64), "dist": np.zeros((0, self.num_nodes), np.int32)}

    def _distances_to(self, targets: np.ndarray) -> np.ndarray:
        """Rows ``dist[k, u]`` = hops from u to ``targets[k]``, by reverse BFS computed once per target: level by
        level in numpy, all targets of a batch at once (the photonic rails' circuit chains are short: 5-20x faster
        than scipy's search, whose import alone costs ~0.15 s), or scipy's past 256 levels. Both give the same
        hop counts."""
        cache = self._bfs
        new = np.unique(targets[cache["row"][targets] < 0], return_index=True)[0]  # (no numpy.ma import)
        for start in range(0, len(new), 256):  # bounded memory per batch of BFS sources
            batch = new[start:start + 256]
            dist = self._bfs_levels(batch)
            if dist is None:
                from scipy.sparse.csgraph import shortest_path

                dist = shortest_path(self._reverse, unweighted=True, directed=True, indices=batch)
                dist[np.isinf(dist)] = -1
                dist = dist.astype(np.int32)
            cache["row"][batch] = len(cache["dist"]) + np.arange(len(batch))
            cache["dist"] = np.concatenate([cache["dist"], dist])
        return cache["row"][targets]

    @cached_property
    def in_links(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of incoming links: links into node v are ``order[indptr[v]:indptr[v+1]]``."""
        order = np.argsort(self.dst, kind="stable")
        indptr = np.concatenate([[0], np.cumsum(np.bincount(self.dst, minlength=self.num_nodes))])
        return indptr, order

    def _bfs_levels(self, targets: np.ndarray, max_levels: int = 256) -> np.ndarray | None:
        """Hops from every node to each of ``targets`` (-1: unreachable), one frontier of all targets at a time
        over the incoming links; None past ``max_levels`` levels (a long chain: scipy's search is faster)."""
        v = self.num_nodes
        indptr, order = self.in_links
        dist = np.full((len(targets), v), -1, np.int32)
        row = np.arange(len(targets), dtype=np.int64)
        node = np.asarray(targets, np.int64)
        dist[row, node] = 0
        level = 0
        while len(row):
            if level == max_levels:
                return None
            level += 1
            deg = indptr[node + 1] - indptr[node]
            r = np.repeat(row, deg)
            offset = np.arange(len(r)) - np.repeat(np.cumsum(deg) - deg, deg)
            u = self.src[order[np.repeat(indptr[node], deg) + offset]].astype(np.int64)
            fresh = dist[r, u] < 0
            code = np.sort(r[fresh] * v + u[fresh])
            first = np.ones(len(code), bool)
            first[1:] = code[1:] != code[:-1]
            row, node = code[first] // v, code[first] % v
            dist[row, node] = level
        return dist

    def hops(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Hop distance from nodes ``u`` to nodes ``v`` (elementwise; -1 if unreachable).

        Uses the builder's closed form when there is one (for the pairs it answers: :data:`UNKNOWN_HOPS` marks
        the others); otherwise BFS towards each destination, computed the first time that destination is asked for.
        """
        u, v = np.asarray(u), np.asarray(v)
        if self.hops_fn is None:
            rows = self._distances_to(v.ravel())
            return self._bfs["dist"][rows, u.ravel()].reshape(np.shape(u))
        d = self.hops_fn(u, v)
        unknown = d == UNKNOWN_HOPS
        if unknown.any():
            d = d.copy()
            uu, vv = np.broadcast_to(u, d.shape)[unknown], np.broadcast_to(v, d.shape)[unknown]
            rows = self._distances_to(vv)  # first: it grows the cache the next line reads
            d[unknown] = self._bfs["dist"][rows, uu]
        return d

    def with_links(self, src, dst, bandwidth, latency, *, name: str | None = None) -> Topology:
        """A new topology with extra links (e.g. OCS circuits); distances fall back to BFS."""
        src, dst, bandwidth, latency = np.broadcast_arrays(src, dst, bandwidth, latency)
        return replace(self, name=name or self.name,
                       src=np.concatenate([self.src, src.astype(np.int32)]),
                       dst=np.concatenate([self.dst, dst.astype(np.int32)]),
                       bandwidth=np.concatenate([self.bandwidth, bandwidth.astype(float)]),
                       latency=np.concatenate([self.latency, latency.astype(float)]), hops_fn=None)

    def __repr__(self) -> str:
        return f"<Topology {self.name}: {self.num_endpoints} GPUs, {self.num_nodes} nodes, {self.num_links} links>"
