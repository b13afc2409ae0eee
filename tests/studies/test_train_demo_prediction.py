"""train-demo's prediction of its own run: the run's measured control-plane costs as the model's parameters, the
compute calibrated under processor sharing of the emulation host's cores, and the controller's CPU on them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightrail.studies.rails import JobRuns
from lightrail.studies.train_demo import DemoConfig
from lightrail.studies.train_demo.prediction import (
    DEMO_POLICY,
    _scenario,
    calibrated_peak_tflops,
    demo_plan,
    measured_control,
    predicted_overhead,
)

METRICS = {'lightrail_revoke_seconds{quantile="0.5"}': 1e-3,
           'lightrail_switch_lag_seconds{kind="after",quantile="0.5"}': 3e-3,
           'lightrail_grant_overhead_seconds{kind="switch",quantile="0.5"}': 5e-3}


def test_measured_control_reads_each_cost_where_it_acts():
    round_trips = [2e-3] * 99 + [0.6]  # a reply held across the other replicas' turn: left out
    with_leases = measured_control(METRICS, round_trips, leases=True)
    assert with_leases == pytest.approx({"check_in_rtt": 2e-3, "revoke_rtt": 1e-3, "switch_grant_latency": 3e-3,
                                         "command_latency": 5e-3 - 3e-3 - 1e-3})
    assert measured_control(METRICS, round_trips, leases=False)["command_latency"] == pytest.approx(2e-3)
    # a mean, not a median: skewed round trips count at their expected value
    assert measured_control({}, [1e-3] * 30 + [4e-3] * 20, leases=True) == pytest.approx({"check_in_rtt": 2.2e-3})
    # no switch lag reported (an older controller): the whole overhead stays before the switch
    older = {k: v for k, v in METRICS.items() if "switch_lag" not in k}
    assert measured_control(older, [], leases=False) == pytest.approx({"revoke_rtt": 1e-3, "command_latency": 5e-3})


CONFIG = DemoConfig(steps=2)


def _electrical(peak: float, cores: int | None) -> float:
    built = _scenario(CONFIG, gpus_per_server=2, ocs_delay=0.0, policy=DEMO_POLICY, peak_tflops=peak).build()
    return JobRuns(built.job).electrical(replace(built.fabric, host_cores=cores)).iteration_time_s


def test_calibration_under_processor_sharing_reproduces_the_measured_iteration():
    """The compute rate fitted on the host's two cores gives back the measured iteration, and is another rate
    than the one fitted as if every rank had its own core (stages that run alone run faster)."""
    own = calibrated_peak_tflops(CONFIG, gpus_per_server=2, iteration_s=0.2)
    shared = calibrated_peak_tflops(CONFIG, gpus_per_server=2, iteration_s=0.2, host_cores=2)
    assert _electrical(own, None) == pytest.approx(0.2, rel=1e-9)
    assert _electrical(shared, 2) == pytest.approx(0.2, rel=1e-6)
    assert shared > 1.5 * own  # 8 ranks on 2 cores: a rank computes at most half as fast as on its own core


def test_the_controllers_cpu_lengthens_the_iteration_by_its_share_of_the_cores():
    plan = demo_plan(CONFIG, gpus_per_server=2, policy=replace(DEMO_POLICY, mode="provisioned"))
    kwargs = dict(gpus_per_server=2, ocs_delay=0.01, plan=plan, peak_tflops=0.01, host_cores=2)
    base = predicted_overhead(CONFIG, **kwargs)
    busy = predicted_overhead(CONFIG, **kwargs, host_work_s=0.02)
    assert busy.overhead_s - base.overhead_s == pytest.approx(0.02 / 2, rel=1e-9)
    assert busy.overhead_breakdown_s["host_cpu_s"] == pytest.approx(0.01)
    assert sum(busy.overhead_breakdown_s.values()) == pytest.approx(busy.overhead_s, rel=1e-9)
    assert busy.to_dict()["host_work_s"] == 0.02 and busy.to_dict()["host_cores"] == 2


def test_the_switch_grant_lag_reaches_the_model_as_a_fabric_parameter():
    """On demand every phase change waits for its switch: the run's lag after each switch adds to the prediction
    (and is reported), where a zero lag adds nothing."""
    plan = demo_plan(CONFIG, gpus_per_server=2, policy=replace(DEMO_POLICY, mode="on-demand"))
    kwargs = dict(gpus_per_server=2, ocs_delay=0.01, plan=plan, peak_tflops=0.01, host_cores=2)
    none = predicted_overhead(CONFIG, **kwargs, control={"switch_grant_latency": 0.0})
    lag = predicted_overhead(CONFIG, **kwargs, control={"switch_grant_latency": 5e-3})
    assert lag.switch_grant_latency_s == 5e-3
    assert lag.overhead_s > none.overhead_s + 5e-3  # at least one switch per iteration on the critical path


def test_host_work_is_the_controllers_cpu_and_the_clients_cpu_beyond_the_bare_wrapper():
    """Per lightrail step: the controller's CPU over the run, and per rank its CPU per step less the controller-less
    replica's, over the steps the medians keep (not each block's first)."""
    from lightrail.studies.train_demo.launch import DemoRun, ReplicaRun
    from lightrail.studies.train_demo.measure import _host_work

    config = DemoConfig(steps=10)
    main = [0.5 if k % 5 == 0 else 0.012 for k in range(10)]  # warm-up steps left out
    bare = [0.5 if k % 5 == 0 else 0.010 for k in range(10)]
    ranks = tuple({"rank": r, "cpu_s": main, "baselines": [{"cpu_s": bare}, {"cpu_s": bare}]} for r in range(8))
    replica = ReplicaRun("lightrail", (), (), True, (), 0.1)
    run = DemoRun(config, 8, replica, ranks, baseline=replica, others=(replica,))
    assert _host_work(run, config, 1.0, 1.3) == pytest.approx(0.3 / 10 + 8 * 0.002)
    assert _host_work(run, config, None, 1.3) is None  # not measured (no /proc)
    swapped = tuple({**r, "cpu_s": bare, "baselines": [{"cpu_s": main}, {"cpu_s": main}]} for r in ranks)
    assert _host_work(replace(run, ranks=swapped), config, 1.0, 1.3) == pytest.approx(0.3 / 10)  # noise below 0
    assert _host_work(replace(run, others=()), config, 1.0, 1.3) is None  # no controller-less replica
