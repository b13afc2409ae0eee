"""nccl-tests in: logs generated from known parameters (plus noise) in nccl-tests' own format are fitted back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.collectives import generate
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import build_topology
from lightrail.studies.calibrate_nccl import StepTerms, fit, fit_terms, model_times, parse_nccl_tests, step_terms
from lightrail.timing import Engine

HEADER = """# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 \
validation: 1 graph: 0
#
# Using devices
{ranks}#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""
FOOTER = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 42.1\n#\n"


def nccl_log(times_us, sizes, n, *, noise=0.0, seed=0, root=True):
    """An all_reduce_perf table (nccl-tests' printf widths) of the given times, with relative noise."""
    rng = np.random.default_rng(seed)
    ranks = "".join(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on    node{r // 8} device {r % 8:2d} [0x{r:02x}] "
                    "NVIDIA H100 80GB HBM3\n" for r in range(n))
    lines = [HEADER.format(ranks=ranks)]
    for size, t in zip(sizes, times_us, strict=True):
        cells = []
        for _ in range(2):
            tt = t * (1 + noise * rng.standard_normal())
            algbw = size / tt / 1e3
            cells.append(f"{tt:8.2f}  {algbw:6.2f}  {algbw * 2 * (n - 1) / n:6.2f}  {0:6d}")
        head = f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}"
        lines.append(head + (f"  {-1:6d}" if root else "") + "  " + "  ".join(cells) + "\n")
    return "".join(lines) + FOOTER


SIZES = [8 * 2**k for k in range(28)]  # 8 B .. 1 GiB


def engine_times(topology, algo, n, sizes, alpha, latency, bandwidth):
    """What lightrail's engine says, built directly (not through the calibration's own model)."""
    engine = Engine(build_topology(topology, n, bandwidth=bandwidth, latency=latency), alpha=alpha)
    schedule = generate("allreduce", algo, n)
    return [engine.time(schedule, s).time_s * 1e6 for s in sizes]


def test_the_fit_model_is_the_engine():
    terms = step_terms("torus2d", "recursive-doubling", "allreduce", 16)
    want = engine_times("torus2d", "recursive-doubling", 16, SIZES, 4e-6, 0.7e-6, 3e10)
    got = model_times(terms, SIZES, 4e-6, 0.7e-6, 3e10) * 1e6
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("noise", [0.0, 0.02])
def test_ring_on_a_switch_recovers_alpha_and_bandwidth(noise):
    alpha, latency, bw = 6e-6, 1e-6, 45e9
    text = nccl_log(engine_times("switch", "ring", 8, SIZES, alpha, latency, bw), SIZES, 8, noise=noise)
    rows, listed = parse_nccl_tests(text)
    assert listed == 8 and len(rows) == len(SIZES)
    cal = fit(rows, kind="allreduce", algo="ring", topology="switch", ranks=8, latency_s=latency)
    tol = 1e-3 + 2 * noise
    assert not cal.latency_fitted  # every step crosses 2 hops: alpha and latency move together
    assert cal.alpha_s == pytest.approx(alpha, rel=tol * 5)
    assert cal.bandwidth_Bps == pytest.approx(bw, rel=tol)
    assert cal.rms_relative_error < 1e-3 + 1.5 * noise
    # a wrong held latency moves into alpha; the start-up per step is what the data determines
    shifted = fit(rows, kind="allreduce", algo="ring", topology="switch", ranks=8, latency_s=2e-6)
    assert shifted.startup_per_step_s == pytest.approx(cal.startup_per_step_s, rel=1e-6)
    assert shifted.alpha_s == pytest.approx(cal.alpha_s - 2 * 1e-6, rel=1e-3)


def test_latency_is_fitted_where_the_slowest_transfer_changes_with_size():
    """A step whose far pair (5 hops, light load) is slowest for small messages and whose near pair (1 hop,
    full load) is slowest for large ones: hops per step vary with size, so all three parameters separate."""
    terms = StepTerms([np.array([1.0, 5.0])] * 6, [np.array([1.0, 0.05])] * 6, 0.25)
    alpha, latency, bw = 3e-6, 2e-6, 25e9
    times = model_times(terms, SIZES, alpha, latency, bw)
    rows, _ = parse_nccl_tests(nccl_log(list(times * 1e6), SIZES, 4, noise=0.002))
    cal = fit_terms(terms, rows, latency_s=0.5e-6)
    assert cal.latency_fitted
    assert (cal.alpha_s, cal.latency_s, cal.bandwidth_Bps) == pytest.approx((alpha, latency, bw), rel=0.05)


def test_old_logs_without_root_and_na_columns_parse():
    text = nccl_log([10.0, 20.0, 40.0], [1024, 2048, 4096], 2, root=False).replace("      0\n", "    N/A\n")
    text = text.replace("#\n", "node0:1234:1240 [0] NCCL INFO Channel 00/02 :    0   1\n", 1)
    rows, _ = parse_nccl_tests(text)
    assert [r.size for r in rows] == [1024, 2048, 4096] and rows[0].root == -1
    assert rows[2].time_s == pytest.approx(40e-6)


@pytest.mark.parametrize("bad, line", [
    ("   1024   256   float   sum   -1   12.0   0.08\n", 2),
    ("   1024   256   float   sum   -1   fast   0.08   0.15   0   11.9   0.09   0.15   0\n", 2),
])
def test_bad_lines_name_their_number(bad, line, tmp_path):
    text = "# a comment\n" + bad
    with pytest.raises(ScenarioError, match=f"log.txt:{line}"):
        parse_nccl_tests(text, source="log.txt")
    path = tmp_path / "log.txt"
    path.write_text(text)
    result = CliRunner().invoke(app, ["calibrate", "nccl-tests", str(path), "--ranks", "2", "--json"])
    assert result.exit_code == 2
    assert f"log.txt:{line}" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 or "error:" in result.output.splitlines()[0]


def test_cli_contract_fragment_and_plot(tmp_path):
    alpha, latency, bw = 5e-6, 1e-6, 48e9
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(nccl_log(engine_times("switch", "ring", 16, SIZES, alpha, latency, bw), SIZES, 16, noise=0.01))
    runner = CliRunner()
    result = runner.invoke(app, ["calibrate", "nccl-tests", str(path), "--ranks", "16", "--topology", "switch",
                                 "--algo", "ring", "--model", "engine", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["bandwidth_Bps"] == pytest.approx(bw, rel=0.03)
    assert data["alpha_s"] == pytest.approx(alpha, rel=0.15)
    assert data["latency_s"] == pytest.approx(latency)
    assert 0 < data["rms_relative_error"] < 0.03
    assert not (tmp_path / "out").exists()  # --json writes nothing without --out
    out = tmp_path / "out"
    result = runner.invoke(app, ["calibrate", "nccl-tests", str(path), "--ranks", "16", "--model", "engine",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    fragment = yaml.safe_load((out / "calibration.yaml").read_text())
    assert set(fragment["cluster"]) == {"alpha", "latency", "rail_bandwidth"}
    assert (out / "calibration.png").stat().st_size > 0
    from lightrail.scenario import DEFAULT_SCENARIO, parse_scenario
    from lightrail.units import parse_rate

    merged = {**DEFAULT_SCENARIO, "cluster": {**DEFAULT_SCENARIO["cluster"], **fragment["cluster"]}}
    built = parse_scenario(merged).build()  # the fragment is a valid scenario part
    assert built.fabric.nic_bandwidth == pytest.approx(parse_rate(fragment["cluster"]["rail_bandwidth"]))
    wrong = runner.invoke(app, ["calibrate", "nccl-tests", str(path), "--ranks", "8", "--json"])
    assert wrong.exit_code == 2 and "--ranks" in wrong.output


def test_cli_nccl_model_contract(tmp_path):
    """--model nccl (the default): the old keys stay, with warnings, per-size choices and the fitted parameters;
    --algo forces one algorithm (the protocol is still chosen); bad input is one line naming the flag."""
    from lightrail.nccl import Communicator, NcclParams, choose

    comm = Communicator(nranks=32, gpus_per_node=8, nvlink_Bps=450e9, nic_Bps=50e9, nvls=True)
    truth = NcclParams(nic_Bps=40e9, base_latency_s=(10e-6, 20e-6, 12e-6))
    times = choose("allreduce", SIZES, comm, truth).seconds * 1e6
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(nccl_log(list(times), SIZES, 32, noise=0.01))
    runner = CliRunner()
    base = ["calibrate", "nccl-tests", str(path), "--ranks", "32", "--gpus-per-server", "8", "--topology", "rails"]
    result = runner.invoke(app, [*base, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    old = {"kind", "algo", "topology", "ranks", "alpha_s", "latency_s", "bandwidth_Bps", "latency_fitted",
           "hops_per_step", "startup_per_step_s", "rms_relative_error", "max_relative_error", "points"}
    assert old | {"warnings", "choices", "params", "model"} <= set(data)
    assert data["model"] == "nccl" and data["algo"] == "auto" and data["topology"] == "rails"
    # the log names H100: its rates are nominal; NVLink is capped by the NICs at every size: not determined
    assert data["rms_relative_error"] < 0.03 and data["bandwidth_identified"] == {"nvlink_Bps": False, "nic_Bps": True}
    assert [w for w in data["warnings"] if "not determined by the data" not in w] == []
    assert sum("NVLink bandwidth is not determined" in w for w in data["warnings"]) == 1
    assert data["params"]["nic_Bps"] == pytest.approx(40e9, rel=0.05)
    assert [c["size"] for c in data["choices"]] == SIZES
    assert {c["protocol"] for c in data["choices"]} >= {"LL", "Simple"}
    forced = json.loads(runner.invoke(app, [*base, "--algo", "ring", "--json"]).stdout)
    assert {c["algorithm"] for c in forced["choices"]} == {"ring"} and forced["algo"] == "ring"
    assert len({c["protocol"] for c in forced["choices"]}) > 1
    slow = runner.invoke(app, [*base, "--rail-bandwidth", "100Gbps", "--json"])  # 40 GB/s fitted > 12.5 nominal
    assert any("NIC bandwidth" in w and "x the nominal" in w for w in json.loads(slow.stdout)["warnings"])
    shown = runner.invoke(app, [*base, "--rail-bandwidth", "100Gbps"])
    assert shown.exit_code == 0 and "warning:" in shown.output and "nvls-tree" in shown.output
    for args, flag in ((["--algo", "tree", "--op", "broadcast"], "--algo"), (["--algo", "hypercube"], "--algo"),
                       (["--topology", "torus2d"], "--topology"), (["--model", "exact"], "--model"),
                       (["--gpus-per-server", "3"], "--gpus-per-server"), (["--gpu", "z80"], "--gpu")):
        bad = runner.invoke(app, [*base, *args, "--json"])
        assert bad.exit_code == 2 and flag in bad.output and "Traceback" not in bad.output, (args, bad.output)
    out = tmp_path / "out"
    assert runner.invoke(app, [*base, "--out", str(out)]).exit_code == 0
    fragment = yaml.safe_load((out / "calibration.yaml").read_text())
    assert set(fragment["cluster"]) == {"alpha", "latency", "rail_bandwidth", "nvlink_bandwidth"}
    assert (out / "calibration.png").stat().st_size > 0
