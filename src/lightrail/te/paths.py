"""Candidate paths: the k shortest simple paths of every ordered node pair, as a sparse link x path
incidence (the path formulation of SWAN, B4 and Symphony: TE picks how much of each demand goes on
each of its precomputed tunnels)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.te.network import Wan

__all__ = ["PathSet", "k_shortest_paths", "DEFAULT_K"]

#: Paths per demand (Symphony and most path-based TE evaluations use a handful; 4 is common).
DEFAULT_K = 4


@dataclass(frozen=True, eq=False)
class PathSet:
    """Demand d goes ``pairs[d, 0] -> pairs[d, 1]``; its paths are ``offsets[d]:offsets[d+1]``;
    ``path_demand[p]`` is path p's demand and ``incidence[l, p]`` is 1 where path p uses link l."""

    pairs: np.ndarray
    offsets: np.ndarray
    path_demand: np.ndarray
    incidence: sp.csr_matrix
    routes: tuple[tuple[int, ...], ...]  # each path's nodes, for display and tests

    @property
    def demands(self) -> int:
        return len(self.pairs)

    @property
    def paths(self) -> int:
        return len(self.path_demand)

    def demand_vector(self, matrix: np.ndarray) -> np.ndarray:
        """The (D,) demands of an (n, n) matrix, or (T, D) of a (T, n, n) stack, in ``pairs`` order."""
        return np.asarray(matrix)[..., self.pairs[:, 0], self.pairs[:, 1]]

    def per_demand(self, x: np.ndarray) -> np.ndarray:
        """Sum of path values per demand (the last axis of ``x`` runs over paths)."""
        return np.add.reduceat(x, self.offsets[:-1], axis=-1)


def k_shortest_paths(wan: Wan, k: int = DEFAULT_K) -> PathSet:
    """The ``k`` shortest loop-free paths (by link length, else hops) of every ordered node pair
    (Yen's algorithm, networkx). A pair with no path at all is an error: its demand could never be
    served."""
    if not isinstance(k, int | np.integer) or k < 1:
        raise ScenarioError(f"{k!r} paths per demand", field="--paths", fix="use an integer >= 1 (default 4)")
    g = nx.DiGraph()
    g.add_nodes_from(range(wan.n))
    weight = wan.weights()
    link_of = {}
    for link, (a, b) in enumerate(zip(wan.src.tolist(), wan.dst.tolist(), strict=True)):
        g.add_edge(a, b, w=float(weight[link]))
        link_of[a, b] = link
    pairs, offsets, routes, rows, cols = [], [0], [], [], []
    for s, t in itertools.permutations(range(wan.n), 2):
        try:
            found = list(itertools.islice(nx.shortest_simple_paths(g, s, t, weight="w"), k))
        except nx.NetworkXNoPath:
            raise InfeasibleError(f"no path from {wan.nodes[s]} to {wan.nodes[t]}", field="--topology",
                                  fix="give a connected topology") from None
        for route in found:
            p = len(routes)
            routes.append(tuple(route))
            links = [link_of[a, b] for a, b in itertools.pairwise(route)]
            rows.extend(links)
            cols.extend([p] * len(links))
        pairs.append((s, t))
        offsets.append(len(routes))
    offsets = np.array(offsets, dtype=np.int64)
    path_demand = np.repeat(np.arange(len(pairs)), np.diff(offsets))
    incidence = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(wan.links, len(routes)))
    return PathSet(np.array(pairs, dtype=np.int64), offsets, path_demand, incidence, tuple(routes))
