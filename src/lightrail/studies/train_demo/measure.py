"""End to end: train the demo job on plain gloo, then on emulated photonic rails through the
lightrail backend and a real controller process, and set the measurement beside the simulator's
prediction for the same job.

The controller gets one emulated OCS per rail (``gpus_per_server`` rails, one port per server);
servers hold ``gpus_per_server`` ranks (default: the TP degree, so TP stays inside a server, as on
an NVLink server, and DP / PP cross the rails).
"""

from __future__ import annotations

import bisect
import functools
import os
import secrets
import signal
import statistics
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import NamedTuple

from lightrail.control.plan import Mode, Policy
from lightrail.errors import ScenarioError
from lightrail.runtime import torch_backend
from lightrail.runtime.controller.process import (  # the controller-process helpers lived here: old paths work
    FAILING,
    IDLE,
    RECOVERED,
    RESTARTING,
    ControllerKiller,
    ControllerPauser,
    _before_failure,
    _metrics,
    _reached,
    register_job,
    start_controller,
)
from lightrail.runtime.launch import process_context
from lightrail.studies.train_demo import DemoConfig, FailoverRun, Failure, run_demo, run_failover_demo
from lightrail.studies.train_demo.prediction import (  # the prediction lived here: old paths work
    DEMO_POLICY,
    Prediction,
    calibrated_peak_tflops,
    demo_plan,
    host_cores,
    measured_control,
    predicted_overhead,
)
from lightrail.web import require_service

__all__ = ["start_controller", "register_job", "ControllerKiller", "ControllerPauser", "run_photonic_demo",
           "predicted_overhead", "calibrated_peak_tflops", "Prediction", "PhotonicDemoResult", "Row", "IDLE",
           "RESTARTING", "FAILING", "RECOVERED"]


class Row(NamedTuple):
    """One row of the train-demo comparison: a quantity on gloo, on the lightrail backend, in ``simulate``."""

    what: str
    unit: str
    """``s`` (a time) or ``1`` (a count)."""
    gloo: float | None
    lightrail: float | None
    simulate: float | None
    relative: float | None = None
    """The lightrail value as a fraction of the gloo iteration, where that says more (the overhead)."""


@dataclass(frozen=True)
class PhotonicDemoResult:
    """The train-demo: measured on gloo and on emulated photonic rails, beside ``simulate``'s prediction.

    ``to_dict()`` is the JSON ``lightrail train-demo --json`` prints and writes."""

    ranks: int
    tp: int
    pp: int
    dp: int
    steps: int
    gpus_per_server: int
    rails: int
    ocs_delay_s: float
    mode: Mode
    leases: bool
    gloo_iteration_s: float
    lightrail_iteration_s: float
    overhead_s: float
    """Measured: lightrail minus gloo median iteration."""
    overhead: float
    """``overhead_s`` as a fraction of the gloo iteration."""
    predicted_overhead_s: float
    model_to_measured_ratio: float | None
    """Measured over predicted overhead (None when the model predicts none)."""
    controller_requests_per_iteration: float
    """Per rank per iteration, the first (warm-up) left out."""
    ops_under_lease: float
    """Fraction of ops on groups with circuits that ran under a lease (no request)."""
    revocations_per_iteration: float
    reconfigurations_per_iteration: float
    """All rails together."""
    reconfigurations_per_rail_per_iteration: float
    request_latency_p50_s: float | None
    request_latency_p99_s: float | None
    acquire_wait_p99_s: float | None
    unsafe_reconfigurations: float
    losses_identical: bool
    losses: tuple[float, ...]
    lightrail_losses: tuple[float, ...]
    gloo_iteration_series_s: tuple[float, ...]
    lightrail_iteration_series_s: tuple[float, ...]
    measurement: str
    predicted: Prediction
    controller_startup_s: float | None
    controller_restarts: int = 0
    """Times the controller was killed (SIGKILL) and started again mid-training (``--kill-controller-at-step``);
    its in-memory counters (grants, revocations, latencies) restart from zero each time."""
    spares: int = 0
    """Idle spare processes the job started with (``--spares``)."""
    recovery: dict | None = None
    """With ``--kill-rank``: ``detect_s``, ``rewire_s``, ``rebuild_s``, ``restore_s``, ``first_step_s`` (from the
    kill), ``steps_lost``, ``checkpoint_step``, ``losses_match_uninterrupted`` (the losses after the checkpoint
    are the plain run's, bit for bit), ``rank``, ``spare``, ``detected_by``; None without a kill."""
    wrapper_overhead_s: float | None = None
    """The lightrail process group with no controller (a third replica, taking turns with the two) less gloo: the
    runtime's own cost, no circuit and no request in it; None in the runs with spares."""
    fabric_overhead_s: float | None = None
    """``overhead_s`` less ``wrapper_overhead_s``: what the circuits and the controller cost, the part the model
    predicts."""
    fabric_model_to_measured_ratio: float | None = None
    """``fabric_overhead_s`` over the predicted overhead."""
    grant_wait_s: Mapping[str, Mapping[str, float]] | None = None
    """Per pipeline stage (``"0"``, ``"1"``, ...) and phase (``pp``, ``dp``, ...), the time a rank waits for its
    groups' grants per iteration (:func:`grant_waits`): where the fabric's overhead shows."""
    controller_pauses: int = 0
    """Times the controller was frozen (SIGSTOP, ``--pause-controller-at-step``) and continued."""
    failovers: float = 0.0
    """Failovers to a spare, summed over the controller's incarnations (its persisted counter)."""

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["mode"] = self.mode.value
        for name in ("losses", "lightrail_losses", "gloo_iteration_series_s", "lightrail_iteration_series_s"):
            out[name] = list(out[name])
        out["predicted"] = self.predicted.to_dict()
        return out

    def rows(self) -> list[Row]:
        """The comparison table: iteration, overhead, reconfigurations per rail, controller requests."""
        p = self.predicted
        return [Row("iteration (median)", "s", self.gloo_iteration_s, self.lightrail_iteration_s, p.iteration_s),
                Row("overhead per iteration", "s", None, self.overhead_s, p.overhead_s, relative=self.overhead),
                Row("reconfigurations / rail / iteration", "1", None, self.reconfigurations_per_rail_per_iteration,
                    p.reconfigurations_per_rail_per_iteration if p.group_reconfigurations_per_rail_per_iteration is None
                    else p.group_reconfigurations_per_rail_per_iteration),  # counted per group, as the controller
                Row("controller requests / rank / iteration", "1", None, self.controller_requests_per_iteration,
                    p.controller_requests_per_iteration if p.controller_requests_per_iteration is not None
                    else p.controller_round_trips_per_iteration)]


_BLOCK = 5
"""Steps per block when the gloo and lightrail replicas alternate."""


BARE = "lightrail-bare"
"""The backend of the controller-less lightrail replica (:func:`_setup_with_bare`)."""


def _setup_with_bare(config: torch_backend.BackendConfig) -> torch_backend.Agent:
    """Each worker's ``init``: the lightrail backend bound to the controller (returned: the run's agent), and
    :data:`BARE`, the same process group with no controller at all, for the wrapper's own cost."""
    torch_backend.register(torch_backend.Agent(replace(config, controller=None, token=None)), BARE)
    return torch_backend.setup(config)


def run_photonic_demo(config: DemoConfig, *, ocs_delay: float, policy: Policy = DEMO_POLICY,
                      gpus_per_server: int | None = None, workdir: Path | None = None,
                      progress=lambda what: None, kill_controller_at_step: int | Sequence[int] = (),
                      kill_controller_after_s: float | Sequence[float] = 0.0, spares: int = 0,
                      kill_rank: int | None = None, kill_at_step: int | None = None,
                      pause_controller_at_step: int | Sequence[int] = (), pause_for_s: float = 5.0,
                      ) -> PhotonicDemoResult:
    """Train on gloo, then on the lightrail backend with a controller at ``ocs_delay`` seconds; compare with
    ``simulate`` for the same job, its compute calibrated on the gloo run. ``policy`` (mode, leases) is
    planned once (:func:`demo_plan`); the backend and the prediction execute that one Plan.

    ``kill_controller_at_step`` (one step or several, ascending): once rank 0 has completed that many steps
    of the lightrail replica (and ``kill_controller_after_s`` more seconds, one value or one per kill), the
    controller is killed (SIGKILL) and started again on the same state file and ports; the ranks reconnect
    and training goes on (``controller_restarts`` counts the restarts; the losses must still be gloo's).

    ``spares`` idle spare processes join the job (LUMION's spare accelerators, one port per rail each);
    ``kill_rank`` is killed (SIGKILL) at the start of step ``kill_at_step``: the controller moves its circuits
    to a spare, the ranks rebuild their groups and resume from the checkpoint a DP peer holds in memory, and
    ``recovery`` reports the timeline (see ``train_demo.Recovery``), the losses compared with a plain gloo run
    of the same job (the gloo replica does not alternate with this one: a failure would stop both).

    Both together: the failover run reports its steps to the controller killer too, and the two take turns
    (see IDLE...RECOVERED): a rank dies only once no restart is under way and every process reconnected, and
    a kill that falls due during a failover waits until rank 0 completed the failed step again. A kill may come
    before ``kill_at_step`` too: the ranks' requests still on the wire when the failover push reaches them are
    given back (``ControllerClient.interrupt``), so a hold from before the restart's resync does not hold the
    rebuilt job's first round.

    ``pause_controller_at_step`` (one step or several, ascending): once rank 0 completed that many steps, the
    controller is frozen (SIGSTOP) for ``pause_for_s`` seconds and continued (:class:`ControllerPauser`); no
    rank may fail for it (``controller_pauses``, ``failovers``)."""
    g = gpus_per_server or config.tp
    if g < 1 or config.world % g:
        raise ScenarioError(f"{config.world} ranks do not fill servers of {g}", field="--gpus-per-server",
                            fix=f"use a divisor of {config.world}")
    kills, after_s = _kills(config, kill_controller_at_step, kill_controller_after_s)
    pauses = _pauses(config, pause_controller_at_step, pause_for_s)
    failure = _failure(config, spares, kill_rank, kill_at_step)
    require_service("fastapi", "uvicorn", "httpx")  # the controller's admin API, read here: fail before training
    plan = demo_plan(config, gpus_per_server=g, policy=policy)  # the one Plan: the runtime's and the model's
    layout = plan.layout
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(workdir or tmp) / "controller.db"
        operator = secrets.token_urlsafe(32)  # the admin API's; the same after a restart
        start = functools.partial(start_controller, state, rails=g, ports=layout.servers + spares, ocs_delay=ocs_delay,
                                  operator_token=operator)
        proc, info = start()
        killer = None
        try:
            token = register_job(info["admin_port"], operator, "train-demo", config.world, spares)
            cpu_before = _cpu_s(proc.pid)  # the controller's CPU from here on is the training's
            # both in the same processes, in alternating blocks of steps, so they are timed under the
            # same load (separate runs of this 8-process job on 2 cores differ by up to 30%)
            progress("training on gloo and on emulated photonic rails, alternating" if failure is None and not spares
                     else "training on emulated photonic rails with spares, then on plain gloo")
            backend = torch_backend.BackendConfig(controller=f"127.0.0.1:{info['port']}", job="train-demo",
                                                  layout=layout, plan=plan, token=token)
            init = functools.partial(torch_backend.setup, backend)  # each worker's agent, from its argument
            reached = process_context().Value("i", 0)
            elastic = bool(spares or failure is not None)  # ranks and idle spares; a rank killed; no alternating
            gate = process_context().Value("i", IDLE) if elastic and kills else None
            killer = ControllerKiller(proc, info, functools.partial(start, restart=True), kills, after_s, reached,
                                      gate=gate, failure_step=None if failure is None else failure.step,
                                      processes=config.world + spares)
            on_step = functools.partial(_reached, reached) if kills or pauses else None
            pauser = ControllerPauser(lambda: killer.proc, pauses, pause_for_s, reached)
            with killer, pauser:
                if elastic:
                    photonic = run_failover_demo(
                        config, spares=spares, failure=failure, backend="lightrail", init=init, on_step=on_step,
                        before_failure=None if gate is None or failure is None else functools.partial(
                            _before_failure, gate))
                else:  # a third replica: the lightrail process group with no controller (the wrapper's own cost)
                    photonic = run_demo(config, backend="lightrail", init=functools.partial(_setup_with_bare, backend),
                                        baseline=("gloo", BARE), block=_BLOCK, on_step=on_step)
            for thread in (killer, pauser):
                if thread.error is not None:
                    raise thread.error
            proc, info = killer.proc, killer.info
            plain = run_demo(config).main if isinstance(photonic, FailoverRun) else photonic.baseline
            metrics = _metrics(info["admin_port"])
            cpu_after = _cpu_s(proc.pid) if killer.restarts == 0 else None  # a restarted one counted from zero
        finally:
            proc = killer.proc if killer is not None else proc
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # frozen (SIGSTOP) or hung: it must not hide the job's own error
                proc.kill()
                proc.wait(30)
    progress("simulating the same job")
    stats = [r.get("controller", {}) for r in photonic.ranks]
    round_trips = sorted(s for st in stats for s in st.get("request_s", []))
    rtt_p50 = round_trips[len(round_trips) // 2] if round_trips else None
    cores = host_cores()  # 8 processes on them: the model computes under processor sharing, as they did
    peak = calibrated_peak_tflops(config, gpus_per_server=g, iteration_s=plain.median_iteration_s, host_cores=cores)
    predicted = predicted_overhead(config, gpus_per_server=g, ocs_delay=ocs_delay, plan=plan, peak_tflops=peak,
                                   control=measured_control(metrics, round_trips, leases=plan.leases),
                                   host_cores=cores, host_work_s=_host_work(photonic, config, cpu_before, cpu_after))
    reconfigs = sum(v for k, v in metrics.items() if k.startswith("lightrail_reconfigurations_total"))
    # requests per rank per iteration, the first (warm-up: groups declared, sequence learned) left out;
    # all of the rank's requests count (acks of revokes can arrive while the gloo replica trains)
    per_rank = [(st["requests"] - st["requests_per_step"][0]) / max(1, config.steps - 1) for st in stats
                if st.get("requests_per_step")]
    ops = sum(st.get("ops", 0) for st in stats)
    main = photonic.main
    identical = plain.loss_bits == main.loss_bits and plain.losses_consistent and main.losses_consistent
    measured_overhead = main.median_iteration_s - plain.median_iteration_s
    bare = None if isinstance(photonic, FailoverRun) else next(iter(photonic.others), None)
    wrapper = None if bare is None else bare.median_iteration_s - plain.median_iteration_s
    return PhotonicDemoResult(
        ranks=config.world, tp=config.tp, pp=config.pp, dp=config.dp, steps=config.steps,
        gpus_per_server=g, rails=g, ocs_delay_s=ocs_delay, mode=plan.mode, leases=plan.leases,
        gloo_iteration_s=plain.median_iteration_s,
        lightrail_iteration_s=main.median_iteration_s,
        overhead_s=measured_overhead,
        overhead=measured_overhead / plain.median_iteration_s,
        predicted_overhead_s=predicted.overhead_s,
        model_to_measured_ratio=measured_overhead / predicted.overhead_s if predicted.overhead_s > 0 else None,
        controller_requests_per_iteration=statistics.fmean(per_rank) if per_rank else 0.0,
        ops_under_lease=sum(st.get("under_lease", 0) for st in stats) / ops if ops else 0.0,
        revocations_per_iteration=metrics.get("lightrail_revocations_total", 0.0) / config.steps,
        reconfigurations_per_iteration=reconfigs / config.steps,
        reconfigurations_per_rail_per_iteration=reconfigs / config.steps / g,
        request_latency_p50_s=rtt_p50,
        request_latency_p99_s=round_trips[min(len(round_trips) - 1, int(0.99 * len(round_trips)))]
        if round_trips else None,
        acquire_wait_p99_s=metrics.get('lightrail_acquire_latency_seconds{quantile="0.99"}'),
        unsafe_reconfigurations=metrics.get("lightrail_unsafe_reconfigurations_total", 0.0),
        losses_identical=bool(identical),
        losses=plain.losses, lightrail_losses=main.losses,
        gloo_iteration_series_s=plain.iteration_s, lightrail_iteration_series_s=main.iteration_s,
        measurement=(f"gloo, lightrail and controller-less lightrail replicas in the same processes, taking turns "
                     f"in blocks of {_BLOCK} steps; medians leave out the first step of each block")
        if not isinstance(photonic, FailoverRun) else
        "lightrail (ranks and spares) and plain gloo in separate runs; medians leave out the first step",
        predicted=predicted,
        controller_startup_s=info.get("startup_s"),
        controller_restarts=killer.restarts,
        controller_pauses=pauser.pauses,
        failovers=metrics.get("lightrail_failovers_total", 0.0),
        spares=spares,
        recovery=_recovery(photonic, plain),
        wrapper_overhead_s=wrapper,
        fabric_overhead_s=None if wrapper is None else measured_overhead - wrapper,
        fabric_model_to_measured_ratio=None if wrapper is None or predicted.overhead_s <= 0 else
        (measured_overhead - wrapper) / predicted.overhead_s,
        grant_wait_s=None if bare is None else grant_waits(photonic.ranks, set(range(0, config.steps, _BLOCK))),
    )


def _host_work(run, config: DemoConfig, before: float | None, after: float | None) -> float | None:
    """CPU seconds per lightrail iteration the control plane took from the host's cores: the controller's (its
    process's CPU over the training, per lightrail step; the other replicas' turns cost it only heartbeats) and
    the ranks' clients' (per rank, its CPU per lightrail step less per step of the controller-less replica, which
    runs the same wrapper: what the requests, the reader thread and the waits cost; steps left out of the medians
    left out here too). None without a measurement (not Linux, a controller restart, runs with spares)."""
    if None in (before, after) or isinstance(run, FailoverRun) or not run.others:
        return None
    kept = [k for k in range(config.steps) if k % _BLOCK]
    clients = 0.0
    for rank in run.ranks:
        bare = rank.get("baselines", [None, None])[-1]
        if not rank.get("cpu_s") or not bare or not bare.get("cpu_s"):
            return None
        clients += statistics.fmean(rank["cpu_s"][k] for k in kept) - statistics.fmean(bare["cpu_s"][k] for k in kept)
    return (after - before) / config.steps + max(0.0, clients)  # a difference of noisy means: never below 0


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` used so far (Linux ``/proc``; None elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def grant_waits(ranks: Sequence[dict], skip: set[int]) -> dict[str, dict[str, float]]:
    """Per pipeline stage and phase, the seconds a rank waits for its groups' grants in an iteration, from the ranks'
    op timelines (``train_worker``'s ``timeline``, ``step_start_s``): the median over the steps not in ``skip`` of
    the mean over the stage's ranks.

    An acquire is its group's barrier, so the wait includes waiting for the group's other members (what gloo waits
    inside the op, a receive for its send): compare stages, and phases, with the model's, not their sum with the
    overhead. The stage that starts and ends the iteration (the first, under GPipe) is where a switch that compute
    did not hide shows."""
    per: dict[str, dict[str, list[list[float]]]] = {}  # stage -> phase -> per rank, per step
    for result in ranks:
        starts = result.get("step_start_s") or []
        waits: dict[str, list[float]] = {}
        for key, rails, start, granted, _ in result.get("timeline") or []:
            step = bisect.bisect_right(starts, start) - 1
            if rails and step >= 0:
                waits.setdefault(key.split(":")[0], [0.0] * len(starts))[step] += granted - start
        for phase, series in waits.items():
            per.setdefault(str(result["stage"]), {}).setdefault(phase, []).append(series)

    def typical(series: list[list[float]]) -> float:
        steps = range(len(series[0]))
        kept = [k for k in steps if k not in skip] or list(steps)
        return statistics.median(statistics.fmean(rank[k] for rank in series) for k in kept)

    return {stage: {phase: typical(series) for phase, series in sorted(phases.items())}
            for stage, phases in sorted(per.items())}


def _failure(config: DemoConfig, spares: int, rank: int | None, step: int | None) -> Failure | None:
    """``--kill-rank`` and ``--kill-at-step`` (both or neither), checked with ``--spares`` before any work."""
    if isinstance(spares, bool) or not isinstance(spares, int) or not 0 <= spares <= 64:
        raise ScenarioError(f"--spares {spares!r} must be an integer in 0..64", field="--spares")
    if (rank is None) != (step is None):
        given, missing = ("--kill-rank", "--kill-at-step") if step is None else ("--kill-at-step", "--kill-rank")
        raise ScenarioError(f"{given} needs {missing}", field=missing, fix="give both, e.g. --kill-rank 3 "
                                                                           "--kill-at-step 10")
    if rank is None:
        return None
    if (spares or rank is not None) and config.dp < 2:
        raise ScenarioError("a spare restores the failed rank's state from a DP replica, and --dp is 1",
                            field="--dp", fix="use --dp 2 or more with --spares and --kill-rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < config.world:
        raise ScenarioError(f"--kill-rank {rank!r} is not a rank of {config.world}", field="--kill-rank",
                            fix=f"use 0..{config.world - 1}")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < config.steps:
        raise ScenarioError(f"--kill-at-step {step!r} is not a step of {config.steps}", field="--kill-at-step",
                            fix=f"use 0..{config.steps - 1}")
    return Failure(rank, step)


def _recovery(run, plain) -> dict | None:
    """The first failover's timeline, with the loss curve after its checkpoint compared, bit for bit, with the
    uninterrupted plain run's."""
    if not isinstance(run, FailoverRun) or not run.recoveries:
        return None
    first = run.recoveries[0].to_dict()
    after = first["checkpoint_step"] + 1
    match = run.main.loss_bits[after:] == plain.loss_bits[after:] and len(run.main.loss_bits) == len(plain.loss_bits)
    return {**first, "losses_match_uninterrupted": bool(match)}


def _steps(config: DemoConfig, at: int | Sequence[int], *, what: str, flag: str) -> tuple[int, ...]:
    """The steps at which to ``what`` (kill, pause) the controller, as an ascending tuple inside the run."""
    at = (at,) if isinstance(at, int) else tuple(at)
    for s in at:
        if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s < config.steps:
            raise ScenarioError(f"cannot {what} the controller at step {s!r} of {config.steps}", field=flag,
                                fix=f"a step in 1..{config.steps - 1}")
    if list(at) != sorted(at):
        raise ScenarioError(f"{what} steps {list(at)} are not in order", field=flag,
                            fix="give the steps in ascending order")
    return at


def _kills(config: DemoConfig, at: int | Sequence[int], after_s: float | Sequence[float]):
    """``kill_controller_at_step`` and ``kill_controller_after_s`` as equal-length tuples, checked."""
    at = _steps(config, at, what="kill", flag="--kill-controller-at-step")
    after_s = (after_s,) * len(at) if isinstance(after_s, int | float) else tuple(after_s)
    if len(after_s) != len(at) or not all(isinstance(a, int | float) and 0 <= a < 60 for a in after_s):
        raise ScenarioError(f"kill_controller_after_s {after_s!r}: one delay (0..60 s) per kill",
                            field="kill_controller_after_s")
    return at, tuple(float(a) for a in after_s)


def _pauses(config: DemoConfig, at: int | Sequence[int], pause_s: float) -> tuple[int, ...]:
    """``pause_controller_at_step`` as a tuple of steps, checked with ``pause_for_s``."""
    at = _steps(config, at, what="pause", flag="--pause-controller-at-step")
    if isinstance(pause_s, bool) or not isinstance(pause_s, int | float) or not 0 < pause_s <= 600:
        raise ScenarioError(f"--pause-for {pause_s!r} s must be more than 0 and at most 600 s", field="--pause-for",
                            fix="e.g. --pause-for 5s")
    return at
