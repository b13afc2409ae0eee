"""The regularized TE problem (``lam > 0``) handed to Clarabel or OSQP as sparse arrays, without a modelling layer.

cvxpy compiled this QP once with the demand as a parameter, but its compiler holds the objective's parameter
coefficients as a dense (variables x parameters) array: paths x demands, 12.3 GiB on TATA's 143 nodes and
23.6 GiB on a 200-node ring. Here every matrix stays sparse (``O(nnz(A) + D)``), and only the demand-dependent
entries change between solves. The data are laid out exactly as cvxpy 1.x laid them out (the same variable
order, rows, cones and solver calls, warm starts included), so the solvers see the same numbers and return the
same answers, bit for bit, as before (``tests/te/test_qp.py`` compares them with cvxpy's own data).

Variables: ``[x, w]`` (max-flow), ``[t, w, x]`` (max-concurrent), ``[U, w, x]`` (min-MLU), where ``w = S x``
(``S = diag(1/c) A``) are the link utilizations whose squares the regularizer sums. Rows: the equalities first
(Clarabel's zero cone), then the inequalities ``G z <= h`` (the nonnegative cone).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from lightrail.errors import InfeasibleError

__all__ = ["RegularizedQp"]

_OSQP_OK = (1, 2)  # OSQP 1.x status_val: solved, solved inaccurate (what cvxpy accepted)
_CLARABEL_OK = ("Solved", "AlmostSolved")


def _eye(n: int, value: float = 1.0) -> sp.csr_matrix:
    return sp.csr_matrix(sp.identity(n, format="csr") * value)


def _zeros(rows: int, cols: int) -> sp.csr_matrix:
    return sp.csr_matrix((rows, cols))


class RegularizedQp:
    """``objective - lam sum_e w_e^2`` (or ``U + lam sum_e w_e^2``) over path flows, for one network.

    ``scaled`` is ``S`` (L x P), ``demand_paths`` ``B`` (D x P, 1 where path p serves demand k); ``objective`` a
    :class:`~lightrail.te.formulations.Objective` value; ``solver`` ``clarabel`` or ``osqp``."""

    def __init__(self, scaled: sp.csr_matrix, demand_paths: sp.csr_matrix, objective: str, lam: float,
                 solver: str, osqp_options: dict | None = None):
        self.objective, self.lam, self.solver = str(objective), float(lam), solver
        self.osqp_options = dict(osqp_options or {})
        s, b = sp.csr_matrix(scaled), sp.csr_matrix(demand_paths)
        nl, npth = s.shape
        nd = b.shape[0]
        self.n_links, self.n_paths, self.n_demands = nl, npth, nd
        lam2 = 2.0 * self.lam  # the solvers minimise 1/2 z'Pz: P = 2 lam on w
        if self.objective == "max-flow":
            n = npth + nl
            self._x = slice(0, npth)
            eq = sp.hstack([s, _eye(nl, -1.0)])
            ineq = sp.vstack([sp.hstack([_eye(npth, -1.0), _zeros(npth, nl)]), sp.hstack([s, _zeros(nl, nl)]),
                              sp.hstack([b, _zeros(nd, nl)])])
            self._h = np.concatenate([np.zeros(npth), np.ones(nl), np.zeros(nd)])
            self._h_demand = slice(npth + nl, npth + nl + nd)
            self._b_eq = np.zeros(nl)
            self._q = np.zeros(n)
            self._p_first = npth
        else:
            n = 1 + nl + npth
            self._x = slice(1 + nl, n)
            head = sp.hstack([_zeros(nl, 1), _eye(nl, -1.0), s])
            one = sp.csr_matrix(np.ones((1, 1)))
            if self.objective == "max-concurrent":
                # d t - B x = 0: the t column holds d, set per solve (a column of ones here fixes the pattern)
                eq = sp.vstack([head, sp.hstack([sp.csr_matrix(np.ones((nd, 1))), _zeros(nd, nl), -b])])
                ineq = sp.vstack([sp.hstack([_zeros(npth, 1 + nl), _eye(npth, -1.0)]),
                                  sp.hstack([_zeros(nl, 1 + nl), s]),
                                  sp.hstack([-one, _zeros(1, nl + npth)]), sp.hstack([one, _zeros(1, nl + npth)])])
                self._h = np.concatenate([np.zeros(npth), np.ones(nl), [0.0, 1.0]])
                self._b_eq = np.zeros(nl + nd)
            else:  # min-mlu: B x = d; U >= 0, x >= 0, S x - U <= 0
                eq = sp.vstack([head, sp.hstack([_zeros(nd, 1 + nl), b])])
                ineq = sp.vstack([sp.hstack([-one, _zeros(1, nl + npth)]),
                                  sp.hstack([_zeros(npth, 1 + nl), _eye(npth, -1.0)]),
                                  sp.hstack([sp.csr_matrix(-np.ones((nl, 1))), _zeros(nl, nl), s])])
                self._h = np.zeros(1 + npth + nl)
                self._b_eq = np.zeros(nl + nd)
            self._q = np.zeros(n)
            self._q[0] = -1.0 if self.objective == "max-concurrent" else 1.0
            self._p_first = 1
        self.n_vars = n
        diag = np.zeros(n)
        diag[self._p_first:self._p_first + nl] = lam2
        self._p = sp.csc_matrix((diag[self._p_first:self._p_first + nl],
                                 (np.arange(self._p_first, self._p_first + nl), np.arange(self._p_first,
                                                                                           self._p_first + nl))),
                                shape=(n, n))
        self._eq = sp.csc_matrix(eq)
        self._ineq = sp.csc_matrix(ineq)
        self._eq.sort_indices()
        self._ineq.sort_indices()
        self._a = sp.csc_matrix(sp.vstack([self._eq, self._ineq]))  # Clarabel's and OSQP's A: [eq; ineq]
        self._a.sort_indices()
        if self.objective == "max-concurrent":
            # where the t column's d entries sit in A's data: column 0's first D entries (rows L..L+D)
            self._t_entries = np.arange(self._a.indptr[0], self._a.indptr[0] + nd)
        self._cache = None  # the solver object kept between solves, as cvxpy's solver cache kept it
        self._last = None

    # -- the demand-dependent data -------------------------------------------------------------------------

    def data(self, d: np.ndarray, total: float) -> tuple[np.ndarray, np.ndarray, sp.csc_matrix, np.ndarray]:
        """``q, b_eq, A, h`` for demand ``d`` (``A = [eq; ineq]``, the equality rows first)."""
        q, b_eq, h, a = self._q.copy(), self._b_eq.copy(), self._h.copy(), self._a
        if self.objective == "max-flow":
            q[self._x] = -(1.0 / total)
            h[self._h_demand] = d
        elif self.objective == "max-concurrent":
            a = a.copy()
            # as cvxpy wrote them: its conic path computes -(-d + 0), so a zero demand is -0.0 for Clarabel
            a.data[self._t_entries] = np.where(d == 0, -0.0, d) if self.solver == "clarabel" else d
        else:
            b_eq[self.n_links:] = d
        return q, b_eq, a, h

    def solve(self, d: np.ndarray, total: float) -> np.ndarray:
        """Path flows ``x`` (P,) for demand ``d`` (D,) whose sum is ``total`` > 0."""
        q, b_eq, a, h = self.data(d, total)
        z = self._clarabel(q, b_eq, a, h) if self.solver == "clarabel" else self._osqp(q, b_eq, a, h)
        return np.asarray(z[self._x], dtype=float)

    # -- the solvers, called as cvxpy called them (warm start and cache included) ---------------------------

    def _fail(self, status) -> InfeasibleError:
        return InfeasibleError(f"{self.solver} did not solve the {self.objective} TE QP (status: {status})",
                               field="demand", fix="try --solver clarabel, or check the demand for extreme values")

    def _clarabel(self, q, b_eq, a, h) -> np.ndarray:
        import clarabel

        p = sp.triu(self._p).tocsc()
        b = np.concatenate([b_eq, h])
        cones = [clarabel.ZeroConeT(len(b_eq)), clarabel.NonnegativeConeT(len(h))]
        solver = None
        if self._cache is not None and self._cache.is_data_update_allowed():
            settings = self._cache.get_settings()
            settings.verbose = False
            try:
                self._cache.update(P=p, q=q, A=a, b=b, settings=settings)
                solver = self._cache
            except Exception:  # noqa: BLE001 -- a changed pattern needs a new solver, as in cvxpy
                solver = None
        if solver is None:
            settings = clarabel.DefaultSettings()
            settings.verbose = False
            solver = clarabel.DefaultSolver(p, q, a, b, cones, settings)
        result = solver.solve()
        self._cache = solver
        if str(result.status) not in _CLARABEL_OK or result.x is None:
            raise self._fail(result.status)
        return np.asarray(result.x)

    def _osqp(self, q, b_eq, a, h) -> np.ndarray:
        import osqp

        rhs = np.where(b_eq == 0, -0.0, b_eq)  # cvxpy's QP path negates -(b): a zero right-hand side is -0.0
        upper = np.concatenate([rhs, h])
        lower = np.concatenate([rhs, np.full(len(h), -np.inf)])
        options = {"eps_abs": 1e-5, "eps_rel": 1e-5, "max_iter": 10_000, **self.osqp_options}
        if self._cache is None:
            options.setdefault("polishing", True)
            solver = osqp.OSQP()
            try:
                solver.setup(sp.csc_matrix(self._p), q, a, lower, upper, verbose=False, **options)
            except Exception as e:  # noqa: BLE001 -- OSQP's own error, as one line
                raise self._fail(e) from None
        else:
            solver, (old_q, old_l, old_u, old_a), last = self._cache
            changed = {key: new for key, new, old in (("q", q, old_q), ("l", lower, old_l), ("u", upper, old_u))
                       if np.any(new != old)}
            factorizing = False
            if a.data.shape != old_a.shape or np.any(a.data != old_a):
                changed["Ax"] = a.data
                factorizing = True
            if changed:
                solver.update(**changed)
            if last.info.status_val == 1:
                solver.warm_start(last.x, last.y)
            options.setdefault("polishing", factorizing)
            solver.update_settings(verbose=False, **options)
        result = solver.solve(raise_error=False)
        self._cache = (solver, (q, lower, upper, a.data.copy()), result)
        if result.info.status_val not in _OSQP_OK or result.x is None:
            raise self._fail(result.info.status)
        return np.asarray(result.x)
