"""Symphony's question on a real WAN: do slice controllers that each solve TE on their own view of
demand overload links together, does the quadratic regularizer stop it, and how much traffic does
one failed controller take down under each slicer? ``run_te`` is ``lightrail te run``; ``sweep_te``
is ``lightrail study te``. The setup and its prepared network live in :mod:`lightrail.te.prepare` (the live
service starts from them too); they are re-exported here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from lightrail.te.decentral import METRICS, Metrics, realize, views
from lightrail.te.formulations import TeProblem
from lightrail.te.prepare import DEFAULT_LAMBDA, TeNetwork, TeSetup, prepare
from lightrail.te.slicing import OPTIMAL_MAX_NODES, Slicer, check_slices, slice_nodes

__all__ = ["CONTROLLERS", "DEFAULT_LAMBDA", "SWEEP", "TeSetup", "TeNetwork", "TeRun", "TeSweep", "prepare",
           "make_slicings", "run_te", "sweep_setups", "sweep_te"]

CONTROLLERS = ("regularized", "unregularized")


@dataclass(frozen=True, eq=False)
class TeRun:
    """Per slicer and controller, each metric over the traffic matrices (arrays of length T)."""

    setup: TeSetup
    network: dict
    slicings: dict[str, np.ndarray]
    per_matrix: dict[tuple[str, str], dict[str, np.ndarray]]

    def mean(self, slicer: str, controller: str) -> dict[str, float]:
        return {m: float(v.mean()) for m, v in self.per_matrix[slicer, controller].items()}

    def rows(self) -> list[dict]:
        return [{"topology": self.setup.topology, "slices": self.setup.slices, "lambda": self.setup.lam,
                 "perturbation": self.setup.perturbation, "slicer": s, "controller": c, **self.mean(s, c)}
                for s, c in self.per_matrix]

    def to_dict(self) -> dict:
        """The JSON of ``lightrail te run``: the contract's keys per controller (for the first slicer,
        randomized by default) and per slicer, the setup, and the flat rows."""
        s = self.setup
        first = next(iter(self.slicings))
        return {
            "topology": s.topology, "network": self.network, "slices": s.slices, "lambda": s.lam,
            "perturbation": s.perturbation, "objective": s.objective.value, "paths_per_demand": s.k,
            "matrices": s.matrices, "load": s.load if s.traffic is None else None, "seed": s.seed,
            "slicer": first,
            **{c: self.mean(first, c) for c in CONTROLLERS},
            "slicers": {sl: {c: self.mean(sl, c) for c in CONTROLLERS} for sl in self.slicings},
            "slicings": {sl: v.tolist() for sl, v in self.slicings.items()},
            "rows": self.rows(),
        }


def make_slicings(setup: TeSetup, net: TeNetwork) -> dict[str, np.ndarray]:
    """The setup's slicings of the network, by slicer name; the exact slicer is left out on networks
    too large for it unless it is the only one asked for (then its error says so)."""
    slicers = [Slicer.parse(s) for s in setup.slicers]
    kept = [s for s in slicers if s is not Slicer.OPTIMAL or net.wan.n <= OPTIMAL_MAX_NODES] or slicers
    weights = net.node_traffic()
    return {s.value: slice_nodes(s, net.wan, setup.slices, weights, seed=setup.seed) for s in kept}


def run_te(setup: TeSetup = TeSetup(), *, network: TeNetwork | None = None,  # noqa: B008 - TeSetup is frozen
           slicings: dict[str, np.ndarray] | None = None,
           progress: Callable[[int, int], None] = lambda done, total: None) -> TeRun:
    """Every traffic matrix: k perturbed views, each solved by a regularized and an unregularized
    controller; each slicer decides which controller's flows each demand gets."""
    setup.check()
    net = network or prepare(setup)
    wan, paths, k = net.wan, net.paths, setup.slices
    check_slices(wan.n, k)
    slicings = slicings if slicings is not None else make_slicings(setup, net)
    owners = {s: v[paths.pairs[:, 0]] for s, v in slicings.items()}
    problems = {"regularized": TeProblem(paths.incidence, paths.path_demand, wan.capacity, setup.objective, setup.lam),
                "unregularized": TeProblem(paths.incidence, paths.path_demand, wan.capacity, setup.objective, 0.0)}
    rng = np.random.default_rng(setup.seed + 1)
    per_matrix = {(s, c): {m: np.empty(len(net.demands)) for m in METRICS} for s in slicings for c in CONTROLLERS}
    for t, demand in enumerate(net.demands):
        seen = views(demand, k, setup.perturbation, rng)
        for c, problem in problems.items():
            flows = np.stack([problem.solve(v) for v in seen])
            for s, owner in owners.items():
                metrics: Metrics = realize(paths, wan.capacity, demand, flows, owner)[0]
                for m, value in metrics.to_dict().items():
                    per_matrix[s, c][m][t] = value
        progress(t + 1, len(net.demands))
    return TeRun(setup, {**wan.describe(), "demands": paths.demands, "paths": paths.paths}, slicings, per_matrix)


#: The default sweep: one factor at a time around TeSetup's defaults, on GEANT and Abilene.
SWEEP = {"topology": ("geant", "abilene"), "lam": (0.0001, 0.001, 0.01, 0.1), "perturbation": (0.02, 0.05, 0.1),
         "slices": (2, 5, 8)}


@dataclass(frozen=True, eq=False)
class TeSweep:
    runs: tuple[TeRun, ...] = field(default_factory=tuple)

    def rows(self) -> list[dict]:
        return [r for run in self.runs for r in run.rows()]

    def to_dict(self) -> dict:
        return {"rows": self.rows()}


def sweep_setups(base: TeSetup, sweep: dict[str, Sequence]) -> list[TeSetup]:
    """The base setup on each topology, then each other factor varied alone (no repeats)."""
    out: list[TeSetup] = []
    for topology in sweep.get("topology", (base.topology,)):
        point = replace(base, topology=topology)
        candidates = [point] + [replace(point, **{f: v}) for f, values in sweep.items() if f != "topology"
                                for v in values]
        out.extend(s for s in candidates if s not in out)
    return out


def sweep_te(base: TeSetup = TeSetup(), sweep: dict[str, Sequence] = SWEEP, *,  # noqa: B008 - TeSetup is frozen
             progress: Callable[[int, int], None] = lambda done, total: None) -> TeSweep:
    """``run_te`` at every point of the sweep; each topology's paths and traffic built once."""
    setups = sweep_setups(base, sweep)
    networks: dict[tuple, TeNetwork] = {}
    slicings: dict[tuple, dict[str, np.ndarray]] = {}  # the exact slicer's MILP takes seconds: once per point
    total = sum(s.matrices for s in setups)
    done = 0
    runs = []
    for s in setups:
        key = (s.topology, s.k, s.matrices, s.load, s.seed, s.traffic)
        if key not in networks:
            networks[key] = prepare(s)
        cut = key + (s.slices, s.slicers)
        if cut not in slicings:
            slicings[cut] = make_slicings(s, networks[key])
        runs.append(run_te(s, network=networks[key], slicings=slicings[cut],
                           progress=lambda d, _t, base=done: progress(base + d, total)))
        done += s.matrices
    return TeSweep(tuple(runs))
