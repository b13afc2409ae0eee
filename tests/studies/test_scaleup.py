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
    assert [row.fabric for row in r.fabrics()] == list(FABRICS)
    d = r.to_dict()
    for fab in FABRICS:
        for key in ("acceptance", "fragmentation", "stranded_fraction", "mean_slice_bandwidth_Bps",
                    "failure_recovery", "elapsed_s"):
            assert key in d[fab]


@pytest.mark.parametrize(("text", "match"), [
    ("", "header"),
    ("arrival,size,duration\n0,4,1\n", "header"),
    ("arrival_s,size,duration_s\n", "no request"),
    ("arrival_s,size,duration_s\n0,65,1\n", "line 2"),
    ("arrival_s,size,duration_s,shape\n0,32,1,4x4x3\n", "line 2: shape 4x4x3 holds 48"),
    ("arrival_s,size,duration_s,shape\n0,4,1,1x1x4\n", "line 2: request '1x1x4'"),
    ("arrival_s,size,duration_s,shape\n0,4,1,4by1\n", "line 2"),
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
                                               ({"mix": ((65, 1.0),)}, "mix"),
                                               ({"mix": (("2x2x3", 0.5),)}, "mix"),
                                               ({"electrical_placement": "diagonal"}, "electrical_placement")])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ScenarioError) as e:
        ScaleupParams(**kwargs)
    assert e.value.field == field


# ---- shaped requests, holes from repair times, the coverage split (issue 30) ---------------------------------
SPEC = RackSpec()


def acc(x, y, z) -> int:
    return int(SPEC.index(x, y, z))


def test_holes_stay_out_for_their_repair_time():
    """Two failed servers at (0,0,0) and (2,2,2) leave no 4x4x2 box on the electrical torus (every one of the 8
    holds a hole) but 14 free servers: refused with room there, placed by the photonic rack. After the repair
    (100 s) the same request fits both."""
    params = ScaleupParams(racks=1, requests=2, mtbf_s=math.inf, repair_s=100.0, time_bins=2)
    reqs = parse_trace("arrival_s,size,duration_s,shape\n10,32,5,4x4x2\n200,32,5,4x4x2\n")
    out = run(reqs, params, (np.array([1.0, 2.0]), np.array([acc(0, 0, 0), acc(2, 2, 2)])))
    e, p = out["electrical"], out["photonic"]
    assert list(e.outcome_by_request) == [1, 2]  # refused with room, then accepted after the repair
    assert list(p.outcome_by_request) == [2, 2]
    assert e.fragmentation == 0.5 and p.fragmentation == 0.0
    assert e.acceptance_by_request == {"4x4x2": 0.5} and p.acceptance_by_size == {32: 1.0}
    # holes seen by the arrivals: 2 servers out at t=10, none at t=200
    assert [b["servers_out"] for b in e.fragmentation_over_time] == [2.0, 0.0]
    assert [b["fragmentation"] for b in e.fragmentation_over_time] == [1.0, 0.0]
    assert e.mean_servers_out == 1.0
    assert e.failure_recovery.on_idle == 2 and e.failure_recovery.hit == 0


def test_a_hole_repaired_later_is_still_a_hole_now():
    # the same failures, repair after 1,000 s: the second request (t=200) is refused with room too
    params = ScaleupParams(racks=1, requests=2, mtbf_s=math.inf, repair_s=1000.0)
    reqs = parse_trace("arrival_s,size,duration_s,shape\n10,32,5,4x4x2\n200,32,5,4x4x2\n")
    out = run(reqs, params, (np.array([1.0, 2.0]), np.array([acc(0, 0, 0), acc(2, 2, 2)])))
    assert list(out["electrical"].outcome_by_request) == [1, 1]
    assert list(out["photonic"].outcome_by_request) == [2, 2]


def coverage_case(spares: int):
    """16 one-server jobs fill a rack (job i on server i); job 2 leaves at t=37. Failures: t=20 on server 0
    (a spare is free if any), t=30 on server 1 (nothing free), t=40 on server 3 (server 2 is free)."""
    lines = ["arrival_s,size,duration_s"] + [f"{i},4,{35 if i == 2 else 1000}" for i in range(16)]
    params = ScaleupParams(racks=1, requests=16, mtbf_s=math.inf, spec=RackSpec(spare_servers=spares))
    first = [int(SPEC.server_accelerators[s][0]) for s in (0, 1, 3)]
    return parse_trace("\n".join(lines)), params, (np.array([20.0, 30.0, 40.0]), np.array(first))


def test_coverage_split_by_hand():
    reqs, params, failures = coverage_case(1)
    out = run(reqs, params, failures)
    fp, fe = out["photonic"].failure_recovery, out["electrical"].failure_recovery
    # photonic: server 0 from the spare, server 1 nowhere (lost), server 3 from the free torus server 2
    assert (fp.hit, fp.spliced_from_spare, fp.spliced_from_free, fp.lost) == (3, 1, 1, 1)
    assert (out["photonic"].spare_coverage, out["photonic"].free_capacity_coverage) == (1 / 3, 1 / 3)
    assert fp.uncovered == pytest.approx(1 / 3)
    # electrical: spares have no torus links; servers 0 and 1 lost, server 3's job migrates to server 2
    assert (fe.hit, fe.migrated, fe.lost) == (3, 1, 2)
    assert (out["electrical"].spare_coverage, out["electrical"].free_capacity_coverage) == (0.0, 1 / 3)


def test_spare_sweep_rows(monkeypatch):
    from lightrail.studies import scaleup as study

    reqs, params, failures = coverage_case(0)
    monkeypatch.setattr(study, "_failures", lambda *_: failures)  # hand-placed failures, through the sweep's replay
    r = study.spare_sweep(params, [0, 1, 2], requests=reqs)
    assert [row["spare_servers"] for row in r.rows] == [0, 1, 2]
    # no spare: the first failure is lost too (nothing free at t=20); one spare covers it; a second spare also
    # covers the failure at t=30
    assert [row["spare_coverage"] for row in r.rows] == [0.0, 1 / 3, 2 / 3]
    assert [row["free_capacity_coverage"] for row in r.rows] == [1 / 3, 1 / 3, 1 / 3]
    assert r.spare_servers == 0 and r.photonic.spare_coverage == 0.0
    d = r.to_dict()
    assert set(d["rows"][0]) >= {"spare_servers", "spare_coverage", "free_capacity_coverage"}


def test_electrical_refusals_and_contract_keys():
    r = scaleup_study(ScaleupParams(racks=4, requests=1500, seed=2, load=1.5, mtbf_s=math.inf))
    d = r.to_dict()
    for fab in FABRICS:
        for key in ("acceptance", "fragmentation", "acceptance_by_size", "spare_coverage", "free_capacity_coverage",
                    "fragmentation_over_time", "acceptance_by_request"):
            assert key in d[fab]
        assert all(isinstance(k, str) for k in d[fab]["acceptance_by_size"])
    assert "rows" not in d
    ref = d["electrical_refusals"]
    e, p = r.electrical.outcome_by_request, r.photonic.outcome_by_request
    assert ref["refused"] == int((e < 2).sum()) > 0
    assert ref["photonic_would_place"] == r.electrical.fragmented_refusals == int((e == 1).sum())
    assert ref["placed_in_photonic_run"] == int(((e < 2) & (p == 2)).sum())
    # the default mix asks for shapes and counts that are not powers of two, and the electrical torus fragments
    assert {"2x2x3", "4x4x2", "6", "20"} <= set(d["electrical"]["acceptance_by_request"])
    assert r.electrical.fragmentation > 0 and r.photonic.fragmentation == 0


def test_alibaba_pod_trace_sample_reads_as_published():
    """The committed real sample (tests/data, provenance in its header): each pod with GPUs is a request of num_gpu
    accelerators at creation_time for deletion - creation seconds; CPU pods are left out."""
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "alibaba_openb_pods_sample.csv"
    text = path.read_text()
    assert "alibaba/clusterdata, commit 7a6c496e4f4b6ce6150be8f881cb051bf2abff42" in text
    rows = list(csv.DictReader(ln for ln in text.splitlines() if not ln.startswith("#")))
    gpu = [r for r in rows if int(r["num_gpu"]) > 0 and int(r["deletion_time"]) > int(r["creation_time"])]
    reqs = parse_trace(text)
    assert len(rows) == 2000 and len(reqs) == len(gpu)
    assert sorted(reqs.size.tolist()) == sorted(int(r["num_gpu"]) for r in gpu)
    assert reqs.duration_s.sum() == sum(int(r["deletion_time"]) - int(r["creation_time"]) for r in gpu)
    assert (np.diff(reqs.arrival_s) >= 0).all() and not reqs.shape.any()
    out = run(reqs, ScaleupParams(racks=1, requests=len(reqs), mtbf_s=math.inf))
    assert set(out["electrical"].acceptance_by_size) == {1, 2, 8}


def test_failure_of_a_one_accelerator_job():
    # a pod on one GPU (the Alibaba trace is mostly these) has no AllReduce to slow down
    out, _ = one_job(1)
    fe, fp = out["electrical"].failure_recovery, out["photonic"].failure_recovery
    assert (fe.migrated, fp.spliced_from_spare) == (1, 1)
    assert math.isnan(fe.mean_allreduce_slowdown) and math.isnan(fp.mean_allreduce_slowdown)
