"""Scale-up slice requests as clusters issue them: a count of accelerators or a torus shape, with arrival and
duration; the default mix, trace files, and the Alibaba GPU-cluster pod trace.

A request is written ``"12"`` (twelve accelerators, any layout) or ``"4x4x2"`` (a torus of that shape, as TPU
slices are asked for). Requests are arrays (``Requests``); a count request has shape ``(0, 0, 0)``.

Default mix (``DEFAULT_MIX``; an assumption, documented here and in the README, replace it with a trace): half
of the requests ask for a torus shape, half for a count; small requests are the most frequent, as in every
published GPU-cluster trace (Philly, ATC'19; Alibaba PAI, NSDI'22: most jobs use few GPUs, most GPU-time goes
to large jobs). Shapes are the TPU-style ones (2x2x1, 2x2x2, 2x2x4, 4x4x2, 4x4x4) plus sides of 3 (2x2x3,
4x2x3, 4x4x3: 12, 24 and 48 accelerators); counts include sizes that are not powers of two (6, 12, 20, 40),
as real clusters ask for (a job sized to a model's pipeline, or to the nodes left after a failure). No
public trace of torus-shaped requests exists that lightrail could read offline (the Philly trace is a
1 GB Git LFS object and the Alibaba PAI job table a download, neither reachable here).

Trace files (CSV, ``#`` lines are comments):

- ``arrival_s,size,duration_s`` or ``arrival_s,size,duration_s,shape`` (``shape`` empty or ``AxBxC`` whose
  volume is ``size``);
- the pod list of Alibaba's GPU cluster trace (``alibaba/clusterdata``, ``cluster-trace-gpu-v2023/csv/
  openb_pod_list_*.csv``: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,...,creation_time,deletion_time,...``),
  read as published: each pod with GPUs asks for ``num_gpu`` accelerators at ``creation_time`` for
  ``deletion_time - creation_time`` seconds; pods without GPUs or without a deletion time (still running
  when the trace ends) are left out. A shared GPU (``gpu_milli < 1000``) still takes a whole accelerator.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from lightrail.control.scaleup import request_shapes
from lightrail.errors import LightrailError, ScenarioError
from lightrail.fabric.scaleup import RackSpec

__all__ = ["DEFAULT_MIX", "Requests", "parse_request", "request_label", "check_mix", "generate_requests",
           "parse_trace", "OPENB_COLUMNS"]

DEFAULT_MIX: tuple[tuple[str, float], ...] = (
    ("2x2x1", 0.12), ("2x2x2", 0.10), ("2x2x3", 0.06), ("2x2x4", 0.08), ("4x2x3", 0.04), ("4x4x2", 0.06),
    ("4x4x3", 0.02), ("4x4x4", 0.02),
    ("4", 0.12), ("6", 0.06), ("8", 0.10), ("12", 0.06), ("16", 0.06), ("20", 0.04), ("32", 0.04), ("40", 0.02),
)
"""Request -> probability of the default stream (an assumption, see the module's docstring)."""
OPENB_COLUMNS = ("name", "num_gpu", "creation_time", "deletion_time")
"""The columns of Alibaba's pod list the loader reads."""
_SHAPE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*$")


@dataclass(frozen=True)
class Requests:
    """Slice requests as arrays, sorted by arrival (seconds, accelerators, seconds, torus shape or zeros)."""

    arrival_s: np.ndarray
    size: np.ndarray
    duration_s: np.ndarray
    shape: np.ndarray = field(default=None)  # (n, 3); (0, 0, 0) for a count request

    def __post_init__(self):
        if self.shape is None:
            object.__setattr__(self, "shape", np.zeros((len(self.arrival_s), 3), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.arrival_s)

    def kind(self, i: int) -> tuple[int, tuple[int, int, int] | None]:
        """Request i as ``(size, shape or None)``."""
        s = tuple(int(v) for v in self.shape[i])
        return int(self.size[i]), (s if s[0] else None)


def parse_request(text, *, field: str = "mix", spec: RackSpec | None = None) -> tuple[int, tuple | None]:
    """``"12"`` -> ``(12, None)``; ``"4x4x2"`` -> ``(32, (4, 4, 2))``; checked against the rack (``spec``)."""
    spec = spec or RackSpec()
    raw = str(text).strip()
    m = _SHAPE.match(raw)
    fix = f"a count of 1..{spec.accelerators} accelerators or a torus shape such as 4x4x2"
    if m:
        shape = tuple(int(v) for v in m.groups())
        size = shape[0] * shape[1] * shape[2]
    elif raw.isdigit():
        shape, size = None, int(raw)
    else:
        raise ScenarioError(f"request {raw!r}", field=field, fix=fix)
    try:
        request_shapes(spec, size, shape)  # the electrical rack can hold it (or refuses with why)
    except LightrailError as e:
        raise ScenarioError(f"request {raw!r}: {e.message}", field=field, fix=e.fix or fix) from None
    return size, shape


def request_label(size: int, shape) -> str:
    """``"12"`` for a count request, ``"4x4x2"`` for a shaped one."""
    if shape is not None and len(shape) and int(shape[0]):
        return "x".join(str(int(v)) for v in shape)
    return str(int(size))


def check_mix(mix, *, spec: RackSpec | None = None) -> tuple[tuple[str, float], ...]:
    """A mix as ``(label, probability)`` pairs; entries may be ints (counts), labels or shapes."""
    out = []
    for req, p in mix:
        label = request_label(*parse_request(req if not isinstance(req, tuple) else "x".join(map(str, req)),
                                             spec=spec))
        if not (isinstance(p, int | float) and p >= 0 and math.isfinite(p)):
            raise ScenarioError(f"probability {p!r} of {label}", field="mix", fix="probabilities >= 0")
        out.append((label, float(p)))
    if not out or abs(sum(p for _, p in out) - 1) > 1e-9:
        raise ScenarioError(f"mix={mix}", field="mix", fix="requests with probabilities summing to 1")
    return tuple(out)


def generate_requests(mix, *, requests: int, racks: int, load: float, mean_duration_s: float,
                      spec: RackSpec, rng: np.random.Generator) -> Requests:
    """Poisson arrivals at the offered load (arrival rate x mean size x mean duration / torus accelerators),
    requests drawn from ``mix``, exponential durations."""
    kinds = [parse_request(label, spec=spec) for label, _ in mix]
    probs = np.array([p for _, p in mix])
    sizes = np.array([s for s, _ in kinds], dtype=np.int64)
    shapes = np.array([sh or (0, 0, 0) for _, sh in kinds], dtype=np.int64)
    rate = load * racks * spec.accelerators / (float(sizes @ probs) * mean_duration_s)
    arrival = np.cumsum(rng.exponential(1 / rate, requests))
    pick = rng.choice(len(kinds), size=requests, p=probs)
    duration = rng.exponential(mean_duration_s, requests)
    return Requests(arrival, sizes[pick], duration, shapes[pick])


def parse_trace(text: str, *, field: str = "--trace", spec: RackSpec | None = None) -> Requests:
    """Read a trace (lightrail's CSV, or Alibaba's pod list); see the module's docstring."""
    spec = spec or RackSpec()
    lines = [(k, ln.strip()) for k, ln in enumerate(text.splitlines(), start=1)
             if ln.strip() and not ln.lstrip().startswith("#")]
    fix = "write a CSV with the header arrival_s,size,duration_s[,shape] and one request a line"
    if not lines:
        raise ScenarioError("the trace's first line is not the header arrival_s,size,duration_s", field=field, fix=fix)
    header = [h.strip() for h in lines[0][1].split(",")]
    if all(c in header for c in OPENB_COLUMNS):
        rows = _openb_rows(header, lines[1:], field=field, spec=spec)
    elif header in (["arrival_s", "size", "duration_s"], ["arrival_s", "size", "duration_s", "shape"]):
        rows = [_row(k, ln, len(header), field=field, spec=spec, fix=fix) for k, ln in lines[1:]]
    else:
        raise ScenarioError("the trace's first line is not the header arrival_s,size,duration_s[,shape] (or "
                            "Alibaba's pod list header)", field=field, fix=fix)
    if not rows:
        raise ScenarioError("the trace holds no request", field=field, fix=fix)
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])  # stable: ties keep file order
    arr = np.array([rows[i][:3] for i in order], dtype=float)
    shapes = np.array([rows[i][3] or (0, 0, 0) for i in order], dtype=np.int64)
    return Requests(arr[:, 0], arr[:, 1].astype(np.int64), arr[:, 2], shapes)


def _row(k: int, ln: str, ncols: int, *, field: str, spec: RackSpec, fix: str):
    parts = [p.strip() for p in ln.split(",")]
    if len(parts) not in (3, ncols):
        raise ScenarioError(f"line {k}: cannot read {ln!r}", field=field, fix=fix)
    try:
        a, s, d = float(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        raise ScenarioError(f"line {k}: cannot read {ln!r}", field=field, fix=fix) from None
    if not (a >= 0 and d > 0 and math.isfinite(a) and math.isfinite(d)):
        raise ScenarioError(f"line {k}: {ln!r}", field=field, fix="arrival >= 0 and duration > 0 seconds")
    label = parts[3] if len(parts) > 3 and parts[3] else str(s)
    try:
        size, shape = parse_request(label, field=field, spec=spec)
    except ScenarioError as e:
        raise ScenarioError(f"line {k}: {e.message}", field=field, fix=e.fix) from None
    if size != s:
        raise ScenarioError(f"line {k}: shape {label} holds {size} accelerators, not {s}", field=field,
                            fix="make size the product of the shape's sides")
    return a, s, d, shape


def _openb_rows(header: list[str], lines, *, field: str, spec: RackSpec):
    col = {c: header.index(c) for c in OPENB_COLUMNS}
    rows = []
    for k, ln in lines:
        parts = [p.strip() for p in ln.split(",")]
        try:
            gpus = int(parts[col["num_gpu"]])
            start = float(parts[col["creation_time"]])
            end = parts[col["deletion_time"]]
        except (ValueError, IndexError):
            raise ScenarioError(f"line {k}: cannot read {ln!r}", field=field,
                                fix="Alibaba's pod list: num_gpu, creation_time and deletion_time") from None
        if gpus <= 0 or not end:  # a CPU pod, or one still running when the trace ends
            continue
        try:
            duration = float(end) - start
        except ValueError:
            raise ScenarioError(f"line {k}: deletion_time {end!r}", field=field, fix="seconds") from None
        if not (start >= 0 and duration > 0 and math.isfinite(duration)):
            continue  # deleted as it was created: no run time to replay
        if gpus > spec.accelerators:
            raise ScenarioError(f"line {k}: {gpus} GPUs", field=field, fix=f"at most {spec.accelerators} per pod")
        rows.append((start, gpus, duration, None))
    return rows
