"""The main jobs as Python calls: what ``lightrail simulate``, ``sweep``, ``collective`` and ``calibrate
nccl-tests`` compute, returned as the typed results the CLI prints (each with ``to_dict()``, the ``--json``).

Arguments take numbers in SI units (seconds, bytes, bytes per second) or strings with units (``"10ms"``,
``"1GiB"``, ``"400Gbps"``), as the CLI's flags do; a scenario is a file path, a mapping (the YAML's content) or
None (the embedded default). Bad input raises :class:`lightrail.errors.LightrailError` naming the field at fault.

>>> import lightrail
>>> r = lightrail.simulate({"name": "tiny", "model": {"preset": "debug"}, "cluster": {"gpus": 16},
...                         "parallel": {"tp": 2, "pp": 2}, "job": {"micro_batches": 4}},
...                        ocs_delay="10ms", ablation=False)
>>> r.gpus, r.reconfig_delay_s, r.ablation
(16, 0.01, ())
>>> round(r.to_dict()["overhead"], 4) == round(r.iteration_time_s / r.baseline_iteration_time_s - 1, 4)
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from lightrail.defaults import ALPHA, HOP_LATENCY, NIC_BANDWIDTH, NVLINK_BANDWIDTH, OCS_DELAYS
from lightrail.errors import ScenarioError

__all__ = ["simulate", "sweep", "collective", "calibrate"]

ScenarioLike = str | Path | Mapping | None


def _seconds(value, field: str) -> float:
    from lightrail.units import parse_time

    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else \
        parse_time(str(value), field=field)


def _bytes(value, field: str) -> float:
    from lightrail.units import parse_size

    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else \
        parse_size(str(value), field=field)


def _rate(value, field: str) -> float:
    from lightrail.units import parse_rate

    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else \
        parse_rate(str(value), field=field)


def built(scenario: ScenarioLike = None, *, ocs_delay=None, mode: str | None = None, runs: int = 1):
    """The scenario built (:class:`lightrail.scenario.Built`), checked for size before any work, with
    ``ocs_delay`` and ``mode`` applied as the CLI's ``--ocs-delay`` and ``--mode`` are."""
    from lightrail.cli.options import check_simulation_size
    from lightrail.defaults import Mode
    from lightrail.scenario import load_scenario, parse_scenario

    if isinstance(scenario, Mapping):
        loaded, base = parse_scenario(dict(scenario)), None
    else:
        loaded, base = load_scenario(scenario)
    check_simulation_size(loaded, runs=runs, runs_field="ocs_delays" if runs > 1 else None)
    result = loaded.build(base)
    if result.trace is not None:
        raise ScenarioError("this call needs a model, and the scenario gives a trace", field="workload",
                            fix="replay traces with `lightrail simulate SCENARIO`")
    if ocs_delay is not None:
        result = replace(result, fabric=replace(result.fabric, ocs_delay=_seconds(ocs_delay, "ocs_delay")))
    if mode is not None:
        result = replace(result, policy=replace(result.policy, mode=Mode.parse(mode, field="mode")))
    return result


def simulate(scenario: ScenarioLike = None, *, ocs_delay=None, mode: str | None = None, ablation: bool = True):
    """Electrical against photonic rails for one training job (``lightrail simulate``): a
    :class:`lightrail.studies.rails.RailsComparison`. ``ablation=False`` leaves out the six-policy ablation
    (its ``ablation`` is empty), a fraction of the time."""
    from lightrail.studies.rails import compare_rails

    return compare_rails(built(scenario, ocs_delay=ocs_delay, mode=mode), ablation=ablation)


def sweep(scenario: ScenarioLike = None, *, ocs_delays: Sequence = OCS_DELAYS, modes: Sequence[str] | None = None):
    """Overhead against the OCS delay, lightrail's policy and the published Opus in each mode (``lightrail
    sweep``): a :class:`lightrail.studies.rails.DelaySweep`."""
    from lightrail.defaults import Mode
    from lightrail.studies.rails import delay_sweep

    delays = [_seconds(d, "ocs_delays") for d in ocs_delays]
    if not delays:
        raise ScenarioError("no delays given", field="ocs_delays", fix="give at least one, e.g. ['10ms']")
    chosen = tuple(Mode.parse(m, field="modes") for m in modes) if modes else (Mode.ON_DEMAND, Mode.PROVISIONED)
    return delay_sweep(built(scenario, runs=len(delays) * 2 * len(chosen)), delays, modes=chosen)


def collective(op: str = "allreduce", algo: str = "ring", *, ranks: int = 64, size="1GiB", topology: str = "switch",
               bandwidth=NIC_BANDWIDTH, latency=HOP_LATENCY, alpha=ALPHA, gpus_per_server: int = 8,
               nvlink_bandwidth=NVLINK_BANDWIDTH, **params):
    """One collective algorithm generated, verified and timed on a static topology (``lightrail collective``): a
    :class:`lightrail.studies.collective.CollectiveResult`. ``params`` are the algorithm's (``root``,
    ``pipeline``)."""
    from lightrail.collectives import get
    from lightrail.fabric.builders import build_topology
    from lightrail.studies.collective import evaluate

    algorithm = get(op, algo)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ScenarioError(f"ranks={ranks!r} must be an integer of at least 2", field="ranks")
    fabric = build_topology(topology, ranks, bandwidth=_rate(bandwidth, "bandwidth"),
                            latency=_seconds(latency, "latency"), gpus_per_server=gpus_per_server,
                            nvlink_bandwidth=_rate(nvlink_bandwidth, "nvlink_bandwidth"))
    return evaluate(algorithm.kind, algo, ranks, _bytes(size, "size"), fabric, alpha=_seconds(alpha, "alpha"),
                    gpus_per_server=gpus_per_server, **params)


def calibrate(log: str | Path, *, ranks: int = 8, **options):
    """NCCL's cost model fitted to an nccl-tests log (``lightrail calibrate nccl-tests``): the calibration the CLI
    writes as ``calibration.json`` (``options``: ``op``, ``topology``, ``algo``, ``gpu``, ``arch``, ``nvls``,
    ``collnet``, ``model="engine"``, ... as the CLI's flags, with the same defaults)."""
    from lightrail.cli.calibrate import fit_log

    return fit_log(Path(log), ranks=ranks, **options)
