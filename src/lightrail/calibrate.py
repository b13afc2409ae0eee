"""Calibrate the step-time model against nccl-tests measurements (pure: text in, parameters out).

The logs are read by :mod:`lightrail.workload.nccl_tests`.

The engine's time for a schedule of a fixed algorithm on a fixed topology is, per step,
``alpha + max_i (hops_i * latency + chunk_bytes * load_i / bandwidth)`` (DESIGN.md "Time model"), so for the
transfer that is slowest in each step it is linear in ``alpha``, ``latency`` and ``1/bandwidth``. We fit those
three by non-negative least squares on *relative* residuals (message sizes span nine decades), re-picking
the slowest transfer of every step at the new parameters until the choice is stable.

For one schedule the step count S and the hops summed over the steps' slowest transfers H do not depend on
the message size (unless the slowest transfer changes with it), so ``alpha`` and ``latency`` enter only as
``S * alpha + H * latency``: one table cannot tell them apart. The latency is then held at the value given
(the fabric's per-hop latency, e.g. from its data sheet) and ``alpha`` and the bandwidth are fitted;
``latency_fitted`` says which happened and ``startup_per_step_s`` (``alpha + H/S * latency``) is the part the
data does determine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from lightrail.defaults import Kind
from lightrail.errors import ScenarioError
from lightrail.workload.nccl_tests import NcclRow, parse_nccl_tests

__all__ = ["NcclRow", "parse_nccl_tests", "StepTerms", "step_terms", "model_times", "Calibration", "fit",
           "fit_terms"]

@dataclass(frozen=True)
class StepTerms:
    """Per step of a schedule, per transfer pair: hops and link load per chunk byte (at unit bandwidth);
    and the chunks per buffer. Enough to time the schedule at any (alpha, latency, bandwidth, size)."""

    hops: list[np.ndarray]
    load: list[np.ndarray]
    chunks_per_buffer: float


def step_terms(topology: str, algo: str, kind: Kind | str, ranks: int, **topology_args) -> StepTerms:
    """The schedule of ``algo`` for ``kind`` on ``ranks`` GPUs of ``topology``, reduced to its step terms
    by the engine itself (built with latency 1 and bandwidth 1, so its latencies are hop counts and its
    per-byte costs are loads)."""
    from lightrail.collectives.registry import generate
    from lightrail.fabric.builders import build_topology
    from lightrail.timing import Engine

    topo = build_topology(topology, ranks, bandwidth=1.0, latency=1.0, **topology_args)
    schedule = generate(kind, algo, ranks)
    models = [m for m in Engine(topo).profile(schedule) if len(m.latency)]
    return StepTerms([m.latency for m in models], [m.per_byte for m in models], schedule.chunk_bytes(1.0))


def model_times(terms: StepTerms, sizes, alpha: float, latency: float, bandwidth: float) -> np.ndarray:
    """The engine's time of the schedule at each buffer size: sum over steps of alpha + the slowest pair."""
    sizes = np.asarray(sizes, float)
    total = np.zeros(len(sizes))
    for hops, load in zip(terms.hops, terms.load, strict=True):
        per_pair = hops[None, :] * latency + (sizes[:, None] * terms.chunks_per_buffer) * load[None, :] / bandwidth
        total += alpha + per_pair.max(axis=1)
    return total


def _design(terms: StepTerms, sizes: np.ndarray, alpha: float, latency: float, bandwidth: float) -> np.ndarray:
    """Columns (alpha, latency, 1/bandwidth) of the model at each size, with each step's slowest pair picked
    at the given parameters."""
    x = np.zeros((len(sizes), 3))
    cb = sizes * terms.chunks_per_buffer
    for hops, load in zip(terms.hops, terms.load, strict=True):
        pick = np.argmax(hops[None, :] * latency + cb[:, None] * load[None, :] / bandwidth, axis=1)
        x[:, 0] += 1.0
        x[:, 1] += hops[pick]
        x[:, 2] += cb * load[pick]
    return x


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Fitted parameters, how well they fit, and the residual of every measurement."""

    kind: str
    algo: str
    topology: str
    ranks: int
    alpha_s: float
    latency_s: float
    bandwidth_Bps: float
    latency_fitted: bool
    """False when alpha and latency cannot be told apart on this topology and algorithm (latency held)."""
    hops_per_step: float
    """H/S: hops of the slowest transfer, averaged over the steps (at the largest size)."""
    startup_per_step_s: float
    """alpha + hops_per_step * latency: the size-independent time per step, which the data determines."""
    rms_relative_error: float
    max_relative_error: float
    points: list[dict] = field(default_factory=list)
    """Per measurement: size, in-place or not, measured and model seconds, relative error."""

    def rows(self) -> list[dict]:
        return list(self.points)

    def to_dict(self) -> dict:
        return asdict(self)

    def scenario_fragment(self) -> dict:
        """The parameters as a scenario's cluster fields (units in the text, as scenario files take them)."""
        from lightrail.units import format_time

        return {"cluster": {"alpha": format_time(self.alpha_s), "latency": format_time(self.latency_s),
                            "rail_bandwidth": f"{self.bandwidth_Bps * 8 / 1e9:.6g}Gbps"}}


def fit(rows: list[NcclRow], *, kind: Kind | str, algo: str, topology: str, ranks: int, latency_s: float,
        in_place: bool = True, **topology_args) -> Calibration:
    """Fit alpha, per-hop latency and bandwidth of the engine's model for ``algo`` on ``topology`` to the rows
    (both the out-of-place and, with ``in_place``, the in-place times). ``latency_s`` is the start of the
    search and the value held when the latency cannot be identified."""
    from lightrail.collectives.registry import parse_kind

    terms = step_terms(topology, algo, kind, ranks, **topology_args)
    return fit_terms(terms, rows, latency_s=latency_s, in_place=in_place, kind=parse_kind(kind).value, algo=algo,
                     topology=topology, ranks=ranks)


def fit_terms(terms: StepTerms, rows: list[NcclRow], *, latency_s: float, in_place: bool = True, kind: str = "",
              algo: str = "", topology: str = "", ranks: int = 0) -> Calibration:
    """:func:`fit` on a schedule already reduced to its step terms (the labels only name the result)."""
    from scipy.optimize import nnls

    sizes = np.array([r.size for r in rows] + ([r.size for r in rows] if in_place else []), float)
    measured = np.array([r.time_s for r in rows] + ([r.in_place_time_s for r in rows] if in_place else []))
    keep = sizes > 0  # a zero-byte line times only the launch, which the model does not have
    if keep.sum() < 3:
        raise ScenarioError(f"{int(keep.sum())} non-empty measurements cannot fit three parameters", field="FILE",
                            fix="measure at least three message sizes (e.g. all_reduce_perf -b 8 -e 1G -f 2)")
    sizes, measured = sizes[keep], measured[keep]
    weight = 1.0 / measured
    # start: all time is bandwidth at the largest size
    big = int(np.argmax(sizes))
    bandwidth = float(_design(terms, sizes[big:big + 1], 0.0, 0.0, 1.0)[0, 2] / measured[big])
    alpha, latency, fitted = 0.0, latency_s, True
    for _ in range(50):
        x = _design(terms, sizes, alpha, latency, bandwidth) * weight[:, None]
        y = measured * weight
        ratio = x[:, 1] / x[:, 0]
        identifiable = float(np.ptp(ratio)) > 1e-3 * float(np.mean(ratio))
        if identifiable:
            coef, _ = nnls(x, y)
        else:  # alpha and latency move together: hold the latency
            coef2, _ = nnls(x[:, [0, 2]], y - x[:, 1] * latency_s)
            coef = np.array([coef2[0], latency_s, coef2[1]])
        fitted = bool(identifiable)
        if coef[2] <= 0:
            raise ScenarioError("the times do not grow with the message size, so no bandwidth fits", field="FILE",
                                fix="measure up to large messages (e.g. -e 1G)")
        new = (float(coef[0]), float(coef[1]), float(1.0 / coef[2]))
        converged = np.allclose(new, (alpha, latency, bandwidth), rtol=1e-10, atol=0.0)
        alpha, latency, bandwidth = new
        if converged:
            break
    model = model_times(terms, sizes, alpha, latency, bandwidth)
    rel = (model - measured) / measured
    labels = [(r.size, False) for r in rows] + ([(r.size, True) for r in rows] if in_place else [])
    labels = [lab for lab, k in zip(labels, keep, strict=True) if k]
    points = [{"size": int(s), "in_place": ip, "measured_s": float(m), "model_s": float(t), "relative_error": float(e)}
              for (s, ip), m, t, e in zip(labels, measured, model, rel, strict=True)]
    x = _design(terms, sizes[big:big + 1], alpha, latency, bandwidth)[0]
    per_step = float(x[1] / x[0])
    return Calibration(kind=kind, algo=algo, topology=topology, ranks=ranks, alpha_s=alpha,
                       latency_s=latency, bandwidth_Bps=bandwidth, latency_fitted=fitted, hops_per_step=per_step,
                       startup_per_step_s=alpha + per_step * latency,
                       rms_relative_error=float(np.sqrt(np.mean(rel ** 2))),
                       max_relative_error=float(np.max(np.abs(rel))), points=points)
