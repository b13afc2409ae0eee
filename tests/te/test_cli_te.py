"""``lightrail te run`` and ``lightrail study te`` end to end: the JSON contract, files, and bad input
exiting 2 with one line naming the flag."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.te.decentral import METRICS

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_the_cli_default_lambda_is_the_studies_one():
    from lightrail.cli.te import DEFAULT_LAMBDA as cli
    from lightrail.studies.te import DEFAULT_LAMBDA as library

    assert cli == library


def test_te_run_json_contract(tmp_path):
    result = run("te", "run", "--topology", "geant", "--slices", 5, "--lambda", 0.01, "--perturbation", 0.05,
                 "--matrices", 2, "--json", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    for controller in ("regularized", "unregularized"):
        assert set(METRICS) <= set(out[controller])
        for slicer in ("randomized", "contiguous", "optimal"):
            assert set(METRICS) <= set(out["slicers"][slicer][controller])
    assert out["regularized"] == out["slicers"]["randomized"]["regularized"]
    assert (out["topology"], out["slices"], out["lambda"], out["perturbation"]) == ("geant", 5, 0.01, 0.05)
    # every node in exactly one of 5 slices, for each slicer
    for slicing in out["slicings"].values():
        assert len(slicing) == 22 and set(slicing) == set(range(5))
    assert json.loads((tmp_path / "te-run.json").read_text()) == out
    assert (tmp_path / "te-run-cdf.png").stat().st_size > 10_000


def test_te_run_reads_a_traffic_file(tmp_path):
    from lightrail.te.inputs import load_topology
    from lightrail.te.traffic import gravity

    wan = load_topology("abilene")
    np.save(tmp_path / "tm.npy", 200 * gravity(wan, 2, seed=4))  # 200 Gbps in all
    result = run("te", "run", "--topology", "abilene", "--slices", 3, "--traffic", tmp_path / "tm.npy",
                 "--matrices", 5, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["load"] is None and len(out["rows"]) == 6
    assert 0 < out["unregularized"]["max_link_utilization"] < 5


def test_study_te_small_sweep(tmp_path):
    result = run("study", "te", "--topologies", "abilene", "--lambdas", "0.001,0.1", "--perturbations", "0.05",
                 "--slice-counts", "3,5", "--matrices", 2, "--json", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    # base point (5 slices, lambda 0.001), lambda 0.1, 3 slices: 3 runs x 3 slicers x 2 controllers
    assert len(rows) == 18
    assert {(r["slices"], r["lambda"]) for r in rows} == {(5, 0.001), (5, 0.1), (3, 0.001)}
    assert all(set(METRICS) <= set(r) for r in rows)
    assert {p.name for p in tmp_path.iterdir()} >= {"study-te.json", "study-te.csv", "study-te-cdf.png",
                                                    "study-te-sweep.png", "study-te-blast.png"}


@pytest.mark.parametrize("args, flag", [
    (("te", "run", "--slices", 0), "--slices"),
    (("te", "run", "--topology", "atlantis"), "--topology"),
    (("te", "run", "--lambda", -0.5), "--lambda"),
    (("te", "run", "--perturbation", 1.5), "--perturbation"),
    (("te", "run", "--objective", "max-fun"), "--objective"),
    (("te", "run", "--paths", 0), "--paths"),
    (("te", "run", "--slicers", "geo"), "--slicers"),
    (("te", "run", "--matrices", 0), "--matrices"),
    (("te", "run", "--load", 0), "--load"),
    (("te", "run", "--topology", "tatanld", "--slicers", "optimal"), "--slicer"),
    (("study", "te", "--lambdas", "a,b"), "--lambdas"),
    (("study", "te", "--slice-counts", "2.5"), "--slice-counts"),
])
def test_bad_input_exits_2_naming_the_flag(args, flag, tmp_path):
    result = run(*args, "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # nothing half-written
