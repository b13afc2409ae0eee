"""Reconfiguration-aware collectives: the exact plan against brute force, the limits the issue names,
valid port configurations, algorithm choice, the study and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.collectives import algorithms, generate
from lightrail.control.pccl import Planner, choose, edge_colouring
from lightrail.fabric.builders import ring
from lightrail.fabric.circuits import is_partial_permutation
from lightrail.fabric.params import ReconfigurableFabric
from lightrail.studies.collective_study import StudyGrid, collective_study
from lightrail.timing import Engine

SIZES = [2.0**10, 2.0**20, 2.0**30]
DELAYS = [0.0, 1e-6, 1e-5, 1e-4, 1e-2]


def small_cases():
    for algo in algorithms():
        if algo.kind.value in ("broadcast", "reduce"):
            continue
        for n in (4, 5, 8):
            for ports in (1, 2):
                yield pytest.param(algo.kind.value, algo.name, n, ports, id=f"{algo.kind}-{algo.name}-{n}-p{ports}")


@pytest.mark.parametrize(("op", "name", "n", "ports"), list(small_cases()))
def test_dynamic_programme_equals_brute_force(op, name, n, ports):
    schedule = generate(op, name, n)
    planner = Planner(schedule, ReconfigurableFabric(n=n, ports=ports))
    choices = math.prod(1 + len(c) for c in planner.candidates)
    if choices > 60_000:
        pytest.skip(f"{choices} choice sequences")
    values, _ = planner.totals(SIZES, DELAYS)
    for di, d in enumerate(DELAYS):
        for si, size in enumerate(SIZES):
            brute = planner.plan_brute_force(size, d)
            assert values[di, si] == pytest.approx(brute, rel=1e-12)
            plan = planner.plan(size, d)
            assert plan.total_s == pytest.approx(brute, rel=1e-12)  # the replayed plan achieves it
            assert planner.plan_threshold(size, d).total_s >= brute * (1 - 1e-12)


@pytest.mark.parametrize("name", ["ring", "recursive-doubling", "halving-doubling", "double-binary-tree", "direct"])
@pytest.mark.parametrize("n", [8, 12, 16])
def test_zero_delay_and_enough_ports_reach_the_contention_free_time_of_every_step(name, n):
    schedule = generate("allreduce", name, n)
    patterns = [np.unique(st.src.astype(np.int64) * n + st.dst, return_counts=True) for st in schedule.steps]
    degree = max(max(np.bincount(c // n).max(), np.bincount(c % n).max()) for c, _ in patterns)
    fabric = ReconfigurableFabric(n=n, ports=degree, latency=1e-6, propagation=2e-7, alpha=3e-6)
    size = 2.0**24
    plan = Planner(schedule, fabric).plan(size, 0.0)
    cb = size / schedule.collective.chunks_per_buffer
    expected = [fabric.alpha + fabric.latency + fabric.propagation + counts.max() * cb / fabric.bandwidth
                for _, counts in patterns]
    assert plan.step_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", ["ring", "recursive-doubling", "halving-doubling", "double-binary-tree"])
def test_infinite_delay_never_reconfigures_and_equals_the_static_ring(name):
    n, size = 16, 2.0**22
    schedule = generate("allreduce", name, n)
    fabric = ReconfigurableFabric(n=n, ports=2, latency=1e-6, alpha=3e-6)
    plan = Planner(schedule, fabric).plan(size, math.inf)
    assert plan.reconfigurations == 0
    static = Engine(ring(n, latency=1e-6), alpha=3e-6).time(schedule, size).time_s
    assert plan.total_s == pytest.approx(static, rel=1e-12)


@pytest.mark.parametrize("name", ["recursive-doubling", "halving-doubling", "double-binary-tree", "bruck"])
@pytest.mark.parametrize("ports", [1, 2, 3])
def test_every_configuration_splits_into_one_permutation_per_port(name, ports):
    op = "allgather" if name == "bruck" else "allreduce"
    n = 16
    planner = Planner(generate(op, name, n), ReconfigurableFabric(n=n, ports=ports))
    planner.plan(2.0**20, 0.0)
    for codes in planner.configs:
        perm = edge_colouring(codes, n, ports)
        assert perm.shape == (ports, n)
        assert all(is_partial_permutation(row) for row in perm)
        rebuilt = np.sort(np.concatenate([np.flatnonzero(row >= 0) * n + row[row >= 0] for row in perm]))
        np.testing.assert_array_equal(rebuilt, np.sort(codes))


def test_edge_colouring_refuses_too_many_circuits():
    from lightrail.errors import InfeasibleError

    star = np.array([0 * 4 + 1, 0 * 4 + 2, 0 * 4 + 3])
    with pytest.raises(InfeasibleError, match="ports"):
        edge_colouring(star, 4, 2)


def test_faster_reconfiguration_never_hurts_and_plans_use_fewer_switches_as_delay_grows():
    planner = Planner(generate("allreduce", "halving-doubling", 32), ReconfigurableFabric(n=32, ports=2))
    values, counts = planner.totals(SIZES, DELAYS)
    assert np.all(np.diff(values, axis=0) >= -1e-15)
    assert np.all(np.diff(counts, axis=0) <= 0)


def test_choose_picks_the_fastest_planned_algorithm_and_explains():
    fabric = ReconfigurableFabric(n=16, ports=2, ocs_delay=1e-6)
    choice = choose("allreduce", 2.0**20, fabric)
    times = [t for _, t, _ in choice.ranking]
    assert times == sorted(times) and choice.plan.total_s == times[0]
    for algo in algorithms("allreduce"):
        assert Planner(algo(16), fabric).plan(2.0**20).total_s >= times[0] * (1 - 1e-12)
    assert choice.algorithm in choice.explain() and "next best" in choice.explain()


def test_study_cells_and_the_three_findings():
    grid = StudyGrid(ops=("allreduce",), ranks=(8, 64), sizes=(2.0**10, 2.0**20, 2.0**30),
                     delays=(0.0, 1e-5, 1e-2))
    result = collective_study(grid).to_dict()
    assert len(result["cells"]) == 2 * 3 * 3
    for cell in result["cells"]:
        best = cell["best_reconfigurable"]["time_s"]
        assert cell["speedup_vs_static_ring"] == pytest.approx(cell["best_static"]["ring"]["time_s"] / best)
        # the reconfigurable fabric starts from the static ring's circuits, so it can only match or win
        assert cell["speedup_vs_static_ring"] >= 1 - 1e-9
    findings = {(f["finding"][:12], f["ranks"]): f for f in result["findings"]}
    ring_vs_rd = findings[("static ring:", 64)]
    assert ring_vs_rd["ring_wins_from_bytes"] is not None  # congestion makes Ring win at large sizes
    short = findings[("short-circui", 64)]
    fast, slow = short["wins_up_to_size_by_delay"]["0"], short["wins_up_to_size_by_delay"]["0.01"]
    assert fast > short["static_wins_up_to_size"]  # short-circuiting extends where RD beats Ring
    assert slow is None or slow <= fast
    stops = findings[("where reconf", 64)]["largest_paying_delay_by_size"]
    assert any(v is None or v < 1e-2 for v in stops.values())  # 10 ms reconfiguration does not pay


def test_study_and_reconfigurable_collective_from_the_cli(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["study", "collectives", "--ops", "allreduce,alltoall", "--ranks", "8",
                                 "--sizes", "1KiB,1MiB", "--ocs-delays", "0,10us", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data["cells"]) == 2 * 2 * 2
    assert (tmp_path / "heatmap-allreduce.png").read_bytes()[:4] == b"\x89PNG"
    assert len((tmp_path / "summary.csv").read_text().splitlines()) == 1 + 8
    one = runner.invoke(app, ["collective", "--algo", "recursive-doubling", "--ranks", "16", "--size", "1MiB",
                              "--reconfigurable", "--ports", "2", "--ocs-delay", "1us", "--json"])
    assert one.exit_code == 0, one.output
    out = json.loads(one.output)
    assert out["reconfigurations"] == sum(step["reconfigure"] for step in out["plan"]) > 0
    assert out["time_s"] < out["static_time_s"] and out["verified"]
    for bad, flag in ((["--base", "star"], "--base"), (["--ports", "0"], "--ports"),
                      (["--ocs-delay", "fast"], "--ocs-delay")):
        r = runner.invoke(app, ["collective", "--reconfigurable", *bad])
        assert r.exit_code == 2 and flag in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["study", "collectives", "--ranks", "1", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists()


COMPRESSED = [("allreduce", "ring"), ("reducescatter", "ring"), ("allgather", "ring"), ("allgather", "bruck"),
              ("reducescatter", "bruck"), ("allreduce", "halving-doubling"), ("allreduce", "recursive-doubling")]


@pytest.mark.parametrize(("op", "name"), COMPRESSED)
@pytest.mark.parametrize(("n", "ports"), [(4, 1), (8, 2), (16, 2), (7, 1)])
def test_the_planner_plans_a_compressed_schedule_exactly_as_the_explicit_one(op, name, n, ports):
    from lightrail.collectives.compressed import compressed_form

    compressed = compressed_form(op, name, n)
    if compressed is None:  # a fold (n not a power of two): explicit only
        pytest.skip("no compressed form")
    fabric = ReconfigurableFabric(n=n, ports=ports, latency=1e-6, propagation=2e-7, alpha=3e-6)
    explicit, packed = Planner(generate(op, name, n), fabric), Planner(compressed, fabric)
    assert packed.pattern_id == explicit.pattern_id and packed.candidates == explicit.candidates
    for a, b in zip(packed.patterns + packed.weights, explicit.patterns + explicit.weights, strict=True):
        assert np.array_equal(a, b) and a.dtype == b.dtype
    assert [c.tobytes() for c in packed.configs] == [c.tobytes() for c in explicit.configs]
    want, got = explicit.totals(SIZES, DELAYS), packed.totals(SIZES, DELAYS)
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])
    for size in SIZES:
        p, q = packed.plan(size), explicit.plan(size)
        assert (p.total_s, p.step_config, p.reconfigure, p.step_s) == (q.total_s, q.step_config, q.reconfigure,
                                                                       q.step_s)


def test_a_compressed_ring_shares_one_traffic_array_for_all_its_steps():
    from lightrail.collectives.compressed import compressed_form

    planner = Planner(compressed_form("allreduce", "ring", 512), ReconfigurableFabric(n=512, ports=2))
    assert len(planner.patterns) == 2 * 511 and set(planner.pattern_id) == {0}
    assert all(p is planner.patterns[0] for p in planner.patterns)
