"""Path-based TE (max-flow, max-concurrent, min-MLU, with and without Symphony's regularizer) against closed forms,
independent solvers (scipy linprog, a HiGHS QP built here, OSQP) and brute-force grid search."""

from __future__ import annotations

import highspy
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from lightrail.errors import ScenarioError
from lightrail.te.formulations import Objective, TeProblem, link_loads, utilization

OBJECTIVES = list(Objective)


def incidence(links: int, paths: list[list[int]]) -> sp.csr_matrix:
    """The link x path incidence of ``paths`` (each a list of link indices)."""
    rows = [link for path in paths for link in path]
    cols = [p for p, path in enumerate(paths) for _ in path]
    return sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(links, len(paths)))


def random_instance(seed: int):
    """A tiny random TE instance: 5-8 links, 2-4 demands of 2-3 paths, each path on 1-3 links."""
    rng = np.random.default_rng(seed)
    links = int(rng.integers(5, 9))
    demands = int(rng.integers(2, 5))
    paths, path_demand = [], []
    for k in range(demands):
        for _ in range(int(rng.integers(2, 4))):
            paths.append(sorted(rng.choice(links, size=int(rng.integers(1, 4)), replace=False).tolist()))
            path_demand.append(k)
    capacity = rng.uniform(1.0, 10.0, links)
    demand = rng.uniform(0.0, 8.0, demands)
    return incidence(links, paths), np.array(path_demand), capacity, demand


def reg(te: TeProblem, x: np.ndarray) -> float:
    return float(np.sum(te.utilization(x) ** 2))


# -- independent solvers ---------------------------------------------------------------------------------------

def dense_model(a, path_demand, capacity, demand, objective):
    """``(cost, A_ub, b_ub, A_eq, b_eq, bounds)`` over ``z = [x, t or U]`` minimising -primary (or U), dense."""
    a = np.asarray(sp.csr_matrix(a).todense())
    nl, npth = a.shape
    b = np.zeros((len(demand), npth))
    b[path_demand, np.arange(npth)] = 1.0
    total = demand.sum()
    if objective == Objective.MAX_FLOW:
        cost = -np.ones(npth) / total
        return cost, np.vstack([a, b]), np.concatenate([capacity, demand]), None, None, [(0, None)] * npth
    if objective == Objective.MAX_CONCURRENT:
        cost = np.append(np.zeros(npth), -1.0)
        a_ub = np.hstack([a, np.zeros((nl, 1))])
        a_eq = np.hstack([b, -demand[:, None]])
        return cost, a_ub, capacity, a_eq, np.zeros(len(demand)), [(0, None)] * npth + [(0, 1)]
    cost = np.append(np.zeros(npth), 1.0)
    a_ub = np.hstack([a, -capacity[:, None]])
    a_eq = np.hstack([b, np.zeros((len(demand), 1))])
    return cost, a_ub, np.zeros(nl), a_eq, demand, [(0, None)] * (npth + 1)


def linprog_primary(a, path_demand, capacity, demand, objective) -> float:
    cost, a_ub, b_ub, a_eq, b_eq, bounds = dense_model(a, path_demand, capacity, demand, objective)
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs-ipm")
    assert res.status == 0
    return res.fun if objective == Objective.MIN_MLU else -res.fun


def highs_qp(a, path_demand, capacity, demand, objective, lam) -> tuple[float, np.ndarray]:
    """The regularized optimum (as the module defines it) and its x, from HiGHS's QP solver with a Hessian."""
    cost, a_ub, b_ub, a_eq, b_eq, bounds = dense_model(a, path_demand, capacity, demand, objective)
    rows = [a_ub] + ([a_eq] if a_eq is not None else [])
    lower = [np.full(len(b_ub), -highspy.kHighsInf)] + ([b_eq] if a_eq is not None else [])
    upper = [b_ub] + ([b_eq] if a_eq is not None else [])
    m = sp.csc_matrix(np.vstack(rows))
    n = len(cost)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, m.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = np.array([lo for lo, _ in bounds], dtype=float)
    lp.col_upper_ = np.array([highspy.kHighsInf if hi is None else hi for _, hi in bounds], dtype=float)
    lp.row_lower_, lp.row_upper_ = np.concatenate(lower), np.concatenate(upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = m.indptr, m.indices, m.data
    scaled = np.asarray(sp.csr_matrix(a).todense()) / capacity[:, None]
    q = np.zeros((n, n))
    npth = scaled.shape[1]
    q[:npth, :npth] = 2.0 * lam * scaled.T @ scaled  # 1/2 z'Qz = lam |A x / c|^2
    tri = sp.csc_matrix(np.tril(q))
    hess = highspy.HighsHessian()
    hess.dim_, hess.format_ = n, highspy.HessianFormat.kTriangular
    hess.start_, hess.index_, hess.value_ = tri.indptr, tri.indices, tri.data
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    assert h.passModel(lp) == highspy.HighsStatus.kOk
    assert h.passHessian(hess) == highspy.HighsStatus.kOk
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    value = h.getInfo().objective_function_value
    x = np.array(h.getSolution().col_value[:npth])
    return (value if objective == Objective.MIN_MLU else -value), x


# -- closed forms ---------------------------------------------------------------------------------------------

TWO_DISJOINT = incidence(2, [[0], [1]]), np.array([0, 0]), np.array([3.0, 5.0])


@pytest.mark.parametrize("d", [2.0, 8.0, 12.0])
def test_max_flow_two_disjoint_paths_serves_min_of_demand_and_capacity(d):
    te = TeProblem(*TWO_DISJOINT, Objective.MAX_FLOW)
    x = te.solve(np.array([d]))
    assert x.sum() == pytest.approx(min(d, 8.0), abs=1e-9)
    assert te.primary(np.array([d]), x) == pytest.approx(min(d, 8.0) / d)


@pytest.mark.parametrize("d", [2.0, 8.0, 12.0])
def test_min_mlu_splits_in_proportion_to_capacity(d):
    te = TeProblem(*TWO_DISJOINT, "min-mlu")
    x = te.solve(np.array([d]))
    np.testing.assert_allclose(x, d * np.array([3.0, 5.0]) / 8.0, atol=1e-9)
    assert te.primary(np.array([d]), x) == pytest.approx(d / 8.0)  # may exceed 1


@pytest.mark.parametrize(("d", "t"), [((4.0, 8.0), 0.5), ((1.0, 2.0), 1.0), ((0.0, 12.0), 0.5)])
def test_max_concurrent_two_demands_sharing_a_link(d, t):
    # demand 0 on links {0, 2}, demand 1 on {1, 2}; link 2 (capacity 6) is the bottleneck
    te = TeProblem(incidence(3, [[0, 2], [1, 2]]), np.array([0, 1]), np.array([100.0, 100.0, 6.0]),
                   Objective.MAX_CONCURRENT)
    d = np.array(d)
    x = te.solve(d)
    np.testing.assert_allclose(x, t * d, atol=1e-9)
    assert te.primary(d, x) == pytest.approx(t)


def test_regularized_concurrent_splits_evenly_over_equal_paths():
    # t = 1 stays optimal while 1 - lam * d(sum u^2)/dt = 1 - 0.16 lam > 0
    a, pd, c = incidence(2, [[0], [1]]), np.array([0, 0]), np.array([10.0, 10.0])
    lp = TeProblem(a, pd, c, Objective.MAX_CONCURRENT).solve(np.array([4.0]))
    assert lp.sum() == pytest.approx(4.0)  # any split is LP-optimal
    for solver in ("clarabel", "osqp"):
        x = TeProblem(a, pd, c, Objective.MAX_CONCURRENT, lam=0.1, solver=solver).solve(np.array([4.0]))
        np.testing.assert_allclose(x, [2.0, 2.0], atol=1e-5)


@pytest.mark.parametrize(("lam", "expected"), [(1.0, 5.0), (0.25, 10.0), (0.01, 10.0)])
def test_regularized_max_flow_on_one_link_closed_form(lam, expected):
    # maximise x/d - lam (x/c)^2 over 0 <= x <= min(d, c):  x* = min(d, c, c^2 / (2 lam d))
    te = TeProblem(incidence(1, [[0]]), np.array([0]), np.array([10.0]), Objective.MAX_FLOW, lam=lam)
    x = te.solve(np.array([10.0]))
    assert x[0] == pytest.approx(expected, abs=1e-5)
    assert te.objective_value(np.array([10.0]), x) == pytest.approx(expected / 10 - lam * (expected / 10) ** 2)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_zero_demand_returns_zeros(objective, lam):
    a, pd, c, _ = random_instance(0)
    x = TeProblem(a, pd, c, objective, lam).solve(np.zeros(pd.max() + 1))
    assert x.shape == (len(pd),) and not x.any()


def test_helpers():
    a = incidence(2, [[0, 1], [1]])
    x = np.array([1.0, 2.0])
    np.testing.assert_allclose(link_loads(a, x), [1.0, 3.0])
    np.testing.assert_allclose(utilization(a, np.array([2.0, 6.0]), x), [0.5, 0.5])


# -- against independent solvers ------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), objective=st.sampled_from(OBJECTIVES))
def test_lp_optimum_matches_scipy_linprog_ipm(seed, objective):
    a, pd, c, d = random_instance(seed)
    te = TeProblem(a, pd, c, objective)
    x = te.solve(d)
    expected = linprog_primary(a, pd, c, d, objective)
    assert te.primary(d, x) == pytest.approx(expected, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("seed", range(5))
def test_qp_optimum_matches_highs_qp_and_osqp(objective, seed):
    a, pd, c, d = random_instance(100 + seed)
    lam = [0.05, 0.3, 2.0][seed % 3]
    value, x_highs = highs_qp(a, pd, c, d, objective, lam)
    clarabel = TeProblem(a, pd, c, objective, lam, solver="clarabel")
    osqp = TeProblem(a, pd, c, objective, lam, solver="osqp")
    x_c, x_o = clarabel.solve(d), osqp.solve(d)
    assert clarabel.objective_value(d, x_c) == pytest.approx(value, rel=1e-5, abs=1e-6)
    assert osqp.objective_value(d, x_o) == pytest.approx(value, rel=1e-4, abs=1e-4)
    # u is unique at the QP optimum (strictly convex in u, primary fixed by the optimum)
    np.testing.assert_allclose(clarabel.utilization(x_c), clarabel.utilization(x_highs), atol=1e-4)
    np.testing.assert_allclose(osqp.utilization(x_o), clarabel.utilization(x_c), atol=1e-3)


# -- brute force ----------------------------------------------------------------------------------------------

def grid_max(f, lo, hi, n=201, rounds=10):
    """Maximise a concave ``f(p, q)`` (``-inf`` off its convex domain) on a box by zooming grid search."""
    lo, hi = np.array(lo, float), np.array(hi, float)
    box_lo, box_hi = lo.copy(), hi.copy()
    for _ in range(rounds):
        p, q = np.meshgrid(np.linspace(lo[0], hi[0], n), np.linspace(lo[1], hi[1], n), indexing="ij")
        v = f(p, q)
        i = np.unravel_index(np.argmax(v), v.shape)
        best = np.array([p[i], q[i]])
        step = (hi - lo) / (n - 1)
        lo, hi = np.maximum(best - 3 * step, box_lo), np.minimum(best + 3 * step, box_hi)
    return float(v[i]), best


# path 0 on links {0, 2}, path 1 on links {1, 2}: both share link 2
SHARED = incidence(3, [[0, 2], [1, 2]]), np.array([0, 0]), np.array([4.0, 6.0, 8.0])


def shared_r(x0, x1):
    return (x0 / 4) ** 2 + (x1 / 6) ** 2 + ((x0 + x1) / 8) ** 2


@pytest.mark.parametrize("lam", [0.05, 1.0])
@pytest.mark.parametrize("d", [5.0, 10.0])
def test_regularized_max_flow_matches_grid_search(lam, d):
    def f(x0, x1):
        v = (x0 + x1) / d - lam * shared_r(x0, x1)
        return np.where((x0 + x1 <= d) & (x0 <= 4) & (x1 <= 6) & (x0 + x1 <= 8), v, -np.inf)

    best, arg = grid_max(f, [0, 0], [4, 6])
    te = TeProblem(*SHARED, Objective.MAX_FLOW, lam=lam)
    x = te.solve(np.array([d]))
    assert te.objective_value(np.array([d]), x) == pytest.approx(best, abs=1e-7)
    np.testing.assert_allclose(x, arg, atol=1e-3)


@pytest.mark.parametrize("lam", [0.05, 1.0])
def test_regularized_max_concurrent_matches_grid_search(lam):
    d = 6.0

    def f(t, s):
        x0, x1 = s * t * d, (1 - s) * t * d
        v = t - lam * shared_r(x0, x1)
        return np.where((x0 <= 4) & (x1 <= 6) & (x0 + x1 <= 8), v, -np.inf)

    best, (t, s) = grid_max(f, [0, 0], [1, 1])
    te = TeProblem(*SHARED, Objective.MAX_CONCURRENT, lam=lam)
    x = te.solve(np.array([d]))
    assert te.objective_value(np.array([d]), x) == pytest.approx(best, abs=1e-7)
    np.testing.assert_allclose(x, [s * t * d, (1 - s) * t * d], atol=1e-3)


@pytest.mark.parametrize("lam", [0.0, 0.05, 1.0])
def test_min_mlu_matches_grid_search(lam):
    d = 12.0  # U > 1: link 2 carries everything

    def f(s, _):
        x0, x1 = s * d, (1 - s) * d
        u = np.stack([x0 / 4, x1 / 6, (x0 + x1) / 8])
        return -(u.max(axis=0) + lam * (u**2).sum(axis=0))

    best, (s, _) = grid_max(f, [0, 0], [1, 1])
    te = TeProblem(*SHARED, Objective.MIN_MLU, lam=lam)
    x = te.solve(np.array([d]))
    assert te.objective_value(np.array([d]), x) == pytest.approx(-best, abs=1e-7)
    assert te.primary(np.array([d]), x) == pytest.approx(1.5)
    if lam > 0:  # the LP's split is not unique (link 2 sets U whatever the split)
        np.testing.assert_allclose(x, [s * d, (1 - s) * d], atol=1e-3)


# -- invariants -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("lam", [0.0, 0.3])
@pytest.mark.parametrize("seed", range(4))
def test_returned_flows_are_feasible(objective, lam, seed):
    a, pd, c, d = random_instance(200 + seed)
    d[0] = 0.0  # a demand with nothing to send
    te = TeProblem(a, pd, c, objective, lam)
    x = te.solve(d)
    per_demand = np.bincount(pd, weights=x, minlength=len(d))
    load = link_loads(a, x)
    assert x.min() >= 0
    tol = 1e-6
    if objective == Objective.MIN_MLU:
        mlu = te.primary(d, x)
        assert np.all(load <= mlu * c * (1 + tol) + tol)
        np.testing.assert_allclose(per_demand, d, rtol=tol, atol=tol)
    else:
        assert np.all(load <= c * (1 + tol) + tol)
        if objective == Objective.MAX_FLOW:
            assert np.all(per_demand <= d * (1 + tol) + tol)
        else:
            t = te.primary(d, x)
            assert -tol <= t <= 1 + tol
            np.testing.assert_allclose(per_demand, t * d, rtol=tol, atol=tol)


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("seed", range(4))
def test_regularization_spreads_load_at_bounded_cost(objective, seed):
    # From optimality of both: lam R_qp <= lam R_lp + (F_qp - F_lp) and F_lp >= F_qp (max; mirrored for MLU), so
    # R_qp <= R_lp and the primary loses at most lam (R_lp - R_qp).
    a, pd, c, d = random_instance(300 + seed)
    d *= 2.0  # congested
    lam = 0.2
    lp, qp = TeProblem(a, pd, c, objective), TeProblem(a, pd, c, objective, lam)
    x_lp, x_qp = lp.solve(d), qp.solve(d)
    r_lp, r_qp = reg(lp, x_lp), reg(qp, x_qp)
    f_lp, f_qp = lp.primary(d, x_lp), qp.primary(d, x_qp)
    assert r_qp <= r_lp + 1e-6
    loss = f_qp - f_lp if objective == Objective.MIN_MLU else f_lp - f_qp
    assert -1e-6 <= loss <= lam * (r_lp - r_qp) + 1e-6


def test_regularization_strictly_spreads_on_equal_paths():
    # two equal paths, demand fits on either: the LP (max-flow) may stack it, the QP must halve it
    a, pd, c = incidence(2, [[0], [1]]), np.array([0, 0]), np.array([10.0, 10.0])
    d = np.array([6.0])
    qp = TeProblem(a, pd, c, Objective.MAX_FLOW, lam=0.01)
    x = qp.solve(d)
    np.testing.assert_allclose(x, [3.0, 3.0], atol=1e-5)
    assert reg(qp, x) == pytest.approx(0.18, abs=1e-6)  # vs 0.36 with all on one path


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("lam", [0.0, 0.2])
def test_repeated_solves_match_fresh_problems(objective, lam):
    a, pd, c, d0 = random_instance(400)
    rng = np.random.default_rng(1)
    demands = [d0, rng.uniform(0, 20, len(d0)), np.zeros(len(d0)), np.where(rng.random(len(d0)) < 0.5, 0.0, d0),
               d0 * 3, d0]
    reused = TeProblem(a, pd, c, objective, lam)
    for d in demands:
        x = reused.solve(d)
        fresh = TeProblem(a, pd, c, objective, lam)
        y = fresh.solve(d)
        assert reused.objective_value(d, x) == pytest.approx(fresh.objective_value(d, y), rel=1e-6, abs=1e-7)
        if lam > 0:
            np.testing.assert_allclose(reused.utilization(x), fresh.utilization(y), atol=1e-5)


def test_lambda_scale_free_in_demand_units():
    # Gbps vs Mbps: scaling demand and capacity together leaves the regularized optimum's u unchanged
    a, pd, c, d = random_instance(500)
    for objective in OBJECTIVES:
        x1 = TeProblem(a, pd, c, objective, 0.3).solve(d)
        x2 = TeProblem(a, pd, 1000 * c, objective, 0.3).solve(1000 * d)
        np.testing.assert_allclose(utilization(a, c, x1), utilization(a, 1000 * c, x2), atol=1e-5)


# -- errors -----------------------------------------------------------------------------------------------------

def test_objective_parse():
    assert Objective.parse("max_concurrent") is Objective.MAX_CONCURRENT
    assert Objective.parse(" MIN-MLU ") is Objective.MIN_MLU
    with pytest.raises(ScenarioError) as err:
        Objective.parse("maxflow")
    assert err.value.field == "--objective" and "max-flow" in err.value.fix and "min-mlu" in err.value.fix


def test_bad_arguments_name_their_field():
    a, pd, c = TWO_DISJOINT
    with pytest.raises(ScenarioError) as err:
        TeProblem(a, pd, c, lam=-0.1)
    assert err.value.field == "--lambda" and err.value.fix == "use lambda >= 0"
    with pytest.raises(ScenarioError) as err:
        TeProblem(a, pd, c, lam=0.1, solver="gurobi")
    assert err.value.field == "--solver"
    with pytest.raises(ScenarioError) as err:
        TeProblem(a, np.array([0, 2]), c)  # demand 1 has no path
    assert err.value.field == "path_demand"
    with pytest.raises(ScenarioError) as err:
        TeProblem(a, pd, np.array([3.0, 0.0]))
    assert err.value.field == "capacity"
    te = TeProblem(a, pd, c)
    for bad in (np.array([1.0, 2.0]), np.array([-1.0]), np.array([np.nan])):
        with pytest.raises(ScenarioError) as err:
            te.solve(bad)
        assert err.value.field == "demand"
