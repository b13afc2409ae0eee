"""Examples are part of the product: each one runs and prints what its docstring promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def test_torchrun_recipe_runs_a_job_on_the_lightrail_backend_with_its_layout_from_the_environment(tmp_path):
    """The README's torchrun recipe, for real: a controller process, a job registered by the operator, four
    processes started by torchrun (2 servers of 2 GPUs, TP 2, DP 2) whose DP all-reduces cross the rails."""
    import json
    import os
    import shutil

    import pytest

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this Python (pip install torch)")
    from lightrail.studies.photonic_demo import register_job, start_controller

    proc, ready = start_controller(tmp_path / "controller.db", rails=2, ports=4, delay_s=0.001)
    try:
        token = register_job(ready["admin_port"], ready["operator_token"], "tr", 4)
        env = {**os.environ, "LIGHTRAIL_CONTROLLER": f"127.0.0.1:{ready['port']}", "LIGHTRAIL_JOB": "tr",
               "LIGHTRAIL_TOKEN": token, "LIGHTRAIL_TP": "2", "LIGHTRAIL_GPUS_PER_SERVER": "2",
               "OMP_NUM_THREADS": "1"}
        result = subprocess.run([torchrun, "--standalone", "--nnodes", "1", "--nproc-per-node", "4",
                                 "--local-ranks-filter", "0", str(EXAMPLES / "torchrun_lightrail.py")],
                                capture_output=True, text=True, timeout=300, env=env)
    finally:
        proc.terminate()
        proc.wait(30)
    assert result.returncode == 0, result.stderr[-2000:]
    line = json.loads([x for x in result.stdout.splitlines() if x.startswith("{")][-1])
    assert line["world"] == 4 and line["dp_group"] == [0, 2] and line["sum"] == line["expected"] == 2.0
    assert line["stats"]["requests"] > 0  # the DP ring crosses the rails: its circuits went through the controller
