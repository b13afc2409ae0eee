"""The regularized TE QP is built as sparse arrays (``te/qp.py``), no longer through cvxpy, whose compiler held a dense
paths x demands array (12.3 GiB on TATA): the solvers must see the very data cvxpy gave them, and answer the same,
bit for bit, over a controller's sequence of solves (warm starts included). cvxpy is the reference here."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from lightrail.te.formulations import Objective, TeProblem
from lightrail.te.paths import k_shortest_paths
from lightrail.te.qp import RegularizedQp

cp = pytest.importorskip("cvxpy")


class CvxpyReference:
    """The formulation ``TeProblem`` solved through cvxpy before (DPP, the demand a parameter)."""

    def __init__(self, te: TeProblem, solver: str):
        x = cp.Variable(te.n_paths, nonneg=True, name="x")
        d = cp.Parameter(te.n_demands, nonneg=True, name="demand")
        u = te.scaled @ x
        reg = te.lam * cp.sum_squares(u)
        b = te.demand_paths
        self.inv_total = None
        if te.objective == Objective.MAX_FLOW:
            self.inv_total = cp.Parameter(nonneg=True, name="inv_total")
            problem = cp.Problem(cp.Maximize(self.inv_total * cp.sum(x) - reg), [u <= 1, b @ x <= d])
        elif te.objective == Objective.MAX_CONCURRENT:
            t = cp.Variable(name="t")
            problem = cp.Problem(cp.Maximize(t - reg), [u <= 1, b @ x == cp.multiply(d, t), t >= 0, t <= 1])
        else:
            mlu = cp.Variable(nonneg=True, name="U")
            problem = cp.Problem(cp.Minimize(mlu + reg), [u <= mlu, b @ x == d])
        self.problem, self.x, self.d = problem, x, d
        self.kwargs = {"solver": solver.upper(), "warm_start": True}
        if solver == "osqp":
            self.kwargs.update(eps_abs=1e-8, eps_rel=1e-8, max_iter=200_000, polishing=True)

    def solve(self, demand: np.ndarray) -> np.ndarray:
        self.d.value = demand
        if self.inv_total is not None:
            self.inv_total.value = 1.0 / float(demand.sum())
        self.problem.solve(**self.kwargs)
        if self.problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
            raise RuntimeError(self.problem.status)
        return np.maximum(np.asarray(self.x.value, dtype=float), 0.0)

    def data(self, solver: str) -> dict:
        return self.problem.get_problem_data(solver.upper())[0]


def _small_wan():
    from lightrail.te.inputs import load_topology

    return load_topology("abilene")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_sparse(a, b) -> bool:
    a, b = sp.csc_matrix(a), sp.csc_matrix(b)
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and _same_bits(a.data, b.data))


@pytest.mark.parametrize("objective", list(Objective))
@pytest.mark.parametrize("solver", ["clarabel", "osqp"])
def test_the_solvers_get_cvxpys_data_bit_for_bit(objective, solver):
    """P, q, A and the right-hand sides, structure and signs of zero included, with zero demands among them."""
    rng = np.random.default_rng(7)
    links, paths, demands = 9, 16, 6
    a = sp.csr_matrix((rng.random((links, paths)) < 0.4).astype(float))
    pd = np.sort(np.concatenate([np.arange(demands), rng.integers(0, demands, paths - demands)]))
    te = TeProblem(a, pd, rng.uniform(1, 5, links), objective, 0.01, solver=solver)
    ref = CvxpyReference(te, solver)
    qp = RegularizedQp(te.scaled, te.demand_paths, objective.value, 0.01, solver)
    for d in (rng.uniform(0, 3, demands), np.where(rng.random(demands) < 0.5, 0.0, 2.0)):
        ref.d.value = d
        if ref.inv_total is not None:
            ref.inv_total.value = 1.0 / float(d.sum())
        q, b_eq, a_all, h = qp.data(d, float(d.sum()))
        data = ref.data(solver)
        if solver == "clarabel":
            assert _same_sparse(data["P"], qp._p) and _same_bits(data["c"], q)
            assert _same_sparse(data["A"], a_all) and _same_bits(data["b"], np.concatenate([b_eq, h]))
        else:
            assert _same_sparse(sp.vstack([data["A"], data["F"]]), a_all) and _same_bits(data["q"], q)
            assert _same_bits(data["b"], np.where(b_eq == 0, -0.0, b_eq)) and _same_bits(data["G"], h)


@pytest.mark.parametrize("objective", list(Objective))
@pytest.mark.parametrize("solver", ["clarabel", "osqp"])
def test_a_controllers_solves_are_cvxpys_bit_for_bit(objective, solver):
    """One controller's views in turn: Abilene (11 nodes, 110 demands, 4 paths each) for Clarabel; a tiny
    instance for OSQP, slow at its 1e-8 tolerances (its warm starts and matrix updates are what is checked)."""
    rng = np.random.default_rng(1)
    if solver == "clarabel":
        wan = _small_wan()
        paths = k_shortest_paths(wan, 4)
        a, pd, c = paths.incidence, paths.path_demand, wan.capacity
    else:
        links, n_paths, demands = 9, 16, 6
        a = sp.csr_matrix((rng.random((links, n_paths)) < 0.4).astype(float))
        pd = np.sort(np.concatenate([np.arange(demands), rng.integers(0, demands, n_paths - demands)]))
        c = rng.uniform(1, 5, links)
    te = TeProblem(a, pd, c, objective, 0.001, solver=solver)
    ref = CvxpyReference(te, solver)
    base = rng.uniform(0.5, 8.0, te.n_demands)
    compared = 0
    for view in range(4):
        d = base * (1 + 0.05 * rng.uniform(-1, 1, te.n_demands))
        if view == 2:
            d[:2] = 0.0
        mine, theirs = _outcome(te.solve, d), _outcome(ref.solve, d)
        if isinstance(theirs, str):  # a solver that gives up must give up on both
            assert isinstance(mine, str), (mine, theirs)
            continue
        assert _same_bits(mine, theirs), (objective, solver, view)
        compared += 1
    assert compared >= 3
def _outcome(solve, d):
    """The flows, or the status text if the solver gave up (cvxpy: no value; ours: an InfeasibleError)."""
    try:
        x = solve(d)
    except Exception as e:  # noqa: BLE001
        return str(e)
    return x


def test_the_qp_holds_no_dense_paths_by_demands_array():
    """The data grow with the incidence's nonzeros, not with paths x demands (TATA: 81k x 20k before)."""
    n_paths, n_demands, n_links = 40_000, 10_000, 300
    rng = np.random.default_rng(0)
    a = sp.csr_matrix((np.ones(3 * n_paths), (rng.integers(0, n_links, 3 * n_paths), np.repeat(np.arange(n_paths), 3))),
                      shape=(n_links, n_paths))
    pd = np.repeat(np.arange(n_demands), n_paths // n_demands)
    te = TeProblem(a, pd, np.full(n_links, 100.0), "max-flow", 0.001)
    held = [te.scaled, te.demand_paths, te._qp._a, te._qp._p]
    assert all(sp.issparse(m) for m in held)
    assert sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in held) < 20 * 2**20  # dense: 3.2 GB


def test_tatas_te_matrices_are_sparse():
    """TATA (143 nodes, shipped): one shortest path per demand (scipy's csgraph, in milliseconds, where Yen's 4
    paths take ~40 s), the regularized problem built and its data made for a demand (what the solver is handed;
    solving it takes seconds, the tests above check the answers): every matrix sparse, the peak a few MB where
    cvxpy asked for a dense 20,306 x 20,306 array (3.3 GB; 12.3 GiB at 4 paths)."""
    import tracemalloc

    from scipy.sparse.csgraph import shortest_path

    from lightrail.te.inputs import load_topology

    wan = load_topology("tatanld")
    graph = sp.csr_matrix((wan.weights(), (wan.src, wan.dst)), shape=(wan.n, wan.n))
    _, pred = shortest_path(graph, directed=True, return_predecessors=True)
    link_of = {(a, b): i for i, (a, b) in enumerate(zip(wan.src.tolist(), wan.dst.tolist(), strict=True))}
    rows, cols, pairs = [], [], []
    for s in range(wan.n):
        for t in range(wan.n):
            if s == t:
                continue
            p, node = len(pairs), t
            while node != s:
                rows.append(link_of[int(pred[s, node]), node])
                cols.append(p)
                node = int(pred[s, node])
            pairs.append((s, t))
    incidence = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(wan.links, len(pairs)))
    demand = np.random.default_rng(0).uniform(0.01, 0.1, len(pairs))
    tracemalloc.start()
    te = TeProblem(incidence, np.arange(len(pairs)), wan.capacity, "max-flow", 0.001)
    q, b_eq, a, h = te._qp.data(demand, float(demand.sum()))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert te.n_demands == 143 * 142 and q.shape == (te.n_paths + te.n_links,) and sp.issparse(a)
    assert all(sp.issparse(m) for m in (te.incidence, te.scaled, te.demand_paths, te._qp._a, te._qp._p))
    assert peak < 64 * 2**20, peak  # dense: 20,306^2 x 8 B = 3.3 GB
