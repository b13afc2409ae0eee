"""Examples are part of the product: each one runs and prints what its docstring promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_custom_fabric_example_runs_and_circuits_help_recursive_doubling():
    result = subprocess.run([sys.executable, str(EXAMPLES / "custom_fabric.py")], capture_output=True, text=True,
                            check=True, timeout=120)
    times = {}
    for line in result.stdout.splitlines():
        m = re.match(r"\s*(\S+) \[(\S+)\] on (.+) ([\d.]+)(ms|us|s)$", line)
        assert m, line
        scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m[5]]
        times[(m[1], m[3].strip())] = float(m[4]) * scale
    assert len(times) == 9
    # direct xor circuits remove recursive doubling's congestion and dilation on the ring of circuits
    assert times[("recursive-doubling", "xor circuits (4 ports)")] < times[("recursive-doubling",
                                                                            "bidirectional ring circuits")]
    # and match the non-blocking switch (no contention on either)
    assert times[("recursive-doubling", "xor circuits (4 ports)")] <= times[("recursive-doubling",
                                                                             "electrical switch")] * 1.0000001


@pytest.mark.slow  # torchrun and four torch processes: ~20 s on 2 shared cores
def test_torchrun_recipe_runs_a_job_whose_ranks_cross_rails_with_the_losses_of_plain_gloo(tmp_path):
    """The README's torchrun recipe, for real, with no layout given: a controller process, a job registered by
    the operator, four processes on one machine started by torchrun. The recipe's default puts them in emulated
    servers of 2 (TP 2 x DP 2), so the DP all-reduces cross the rails and go through the controller; trained
    again on plain gloo groups (``--compare-gloo``), the losses are bit-identical."""
    import json
    import os
    import shutil

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python (pip install torch)")
    from lightrail.runtime.controller.process import register_job, start_controller

    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTRAIL_")} | {"OMP_NUM_THREADS": "1"}
    proc, ready = start_controller(tmp_path / "controller.db", rails=2, ports=4, ocs_delay=0.001)
    try:
        token = register_job(ready["admin_port"], ready["operator_token"], "tr", 4)
        env |= {"LIGHTRAIL_CONTROLLER": f"127.0.0.1:{ready['port']}", "LIGHTRAIL_JOB": "tr", "LIGHTRAIL_TOKEN": token}
        done = subprocess.run([torchrun, "--standalone", "--nnodes", "1", "--nproc-per-node", "4",
                               "--local-ranks-filter", "0", str(EXAMPLES / "torchrun_lightrail.py"),
                               "--compare-gloo"], capture_output=True, text=True, timeout=300, env=env)
    finally:
        proc.terminate()
        proc.wait(30)
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])
    assert line["layout"] == "TP2 x DP2" and line["servers"] == 2 and line["dp_group"] == [0, 2]
    assert line["requests"] > 0 and line["stats"]["ops"] > 0  # the DP ring crossed the rails
    assert len(line["losses"]) == 5 and line["losses"] == line["gloo_losses"] and line["identical"]  # bit-identical
    assert line["losses"][-1] < line["losses"][0]  # it trains
