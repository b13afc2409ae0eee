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
