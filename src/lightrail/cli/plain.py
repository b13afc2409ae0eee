"""A scenario file read without pydantic when its values are plain (issue 33: pydantic is ~70 ms of a small job).

Plain: every field of its own type as the pydantic models declare it (a string where a string goes, an int for an
int, a float or int for a float, within the field's bounds), no unknown key, a model and a job. Such a scenario
becomes a :class:`PlainScenario`, which builds with the pydantic Scenario's own methods
(``lightrail.scenario._Builds``) and hands anything else asked of it to the pydantic Scenario of the same values.
Anything not plain (a trace, a missing field, ``"4"`` for an int, a typo) goes to the pydantic models, so every
error and every conversion is theirs. ``tests/cli/test_plain_scenario.py`` checks the fields agree with the
models' and that both read the examples, and many variations of them, alike.
"""

from __future__ import annotations

import functools
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightrail.control.plan import Mode, Policy
from lightrail.defaults import GPUS_PER_SERVER
from lightrail.fabric.params import (
    ALPHA,
    CHECK_IN_RTT,
    COMMAND_LATENCY,
    HOP_LATENCY,
    RECONFIG_DELAY,
    REVOKE_RTT,
    RailFabric,
)
from lightrail.scenario import _JOB, DEFAULT_SCENARIO, _Builds, _Policy, _time_text, parse_scenario
from lightrail.units import format_time
from lightrail.validation import read_mapping
from lightrail.workload.program import SCENARIO_DP_BUCKETS

if TYPE_CHECKING:
    from lightrail.scenario import Scenario

__all__ = ["PlainScenario", "load_scenario"]


def load_scenario(path: str | Path | None) -> tuple[Scenario | PlainScenario, Path | None]:
    """``lightrail.scenario.load_scenario``, returning a :class:`PlainScenario` when the values are plain."""
    data, source = (DEFAULT_SCENARIO, "scenario") if path is None else (read_mapping(path, field="SCENARIO"),
                                                                         Path(path).name)
    return PlainScenario.read(data, source) or parse_scenario(data, source=source), \
        None if path is None else Path(path).parent


class _NotPlain(Exception):
    """A value the plain reading leaves to pydantic (which may take it, convert it, or refuse it)."""


def _typed(*types, copy=None, check=None):
    """A field of exactly one of ``types`` (``bool`` is no ``int``), meeting ``check``, kept as is (``copy``d)."""

    def read(value):
        if type(value) not in types or (check is not None and not check(value)):
            raise _NotPlain
        return copy(value) if copy else value

    return read


def _number(kind, *, gt=None, ge=None):
    """An ``int`` field, or a ``float`` field (an int read as its float, as pydantic does), within bounds."""

    def read(value):
        if type(value) not in ((int,) if kind is int else (int, float)):
            raise _NotPlain
        if (gt is not None and not value > gt) or (ge is not None and not value >= ge):
            raise _NotPlain
        return kind(value)

    return read


def _optional(read):
    return lambda value: None if value is None else read(value)


def _one_of(*values):
    return _typed(str, check=lambda v: v in values)


def _duration(value):
    """``Duration``: a time's text; a bare number becomes its text (``_time_text``)."""
    return _typed(str)(_time_text(value) if type(value) in (int, float) else value)


def _ints(value):
    return _typed(list, copy=list, check=lambda v: all(type(x) is int for x in v))(value)


_STR, _BOOL, _INT, _FLOAT = _typed(str), _typed(bool), _number(int), _number(float)
_REQUIRED = object()
_SECTIONS: dict[str, tuple[tuple[str, Any, Any], ...]] = {
    "model": (("preset", _optional(_STR), None), ("hf_config", _optional(_STR), None),
              ("seq_len", _optional(_number(int, ge=1)), None), ("tied_embeddings", _optional(_BOOL), None),
              ("overrides", _typed(dict, copy=dict, check=lambda v: all(type(k) is str for k in v)), dict)),
    "cluster": (("gpus", _INT, _REQUIRED), ("gpus_per_server", _INT, GPUS_PER_SERVER), ("gpu", _STR, "h200"),
                ("rail_bandwidth", _optional(_STR), None), ("nvlink_bandwidth", _optional(_STR), None),
                ("latency", _duration, format_time(HOP_LATENCY)), ("alpha", _duration, format_time(ALPHA)),
                ("peak_tflops", _optional(_number(float, gt=0)), None),
                ("routing", _one_of("pxn", "ecmp"), RailFabric.routing),
                ("topology", _one_of("rails", "ring", "switch", "torus", "torus2d", "torus3d", "fat-tree",
                                     "fat_tree"), "rails"),
                ("shape", _optional(_ints), None), ("hosts_per_leaf", _optional(_number(int, ge=1)), None),
                ("oversubscription", _optional(_number(float, ge=1)), None)),
    "parallel": tuple((dim, _INT, default) for dim, default in (("tp", 1), ("cp", 1), ("ep", 1), ("dp", -1),
                                                                 ("pp", 1))),
    "job": (("micro_batches", _INT, _REQUIRED), ("micro_batch_size", _INT, _JOB["micro_batch_size"]),
            ("mfu", _FLOAT, _JOB["mfu"]), ("distributed_optimizer", _optional(_BOOL), _JOB["distributed_optimizer"]),
            ("zero", _optional(_BOOL), _JOB["zero"]),
            *((name, _BOOL, _JOB[name]) for name in ("overlap_grad_reduce", "overlap_param_gather",
                                                      "sequence_parallel")),
            ("grad_clip", _FLOAT, _JOB["grad_clip"]), ("megatron_step", _BOOL, _JOB["megatron_step"]),
            ("dp_buckets", _INT, SCENARIO_DP_BUCKETS), ("grad_bytes", _INT, _JOB["grad_bytes"]),
            ("schedule", _one_of("1f1b", "gpipe", "interleaved"), _JOB["schedule"].value),
            ("virtual_stages", _INT, _JOB["virtual_stages"]),
            ("moe_dispatch", _one_of("payload", "padded"), _JOB["moe_dispatch"]),
            ("capacity_factor", _number(float, gt=0), _JOB["capacity_factor"]),
            ("moe_imbalance", _number(float, ge=1), _JOB["moe_imbalance"]),
            ("pipeline_layers", lambda v: _ints(v) if type(v) is list else _one_of("even", "balanced")(v),
             _JOB["pipeline_layers"])),
    "ocs": (("reconfig_delay", _duration, f"{RECONFIG_DELAY * 1e3:g}ms"),
            ("check_in_rtt", _duration, f"{CHECK_IN_RTT * 1e3:g}ms"),
            ("command_latency", _duration, f"{COMMAND_LATENCY * 1e3:g}ms"),
            ("revoke_rtt", _duration, f"{REVOKE_RTT * 1e3:g}ms"), ("switch_grant_latency", _duration, "0ms"),
            *((f.name, _one_of(*(m.value for m in Mode), "on_demand") if f.name == "mode" else _BOOL,
               f.default.value if f.name == "mode" else f.default) for f in fields(Policy))),
    "engine": (("sharing", _one_of("fair", "none"), RailFabric.sharing),
               ("collectives", _one_of("nccl", "schedules"), RailFabric.collectives),
               ("endpoint_delay", _typed(str, int, float), "0s"), ("local_mem_bw", _optional(_STR), None)),
}
"""Each section's fields as the pydantic models declare them (name, reading, default), in their order;
``tests/test_scenario_plain.py`` checks both agree."""


class _Section(_Policy):
    """A section read plainly: its fields as attributes (``policy()`` is the ``ocs`` section's)."""

    def __init__(self, name: str, data: Any):
        if type(data) is not dict or not set(data) <= {f for f, _, _ in _SECTIONS[name]}:
            raise _NotPlain
        for field, read, default in _SECTIONS[name]:
            if field in data:
                value = read(data[field])
            elif default is _REQUIRED:
                raise _NotPlain
            else:
                value = default() if default is dict else default
            setattr(self, field, value)
        self._name = name

    def model_dump(self) -> dict:
        return {field: getattr(self, field) for field, _, _ in _SECTIONS[self._name]}

    def __eq__(self, other) -> bool:
        return isinstance(other, _Section) and self.model_dump() == other.model_dump()


class PlainScenario(_Builds):
    """A scenario whose values are all plain, read without pydantic: builds as the pydantic :class:`Scenario`
    would, and hands anything else asked of it (``model_dump``, ``model_json_schema``, ...) to that Scenario,
    validated on first need."""

    _FIELDS = ("name", "model", "workload", "cluster", "parallel", "job", "ocs", "engine", "costs")

    @classmethod
    def read(cls, data: Any, source: str = "scenario") -> PlainScenario | None:
        """The plain scenario of ``data``, or None if pydantic must read it (then it errs, or converts)."""
        try:
            return cls(data, source)
        except _NotPlain:
            return None

    def __init__(self, data: Any, source: str):
        if type(data) is not dict or not set(data) <= set(self._FIELDS) or "cluster" not in data:
            raise _NotPlain
        if data.get("workload") is not None or data.get("model") is None or data.get("job") is None:
            raise _NotPlain  # traces, and the errors of a model without a job, are the models' to handle
        self._data, self._source = data, source
        self.name = _STR(data.get("name", "scenario"))
        model = data["model"]
        self.model = model if type(model) is str else _Section("model", model)
        self.workload = None
        for name in ("cluster", "parallel", "job", "ocs", "engine"):
            setattr(self, name, _Section(name, data.get(name, {})))
        costs = data.get("costs", {})
        self.costs = _typed(dict, copy=dict, check=lambda v: all(
            type(k) is str and type(x) in (int, float, bool) for k, x in v.items()))(costs)

    @functools.cached_property
    def validated(self) -> Scenario:
        """The pydantic Scenario of the same values."""
        return parse_scenario(self._data, source=self._source)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_data", "_source"):
            raise AttributeError(name)
        return getattr(self.validated, name)
