"""Export to ASTRA-sim, then import the traces back: op counts, sizes and groups round-trip."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("chakra")

from lightrail.cli import app  # noqa: E402
from lightrail.scenario import parse_scenario  # noqa: E402
from lightrail.workload.chakra import read_chakra  # noqa: E402
from lightrail.workload.program import CollectiveOp, ComputeOp, RecvOp, SendOp, build_program  # noqa: E402

SCENARIO = {"name": "tiny", "model": "debug", "cluster": {"gpus": 16, "gpus_per_server": 4, "gpu": "h100"},
            "parallel": {"tp": 2, "pp": 2, "dp": 4}, "job": {"micro_batches": 4}}


def expected(program):
    """Per rank, what the traces must hold: counts by op and collective bytes by kind."""
    lay = program.job.layout
    out = []
    for rank in range(lay.world):
        counts, nbytes = Counter(), Counter()
        for op in program.ops_for_rank(rank):
            match op:
                case ComputeOp():
                    counts["compute"] += 1
                case CollectiveOp():
                    counts["collective"] += op.count
                    nbytes[op.kind.value] += op.nbytes * op.count
                case SendOp():
                    counts["send"] += 1
                    nbytes["send"] += op.nbytes
                case RecvOp():
                    counts["recv"] += 1
        out.append((counts, nbytes))
    return out


def test_export_then_import_round_trips(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "astra"
    runner = CliRunner()
    result = runner.invoke(app, ["export", "astra-sim", str(path), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    exported = json.loads(result.output)
    network = yaml.safe_load((out / "network.yml").read_text())
    # ASTRA-sim's GB/s is 2^30 bytes/s: 450e9 and 50e9 bytes/s
    assert network == {"topology": ["Switch", "Switch"], "npus_count": [4, 4],
                       "bandwidth": [round(450e9 / 2**30, 6), round(50e9 / 2**30, 6)], "latency": [1000.0, 1000.0]}
    system = json.loads((out / "system.json").read_text())
    assert system["all-reduce-implementation"] == ["ring", "ring"] and system["endpoint-delay"] == 3000

    built = parse_scenario(SCENARIO).build()
    program = build_program(built.job)
    trace = read_chakra(out)
    assert trace.world == 16
    for rank, (counts, nbytes) in enumerate(expected(program)):
        nodes = trace.ranks[rank]
        assert Counter(n.op for n in nodes) == counts
        got = Counter()
        for n in nodes:
            if n.op == "collective":
                got[n.kind.value] += n.nbytes
            elif n.op == "send":
                got["send"] += n.nbytes
        assert got == pytest.approx(Counter({k: round(v) for k, v in nbytes.items()}), abs=len(nodes))
    # groups are the layout's: tp pairs of neighbours, dp groups across servers, and the 16 / (tp 2 x pp 2) = 4
    # model-parallel groups of Megatron's step (grad norm, train_step's reductions)
    sizes = Counter(len(g) for g in trace.groups.values())
    assert sizes == {2: 8, 4: 4 + 4}
    imported = runner.invoke(app, ["import", "chakra", str(out), "--json"])
    assert imported.exit_code == 0, imported.output
    assert json.loads(imported.output)["ops"] == exported["ops"]


def test_exported_traces_replay_like_the_program(tmp_path):
    """The exported job replayed on electrical rails takes as long as lightrail's own simulator says (up to
    the whole microseconds Chakra stores compute in)."""
    from lightrail.sim.iteration import simulate_iteration
    from lightrail.sim.replay import RailsCost, replay

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "job": {"micro_batches": 4, "dp_buckets": 1}}))
    out = tmp_path / "astra"
    assert CliRunner().invoke(app, ["export", "astra-sim", str(path), "--out", str(out)]).exit_code == 0
    built = parse_scenario({**SCENARIO, "job": {"micro_batches": 4, "dp_buckets": 1}}).build()
    from dataclasses import replace

    fabric = replace(built.fabric, kind="electrical")
    own = simulate_iteration(build_program(built.job), fabric).iteration_time_s
    trace = read_chakra(out)
    cost = RailsCost(trace.world, fabric, 4)
    replayed = replay(trace, cost.collective, cost.transfer).iteration_time_s
    ops = sum(len(n) for n in trace.ranks[:1])
    assert replayed == pytest.approx(own, abs=ops * 1e-6)
