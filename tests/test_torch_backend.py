"""The torch.distributed backend "lightrail" and the end-to-end training demo on emulated photonic rails:
phases identified from groups, circuits by the PXN rule, identical losses, no unsafe reconfiguration."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from lightrail.cli import app  # noqa: E402
from lightrail.runtime.photonic_demo import run_photonic_demo  # noqa: E402
from lightrail.runtime.torch_backend import circuits_of, phase_of  # noqa: E402
from lightrail.runtime.train_demo import DemoConfig  # noqa: E402
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
    for key in ("gloo_iteration_s", "lightrail_iteration_s", "reconfigurations_per_iteration",
                "request_latency_p99_s", "losses_identical"):
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
