"""Candidate paths: the k shortest simple paths of every ordered node pair, as a sparse link x path
incidence (the path formulation of SWAN, B4 and Symphony: TE picks how much of each demand goes on
each of its precomputed tunnels)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.te.network import Wan

__all__ = ["PathSet", "k_shortest_paths", "check_te_size", "te_bytes", "DEFAULT_K", "MAX_TE_PATHS"]

#: Paths per demand (Symphony and most path-based TE evaluations use a handful; 4 is common).
DEFAULT_K = 4

MAX_TE_PATHS = 1 << 18
"""Most candidate paths (demands x paths per demand, counted as ``n (n-1) k``) of one TE network: each is a variable
of every controller's solve. TATA (143 nodes, 4 paths per demand) has 80,962 and ``te run`` takes 13 CPU-minutes
there; 262,144 is ~3x that. A 500-node network at 4 paths (998,000) would take hours."""
BYTES_PER_PATH = 2 << 10
BYTES_PER_HOP = 512
"""Peak bytes of ``te run`` per candidate path and per link of a path (the incidence's entries, held by the paths,
the HiGHS and Clarabel models and the views' flows), fitted to ru_maxrss: germany50 (9,800 paths, 188 MiB),
TATA (80,962 paths, ~1M entries, 676 MiB), a 200-node ring at 1 path (39,800 paths of 50 hops, 1,038 MiB):
1.7 KiB and 415 B, rounded up."""
BASE_BYTES = 160 << 20
"""Peak bytes of ``te run`` before its paths: the interpreter, numpy/scipy, HiGHS (154 MiB measured on GEANT)."""


def _mean_hops(wan: Wan) -> float:
    """Mean hop count of the shortest paths (breadth-first, every ordered pair): the k shortest run ~20% longer."""
    from scipy.sparse.csgraph import shortest_path

    graph = sp.csr_matrix((np.ones(wan.links), (wan.src, wan.dst)), shape=(wan.n, wan.n))
    hops = shortest_path(graph, unweighted=True)
    finite = hops[np.isfinite(hops) & (hops > 0)]
    return float(finite.mean()) if finite.size else 1.0


def te_bytes(wan: Wan, k: int) -> tuple[int, float]:
    """Candidate paths (``n (n-1) k``, an upper bound) and the estimated peak bytes of TE on ``wan``."""
    paths = wan.n * (wan.n - 1) * int(k)
    return paths, BASE_BYTES + paths * (BYTES_PER_PATH + BYTES_PER_HOP * (1.2 * _mean_hops(wan) + 1))


def check_te_size(wan: Wan, k: int) -> int:
    """Refuse, before any path is computed, a network whose TE this machine cannot hold or would take hours over:
    at most :data:`MAX_TE_PATHS` candidate paths, and their estimated memory (:func:`te_bytes`) within
    ``limits.memory_budget()``. Returns the candidate paths."""
    from lightrail.limits import check_fits, show_count

    paths = wan.n * (wan.n - 1) * int(k)
    most = int(math.sqrt(MAX_TE_PATHS / k)) + 1  # n (n-1) k <= MAX_TE_PATHS
    while most * (most - 1) * k > MAX_TE_PATHS:
        most -= 1
    fix = f"use a topology of at most {most:,} nodes at --paths {k}, or fewer --paths"
    what = f"TE on {wan.name} ({wan.n:,} nodes x {wan.n - 1:,} x {k} paths per demand: up to {show_count(paths)} paths"
    if paths > MAX_TE_PATHS:  # checked first: the estimate below walks every pair
        need = BASE_BYTES + paths * (BYTES_PER_PATH + BYTES_PER_HOP)  # at least, whatever the path lengths
        raise ScenarioError(f"{what}, at least {need / 2**30:,.1f} GiB) is over the bound of {MAX_TE_PATHS:,} "
                            "paths (each is a variable of every solve: hours of work)", field="--topology", fix=fix)
    paths, need = te_bytes(wan, k)
    check_fits(need, field="--topology", value=what + ")", fix="use fewer --paths or a smaller topology")
    return paths


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
    check_te_size(wan, k)
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
