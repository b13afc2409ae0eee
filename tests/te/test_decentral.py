"""Decentralized TE: realized load and metrics by hand, the regularizer removing divergence on a
hand-built case, slicers covering every node once, the exact slicer against brute force, and a
whole run's contract keys."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.te.decentral import METRICS, realize, scale_to_load, views
from lightrail.te.formulations import Objective, TeProblem
from lightrail.te.network import Wan
from lightrail.te.paths import PathSet, k_shortest_paths
from lightrail.te.slicing import (
    OPTIMAL_GAP,
    OPTIMAL_MAX_NODES,
    Slicer,
    blast_radius,
    contiguous,
    optimal,
    randomized,
    slice_nodes,
)


def _pathset(incidence: np.ndarray, path_demand: list[int], pairs: list[tuple[int, int]]) -> PathSet:
    path_demand = np.array(path_demand)
    offsets = np.r_[0, np.cumsum(np.bincount(path_demand))]
    return PathSet(np.array(pairs), offsets, path_demand, sp.csr_matrix(incidence), tuple(() for _ in path_demand))


def test_realize_by_hand_on_one_bottleneck():
    # two single-path demands (sources 0 and 1) over one 10 Gbps link; each controller programs its own
    paths = _pathset(np.array([[1.0, 1.0]]), [0, 1], [(0, 2), (1, 2)])
    flows = np.array([[6.0, 4.0],   # controller 0's allocation (it programs demand 0: 6)
                      [4.0, 6.0]])  # controller 1's (it programs demand 1: 6)
    m, load = realize(paths, np.array([10.0]), np.array([6.0, 6.0]), flows, owner=np.array([0, 1]))
    assert load.tolist() == [12.0]
    assert m.divergence_overload_fraction == pytest.approx(0.2)  # 2 Gbps above 10 Gbps of capacity
    assert m.worst_link_overload == pytest.approx(0.2) and m.max_link_utilization == pytest.approx(1.2)
    assert m.throughput == pytest.approx(10 / 12)  # the link carries 10/12 of each flow
    assert m.blast_radius == pytest.approx(0.5)


def test_realize_sends_no_more_than_the_true_demand():
    paths = _pathset(np.array([[1.0, 0.0], [0.0, 1.0]]), [0, 0], [(0, 1)])
    # programmed 8 + 4 for a demand of 6: sent 4 + 2, split as programmed
    m, load = realize(paths, np.array([10.0, 10.0]), np.array([6.0]), np.array([[8.0, 4.0]]), owner=np.array([0]))
    np.testing.assert_allclose(load, [4.0, 2.0])
    assert m.throughput == pytest.approx(1.0) and m.divergence_overload_fraction == 0.0


def test_regularizer_removes_divergence_on_two_shared_paths():
    """Two demands of 9.7 Gbps, each with a path over link a and one over link b (10 Gbps each); each
    controller over-estimates its own demand by 2% and under-estimates the other's. The LP puts one
    demand almost wholly on one link, so the two controllers' choices overload link b; the
    regularized controllers split both demands evenly, so they agree."""
    paths = _pathset(np.array([[1.0, 0, 1, 0], [0, 1.0, 0, 1]]), [0, 0, 1, 1], [(0, 2), (1, 2)])
    cap, truth = np.array([10.0, 10.0]), np.array([9.7, 9.7])
    seen = np.array([[9.9, 9.5], [9.5, 9.9]])
    owner = np.array([0, 1])
    out = {}
    for lam in (0.0, 0.01):
        problem = TeProblem(paths.incidence, paths.path_demand, cap, Objective.MAX_FLOW, lam)
        out[lam] = realize(paths, cap, truth, np.stack([problem.solve(v) for v in seen]), owner)[0]
    assert out[0.0].divergence_overload_fraction > 0.005
    assert out[0.01].divergence_overload_fraction == pytest.approx(0.0, abs=1e-6)
    assert out[0.01].throughput >= out[0.0].throughput


def test_regularized_controllers_keep_link_loads_near_the_truth_for_any_views():
    """The regularized link utilizations move with the demand: on the same case, for random views
    within +-3%, every link's realized load stays within 3% of what one controller with the true
    demand would program (the LP's does not)."""
    paths = _pathset(np.array([[1.0, 0, 1, 0], [0, 1.0, 0, 1]]), [0, 0, 1, 1], [(0, 2), (1, 2)])
    cap, truth, owner = np.array([10.0, 10.0]), np.array([9.0, 9.0]), np.array([0, 1])
    problem = TeProblem(paths.incidence, paths.path_demand, cap, Objective.MAX_FLOW, 0.01)
    central = paths.incidence @ problem.solve(truth)
    rng = np.random.default_rng(0)
    for _ in range(10):
        seen = views(truth, 2, 0.03, rng)
        _, load = realize(paths, cap, truth, np.stack([problem.solve(v) for v in seen]), owner)
        assert np.all(np.abs(load - central) <= 0.03 * central + 1e-6)


def test_views_stay_within_the_perturbation():
    rng = np.random.default_rng(1)
    d = np.linspace(1, 10, 50)
    v = views(d, 4, 0.1, rng)
    assert v.shape == (4, 50) and np.all(np.abs(v / d - 1) <= 0.1) and np.abs(v / d - 1).max() > 0.09
    np.testing.assert_array_equal(views(d, 3, 0.0, rng), np.tile(d, (3, 1)))
    with pytest.raises(ScenarioError) as e:
        views(d, 2, 1.5, rng)
    assert e.value.field == "--perturbation"


def _ring(n: int) -> Wan:
    return Wan.from_edges("ring", [str(i) for i in range(n)], [(i, (i + 1) % n) for i in range(n)],
                          lon=np.linspace(-10, 10, n), lat=np.zeros(n))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(3, 12), k=st.integers(1, 4), seed=st.integers(0, 1000), slicer=st.sampled_from(list(Slicer)))
def test_slices_cover_every_node_exactly_once_and_none_is_empty(n, k, seed, slicer):
    k = min(k, n)
    weights = np.random.default_rng(seed).lognormal(0, 1, n)
    s = slice_nodes(slicer, _ring(n), k, weights, seed=seed)
    assert s.shape == (n,) and s.dtype.kind == "i" and set(s.tolist()) == set(range(k))


def test_contiguous_slices_are_runs_from_west_to_east():
    s = contiguous(_ring(10), 3)  # longitudes increase with the index
    assert s.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_randomized_puts_the_heaviest_sources_in_different_slices():
    w = np.array([1, 50, 2, 40, 3, 30, 4, 20, 5.0])
    for seed in range(5):
        s = randomized(w, 4, seed=seed)
        assert len(set(s[np.argsort(-w)[:4]].tolist())) == 4


@pytest.mark.parametrize("n, k", [(5, 2), (6, 3), (7, 3), (7, 4)])
def test_optimal_slicing_matches_brute_force(n, k):
    w = np.random.default_rng(n * k).lognormal(0, 1, n)
    best = min(blast_radius(np.array(a), w) for a in itertools.product(range(k), repeat=n) if len(set(a)) == k)
    s = optimal(w, k)
    assert best <= blast_radius(s, w) <= best * (1 + OPTIMAL_GAP) + 1e-12
    assert blast_radius(s, w) <= blast_radius(randomized(w, k), w) + 1e-12


def test_optimal_refuses_large_networks_with_the_flag():
    with pytest.raises(InfeasibleError) as e:
        optimal(np.ones(OPTIMAL_MAX_NODES + 1), 2)
    assert e.value.field == "--slicer"


def test_bad_slices_and_slicer_name_the_flags():
    with pytest.raises(ScenarioError) as e:
        contiguous(_ring(4), 5)
    assert e.value.field == "--slices"
    with pytest.raises(ScenarioError) as e:
        Slicer.parse("geo")
    assert e.value.field == "--slicer" and "randomized" in e.value.fix


def test_scale_to_load_sets_the_best_max_link_utilization():
    wan = _ring(6)
    paths = k_shortest_paths(wan, 2)
    demands = np.random.default_rng(2).uniform(1, 5, (3, paths.demands))
    scaled = scale_to_load(paths, wan.capacity, demands, 0.8)
    x = TeProblem(paths.incidence, paths.path_demand, wan.capacity, Objective.MIN_MLU).solve(scaled.mean(axis=0))
    assert (paths.incidence @ x / wan.capacity).max() == pytest.approx(0.8, rel=1e-5)
    np.testing.assert_allclose(scaled / demands, scaled[0, 0] / demands[0, 0])  # one factor


def test_run_te_reports_the_contract_for_each_controller_and_slicer():
    from lightrail.studies.te import CONTROLLERS, TeSetup, run_te

    run = run_te(TeSetup(topology="abilene", slices=3, matrices=3, perturbation=0.1))
    d = run.to_dict()
    assert d["slicer"] == "randomized"
    for c in CONTROLLERS:
        assert set(METRICS) <= set(d[c])
        for s in d["slicers"]:
            assert set(METRICS) <= set(d["slicers"][s][c])
    assert set(d["slicers"]) == {"contiguous", "randomized", "optimal"}
    # blast radius is the slicing's, whichever controller; the exact slicer is never worse
    for s in d["slicers"]:
        assert d["slicers"][s]["regularized"]["blast_radius"] == d["slicers"][s]["unregularized"]["blast_radius"]
        assert d["slicers"]["optimal"]["regularized"]["blast_radius"] <= d["slicers"][s]["regularized"][
            "blast_radius"] + 1e-9
    assert len(d["rows"]) == 3 * 2
