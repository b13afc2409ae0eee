"""End to end: train the demo job on plain gloo, then on emulated photonic rails through the
lightrail backend and a real controller process, and set the measurement beside the simulator's
prediction for the same job.

The controller gets one emulated OCS per rail (``gpus_per_server`` rails, one port per server);
servers hold ``gpus_per_server`` ranks (default: the TP degree, so TP stays inside a server, as on
an NVLink server, and DP / PP cross the rails).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime import torch_backend
from lightrail.runtime.train_demo import DemoConfig, run_demo
from lightrail.workload.parallel import Layout

__all__ = ["start_controller", "run_photonic_demo", "predicted_overhead"]


def start_controller(state: Path, *, rails: int, ports: int, delay_s: float, timeout: float = 30.0):
    """Start ``lightrail controller serve`` on free ports; returns (process, ready info)."""
    cmd = [sys.executable, "-m", "lightrail.cli", "controller", "serve", "--port", "0", "--admin-port", "0",
           "--state", str(state), "--rails", str(rails), "--ports", str(ports), "--delay", f"{delay_s}s"]
    log = open(state.with_suffix(".log"), "w")  # noqa: SIM115 (the process owns it until it exits)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout)
        raise InfeasibleError(f"the controller did not start (exit {proc.returncode})", field="controller",
                              fix=f"see {log.name}")
    return proc, json.loads(line)


def _metrics(admin_port: int) -> dict[str, float]:
    import httpx

    text = httpx.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(lightrail_[a-z_]+)(\{[^}]*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def predicted_overhead(config: DemoConfig, *, gpus_per_server: int, delay_s: float, mode: str) -> dict:
    """What ``lightrail simulate`` predicts for the same model, layout, micro-batches and OCS delay
    (on its default GPU: compute there is far faster than on these CPUs, so compare the exposed
    reconfiguration time and the reconfiguration count, not the iteration times)."""
    from lightrail.scenario import parse_scenario
    from lightrail.sim.photonic_rails import compare_rails

    scenario = parse_scenario({
        "name": "train-demo",
        "model": {"preset": "debug", "overrides": {"layers": config.layers, "hidden": config.d_model,
                                                   "ffn": 4 * config.d_model, "heads": config.heads,
                                                   "kv_heads": config.heads, "vocab": config.vocab,
                                                   "seq_len": config.seq}},
        "cluster": {"gpus": config.world, "gpus_per_server": gpus_per_server},
        "parallel": {"tp": config.tp, "pp": config.pp, "dp": config.dp},
        "job": {"micro_batches": config.microbatches, "micro_batch_size": config.micro_batch, "dp_buckets": 1,
                "grad_bytes": 4},
        # the backend reconfigures per group (partial, skip-if-present), one rail per direction is not split
        "ocs": {"reconfig_delay": f"{delay_s}s", "mode": mode, "partial": True, "skip_present": True,
                "split_pp": False, "defer_dp": True},
    })
    result = compare_rails(scenario.build())
    photonic, electrical = float(result["iteration_time_s"]), float(result["baseline_iteration_time_s"])
    return {"iteration_s": photonic, "electrical_iteration_s": electrical, "overhead_s": photonic - electrical,
            "reconfigurations_per_rail_per_iteration": float(result["reconfigurations_per_iteration"])}


def run_photonic_demo(config: DemoConfig, *, ocs_delay_s: float, mode: str = "provisioned",
                      gpus_per_server: int | None = None, workdir: Path | None = None,
                      progress=lambda what: None) -> dict:
    """Train on gloo, then on the lightrail backend with a controller at ``ocs_delay_s``; compare."""
    g = gpus_per_server or config.tp
    if g < 1 or config.world % g:
        raise ScenarioError(f"{config.world} ranks do not fill servers of {g}", field="--gpus-per-server",
                            fix=f"use a divisor of {config.world}")
    if mode not in ("on_demand", "provisioned"):
        raise ScenarioError(f"unknown mode {mode!r}", field="--mode", fix="on_demand or provisioned")
    layout = Layout.from_degrees(config.world, tp=config.tp, pp=config.pp, dp=config.dp, gpus_per_server=g)
    progress("training on gloo")
    plain = run_demo(config, backend="gloo")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(workdir or tmp) / "controller.db"
        proc, info = start_controller(state, rails=g, ports=layout.servers, delay_s=ocs_delay_s)
        try:
            progress("training on emulated photonic rails")
            init = functools.partial(torch_backend.setup, controller=f"127.0.0.1:{info['port']}", job="train-demo",
                                     layout=layout, mode=mode)
            photonic = run_demo(config, backend="lightrail", init=init)
            metrics = _metrics(info["admin_port"])
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)
    progress("simulating the same job")
    predicted = predicted_overhead(config, gpus_per_server=g, delay_s=ocs_delay_s, mode=mode)
    reconfigs = sum(v for k, v in metrics.items() if k.startswith("lightrail_reconfigurations_total"))
    releases = [s for r in photonic["ranks"] for s in r.get("controller", {}).get("request_s", [])]
    releases.sort()
    identical = plain["loss_bits"] == photonic["loss_bits"] and plain["losses_consistent"] \
        and photonic["losses_consistent"]
    measured_overhead = photonic["median_iteration_s"] - plain["median_iteration_s"]
    return {
        "ranks": config.world, "tp": config.tp, "pp": config.pp, "dp": config.dp, "steps": config.steps,
        "gpus_per_server": g, "rails": g, "ocs_delay_s": ocs_delay_s, "mode": mode,
        "gloo_iteration_s": plain["median_iteration_s"],
        "lightrail_iteration_s": photonic["median_iteration_s"],
        "overhead_s": measured_overhead,
        "overhead": measured_overhead / plain["median_iteration_s"],
        "reconfigurations_per_iteration": reconfigs / config.steps,  # all rails
        "reconfigurations_per_rail_per_iteration": reconfigs / config.steps / g,
        "request_latency_p50_s": releases[len(releases) // 2] if releases else None,
        "request_latency_p99_s": releases[min(len(releases) - 1, int(0.99 * len(releases)))] if releases else None,
        "acquire_wait_p99_s": metrics.get('lightrail_acquire_latency_seconds{quantile="0.99"}'),
        "unsafe_reconfigurations": metrics.get("lightrail_unsafe_reconfigurations_total", 0.0),
        "losses_identical": bool(identical),
        "losses": plain["losses"], "lightrail_losses": photonic["losses"],
        "gloo_iteration_series_s": plain["iteration_s"], "lightrail_iteration_series_s": photonic["iteration_s"],
        "predicted": predicted,
        "controller_startup_s": info.get("startup_s"),
    }
