"""What the train-demo's measured overhead holds besides the photonic fabric: prints JSON.

- ``wrapper_overhead_s``: the lightrail process group with no controller at all (no circuit, no request) against
  plain gloo, the two replicas alternating in the same processes as train-demo runs them: the cost of the
  Python ``ProcessGroup`` wrapper on every op.
- ``controller_cpu_s_per_iteration``: CPU time the controller process used per lightrail iteration of a
  train-demo run (``/proc/<pid>/stat``, training only: its start-up left out), taken from the cores the ranks
  compute on.

Usage: ``.venv/bin/python benchmarks/bench_train_demo_costs.py [--steps 20] [--ocs-delay-ms 10]`` (Linux).
"""

from __future__ import annotations

import argparse
import functools
import json
import os


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wrapper_overhead(steps: int) -> dict:
    from lightrail.runtime import torch_backend
    from lightrail.studies.train_demo import DemoConfig, run_demo
    from lightrail.workload.parallel import Layout

    config = DemoConfig(steps=steps)
    layout = Layout.from_degrees(config.world, tp=config.tp, pp=config.pp, dp=config.dp, gpus_per_server=config.tp)
    init = functools.partial(torch_backend.setup, torch_backend.BackendConfig(layout=layout))  # no controller
    run = run_demo(config, backend="lightrail", init=init, baseline="gloo", block=5)
    return {"gloo_iteration_s": run.baseline.median_iteration_s, "wrapper_iteration_s": run.main.median_iteration_s,
            "wrapper_overhead_s": run.main.median_iteration_s - run.baseline.median_iteration_s}


def controller_cpu(steps: int, delay_s: float) -> dict:
    import lightrail.studies.train_demo.measure as demo
    from lightrail.studies.train_demo import DemoConfig

    seen: dict[str, float] = {}
    start, register, kill = demo.start_controller, demo.register_job, demo.os.kill

    def started(*args, **kwargs):
        proc, info = start(*args, **kwargs)
        seen["pid"] = proc.pid
        return proc, info

    def registered(*args, **kwargs):  # training starts next: the controller's start-up CPU is behind it
        seen["before"] = _cpu_s(int(seen["pid"]))
        return register(*args, **kwargs)

    def stopped(pid, sig):
        if pid == seen.get("pid"):
            seen["after"] = _cpu_s(pid)
        return kill(pid, sig)

    demo.start_controller, demo.register_job, demo.os.kill = started, registered, stopped
    try:
        result = demo.run_photonic_demo(DemoConfig(steps=steps), ocs_delay=delay_s)
    finally:
        demo.start_controller, demo.register_job, demo.os.kill = start, register, kill
    return {"controller_cpu_s_per_iteration": (seen["after"] - seen["before"]) / steps,
            "overhead_s": result.overhead_s, "predicted_overhead_s": result.predicted_overhead_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ocs-delay-ms", type=float, default=10.0)
    args = parser.parse_args()
    print(json.dumps({"steps": args.steps, **wrapper_overhead(args.steps),
                      **controller_cpu(args.steps, args.ocs_delay_ms / 1e3)}, indent=2))


if __name__ == "__main__":
    main()
