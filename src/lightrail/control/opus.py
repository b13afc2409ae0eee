"""Opus photonic rails: the circuits each parallelism phase needs on every rail, and the policy knobs.

Every rail of a rail-optimized cluster is an optical circuit switch whose ports are the rail's
NICs, one per server. A circuit joins one NIC's transmitter to another NIC's receiver, so a port
talks to one peer at a time and the rail is time-multiplexed between phases (Opus, arXiv
2507.08119). The phase of an op is known from its group's dimension (tp, cp, ep, dp, pp), online,
with no profiling pass.

Circuits of an op follow from its traffic: a transfer between GPUs on different servers crosses
the rail of the destination GPU (NCCL's PXN: NVLink to the GPU on the right rail first), so it
needs the circuit (rail of dst, server of src -> server of dst). A collective whose circuits do
not form a partial permutation on a rail (an all-to-all across servers) is split into parts, each
a matching, run one after the other.

Policy knobs (``OpusParams``), the original first and lightrail's improvements after:
- ``mode``: reconfigure *on demand* when a phase's first op arrives, or *provisioned* as soon as the
  previous phase's last op on those ports completes, hiding the delay behind compute;
- ``partial``: reconfigure only the ports whose circuits change (the original rewrites the whole
  rail switch to the phase's configuration and waits for the whole rail to drain);
- ``skip_present``: keep the switch as it is when the next op's circuits are already there;
- ``split_pp``: serve pipeline forward traffic on half the rails and backward on the other half,
  so a middle stage never has to swing its ports between its two neighbours (PXN spreads a
  stage's traffic over the rails of its direction);
- ``defer_dp``: run the data-parallel gradient buckets after the stage's last pipeline send, as one
  phase, instead of interleaving them with the last backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from lightrail.collectives import generate
from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.fabric.circuits import is_partial_permutation
from lightrail.workload.parallel import Dim, Layout
from lightrail.workload.program import Collective, Op, Send

__all__ = ["OpusParams", "OpusPlanner", "Requirement", "ORIGINAL", "LIGHTRAIL", "is_rail_configuration"]

Mode = Literal["on_demand", "provisioned"]


@dataclass(frozen=True, kw_only=True)
class OpusParams:
    """How the control plane reconfigures photonic rails (see the module docstring)."""

    mode: Mode = "provisioned"
    partial: bool = True
    skip_present: bool = True
    split_pp: bool = True
    defer_dp: bool = True

    def __post_init__(self):
        if self.mode not in ("on_demand", "provisioned"):
            raise ScenarioError(f"unknown mode {self.mode!r}", field="opus.mode", fix="use on_demand or provisioned")

    @property
    def label(self) -> str:
        knobs = [k for k in ("partial", "skip_present", "split_pp", "defer_dp") if getattr(self, k)]
        return f"{self.mode}" + (f" +{'+'.join(knobs)}" if knobs else " (original)")


ORIGINAL = OpusParams(partial=False, skip_present=False, split_pp=False, defer_dp=False)
"""The published Opus policy: whole-switch reconfiguration at every phase change."""
LIGHTRAIL = OpusParams()
"""lightrail's default: every improvement on (partial, skip-if-present, split pipeline rails, deferred DP)."""


@dataclass(frozen=True, eq=False)
class Requirement:
    """What one communication op (or one part of it) needs from the rails.

    ``transfers`` are the (src, dst) rank pairs of each of its steps (all groups of the stage at
    once); ``circuits`` are (rail, tx_server, rx_server) arrays; ``phase`` names the configuration.
    """

    phase: str
    steps: tuple[tuple[np.ndarray, np.ndarray], ...]
    circuits: tuple[np.ndarray, np.ndarray, np.ndarray]

    @property
    def ncircuits(self) -> int:
        return len(self.circuits[0])


def _schedule_name(kind: str) -> tuple[str, str]:
    return (kind, "pairwise") if kind == "alltoall" else (kind, "ring")


class OpusPlanner:
    """Circuits per op and per phase for one job layout; pure and cached."""

    def __init__(self, layout: Layout, params: OpusParams = LIGHTRAIL):
        self.layout = layout
        self.params = params
        self._cache: dict = {}

    # -- traffic -> circuits ----------------------------------------------------------------------------
    def _circuits(self, src: np.ndarray, dst: np.ndarray, rails: np.ndarray | None = None):
        """Unique circuits (rail, tx_server, rx_server) that cross-server transfers need."""
        lay = self.layout
        s_srv, d_srv = lay.server(src), lay.server(dst)
        cross = s_srv != d_srv
        s_srv, d_srv = s_srv[cross], d_srv[cross]
        if rails is None:  # PXN: each transfer rides the rail of its destination GPU
            rail = lay.rail(dst[cross])
        else:  # every server pair gets a circuit on each of the given rails
            pairs = np.unique(np.stack([s_srv, d_srv]), axis=1) if len(s_srv) else np.zeros((2, 0), int)
            rail = np.repeat(rails, pairs.shape[1])
            s_srv, d_srv = np.tile(pairs[0], len(rails)), np.tile(pairs[1], len(rails))
        if not len(rail):
            return (np.zeros(0, np.int64),) * 3
        key = np.unique((rail * lay.servers + s_srv) * lay.servers + d_srv)
        return key // lay.servers**2, key // lay.servers % lay.servers, key % lay.servers

    def _is_matching(self, circuits) -> bool:
        rail, tx, rx = circuits
        txk, rxk = rail * self.layout.servers + tx, rail * self.layout.servers + rx
        return len(np.unique(txk)) == len(txk) and len(np.unique(rxk)) == len(rxk)

    def _union(self, a, b):
        if not len(a[0]):
            return b
        s = self.layout.servers
        key = np.unique(np.concatenate([(a[0] * s + a[1]) * s + a[2], (b[0] * s + b[1]) * s + b[2]]))
        return key // s**2, key // s % s, key % s

    def _stage_groups(self, dims: tuple[Dim, ...], stage: int) -> np.ndarray:
        groups = self.layout.groups_over(dims)
        size = self.layout.world // self.layout.pp
        return groups[(groups[:, 0] // size) == stage]

    def requirements(self, op: Op, stage: int) -> tuple[Requirement, ...]:
        """The parts of a communication op at ``stage``, each with its transfers and circuits."""
        key = (getattr(op, "group_dims", op.dim), getattr(op, "kind", "send"), getattr(op, "offset", 0), stage)
        if key not in self._cache:
            self._cache[key] = self._requirements(op, stage)
        return self._cache[key]

    def _requirements(self, op: Op, stage: int) -> tuple[Requirement, ...]:
        lay = self.layout
        if isinstance(op, Send):
            src = lay.stage_ranks(stage)
            dst = src + op.offset * lay.stride(Dim.PP)
            direction = "fwd" if op.offset > 0 else "bwd"
            rails = None
            if self.params.split_pp and lay.gpus_per_server > 1:
                g = lay.gpus_per_server
                rails = np.arange(0 if op.offset > 0 else 1, g, 2)
            return (Requirement(f"pp-{direction}", ((src, dst),), self._circuits(src, dst, rails)),)
        if not isinstance(op, Collective):
            raise TypeError(f"{op!r} is not a communication op")
        groups = self._stage_groups(op.group_dims, stage)
        # the phase is named by the dimensions the group really spans ("dp", "ep+dp", ...)
        spanned = [d.value for d in op.group_dims if lay.degree(d) > 1] or [op.dim.value]
        phase = "+".join(spanned)
        kind, algo = _schedule_name(op.kind)
        schedule = generate(kind, algo, groups.shape[1]) if groups.shape[1] > 1 else None
        k = groups.shape[1]
        # Greedy: extend a part while its circuits stay one matching per rail. Steps with the same
        # pairs as the previous one (every step of a ring) add nothing and are not recomputed.
        parts: list[Requirement] = []
        current: list = []
        circuits = (np.zeros(0, np.int64),) * 3
        last_key = None
        for st in (schedule.steps if schedule is not None else ()):
            codes = np.unique(st.src.astype(np.int64) * k + st.dst)
            src, dst = groups[:, codes // k].ravel(), groups[:, codes % k].ravel()
            key = codes.tobytes()
            if key != last_key:
                step_circuits = self._circuits(src, dst)
                merged = self._union(circuits, step_circuits)
                if current and not self._is_matching(merged):
                    parts.append(Requirement(phase, tuple(current), circuits))
                    current, merged = [], step_circuits
                circuits, last_key = merged, key
            current.append((src, dst))
        if current or not parts:
            parts.append(Requirement(phase, tuple(current), circuits))
        if len(parts) > 1:
            parts = [Requirement(f"{p.phase}#{i}", p.steps, p.circuits) for i, p in enumerate(parts)]
        return tuple(parts)

    # -- per-rail configurations ----------------------------------------------------------------------
    def phase_configurations(self, ops_by_stage) -> dict[str, np.ndarray]:
        """Per phase, the rail configuration as ``perm[rail, tx_server] = rx_server`` (-1: dark).

        The union over every stage's ops of that phase: what the original Opus installs on the
        whole rail switch when the phase begins.
        """
        lay = self.layout
        out: dict[str, np.ndarray] = {}
        for stage, ops in enumerate(ops_by_stage):
            for op in ops:
                if not isinstance(op, (Collective, Send)):
                    continue
                for req in self.requirements(op, stage):
                    perm = out.setdefault(req.phase, np.full((lay.gpus_per_server, lay.servers), -1, np.int64))
                    rail, tx, rx = req.circuits
                    clash = (perm[rail, tx] >= 0) & (perm[rail, tx] != rx)
                    if np.any(clash):
                        i = int(np.flatnonzero(clash)[0])
                        raise InfeasibleError(f"phase {req.phase} needs two circuits from server {tx[i]} on rail "
                                              f"{rail[i]}", field="parallel",
                                              fix="this layout's phase is not one matching per rail")
                    perm[rail, tx] = rx
        return out


def is_rail_configuration(perm: np.ndarray) -> bool:
    """True if every rail's row is a partial permutation of its servers (one circuit per port)."""
    return all(is_partial_permutation(row) for row in perm)
