"""Fit the parameters hardware facts cannot give to measured iteration times (``lightrail calibrate iterations``).

A testbed measures the iteration time of one job on electrical rails and on photonic rails at a few OCS delays,
on demand and provisioned. Three parameters of the scenario are not hardware facts: the compute efficiency
``job.mfu``, and the control plane's costs, ``ocs.check_in_rtt`` per check-in and ``ocs.command_latency`` per
reconfiguration. :func:`fit_iterations` fits them on the rows the user names (the others are the model's test),
running the iteration simulator (:func:`lightrail.sim.iteration.simulate_iteration`) for every evaluation, and
predicts every row. Pure: the table arrives as text and the result is data; ``report/`` writes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from lightrail.errors import LightrailError, ScenarioError
from lightrail.units import parse_time

if TYPE_CHECKING:
    from lightrail.scenario import Built

__all__ = ["HEADER", "MODES", "MAX_ROWS", "TableRow", "IterationCalibration", "parse_iteration_table",
           "fit_iterations", "time_text"]

HEADER = ("mode", "ocs_delay", "iteration_s")
"""The table's columns (a header line naming them is optional)."""
MODES = ("electrical", "provisioned", "on-demand")
MAX_ROWS = 1000
"""Most rows a table may hold: each distinct (mode, delay) is simulated at every step of the fit."""
MFU_MIN = 1e-3
"""The lowest mfu the fit tries (the bound is (0, 1]; below this a GPU computes at a thousandth of its peak)."""
SAME_DELAY = 1e-9
"""Relative tolerance when matching ``fit_delays`` to the table's delays."""
RMS_GOAL = 0.10
"""Out-of-fit rms relative error above which the fit warns that the model does not describe the testbed."""
_FLAT = 1e-9
"""Relative change of the residuals below which a parameter moves nothing (the rows do not identify it)."""
_COLLINEAR = 1 - 1e-6
"""|cos| between two parameters' effects on the residuals above which only their combination is identified."""
EXAMPLE = "provisioned,10ms,0.0345"


@dataclass(frozen=True)
class TableRow:
    """One measured iteration: ``mode`` (electrical, provisioned, on-demand), the OCS delay (None on electrical
    rails), the time in seconds, and the table line it came from."""

    mode: str
    delay_s: float | None
    measured_s: float
    line: int


def _row_error(message: str, where: str, fix: str) -> ScenarioError:
    return ScenarioError(message, field=where, fix=fix)


def parse_iteration_table(text: str, *, source: str = "TABLE") -> tuple[TableRow, ...]:
    """Rows of a ``mode,ocs_delay,iteration_s`` table: ``#`` lines are comments, blank lines are skipped, a header
    line naming the columns is optional. ``ocs_delay`` is empty on electrical rows and a time with a unit
    otherwise (``10ms``; a bare ``0`` is fine); ``iteration_s`` is seconds (or a time with a unit).

    Raises
    ------
    ScenarioError : naming ``source:line`` and the fix, for a row that cannot be read.

    Examples
    --------
    >>> parse_iteration_table("mode,ocs_delay,iteration_s\\nelectrical,,0.5\\non-demand,10ms,0.61")[1]
    TableRow(mode='on-demand', delay_s=0.01, measured_s=0.61, line=3)
    """
    rows: list[TableRow] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{n}"
        cells = [c.strip() for c in line.split(",")]
        if [c.lower() for c in cells] == list(HEADER):
            if rows:
                raise _row_error("a header line after rows", where, "give the header first, or leave it out")
            continue
        if len(cells) != 3:
            raise _row_error(f"{len(cells)} columns in {line!r}", where,
                             f"give {','.join(HEADER)} per line, e.g. {EXAMPLE} or electrical,,0.0312")
        mode, delay, seconds = cells
        if mode.lower() == "mode":
            raise _row_error(f"header {line!r}", where, f"the header is {','.join(HEADER)} (in that order), "
                             "or leave it out")
        mode = mode.lower().replace("_", "-")
        if mode not in MODES:
            raise _row_error(f"unknown mode {cells[0]!r}", where, f"use one of {', '.join(MODES)}")
        if mode == "electrical":
            if delay:
                raise _row_error(f"an electrical row has an OCS delay ({delay!r})", where,
                                 "leave ocs_delay empty on electrical rows: electrical,,0.0312")
            delay_s = None
        elif not delay:
            article = "an" if mode == "on-demand" else "a"
            raise _row_error(f"{article} {mode} row needs its OCS delay", where, f"give it with a unit, e.g. {EXAMPLE}")
        else:
            try:
                delay_s = parse_time(delay, field=where)
            except LightrailError as e:
                raise _row_error(f"ocs_delay {delay!r}: {e.message}", where,
                                 "give a time with a unit, e.g. 10ms, 250us, 1s (a bare 0 is fine)") from None
        rows.append(TableRow(mode, delay_s, _seconds(seconds, where), n))
        if len(rows) > MAX_ROWS:
            raise _row_error(f"more than {MAX_ROWS} rows", where, "measure fewer points (each is simulated)")
    if not rows:
        raise ScenarioError("no rows (every line is blank, a comment or the header)", field=source,
                            fix=f"give lines of {','.join(HEADER)}, e.g. {EXAMPLE}")
    return tuple(rows)


def _seconds(text: str, where: str) -> float:
    fix = "give the measured iteration time in seconds, e.g. 0.0345 (or with a unit: 34.5ms)"
    try:
        value = float(text)
    except ValueError:
        try:
            value = parse_time(text, field=where)
        except LightrailError:
            raise _row_error(f"iteration_s {text!r} is not a number of seconds", where, fix) from None
    if not math.isfinite(value) or not 0 < value <= 1e7:
        raise _row_error(f"iteration_s {text!r} is not a positive, finite time (at most 10^7 s)", where, fix)
    return value


def time_text(seconds: float) -> str:
    """A time a scenario file reads back, to six significant digits: ``0.002 -> '2ms'``, ``0 -> '0'``."""
    if seconds == 0:
        return "0"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.6g}{unit}"
    return f"{seconds / 1e-9:.6g}ns"


@dataclass(frozen=True, kw_only=True)
class IterationCalibration:
    """The fit: ``fitted`` (mfu, check_in_rtt_s, command_latency_s; a parameter the rows do not identify keeps
    the scenario's value, ``identified`` says which), one row per table row with its prediction, and the rms
    relative error over the rows outside the fit (the model's test), inside it, and over all."""

    scenario: str
    source: str
    fitted: dict[str, float]
    scenario_values: dict[str, float]
    identified: dict[str, bool]
    rows: list[dict]
    rms_relative_error: dict[str, float | None]
    fit_delays_s: list[float] | None
    policy: str
    """The scenario's policy knobs (``ocs`` section), e.g. ``+skip_present+partial``; each row runs in its mode."""
    method: str
    simulations: int
    warnings: list[str]

    def scenario_fragment(self) -> dict:
        """The fitted values as scenario sections: ``job.mfu``, ``ocs.check_in_rtt``, ``ocs.command_latency``."""
        f = self.fitted
        return {"job": {"mfu": round(f["mfu"], 6)},
                "ocs": {"check_in_rtt": time_text(f["check_in_rtt_s"]),
                        "command_latency": time_text(f["command_latency_s"])}}

    def to_dict(self) -> dict:
        return asdict(self)


class _Model:
    """Iteration times of the scenario's job with mfu and the control plane's costs replaced, cached.

    Electrical runs of different mfu share one :class:`OpDurations` (an op's time on the rails depends on its
    bytes and the fabric, not on compute); photonic runs of one mfu share a :class:`JobRuns` (programs, planners,
    op durations), since they differ only in the delay and the controller's latencies."""

    def __init__(self, built: Built, progress: Callable[[str], None] | None):
        self.built = built
        self.step = progress or (lambda description: None)
        self.simulations = 0
        self._electrical: dict[float, float] = {}
        self._durations = None
        self._runs: dict = {}
        self._photonic: dict[tuple, float] = {}

    def electrical(self, mfu: float) -> float:
        if mfu not in self._electrical:
            from lightrail.sim.iteration import OpDurations, simulate_iteration
            from lightrail.workload.program import build_program

            program = build_program(replace(self.built.job, mfu=mfu))
            fabric = replace(self.built.fabric, kind="electrical")
            if self._durations is None:
                self._durations = OpDurations(program, fabric)
            self._electrical[mfu] = simulate_iteration(program, fabric, durations=self._durations).iteration_time_s
            self.simulations += 1
            self.step(f"mfu {mfu:.4g}: electrical")
        return self._electrical[mfu]

    def photonic(self, mfu: float, mode: str, delay: float, rtt: float, command: float) -> float:
        key = (mfu, mode, delay, rtt, command)
        if key not in self._photonic:
            from lightrail.defaults import Mode
            from lightrail.studies.rails import JobRuns

            runs = self._runs.get(mfu)
            if runs is None:
                self._runs = {mfu: JobRuns(replace(self.built.job, mfu=mfu))}  # one mfu at a time: keep one
                runs = self._runs[mfu]
            fabric = replace(self.built.fabric, ocs_delay=delay, check_in_rtt=rtt, command_latency=command)
            result = runs(fabric, replace(self.built.policy, mode=Mode(mode)))
            self._photonic[key] = result.iteration_time_s
            self.simulations += 1
            self.step(f"rtt {time_text(rtt)}, command {time_text(command)}: {mode} {time_text(delay)}")
        return self._photonic[key]


def _fit_mfu(model: _Model, measured, start: float, warnings: list[str]) -> tuple[float, bool]:
    """Bounded search over log(mfu): a grid of 13 points on [MFU_MIN, 1], then Brent's bounded method between
    the best point's neighbours. The electrical iteration falls monotonically with mfu, so the relative
    least-squares cost is unimodal and the grid brackets its minimum."""
    import numpy as np
    from scipy.optimize import minimize_scalar

    m = np.asarray(measured, dtype=float)

    def cost(log_mfu: float) -> float:
        return float(np.sum((model.electrical(math.exp(log_mfu)) / m - 1) ** 2))

    grid = np.linspace(math.log(MFU_MIN), 0.0, 13)
    costs = [cost(g) for g in grid]
    times = [model.electrical(math.exp(g)) for g in grid]
    if max(times) - min(times) <= _FLAT * max(times):
        warnings.append(f"mfu is not identified: the electrical iteration does not depend on compute; kept the "
                        f"scenario's job.mfu {start:g}")
        return start, False
    k = int(np.argmin(costs))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    found = minimize_scalar(cost, bounds=(lo, hi), method="bounded", options={"xatol": 1e-7})
    best = float(found.x) if found.fun <= costs[k] else float(grid[k])
    mfu = min(math.exp(best), 1.0)
    mean = float(np.exp(np.mean(np.log(m))))
    if mfu > 0.999 and times[-1] > mean:
        warnings.append(f"the electrical rows ({mean:.4g} s) are faster than the model at mfu 1 ({times[-1]:.4g} s): "
                        "the hardware facts (cluster.gpu, peak_tflops, the bandwidths) overstate the time")
    if best <= grid[0] + 1e-6:
        warnings.append(f"the electrical rows need mfu at or below {MFU_MIN:g}: check the model, the layout and "
                        "the GPU (cluster.gpu, peak_tflops) against the testbed")
    return mfu, True


_CONTROL = ("check_in_rtt_s", "command_latency_s")


def _fit_control(model: _Model, mfu: float, rows: Sequence[TableRow], start: tuple[float, float],
                 warnings: list[str]) -> tuple[tuple[float, float], dict[str, bool]]:
    """check_in_rtt and command_latency from the photonic rows, by least squares on relative error.

    The iteration time is piecewise linear in both (a cost counts where it lies on the critical path, not where
    the schedule hides it), so: (1) runs at zero cost and at a probe cost give each row's local slopes, and a
    non-negative least-squares solve of that linear model a first guess; (2) a coarse 4 x 4 grid around the
    rows' overhead scale adds starts that do not rely on linearity; (3) ``scipy.optimize.least_squares`` (trf,
    bounds >= 0) polishes the best start in variables scaled to it, with ``diff_step`` 1% so that its finite
    differences straddle small kinks. Then each parameter's effect on the residuals is measured at the fit: one
    that moves nothing (hidden by the schedule) or moves them only in step with the other (e.g. rows of one mode)
    is not identified, keeps the scenario's value, and the other is refitted alone."""
    import numpy as np
    from scipy.optimize import least_squares, nnls

    m = np.array([r.measured_s for r in rows])

    def predict(x) -> np.ndarray:
        return np.array([model.photonic(mfu, r.mode, r.delay_s, float(x[0]), float(x[1])) for r in rows])

    def resid(x) -> np.ndarray:
        return predict(x) / m - 1

    zero = predict((0.0, 0.0))
    over = m - zero
    s = max(float(np.max(over)) / 10, 1e-6) if np.max(over) > 0 else max(max(start), 1e-6)
    slopes = np.stack([(predict((s, 0.0)) - zero) / s, (predict((0.0, s)) - zero) / s], axis=1)
    linear, _ = nnls(slopes / m[:, None], over / m)
    starts = [tuple(linear), tuple(start)] + [(a * s, b * s) for a in (0, 0.25, 1, 4) for b in (0, 0.25, 1, 4)]
    best = min(starts, key=lambda x: float(np.sum(resid(x) ** 2)))

    def solve(free: list[int], x0) -> tuple[float, float]:
        x0 = np.asarray(x0, dtype=float)
        scale = np.array([max(x0[j], s) for j in free])

        def r(u):
            x = x0.copy()
            x[free] = u * scale
            return resid(x)

        u = least_squares(r, x0[free] / scale, bounds=(0, np.inf), diff_step=1e-2, xtol=1e-12, ftol=1e-12,
                          gtol=1e-12, max_nfev=60, method="trf").x
        x = x0.copy()
        x[free] = u * scale
        return (float(x[0]), float(x[1])) if np.sum(r(u) ** 2) <= np.sum(resid(x0) ** 2) else tuple(x0)

    x = solve([0, 1], best)
    # identification at the fit: each parameter's effect on the residuals over 5% of its scale (forward)
    base = resid(x)
    cols = []
    for j in range(2):
        h = 0.05 * max(x[j], s)
        bumped = list(x)
        bumped[j] += h
        cols.append((resid(bumped) - base) / h * max(x[j], s))
    norms = [float(np.linalg.norm(c)) for c in cols]
    flat = [n <= _FLAT for n in norms]
    names = ("ocs.check_in_rtt", "ocs.command_latency")
    identified = {_CONTROL[j]: not flat[j] for j in range(2)}
    if all(flat):
        warnings.append("check_in_rtt and command_latency are not identified: the photonic rows in the fit do not "
                        "depend on them (the schedule hides the control plane at these delays); kept the scenario's "
                        f"{time_text(start[0])} and {time_text(start[1])}; add on-demand rows, or provisioned rows "
                        "at delays the compute cannot hide")
        return start, identified
    if any(flat):
        j = flat.index(True)
        warnings.append(f"{names[j]} is not identified: the photonic rows in the fit do not depend on it; kept the "
                        f"scenario's {time_text(start[j])}")
        x0 = list(x)
        x0[j] = start[j]
        return solve([1 - j], x0), identified
    cos = abs(float(np.dot(cols[0], cols[1]))) / (norms[0] * norms[1])
    if cos > _COLLINEAR:
        identified["check_in_rtt_s"] = False
        warnings.append("check_in_rtt and command_latency are not separated by these rows (they move the iteration "
                        f"in step, e.g. rows of one mode): kept ocs.check_in_rtt at the scenario's "
                        f"{time_text(start[0])} and fitted command_latency; add rows of the other mode")
        return solve([1], (start[0], x[1])), identified
    return x, identified


def fit_iterations(built: Built, rows: Sequence[TableRow], *, fit_delays: Sequence[float] | None = None,
                   source: str = "TABLE", progress: Callable[[str], None] | None = None) -> IterationCalibration:
    """Fit ``job.mfu`` to the electrical rows, then ``ocs.check_in_rtt`` and ``ocs.command_latency`` to the
    photonic rows at ``fit_delays`` (None: every row), and predict every row.

    Parameters
    ----------
    built : the scenario (a model, not a trace); its policy (``ocs`` knobs) runs every photonic row, in the row's
        mode.
    rows : :func:`parse_iteration_table`'s rows.
    fit_delays : OCS delays (seconds) whose photonic rows the fit uses; electrical rows are always used (for mfu).
        Each must be a delay of the table.
    progress : called once per simulation.

    Notes
    -----
    mfu first, from the electrical rows alone (their iteration does not depend on the control plane): a bounded
    search over log(mfu) in [0.001, 1] (grid, then Brent). Then the two control-plane costs with that mfu: a
    linear first guess, a coarse grid and ``least_squares`` (see :func:`_fit_control`). Both minimise the sum of
    squared relative errors. A parameter the rows do not identify keeps the scenario's value and is named in
    ``warnings``.

    Raises
    ------
    ScenarioError : a delay in ``fit_delays`` that no photonic row has (field ``fit_delays``); a trace scenario.
    """
    import numpy as np

    if built.job is None:
        raise ScenarioError("calibration needs a model, and the scenario gives a trace", field="workload",
                            fix="give a scenario with model and job sections")
    photonic = [r for r in rows if r.mode != "electrical"]
    if fit_delays is None:
        in_fit = {id(r) for r in photonic}
    else:
        present = sorted({r.delay_s for r in photonic})
        in_fit = set()
        for d in fit_delays:
            matched = [r for r in photonic if abs(r.delay_s - d) <= SAME_DELAY * max(d, 1e-12)]
            if not matched:
                have = ", ".join(time_text(p) for p in present) or "none (no photonic rows)"
                raise ScenarioError(f"no photonic row at {time_text(d)}", field="fit_delays",
                                    fix=f"name delays of the table: {have}")
            in_fit |= {id(r) for r in matched}
    used = [r.mode == "electrical" or id(r) in in_fit for r in rows]
    model = _Model(built, progress)
    warnings: list[str] = []
    job, fabric = built.job, built.fabric
    start = {"mfu": job.mfu, "check_in_rtt_s": fabric.check_in_rtt, "command_latency_s": fabric.command_latency}
    electrical = [r.measured_s for r in rows if r.mode == "electrical"]
    if electrical:
        mfu, mfu_known = _fit_mfu(model, electrical, job.mfu, warnings)
    else:
        mfu, mfu_known = job.mfu, False
        warnings.append(f"mfu is not identified: the table has no electrical row; kept the scenario's job.mfu "
                        f"{job.mfu:g}")
    fit_rows = [r for r, u in zip(rows, used, strict=True) if u and r.mode != "electrical"]
    if fit_rows:
        (rtt, command), known = _fit_control(model, mfu, fit_rows, (fabric.check_in_rtt, fabric.command_latency),
                                             warnings)
    else:
        rtt, command, known = fabric.check_in_rtt, fabric.command_latency, dict.fromkeys(_CONTROL, False)
        warnings.append("check_in_rtt and command_latency are not identified: no photonic row in the fit; kept the "
                        f"scenario's {time_text(rtt)} and {time_text(command)}")
    out = []
    for r, u in zip(rows, used, strict=True):
        predicted = model.electrical(mfu) if r.mode == "electrical" else model.photonic(mfu, r.mode, r.delay_s, rtt,
                                                                                          command)
        out.append({"line": r.line, "mode": r.mode, "delay_s": r.delay_s, "measured_s": r.measured_s,
                    "predicted_s": predicted, "relative_error": predicted / r.measured_s - 1, "used_in_fit": u})

    def rms(selected) -> float | None:
        errors = [row["relative_error"] for row in selected]
        return float(np.sqrt(np.mean(np.square(errors)))) if errors else None

    errors = {"out_of_fit": rms(r for r in out if not r["used_in_fit"]),
              "in_fit": rms(r for r in out if r["used_in_fit"]), "all": rms(out)}
    if errors["out_of_fit"] is not None and errors["out_of_fit"] > RMS_GOAL:
        warnings.append(f"the out-of-fit rows miss by {errors['out_of_fit']:.1%} rms (above {RMS_GOAL:.0%}): the "
                        "model does not describe this testbed well; check the scenario's hardware and policy")
    return IterationCalibration(
        scenario=built.scenario.name, source=source,
        fitted={"mfu": mfu, "check_in_rtt_s": rtt, "command_latency_s": command}, scenario_values=start,
        identified={"mfu": mfu_known, **known}, rows=out, rms_relative_error=errors,
        fit_delays_s=None if fit_delays is None else [float(d) for d in fit_delays],
        policy=built.policy.label.split(" ", 1)[1],
        method="mfu: grid + bounded Brent on log(mfu); control plane: linear guess + 4x4 grid + least_squares "
               "(trf, bounds >= 0, diff_step 1%); relative error",
        simulations=model.simulations, warnings=warnings)
