"""What a replayed trace's communication costs on a static fabric: one step engine over one topology.

:class:`FabricCost` prices a collective on a group of GPUs, or a point-to-point transfer, as the step engine
(:class:`lightrail.timing.Engine`) times it, and says which links the op keeps busy for how long
(a :class:`lightrail.sharing.OpCost`), so the replay can share links among ops in flight. The fabric is
electrical rails by default (a rail-optimized cluster of the scenario's NIC and NVLink rates) or any topology
:func:`lightrail.fabric.builders.build_topology` builds (ring, switch, torus, fat tree), with the link rate
the scenario gives; ASTRA-sim's microbenchmarks run on its ring and switch this way.

On rails (no ``topology``) with ``fabric.collectives == "nccl"`` (the default) a collective runs as NCCL runs it
(:func:`lightrail.nccl_cost.nccl_op_cost`): NCCL's algorithm, protocol and time at its size, on the links the
engine charges the matching lightrail schedule. On the other topologies (ring, switch, torus, fat tree: ASTRA-sim's
world, where no NCCL runs) and with ``collectives: schedules`` the engine times the registry's schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.fabric.params import RailFabric
from lightrail.fabric.topology import Topology
from lightrail.sharing import OpCost
from lightrail.workload.chakra import TraceNode
from lightrail.workload.hardware import GPU, GPUS

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
    gpu : the GPU, for NCCL's model on rails (its class, and whether its NVSwitch runs NVLS); default: the preset
        whose NVLink rate is the fabric's (H100 at 450 GB/s, A100 at 300, B200 at 900), else a Hopper without NVLS.

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
                 topology: Topology | None = None, terms: EngineTerms | None = None, gpu: GPU | None = None):
        self.world, self.fabric = world, fabric
        self.gpus_per_server = gpus_per_server
        self.topology = topology
        self.terms = EngineTerms() if terms is None else terms
        self.gpu = gpu
        self._engine_obj = None
        self._cache: dict = {}
        self.choices: dict[tuple, tuple[str, str]] = {}
        """NCCL's (algorithm, protocol) per priced collective, keyed by (kind, group, bytes)."""

    @property
    def nccl(self) -> bool:
        """Collectives run as NCCL runs them: on rails (no ``topology``) with ``fabric.collectives == "nccl"``."""
        return self.topology is None and self.fabric.collectives == "nccl"

    @property
    def _gpus_per_server(self) -> int:
        from lightrail.fabric.builders import GPUS_PER_SERVER

        return GPUS_PER_SERVER if self.gpus_per_server is None else self.gpus_per_server

    @property
    def _engine(self):
        """Built on first use: a one-rank trace has no network."""
        if self._engine_obj is None:
            from lightrail.timing import Engine

            topology = self.topology
            if topology is None:
                from lightrail.fabric.builders import rails

                f = self.fabric
                g = self._gpus_per_server
                topology = rails(self.world, gpus_per_server=g, nic_bandwidth=f.nic_bandwidth,
                                 nvlink_bandwidth=f.nvlink_bandwidth, latency=f.latency, routing=f.routing)
            self._engine_obj = Engine(topology, alpha=self.fabric.alpha, endpoint_delay=self.terms.endpoint_delay,
                                      local_mem_bw=self.terms.local_mem_bw)
        return self._engine_obj

    def collective(self, node: TraceNode, ranks: tuple[int, ...]) -> OpCost:
        """The node's collective on its group. On rails with ``collectives: nccl``: as NCCL runs it
        (:func:`lightrail.nccl_cost.nccl_op_cost`; a trace names no algorithm, so NCCL's tuner picks, and
        :attr:`choices` records its pick), on the links of the matching schedule. Otherwise the registry's
        ``auto`` schedule of the node's kind: each step's transfers mapped onto the group's GPUs, then timed and
        charged to links as :meth:`Engine.op_cost` does (endpoint delay and local-memory terms included). A
        one-rank group costs nothing."""
        key = ("c", node.kind, ranks, node.nbytes)
        if key not in self._cache:
            if len(ranks) < 2:
                self._cache[key] = OpCost(0.0)
            elif self.nccl:
                self._cache[key] = self._nccl(node, ranks, key)
            else:
                self._cache[key] = self._collective(node, ranks)
        return self._cache[key]

    def choice(self, node: TraceNode, ranks: tuple[int, ...]) -> tuple[str, str] | None:
        """NCCL's (algorithm, protocol) for the node on its group (None when the engine's schedule prices it)."""
        self.collective(node, ranks)
        return self.choices.get(("c", node.kind, ranks, node.nbytes))

    def _nccl(self, node: TraceNode, ranks: tuple[int, ...], key: tuple) -> OpCost:
        from lightrail.nccl_cost import communicator, nccl_op_cost

        gpu = self.gpu if self.gpu is not None else _gpu_of(self.fabric)
        comm = communicator(ranks, self._gpus_per_server, self.fabric, nvls=gpu.nvls, arch=gpu.arch)
        cost, choice = nccl_op_cost(node.kind, node.nbytes, comm,
                                    alone=lambda name: self._collective(node, ranks, name, comm.ppn))
        self.choices[key] = (str(choice.algorithm[0]), str(choice.protocol[0]))
        return cost

    def _collective(self, node: TraceNode, ranks: tuple[int, ...], name: str | None = None,
                    ppn: int | None = None) -> OpCost:
        """The engine's cost of schedule ``name`` (a registry name; None: ``auto``) of the node's kind on its
        group (``ppn``: the group's GPUs per server, for schedules that take ``gpus_per_server``)."""
        from lightrail.collectives.registry import AUTO, get, resolve
        from lightrail.timing import StepModel

        n = len(ranks)
        algorithm = get(node.kind, name) if name is not None else None
        if algorithm is None or not algorithm.supports(n):
            algorithm = resolve(node.kind, AUTO, n)
        extra = {"gpus_per_server": ppn} if ppn and "gpus_per_server" in algorithm.parameters else {}
        schedule = algorithm(n, **extra)
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


def _gpu_of(fabric: RailFabric) -> GPU:
    """The preset GPU whose NVLink rate is the fabric's, else a Hopper without NVLS."""
    for spec in GPUS.values():
        if spec.nvlink_bandwidth == fabric.nvlink_bandwidth:
            return spec
    return GPU(name="custom", peak_flops=1.0, memory_bytes=1.0, nvlink_bandwidth=fabric.nvlink_bandwidth,
               nic_bandwidth=fabric.nic_bandwidth)


RailsCost = FabricCost
"""The old name: with no ``topology``, a :class:`FabricCost` is on electrical rails
(``RailsCost(world, fabric, gpus_per_server)``)."""
