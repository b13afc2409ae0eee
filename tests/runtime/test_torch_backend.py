"""The torch.distributed backend "lightrail" and the end-to-end training demo on emulated photonic rails:
phases identified from groups, circuits by the PXN rule, identical losses, no unsafe reconfiguration."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from lightrail.cli import app  # noqa: E402
from lightrail.runtime.torch_backend import circuits_of, phase_of  # noqa: E402
from lightrail.studies.photonic_demo import run_photonic_demo  # noqa: E402
from lightrail.studies.train_demo import DemoConfig  # noqa: E402
from lightrail.workload.parallel import Dim, Layout  # noqa: E402

LAYOUT = Layout.from_degrees(8, tp=2, pp=2, dp=2, gpus_per_server=2)


def test_phase_of_every_group_is_its_dimension():
    for dim in (Dim.TP, Dim.DP, Dim.PP):
        for group in LAYOUT.groups(dim):
            assert phase_of(LAYOUT, group) == dim.value
    assert phase_of(LAYOUT, range(8)) == "tp+dp+pp"
    assert phase_of(LAYOUT, [0, 4]) == "pp" and phase_of(LAYOUT, [3]) == "self"


def test_circuits_follow_the_destination_rail_between_servers():
    # servers of 2 GPUs: rank r sits on server r // 2, rail r % 2
    assert circuits_of(LAYOUT, [(0, 1)]) == {}  # same server: NVLink, no circuit
    assert circuits_of(LAYOUT, [(0, 4)]) == {"rail0": {0: 2}}
    assert circuits_of(LAYOUT, [(1, 4)]) == {"rail0": {0: 2}}  # PXN: the rail of the destination GPU
    assert circuits_of(LAYOUT, [(0, 2), (2, 0)]) == {"rail0": {0: 1, 1: 0}}
    for group in LAYOUT.groups(Dim.TP):
        ring = list(zip(group, [*group[1:], group[0]], strict=True))
        assert circuits_of(LAYOUT, ring) == {}


def test_leases_only_for_phases_of_one_configuration(monkeypatch):
    from lightrail.control.plan import runtime_plan
    from lightrail.runtime.torch_backend import _Agent

    pp2 = _Agent(None, LAYOUT, "provisioned", 0, plan=runtime_plan(LAYOUT))
    assert pp2.leased("dp:0,2") and pp2.leased("pp:0<->4") and not pp2.leased("tp+dp+pp:0,1,2,3,4,5,6,7")
    pp4 = Layout.from_degrees(8, tp=1, pp=4, dp=2, gpus_per_server=2)
    agent = _Agent(None, pp4, "provisioned", 0, plan=runtime_plan(pp4))
    # a middle stage's forward and backward circuits share a transmitter: two matchings, per-op
    assert agent.leased("dp:0,1") and not agent.leased("pp:2->4")
    assert not _Agent(None, LAYOUT, "provisioned", 0, plan=runtime_plan(LAYOUT), leases=False).leased("dp:0,2")


@pytest.mark.slow
def test_training_on_emulated_photonic_rails_gives_identical_losses(tmp_path):
    config = DemoConfig(tp=2, pp=2, dp=2, steps=3, layers=2, d_model=32, heads=2, microbatches=2, seq=16)
    result = run_photonic_demo(config, ocs_delay_s=0.002, mode="provisioned", workdir=tmp_path)
    assert result["losses_identical"] and len(result["losses"]) == 3
    assert result["losses"] == result["lightrail_losses"]
    assert result["unsafe_reconfigurations"] == 0
    # DP and PP share each rail's ports (PXN), so the fabric must switch within every iteration
    assert result["reconfigurations_per_iteration"] >= 1
    assert result["request_latency_p99_s"] is not None and result["request_latency_p99_s"] > 0
    assert result["predicted"]["reconfigurations_per_rail_per_iteration"] >= 1
    # leases: DP and PP are one configuration each, so most ops run with no request
    assert result["leases"] and result["ops_under_lease"] > 0.3
    assert 0 < result["controller_requests_per_iteration"] < 12
    assert result["predicted_overhead_s"] == result["predicted"]["overhead_s"]
    assert result["predicted"]["schedule"] == "gpipe" and result["predicted"]["peak_tflops"] > 0
    state = json.loads((tmp_path / "controller.log").read_text().splitlines()[0])
    assert state["event"] == "ready"


@pytest.mark.slow
def test_train_demo_cli_on_demand_json(tmp_path):
    out = tmp_path / "demo"
    r = CliRunner().invoke(app, ["train-demo", "--ranks", "4", "--tp", "1", "--pp", "2", "--dp", "2", "--steps", "2",
                                 "--ocs-delay", "1ms", "--mode", "on_demand", "--gpus-per-server", "1", "--out",
                                 str(out), "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.output[r.output.index("{"):])
    for key in ("gloo_iteration_s", "lightrail_iteration_s", "overhead_s", "reconfigurations_per_iteration",
                "request_latency_p99_s", "losses_identical", "unsafe_reconfigurations", "predicted",
                "predicted_overhead_s", "controller_requests_per_iteration", "model_to_measured_ratio"):
        assert key in result
    assert result["losses_identical"] is True and result["unsafe_reconfigurations"] == 0
    assert (out / "train-demo.json").is_file() and (out / "iterations.png").is_file()


@pytest.mark.parametrize(("args", "flag"), [
    (["--tp", "3"], "--ranks"),
    (["--ranks", "8", "--tp", "2", "--pp", "2", "--dp", "1"], "--ranks"),
    (["--ocs-delay", "abc"], "--ocs-delay"),
    (["--mode", "sometimes"], "--mode"),
    (["--gpus-per-server", "3"], "--gpus-per-server"),
    (["--steps", "0"], "--steps"),
])
def test_train_demo_bad_input_exits_2_naming_the_flag(args, flag, tmp_path):
    r = CliRunner().invoke(app, ["train-demo", "--out", str(tmp_path / "x"), *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert not (tmp_path / "x").exists()
