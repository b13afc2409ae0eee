"""A WAN as arrays: named nodes with positions, directed links with capacities and lengths.

Topologies come undirected (Topology Zoo, SNDlib, our JSON format); each edge becomes two directed
links of the same capacity, the convention of path-based TE (SWAN, B4, Symphony): a demand's
flow uses one direction of a link, and each direction has its own capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.errors import ScenarioError

__all__ = ["Wan", "DEFAULT_CAPACITY_GBPS"]

#: Capacity of a link the data gives none for. Topology Zoo and SNDlib's topohub copies carry no
#: capacities; 100 Gbps per direction is the line rate of today's WAN wavelengths (100G coherent
#: optics), the same for every link so that only the topology and the traffic shape the result.
DEFAULT_CAPACITY_GBPS = 100.0


@dataclass(frozen=True, eq=False)
class Wan:
    """``nodes[i]`` is node i's name; link l goes ``src[l] -> dst[l]`` with ``capacity[l]`` Gbps
    and ``length_km[l]`` (NaN where unknown). ``lon``/``lat`` are degrees (NaN where unknown);
    ``mass`` is a node's traffic weight for the gravity model when the data has one (SNDlib's
    measured demands), else None."""

    name: str
    nodes: tuple[str, ...]
    src: np.ndarray
    dst: np.ndarray
    capacity: np.ndarray
    length_km: np.ndarray
    lon: np.ndarray
    lat: np.ndarray
    mass: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.nodes)
        if n < 2:
            raise ScenarioError(f"topology {self.name!r} has {n} node(s)", field="nodes", fix="give at least 2 nodes")
        if len(set(self.nodes)) != n:
            dup = next(x for x in self.nodes if self.nodes.count(x) > 1)
            raise ScenarioError(f"node {dup!r} appears twice", field="nodes", fix="give each node a unique name")
        for name in ("src", "dst"):
            a = getattr(self, name)
            if a.size and (a.min() < 0 or a.max() >= n):
                raise ScenarioError(f"a link end is not one of the {n} nodes", field="links", fix="use node names")
        if np.any(self.src == self.dst):
            raise ScenarioError("a link joins a node to itself", field="links", fix="remove self-loops")
        if not np.all(np.isfinite(self.capacity)) or np.any(self.capacity <= 0):
            raise ScenarioError("every link needs a positive capacity", field="links.capacity_gbps",
                                fix="give a capacity in Gbps > 0")

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def links(self) -> int:
        return len(self.src)

    @classmethod
    def from_edges(cls, name: str, nodes, edges, *, capacity=None, length_km=None, lon=None, lat=None,
                   mass=None) -> Wan:
        """Undirected ``edges`` (pairs of node indices) as two directed links each; ``capacity``
        per edge (default DEFAULT_CAPACITY_GBPS). Parallel edges are merged, adding capacities.

        >>> w = Wan.from_edges("line", ["a", "b", "c"], [(0, 1), (1, 2)])
        >>> w.links, w.src.tolist(), w.dst.tolist(), float(w.capacity[0])
        (4, [0, 1, 1, 2], [1, 2, 0, 1], 100.0)
        """
        nodes = tuple(str(x) for x in nodes)
        e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        m = len(e)
        cap = np.full(m, DEFAULT_CAPACITY_GBPS) if capacity is None else np.asarray(capacity, dtype=float)
        km = np.full(m, np.nan) if length_km is None else np.asarray(length_km, dtype=float)
        lo, hi = np.minimum(e[:, 0], e[:, 1]), np.maximum(e[:, 0], e[:, 1])
        pairs, first, inverse = np.unique(np.stack([lo, hi], axis=1), axis=0, return_index=True, return_inverse=True)
        merged = np.bincount(inverse.ravel(), weights=cap, minlength=len(pairs))
        km = km[first]
        unknown = np.full(len(nodes), np.nan)
        return cls(name, nodes,
                   src=np.concatenate([pairs[:, 0], pairs[:, 1]]), dst=np.concatenate([pairs[:, 1], pairs[:, 0]]),
                   capacity=np.concatenate([merged, merged]), length_km=np.concatenate([km, km]),
                   lon=unknown if lon is None else np.asarray(lon, dtype=float),
                   lat=unknown if lat is None else np.asarray(lat, dtype=float),
                   mass=None if mass is None else np.asarray(mass, dtype=float))

    def weights(self) -> np.ndarray:
        """Link lengths for shortest paths: kilometres where every link has one, else hop count."""
        return self.length_km if np.all(np.isfinite(self.length_km)) else np.ones(self.links)

    def describe(self) -> dict:
        return {"name": self.name, "nodes": self.n, "links": self.links,
                "capacity_gbps": float(self.capacity.sum())}
