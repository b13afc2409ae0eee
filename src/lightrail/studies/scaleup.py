"""The scale-up study: a stream of slice requests replayed on many racks, electrical against photonic.

Both fabrics see the same requests (``studies/scaleup_requests.py``: counts and torus shapes, the default mix or
a trace) and the same accelerator failures (``seed``). Per fabric it reports acceptance (overall, by size and by
request), fragmentation (overall and over time), stranded accelerators, bandwidth per slice, the ring AllReduce
time the timing engine gives each slice on that bandwidth, and what failures cost. It also answers the papers'
question directly: of the requests the electrical torus refused, how many the photonic rack would have placed
(``electrical_refusals``). Definitions of the allocators, bandwidth, fragmentation and stranded accelerators:
``control/scaleup.py``.

Failures. Accelerators fail as a Poisson process, ``racks * 64 / mtbf`` per second, each at a uniformly
drawn torus accelerator; its server leaves service for ``repair_s`` and is a hole in the torus until then
(no slice can use it; an electrical box cannot span it). A failure on a running slice is recovered, in this
order of preference:

- **photonic**: *splice* a free dedicated spare server of the rack (else any free torus server of the rack)
  into the slice by rerouting its circuits (an MZI mesh reconfigures in 3.7 µs);
- both fabrics: *migrate* the slice to a new allocation (the fabric's own allocator, any rack); an electrical
  rack's spares have no torus links, so it cannot use them;
- both: run *degraded* on the slice's surviving servers (bandwidth measured on what is left);
- else the job is *lost* (a one-server slice with nowhere to go); its remaining run time is counted.

Coverage (over the failures that hit a running slice): ``spare_coverage`` is the share repaired from a
dedicated spare, ``free_capacity_coverage`` the share repaired at full size from other free capacity (a free
torus server spliced in, or a migration), and the rest is not covered (degraded or lost). ``rows`` sweeps the
spares per rack (:func:`spare_sweep`), so "k spares per 64 accelerators cover X% of failures" is read off.
Every recovery but a splice inside the rack restarts the job from its checkpoint elsewhere or smaller; the
checkpoint restore itself is the same for all and is not priced (no hardware fact for it).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from lightrail.collectives import generate
from lightrail.control.scaleup import (
    PLACEMENTS,
    block_fits,
    first_fit_block,
    photonic_allocate,
    photonic_ports,
    request_placements,
    servers_needed,
    splice,
    stranded,
)
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import ring
from lightrail.fabric.params import ALPHA
from lightrail.fabric.scaleup import MZI_RECONFIG_DELAY, RackSpec
from lightrail.studies import scaleup_requests as _req
from lightrail.studies.scaleup_requests import DEFAULT_MIX, Requests, check_mix, parse_trace, request_label
from lightrail.studies.scaleup_results import (
    ACCEPTED,
    FABRICS,
    REFUSED,
    REFUSED_WITH_ROOM,
    FabricOutcome,
    FailureRecovery,
    ScaleupStudy,
)
from lightrail.timing import Engine

__all__ = ["DEFAULT_MIX", "MTBF", "REPAIR", "ScaleupParams", "Requests", "generate_requests", "parse_trace",
           "FailureRecovery", "FabricOutcome", "ScaleupStudy", "scaleup_study", "spare_sweep", "simulate_fabric",
           "FABRICS"]

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
    mix: tuple = DEFAULT_MIX
    """Request (``"12"``, ``"4x4x2"`` or an int) -> probability; ``studies/scaleup_requests.py``."""
    mtbf_s: float = MTBF
    """Per accelerator, seconds; ``inf`` turns failures off."""
    repair_s: float = REPAIR
    allreduce_bytes: float = 2.0**30
    """Buffer of the ring AllReduce timed on each slice (1 GiB of gradients)."""
    alpha: float = ALPHA
    spec: RackSpec = field(default_factory=RackSpec)
    electrical_placement: str = "contiguous"
    """Where an electrical box may sit: ``contiguous`` (any origin, wrapping) or ``aligned`` (control/scaleup.py)."""
    time_bins: int = 24
    """Intervals of the run's span that ``fragmentation_over_time`` reports."""

    def __post_init__(self):
        for name, lo in (("racks", 1), ("requests", 1), ("time_bins", 1)):
            if getattr(self, name) < lo:
                raise ScenarioError(f"{name}={getattr(self, name)}", field=name, fix=f"use {lo} or more")
        if not 0 < self.load:
            raise ScenarioError(f"load={self.load}", field="load", fix="use a load above 0, e.g. 0.9")
        if not self.mtbf_s > 0:
            raise ScenarioError(f"mtbf={self.mtbf_s}", field="mtbf", fix="use a positive time, e.g. 50000h")
        if self.mean_duration_s <= 0 or self.repair_s < 0:
            raise ScenarioError("durations must be positive", field="mean_duration_s")
        if self.electrical_placement not in PLACEMENTS:
            raise ScenarioError(f"electrical_placement={self.electrical_placement!r}", field="electrical_placement",
                                fix=f"use one of {', '.join(PLACEMENTS)}")
        object.__setattr__(self, "mix", check_mix(self.mix, spec=self.spec))


def generate_requests(params: ScaleupParams, rng: np.random.Generator) -> Requests:
    """The default stream of ``params`` (Poisson arrivals at the offered load, requests from the mix)."""
    return _req.generate_requests(params.mix, requests=params.requests, racks=params.racks, load=params.load,
                                  mean_duration_s=params.mean_duration_s, spec=params.spec, rng=rng)


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
    """The servers of every rack of one fabric: free bitmasks, free torus servers per rack, owners, holes."""

    def __init__(self, fabric: str, params: ScaleupParams):
        spec = self.spec = params.spec
        self.placement = params.electrical_placement
        self.photonic = fabric == "photonic"
        self.free = np.full(params.racks, (1 << spec.total_servers) - 1, dtype=np.uint32)
        self.free_count = np.full(params.racks, spec.servers, dtype=np.int64)  # free torus servers per rack
        self.owner = np.full((params.racks, spec.total_servers), -1, dtype=np.int64)  # -1 free, -2 failed, else job
        self.out = 0  # servers out of service (failed, awaiting repair)
        self._ports: dict = {}  # one rack geometry: a server mask's ports are the same in every rack
        self._masks: dict = {}

    def take(self, r: int, mask: int, owner: int) -> None:
        self.free[r] &= np.uint32(~mask & 0xFFFFFFFF)
        self.free_count[r] -= bin(mask & self.spec.torus_mask).count("1")
        self.owner[r, list(_bits(mask))] = owner

    def give(self, r: int, mask: int) -> None:
        self.free[r] |= np.uint32(mask)
        self.free_count[r] += bin(mask & self.spec.torus_mask).count("1")
        self.owner[r, list(_bits(mask))] = -1

    def masks(self, size: int, shape) -> np.ndarray:
        key = (size, shape)
        if key not in self._masks:
            self._masks[key] = request_placements(self.spec, size, shape, placement=self.placement)
        return self._masks[key]

    def placeable(self, size: int, shape) -> tuple[np.ndarray, np.ndarray | None]:
        """Per rack, whether the request fits (and the electrical fit matrix, reused by allocate)."""
        if self.photonic:
            return self.free_count >= servers_needed(self.spec, size), None
        fits = block_fits(self.free, self.masks(size, shape))
        return fits.any(axis=1), fits

    def allocate(self, size: int, shape, fits: np.ndarray | None = None) -> tuple[int, int] | None:
        if self.photonic:
            return photonic_allocate(self.free, size, self.spec, counts=self.free_count)
        return first_fit_block(self.free, self.masks(size, shape), fits=fits)

    def ports(self, mask: int, shape) -> int:
        """Ports per accelerator the slice on ``mask`` drives (measured on its circuits when photonic)."""
        key = (mask, shape)
        if key not in self._ports:
            self._ports[key] = (photonic_ports(self.spec, mask, shape)[0] if self.photonic
                                else self.spec.electrical_ports(mask))
        return self._ports[key]


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
    by_request: dict = field(default_factory=dict)  # label -> [requests, accepted]
    recovery: dict = field(default_factory=lambda: dict(failures=0, on_idle=0, hit=0, spliced=0,
                                                        spliced_from_spare=0, spliced_from_free=0, migrated=0,
                                                        degraded=0, lost=0))
    lost_hours: float = 0.0
    after_bw: list = field(default_factory=list)
    after_ratio: list = field(default_factory=list)
    after_slow: list = field(default_factory=list)


class _Run:
    """One fabric's replay: arrivals, departures, failures and repairs in time order."""

    def __init__(self, fabric: str, params: ScaleupParams, n: int):
        self.params, self.spec = params, params.spec
        self.racks = _Racks(fabric, params)
        self.allreduce = _AllReduce(params)
        self.tally = _Tally()
        self.jobs: dict[int, list] = {}  # job -> [rack or None (gone), server mask, end time, size, shape]
        self.heap: list[tuple[float, int, int, int]] = []  # (time, 0 departure | 1 repair, job or rack, server)
        self.outcome = np.zeros(n, dtype=np.int8)  # per request: REFUSED, REFUSED_WITH_ROOM, ACCEPTED
        self.free_at = np.zeros(n)  # free torus accelerators at each arrival
        self.out_at = np.zeros(n)  # servers out of service at each arrival

    def arrive(self, jid: int, t: float, size: int, shape, duration: float) -> None:
        racks, tally, per = self.racks, self.tally, self.spec.per_server
        row = tally.by_size.setdefault(size, [0, 0, 0.0, 0.0])
        row[0] += 1
        label = tally.by_request.setdefault(request_label(size, shape), [0, 0])
        label[0] += 1
        need = servers_needed(self.spec, size)
        free_acc = racks.free_count * per
        self.free_at[jid], self.out_at[jid] = free_acc.sum(), racks.out
        placeable, fits = racks.placeable(size, shape)
        tally.stranded += stranded(free_acc, placeable, need * per)
        tally.free_seen += int(free_acc.sum())
        got = racks.allocate(size, shape, fits) if placeable.any() else None
        if got is None:
            room = bool((racks.free_count >= need).any())
            tally.fragmented += room
            tally.cluster_room += bool(racks.free_count.sum() >= need)
            self.outcome[jid] = REFUSED_WITH_ROOM if room else REFUSED
            return
        self.outcome[jid] = ACCEPTED
        r, mask = got
        racks.take(r, mask, jid)
        self.jobs[jid] = [r, mask, t + duration, size, shape]
        heapq.heappush(self.heap, (t + duration, 0, jid, 0))
        ports = racks.ports(mask, shape)
        bw, ar = ports * self.spec.link_bandwidth, self.allreduce(size, ports)
        tally.accepted += 1
        tally.bandwidth += bw
        tally.allreduce += ar
        row[1] += 1
        row[2] += bw
        row[3] += ar
        label[1] += 1

    def depart(self, jid: int) -> None:
        job = self.jobs.pop(jid)
        if job[0] is not None:
            self.racks.give(job[0], job[1])

    def repair(self, r: int, s: int) -> None:
        self.racks.give(r, 1 << s)
        self.racks.out -= 1

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
        racks.take(r, 1 << s, -2)  # a hole until its repair
        racks.out += 1
        heapq.heappush(self.heap, (t + self.params.repair_s, 1, r, s))
        if jid >= 0:
            self._recover(jid, t, s)

    def _recover(self, jid: int, t: float, s: int) -> None:
        """Splice (photonic), else migrate, else run degraded, else lose the job; record the cost."""
        racks, rec, per, job = self.racks, self.tally.recovery, self.spec.per_server, self.jobs[jid]
        rec["hit"] += 1
        r, old, size, shape = job[0], job[1], job[3], job[4]
        before = racks.ports(old, shape)
        t_before = self.allreduce(size, before)
        remaining = old & ~(1 << s)
        new = splice(self.spec, old, s, int(racks.free[r])) if racks.photonic else None
        if new is not None:
            rec["spliced"] += 1
            rec["spliced_from_spare" if new & ~old & self.spec.spare_mask else "spliced_from_free"] += 1
            racks.take(r, new & ~old, jid)
            target = (r, new)
        else:
            racks.give(r, remaining)
            target = racks.allocate(size, shape)
            if target is not None:
                rec["migrated"] += 1
            elif remaining:
                rec["degraded"] += 1
                target = (r, remaining)
            else:
                rec["lost"] += 1
                self.tally.lost_hours += max(job[2] - t, 0.0) * size / 3600
                job[0] = None
                return
            racks.take(*target, jid)
        job[0], job[1] = target
        after = racks.ports(target[1], shape)
        self.tally.after_bw.append(after * self.spec.link_bandwidth)
        self.tally.after_ratio.append(after / before if before else 1.0)
        if math.isfinite(t_before) and t_before > 0:  # a one-accelerator job has no AllReduce
            kept = min(size, bin(target[1]).count("1") * per)  # a degraded slice runs on what is left
            self.tally.after_slow.append(self.allreduce(kept, after) / t_before)


def simulate_fabric(fabric: str, requests: Requests, fail_t: np.ndarray, fail_acc: np.ndarray,
                    params: ScaleupParams, *, progress: Callable[[int], None] | None = None) -> FabricOutcome:
    """Replay ``requests`` and the failures (times, global accelerator ids ``rack * 64 + accelerator``) on
    ``params.racks`` racks of ``fabric``, to the last arrival or failure."""
    if fabric not in FABRICS:
        raise ScenarioError(f"fabric {fabric!r}", field="fabric", fix=f"use one of {', '.join(FABRICS)}")
    started = time.perf_counter()
    n, nf = len(requests), len(fail_t)
    run = _Run(fabric, params, n)
    heap = run.heap
    arrival, durations = requests.arrival_s, requests.duration_s
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
            size, shape = requests.kind(i)
            run.arrive(i, t_arr, size, shape, float(durations[i]))
            i += 1
            if progress and i % 1000 == 0:
                progress(i)
    if progress:
        progress(n)
    return _outcome(fabric, run, requests, time.perf_counter() - started)


def _over_time(run: _Run, arrival: np.ndarray) -> list[dict]:
    """The run's span cut into ``time_bins`` intervals: per interval, what the arrivals in it saw."""
    n, bins = len(arrival), run.params.time_bins
    if not n:
        return []
    span = float(arrival[-1]) or 1.0
    edges = np.linspace(0.0, span, bins + 1)
    b = np.clip(np.searchsorted(edges, arrival, side="right") - 1, 0, bins - 1)
    count = np.bincount(b, minlength=bins)
    ok = np.bincount(b, weights=run.outcome == ACCEPTED, minlength=bins)
    frag = np.bincount(b, weights=run.outcome == REFUSED_WITH_ROOM, minlength=bins)
    free = np.bincount(b, weights=run.free_at, minlength=bins)
    out = np.bincount(b, weights=run.out_at, minlength=bins)
    torus = run.params.racks * run.spec.accelerators
    rows = []
    for j in range(bins):
        c = int(count[j])
        rows.append({"t_start_s": float(edges[j]), "t_end_s": float(edges[j + 1]), "requests": c,
                     "acceptance": ok[j] / c if c else None, "fragmentation": frag[j] / c if c else None,
                     "free_fraction": free[j] / c / torus if c else None,
                     "servers_out": out[j] / c / run.params.racks if c else None})
    return rows


def _outcome(fabric: str, run: _Run, requests: Requests, elapsed: float) -> FabricOutcome:
    tally, n = run.tally, len(requests)
    rec = tally.recovery
    hit = rec["hit"]

    def share(k: int) -> float:
        return k / hit if hit else math.nan

    spare, free_cap = share(rec["spliced_from_spare"]), share(rec["spliced_from_free"] + rec["migrated"])
    recovery = FailureRecovery(
        **rec, spare_coverage=spare, free_capacity_coverage=free_cap, uncovered=share(rec["degraded"] + rec["lost"]),
        lost_accelerator_hours=tally.lost_hours, restarts=rec["migrated"] + rec["degraded"],
        reconfiguration_s=MZI_RECONFIG_DELAY if rec["spliced"] else 0.0,
        mean_bandwidth_after_Bps=_mean(tally.after_bw), mean_bandwidth_ratio_after=_mean(tally.after_ratio),
        mean_allreduce_slowdown=_mean(tally.after_slow))
    rows = sorted(tally.by_size.items())
    got = tally.accepted
    return FabricOutcome(
        fabric=fabric, requests=n, accepted=got, acceptance=got / n if n else 0.0,
        fragmentation=tally.fragmented / n if n else 0.0, fragmented_refusals=tally.fragmented,
        refused_with_cluster_room=tally.cluster_room / n if n else 0.0,
        stranded_fraction=tally.stranded / tally.free_seen if tally.free_seen else 0.0,
        mean_slice_bandwidth_Bps=tally.bandwidth / got if got else 0.0,
        mean_allreduce_s=tally.allreduce / got if got else 0.0,
        acceptance_by_size={s: v[1] / v[0] for s, v in rows},
        acceptance_by_request={k: v[1] / v[0] for k, v in sorted(tally.by_request.items(), key=_label_order)},
        bandwidth_by_size_Bps={s: v[2] / v[1] for s, v in rows if v[1]},
        allreduce_by_size_s={s: v[3] / v[1] for s, v in rows if v[1]},
        spare_coverage=spare, free_capacity_coverage=free_cap,
        mean_servers_out=float(run.out_at.mean()) / run.params.racks if n else 0.0,
        fragmentation_over_time=_over_time(run, requests.arrival_s),
        failure_recovery=recovery, elapsed_s=elapsed, outcome_by_request=run.outcome)


def _label_order(item) -> tuple:
    label = item[0]
    sides = [int(v) for v in label.split("x")]
    return (int(np.prod(sides)), len(sides), label)


def _bits(mask: int):
    s = 0
    while mask:
        if mask & 1:
            yield s
        mask >>= 1
        s += 1


def _mean(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def _stream(params: ScaleupParams, requests: Requests | None) -> tuple[Requests, np.ndarray, np.ndarray]:
    """The request stream (given, else generated from ``params.seed``) and the failures, both from one seed."""
    rng = np.random.default_rng(params.seed)
    if requests is None:
        requests = generate_requests(params, rng)
    horizon = float(requests.arrival_s[-1]) if len(requests) else 0.0
    return (requests, *_failures(params, horizon, rng))


def scaleup_study(params: ScaleupParams, *, requests: Requests | None = None, trace: str | None = None,
                  progress: Callable[[str, int], None] | None = None) -> ScaleupStudy:
    """Run both fabrics on one request stream (``requests``, else generated from ``params.seed``).

    ``progress(fabric, done)`` is called every 1,000 requests."""
    requests, fail_t, fail_acc = _stream(params, requests)
    outcomes = {fab: simulate_fabric(fab, requests, fail_t, fail_acc, params,
                                     progress=(lambda done, fab=fab: progress(fab, done)) if progress else None)
                for fab in FABRICS}
    return ScaleupStudy(racks=params.racks, requests=len(requests), seed=params.seed, trace=trace, load=params.load,
                        mtbf_s=params.mtbf_s, repair_s=params.repair_s, spare_servers=params.spec.spare_servers,
                        electrical_placement=params.electrical_placement,
                        mix=None if trace else dict(params.mix), link_bandwidth_Bps=params.spec.link_bandwidth,
                        allreduce_bytes=params.allreduce_bytes, request_sizes=requests.size.copy(), **outcomes)


def _sweep_row(spares: int, spec: RackSpec, electrical: FabricOutcome, photonic: FabricOutcome) -> dict:
    fp = photonic.failure_recovery
    return {"spare_servers": spares, "accelerators_per_rack": spec.accelerators,
            "spare_coverage": photonic.spare_coverage, "free_capacity_coverage": photonic.free_capacity_coverage,
            "uncovered": fp.uncovered, "failures_hit": fp.hit, "acceptance": photonic.acceptance,
            "electrical_free_capacity_coverage": electrical.free_capacity_coverage}


def spare_sweep(params: ScaleupParams, spares: Sequence[int], *, requests: Requests | None = None,
                trace: str | None = None, progress: Callable[[str, int], None] | None = None) -> ScaleupStudy:
    """The study at ``spares[0]`` spare servers per rack, plus ``rows``: per value, the photonic rack's coverage
    of the failures that hit a slice (same requests, same failures). The electrical rack cannot use spares
    (no torus links), so it runs once; its free-capacity coverage is repeated in every row."""
    if not spares:
        raise ScenarioError("no spare counts", field="spare_servers", fix="give at least one, e.g. 0,1,2,4")
    specs = [replace(params.spec, spare_servers=int(k)) for k in spares]
    first = replace(params, spec=specs[0])
    requests, fail_t, fail_acc = _stream(first, requests)
    study = scaleup_study(first, requests=requests, trace=trace, progress=progress)
    rows = [_sweep_row(int(spares[0]), specs[0], study.electrical, study.photonic)]
    for k, spec in zip(spares[1:], specs[1:], strict=True):
        label = f"photonic, {k} spares"
        photonic = simulate_fabric("photonic", requests, fail_t, fail_acc, replace(params, spec=spec),
                                   progress=(lambda done, label=label: progress(label, done)) if progress else None)
        rows.append(_sweep_row(int(k), spec, study.electrical, photonic))
    return replace(study, rows=rows)
