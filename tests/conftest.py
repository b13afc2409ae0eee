"""Suite-wide: the tests that run many processes at once (gloo ranks, services, Ray) share one xdist group, so under
``make test`` (``pytest -n 2 --dist loadgroup``) they run one at a time on one worker while the other worker takes the
rest; each keeps the 2 cores' load it was written for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:  # no test asserts a wall-clock time, hypothesis's included: its deadline and too-slow check are timings
    from hypothesis import HealthCheck, settings

    settings.register_profile("lightrail", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("lightrail")
except ImportError:
    pass

ROOT = Path(__file__).resolve().parent
PROCESSES = ("runtime", "fl", "moe/test_moe_layer.py", "studies/test_train_demo.py", "studies/test_stragglar_run.py",
             "studies/test_sweep.py", "te/test_service.py", "test_examples.py", "cli/test_hostile_cli.py")
"""Test folders and files (under tests/) whose tests start several processes."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            where = Path(item.path).resolve().relative_to(ROOT).as_posix()
        except ValueError:  # the doctests under src/
            continue
        if any(where == p or where.startswith(p.rstrip("/") + "/") for p in PROCESSES):
            item.add_marker(pytest.mark.xdist_group("processes"))


@pytest.fixture(autouse=True)
def _yield_cpu_to_the_process_tests(request):
    """Under xdist, a test outside the processes group runs at a low CPU priority (nice 10), it and what it starts:
    the other worker's multi-process test (8 ranks and a controller on 2 cores, timed against heartbeats) keeps the
    cores it was written for. Only as root, which may raise the priority back after the test."""
    if (not hasattr(request.config, "workerinput") or request.node.get_closest_marker("xdist_group") is not None
            or not hasattr(os, "setpriority") or os.geteuid() != 0):
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, 10)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
