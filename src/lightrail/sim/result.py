"""What a simulated iteration reports (:func:`lightrail.sim.iteration.simulate_iteration`): its time, where the
time went, the switches per rail, and the trace events; the engine that produces it lives in ``iteration.py``."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from lightrail.control.plan import Plan, Policy

__all__ = ["TraceEvent", "IterationResult"]


@dataclass(frozen=True)
class TraceEvent:
    track: str
    name: str
    category: str
    start: float
    duration: float


@dataclass
class IterationResult:
    """Time and breakdown of a steady-state iteration; per-stage and per-rail detail."""

    fabric: str
    policy: str
    iteration_time_s: float
    compute_s: float
    communication_s: float
    reconfiguration_s: float
    bubble_s: float
    reconfigurations_per_rail: list[int]
    events: list[TraceEvent] = field(repr=False, default_factory=list)
    stages: list[dict] = field(repr=False, default_factory=list)
    control_s: float = 0.0
    """Time a stage waits for controller round trips (check-ins), mean over stages."""
    controller_round_trips_per_iteration: float = 0.0
    """Check-ins per rank per iteration (every rank of a stage checks in for its groups), mean over ranks."""
    controller_requests_per_iteration: float = 0.0
    """Messages per rank per iteration to the controller, as the runtime counts them (``Agent.stats``): an acquire
    per check-in, a release after each op without leases, an ack per lease revoked, a prepare per new
    configuration in provisioned mode; mean over ranks."""
    plan: Plan | None = field(repr=False, default=None)
    group_reconfigurations_per_rail: list[int] = field(default_factory=list)
    """Per rail, the reconfigurations as a runtime's controller counts them: one per group whose circuits a switch
    changes (the pipeline pairs, the DP rings of the stage that asked), where ``reconfigurations_per_rail``
    counts one per stage's switch."""
    same_without_drain: bool = field(default=False, repr=False)
    """A run on rails that drain before switching (``fabric.drain``) whose switches never waited for that: the run
    on the same rails without draining is this one."""
    same_with_skip_present: bool = field(default=False, repr=False)
    """A whole-switch run without ``skip_present`` that never rewrote a rail whose op's circuits were all there:
    the run with ``skip_present`` on is this one (:meth:`with_policy`)."""

    @property
    def reconfigurations_per_iteration(self) -> float:
        """Mean reconfigurations of one rail switch per iteration."""
        return float(np.mean(self.reconfigurations_per_rail)) if self.reconfigurations_per_rail else 0.0

    @property
    def group_reconfigurations_per_iteration(self) -> float:
        """:attr:`group_reconfigurations_per_rail`'s mean."""
        return float(np.mean(self.group_reconfigurations_per_rail)) if self.group_reconfigurations_per_rail else 0.0

    def with_policy(self, policy: Policy) -> IterationResult:
        """This run as the run of ``policy`` (named and planned by it), for a policy that decides alike."""
        plan = replace(self.plan, policy=policy) if self.plan is not None else None
        return replace(self, policy=policy.label if plan is not None else self.policy, plan=plan)

    def summary(self) -> dict:
        return {
            "fabric": self.fabric, "policy": self.policy, "iteration_time_s": self.iteration_time_s,
            "compute_s": self.compute_s, "communication_s": self.communication_s,
            "reconfiguration_s": self.reconfiguration_s, "control_s": self.control_s, "bubble_s": self.bubble_s,
            "reconfigurations_per_iteration": self.reconfigurations_per_iteration,
            "reconfigurations_per_rail": self.reconfigurations_per_rail,
            "controller_round_trips_per_iteration": self.controller_round_trips_per_iteration,
            "controller_requests_per_iteration": self.controller_requests_per_iteration,
        }
