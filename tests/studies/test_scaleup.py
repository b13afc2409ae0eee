"""The scale-up study on hand-built request streams: fragmentation, stranding, bandwidth, AllReduce time,
failure recovery, determinism by seed, trace files."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightrail.errors import ScenarioError
from lightrail.fabric.params import ALPHA
from lightrail.fabric.scaleup import RackSpec
from lightrail.studies.scaleup import (
    FABRICS,
    ScaleupParams,
    parse_trace,
    scaleup_study,
    simulate_fabric,
)

NO_FAILURES = (np.zeros(0), np.zeros(0, dtype=np.int64))


def run(requests, params=None, failures=NO_FAILURES):
    params = params or ScaleupParams(racks=1, requests=len(requests), mtbf_s=math.inf)
    return {fab: simulate_fabric(fab, requests, *failures, params) for fab in FABRICS}


def checkerboard():
    """16 one-server jobs fill a rack (job i on server i); at t=50 the jobs on servers 0, 5, 10 and 15 leave,
    one free server in each z column; at t=100 a 16-accelerator slice arrives."""
    lines = ["arrival_s,size,duration_s"]
    for i in range(16):
        lines.append(f"{i},4,{50 - i if i in (0, 5, 10, 15) else 1000}")
    lines.append("100,16,10")
    return parse_trace("\n".join(lines))


def test_fragmentation_and_stranding_by_hand():
    out = run(checkerboard())
    e, p = out["electrical"], out["photonic"]
    # electrical: 16 free accelerators but no free 2x2x4 block -> one refusal with room, all 16 stranded.
    # Free accelerators seen at the 17 arrivals: 64 + 60 + ... + 4 = 544, then 16.
    assert (e.accepted, e.fragmented_refusals) == (16, 1)
    assert e.acceptance == pytest.approx(16 / 17) and e.fragmentation == pytest.approx(1 / 17)
    assert e.stranded_fraction == pytest.approx(16 / 560)
    # photonic: any four free servers make the slice
    assert (p.accepted, p.fragmented_refusals, p.stranded_fraction) == (17, 0, 0.0)


def test_bandwidth_and_allreduce_time_by_hand():
    out = run(checkerboard())
    e, p = out["electrical"], out["photonic"]
    assert e.bandwidth_by_size_Bps == {4: 150e9}  # a 2x2x1 block drives 2 links of 75 GB/s
    assert p.bandwidth_by_size_Bps == {4: 450e9, 16: 450e9}  # every port in the slice's rings
    assert e.mean_slice_bandwidth_Bps == pytest.approx(150e9)
    # ring AllReduce on p ranks: 2(p-1) alpha + 2(p-1)/p N/B (the engine's closed form)
    n = 2.0**30
    assert e.allreduce_by_size_s[4] == pytest.approx(6 * ALPHA + 1.5 * n / 150e9, rel=1e-9)
    assert p.allreduce_by_size_s[16] == pytest.approx(30 * ALPHA + 30 / 16 * n / 450e9, rel=1e-9)


def one_job(size: int, *, fail_at: int = 0, racks: int = 1):
    params = ScaleupParams(racks=racks, requests=1, mtbf_s=math.inf, repair_s=1e6)
    reqs = parse_trace(f"arrival_s,size,duration_s\n0,{size},100\n")
    return run(reqs, params, (np.array([5.0]), np.array([fail_at]))), reqs


def test_failure_of_a_whole_rack_slice_electrical_degrades_photonic_splices():
    out, _ = one_job(64)
    fe, fp = out["electrical"].failure_recovery, out["photonic"].failure_recovery
    assert (fe.hit, fe.migrated, fe.degraded, fe.spliced) == (1, 0, 1, 0)
    assert fe.mean_bandwidth_ratio_after == pytest.approx(5 / 6)  # the hole's neighbours lose one link
    assert fe.mean_allreduce_slowdown > 1
    assert (fp.hit, fp.spliced, fp.restarts) == (1, 1, 0)
    assert fp.mean_bandwidth_ratio_after == 1.0 and fp.mean_allreduce_slowdown == 1.0
    assert fp.reconfiguration_s == pytest.approx(3.7e-6)


def test_failure_electrical_migrates_when_a_block_is_free():
    out, _ = one_job(8)
    fe = out["electrical"].failure_recovery
    assert (fe.migrated, fe.degraded, fe.lost) == (1, 0, 0)
    assert fe.mean_bandwidth_ratio_after == 1.0


def test_failure_with_nowhere_to_go_loses_the_job():
    lines = ["arrival_s,size,duration_s"] + [f"{i},4,100" for i in range(16)]
    params = ScaleupParams(racks=1, requests=16, mtbf_s=math.inf)
    out = run(parse_trace("\n".join(lines)), params, (np.array([20.0]), np.array([0])))
    fe, fp = out["electrical"].failure_recovery, out["photonic"].failure_recovery
    assert (fe.lost, fe.migrated, fe.degraded) == (1, 0, 0)
    assert fe.lost_accelerator_hours == pytest.approx((100 - 20) * 4 / 3600)  # job 0 ran 0..100
    assert (fp.spliced, fp.lost) == (1, 0)


def test_without_spares_a_full_rack_cannot_splice():
    lines = ["arrival_s,size,duration_s"] + [f"{i},4,100" for i in range(16)]
    params = ScaleupParams(racks=1, requests=16, mtbf_s=math.inf, spec=RackSpec(spare_servers=0))
    out = run(parse_trace("\n".join(lines)), params, (np.array([20.0]), np.array([0])))
    fp = out["photonic"].failure_recovery
    assert (fp.spliced, fp.lost) == (0, 1)


def test_failure_of_a_free_server_hits_nothing():
    out, _ = one_job(4, fail_at=63)
    for o in out.values():
        assert (o.failure_recovery.failures, o.failure_recovery.on_idle, o.failure_recovery.hit) == (1, 1, 0)


def test_determinism_by_seed():
    def figures(seed):
        d = scaleup_study(ScaleupParams(racks=8, requests=600, seed=seed, load=1.2, mtbf_s=2e6)).to_dict()
        for fab in FABRICS:
            d[fab].pop("elapsed_s")
        return d

    assert figures(3) == figures(3)
    assert figures(3) != figures(4)


def test_default_stream_photonic_never_fragments_and_has_more_bandwidth():
    r = scaleup_study(ScaleupParams(racks=6, requests=800, seed=1, load=1.3))
    assert r.photonic.fragmentation == 0 and r.photonic.stranded_fraction == 0
    assert r.photonic.mean_slice_bandwidth_Bps == pytest.approx(450e9)
    assert r.electrical.mean_slice_bandwidth_Bps < r.photonic.mean_slice_bandwidth_Bps
    assert [row.fabric for row in r.rows()] == list(FABRICS)
    d = r.to_dict()
    for fab in FABRICS:
        for key in ("acceptance", "fragmentation", "stranded_fraction", "mean_slice_bandwidth_Bps",
                    "failure_recovery", "elapsed_s"):
            assert key in d[fab]


@pytest.mark.parametrize(("text", "match"), [
    ("", "header"),
    ("arrival,size,duration\n0,4,1\n", "header"),
    ("arrival_s,size,duration_s\n", "no request"),
    ("arrival_s,size,duration_s\n0,12,1\n", "line 2"),
    ("arrival_s,size,duration_s\n0,4\n", "line 2"),
    ("arrival_s,size,duration_s\n0,4,-1\n", "line 2"),
])
def test_bad_traces_name_the_line(text, match):
    with pytest.raises(ScenarioError, match=match) as e:
        parse_trace(text)
    assert e.value.field == "--trace"


def test_trace_is_sorted_by_arrival():
    r = parse_trace("# a comment\narrival_s,size,duration_s\n5,8,1\n1,4,2\n")
    assert list(r.arrival_s) == [1, 5] and list(r.size) == [4, 8] and list(r.duration_s) == [2, 1]


@pytest.mark.parametrize(("kwargs", "field"), [({"racks": 0}, "racks"), ({"requests": 0}, "requests"),
                                               ({"load": 0}, "load"), ({"mtbf_s": -1}, "mtbf"),
                                               ({"mix": ((12, 1.0),)}, "mix")])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ScenarioError) as e:
        ScaleupParams(**kwargs)
    assert e.value.field == field
