"""How long each op of a Program takes on the rails alone, and which links it keeps busy: what the iteration
simulator (:mod:`lightrail.sim.iteration`) starts as a flow on the shared links."""

from __future__ import annotations

from math import prod

import numpy as np

from lightrail.control.opus import Requirement
from lightrail.fabric.builders import photonic_rails, rails
from lightrail.fabric.params import RailFabric
from lightrail.fabric.topology import NodeKind
from lightrail.sharing import OpCost
from lightrail.timing import Engine
from lightrail.workload.program import CollectiveOp, CommOp, Program, SendOp

__all__ = ["OpDurations"]


class OpDurations:
    """Seconds each op part takes on the fabric alone, and the links it keeps busy, from the engine; cached by
    op shape.

    With ``fabric.collectives == "nccl"`` (the default) a collective whose algorithm is ``auto`` runs as NCCL runs
    it (:mod:`lightrail.nccl_cost`): its time is NCCL's for one group (the op's groups run at once, and the
    engine's busy seconds already count them all), its links the engine's for the planner's schedule, their busy
    seconds scaled so that the bytes move in NCCL's time. On electrical rails NCCL's tuner picks the algorithm and
    protocol; on photonic and ideal rails the circuits are the planner's schedule (a ring for DP, CP and PP), so
    NCCL's ring is forced (its protocol still picked), except for a group inside one server (TP), which NCCL runs
    over NVLink as it likes (NVLS where the GPU has it). All-to-all and sends stay the engine's (NCCL runs them
    point to point; its tuner has no entry for them); ``collectives: schedules`` and named algorithms keep the
    engine's schedule.

    Independent of the switch's delay and the controller's latency, so runs that differ only in those
    (a delay sweep, the overhead breakdown) can share one."""

    CLASSES = 4
    """Link classes per (stage, rail): NVLink out, NVLink in, NIC out, NIC in."""

    def __init__(self, program: Program, fabric: RailFabric):
        self.layout = program.job.layout
        self.gpu = program.job.gpu
        self.fabric = fabric
        self._cache: dict = {}
        self._steps: dict = {}

    def seconds(self, op: CommOp, part: int, req: Requirement) -> float:
        """Seconds of part ``part`` (whose transfers and circuits are ``req``) of one ``op``."""
        return self._entry(op, part, req)[0]

    def cost(self, op: CommOp, part: int, req: Requirement, stage: int, count: int = 1) -> OpCost:
        """:meth:`seconds` of ``count`` back-to-back ``op`` parts run by ``stage``, with the link classes they keep
        busy (ids ``((stage * rails + rail) * 4 + class)``) for :class:`FairShare`."""
        entry = self._entry(op, part, req)
        costs = entry[-1]
        if (stage, count) not in costs:
            seconds, wire, offset, rail, cls, busy = entry[:-1]
            # a share of a ring over the stages wraps from the last stage to the first: stages count modulo pp
            ids = (((stage + offset) % self.layout.pp) * self.layout.gpus_per_server + rail) * self.CLASSES + cls
            costs[stage, count] = OpCost(seconds * count, ids, busy * count, bandwidth_s=wire * count)
        return costs[stage, count]

    def _entry(self, op: CommOp, part: int, req: Requirement) -> tuple:
        match op:
            case CollectiveOp(kind=kind, algorithm=algorithm, nbytes=nbytes):
                shape = ("collective", op.group_dims, kind, algorithm, nbytes, part)
                per_transfer = nbytes / prod(self.layout.degree(d) for d in op.group_dims)  # one chunk
            case SendOp(offset=offset, nbytes=nbytes):
                shape = ("send", op.group_dims, offset, nbytes, part)
                per_transfer = nbytes
            case _:
                raise TypeError(f"{op!r} is not a communication op")
        if shape not in self._cache:
            entry = self._time(req, per_transfer)
            if isinstance(op, CollectiveOp) and self._as_nccl(op) and entry[0] > 0:
                entry = self._nccl(op, req, entry)
            self._cache[shape] = entry
        return self._cache[shape]

    def _as_nccl(self, op: CollectiveOp) -> bool:
        from lightrail.collectives.registry import AUTO
        from lightrail.nccl_cost import TUNED

        return self.fabric.collectives == "nccl" and op.algorithm == AUTO and op.kind.value in TUNED

    def _nccl(self, op: CollectiveOp, req: Requirement, entry: tuple) -> tuple:
        """``entry`` (:meth:`_time`'s) with NCCL's time for one group and the busy seconds scaled to its bytes
        time (:func:`lightrail.nccl_cost.nccl_op_cost`). A part of an op that the planner split (circuits that
        are not one matching) gets NCCL's time in proportion to its share of the schedule's steps."""
        from lightrail.nccl_cost import communicator, nccl_op_cost

        lay, fab = self.layout, self.fabric
        seconds, wire, offset, rail, cls, busy, _ = entry
        group = lay.groups_over(op.group_dims)[0]
        comm = communicator(lay.server(group) * lay.gpus_per_server + lay.rail(group), lay.gpus_per_server, fab,
                            nvls=self.gpu.nvls, arch=self.gpu.arch)
        forced = "ring" if fab.circuits and comm.nnodes > 1 else None  # the circuits are the planner's ring
        alone = OpCost(seconds, np.arange(len(busy)), busy, bandwidth_s=wire)
        cost, _ = nccl_op_cost(op.kind, op.nbytes, comm, alone=alone, algorithm=forced)
        share = len(req.steps) / self._schedule_steps(op, len(group))
        return (cost.seconds * share, cost.wire_s * share, offset, rail, cls, cost.busy_s * share, {})

    def _schedule_steps(self, op: CollectiveOp, k: int) -> int:
        """Steps of the registry's ``auto`` schedule of ``op`` on ``k`` ranks, as the planner lists them."""
        key = (op.kind, k)
        if key not in self._steps:
            from lightrail.collectives.compressed import compressed_form, step_traffic
            from lightrail.collectives.registry import AUTO, resolve

            algorithm = resolve(op.kind, AUTO, k)
            schedule = compressed_form(algorithm.kind, algorithm.name, k) or algorithm(k)
            self._steps[key] = max(len(step_traffic(schedule)[0]), 1)
        return self._steps[key]

    def _time(self, req: Requirement, per_transfer: float) -> tuple:
        """(seconds, seconds moving bytes, per link class its stage offset, rail, class and busy seconds, and a
        cache of the OpCost per stage)."""
        lay, fab = self.layout, self.fabric
        g = lay.gpus_per_server
        none = np.zeros(0, np.int64)
        # steps with the same traffic share their (src, dst) arrays (the planner's ring repeats one pair of arrays
        # 2(k-1) times): each distinct pair of arrays is marked, relabelled and modelled once
        distinct = list({(id(src), id(dst)): (src, dst) for src, dst in req.steps}.values())
        present = np.zeros(lay.world, bool)  # the ranks the steps name: marked, not sorted (steps x ranks values)
        for src, dst in distinct:
            present[src] = present[dst] = True
        if not present.any():
            return 0.0, 0.0, none, none, none, np.zeros(0), {}
        named = np.flatnonzero(present)
        in_use = np.zeros(lay.servers, bool)
        in_use[lay.server(named)] = True
        servers = np.flatnonzero(in_use)  # sorted, each once (np.unique without its sort)
        where = np.zeros(lay.servers, np.int64)
        where[servers] = np.arange(len(servers))
        local_of = np.zeros(lay.world, np.int64)  # a rank's GPU on the servers kept, renumbered from 0
        local_of[named] = where[lay.server(named)] * g + lay.rail(named)
        if fab.circuits:
            rail, tx, rx = req.circuits
            topo = photonic_rails(len(servers), (rail, np.searchsorted(servers, tx), np.searchsorted(servers, rx)),
                                  gpus_per_server=g, nic_bandwidth=fab.nic_bandwidth,
                                  nvlink_bandwidth=fab.nvlink_bandwidth, latency=fab.latency)
        else:
            topo = rails(len(servers) * g, gpus_per_server=g, nic_bandwidth=fab.nic_bandwidth,
                         nvlink_bandwidth=fab.nvlink_bandwidth, latency=fab.latency, routing=fab.routing)
        engine = Engine(topo, alpha=fab.alpha)
        # steps with the same traffic share one model (a ring's 2(n-1) steps are one): each is routed once
        model_of = {(id(src), id(dst)): engine.step_model(local_of[src], local_of[dst],
                                                         np.full(len(src), float(per_transfer)))
                    for src, dst in distinct}
        models = [model_of[id(src), id(dst)] for src, dst in req.steps]
        seconds = sum(m.time(1.0, engine.alpha) for m in models)
        wire = engine.wire(models, 1.0)
        link, sec = engine.busy(models, 1.0)
        # a link is charged to the GPU at each of its ends: out of its source, into its destination
        gpu_ends = []
        for node, other, out in ((topo.src[link], topo.dst[link], 0), (topo.dst[link], topo.src[link], 1)):
            at = node < topo.num_endpoints
            nic = topo.node_kind[other[at]] != NodeKind.NVSWITCH
            gpu_ends.append((node[at], 2 * nic + out, sec[at]))
        gpu = np.concatenate([e[0] for e in gpu_ends])
        cls = np.concatenate([e[1] for e in gpu_ends]).astype(np.int64)
        sec = np.concatenate([e[2] for e in gpu_ends])
        stage_size = max(lay.world // lay.pp, 1)
        stage = (servers[gpu // g] * g + gpu % g) // stage_size
        offset = stage - int(np.min(req.steps[0][0])) // stage_size  # from the stage whose op this is
        code = ((offset - offset.min()) * g + gpu % g) * self.CLASSES + cls
        uniq, inv = np.unique(code, return_inverse=True)
        most = np.zeros(len(uniq))
        np.maximum.at(most, inv, sec)  # the stage's ranks load their links alike: the busiest stands for all
        first = np.zeros(len(uniq), np.int64)
        first[inv] = np.arange(len(inv))
        return (seconds, wire, offset[first], (gpu % g)[first], cls[first], most, {})  # {}: OpCost per stage
