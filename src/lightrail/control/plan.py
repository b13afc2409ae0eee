"""The Plan: per rail switch, which configuration serves which phase, and when the switch changes.

One Plan is executed by both faces of lightrail: the iteration simulator (``sim/iteration.py``)
and the runtime (the torch backend and the controller). A planner derives it from the traffic of
a job; the executors only look it up.

- **Circuits of a transfer** (:func:`rail_circuits`): a transfer between GPUs on different servers
  crosses the rail of its destination GPU (NCCL's PXN: NVLink to the GPU on the right rail first),
  so it needs the circuit (rail of dst, server of src -> server of dst).
- **A phase is a parallelism dimension** (tp, cp, ep, pp, dp), as Opus defines it (arXiv
  2507.08119, section 4), or (:func:`phase_key`) a group that spans the pipeline stages and more (Megatron's
  model-parallel group, ``tp+pp``) or the embedding group of the first and last stage (``embd``): its
  configuration on a rail is the union of the circuits its ops need,
  whenever that union is a partial permutation of the rail's ports. Only when it is not (a middle
  pipeline stage whose two neighbours need the same transmitter, an all-to-all across servers) is
  the phase split into matchings (:func:`split_into_matchings`): first-fit over the requirements in
  the order the traffic needs them, so pipeline forward and backward between the same two servers
  share one configuration. First fit equals the fewest matchings on every layout the tests
  brute-force.
- **When the switch changes** is the :class:`Policy`, which the Plan carries: on demand (a phase's first
  op asks) or provisioned (the previous phase's last op releases), the whole switch (Opus) or only the
  changed ports, per-op check-ins with the controller (Opus) or leases held for a whole phase. It is
  declared here once: the scenario's ``ocs`` section takes its fields from it, the planner builds the
  Plan with it, and the simulator and the torch backend read it from the Plan they are given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from lightrail.defaults import Mode
from lightrail.errors import InfeasibleError
from lightrail.fabric.builders import sorted_unique
from lightrail.workload.parallel import Dim, Layout

__all__ = ["Mode", "Policy", "KNOBS", "Circuits", "phase_key", "rail_circuits", "is_matching", "union",
           "split_into_matchings", "Plan", "runtime_plan"]


# Mode (on-demand / provisioned) lives in lightrail.defaults, so the CLI shows it without importing numpy;
# re-exported here as control.plan.Mode.


@dataclass(frozen=True, kw_only=True)
class Policy:
    """How the control plane switches the rails: the one declaration of the OCS policy.

    The published Opus policy (arXiv 2507.08119 sections 4-5) has every knob off (``control.opus.ORIGINAL``);
    lightrail's default has them on. Each field's ``doc`` is what the scenario's ``ocs`` section shows for it.
    A string ``mode`` (``on-demand``, the old ``on_demand``, ``provisioned``) is read here, once, at the edge.
    """

    mode: Mode = field(default=Mode.PROVISIONED, metadata={"doc": (
        "When to reconfigure: on demand, when a phase's first op checks in, or provisioned, once the previous "
        "phase's last op released (on_demand, the old spelling, is still read).")})
    partial: bool = field(default=True, metadata={"doc": (
        "Reconfigure only the ports that change (Opus: rewrite the whole rail switch, drained first).")})
    skip_present: bool = field(default=True, metadata={"doc": (
        "Skip a reconfiguration when the op's circuits are already there.")})
    split_pp: bool = field(default=True, metadata={"doc": (
        "Forward pipeline traffic on even rails, backward on odd rails.")})
    defer_dp: bool = field(default=True, metadata={"doc": (
        "Run gradient buckets after the last pipeline send, as one phase.")})
    leases: bool = field(default=True, metadata={"doc": (
        "A group keeps its circuits across ops until another phase needs them (Opus: every op checks in with "
        "the controller).")})

    def __post_init__(self):
        from lightrail.errors import ScenarioError

        if not isinstance(self.mode, Mode):
            object.__setattr__(self, "mode", Mode.parse(self.mode, field="ocs.mode"))
        for f in fields(self)[1:]:
            if not isinstance(getattr(self, f.name), bool):
                raise ScenarioError(f"{f.name} must be true or false, got {getattr(self, f.name)!r}",
                                    field=f"ocs.{f.name}", fix=f"{f.name}: true")

    @property
    def whole_switch(self) -> bool:
        """Opus: rewrite the whole rail switch to the configuration (drain the rail first)."""
        return not self.partial

    @property
    def label(self) -> str:
        knobs = [k for k in KNOBS if getattr(self, k)]
        return f"{self.mode}" + (f" +{'+'.join(knobs)}" if knobs else " (original)")

    def to_dict(self) -> dict:
        """The ``ocs`` section's policy fields (JSON-ready)."""
        return {f.name: str(getattr(self, f.name)) if f.name == "mode" else getattr(self, f.name)
                for f in fields(self)}


KNOBS = ("skip_present", "partial", "split_pp", "defer_dp", "leases")
"""lightrail's improvements over the published policy, in the order the ablation adds them."""


Circuits = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Circuits as parallel arrays ``(rail, tx_server, rx_server)``."""

NO_CIRCUITS: Circuits = (np.zeros(0, np.int64),) * 3


def phase_key(op) -> str:
    """The phase of a communication op (anything with ``dim`` and ``group_dims``, and maybe ``phase``): the
    op's own ``phase`` if it names one (``"embd"``, the first and last stage's exchange); the dimensions of its
    group joined by ``+`` when the group spans pipeline stages and more (Megatron's model-parallel group
    ``"tp+pp"``, the distributed optimizer's whole world ``"tp+cp+ep+dp+pp"``): its ring crosses the stages'
    servers, wrapping from the last to the first, a pattern of its own; otherwise its dimension (Opus's phases,
    gradient buckets over cp x ep x dp replicas included, which stay inside a stage).

    >>> from lightrail.workload.program import CollectiveOp
    >>> phase_key(CollectiveOp(Dim.PP, "allreduce", 4, "grad norm", span=(Dim.TP, Dim.PP)))
    'tp+pp'
    >>> phase_key(CollectiveOp(Dim.DP, "allreduce", 4, "dp bucket 0", span=(Dim.CP, Dim.EP, Dim.DP)))
    'dp'
    """
    named = getattr(op, "phase", "")
    if named:
        return named
    dims = tuple(op.group_dims)
    if len(dims) > 1 and Dim.PP in dims:
        return "+".join(Dim(d).value for d in dims)
    return op.dim.value


def _unique(layout: Layout, rail, tx, rx) -> Circuits:
    """The circuits ``(rail, tx, rx)``, each once, sorted (by a sort: ``np.unique`` would import numpy.ma)."""
    s = layout.servers
    key = sorted_unique((np.asarray(rail, np.int64) * s + tx) * s + rx)
    return key // s**2, key // s % s, key % s


def rail_circuits(layout: Layout, src, dst, rails=None) -> Circuits:
    """Unique circuits that the transfers ``src -> dst`` (ranks) need on the rails.

    By default each cross-server transfer rides the rail of its destination GPU (PXN). With
    ``rails``, every server pair gets a circuit on each of the given rails instead (traffic
    spread over those rails).
    """
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    s_srv, d_srv = layout.server(src), layout.server(dst)
    cross = s_srv != d_srv
    s_srv, d_srv = s_srv[cross], d_srv[cross]
    if not len(s_srv):
        return NO_CIRCUITS
    if rails is None:
        return _unique(layout, layout.rail(dst[cross]), s_srv, d_srv)
    rails = np.asarray(rails, np.int64)
    pair = sorted_unique(s_srv * layout.servers + d_srv)  # the server pairs, each once, in np.unique's order
    pairs = np.stack([pair // layout.servers, pair % layout.servers])
    return _unique(layout, np.repeat(rails, pairs.shape[1]), np.tile(pairs[0], len(rails)),
                   np.tile(pairs[1], len(rails)))


def is_matching(layout: Layout, circuits: Circuits) -> bool:
    """True if no transmitter and no receiver of a rail has two circuits (a partial permutation)."""
    rail, tx, rx = circuits
    s = layout.servers
    if not len(rail):
        return True
    ports = layout.gpus_per_server * s  # a port's count, not a hash set of them: the planner asks this step by step
    return (int(np.bincount(np.asarray(rail * s + tx, np.int64), minlength=ports).max()) <= 1
            and int(np.bincount(np.asarray(rail * s + rx, np.int64), minlength=ports).max()) <= 1)


def union(layout: Layout, *parts: Circuits) -> Circuits:
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return NO_CIRCUITS
    return _unique(layout, *(np.concatenate([p[i] for p in parts]) for i in range(3)))


def split_into_matchings(layout: Layout, requirements: Sequence[Circuits]) -> tuple[list[int], list[Circuits]]:
    """Colour requirements (each needed whole, at once) into configurations that are matchings.

    First fit in the given order (the order the traffic needs them): a requirement joins the
    first configuration it does not conflict with. Returns each requirement's configuration
    index and each configuration's circuits. One configuration when the union is a matching.
    """
    configs: list[Circuits] = []
    colour: list[int] = []
    for k, req in enumerate(requirements):
        if not is_matching(layout, req):
            raise InfeasibleError(f"requirement {k} needs two circuits on one port of a rail", field="circuits",
                                  fix="split the op into parts that are each a matching (one circuit per port)")
        for i, cfg in enumerate(configs):
            merged = union(layout, cfg, req)
            if is_matching(layout, merged):
                configs[i] = merged
                colour.append(i)
                break
        else:
            configs.append(union(layout, req))
            colour.append(len(configs) - 1)
    return colour, configs


def _perm(layout: Layout, circuits: Circuits) -> np.ndarray:
    perm = np.full((layout.gpus_per_server, layout.servers), -1, np.int64)
    rail, tx, rx = circuits
    perm[rail, tx] = rx
    return perm


@dataclass(frozen=True)
class Plan:
    """Per rail, the configuration of each phase (or its matchings), and the policy that switches them.

    ``configurations[name]`` is ``perm[rail, tx_server] = rx_server`` (-1: dark); a phase's
    configurations are ``phases[phase]`` in the order its traffic needs them (one name, the phase
    itself, when its union is a matching; ``"pp#0"``, ``"pp#1"``... otherwise).
    """

    layout: Layout
    configurations: dict[str, np.ndarray]
    phases: dict[str, tuple[str, ...]]
    policy: Policy = Policy()
    """How the rails switch between the configurations; the executors read it from here."""
    notes: dict = field(default_factory=dict)

    @property
    def mode(self) -> Mode:
        return self.policy.mode

    @property
    def whole_switch(self) -> bool:
        return self.policy.whole_switch

    @property
    def leases(self) -> bool:
        return self.policy.leases

    def single_configuration(self, phase: str) -> bool:
        """True if the phase's circuits all fit one configuration (its groups never conflict)."""
        return len(self.phases.get(phase, ())) == 1

    def serves(self, phase: str, circuits: Circuits) -> bool:
        """True if ``phase`` is one configuration and it holds every one of ``circuits``: a group with that
        traffic may lease its circuits (it conflicts with no group of its phase, only with other phases)."""
        if not self.single_configuration(phase):
            return False
        rail, tx, rx = (np.asarray(c, np.int64) for c in circuits)
        return bool(np.all(self.configurations[self.phases[phase][0]][rail, tx] == rx))

    def circuits(self, name: str) -> Circuits:
        perm = self.configurations[name]
        rail, tx = np.nonzero(perm >= 0)
        return rail, tx, perm[rail, tx]

    @property
    def trigger(self) -> str:
        """When a rail switches to a configuration, in words."""
        when = ("when the previous phase's last op has released (provisioned)" if self.mode == Mode.PROVISIONED
                else "when the phase's first op checks in (on demand)")
        what = "the whole rail switch, drained first" if self.whole_switch else "only the ports that change"
        return f"{when}; {what}"

    def summary(self) -> dict:
        """JSON-ready: per phase, its configurations and how many circuits each lights; the policy."""
        return {"phases": {phase: {name: int(np.sum(self.configurations[name] >= 0)) for name in names}
                           for phase, names in self.phases.items()},
                "trigger": self.trigger, "leases": self.leases, "policy": self.policy.to_dict()}

    @classmethod
    def from_requirements(cls, layout: Layout, requirements: Mapping[str, Sequence[Circuits]],
                          policy: Policy = Policy()) -> tuple[Plan, dict[str, list[str]]]:
        """Build a plan from each phase's requirements in order of need; also returns, per phase,
        the configuration name each requirement falls in."""
        configurations: dict[str, np.ndarray] = {}
        phases: dict[str, tuple[str, ...]] = {}
        names: dict[str, list[str]] = {}
        for phase, reqs in requirements.items():
            colour, configs = split_into_matchings(layout, [r for r in reqs])
            labels = [phase] if len(configs) == 1 else [f"{phase}#{i}" for i in range(len(configs))]
            for label, cfg in zip(labels, configs, strict=True):
                configurations[label] = _perm(layout, cfg)
            phases[phase] = tuple(labels)
            names[phase] = [labels[c] for c in colour]
        return cls(layout, configurations, phases, policy), names


def _ring(members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return members.ravel(), np.roll(members, -1, axis=1).ravel()


def runtime_plan(layout: Layout, policy: Policy = Policy()) -> Plan:
    """The plan for the traffic the torch backend sees: a ring over every group of each dimension
    (gloo's and NCCL's large-message collective) and the pipeline chain in both directions.

    A dimension whose ring needs two circuits on one port (several members of a group behind one
    NIC, in unusual layouts) is left out of the plan (``notes["unplanned"]``): its groups then check
    in per op."""
    requirements: dict[str, list[Circuits]] = {}
    unplanned = []
    for dim in (Dim.CP, Dim.EP, Dim.DP):
        if layout.degree(dim) > 1:
            reqs = [rail_circuits(layout, *_ring(group[None, :])) for group in layout.groups(dim)]
            if all(is_matching(layout, r) for r in reqs):
                requirements[dim.value] = reqs
            else:
                unplanned.append(dim.value)
    if layout.pp > 1:
        stride = layout.stride(Dim.PP)
        reqs = []
        for stage in range(layout.pp):
            ranks = layout.stage_ranks(stage)
            if stage < layout.pp - 1:
                reqs.append(rail_circuits(layout, ranks, ranks + stride))
            if stage > 0:
                reqs.append(rail_circuits(layout, ranks, ranks - stride))
        requirements[Dim.PP.value] = reqs
    plan = Plan.from_requirements(layout, requirements, policy)[0]
    plan.notes["unplanned"] = unplanned
    return plan
