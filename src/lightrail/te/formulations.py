"""Path-based WAN traffic engineering: max-flow, max-concurrent-flow and min-MLU, optionally regularized.

Every slice controller in Symphony (arXiv 2510.11937) solves the whole network's TE over fixed tunnels (a path
formulation: variable ``x_p`` is the rate on path ``p``). The three objectives are the standard ones of the
SWAN / B4-style TE literature:

``max-flow``        maximise ``sum_p x_p / sum_k d_k``   s.t. ``sum_{p in k} x_p <= d_k``, ``A x <= c``
``max-concurrent``  maximise ``t in [0, 1]``             s.t. ``sum_{p in k} x_p = t d_k``, ``A x <= c``
``min-mlu``         minimise ``U >= 0``                  s.t. ``sum_{p in k} x_p = d_k``, ``A x <= U c``

with ``A`` the link-by-path incidence, ``c`` the link capacities and ``d`` the demands. An LP has many optimal
splits, so two controllers with slightly different demand views can pick very different ones. Symphony's fix is
the quadratic regularizer ``lam * sum_e u_e^2`` on the link utilizations ``u_e = (A x)_e / c_e``: it is subtracted
from the maximisations and added to min-MLU, which makes the link utilizations unique and Lipschitz in the demand.

Each primary term is dimensionless (the fraction of the total demand served, ``t``, or ``U``) and so is ``u``, so
one ``lam`` means the same trade-off on any network and at any traffic scale.

``lam == 0`` solves an LP with HiGHS (through highspy, from sparse arrays); ``lam > 0`` solves a QP with Clarabel or
OSQP, its sparse data built once and only the demand's entries changed per solve (``te/qp.py``; cvxpy, used before,
held a dense paths x demands array while compiling it: 12.3 GiB on TATA).
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum

import highspy
import numpy as np
import scipy.sparse as sp

from lightrail.errors import InfeasibleError, ScenarioError

__all__ = ["Objective", "TeProblem", "QP_SOLVERS", "link_loads", "utilization"]

QP_SOLVERS = ("clarabel", "osqp")
"""Solvers accepted for the regularized (``lam > 0``) problem."""

_INF = highspy.kHighsInf
_bannered = False


def _quiet_highs() -> highspy.Highs:
    """A Highs with output off. The process's first Highs prints a banner from C++ on file descriptor 1
    whatever the options, which would corrupt ``--json`` output: that one is built with fd 1 on /dev/null."""
    global _bannered
    if _bannered:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)
        _bannered = True
    h.setOptionValue("output_flag", False)
    return h


class Objective(StrEnum):
    """Which TE problem a controller solves (see the module docstring for the formulations)."""

    MAX_FLOW = "max-flow"
    """Maximise the fraction of total demand served; demands may be partly served."""
    MAX_CONCURRENT = "max-concurrent"
    """Maximise the common fraction ``t`` of every demand that is served."""
    MIN_MLU = "min-mlu"
    """Route every demand in full and minimise the maximum link utilization (may exceed 1)."""

    @classmethod
    def parse(cls, text: str | Objective, *, field: str = "--objective") -> Objective:
        """An objective by name (``max_flow`` and upper case are read too); a ScenarioError naming ``field`` else.

        >>> Objective.parse("MIN_MLU"), str(Objective.parse("max-flow"))
        (<Objective.MIN_MLU: 'min-mlu'>, 'max-flow')
        """
        if isinstance(text, Objective):
            return text
        try:
            return cls(str(text).strip().lower().replace("_", "-"))
        except ValueError:
            raise ScenarioError(f"unknown TE objective {text!r}", field=field,
                                fix="one of: " + ", ".join(o.value for o in cls)) from None


def link_loads(incidence: sp.spmatrix | np.ndarray, x: np.ndarray) -> np.ndarray:
    """The load ``A x`` on every link (Gbps) of path flows ``x``."""
    return np.asarray(incidence @ np.asarray(x, dtype=float), dtype=float).ravel()


def utilization(incidence: sp.spmatrix | np.ndarray, capacity: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The utilization ``(A x) / c`` of every link: what the regularizer and the MLU measure."""
    return link_loads(incidence, x) / np.asarray(capacity, dtype=float)


class TeProblem:
    """One network's TE, compiled once, solved for many demand vectors (a controller's views over time).

    Parameters
    ----------
    incidence : (L links, P paths) 0/1 matrix, 1 where path ``p`` uses directed link ``l``.
    path_demand : (P,) the demand index of every path, ``0..D-1``; every demand needs at least one path.
    capacity : (L,) link capacities (Gbps), all > 0.
    objective : an :class:`Objective` or its name.
    lam : weight of ``sum_e u_e^2`` (dimensionless, >= 0); 0 solves the plain LP.
    solver : solver of the regularized problem, ``clarabel`` or ``osqp`` (the LP always uses HiGHS).

    >>> import scipy.sparse as sp
    >>> te = TeProblem(sp.csr_matrix(np.eye(2)), np.array([0, 0]), np.array([3.0, 1.0]), "min-mlu")
    >>> te.solve(np.array([2.0])).round(6).tolist()
    [1.5, 0.5]
    """

    def __init__(self, incidence: sp.spmatrix | np.ndarray, path_demand: np.ndarray, capacity: np.ndarray,
                 objective: Objective | str = Objective.MAX_FLOW, lam: float = 0.0, solver: str = "clarabel"):
        self.objective = Objective.parse(objective, field="objective")
        lam = float(lam)
        if not np.isfinite(lam) or lam < 0:
            raise ScenarioError(f"regularization weight must be a finite number >= 0, got {lam!r}",
                                field="--lambda", fix="use lambda >= 0")
        self.lam = lam
        solver = str(solver).strip().lower()
        if solver not in QP_SOLVERS:
            raise ScenarioError(f"unknown QP solver {solver!r}", field="--solver",
                                fix="one of: " + ", ".join(QP_SOLVERS))
        self.solver = solver

        a = sp.csr_matrix(incidence, dtype=float)
        a.sum_duplicates()
        a.eliminate_zeros()
        n_links, n_paths = a.shape
        cap = np.asarray(capacity, dtype=float).ravel()
        if cap.shape != (n_links,) or not np.all(np.isfinite(cap)) or np.any(cap <= 0):
            raise ScenarioError(f"capacity needs {n_links} finite values > 0 (one per link), got shape {cap.shape}",
                                field="capacity", fix="give every link a positive capacity in Gbps")
        pd = np.asarray(path_demand).ravel()
        if pd.shape != (n_paths,) or (pd.size and (not np.issubdtype(pd.dtype, np.integer) or pd.min() < 0)):
            raise ScenarioError(f"path_demand needs {n_paths} integers >= 0 (one per path), got {pd.shape}",
                                field="path_demand", fix="give every path the index of its demand")
        n_demands = int(pd.max()) + 1 if pd.size else 0
        if n_paths == 0 or np.any(np.bincount(pd, minlength=n_demands) == 0):
            raise ScenarioError("every demand needs at least one path", field="path_demand",
                                fix="drop demands without tunnels or add a path for them")
        self.n_links, self.n_paths, self.n_demands = n_links, n_paths, n_demands
        self.incidence = a
        self.capacity = cap
        self.path_demand = pd.astype(np.int64)
        self.scaled = sp.csr_matrix(sp.diags(1.0 / cap) @ a)  # u = scaled @ x
        self.demand_paths = sp.csr_matrix((np.ones(n_paths), (self.path_demand, np.arange(n_paths))),
                                          shape=(n_demands, n_paths))
        if lam == 0:
            self._build_lp()
        else:
            self._build_qp()

    # -- the LP (lam == 0): HiGHS on [A/c; B] in column-wise form, x plus one column for t or U ---------------

    def _build_lp(self) -> None:
        nl, npth, nd = self.n_links, self.n_paths, self.n_demands
        m = sp.vstack([self.scaled, self.demand_paths]).tocsc()
        extra = self.objective != Objective.MAX_FLOW
        lp = highspy.HighsLp()
        lp.num_col_ = npth + extra
        lp.num_row_ = nl + nd
        lp.sense_ = highspy.ObjSense.kMinimize
        cost = np.zeros(npth + extra)
        lower = np.zeros(npth + extra)
        upper = np.full(npth + extra, _INF)
        row_lower = np.full(nl + nd, -_INF)
        row_upper = np.zeros(nl + nd)
        start, index, value = m.indptr.astype(np.int32), m.indices.astype(np.int32), m.data
        if self.objective == Objective.MAX_FLOW:
            cost[:] = -1.0  # same optimum as -sum(x)/sum(d), better scaled
            row_upper[:nl] = 1.0
        elif self.objective == Objective.MAX_CONCURRENT:
            cost[-1], upper[-1] = -1.0, 1.0
            row_upper[:nl] = 1.0
            row_lower[nl:] = 0.0  # B x - t d = 0; the t column starts empty, its -d is set per solve
            start = np.append(start, start[-1]).astype(np.int32)
        else:
            cost[-1] = 1.0
            row_upper[:nl] = 0.0  # A x / c - U <= 0
            start = np.append(start, start[-1] + nl).astype(np.int32)
            index = np.concatenate([index, np.arange(nl, dtype=np.int32)])
            value = np.concatenate([value, -np.ones(nl)])
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, lower, upper
        lp.row_lower_, lp.row_upper_ = row_lower, row_upper
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = lp.num_col_, lp.num_row_
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = start, index, value
        h = _quiet_highs()
        if h.passModel(lp) != highspy.HighsStatus.kOk:
            raise InfeasibleError(f"HiGHS rejected the {self.objective} TE LP ({nl} links, {npth} paths)",
                                  field="incidence", fix="check incidence, path_demand and capacity for bad values")
        self._highs = h
        self._demand_rows = np.arange(nl, nl + nd, dtype=np.int32)
        self._lp_demand = np.zeros(nd)  # the demand the model in HiGHS holds now

    def _solve_lp(self, d: np.ndarray) -> np.ndarray:
        # Only the demand changes between solves, so update it in place and let HiGHS warm-start from the last
        # basis: 3-5x faster than passing a rebuilt model on a 1,800-path WAN.
        h, rows, nd = self._highs, self._demand_rows, self.n_demands
        if self.objective == Objective.MAX_FLOW:
            h.changeRowsBounds(nd, rows, np.full(nd, -_INF), d)
        elif self.objective == Objective.MIN_MLU:
            h.changeRowsBounds(nd, rows, d, d)
        else:  # the t column holds -d on the demand rows: B x - t d = 0
            col = self.n_paths
            for k in np.flatnonzero(d != self._lp_demand).tolist():
                h.changeCoeff(int(rows[k]), col, float(-d[k]))
        self._lp_demand = d.copy()
        h.run()
        status = h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:  # retry once from scratch before giving up
            h.clearSolver()
            h.run()
            status = h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise InfeasibleError(f"HiGHS did not solve the {self.objective} TE LP to optimality "
                                  f"(status: {h.modelStatusToString(status)})", field="demand",
                                  fix="check the demand and capacity arrays for extreme or non-finite values")
        return np.asarray(h.getSolution().col_value[: self.n_paths], dtype=float)

    # -- the QP (lam > 0): sparse data straight to Clarabel or OSQP (te/qp.py: cvxpy's layout, no dense tensor) --

    def _build_qp(self) -> None:
        from lightrail.te.qp import RegularizedQp

        osqp = {"eps_abs": 1e-8, "eps_rel": 1e-8, "max_iter": 200_000, "polishing": True}
        self._qp = RegularizedQp(self.scaled, self.demand_paths, self.objective.value, self.lam, self.solver,
                                 osqp_options=osqp if self.solver == "osqp" else None)

    def _solve_qp(self, d: np.ndarray, total: float) -> np.ndarray:
        return self._qp.solve(d, total)

    # -- public -------------------------------------------------------------------------------------------------

    def _demand(self, demand: np.ndarray) -> np.ndarray:
        d = np.asarray(demand, dtype=float).ravel()
        if d.shape != (self.n_demands,) or not np.all(np.isfinite(d)) or np.any(d < 0):
            raise ScenarioError(f"demand needs {self.n_demands} finite values >= 0, got shape {d.shape}",
                                field="demand", fix="give one rate in Gbps per demand, in path_demand's order")
        return d

    def solve(self, demand: np.ndarray) -> np.ndarray:
        """Path flows ``x`` (P,), >= 0, optimal for ``demand`` (D,) Gbps; zeros when there is no demand."""
        d = self._demand(demand)
        total = float(d.sum())
        if total == 0:
            return np.zeros(self.n_paths)
        x = self._solve_lp(d) if self.lam == 0 else self._solve_qp(d, total)
        return np.maximum(x, 0.0)

    def utilization(self, x: np.ndarray) -> np.ndarray:
        """Link utilizations ``u = A x / c`` of path flows ``x``."""
        return np.asarray(self.scaled @ np.asarray(x, dtype=float), dtype=float).ravel()

    def primary(self, demand: np.ndarray, x: np.ndarray) -> float:
        """The unregularized objective of ``x``: served fraction (``t`` for concurrent, as ``B x = t d``) or MLU.

        With no demand at all everything is served (1.0) and the MLU is 0."""
        d = self._demand(demand)
        if self.objective == Objective.MIN_MLU:
            u = self.utilization(x)
            return float(max(u.max(initial=0.0), 0.0))
        total = float(d.sum())
        return float(np.sum(x)) / total if total > 0 else 1.0

    def objective_value(self, demand: np.ndarray, x: np.ndarray) -> float:
        """The full objective of ``x``: ``primary - lam sum u^2`` (maximisations) or ``U + lam sum u^2`` (MLU)."""
        reg = self.lam * float(np.sum(self.utilization(x) ** 2))
        primary = self.primary(demand, x)
        return primary + reg if self.objective == Objective.MIN_MLU else primary - reg
