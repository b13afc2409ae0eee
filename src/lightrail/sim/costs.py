"""What a replayed trace's communication costs on a static fabric: one step engine over one topology.

:class:`FabricCost` prices a collective on a group of GPUs, or a point-to-point transfer, as the step engine
(:class:`lightrail.timing.Engine`) times it, and says which links the op keeps busy for how long
(a :class:`lightrail.sharing.OpCost`), so the replay can share links among ops in flight. The fabric is
electrical rails by default (a rail-optimized cluster of the scenario's NIC and NVLink rates) or any topology
:func:`lightrail.fabric.builders.build_topology` builds (ring, switch, torus, fat tree), with the link rate
the scenario gives; ASTRA-sim's microbenchmarks run on its ring and switch this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.fabric.params import RailFabric
from lightrail.fabric.topology import Topology
from lightrail.sharing import OpCost
from lightrail.workload.chakra import TraceNode

__all__ = ["EngineTerms", "FabricCost", "RailsCost"]


@dataclass(frozen=True, kw_only=True)
class EngineTerms:
    """The step engine's optional terms (``Engine(endpoint_delay=..., local_mem_bw=...)``; docs/astra-sim.md
    "Terms on"), both off by default."""

    endpoint_delay: float = 0.0
    """Seconds each step's data waits at its endpoints, charged once per step plus once for the collective's
    result (ASTRA-sim's ``endpoint-delay``)."""
    local_mem_bw: float | None = None
    """Bytes/s of the local memory a reduction streams through: a step reducing ``c`` chunks into a rank adds
    ``3 c chunk_bytes / local_mem_bw`` (ASTRA-sim's ``local-mem-bw``); None: not charged."""


class FabricCost:
    """Costs (:class:`OpCost`) of collectives and transfers among ``world`` GPUs on one fabric, from one step
    engine whose routes and step patterns every group shares; cached by (kind, group, bytes).

    Parameters
    ----------
    world : GPUs (endpoints 0 .. world-1; rank r on GPU r).
    fabric : rates, latency per hop, alpha and routing; the NIC rate is every link's rate on a ``topology``.
    gpus_per_server : servers of the rails built when no ``topology`` is given.
    topology : the network (its first ``world`` nodes the GPUs); default: electrical rails built from ``fabric``
        on first use (a one-rank trace has no network).
    terms : the engine's endpoint delay and local-memory terms (default: off).

    Examples
    --------
    Ring AllReduce of 4 GB on a ring of 4 GPUs with 1 GB/s links: ``2(p-1)/p · N/B`` = 6 s plus six start-ups:

    >>> from lightrail.fabric.builders import ring
    >>> from lightrail.fabric.params import RailFabric
    >>> from lightrail.workload.chakra import TraceNode
    >>> cost = FabricCost(4, RailFabric(alpha=1e-6), topology=ring(4, bandwidth=1e9))
    >>> node = TraceNode(id=0, name="ar", op="collective", kind="allreduce", nbytes=4e9)
    >>> cost.collective(node, (0, 1, 2, 3)).seconds
    6.000006
    """

    def __init__(self, world: int, fabric: RailFabric, gpus_per_server: int | None = None, *,
                 topology: Topology | None = None, terms: EngineTerms | None = None):
        self.world, self.fabric = world, fabric
        self.gpus_per_server = gpus_per_server
        self.topology = topology
        self.terms = EngineTerms() if terms is None else terms
        self._engine_obj = None
        self._cache: dict = {}

    @property
    def _engine(self):
        """Built on first use: a one-rank trace has no network."""
        if self._engine_obj is None:
            from lightrail.timing import Engine

            topology = self.topology
            if topology is None:
                from lightrail.fabric.builders import GPUS_PER_SERVER, rails

                f = self.fabric
                g = GPUS_PER_SERVER if self.gpus_per_server is None else self.gpus_per_server
                topology = rails(self.world, gpus_per_server=g, nic_bandwidth=f.nic_bandwidth,
                                 nvlink_bandwidth=f.nvlink_bandwidth, latency=f.latency, routing=f.routing)
            self._engine_obj = Engine(topology, alpha=self.fabric.alpha, endpoint_delay=self.terms.endpoint_delay,
                                      local_mem_bw=self.terms.local_mem_bw)
        return self._engine_obj

    def collective(self, node: TraceNode, ranks: tuple[int, ...]) -> OpCost:
        """The registry's ``auto`` schedule of the node's kind on its group: each step's transfers mapped onto
        the group's GPUs, then timed and charged to links as :meth:`Engine.op_cost` does (endpoint delay and
        local-memory terms included). A one-rank group costs nothing."""
        key = ("c", node.kind, ranks, node.nbytes)
        if key not in self._cache:
            self._cache[key] = self._collective(node, ranks) if len(ranks) > 1 else OpCost(0.0)
        return self._cache[key]

    def _collective(self, node: TraceNode, ranks: tuple[int, ...]) -> OpCost:
        from lightrail.collectives.registry import AUTO, generate
        from lightrail.timing import StepModel

        schedule = generate(node.kind, AUTO, len(ranks))
        gpus, engine = np.asarray(ranks), self._engine
        empty = StepModel(np.zeros(0), np.zeros(0))
        ptr = schedule.step_ptr
        # the group's profile: its steps as the engine models them on the group's GPUs (Engine.profile places
        # rank r on GPU r; a group's rank i is GPU ranks[i])
        profile = [engine.step_model(gpus[schedule.src[a:z]], gpus[schedule.dst[a:z]]) if z > a else empty
                   for a, z in zip(ptr[:-1], ptr[1:], strict=True)]
        return engine.op_cost(schedule, node.nbytes, profile=profile)

    def transfer(self, src: int, dst: int, nbytes: float) -> OpCost:
        """A send of ``nbytes`` from GPU ``src`` to GPU ``dst``: :meth:`Engine.transfer_cost` (one step, one
        alpha; no endpoint delay, as the engine's transfers)."""
        key = ("p", src, dst, nbytes)
        if key not in self._cache:
            self._cache[key] = self._engine.transfer_cost(np.array([src]), np.array([dst]), nbytes)
        return self._cache[key]


RailsCost = FabricCost
"""The old name: with no ``topology``, a :class:`FabricCost` is on electrical rails
(``RailsCost(world, fabric, gpus_per_server)``)."""
