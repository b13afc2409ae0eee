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

That single-schedule fit (``model="engine"``) cannot describe a real log: NCCL switches algorithm (ring, tree,
NVLS, CollNet) and protocol (LL, LL128, Simple) with the message size, each with its own latency and bandwidth.
:func:`fit_nccl` fits the parameters of NCCL's own cost model (:mod:`lightrail.nccl`) instead: the base latency
per protocol, the per-hop latency per link class (NVLink, network) and protocol, the NVLink and NIC bandwidths
and the LL/LL128/NVLS efficiencies, by bounded least squares (``scipy.optimize.least_squares``) on the relative
error of every measurement, with the (algorithm, protocol) of each size re-picked as the model's argmin at the
current parameters until the picks are stable. A weak prior pulls every parameter toward NCCL's published value
(a factor of e costs as much as a 3% error on one point), so what the data cannot tell apart (one log with one
rank count fixes only sums of latencies) stays where NCCL put it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from lightrail.defaults import Kind
from lightrail.errors import ScenarioError
from lightrail.workload.nccl_tests import NcclRow, parse_nccl_tests

__all__ = ["NcclRow", "parse_nccl_tests", "StepTerms", "step_terms", "model_times", "Calibration", "fit",
           "fit_terms", "fit_nccl", "measurements", "bandwidth_identified", "FIT_FIELDS", "RMS_GOAL"]

RMS_GOAL = 0.10
"""A fit whose rms relative error is above this gets a warning."""

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
    """Per measurement: size, in-place or not, measured and model seconds, relative error (and with the NCCL
    model the algorithm and protocol)."""
    model: str = "engine"
    """``engine`` (one lightrail schedule, the fields above) or ``nccl`` (NCCL's algorithm x protocol model)."""
    warnings: list[str] = field(default_factory=list)
    """What the user should know: a poor fit, a bandwidth above the hardware's, what the log reader skipped."""
    choices: list[dict] = field(default_factory=list)
    """NCCL model: per size, the algorithm and protocol the fitted model picks."""
    params: dict = field(default_factory=dict)
    """NCCL model: the fitted :class:`lightrail.nccl.NcclParams` (seconds, bytes/s, fractions)."""
    defaults: dict = field(default_factory=dict)
    """NCCL model: NCCL's published parameters for this communicator (the fit's start and prior)."""
    nominal: dict = field(default_factory=dict)
    """The hardware's data-sheet rates (``nvlink_Bps``, ``nic_Bps``) the fitted bandwidths are checked against."""
    bandwidth_identified: dict = field(default_factory=dict)
    """NCCL model: per link class (``nvlink_Bps``, ``nic_Bps``), whether the data determines its bandwidth: False
    when moving it by 2% moves no modelled time by 5% of that (a per-channel cap, NCCL's LL cap or the other link
    binds at every size), so the fitted value is NCCL's default held by the prior, not a measurement."""
    communicator: dict = field(default_factory=dict)
    """NCCL model: ranks, nodes, GPUs per node, nvls, collnet, arch."""

    def rows(self) -> list[dict]:
        return list(self.points)

    def to_dict(self) -> dict:
        return asdict(self)

    def scenario_fragment(self) -> dict:
        """The parameters as a scenario's cluster fields (units in the text, as scenario files take them)."""
        from lightrail.units import format_time

        cluster = {"alpha": format_time(self.alpha_s), "latency": format_time(self.latency_s),
                   "rail_bandwidth": f"{self.bandwidth_Bps * 8 / 1e9:.6g}Gbps"}
        if self.model == "nccl":
            cluster["rail_bandwidth"] = f"{self.params['nic_Bps'] * 8 / 1e9:.6g}Gbps"
            cluster["nvlink_bandwidth"] = f"{self.params['nvlink_Bps'] / 1e9:.6g}GBps"
        return {"cluster": cluster}


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
    rms = float(np.sqrt(np.mean(rel ** 2)))
    warnings = [f"rms relative error {rms:.1%} is above {RMS_GOAL:.0%}: one schedule does not describe this log "
                "(NCCL changes algorithm and protocol with the size: try --model nccl)"] if rms > RMS_GOAL else []
    return Calibration(kind=kind, algo=algo, topology=topology, ranks=ranks, alpha_s=alpha,
                       latency_s=latency, bandwidth_Bps=bandwidth, latency_fitted=fitted, hops_per_step=per_step,
                       startup_per_step_s=alpha + per_step * latency, rms_relative_error=rms,
                       max_relative_error=float(np.max(np.abs(rel))), points=points, warnings=warnings)


# ---- NCCL's algorithm x protocol model ---------------------------------------------------------------------------

FIT_FIELDS = ("base_LL", "base_LL128", "base_Simple", "nvlink_LL", "nvlink_LL128", "nvlink_Simple", "net_LL",
              "net_LL128", "net_Simple", "nvlink_Bps", "nic_Bps", "ll_efficiency", "ll128_efficiency",
              "nvls_efficiency", "p2p_net_channel_Bps")
"""The entries of the NCCL model's parameter vector (:class:`lightrail.nccl.NcclParams` flattened)."""
_LATENCIES, _BANDWIDTHS, _EFFICIENCIES, _P2P_CHANNEL = range(9), (9, 10), (11, 12, 13), 14
PRIOR_WEIGHT = 0.03
"""Weight of log(parameter / NCCL's value) beside the relative errors: a factor e costs a 3% error."""


def _vector(q) -> np.ndarray:
    return np.array([*q.base_latency_s, *q.nvlink_latency_s, *q.net_latency_s, q.nvlink_Bps, q.nic_Bps,
                     q.ll_efficiency, q.ll128_efficiency, q.nvls_efficiency, q.p2p_net_channel_Bps], float)


def _params(v):
    from lightrail.nccl import NcclParams

    v = [float(x) for x in v]
    return NcclParams(base_latency_s=tuple(v[0:3]), nvlink_latency_s=tuple(v[3:6]), net_latency_s=tuple(v[6:9]),
                      nvlink_Bps=v[9], nic_Bps=v[10], ll_efficiency=v[11], ll128_efficiency=v[12],
                      nvls_efficiency=v[13], p2p_net_channel_Bps=v[14])


def _active(kind: str, comm) -> np.ndarray:
    """Which parameters the data can move: no network parameter on one node, no NVLS efficiency without NVLS, only
    Simple's latencies, the bandwidths and (across nodes) the p2p channel's bandwidth for point-to-point."""
    active = np.ones(len(FIT_FIELDS), bool)
    if comm.nnodes == 1 or kind not in ("alltoall", "sendrecv"):
        active[_P2P_CHANNEL] = False
    if comm.nnodes == 1:
        active[[6, 7, 8, 10]] = False
    if not comm.nvls or kind in ("alltoall", "sendrecv"):
        active[13] = False
    if kind in ("alltoall", "sendrecv"):
        active[[0, 1, 3, 4, 6, 7, 11, 12]] = False
    return active


def measurements(rows: list[NcclRow], *, in_place: bool = True) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """(sizes, seconds, labels (size, in_place)) of the non-empty measurements of the rows: out-of-place, then
    in-place where the log has it."""
    labels, times = [], []
    for r in rows:
        labels.append((r.size, False))
        times.append(r.time_s)
    if in_place:
        for r in rows:
            if getattr(r, "in_place_time_s", None) is not None:
                labels.append((r.size, True))
                times.append(r.in_place_time_s)
    keep = [i for i, ((s, _), t) in enumerate(zip(labels, times, strict=True)) if s > 0 and t and t > 0]
    sizes = np.array([labels[i][0] for i in keep], float)
    return sizes, np.array([times[i] for i in keep], float), [labels[i] for i in keep]


def _model(kind, sizes, comm, q, algorithm, pairs=None) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Model seconds per size and the pair of each: the argmin, or with ``pairs`` those pairs held."""
    from lightrail.nccl import algo_time, choose

    if pairs is None:
        chosen = choose(kind, sizes, comm, q, algorithm=algorithm)
        return chosen.seconds, list(zip(chosen.algorithm.tolist(), chosen.protocol.tolist(), strict=True))
    out = np.empty(len(sizes))
    for pair in set(pairs):
        idx = np.array([i for i, p in enumerate(pairs) if p == pair])
        out[idx] = algo_time(kind, *pair, sizes[idx], comm, q)
    return out, pairs


def fit_nccl(rows: list[NcclRow], *, kind: str, comm, algorithm: str | None = None, in_place: bool = True,
             topology: str = "rails", nominal: dict | None = None, warnings: list[str] | tuple = (),
             prior: float = PRIOR_WEIGHT) -> Calibration:
    """Fit NCCL's cost model (:mod:`lightrail.nccl`) for ``kind`` on ``comm`` to the rows: bounded least squares
    on relative error in log-parameters, the (algorithm, protocol) of each size re-picked as the model's argmin
    (``algorithm`` forces one algorithm; the protocol is still picked) until the picks are stable, then a last pass
    on the argmin model itself. ``nominal`` (``nvlink_Bps``, ``nic_Bps``, bytes/s) are the data-sheet rates the
    fitted bandwidths are checked against (default: the communicator's). ``warnings`` (e.g. the log reader's) are
    passed through, and a warning is added when the rms relative error is above :data:`RMS_GOAL` or a fitted
    bandwidth above its nominal rate."""
    from scipy.optimize import least_squares

    from lightrail.nccl import NcclParams, choose

    sizes, measured, labels = measurements(rows, in_place=in_place)
    if len(sizes) < 3:
        raise ScenarioError(f"{len(sizes)} non-empty measurements are too few to fit NCCL's model", field="FILE",
                            fix="measure at least three message sizes (e.g. all_reduce_perf -b 8 -e 1G -f 2)")
    choose(kind, sizes[:1], comm, None, algorithm=algorithm)  # a forced algorithm NCCL cannot run fails here
    theta0 = _vector(NcclParams().resolve(comm))
    active = _active(kind, comm)
    lo, hi = np.full(len(theta0), np.log(1e-2)), np.full(len(theta0), np.log(1e2))
    lo[[*_BANDWIDTHS, _P2P_CHANNEL]], hi[[*_BANDWIDTHS, _P2P_CHANNEL]] = np.log(1 / 20), np.log(20)
    lo[list(_EFFICIENCIES)], hi[list(_EFFICIENCIES)] = np.log(1 / 20), np.log(1 / theta0[list(_EFFICIENCIES)])
    lo, hi = lo[active], hi[active]

    def params(x):
        theta = theta0.copy()
        theta[active] = theta0[active] * np.exp(x)
        return _params(theta)

    def residuals(x, pairs=None):
        model, _ = _model(kind, sizes, comm, params(x), algorithm, pairs)
        return np.concatenate([model / measured - 1.0, prior * x])

    # start: latencies scaled to the smallest size, then bandwidths to the largest
    x = np.zeros(active.sum())
    lat_ix = np.cumsum(active) - 1
    small, big = int(np.argmin(sizes)), int(np.argmax(sizes))
    model, _ = _model(kind, sizes, comm, params(x), algorithm)
    for i in _LATENCIES:
        if active[i]:
            x[lat_ix[i]] = np.log(np.clip(measured[small] / model[small], 0.05, 20))
    model, _ = _model(kind, sizes, comm, params(x), algorithm)
    ratio = float(np.clip(model[big] / measured[big], 0.06, 15))
    for i in (*_BANDWIDTHS, _P2P_CHANNEL):  # across nodes a slow log is the NICs' doing (and the p2p channels'):
        if active[i] and (i != 9 or comm.nnodes == 1 or ratio > 1 or not active[10]):  # NVLink moves only if not
            x[lat_ix[i]] = np.log(ratio)
    x = np.clip(x, lo + 1e-9, hi - 1e-9)
    best_x, best_cost, seen = x, np.inf, set()
    for _ in range(25):
        _, pairs = _model(kind, sizes, comm, params(x), algorithm)
        if tuple(pairs) in seen:  # stable (or cycling back): the picks will not change any more
            break
        seen.add(tuple(pairs))
        x = least_squares(residuals, x, bounds=(lo, hi), args=(pairs,), x_scale=1.0, max_nfev=400).x
        cost = float(np.sum(residuals(x) ** 2))
        if cost < best_cost:
            best_x, best_cost = x, cost
    polished = least_squares(residuals, best_x, bounds=(lo, hi), max_nfev=400).x  # the argmin model itself
    if np.sum(residuals(polished) ** 2) < best_cost:
        best_x = polished
    q = params(best_x)
    model, pairs = _model(kind, sizes, comm, q, algorithm)
    return _nccl_calibration(rows, kind, comm, algorithm, topology, q, sizes, measured, labels, model, pairs,
                             nominal, list(warnings))


IDENTIFIED = 0.05
"""A bandwidth is determined by the data when a relative change of it moves some modelled time by at least this
fraction of that change (its bytes term is >= 5% of that size's time)."""
_NUDGE = 0.02


def bandwidth_identified(kind: str, sizes, comm, q, algorithm: str | None = None) -> dict[str, bool]:
    """Per link class (``nvlink_Bps``; ``nic_Bps`` across nodes): whether the model's times at ``sizes`` depend on
    that bandwidth at parameters ``q`` (resolved :class:`lightrail.nccl.NcclParams`), the picks re-chosen: it is
    nudged by +-2% and identified when some time moves by at least :data:`IDENTIFIED` x 2%. Where NCCL's caps
    (per-channel LL128/tree caps, ``llMaxBws``, p2p channels per peer) or the other link class bind at every size,
    it is not."""
    from dataclasses import replace

    sizes = np.asarray(sizes, float)
    base, _ = _model(kind, sizes, comm, q, algorithm)
    keys = ["nvlink_Bps", "nic_Bps"] if comm.nnodes > 1 else ["nvlink_Bps"]
    out = {}
    for key in keys:
        moved = 0.0
        for f in (1 + _NUDGE, 1 / (1 + _NUDGE)):
            t, _ = _model(kind, sizes, comm, replace(q, **{key: getattr(q, key) * f}), algorithm)
            moved = max(moved, float(np.max(np.abs(t / base - 1.0))))
        out[key] = moved >= IDENTIFIED * np.log(1 + _NUDGE)
    return out


def _nccl_calibration(rows, kind, comm, algorithm, topology, q, sizes, measured, labels, model, pairs, nominal,
                      warnings) -> Calibration:
    from lightrail.nccl import NcclParams, algo_time

    rel = (model - measured) / measured
    points = [{"size": int(s), "in_place": ip, "measured_s": float(m), "model_s": float(t), "relative_error": float(e),
               "algorithm": a, "protocol": p}
              for (s, ip), m, t, e, (a, p) in zip(labels, measured, model, rel, pairs, strict=True)]
    by_size = {}
    for point in points:
        by_size.setdefault(point["size"], (point["algorithm"], point["protocol"]))
    choices = [{"size": s, "algorithm": a, "protocol": p} for s, (a, p) in sorted(by_size.items())]
    fitted = q.to_dict()
    nominal = dict(nominal or {"nvlink_Bps": comm.nvlink_Bps, "nic_Bps": comm.nic_Bps})
    checked = ["nvlink_Bps", "nic_Bps"] if comm.nnodes > 1 else ["nvlink_Bps"]
    ratio = {k: fitted[k] / nominal[k] for k in checked if nominal.get(k)}
    rms, worst = float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel)))
    if rms > RMS_GOAL:
        warnings.append(f"rms relative error {rms:.1%} is above {RMS_GOAL:.0%}: the model does not describe this log "
                        "well (check --ranks, --gpus-per-server, --gpu and --nvls against the cluster)")
    identified = bandwidth_identified(kind, sizes, comm, q, algorithm)
    for key, r in ratio.items():
        link = "NVLink" if key == "nvlink_Bps" else "NIC"
        if not identified.get(key, True):
            warnings.append(f"the {link} bandwidth is not determined by the data: at every size NCCL's model is "
                            "bound elsewhere (a per-channel cap, the LL cap, p2p channels per peer or the other link), "
                            f"so {fitted[key] / 1e9:.4g} GB/s is NCCL's default held by the prior, not a measurement")
        elif r > 1.0:
            warnings.append(f"fitted {link} bandwidth {fitted[key] / 1e9:.4g} GB/s is {r:.2f}x the nominal "
                            f"{nominal[key] / 1e9:.4g} GB/s: check the hardware options (--gpu, "
                            f"{'--nvlink-bandwidth' if link == 'NVLink' else '--rail-bandwidth'}, --gpus-per-server)")
    # the old keys, read at the largest size: base latency (alpha), per-hop latency and bandwidth of its link class
    a, p = pairs[int(np.argmax(sizes))]
    slot = ("LL", "LL128", "Simple").index(p)
    hop = (q.net_latency_s if comm.nnodes > 1 else q.nvlink_latency_s)[slot]
    alpha = q.base_latency_s[slot]
    startup = float(algo_time(kind, a, p, np.array([0.0]), comm, q)[0])
    bandwidth = q.nic_Bps if comm.nnodes > 1 else q.nvlink_Bps
    return Calibration(
        kind=kind, algo=algorithm or "auto", topology=topology, ranks=comm.nranks, alpha_s=alpha, latency_s=hop,
        bandwidth_Bps=bandwidth, latency_fitted=True, hops_per_step=(startup - alpha) / hop if hop else 0.0,
        startup_per_step_s=startup, rms_relative_error=rms, max_relative_error=worst, points=points, model="nccl",
        warnings=warnings, choices=choices, params=fitted, defaults=NcclParams().resolve(comm).to_dict(),
        nominal={**nominal, **{f"fitted_over_{k}": r for k, r in ratio.items()}},
        bandwidth_identified={k: bool(identified.get(k, True)) for k in checked},
        communicator={"ranks": comm.nranks, "nodes": comm.nnodes, "gpus_per_node": comm.ppn, "nvls": comm.nvls,
                      "collnet": comm.collnet, "arch": comm.arch, "cpu": comm.cpu, "nics_per_node": comm.nics})


_ARCH_OF = {"h100": "hopper", "h200": "hopper", "b200": "blackwell", "a100": "ampere"}
"""GPU preset (``lightrail.workload.hardware.GPUS``) -> NCCL's GPU class."""
_ARCH_NAMES = {"v100": "volta", "t4": "volta", "a10": "ampere", "a40": "ampere", "l40": "ampere", "gh200": "hopper",
               "gb200": "blackwell", "b100": "blackwell"}
"""Device names the log may print without a preset: their NCCL class (nominal rates then come from the options)."""


def nccl_communicator(ranks: int, gpus_per_server: int, *, gpu: str | None = None, arch: str | None = None,
                      nvlink_Bps: float | None = None, nic_Bps: float | None = None, nvls: bool | None = None,
                      collnet: bool = False, devices: tuple[str, ...] | list[str] = (),
                      nics_per_server: int | None = None) -> tuple:
    """The communicator NCCL's model prices and the nominal rates it is checked against, from the options and
    the GPU names the log prints: ``(Communicator, {"nvlink_Bps", "nic_Bps"}, warnings)``. The GPU is ``gpu``
    (a preset: h100, h200, b200, a100), else the preset the log's device names contain, else H100's rates with a
    warning; ``nvlink_Bps``/``nic_Bps`` override its rates, ``arch`` its NCCL class. NVLS defaults to on for
    Hopper and Blackwell (NVSwitch multicast). ``nics_per_server`` (default: one per GPU) sets the ring's channels
    across nodes; ``nic_Bps`` stays a GPU's share of the node's NICs."""
    from lightrail.nccl import Communicator
    from lightrail.workload.hardware import GPUS
    from lightrail.workload.hardware import gpu as preset

    warnings = []
    spec = preset(gpu) if gpu else None
    named = " ".join(devices).lower()
    if spec is None:
        found = [k for k in GPUS if k in named.replace(" ", "").replace("-", "")]
        spec = GPUS[found[0]] if found else None
    key = next((k for k, v in GPUS.items() if v is spec), None)
    if arch is None:
        arch = _ARCH_OF.get(key) or next((a for k, a in _ARCH_NAMES.items() if k in named), None)
    if spec is None and (nvlink_Bps is None or nic_Bps is None):
        from lightrail.defaults import NIC_BANDWIDTH, NVLINK_BANDWIDTH

        warnings.append("no --gpu given and the log names no GPU preset: nominal rates "
                        f"{'' if nvlink_Bps else 'NVLink 450 GB/s '}{'' if nic_Bps else 'NIC 400 Gb/s '}assumed "
                        "(H100; give --gpu, --nvlink-bandwidth, --rail-bandwidth)")
        nvlink_Bps, nic_Bps = nvlink_Bps or NVLINK_BANDWIDTH, nic_Bps or NIC_BANDWIDTH
    nvlink_Bps = nvlink_Bps or spec.nvlink_bandwidth
    nic_Bps = nic_Bps or spec.nic_bandwidth
    for flag, rate in (("--nvlink-bandwidth", nvlink_Bps), ("--rail-bandwidth", nic_Bps)):
        if not 1e6 <= rate <= 1e15:
            raise ScenarioError(f"{rate:g} B/s is not a link's rate", field=flag,
                                fix="give a rate between 1 MB/s and 1 PB/s, e.g. 400Gbps or 450GBps")
    arch = arch or "hopper"
    if gpus_per_server < 1:
        raise ScenarioError(f"{gpus_per_server} GPUs per server", field="--gpus-per-server", fix="use 1 or more")
    if nics_per_server is not None and (isinstance(nics_per_server, bool) or nics_per_server < 1):
        raise ScenarioError(f"{nics_per_server} NICs per server", field="--nics-per-server", fix="use 1 or more")
    comm = Communicator(nranks=ranks, gpus_per_node=gpus_per_server, nvlink_Bps=nvlink_Bps, nic_Bps=nic_Bps,
                        nics_per_node=nics_per_server,
                        nvls=(arch in ("hopper", "blackwell")) if nvls is None else nvls, collnet=collnet, arch=arch)
    return comm, {"nvlink_Bps": nvlink_Bps, "nic_Bps": nic_Bps}, warnings
