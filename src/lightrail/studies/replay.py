"""A recorded workload (a Chakra trace named by the scenario) replayed on the scenario's electrical rails."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightrail.sim.replay import RailsCost, ReplayResult, replay

if TYPE_CHECKING:
    from lightrail.scenario import Built

__all__ = ["TraceRun", "simulate_trace", "TIMELINE_RANKS"]

TIMELINE_RANKS = 256
"""Ranks whose events the Perfetto timeline keeps (the first ones): a 2,048-rank trace's 1.4 million events
would not load in a browser, and cost gigabytes to hold."""


@dataclass(frozen=True, kw_only=True)
class TraceRun:
    """One iteration of the trace: the scenario, the trace's shape and the replay's times."""

    scenario: str
    source: str
    ranks: int
    ops: dict[str, int]
    fabric: str
    result: ReplayResult = field(repr=False)

    def rows(self) -> list[dict]:
        """One row per rank."""
        return list(self.result.per_rank)

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "workload": "chakra", "source": self.source, "ranks": self.ranks,
                "ops": self.ops, "fabric": self.fabric, **self.result.summary(), "per_rank": self.rows()}


def simulate_trace(built: Built) -> TraceRun:
    """Replay ``built.trace`` on electrical rails of the scenario's NIC/NVLink rates, latency and alpha.

    Photonic rails need the phase of every op (its parallelism dimension), which a trace's process groups
    do not name, so traces run on the electrical baseline only."""
    trace = built.trace
    if trace is None:
        raise ValueError("the scenario has no trace")
    cost = RailsCost(trace.world, built.fabric, built.scenario.cluster.gpus_per_server)
    result = replay(trace, cost.collective, cost.transfer, record=TIMELINE_RANKS)
    return TraceRun(scenario=built.scenario.name, source=trace.source, ranks=trace.world, ops=trace.ops(),
                    fabric="electrical", result=result)
