"""One decentralized-TE experiment made ready: its setup (``TeSetup``, checked) and its network (``TeNetwork``:
the WAN, its k shortest paths and its traffic matrices), which the study (:mod:`lightrail.studies.te`) and the
live network service (:mod:`lightrail.te.service`) both start from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.te.decentral import check_perturbation, scale_to_load
from lightrail.te.formulations import Objective
from lightrail.te.inputs import load_topology, load_traffic
from lightrail.te.network import Wan
from lightrail.te.paths import DEFAULT_K, PathSet, k_shortest_paths
from lightrail.te.slicing import OPTIMAL_MAX_NODES, Slicer, check_slices, optimal
from lightrail.te.traffic import gravity

__all__ = ["DEFAULT_LAMBDA", "TeNetwork", "TeSetup", "prepare"]

#: Weight of the regularizer against the dimensionless primary objective (fraction of demand served). Chosen on
#: our own runs (GEANT, 5 slices, +-5% views, 100 matrices, `benchmarks/bench_te.py --lambda L --matrices 100`):
#: 0.0003 to 0.003 all cut the divergence overload 8x and raise throughput (98.71% vs 98.46% unregularized);
#: 0.01 cuts it 10x but serves 97.5%, and 0.1 starves the network (the sum runs over every link).
DEFAULT_LAMBDA = 0.001


@dataclass(frozen=True)
class TeSetup:
    """One decentralized-TE experiment: the network, its traffic, the controllers and the slicers."""

    topology: str = "geant"
    slices: int = 5
    lam: float = DEFAULT_LAMBDA
    perturbation: float = 0.05
    objective: Objective = Objective.MAX_FLOW
    k: int = DEFAULT_K
    matrices: int = 10
    load: float = 0.9
    seed: int = 0
    traffic: str | None = None  # a matrix file (Gbps); None: the gravity model scaled to ``load``
    slicers: tuple[Slicer, ...] = (Slicer.RANDOMIZED, Slicer.CONTIGUOUS, Slicer.OPTIMAL)  # the first: top level

    def check(self) -> None:
        if not self.lam >= 0:
            raise ScenarioError(f"lambda {self.lam}", field="--lambda", fix="use lambda >= 0 (0 turns it off)")
        check_perturbation(self.perturbation)
        if not isinstance(self.matrices, int) or self.matrices < 1:
            raise ScenarioError(f"{self.matrices!r} traffic matrices", field="--matrices", fix="use an integer >= 1")


@dataclass(frozen=True, eq=False)
class TeNetwork:
    """What every run on one topology shares: the WAN, its paths, its traffic (T, D) in Gbps."""

    wan: Wan
    paths: PathSet
    demands: np.ndarray

    def node_traffic(self) -> np.ndarray:
        """Each node's mean outgoing traffic: what its slice controller programs."""
        return np.bincount(self.paths.pairs[:, 0], weights=self.demands.mean(axis=0), minlength=self.wan.n)


def prepare(setup: TeSetup) -> TeNetwork:
    """Load the topology, compute its paths and its traffic."""
    setup.check()
    wan = load_topology(setup.topology)
    check_slices(wan.n, setup.slices)
    if all(Slicer.parse(s) is Slicer.OPTIMAL for s in setup.slicers) and wan.n > OPTIMAL_MAX_NODES:
        optimal(np.ones(wan.n), setup.slices)  # its error, before the paths of a large network are computed
    paths = k_shortest_paths(wan, setup.k)
    if setup.traffic is not None:
        demands = paths.demand_vector(load_traffic(setup.traffic, wan.n))[: setup.matrices]
    else:
        tms = gravity(wan, setup.matrices, seed=setup.seed)
        demands = scale_to_load(paths, wan.capacity, paths.demand_vector(tms), setup.load)
    return TeNetwork(wan, paths, demands)
