"""A recorded workload (a Chakra trace named by the scenario) replayed on the scenario's network: electrical rails
by default, or the topology it names (``cluster.topology``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightrail.sim.costs import FabricCost
from lightrail.sim.replay import ReplayResult, replay

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
    """``electrical`` (rails), else the topology's kind (``ring``, ``switch``, ``torus2d``, ``fat-tree``, ...)."""
    topology: str = "rails"
    """The built network's name, e.g. ``ring(n=8)``, ``rails(n=16,g=8,pxn)``."""
    sharing: str = "fair"
    result: ReplayResult = field(repr=False)

    def rows(self) -> list[dict]:
        """One row per rank."""
        return list(self.result.per_rank)

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "workload": "chakra", "source": self.source, "ranks": self.ranks,
                "ops": self.ops, "fabric": self.fabric, "topology": self.topology, "sharing": self.sharing,
                **self.result.summary(), "per_rank": self.rows()}


def simulate_trace(built: Built) -> TraceRun:
    """Replay ``built.trace`` on the scenario's network (``built.topology``: electrical rails of its NIC/NVLink
    rates by default, or a ring, switch, torus or fat tree of links at the rail rate), with its latency per hop,
    alpha, engine terms (endpoint delay, local memory rate) and link sharing among ops in flight.

    Photonic rails need the phase of every op (its parallelism dimension), which a trace's process groups
    do not name, so traces run on static fabrics only."""
    trace = built.trace
    if trace is None:
        raise ValueError("the scenario has no trace")
    c = built.scenario.cluster
    on_rails = built.scenario.topology_kind == "rails"  # FabricCost's own rails: collectives as NCCL runs them
    cost = FabricCost(trace.world, built.fabric, c.gpus_per_server, topology=None if on_rails else built.topology,
                      terms=built.engine, gpu=built.gpu)
    sharing = built.fabric.sharing
    result = replay(trace, cost.collective, cost.transfer, record=TIMELINE_RANKS, sharing=sharing)
    kind = built.scenario.topology_kind
    name = built.topology.name if built.topology is not None else f"{kind}(n={trace.world})"
    return TraceRun(scenario=built.scenario.name, source=trace.source, ranks=trace.world, ops=trace.ops(),
                    fabric="electrical" if kind == "rails" else kind, topology=name, sharing=sharing,
                    result=result)
