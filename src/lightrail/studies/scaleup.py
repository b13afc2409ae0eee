"""The scale-up study: a stream of slice requests replayed on many racks, electrical against photonic.

Both fabrics see the same requests and the same accelerator failures (``seed``). Per fabric it reports
acceptance, fragmentation, stranded accelerators, bandwidth per slice, the ring AllReduce time the
timing engine gives each slice on that bandwidth (the training-throughput effect), and what failures
cost. Definitions of bandwidth, fragmentation and stranded accelerators: ``control/scaleup.py``.

Failures. Accelerators fail as a Poisson process, ``racks * 64 / mtbf`` per second, each at a uniformly
drawn torus accelerator; its server leaves service for ``repair_s``. A failure on a running slice is
recovered, in this order of preference:

- **photonic**: *splice* a free spare server of the rack (else any free server of the rack) into the
  slice by rerouting its circuits (an MZI mesh reconfigures in 3.7 µs); the bandwidth after is measured
  on the rerouted circuits;
- both fabrics: *migrate* the slice to a new allocation (the fabric's own allocator, any rack);
- both: run *degraded* on the slice's surviving servers (bandwidth measured on what is left);
- else the job is *lost* (a one-server slice with nowhere to go); its remaining run time is counted.

Every recovery but a splice inside the rack restarts the job from its checkpoint elsewhere or smaller;
the checkpoint restore itself is the same for all and is not priced (no hardware fact for it).

Default request mix (an assumption, documented, overridable by a trace file): sizes 4, 8, 16, 32, 64
accelerators with probabilities 0.30, 0.25, 0.20, 0.15, 0.10; exponential durations of mean 6 h; Poisson
arrivals at an offered load of 0.9 of the torus accelerators. Trace files: CSV with the header
``arrival_s,size,duration_s``, one request a line (``#`` comments allowed); sizes must be slice sizes.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from lightrail.collectives import generate
from lightrail.control.scaleup import (
    SIZES,
    block_fits,
    first_fit_block,
    photonic_allocate,
    photonic_ports,
    splice,
    stranded,
)
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import ring
from lightrail.fabric.params import ALPHA
from lightrail.fabric.scaleup import MZI_RECONFIG_DELAY, RackSpec
from lightrail.timing import Engine

__all__ = ["DEFAULT_MIX", "MTBF", "ScaleupParams", "Requests", "generate_requests", "parse_trace",
           "FailureRecovery", "FabricOutcome", "ScaleupStudy", "scaleup_study", "simulate_fabric", "FABRICS"]

FABRICS = ("electrical", "photonic")
DEFAULT_MIX: tuple[tuple[int, float], ...] = ((4, 0.30), (8, 0.25), (16, 0.20), (32, 0.15), (64, 0.10))
"""Slice size -> probability of the default request stream (an assumption; replace it with a trace)."""
MTBF = 50_000 * 3600.0
"""Mean time between failures of one accelerator, seconds: 419 unexpected interruptions in 54 days on
16,384 GPUs (Llama 3 training report, Meta 2024) is about 50,000 GPU-hours per interruption."""
REPAIR = 24 * 3600.0
"""How long a failed server stays out of service, seconds (an assumption: a day to swap a board)."""


@dataclass(frozen=True, kw_only=True)
class ScaleupParams:
    """Settings of one study run (the CLI fills them from its flags)."""

    racks: int = 100
    requests: int = 10_000
    seed: int = 0
    load: float = 0.9
    """Offered load: arrival rate x mean size x mean duration / torus accelerators."""
    mean_duration_s: float = 6 * 3600.0
    mix: tuple[tuple[int, float], ...] = DEFAULT_MIX
    mtbf_s: float = MTBF
    """Per accelerator, seconds; ``inf`` turns failures off."""
    repair_s: float = REPAIR
    allreduce_bytes: float = 2.0**30
    """Buffer of the ring AllReduce timed on each slice (1 GiB of gradients)."""
    alpha: float = ALPHA
    spec: RackSpec = field(default_factory=RackSpec)

    def __post_init__(self):
        for name, lo in (("racks", 1), ("requests", 1)):
            if getattr(self, name) < lo:
                raise ScenarioError(f"{name}={getattr(self, name)}", field=name, fix=f"use {lo} or more")
        if not 0 < self.load:
            raise ScenarioError(f"load={self.load}", field="load", fix="use a load above 0, e.g. 0.9")
        if not self.mtbf_s > 0:
            raise ScenarioError(f"mtbf={self.mtbf_s}", field="mtbf", fix="use a positive time, e.g. 50000h")
        if self.mean_duration_s <= 0 or self.repair_s < 0:
            raise ScenarioError("durations must be positive", field="mean_duration_s")
        sizes = [s for s, _ in self.mix]
        if any(s not in SIZES for s in sizes) or abs(sum(p for _, p in self.mix) - 1) > 1e-9:
            raise ScenarioError(f"mix={self.mix}", field="mix", fix=f"sizes from {SIZES}, probabilities summing to 1")


@dataclass(frozen=True)
class Requests:
    """Slice requests as arrays, sorted by arrival (seconds, accelerators, seconds)."""

    arrival_s: np.ndarray
    size: np.ndarray
    duration_s: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)


def generate_requests(params: ScaleupParams, rng: np.random.Generator) -> Requests:
    """The default stream: Poisson arrivals at the offered load, sizes from the mix, exponential durations."""
    sizes = np.array([s for s, _ in params.mix])
    probs = np.array([p for _, p in params.mix])
    rate = params.load * params.racks * params.spec.accelerators / (float(sizes @ probs) * params.mean_duration_s)
    arrival = np.cumsum(rng.exponential(1 / rate, params.requests))
    size = rng.choice(sizes, size=params.requests, p=probs)
    duration = rng.exponential(params.mean_duration_s, params.requests)
    return Requests(arrival, size.astype(np.int64), duration)


def parse_trace(text: str, *, field: str = "--trace") -> Requests:
    """Read a trace: CSV with the header ``arrival_s,size,duration_s`` (``#`` lines are comments)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    fix = "write a CSV with the header arrival_s,size,duration_s and one request a line"
    if not lines or [h.strip() for h in lines[0].split(",")] != ["arrival_s", "size", "duration_s"]:
        raise ScenarioError("the trace's first line is not the header arrival_s,size,duration_s", field=field, fix=fix)
    rows = []
    for k, ln in enumerate(lines[1:], start=2):
        parts = ln.split(",")
        try:
            a, s, d = float(parts[0]), int(parts[1]), float(parts[2])
        except (ValueError, IndexError):
            raise ScenarioError(f"line {k}: cannot read {ln!r}", field=field, fix=fix) from None
        if s not in SIZES or not (a >= 0 and d > 0 and math.isfinite(a) and math.isfinite(d)):
            raise ScenarioError(f"line {k}: {ln!r}", field=field,
                                fix=f"sizes from {', '.join(map(str, SIZES))}, arrival >= 0, duration > 0")
        rows.append((a, s, d))
    if not rows:
        raise ScenarioError("the trace holds no request", field=field, fix=fix)
    arr = np.array(rows)
    order = np.argsort(arr[:, 0], kind="stable")
    arr = arr[order]
    return Requests(arr[:, 0], arr[:, 1].astype(np.int64), arr[:, 2])


@dataclass(frozen=True)
class FailureRecovery:
    """What failures cost on one fabric (counts over the run; means over the recovered slices)."""

    failures: int
    on_idle: int
    """Failures of free (or already failed) servers: no job hit."""
    hit: int
    spliced: int
    migrated: int
    degraded: int
    lost: int
    lost_accelerator_hours: float
    """Remaining run time x size of the lost jobs."""
    restarts: int
    """Recoveries that restart the job from its checkpoint elsewhere or smaller (migrated + degraded)."""
    reconfiguration_s: float
    """Circuit reconfiguration per splice (MZI mesh), seconds; 0 when nothing was spliced."""
    mean_bandwidth_after_Bps: float
    mean_bandwidth_ratio_after: float
    """Slice bandwidth after recovery / before, mean over the recovered slices (1.0: nothing lost)."""
    mean_allreduce_slowdown: float
    """Ring AllReduce time after recovery / before, mean over the recovered slices."""


@dataclass(frozen=True)
class FabricOutcome:
    """One fabric's figures (the contract's keys are fields here)."""

    fabric: str
    requests: int
    accepted: int
    acceptance: float
    fragmentation: float
    """Requests refused although one rack held ``size`` free accelerators, over all requests."""
    fragmented_refusals: int
    refused_with_cluster_room: float
    """Requests refused while the cluster as a whole had ``size`` free accelerators (spread over racks; a slice
    lives in one rack, so this counts rack boundaries too), as a fraction of all requests."""
    stranded_fraction: float
    """Summed over arrivals: free accelerators in racks with ``size`` free that cannot place the request, over
    all free accelerators (``control.scaleup.stranded``)."""
    mean_slice_bandwidth_Bps: float
    """Ports per accelerator the slice drives x link bandwidth, at allocation, mean over accepted slices."""
    mean_allreduce_s: float
    """Ring AllReduce of ``allreduce_bytes`` on each accepted slice's bandwidth (timing engine), mean."""
    acceptance_by_size: dict[int, float]
    bandwidth_by_size_Bps: dict[int, float]
    allreduce_by_size_s: dict[int, float]
    failure_recovery: FailureRecovery
    elapsed_s: float


@dataclass(frozen=True)
class ScaleupStudy:
    """Both fabrics on one request stream; ``to_dict()`` is what ``lightrail study scaleup --json`` prints."""

    racks: int
    requests: int
    seed: int
    trace: str | None
    load: float
    mtbf_s: float
    spare_servers: int
    link_bandwidth_Bps: float
    allreduce_bytes: float
    electrical: FabricOutcome
    photonic: FabricOutcome

    def rows(self) -> list[FabricOutcome]:
        return [self.electrical, self.photonic]

    @property
    def bandwidth_gain(self) -> float:
        """Photonic over electrical mean slice bandwidth."""
        return self.photonic.mean_slice_bandwidth_Bps / self.electrical.mean_slice_bandwidth_Bps

    @property
    def allreduce_speedup_by_size(self) -> dict[int, float]:
        """Electrical over photonic ring AllReduce time, per slice size (both at allocation)."""
        e, p = self.electrical.allreduce_by_size_s, self.photonic.allreduce_by_size_s
        return {s: e[s] / p[s] for s in e if s in p and p[s] > 0}

    def to_dict(self) -> dict:
        d = asdict(self)
        for fab in FABRICS:
            for key in ("acceptance_by_size", "bandwidth_by_size_Bps", "allreduce_by_size_s"):
                d[fab][key] = {str(k): v for k, v in d[fab][key].items()}
        d["bandwidth_gain"] = self.bandwidth_gain
        d["allreduce_speedup_by_size"] = {str(k): v for k, v in self.allreduce_speedup_by_size.items()}
        return _finite(d)


def _finite(obj):
    """Strict JSON: NaN and infinities (no failures, failures off) become None."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class _AllReduce:
    """Ring AllReduce times from the timing engine, cached per (ranks, ports)."""

    def __init__(self, params: ScaleupParams):
        self.params = params
        self._cache: dict[tuple[int, int], float] = {}

    def __call__(self, p: int, ports: int) -> float:
        key = (p, ports)
        if key not in self._cache:
            if ports <= 0 or p < 2:
                self._cache[key] = math.inf if p >= 2 else 0.0
            else:
                bw = ports * self.params.spec.link_bandwidth
                engine = Engine(ring(p, bandwidth=bw), alpha=self.params.alpha)
                self._cache[key] = engine.time(generate("allreduce", "ring", p), self.params.allreduce_bytes).time_s
        return self._cache[key]


def _failures(params: ScaleupParams, horizon: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n_acc = params.racks * params.spec.accelerators
    if not math.isfinite(params.mtbf_s):
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    rate = n_acc / params.mtbf_s
    count = int(rng.poisson(rate * horizon))
    t = np.sort(rng.uniform(0.0, horizon, count))
    return t, rng.integers(0, n_acc, count)


class _Racks:
    """The servers of every rack of one fabric: free bitmasks, free torus servers per rack, owners."""

    def __init__(self, fabric: str, params: ScaleupParams):
        spec = self.spec = params.spec
        self.photonic = fabric == "photonic"
        self.free = np.full(params.racks, (1 << spec.total_servers) - 1, dtype=np.uint32)
        self.free_count = np.full(params.racks, spec.servers, dtype=np.int64)  # free torus servers per rack
        self.owner = np.full((params.racks, spec.total_servers), -1, dtype=np.int64)  # -1 free, -2 failed, else job
        self._ports: dict[int, int] = {}  # one rack geometry: a server mask's ports are the same in every rack

    def take(self, r: int, mask: int, owner: int) -> None:
        self.free[r] &= np.uint32(~mask & 0xFFFFFFFF)
        self.free_count[r] -= bin(mask & self.spec.torus_mask).count("1")
        self.owner[r, list(_bits(mask))] = owner

    def give(self, r: int, mask: int) -> None:
        self.free[r] |= np.uint32(mask)
        self.free_count[r] += bin(mask & self.spec.torus_mask).count("1")
        self.owner[r, list(_bits(mask))] = -1

    def placeable(self, size: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Per rack, whether a ``size`` request fits (and the electrical fit matrix, reused by allocate)."""
        if self.photonic:
            return self.free_count >= -(-size // self.spec.per_server), None
        fits = block_fits(self.free, size, self.spec)
        return fits.any(axis=1), fits

    def allocate(self, size: int, fits: np.ndarray | None = None) -> tuple[int, int] | None:
        if self.photonic:
            return photonic_allocate(self.free, size, self.spec, counts=self.free_count)
        return first_fit_block(self.free, size, self.spec, fits=fits)

    def ports(self, mask: int) -> int:
        """Ports per accelerator the slice on ``mask`` drives (measured on its circuits when photonic)."""
        if mask not in self._ports:
            self._ports[mask] = (photonic_ports(self.spec, mask)[0] if self.photonic
                                 else self.spec.electrical_ports(mask))
        return self._ports[mask]


@dataclass
class _Tally:
    """Running sums of one fabric's run."""

    accepted: int = 0
    fragmented: int = 0
    cluster_room: int = 0
    stranded: int = 0
    free_seen: int = 0
    bandwidth: float = 0.0
    allreduce: float = 0.0
    by_size: dict = field(default_factory=dict)  # size -> [requests, accepted, sum bandwidth, sum allreduce]
    recovery: dict = field(default_factory=lambda: dict(failures=0, on_idle=0, hit=0, spliced=0, migrated=0,
                                                        degraded=0, lost=0))
    lost_hours: float = 0.0
    after_bw: list = field(default_factory=list)
    after_ratio: list = field(default_factory=list)
    after_slow: list = field(default_factory=list)


class _Run:
    """One fabric's replay: arrivals, departures, failures and repairs in time order."""

    def __init__(self, fabric: str, params: ScaleupParams):
        self.params, self.spec = params, params.spec
        self.racks = _Racks(fabric, params)
        self.allreduce = _AllReduce(params)
        self.tally = _Tally()
        self.jobs: dict[int, list] = {}  # job -> [rack or None (gone), server mask, end time, size]
        self.heap: list[tuple[float, int, int, int]] = []  # (time, 0 departure | 1 repair, job or rack, server)

    def arrive(self, jid: int, t: float, size: int, duration: float) -> None:
        racks, tally, per = self.racks, self.tally, self.spec.per_server
        row = tally.by_size.setdefault(size, [0, 0, 0.0, 0.0])
        row[0] += 1
        free_acc = racks.free_count * per
        placeable, fits = racks.placeable(size)
        tally.stranded += stranded(free_acc, placeable, size)
        tally.free_seen += int(free_acc.sum())
        got = racks.allocate(size, fits) if placeable.any() else None
        if got is None:
            tally.fragmented += bool((free_acc >= size).any())
            tally.cluster_room += bool(free_acc.sum() >= size)
            return
        r, mask = got
        racks.take(r, mask, jid)
        self.jobs[jid] = [r, mask, t + duration, size]
        heapq.heappush(self.heap, (t + duration, 0, jid, 0))
        ports = racks.ports(mask)
        bw, ar = ports * self.spec.link_bandwidth, self.allreduce(size, ports)
        tally.accepted += 1
        tally.bandwidth += bw
        tally.allreduce += ar
        row[1] += 1
        row[2] += bw
        row[3] += ar

    def depart(self, jid: int) -> None:
        job = self.jobs.pop(jid)
        if job[0] is not None:
            self.racks.give(job[0], job[1])

    def repair(self, r: int, s: int) -> None:
        self.racks.give(r, 1 << s)

    def fail(self, t: float, g: int) -> None:
        spec, racks, rec = self.spec, self.racks, self.tally.recovery
        rec["failures"] += 1
        r, s = g // spec.accelerators, int(spec.server_of[g % spec.accelerators])
        jid = int(racks.owner[r, s])
        if jid == -2:  # already out of service
            rec["on_idle"] += 1
            return
        if jid == -1:
            rec["on_idle"] += 1
        else:
            racks.give(r, 1 << s)  # the failed server leaves its job, then service (below)
        racks.take(r, 1 << s, -2)
        heapq.heappush(self.heap, (t + self.params.repair_s, 1, r, s))
        if jid >= 0:
            self._recover(jid, t, s)

    def _recover(self, jid: int, t: float, s: int) -> None:
        """Splice (photonic), else migrate, else run degraded, else lose the job; record the cost."""
        racks, rec, per, job = self.racks, self.tally.recovery, self.spec.per_server, self.jobs[jid]
        rec["hit"] += 1
        r, old = job[0], job[1]
        before = racks.ports(old)
        t_before = self.allreduce(bin(old).count("1") * per, before)
        remaining = old & ~(1 << s)
        new = splice(self.spec, old, s, int(racks.free[r])) if racks.photonic else None
        if new is not None:
            rec["spliced"] += 1
            racks.take(r, new & ~old, jid)
            target = (r, new)
        else:
            racks.give(r, remaining)
            target = racks.allocate(job[3])
            if target is not None:
                rec["migrated"] += 1
            elif remaining:
                rec["degraded"] += 1
                target = (r, remaining)
            else:
                rec["lost"] += 1
                self.tally.lost_hours += max(job[2] - t, 0.0) * job[3] / 3600
                job[0] = None
                return
            racks.take(*target, jid)
        job[0], job[1] = target
        after = racks.ports(target[1])
        self.tally.after_bw.append(after * self.spec.link_bandwidth)
        self.tally.after_ratio.append(after / before if before else 1.0)
        if math.isfinite(t_before):
            self.tally.after_slow.append(self.allreduce(bin(target[1]).count("1") * per, after) / t_before)


def simulate_fabric(fabric: str, requests: Requests, fail_t: np.ndarray, fail_acc: np.ndarray,
                    params: ScaleupParams, *, progress: Callable[[int], None] | None = None) -> FabricOutcome:
    """Replay ``requests`` and the failures (times, global accelerator ids ``rack * 64 + accelerator``) on
    ``params.racks`` racks of ``fabric``, to the last arrival or failure."""
    if fabric not in FABRICS:
        raise ScenarioError(f"fabric {fabric!r}", field="fabric", fix=f"use one of {', '.join(FABRICS)}")
    started = time.perf_counter()
    run = _Run(fabric, params)
    heap = run.heap
    n, nf = len(requests), len(fail_t)
    arrival, sizes, durations = requests.arrival_s, requests.size, requests.duration_s
    i = k = 0
    while i < n or k < nf:
        t_arr = float(arrival[i]) if i < n else math.inf
        t_fail = float(fail_t[k]) if k < nf else math.inf
        if heap and heap[0][0] <= min(t_arr, t_fail):  # departures and repairs first at equal times
            _, kind, a, b = heapq.heappop(heap)
            run.depart(a) if kind == 0 else run.repair(a, b)
        elif t_fail <= t_arr:
            run.fail(t_fail, int(fail_acc[k]))
            k += 1
        else:
            run.arrive(i, t_arr, int(sizes[i]), float(durations[i]))
            i += 1
            if progress and i % 1000 == 0:
                progress(i)
    if progress:
        progress(n)
    return _outcome(fabric, n, run.tally, time.perf_counter() - started)


def _outcome(fabric: str, n: int, tally: _Tally, elapsed: float) -> FabricOutcome:
    rec = tally.recovery
    recovery = FailureRecovery(
        **rec, lost_accelerator_hours=tally.lost_hours, restarts=rec["migrated"] + rec["degraded"],
        reconfiguration_s=MZI_RECONFIG_DELAY if rec["spliced"] else 0.0,
        mean_bandwidth_after_Bps=_mean(tally.after_bw), mean_bandwidth_ratio_after=_mean(tally.after_ratio),
        mean_allreduce_slowdown=_mean(tally.after_slow))
    rows = sorted(tally.by_size.items())
    got = tally.accepted
    return FabricOutcome(
        fabric=fabric, requests=n, accepted=got, acceptance=got / n, fragmentation=tally.fragmented / n,
        fragmented_refusals=tally.fragmented, refused_with_cluster_room=tally.cluster_room / n,
        stranded_fraction=tally.stranded / tally.free_seen if tally.free_seen else 0.0,
        mean_slice_bandwidth_Bps=tally.bandwidth / got if got else 0.0,
        mean_allreduce_s=tally.allreduce / got if got else 0.0,
        acceptance_by_size={s: v[1] / v[0] for s, v in rows},
        bandwidth_by_size_Bps={s: v[2] / v[1] for s, v in rows if v[1]},
        allreduce_by_size_s={s: v[3] / v[1] for s, v in rows if v[1]},
        failure_recovery=recovery, elapsed_s=elapsed)


def _bits(mask: int):
    s = 0
    while mask:
        if mask & 1:
            yield s
        mask >>= 1
        s += 1


def _mean(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def scaleup_study(params: ScaleupParams, *, requests: Requests | None = None, trace: str | None = None,
                  progress: Callable[[str, int], None] | None = None) -> ScaleupStudy:
    """Run both fabrics on one request stream (``requests``, else generated from ``params.seed``).

    ``progress(fabric, done)`` is called every 1,000 requests."""
    rng = np.random.default_rng(params.seed)
    if requests is None:
        requests = generate_requests(params, rng)
    horizon = float(requests.arrival_s[-1]) if len(requests) else 0.0
    fail_t, fail_acc = _failures(params, horizon, rng)
    outcomes = {fab: simulate_fabric(fab, requests, fail_t, fail_acc, params,
                                     progress=(lambda done, fab=fab: progress(fab, done)) if progress else None)
                for fab in FABRICS}
    return ScaleupStudy(racks=params.racks, requests=len(requests), seed=params.seed, trace=trace, load=params.load,
                        mtbf_s=params.mtbf_s, spare_servers=params.spec.spare_servers,
                        link_bandwidth_Bps=params.spec.link_bandwidth,
                        allreduce_bytes=params.allreduce_bytes, **outcomes)

