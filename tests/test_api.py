"""The Python API (``lightrail.simulate`` / ``sweep`` / ``collective`` / ``calibrate``): the same answers as the CLI's
``--json`` for the same inputs, errors naming the field, and the contract's one-liner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lightrail
from lightrail.cli import app
from lightrail.errors import LightrailError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "debug-tiny.yaml"
LOG = ROOT / "tests" / "data" / "nccl" / "aws-p5-2x8-h100-efa.txt"


def cli_json(*args) -> dict:
    result = CliRunner().invoke(app, [str(a) for a in args] + ["--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_contract_one_liner_prints_the_default_scenarios_overhead():
    done = subprocess.run([sys.executable, "-c", "import lightrail; r = lightrail.simulate(ablation=False); "
                           "print(r.to_dict()['overhead'])"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert float(done.stdout) == cli_json("simulate", "--no-ablation")["overhead"]


def test_simulate_is_the_cli_simulate():
    assert lightrail.simulate(TINY).to_dict() == cli_json("simulate", TINY)


def test_simulate_takes_a_mapping_and_overrides():
    scenario = {"name": "tiny", "model": {"preset": "debug"}, "cluster": {"gpus": 16}, "parallel": {"tp": 2, "pp": 2},
                "job": {"micro_batches": 4}}
    r = lightrail.simulate(scenario, ocs_delay=0.05, mode="on-demand", ablation=False)
    assert (r.reconfig_delay_s, str(r.mode), r.ablation) == (0.05, "on-demand", ())
    assert r.to_dict() == lightrail.simulate(scenario, ocs_delay="50ms", mode="on_demand", ablation=False).to_dict()


def test_sweep_is_the_cli_sweep():
    api = lightrail.sweep(TINY, ocs_delays=["10ms", 0.1]).to_dict()
    assert api == cli_json("sweep", TINY, "--ocs-delays", "10ms,100ms")


def test_collective_is_the_cli_collective():
    api = lightrail.collective("allreduce", "ring", ranks=16, size="64MiB").to_dict()
    cli = cli_json("collective", "--op", "allreduce", "--algo", "ring", "--ranks", "16", "--size", "64MiB")
    assert {k: v for k, v in cli.items() if k != "splits"} == api


def test_calibrate_is_the_cli_calibrate(tmp_path):
    api = lightrail.calibrate(LOG, ranks=16).to_dict()
    assert api == cli_json("calibrate", "nccl-tests", LOG, "--ranks", "16", "--out", tmp_path)


@pytest.mark.parametrize(("call", "field"), [
    (lambda: lightrail.simulate({"name": "x", "model": {"preset": "nope"}, "cluster": {"gpus": 16},
                                 "job": {"micro_batches": 4}}), "unknown model"),
    (lambda: lightrail.simulate(TINY, ocs_delay="ten"), "ocs_delay"),
    (lambda: lightrail.simulate(TINY, mode="sometimes"), "mode"),
    (lambda: lightrail.collective(ranks=1), "ranks"),
    (lambda: lightrail.collective("allreduce", "nope"), "algorithm"),
    (lambda: lightrail.sweep(TINY, ocs_delays=[]), "ocs_delays"),
])
def test_bad_input_raises_an_error_naming_the_field(call, field):
    with pytest.raises(LightrailError) as info:
        call()
    assert field in str(info.value)


def test_the_package_exports_the_four_calls_and_nothing_else_by_surprise():
    assert set(lightrail.__all__) == {"simulate", "sweep", "collective", "calibrate", "__version__"}
    with pytest.raises(AttributeError):
        lightrail.nothing_here  # noqa: B018
