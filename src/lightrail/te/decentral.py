"""Decentralized TE as Symphony defines it: k slice controllers each solve the whole network's TE on
their own view of demand and program only the demands whose source is in their slice; the network
carries the sum of what they programmed.

Views: each controller sees every demand with an independent relative error drawn uniformly in
``[-perturbation, +perturbation]`` (controllers measure demand at different places and times).

Realization: a demand sends at most its true rate, split over its paths as programmed
(``sent = programmed * min(1, d / sum programmed)``); a link above capacity carries ``c / load``
of every flow through it, and a flow delivers the worst such fraction along its path.

Metrics of one traffic matrix (the contract of ``lightrail te run``):
``divergence_overload_fraction`` (sum over links of load above capacity / total capacity),
``worst_link_overload`` (max over links of load / capacity - 1, at least 0; 0.3 is 30 % over),
``throughput`` (delivered / total demand), ``max_link_utilization`` (max load / capacity) and
``blast_radius`` (the worst share of traffic a single slice controller programs: what its failure
leaves unprogrammed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.te.formulations import Objective, TeProblem
from lightrail.te.paths import PathSet
from lightrail.te.slicing import blast_radius

__all__ = ["Metrics", "METRICS", "views", "realize", "scale_to_load", "check_perturbation"]

METRICS = ("divergence_overload_fraction", "worst_link_overload", "throughput", "max_link_utilization",
           "blast_radius")


@dataclass(frozen=True)
class Metrics:
    divergence_overload_fraction: float
    worst_link_overload: float
    throughput: float
    max_link_utilization: float
    blast_radius: float

    def to_dict(self) -> dict:
        return asdict(self)


def check_perturbation(p: float) -> None:
    if not 0 <= p < 1:
        raise ScenarioError(f"perturbation {p}", field="--perturbation",
                            fix="a relative demand error in [0, 1), e.g. 0.05 for +-5%")


def views(demand: np.ndarray, k: int, perturbation: float, rng: np.random.Generator) -> np.ndarray:
    """(k, D) demand views: each controller's own relative error, uniform in +-perturbation."""
    check_perturbation(perturbation)
    return demand[None, :] * (1.0 + perturbation * rng.uniform(-1.0, 1.0, (k, len(demand))))


def realize(paths: PathSet, capacity: np.ndarray, demand: np.ndarray, flows: np.ndarray,
            owner: np.ndarray) -> tuple[Metrics, np.ndarray]:
    """Metrics of programming demand d with controller ``owner[d]``'s path flows (``flows``: (k, P));
    returns them with the per-link load (Gbps)."""
    programmed = flows[owner[paths.path_demand], np.arange(paths.paths)]
    asked = paths.per_demand(programmed)
    scale = np.divide(demand, asked, out=np.ones_like(demand), where=asked > demand)
    sent = programmed * scale[paths.path_demand]
    load = paths.incidence @ sent
    util = load / capacity
    over = np.maximum(load - capacity, 0.0)
    share = np.minimum(1.0, np.divide(capacity, load, out=np.ones_like(load), where=load > 0))
    inc = paths.incidence.T.tocsr()  # (P, L): each path's links
    worst = np.minimum.reduceat(share[inc.indices], inc.indptr[:-1]) if inc.nnz else np.ones(paths.paths)
    total = demand.sum()
    metrics = Metrics(
        divergence_overload_fraction=float(over.sum() / capacity.sum()),
        worst_link_overload=float(max(0.0, util.max() - 1.0)),
        throughput=float((sent * worst).sum() / total) if total > 0 else 1.0,
        max_link_utilization=float(util.max()),
        blast_radius=blast_radius(owner, demand))
    return metrics, load


def scale_to_load(paths: PathSet, capacity: np.ndarray, demands: np.ndarray, load: float) -> np.ndarray:
    """``demands`` (T, D) scaled by one factor so that the least achievable max link utilization of
    their mean is ``load`` (how TE evaluations set how full the network runs)."""
    if not load > 0:
        raise ScenarioError(f"load {load}", field="--load", fix="a target utilization > 0, e.g. 0.9")
    mlu_problem = TeProblem(paths.incidence, paths.path_demand, capacity, Objective.MIN_MLU)
    x = mlu_problem.solve(demands.mean(axis=0))
    mlu = float(((paths.incidence @ x) / capacity).max())
    return demands * (load / mlu)
