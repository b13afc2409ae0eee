"""Opus photonic rails: the circuits each parallelism phase needs on every rail, and the policy knobs.

Every rail of a rail-optimized cluster is an optical circuit switch whose ports are the rail's
NICs, one per server. A circuit joins one NIC's transmitter to another NIC's receiver, so a port
talks to one peer at a time and the rail is time-multiplexed between phases (Opus, arXiv
2507.08119). The phase of an op is its parallelism dimension (tp, cp, ep, pp, dp), known online
from its group, with no profiling pass; a group that spans the pipeline stages and more (Megatron's
model-parallel group: the grad-norm and train-step all-reduces) is a phase of its own, ``tp+pp``, and so is the
embedding group of the first and last stage, ``embd`` (``control.plan.phase_key``). Each stage's op of a group
over several stages needs the circuits of what its own ranks send.

Circuits of an op follow from its traffic (``control/plan.py``: PXN, a transfer crosses the rail of
its destination GPU); a collective's traffic is the schedule of its algorithm (``CollectiveOp.algorithm``,
``"auto"`` resolved by the collectives registry). A collective whose circuits do not form a partial
permutation on a rail (an all-to-all across servers) is split into parts, each a matching, run one
after the other. A phase's configuration on a rail is the union of its ops' circuits, split into
the fewest matchings only where the union is not one (Opus section 4: pipeline forward and backward
between the same two servers are one configuration; a middle stage of PP >= 4 needs two).

Policy knobs (``control.plan.Policy``, the Plan carries it; ``OpusParams`` is its old name), the published
Opus first (``ORIGINAL``), lightrail's after:
- ``mode``: reconfigure *on demand* when a phase's first op checks in, or *provisioned* once the
  previous phase's last op released (the controller learns the next phase then, not earlier),
  hiding the delay behind compute. Both are Opus's.
- Opus reconfigures the whole rail switch (drain the rail, rewrite it to the configuration, wait
  the delay) when the next op's configuration differs from what the rail holds, and every
  collective and send/recv checks in with the controller before it runs;
- ``partial``: reconfigure only the ports whose circuits change;
- ``skip_present``: keep the switch as it is when the next op's circuits are already there;
- ``split_pp``: serve pipeline forward traffic on half the rails and backward on the other half,
  so a middle stage never has to swing its ports between its two neighbours (PXN spreads a
  stage's traffic over the rails of its direction);
- ``defer_dp``: run the data-parallel gradient buckets after the stage's last pipeline send, as one
  phase, instead of interleaving them with the last backward;
- ``leases``: a group holds its circuits across ops until another phase needs the ports (the
  controller revokes the lease), so only a change of phase costs a controller round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.collectives import resolve
from lightrail.collectives.compressed import compressed_form, step_traffic
from lightrail.control.plan import (
    KNOBS,
    NO_CIRCUITS,
    Circuits,
    Plan,
    Policy,
    is_matching,
    phase_key,
    rail_circuits,
    union,
)
from lightrail.fabric.circuits import is_partial_permutation
from lightrail.workload.parallel import Dim, Layout
from lightrail.workload.program import CollectiveOp, CommOp, Program, SendOp

__all__ = ["OpusParams", "OpusPlanner", "Requirement", "ORIGINAL", "LIGHTRAIL", "KNOBS", "is_rail_configuration"]

OpusParams = Policy
"""The old name of :class:`lightrail.control.plan.Policy` (still read)."""
ORIGINAL = Policy(partial=False, skip_present=False, split_pp=False, defer_dp=False, leases=False)
"""The published Opus policy (arXiv 2507.08119 sections 4-5): phases are parallelism dimensions, the whole
rail switch is rewritten when the next op's configuration differs from the rail's, every op checks in."""
LIGHTRAIL = Policy()
"""lightrail's default: every improvement on (skip-if-present, partial, split pipeline rails, deferred DP,
leases)."""


@dataclass(frozen=True, eq=False)
class Requirement:
    """What one communication op (or one part of it) needs from the rails.

    ``transfers`` are the (src, dst) rank pairs of each of its steps (all groups of the stage at
    once); ``circuits`` are (rail, tx_server, rx_server) arrays; ``phase`` is the name of the plan's
    configuration that serves it (the dimension, or ``"pp#1"`` where the phase splits).
    """

    phase: str
    steps: tuple[tuple[np.ndarray, np.ndarray], ...]
    circuits: Circuits

    @property
    def ncircuits(self) -> int:
        return len(self.circuits[0])


def _comm_ops(program: Program):
    for stage, ops in enumerate(program.stages):
        for op in ops:
            match op:
                case CollectiveOp() | SendOp():
                    yield stage, op


class OpusPlanner:
    """Circuits per op and the Plan for one job layout; pure and cached.

    :meth:`plan` must see the program before :meth:`requirements` names an op's configuration;
    until then each requirement is named by its dimension.
    """

    def __init__(self, layout: Layout, policy: Policy = LIGHTRAIL):
        self.layout = layout
        self.policy = policy
        self._cache: dict = {}
        self._names: dict = {}  # requirement key -> configuration name, filled by plan()
        self._plan: tuple[Program, Plan] | None = None

    @staticmethod
    def _key(op: CommOp, stage: int) -> tuple:
        """Ops with equal keys have the same traffic (and so the same requirements)."""
        match op:
            case CollectiveOp(kind=kind, algorithm=algorithm):
                return (op.group_dims, kind, algorithm, 0, stage)
            case SendOp(offset=offset):
                return (op.group_dims, "send", phase_key(op), offset, stage)
        raise TypeError(f"{op!r} is not a communication op")

    def requirements(self, op: CommOp, stage: int) -> tuple[Requirement, ...]:
        """The parts of a communication op at ``stage``, each with its transfers, circuits and configuration."""
        key = self._key(op, stage)
        if key not in self._cache:
            parts = self._parts(op, stage)
            names = self._names.get(key)
            if names is not None:
                parts = [(name, steps, circuits) for name, (_, steps, circuits) in zip(names, parts, strict=True)]
            self._cache[key] = tuple(Requirement(*p) for p in parts)
        return self._cache[key]

    def _parts(self, op: CommOp, stage: int) -> list[tuple[str, tuple, Circuits]]:
        match op:
            case SendOp():
                return self._send_parts(op, stage)
            case CollectiveOp():
                return self._collective_parts(op, stage)
        raise TypeError(f"{op!r} is not a communication op")

    def _send_parts(self, op: SendOp, stage: int) -> list[tuple[str, tuple, Circuits]]:
        lay = self.layout
        src = lay.stage_ranks(stage)
        dst = src + op.offset * lay.stride(Dim.PP)
        rails = None
        if self.policy.split_pp and lay.gpus_per_server > 1:
            # Downstream traffic on the even rails, upstream on the odd ones. With virtual pipeline stages
            # (interleaved 1F1B) the last stage's forward wraps to stage 0 (offset -(pp - 1)) and stage 0's backward
            # to the last stage (offset pp - 1): taken with their direction round the ring of stages, the forward
            # circuits stay one ring per rail and the backward ones the reverse ring, one configuration as before.
            # (pp = 2 and the embedding exchange keep the sign: there, +-(pp - 1) is also the plain neighbour.)
            ring = lay.pp > 2 and not op.phase
            downstream = op.offset % lay.pp == 1 if ring else op.offset > 0
            rails = np.arange(0 if downstream else 1, lay.gpus_per_server, 2)
        return [(phase_key(op), ((src, dst),), rail_circuits(lay, src, dst, rails))]

    def _collective_parts(self, op: CollectiveOp, stage: int) -> list[tuple[str, tuple, Circuits]]:
        lay = self.layout
        phase = phase_key(op)
        stage_size = lay.world // lay.pp
        groups = lay.groups_over(op.group_dims)
        across = Dim.PP in op.group_dims and lay.pp > 1
        if not across:
            groups = groups[(groups[:, 0] // stage_size) == stage]
        k = groups.shape[1]
        algorithm = resolve(op.kind, op.algorithm, k) if k > 1 else None
        schedule = None
        if algorithm is not None:  # the compressed form where there is one: a pattern's pairs are made once
            schedule = compressed_form(algorithm.kind, algorithm.name, k) or algorithm(k)
        step_codes, _, ids = step_traffic(schedule) if schedule is not None else ([], [], [])
        # Greedy: extend a part while its circuits stay one matching per rail. Steps with the same
        # pairs as the previous one (every step of a ring) add nothing and are not recomputed; steps with
        # the same traffic share their (src, dst) arrays.
        parts: list = []
        current: list = []
        circuits, last_key = NO_CIRCUITS, None
        pairs: dict[int, tuple[np.ndarray, np.ndarray, bytes]] = {}
        for codes, i in zip(step_codes, ids, strict=True):
            if i not in pairs:
                src, dst = groups[:, codes // k].ravel(), groups[:, codes % k].ravel()
                if across:  # a group over several stages: each stage's op moves what its own ranks send
                    mine = src // stage_size == stage
                    src, dst = src[mine], dst[mine]
                pairs[i] = (src, dst, codes.tobytes())
            src, dst, key = pairs[i]
            if key != last_key:
                step_circuits = rail_circuits(lay, src, dst)
                merged = union(lay, circuits, step_circuits)
                if current and not is_matching(lay, merged):
                    parts.append((phase, tuple(current), circuits))
                    current, merged = [], step_circuits
                circuits, last_key = merged, key
            current.append((src, dst))
        if current or not parts:
            parts.append((phase, tuple(current), circuits))
        return parts

    # -- the plan --------------------------------------------------------------------------------------
    def plan(self, program: Program) -> Plan:
        """The Plan of ``program``: per phase, the union of its requirements in the order the traffic
        needs them (stage by stage, op by op), split into matchings only where needed; requirements
        are then named by the configuration that serves them."""
        if self._plan is not None and self._plan[0] is program:
            return self._plan[1]
        order: dict[str, list[tuple]] = {}
        for stage, op in _comm_ops(program):
            key = self._key(op, stage)
            keys = order.setdefault(phase_key(op), [])
            if key not in keys:
                keys.append(key)
                self._cache.setdefault(key, tuple(Requirement(*p) for p in self._parts(op, stage)))
        requirements = {phase: [req.circuits for key in keys for req in self._cache[key]]
                        for phase, keys in order.items()}
        requirements = {phase: reqs for phase, reqs in requirements.items() if any(len(r[0]) for r in reqs)}
        plan, names = Plan.from_requirements(self.layout, requirements, self.policy)
        for phase, keys in order.items():
            labels = iter(names.get(phase, ()))
            for key in keys:
                reqs = self._cache[key]
                if phase in names:
                    self._names[key] = [next(labels) for _ in reqs]
                    self._cache[key] = tuple(Requirement(n, r.steps, r.circuits)
                                             for n, r in zip(self._names[key], reqs, strict=True))
        self._plan = (program, plan)
        return plan

    def phase_configurations(self, ops_by_stage) -> dict[str, np.ndarray]:
        """Per configuration name, ``perm[rail, tx_server] = rx_server`` (-1: dark): what the original
        Opus installs on the whole rail switch when that configuration's phase begins."""
        program = ops_by_stage if isinstance(ops_by_stage, Program) else _Ops(tuple(ops_by_stage))
        return self.plan(program).configurations


@dataclass(frozen=True)
class _Ops:
    stages: tuple


def is_rail_configuration(perm: np.ndarray) -> bool:
    """True if every rail's row is a partial permutation of its servers (one circuit per port)."""
    return all(is_partial_permutation(row) for row in perm)
