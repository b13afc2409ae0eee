"""The torch.distributed backend "lightrail" and the end-to-end training demo on emulated photonic rails:
phases identified from groups, circuits by the PXN rule, identical losses, no unsafe reconfiguration;
the backend's one config object, and the train-demo verb's flags (old spellings noted)."""

from __future__ import annotations

import dataclasses
import json
import pickle
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from lightrail.cli import app  # noqa: E402
from lightrail.control.plan import Mode, Policy, runtime_plan  # noqa: E402
from lightrail.errors import ScenarioError  # noqa: E402
from lightrail.runtime.launch import free_port  # noqa: E402
from lightrail.runtime.torch_backend import Agent, BackendConfig, Inner, circuits_of, phase_of, setup  # noqa: E402
from lightrail.studies.train_demo import DemoConfig  # noqa: E402
from lightrail.studies.train_demo.measure import (  # noqa: E402
    DEMO_POLICY,
    PhotonicDemoResult,
    Prediction,
    demo_plan,
    grant_waits,
    run_photonic_demo,
)
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


def test_leases_only_for_phases_of_one_configuration():
    pp2 = Agent(BackendConfig(layout=LAYOUT))
    assert pp2.leased("dp:0,2") and pp2.leased("pp:0<->4") and not pp2.leased("tp+dp+pp:0,1,2,3,4,5,6,7")
    pp4 = Layout.from_degrees(8, tp=1, pp=4, dp=2, gpus_per_server=2)
    agent = Agent(BackendConfig(layout=pp4))
    # a middle stage's forward and backward circuits share a transmitter: two matchings, per-op
    assert agent.leased("dp:0,1") and not agent.leased("pp:2->4")
    assert not Agent(BackendConfig(layout=LAYOUT, plan=runtime_plan(LAYOUT, Policy(leases=False)))).leased("dp:0,2")


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 2, 2), (1, 4, 2), (2, 1, 4)])
def test_train_demo_runs_its_one_plan_and_leases_what_the_runtime_plan_would(tp, pp, dp):
    """The Plan train-demo hands the backend (the planner's, for the demo's program) carries the flags' policy,
    and leases exactly the groups the backend's own ring plan would: the same circuits, read from one object."""
    config = DemoConfig(tp=tp, pp=pp, dp=dp, steps=2, layers=4)
    policy = replace(DEMO_POLICY, mode=Mode.ON_DEMAND)
    plan = demo_plan(config, gpus_per_server=2, policy=policy)
    assert plan.policy is policy
    mine, ring = Agent(BackendConfig(layout=plan.layout, plan=plan)), Agent(BackendConfig(layout=plan.layout))
    lay = plan.layout
    groups = [(f"dp:{','.join(map(str, g))}", list(zip(g, np.roll(g, -1), strict=True))) for g in
              lay.groups(Dim.DP).tolist()]
    stride = lay.stride(Dim.PP)
    groups += [(f"pp:{a}<->{a + stride}", [(a, a + stride), (a + stride, a)]) for a in range(lay.world - stride)]
    asked = 0
    for key, transfers in groups:
        if circuits_of(lay, transfers):  # groups inside a server never reach the controller
            assert mine.leased(key, transfers) == ring.leased(key, transfers), key
            asked += 1
    assert asked


@pytest.mark.slow
def test_training_on_emulated_photonic_rails_gives_identical_losses(tmp_path):
    config = DemoConfig(tp=2, pp=2, dp=2, steps=3, layers=2, d_model=32, heads=2, microbatches=2, seq=16)
    result = run_photonic_demo(config, ocs_delay=0.002, workdir=tmp_path).to_dict()
    assert result["losses_identical"] and len(result["losses"]) == 3
    assert result["losses"] == result["lightrail_losses"]
    assert result["unsafe_reconfigurations"] == 0
    # DP and PP share each rail's ports (PXN), so the fabric must switch within every iteration
    assert result["reconfigurations_per_iteration"] >= 1
    assert result["request_latency_p99_s"] is not None and result["request_latency_p99_s"] > 0
    # the controller-less replica took turns with the two: the overhead splits into the wrapper's and the fabric's
    assert result["wrapper_overhead_s"] is not None
    assert result["fabric_overhead_s"] == pytest.approx(result["overhead_s"] - result["wrapper_overhead_s"])
    assert result["predicted"]["reconfigurations_per_rail_per_iteration"] >= 1
    # leases: DP and PP are one configuration each, so most ops run with no request
    assert result["leases"] and result["ops_under_lease"] > 0.3
    assert 0 < result["controller_requests_per_iteration"] < 12
    assert result["predicted_overhead_s"] == result["predicted"]["overhead_s"]
    assert result["predicted"]["schedule"] == "gpipe" and result["predicted"]["peak_tflops"] > 0
    # the ranks' op timelines: each stage waited for grants of its pipeline and its DP groups
    assert {stage: sorted(phases) for stage, phases in result["grant_wait_s"].items()} == {"0": ["dp", "pp"],
                                                                                        "1": ["dp", "pp"]}
    assert all(w >= 0 for phases in result["grant_wait_s"].values() for w in phases.values())
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


# --- the backend's one config object ----------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"layout": "tp=2,pp=2"}, "layout"),
    ({"controller": "127.0.0.1"}, "controller"),
    ({"controller": "127.0.0.1:http"}, "controller"),
    ({"controller": "127.0.0.1:70000"}, "controller"),
    ({"controller": ":7600"}, "controller"),
    ({"job": ""}, "job"),
    ({"plan": "provisioned"}, "plan"),
    ({"inner": "mpi"}, "inner"),
])
def test_backend_config_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ScenarioError) as info:
        BackendConfig(**{"layout": LAYOUT, **kwargs})
    assert info.value.field == field
    assert field in str(info.value)


def test_backend_config_parses_its_strings_is_frozen_and_pickles():
    """Workers get the config as an argument (spawned processes: it must pickle), never from the environment."""
    config = BackendConfig(layout=LAYOUT, controller="127.0.0.1:7600", job="j1", inner="nccl",
                           plan=runtime_plan(LAYOUT, Policy(mode="on_demand")))
    assert config.plan.mode is Mode.ON_DEMAND and config.inner is Inner.NCCL and config.address() == ("127.0.0.1", 7600)
    copy = pickle.loads(pickle.dumps(config))
    assert copy.plan.policy == config.plan.policy and copy.plan.phases == config.plan.phases
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.plan = None
    assert BackendConfig(layout=LAYOUT).controller is None  # no controller: the wrapped backend alone


def test_registering_again_binds_new_groups_to_the_new_agent():
    """torch keeps one factory per backend name: a second setup in the same process (a second run) rebinds
    "lightrail", so the groups created from then on use the new agent, and the old one is left untouched."""
    if dist.is_initialized():
        pytest.skip("this process already has a default group")
    one = Layout.from_degrees(1, gpus_per_server=1)
    first, second = setup(BackendConfig(layout=one)), setup(BackendConfig(layout=one))
    dist.init_process_group("lightrail", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        x = torch.ones(4)
        dist.all_reduce(x)
        assert x.tolist() == [1.0] * 4
        assert second.rank == 0 and first.rank is None
        assert second.stats() == first.stats() == {"requests": 0, "wait_s": 0.0, "request_s": [], "ops": 0,
                                                   "under_lease": 0, "revokes": 0}
    finally:
        dist.destroy_process_group()
        second.close()


def test_grant_waits_split_a_ranks_timeline_by_stage_phase_and_step():
    """Hand-built timelines of two ranks of stage 0 and one of stage 1: the waits (granted - start) of ops on the
    rails add up per step and phase, in-server ops and skipped steps do not count, the stage's ranks are averaged."""
    def rank(stage, starts, ops):
        return {"stage": stage, "step_start_s": starts, "timeline": ops}

    a = rank(0, [0.0, 1.0, 2.0], [("pp:0<->4", True, 0.1, 0.5, 0.6),  # step 0: skipped
                                  ("pp:0<->4", True, 1.1, 1.103, 1.2), ("pp:0<->4", True, 1.3, 1.301, 1.4),
                                  ("tp:0,1", False, 1.5, 1.9, 1.95), ("dp:0,2", True, 1.6, 1.61, 1.7),
                                  ("pp:0<->4", True, 2.1, 2.105, 2.2), ("dp:0,2", True, 2.6, 2.63, 2.7)])
    b = rank(0, [0.0, 1.0, 2.0], [("pp:2<->6", True, 1.1, 1.101, 1.2), ("dp:0,2", True, 1.6, 1.63, 1.7),
                                  ("pp:2<->6", True, 2.1, 2.101, 2.2), ("dp:0,2", True, 2.6, 2.61, 2.7)])
    c = rank(1, [0.0, 1.0, 2.0], [("pp:0<->4", True, 1.0, 1.05, 1.2), ("pp:0<->4", True, 2.0, 2.07, 2.2)])
    waits = grant_waits([a, b, c], skip={0})
    # stage 0, pp: steps 1 and 2 are (0.004 + 0.001) / 2 and (0.005 + 0.001) / 2; dp: (0.01 + 0.03) / 2 twice
    assert waits["0"]["pp"] == pytest.approx((0.0025 + 0.003) / 2)
    assert waits["0"]["dp"] == pytest.approx(0.02)
    assert waits["1"] == {"pp": pytest.approx(0.06)}
    assert "tp" not in waits["0"]


# --- train-demo: flags, old spellings, the JSON ---------------------------------------------------------------

JSON_KEYS = ["ranks", "tp", "pp", "dp", "steps", "gpus_per_server", "rails", "ocs_delay_s", "mode", "leases",
             "gloo_iteration_s", "lightrail_iteration_s", "overhead_s", "overhead", "predicted_overhead_s",
             "model_to_measured_ratio", "controller_requests_per_iteration", "ops_under_lease",
             "revocations_per_iteration", "reconfigurations_per_iteration", "reconfigurations_per_rail_per_iteration",
             "request_latency_p50_s", "request_latency_p99_s", "acquire_wait_p99_s", "unsafe_reconfigurations",
             "losses_identical", "losses", "lightrail_losses", "gloo_iteration_series_s",
             "lightrail_iteration_series_s", "measurement", "predicted", "controller_startup_s", "controller_restarts",
             "spares", "recovery", "wrapper_overhead_s", "fabric_overhead_s", "fabric_model_to_measured_ratio",
             "grant_wait_s", "controller_pauses", "failovers"]
"""train-demo.json's keys, in order: as before the result was typed, then the wrapper's share (issue 29)."""


def _canned(config: DemoConfig, *, ocs_delay: float, policy: Policy, **_) -> PhotonicDemoResult:
    """A train-demo result without training: the verb's parsing, reporting and files, in milliseconds."""
    mode, leases = policy.mode, policy.leases
    predicted = Prediction(0.11, 0.1, 0.01, 4.0, 4.0, {"exposed_reconfiguration_s": 0.01}, 0.5, 4e-4, leases,
                           "gpipe", switch_grant_latency_s=3e-3, host_cores=2, host_work_s=0.02)
    return PhotonicDemoResult(
        ranks=config.world, tp=config.tp, pp=config.pp, dp=config.dp, steps=config.steps, gpus_per_server=2, rails=2,
        ocs_delay_s=ocs_delay, mode=mode, leases=leases, gloo_iteration_s=0.1, lightrail_iteration_s=0.12,
        overhead_s=0.02, overhead=0.2, predicted_overhead_s=0.01, model_to_measured_ratio=2.0,
        controller_requests_per_iteration=6.0, ops_under_lease=0.5, revocations_per_iteration=1.0,
        reconfigurations_per_iteration=8.0, reconfigurations_per_rail_per_iteration=4.0, request_latency_p50_s=4e-4,
        request_latency_p99_s=1e-3, acquire_wait_p99_s=0.02, unsafe_reconfigurations=0.0, losses_identical=True,
        losses=(5.5, 5.4), lightrail_losses=(5.5, 5.4), gloo_iteration_series_s=(0.1, 0.1),
        lightrail_iteration_series_s=(0.12, 0.12), measurement="canned", predicted=predicted,
        controller_startup_s=0.5)


@pytest.mark.parametrize(("args", "env", "leases", "note"), [
    ([], None, True, None),
    (["--no-leases"], None, False, None),
    ([], "0", False, "note: LIGHTRAIL_LEASES=0 is now --no-leases"),
    (["--leases"], "0", True, None),  # the flag wins over the old variable
    (["--no-leases", "--mode", "on_demand"], None, False, "note: --mode on_demand is now --mode on-demand"),
])
def test_train_demo_leases_flag_replaces_the_environment_variable(args, env, leases, note, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("lightrail.studies.train_demo.measure.run_photonic_demo",
                        lambda config, **kw: calls.append(kw) or _canned(config, **kw))
    if env is None:
        monkeypatch.delenv("LIGHTRAIL_LEASES", raising=False)
    else:
        monkeypatch.setenv("LIGHTRAIL_LEASES", env)
    r = CliRunner().invoke(app, ["train-demo", "--steps", "2", "--out", str(tmp_path), *args, "--json"])
    assert r.exit_code == 0, r.output
    (kw,) = calls
    assert kw["policy"].leases is leases and kw["policy"] == replace(DEMO_POLICY, mode=kw["policy"].mode, leases=leases)
    assert (note in r.output) if note else "note:" not in r.output
    result = json.loads(r.output[r.output.index("{"):])
    assert list(result) == JSON_KEYS and result["leases"] is leases
    assert json.loads((tmp_path / "train-demo.json").read_text()) == result
    assert (tmp_path / "iterations.png").is_file()


def test_train_demo_table_reports_the_typed_result(monkeypatch, tmp_path):
    monkeypatch.setattr("lightrail.studies.train_demo.measure.run_photonic_demo", _canned)
    r = CliRunner().invoke(app, ["train-demo", "--steps", "2", "--ocs-delay", "5ms", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    flat = "".join(r.output.split())  # long lines wrap at the console's width, a long path even mid-word
    for text in ("train-demo: 8 CPU ranks (TP2 PP2 DP2), 2 rails, OCS 5ms, provisioned", "iteration (median)",
                 "20ms (+20.0%)", "measured / predicted overhead: 2.00x", "leases on", "losses identical: yes",
                 "compute on 2 shared cores (processor sharing); the control plane's CPU on them 20ms per iteration; "
                 "3ms from a switch's end to its grant",
                 f"wrote {tmp_path / 'train-demo.json'}, {tmp_path / 'iterations.png'}"):
        assert "".join(text.split()) in flat, text


def test_train_demo_spare_flags_reach_the_run_and_its_recovery_is_reported(monkeypatch, tmp_path):
    recovery = {"rank": 3, "spare": 8, "checkpoint_step": 9, "steps_lost": 0, "detected_by": "controller",
                "detect_s": 0.01, "rewire_s": 0.002, "rebuild_s": 0.1, "restore_s": 0.05, "first_step_s": 0.5,
                "woken_by": {"connection": 7}, "losses_match_uninterrupted": True}
    calls = []

    def canned(config, **kw):
        calls.append(kw)
        return dataclasses.replace(_canned(config, **kw), spares=kw["spares"], recovery=recovery)

    monkeypatch.setattr("lightrail.studies.train_demo.measure.run_photonic_demo", canned)
    args = ["train-demo", "--steps", "20", "--spares", "1", "--kill-rank", "3", "--kill-at-step", "10",
            "--out", str(tmp_path)]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    assert {k: calls[0][k] for k in ("spares", "kill_rank", "kill_at_step")} == \
        {"spares": 1, "kill_rank": 3, "kill_at_step": 10}
    result = json.loads(r.output[r.output.index("{"):])
    assert result["recovery"] == recovery and result["spares"] == 1
    r = CliRunner().invoke(app, args)
    flat = " ".join(r.output.split())
    assert "rank 3 killed (SIGKILL), spare 8 took its place" in flat and "first step after 500ms" in flat, flat
