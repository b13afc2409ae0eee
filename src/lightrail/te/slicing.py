"""Slicers: which controller owns which node (and so programs the demands that start there).

A slicing is an int array ``slice_of[node]`` in 0..k-1 with every slice non-empty, so every node is
in exactly one slice by construction. Its blast radius is the worst share of traffic one slice
controller programs: what a single controller failure leaves unprogrammed.

- ``contiguous``: current practice, geographic regions (Symphony, sec. 2: slices follow regions).
  Nodes ordered west to east by longitude (breadth-first from node 0 where positions are unknown)
  and cut into k runs of equal size.
- ``randomized``: Symphony's randomized slicing, which spreads the heaviest sources: nodes in order
  of decreasing traffic, dealt k at a time to a fresh random permutation of the slices.
- ``optimal``: the least blast radius, a small MILP solved by HiGHS (scipy.milp), proven to within
  OPTIMAL_GAP (0.1%) of the optimum.
"""

from __future__ import annotations

from enum import StrEnum

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.te.network import Wan

__all__ = ["Slicer", "contiguous", "randomized", "optimal", "slice_nodes", "blast_radius", "check_slices",
           "OPTIMAL_MAX_NODES", "OPTIMAL_GAP"]

#: The exact slicer's proven relative gap: closing the last 0.1% between near-equal slicings can take HiGHS
#: minutes (GEANT, 5 slices: 0.20018 found at once, 92 s to prove), and no blast radius differs by that little.
OPTIMAL_GAP = 1e-3

#: Largest network the exact slicer takes (the MILP has n*k binaries; beyond this HiGHS may take minutes).
OPTIMAL_MAX_NODES = 60


class Slicer(StrEnum):
    CONTIGUOUS = "contiguous"
    RANDOMIZED = "randomized"
    OPTIMAL = "optimal"

    @classmethod
    def parse(cls, text: str, *, field: str = "--slicer") -> Slicer:
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            raise ScenarioError(f"unknown slicer {text!r}", field=field,
                                fix=f"one of: {', '.join(s.value for s in cls)}") from None


def check_slices(n: int, k: int) -> None:
    if not isinstance(k, int | np.integer) or not 1 <= k <= n:
        raise ScenarioError(f"{k!r} slices of {n} nodes", field="--slices", fix=f"use 1..{n} slices")


def contiguous(wan: Wan, k: int) -> np.ndarray:
    """Geographic slicing: k runs of equal size in west-to-east order.

    >>> w = Wan.from_edges("l", "abcd", [(0, 1), (1, 2), (2, 3)], lon=[3, 0, 2, 1])
    >>> contiguous(w, 2).tolist()
    [1, 0, 1, 0]
    """
    check_slices(wan.n, k)
    if np.all(np.isfinite(wan.lon)):
        order = np.lexsort((np.nan_to_num(wan.lat), wan.lon))
    else:
        g = nx.Graph(list(zip(wan.src.tolist(), wan.dst.tolist(), strict=True)))
        g.add_nodes_from(range(wan.n))
        order = np.array(list(nx.bfs_tree(g, 0)) + [v for v in range(wan.n) if not nx.has_path(g, 0, v)])
    out = np.empty(wan.n, dtype=np.int64)
    out[order] = np.arange(wan.n) * k // wan.n
    return out


def randomized(weights: np.ndarray, k: int, *, seed: int = 0) -> np.ndarray:
    """Heaviest first, each round of k nodes to a random permutation of the slices.

    >>> randomized(np.array([9.0, 8.0, 1.0, 1.0]), 2, seed=1).tolist() in ([0, 1, 0, 1], [0, 1, 1, 0],
    ...                                                                    [1, 0, 0, 1], [1, 0, 1, 0])
    True
    """
    w = np.asarray(weights, dtype=float)
    check_slices(len(w), k)
    rng = np.random.default_rng(seed)
    order = np.argsort(-w, kind="stable")
    out = np.empty(len(w), dtype=np.int64)
    for first in range(0, len(w), k):
        chunk = order[first:first + k]
        out[chunk] = rng.permutation(k)[:len(chunk)]
    return out


def optimal(weights: np.ndarray, k: int) -> np.ndarray:
    """The slicing of least blast radius (every slice non-empty, within OPTIMAL_GAP): min z s.t. each node in
    one slice and each slice's traffic <= z. Slice 0 holds node 0 (the slices are interchangeable)."""
    w = np.asarray(weights, dtype=float)
    n = len(w)
    check_slices(n, k)
    if n > OPTIMAL_MAX_NODES:
        raise InfeasibleError(f"the exact slicer takes up to {OPTIMAL_MAX_NODES} nodes, not {n}", field="--slicer",
                              fix="use contiguous or randomized on large networks")
    scale = w.sum() or 1.0
    nv = n * k + 1  # y[i, s] row-major, then z
    one = sp.kron(sp.identity(n), np.ones((1, k)))  # sum_s y[i, s] = 1
    load = sp.hstack([sp.kron(w[None, :] / scale, sp.identity(k)), -np.ones((k, 1))])  # sum_i w_i y[i,s] - z <= 0
    used = sp.kron(np.ones((1, n)), sp.identity(k))  # sum_i y[i, s] >= 1
    a = sp.vstack([sp.hstack([one, sp.csr_matrix((n, 1))]), load, sp.hstack([used, sp.csr_matrix((k, 1))])])
    lo = np.concatenate([np.ones(n), np.full(k, -np.inf), np.ones(k)])
    hi = np.concatenate([np.ones(n), np.zeros(k), np.full(k, np.inf)])
    c = np.zeros(nv)
    c[-1] = 1.0
    upper = np.ones(nv)
    upper[-1] = np.inf
    lower = np.zeros(nv)
    upper[:-1] = (np.arange(k)[None, :] <= np.arange(n)[:, None]).ravel()  # node i in slices 0..i: the slices
    lower[0] = 1.0  # are interchangeable, so this symmetry break keeps an optimum (node 0 in slice 0)
    lower[-1] = max(1.0 / k, w.max() / scale)  # no slicing does better: HiGHS stops when one attains it
    res = milp(c, constraints=LinearConstraint(a.tocsr(), lo, hi), integrality=np.r_[np.ones(n * k), 0],
               bounds=Bounds(lower, upper), options={"mip_rel_gap": OPTIMAL_GAP, "time_limit": 120.0})
    if res.status != 0 or res.x is None:
        raise InfeasibleError(f"the exact slicer proved no slicing optimal ({res.message})", field="--slicer",
                              fix="use fewer nodes or slices, or the randomized slicer")
    return np.argmax(res.x[:-1].reshape(n, k), axis=1).astype(np.int64)


def slice_nodes(slicer: Slicer | str, wan: Wan, k: int, weights: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """The slicing a slicer makes of ``wan`` (``weights``: each node's outgoing traffic)."""
    slicer = Slicer.parse(slicer)
    if slicer is Slicer.CONTIGUOUS:
        return contiguous(wan, k)
    if slicer is Slicer.RANDOMIZED:
        return randomized(weights, k, seed=seed)
    return optimal(weights, k)


def blast_radius(slice_of: np.ndarray, weights: np.ndarray) -> float:
    """The worst share of traffic one slice's controller programs.

    >>> blast_radius(np.array([0, 0, 1]), np.array([1.0, 1.0, 2.0]))
    0.5
    """
    w = np.asarray(weights, dtype=float)
    total = w.sum()
    return float(np.bincount(slice_of, weights=w).max() / total) if total > 0 else 0.0
