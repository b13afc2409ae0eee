"""Scenario files: one YAML/JSON document holds model, cluster, parallelism, job, OCS and cost overrides.

Validated at the edge with pydantic (unknown fields are refused), quantities read with units
(``400Gbps``, ``10ms``), and turned into the core's objects by :meth:`Scenario.build`. Every error
is a :class:`ScenarioError` naming the field (``parallel.tp``, ``ocs.reconfig_delay``).

The pydantic models are made on first use (``from lightrail.scenario import Scenario``, or a scenario to
validate): pydantic costs a small job ~70 ms to start (issue 33), and the CLI reads a scenario whose values are
all plain without it (:mod:`lightrail.cli.plain`), building it with the same methods (:class:`_Builds`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightrail.control.plan import Mode, Policy
from lightrail.errors import LightrailError, ScenarioError
from lightrail.fabric.builders import GPUS_PER_SERVER
from lightrail.fabric.costs import CostFacts
from lightrail.fabric.params import (
    ALPHA,
    CHECK_IN_RTT,
    COMMAND_LATENCY,
    HOP_LATENCY,
    RECONFIG_DELAY,
    REVOKE_RTT,
    FabricKind,
    RailFabric,
)
from lightrail.fabric.topology import Topology
from lightrail.units import format_time, parse_rate, parse_time
from lightrail.validation import first_error, read_mapping
from lightrail.workload.hardware import GPU, gpu
from lightrail.workload.importers import model_from_hf_config
from lightrail.workload.model import ModelSpec, preset
from lightrail.workload.parallel import Layout
from lightrail.workload.program import SCENARIO_DP_BUCKETS, TrainingJob

if TYPE_CHECKING:  # traces and the engine's terms are imported when a scenario names them
    from lightrail.scenario import ModelSection, Scenario
    from lightrail.sim.costs import EngineTerms
    from lightrail.workload.chakra import ChakraTrace

__all__ = ["Scenario", "Built", "DEFAULT_SCENARIO", "load_scenario", "parse_scenario"]

_MODELS = ("Scenario", "ModelSection", "WorkloadSection", "ClusterSection", "EngineSection", "ParallelSection",
           "JobSection", "OcsSection", "Duration")
"""The pydantic names, made on first use (:func:`_pydantic`)."""

_JOB = {f.name: f.default for f in fields(TrainingJob)}  # the job section's defaults are TrainingJob's
_TOPOLOGY_ALIASES = {"fat_tree": "fat-tree"}  # cluster.topology: build_topology's names, torus, fat_tree
_BUILDER_FIELDS = {"--shape": "cluster.shape", "ranks": "cluster.gpus", "--topology": "cluster.topology",
                   "routing": "cluster.routing"}


def _time_text(value: Any) -> Any:
    """A number where a time is expected, as text: ``parse_time`` then reads a bare 0 as no time (as flags and
    sweep files do) and names any other bare number as one without a unit."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value



class _Builds:
    """What a scenario does with its values: the pydantic :class:`Scenario`'s methods and a
    :class:`PlainScenario`'s."""

    def build(self, base: Path | None = None) -> Built:
        """The core objects; raises ScenarioError / InfeasibleError naming the field at fault."""
        if self.workload is not None:
            return self._build_trace(base)
        if self.model is None:
            raise ScenarioError("a scenario needs a model (or a workload trace)", field="model",
                                fix="e.g. model: llama3-70b, or workload: {chakra: traces/}")
        if self.job is None:
            raise ScenarioError("a model needs a job section", field="job.micro_batches",
                                fix="e.g. job: {micro_batches: 16}")
        if self.cluster.topology != "rails":
            raise ScenarioError(f"a model's iteration runs on rails, not on a {self.cluster.topology}",
                                field="cluster.topology", fix="drop cluster.topology (or set rails), or replay a "
                                "trace on it: workload: {chakra: DIR}")
        self._topology(1)  # refuses torus or fat-tree arguments on rails
        delay, rate = self._engine_values()
        for name, value, off in (("endpoint_delay", delay, 0.0), ("local_mem_bw", rate, None)):
            if value != off:
                raise ScenarioError("the iteration simulator does not charge it (trace replays do)",
                                    field=f"engine.{name}", fix="drop it, or replay a trace: workload: {chakra: DIR}")
        model = _model(self.model, base)
        c = self.cluster
        accel, fabric, params, costs, rail_speed = self._fabric()
        layout = Layout.from_degrees(c.gpus, gpus_per_server=c.gpus_per_server, **self.parallel.model_dump())
        job = TrainingJob(model=model, layout=layout, gpu=accel, **self.job.model_dump())
        return Built(self, model, accel, job, fabric, params, costs, rail_speed)

    def _fabric(self) -> tuple[GPU, RailFabric, Policy, CostFacts, str]:
        """The cluster's GPU, rails, OCS policy and cost facts (whatever the workload)."""
        accel = gpu(self.cluster.gpu)
        c = self.cluster
        nic = parse_rate(c.rail_bandwidth, field="cluster.rail_bandwidth") if c.rail_bandwidth else accel.nic_bandwidth
        nvl = parse_rate(c.nvlink_bandwidth, field="cluster.nvlink_bandwidth") if c.nvlink_bandwidth \
            else accel.nvlink_bandwidth
        if c.peak_tflops is not None:
            accel = replace(accel, peak_flops=c.peak_tflops * 1e12)
        fabric = RailFabric(kind=FabricKind.PHOTONIC,
                            ocs_delay=parse_time(self.ocs.reconfig_delay, field="ocs.reconfig_delay"),
                            nic_bandwidth=nic, nvlink_bandwidth=nvl,
                            latency=parse_time(c.latency, field="cluster.latency"),
                            alpha=parse_time(c.alpha, field="cluster.alpha"), routing=c.routing,
                            check_in_rtt=parse_time(self.ocs.check_in_rtt, field="ocs.check_in_rtt"),
                            command_latency=parse_time(self.ocs.command_latency, field="ocs.command_latency"),
                            revoke_rtt=parse_time(self.ocs.revoke_rtt, field="ocs.revoke_rtt"),
                            switch_grant_latency=parse_time(self.ocs.switch_grant_latency,
                                                            field="ocs.switch_grant_latency"),
                            sharing=self.engine.sharing, collectives=self.engine.collectives)
        params = self.ocs.policy()
        known = {f.name for f in fields(CostFacts)}
        unknown = sorted(set(self.costs) - known)
        if unknown:
            raise ScenarioError(f"unknown cost fact {unknown[0]!r}", field=f"costs.{unknown[0]}",
                                fix="use a CostFacts field, e.g. ocs_port_price_usd")
        rail_speed = "800G" if nic >= 800e9 / 8 else "400G"
        return accel, fabric, params, CostFacts(**self.costs), rail_speed

    def _build_trace(self, base: Path | None) -> Built:
        """A scenario whose workload is a Chakra trace: its ranks must be the cluster's GPUs."""
        for name in ("model", "job"):
            if getattr(self, name) is not None:
                raise ScenarioError(f"give either {name} or workload, not both", field=name,
                                    fix="a trace already fixes the model, layout and job")
        if self.parallel != type(self.parallel)():
            raise ScenarioError("a trace already fixes the parallel layout", field="parallel",
                                fix="drop the parallel section")
        folder = Path(self.workload.chakra)
        if base is not None and not folder.is_absolute():
            folder = base / folder
        from lightrail.workload.chakra import read_chakra

        try:
            trace = read_chakra(folder)
        except LightrailError as e:
            field = f"workload.chakra: {e.field}" if e.field and e.field != "DIR" else "workload.chakra"
            raise type(e)(e.message, field=field, fix=e.fix) from None
        if trace.world != self.cluster.gpus:
            raise ScenarioError(f"the trace has {trace.world} ranks, the cluster {self.cluster.gpus} GPUs",
                                field="cluster.gpus", fix=f"set cluster.gpus: {trace.world}")
        accel, fabric, params, costs, rail_speed = self._fabric()
        terms = self._engine_terms()
        topology = self._topology(trace.world, fabric)
        return Built(self, None, accel, None, fabric, params, costs, rail_speed, trace=trace, topology=topology,
                     engine=terms)

    def _engine_terms(self) -> EngineTerms:
        """The engine section's endpoint delay and local memory rate, in seconds and bytes/s."""
        from lightrail.sim.costs import EngineTerms

        delay, rate = self._engine_values()
        return EngineTerms(endpoint_delay=delay, local_mem_bw=rate)

    def _engine_values(self) -> tuple[float, float | None]:
        """:meth:`_engine_terms`' two numbers (a model's build checks them, with no engine to import)."""
        e = self.engine
        delay = e.endpoint_delay
        if isinstance(delay, bool) or (isinstance(delay, (int, float)) and delay != 0):
            raise ScenarioError(f"{delay!r} has no unit", field="engine.endpoint_delay",
                                fix="give a time with a unit, e.g. 10ns, 1us; 0 for none")
        seconds = parse_time(delay, field="engine.endpoint_delay")
        rate = None if e.local_mem_bw is None else parse_rate(e.local_mem_bw, field="engine.local_mem_bw")
        return seconds, rate

    @property
    def topology_kind(self) -> str:
        """``cluster.topology`` as :func:`lightrail.fabric.builders.build_topology` names it (torus: torus2d or
        torus3d by the length of ``cluster.shape``; fat_tree: fat-tree)."""
        c = self.cluster
        kind = _TOPOLOGY_ALIASES.get(c.topology, c.topology)
        if kind == "torus":
            kind = f"torus{len(c.shape)}d" if c.shape and len(c.shape) in (2, 3) else "torus2d"
        return kind

    def _topology(self, world: int, fabric: RailFabric | None = None) -> Topology | None:
        """The cluster's network for ``world`` GPUs (None without a fabric, or for one GPU); arguments that
        its topology does not take are refused, and the builder's errors name the cluster field at fault."""
        from lightrail.fabric.builders import build_topology

        c = self.cluster
        kind = self.topology_kind
        given = {"shape": c.shape is not None, "hosts_per_leaf": c.hosts_per_leaf is not None,
                 "oversubscription": c.oversubscription is not None}
        takes = {"shape": kind.startswith("torus"), "hosts_per_leaf": kind == "fat-tree",
                 "oversubscription": kind == "fat-tree"}
        for name in given:
            if given[name] and not takes[name]:
                owner = "a torus" if name == "shape" else "a fat tree"
                raise ScenarioError(f"only {owner} takes {name}, and the topology is {c.topology}",
                                    field=f"cluster.{name}", fix=f"drop it, or set cluster.topology to "
                                    f"{'torus' if name == 'shape' else 'fat-tree'}")
        if fabric is None or world < 2:
            return None
        args = {"shape": tuple(c.shape) if c.shape is not None else None,
                "hosts_per_leaf": c.hosts_per_leaf, "oversubscription": c.oversubscription}
        try:
            return build_topology(kind, world, bandwidth=fabric.nic_bandwidth, latency=fabric.latency,
                                  gpus_per_server=c.gpus_per_server, nvlink_bandwidth=fabric.nvlink_bandwidth,
                                  routing=fabric.routing, **{k: v for k, v in args.items() if v is not None})
        except LightrailError as e:
            field = _BUILDER_FIELDS.get(e.field or "", f"cluster.{e.field}" if e.field else "cluster.topology")
            raise type(e)(e.message, field=field, fix=e.fix) from None



class _Policy:
    """The ``ocs`` section's :meth:`policy`, the pydantic section's and a plain one's."""

    def policy(self) -> Policy:
        """The section's policy fields as the one Policy object the Plan carries."""
        return Policy(**{f.name: getattr(self, f.name) for f in fields(Policy)})


@functools.cache
def _pydantic() -> dict[str, Any]:
    """The pydantic models, made once on first use (``from lightrail.scenario import Scenario`` reads them)."""
    from typing import Annotated

    from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

    class _Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")


    Duration = Annotated[str, BeforeValidator(_time_text)]
    """A time with a unit (``10ms``, ``3us``), or a bare 0."""

    class ModelSection(_Strict):
        preset: str | None = Field(None, description="A preset: debug, llama3-8b, llama3-70b, llama3-405b, gpt3-175b, "
                                                     "mixtral-8x7b, deepseek-v3.")
        hf_config: str | None = Field(None, description="Path to a HuggingFace config.json (relative to the scenario).")
        seq_len: int | None = Field(None, ge=1, description="Training sequence length in tokens; required with "
                                    "hf_config (never the config's maximum context); a preset's own otherwise.")
        tied_embeddings: bool | None = Field(None, description="The output layer shares the input embedding matrix "
                                             "(default: the preset's, or hf_config's tie_word_embeddings); with pp > 1 "
                                             "its gradient is all-reduced between the first and the last stage.")
        overrides: dict[str, Any] = Field(default_factory=dict, description="ModelSpec fields to change, e.g. seq_len.")


    class WorkloadSection(_Strict):
        chakra: str = Field(description="Folder of Chakra execution traces, one PREFIX.RANK.et per rank (relative to "
                                        "the scenario); replaces the model, parallel and job sections.")


    class ClusterSection(_Strict):
        gpus: int = Field(description="Number of GPUs in the job.")
        gpus_per_server: int = Field(GPUS_PER_SERVER, description="GPUs per server (NVLink domain) = rails.")
        gpu: str = Field("h200", description="GPU preset: h100, h200, b200, a100.")
        rail_bandwidth: str | None = Field(None, description="NIC / rail rate per GPU, e.g. 400Gbps (default: the "
                                                             "GPU's).")
        nvlink_bandwidth: str | None = Field(None, description="NVLink rate per GPU per direction (default: the "
                                                               "GPU's).")
        latency: Duration = Field(format_time(HOP_LATENCY), description="Latency per hop.")
        alpha: Duration = Field(format_time(ALPHA), description="Start-up cost per collective step.")
        peak_tflops: float | None = Field(None, gt=0, description="Dense BF16 peak of one GPU in TFLOP/s (default: the "
                                                                   "GPU preset's); e.g. a measured CPU rate.")
        routing: Literal["pxn", "ecmp"] = Field(RailFabric.routing, description="Electrical rails: NCCL's PXN (a "
                                                "flow uses the rail of its destination GPU, as photonic rails do) or "
                                                "ECMP over both rails of a cross-rail flow.")
        topology: Literal["rails", "ring", "switch", "torus", "torus2d", "torus3d", "fat-tree", "fat_tree"] = Field(
            "rails", description="The network: rails (servers on NVLink, one rail switch per GPU of a server; the only "
            "one a model runs on) or, for a trace (workload: {chakra: DIR}), ring, switch, torus (torus2d, torus3d; "
            "sides in shape) or fat-tree (fat_tree; hosts_per_leaf, oversubscription). Every link of a topology other "
            "than rails runs at rail_bandwidth, with latency per hop; nvlink_bandwidth and gpus_per_server are rails' "
            "alone.")
        shape: list[int] | None = Field(None, description="Torus sides, e.g. [4, 4] (their product is gpus; default: "
                                        "as square as possible, 2D for torus).")
        hosts_per_leaf: int | None = Field(None, ge=1, description="Fat tree: GPUs under one leaf switch (default: "
                                                                   "32).")
        oversubscription: float | None = Field(None, ge=1, description="Fat tree: a leaf's down over up capacity (1: "
                                               "non-blocking, the default).")


    class EngineSection(_Strict):
        sharing: Literal["fair", "none"] = Field(RailFabric.sharing, description="Ops in flight at once share links at "
                                                 "max-min fair rates (fair), or each runs as if alone (none).")
        collectives: Literal["nccl", "schedules"] = Field(
            RailFabric.collectives, description="nccl: a collective runs as NCCL runs it (the algorithm and protocol "
            "NCCL's tuner picks per size, its latencies and protocol efficiencies); schedules: lightrail's step engine "
            "times the registry's schedule (textbook alpha-beta per step, as ASTRA-sim).")
        endpoint_delay: str | int | float = Field("0s", description="Time each step's data waits at its endpoints, "
                                                  "charged once per step and once more per collective (ASTRA-sim's "
                                                  "endpoint-delay, e.g. 10ns); a time with a unit, 0 for none. Trace "
                                                  "scenarios only.")
        local_mem_bw: str | None = Field(None, description="Rate of the local memory a reduction streams through (a "
                                         "step reducing c chunks into a rank adds 3 c chunk_bytes / local_mem_bw, "
                                         "ASTRA-sim's local-mem-bw), e.g. 1600GBps; default: not charged. Trace "
                                         "scenarios only.")


    class ParallelSection(_Strict):
        tp: int = Field(1, description="Tensor parallel degree (inside a server).")
        cp: int = Field(1, description="Context parallel degree.")
        ep: int = Field(1, description="Expert parallel degree (MoE models).")
        dp: int = Field(-1, description="Data parallel degree; -1 = the rest.")
        pp: int = Field(1, description="Pipeline stages.")


    class JobSection(_Strict):
        micro_batches: int = Field(description="Micro-batches per pipeline per iteration.")
        micro_batch_size: int = Field(_JOB["micro_batch_size"], description="Sequences per micro-batch.")
        mfu: float = Field(_JOB["mfu"], description="Fraction of peak FLOP/s achieved by compute.")
        distributed_optimizer: bool | None = Field(
            _JOB["distributed_optimizer"], description="Megatron's distributed optimizer (ZeRO-1): gradients "
            "reduce-scattered, parameters all-gathered after the step. Off by default, as Megatron's "
            "--use-distributed-optimizer (megatron/training/arguments.py).")
        zero: bool | None = Field(_JOB["zero"], description="The old spelling of distributed_optimizer (still read; "
                                  "both given and different is an error).")
        overlap_grad_reduce: bool = Field(_JOB["overlap_grad_reduce"], description="Launch gradient buckets during "
                                          "the last backward (dp_buckets of them) instead of one bucket after it. Off "
                                          "by default, as Megatron's --overlap-grad-reduce.")
        overlap_param_gather: bool = Field(_JOB["overlap_param_gather"], description="Run the distributed optimizer's "
                                           "parameter all-gathers behind the next forward instead of after the step "
                                           "(needs distributed_optimizer and overlap_grad_reduce). Off by default, as "
                                           "Megatron's --overlap-param-gather.")
        sequence_parallel: bool = Field(_JOB["sequence_parallel"], description="Sequence parallelism: tensor-parallel "
                                        "all-reduces become all-gather + reduce-scatter, and LayerNorm gradients are "
                                        "all-reduced over tp after the backward. Off by default, as Megatron's "
                                        "--sequence-parallel (ModelParallelConfig).")
        grad_clip: float = Field(_JOB["grad_clip"], description="Gradient clipping by the global L2 norm (0: off). "
                                 "1.0 by default, as Megatron's --clip-grad; the grad-norm all-reduce runs either way "
                                 "(Megatron's ChainedOptimizer reduces the norm every step).")
        megatron_step: bool = Field(_JOB["megatron_step"], description="Megatron's step after the last backward "
                                    "(finalize_model_grads, the optimizer step, train_step's reductions) as Megatron "
                                    "issues it; false: only the gradient buckets, all asynchronous (lightrail before "
                                    "it modelled the step, for comparison).")
        dp_buckets: int = Field(SCENARIO_DP_BUCKETS, description="Gradient buckets launched during the last backward "
                                "with overlap_grad_reduce (without it Megatron reduces one bucket per buffer).")
        grad_bytes: int = Field(_JOB["grad_bytes"], description="Bytes per gradient element in the gradient "
                                "reductions: 4 (fp32), as Megatron reduces bf16 training's gradients; 2 with its "
                                "--grad-reduce-in-bf16.")
        schedule: Literal["1f1b", "gpipe", "interleaved"] = Field(
            _JOB["schedule"].value, description="Pipeline schedule: 1F1B (Megatron), GPipe (all forwards, then all "
            "backwards), or interleaved 1F1B (Megatron's virtual pipeline stages; needs virtual_stages >= 2 and "
            "micro_batches a multiple of pp).")
        virtual_stages: int = Field(_JOB["virtual_stages"], description="Model chunks per pipeline stage with "
                                    "schedule: "
                                    "interleaved (Megatron's virtual_pipeline_model_parallel_size; each chunk holds "
                                    "layers/(pp x virtual_stages) layers); 1 for the other schedules.")
        moe_dispatch: Literal["payload", "padded"] = Field(_JOB["moe_dispatch"], description="MoE all-to-all: payload "
                                                           "(routed tokens only) or padded (every expert's capacity "
                                                           "slots, GShard).")
        capacity_factor: float = Field(_JOB["capacity_factor"], gt=0, description="Slots per expert over the uniform "
                                       "share (moe_dispatch: padded).")
        moe_imbalance: float = Field(_JOB["moe_imbalance"], ge=1, description="Max/mean tokens per destination rank of "
                                     "the MoE all-to-all (1: uniform routing; lightrail moe bench measures it).")
        pipeline_layers: Literal["even", "balanced"] | list[int] = Field(
            _JOB["pipeline_layers"], description="Layers per pipeline stage: even (pp divides the layers), balanced "
            "(Llama 3 405B's recipe: one fewer on the first and last stages until they fit), or one count per stage.")


    class _OcsFacts(_Policy, _Strict):
        """The ``ocs`` section's hardware and control-plane facts; its policy fields come from ``Policy``."""

        reconfig_delay: Duration = Field(f"{RECONFIG_DELAY * 1e3:g}ms",
                                         description="OCS reconfiguration delay (MEMS: 10-25 ms); 0 for none.")
        check_in_rtt: Duration = Field(f"{CHECK_IN_RTT * 1e3:g}ms", description="Round trip of a rank's check-in "
                                       "with the controller (default: lightrail's controller, measured; see "
                                       "fabric/params.py).")
        command_latency: Duration = Field(f"{COMMAND_LATENCY * 1e3:g}ms", description="From the controller's "
                                          "decision to the start of a reconfiguration (default: measured, see "
                                          "fabric/params.py).")
        revoke_rtt: Duration = Field(f"{REVOKE_RTT * 1e3:g}ms", description="From the controller's revoke of a "
                                     "lease to "
                                     "its end, every holder's ack in (default: lightrail's controller, measured; see "
                                     "fabric/params.py).")
        switch_grant_latency: Duration = Field("0ms", description="From a switch's end to the grant of the group that "
                                               "waited for it (default 0: included in command_latency; train-demo "
                                               "reads it from its controller; see fabric/params.py).")

    def _policy_field(f) -> tuple[Any, Any]:
        """A ``Policy`` field as an ``ocs`` section field: its type, default and doc (declared once, in Policy)."""
        if f.name == "mode":
            return (Literal[(*(m.value for m in Mode), "on_demand")],
                    Field(f.default.value, description=f.metadata["doc"]))
        return bool, Field(f.default, description=f.metadata["doc"])


    OcsSection = create_model("OcsSection", __base__=_OcsFacts, __module__=__name__,
                              **{f.name: _policy_field(f) for f in fields(Policy)})
    """The ``ocs`` section: the facts above and the policy's fields (``control.plan.Policy``, defaults lightrail's)."""


    class Scenario(_Builds, _Strict):
        """A whole simulation input (see ``examples/*.yaml`` for annotated copies)."""

        name: str = Field("scenario", description="A label for outputs.")
        model: str | ModelSection | None = Field(None, description="A preset name, or a model section (or give "
                                                                  "workload instead).")
        workload: WorkloadSection | None = Field(None, description="A recorded workload instead of a model: "
                                                                   "{chakra: DIR}.")
        cluster: ClusterSection
        parallel: ParallelSection = Field(default_factory=ParallelSection)
        job: JobSection | None = Field(None, description="The training job (required with a model).")
        ocs: OcsSection = Field(default_factory=OcsSection)
        engine: EngineSection = Field(default_factory=EngineSection, description="The step engine's terms: link "
                                      "sharing among ops in flight, endpoint delay, local memory rate.")
        costs: dict[str, float | int | bool] = Field(default_factory=dict, description="CostFacts overrides.")

    made = {name: value for name, value in locals().items() if name in _MODELS}
    for name, model in made.items():
        if isinstance(model, type):
            model.__qualname__ = name  # pickled by reference, as lightrail.scenario.<name> (module __getattr__)
    return made


def __getattr__(name: str):
    if name in _MODELS:
        value = globals()[name] = _pydantic()[name]
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Built:
    scenario: Scenario
    model: ModelSpec
    gpu: GPU
    job: TrainingJob
    fabric: RailFabric
    policy: Policy
    """The OCS policy (``ocs``), the one the Plan carries."""
    costs: CostFacts
    rail_speed: str
    trace: ChakraTrace | None = None
    """A scenario's recorded workload (``workload: {chakra: DIR}``); then ``model`` and ``job`` are None."""
    topology: Topology | None = None
    """A trace's network for its ranks (``cluster.topology``, rails by default; None for a model, whose
    iteration runs on the rails of ``fabric``, or a one-rank trace)."""
    engine: EngineTerms | None = None
    """A trace's engine terms (``engine.endpoint_delay``, ``engine.local_mem_bw``; None for a model)."""

    @property
    def params(self) -> Policy:
        """The old name of ``policy`` (still read)."""
        return self.policy


def _model(spec: str | ModelSection, base: Path | None) -> ModelSpec:
    if isinstance(spec, str):
        return preset(spec)
    if (spec.preset is None) == (spec.hf_config is None):
        raise ScenarioError("give exactly one of preset or hf_config", field="model",
                            fix="e.g. model: {preset: llama3-8b} or model: {hf_config: config.json}")
    if spec.preset is not None:
        model = preset(spec.preset)
    else:
        if spec.seq_len is None and "seq_len" not in spec.overrides:
            raise ScenarioError("a HuggingFace config gives the maximum context, not the training sequence length",
                                field="model.seq_len", fix="give it, e.g. model: {hf_config: ..., seq_len: 4096}")
        path = Path(spec.hf_config)
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            model = model_from_hf_config(path, seq_len=spec.seq_len)
        except LightrailError as e:  # name the scenario field, then the file's own (its path, or path: key)
            raise type(e)(e.message, field=f"model.hf_config: {e.field}" if e.field else "model.hf_config",
                          fix=e.fix) from None
    if spec.seq_len is not None:
        model = model.with_(seq_len=spec.seq_len)
    if spec.tied_embeddings is not None:
        model = model.with_(tied_embeddings=spec.tied_embeddings)
    try:
        return model.with_(**spec.overrides) if spec.overrides else model
    except TypeError as e:
        raise ScenarioError(str(e), field="model.overrides") from None
    except LightrailError as e:  # a bad override is named as the scenario spells it: model.overrides.layers
        key = (e.field or "").removeprefix("model.")
        if key in spec.overrides:
            e.field = f"model.overrides.{key}"
        raise


DEFAULT_SCENARIO: dict = {
    "name": "llama3-70b-2048xh200",
    "model": "llama3-70b",
    "cluster": {"gpus": 2048, "gpus_per_server": 8, "gpu": "h200", "rail_bandwidth": "400Gbps"},
    "parallel": {"tp": 8, "pp": 8, "dp": 32},
    "job": {"micro_batches": 16, "overlap_grad_reduce": True},
}
"""Llama-3 70B on 2,048 H200 GPUs, TP8 x PP8 x DP32, 400 Gb/s rails; 4 gradient buckets overlapping the last
backward (Megatron's --overlap-grad-reduce, on in its Llama recipes); the rest takes the scenario defaults (mfu
0.4, Megatron's step, OCS delay 10 ms, provisioned)."""


def parse_scenario(data: Any, *, source: str = "scenario") -> Scenario:
    """Validate a scenario mapping; the error names the first bad field and the fix."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source} must be a mapping of sections", field=source,
                            fix="see examples/llama3-70b-2048xh200.yaml")
    from pydantic import ValidationError

    try:
        return _pydantic()["Scenario"].model_validate(data)
    except ValidationError as e:
        raise first_error(e, source=source, hint="see examples/") from None


def load_scenario(path: str | Path | None) -> tuple[Scenario, Path | None]:
    """Read a YAML or JSON scenario (None: the embedded default); returns it and its folder."""
    if path is None:
        return parse_scenario(DEFAULT_SCENARIO), None
    path = Path(path)
    data = read_mapping(path, field="SCENARIO")
    return parse_scenario(data, source=path.name), path.parent
