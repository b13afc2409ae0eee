"""What the scale-up study reports (``studies/scaleup.py`` fills these): per fabric, and both fabrics together.

``ScaleupStudy.to_dict()`` is the JSON of ``lightrail study scaleup --json``; its keys are a contract
(issue 30): ``electrical`` and ``photonic`` each with ``acceptance``, ``fragmentation``, ``acceptance_by_size``
(size as a string), ``spare_coverage`` and ``free_capacity_coverage``; ``rows`` with a spare sweep.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

__all__ = ["FABRICS", "REFUSED", "REFUSED_WITH_ROOM", "ACCEPTED", "FailureRecovery", "FabricOutcome",
           "ScaleupStudy"]

FABRICS = ("electrical", "photonic")
REFUSED, REFUSED_WITH_ROOM, ACCEPTED = 0, 1, 2
"""A request's outcome on one fabric: refused; refused although one rack had enough free servers; accepted."""


@dataclass(frozen=True)
class FailureRecovery:
    """What failures cost on one fabric (counts over the run; means over the recovered slices)."""

    failures: int
    on_idle: int
    """Failures of free (or already failed) servers: no job hit."""
    hit: int
    spliced: int
    spliced_from_spare: int
    spliced_from_free: int
    migrated: int
    degraded: int
    lost: int
    spare_coverage: float
    """Hits repaired from a dedicated spare server / hits (NaN, JSON null, when nothing was hit)."""
    free_capacity_coverage: float
    """Hits repaired at full size from other free capacity (a free torus server spliced in, or a migration) / hits."""
    uncovered: float
    """Hits left degraded or lost / hits."""
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
    """Requests refused although one rack held enough free servers for them, over all requests."""
    fragmented_refusals: int
    refused_with_cluster_room: float
    """Requests refused while the cluster as a whole had enough free servers (spread over racks; a slice lives
    in one rack, so this counts rack boundaries too), as a fraction of all requests."""
    stranded_fraction: float
    """Summed over arrivals: free accelerators in racks with room that cannot place the request, over all free
    accelerators (``control.scaleup.stranded``)."""
    mean_slice_bandwidth_Bps: float
    """Ports per accelerator the slice drives x link bandwidth, at allocation, mean over accepted slices."""
    mean_allreduce_s: float
    """Ring AllReduce of ``allreduce_bytes`` on each accepted slice's bandwidth (timing engine), mean."""
    acceptance_by_size: dict[int, float]
    acceptance_by_request: dict[str, float]
    """By request as asked (``"12"``, ``"4x4x2"``)."""
    bandwidth_by_size_Bps: dict[int, float]
    allreduce_by_size_s: dict[int, float]
    spare_coverage: float
    free_capacity_coverage: float
    mean_servers_out: float
    """Failed servers out of service (holes), mean over arrivals, per rack."""
    fragmentation_over_time: list[dict]
    """Per interval of the run: requests, acceptance, fragmentation, free_fraction, servers_out (per rack)."""
    failure_recovery: FailureRecovery
    elapsed_s: float
    outcome_by_request: np.ndarray = field(repr=False, compare=False)
    """Per request: 0 refused, 1 refused although one rack had enough free servers, 2 accepted (not in JSON)."""


@dataclass(frozen=True)
class ScaleupStudy:
    """Both fabrics on one request stream; ``to_dict()`` is what ``lightrail study scaleup --json`` prints."""

    racks: int
    requests: int
    seed: int
    trace: str | None
    load: float
    mtbf_s: float
    repair_s: float
    spare_servers: int
    electrical_placement: str
    mix: dict[str, float] | None
    link_bandwidth_Bps: float
    allreduce_bytes: float
    electrical: FabricOutcome
    photonic: FabricOutcome
    rows: list[dict] | None = None
    """The spare sweep (:func:`spare_sweep`), one row per spares-per-rack value; None without a sweep."""
    request_sizes: np.ndarray = field(default=None, repr=False, compare=False)
    """Size of every request, in stream order (for ``electrical_refusals``; not in JSON)."""

    def fabrics(self) -> list[FabricOutcome]:
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

    @property
    def electrical_refusals(self) -> dict:
        """Of the requests the electrical torus refused: how many the photonic allocator would have placed on the
        electrical rack's own state at that moment (enough free servers in one rack), and how many the photonic
        run (its own history) placed; overall and by size."""
        e, p = self.electrical.outcome_by_request, self.photonic.outcome_by_request
        refused = e < ACCEPTED
        would, placed = e == REFUSED_WITH_ROOM, refused & (p == ACCEPTED)
        n = int(refused.sum())
        sizes = np.asarray(self.request_sizes)
        by_size = {str(s): (int(would[refused & (sizes == s)].sum()) / k if (k := int((refused & (sizes == s)).sum()))
                            else None) for s in np.unique(sizes)}
        return {"refused": n, "photonic_would_place": int(would.sum()),
                "share_photonic_would_place": would.sum() / n if n else None,
                "placed_in_photonic_run": int(placed.sum()),
                "share_placed_in_photonic_run": placed.sum() / n if n else None,
                "share_photonic_would_place_by_size": by_size}

    def to_dict(self) -> dict:
        d = asdict(replace(self, electrical=None, photonic=None, request_sizes=None))
        d.pop("request_sizes")
        for fab in FABRICS:
            o = asdict(replace(getattr(self, fab), outcome_by_request=None))
            o.pop("outcome_by_request")
            for key in ("acceptance_by_size", "bandwidth_by_size_Bps", "allreduce_by_size_s"):
                o[key] = {str(k): v for k, v in o[key].items()}
            d[fab] = o
        if self.rows is None:
            d.pop("rows")
        d["bandwidth_gain"] = self.bandwidth_gain
        d["allreduce_speedup_by_size"] = {str(k): v for k, v in self.allreduce_speedup_by_size.items()}
        d["electrical_refusals"] = self.electrical_refusals
        return _finite(d)


def _finite(obj):
    """Strict JSON: NaN and infinities (no failures, failures off) become None; numpy scalars plain numbers."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
