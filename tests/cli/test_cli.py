"""The command line end to end: outputs agree with the model, bad input exits 2 with no traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.collectives import algorithms

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_help_lists_the_verbs():
    result = run("--help")
    assert result.exit_code == 0
    for verb in ("collective", "algorithms", "collective-sweep", "simulate", "sweep", "check", "cost"):
        assert verb in result.output


def test_collective_json_matches_the_closed_form():
    # ring AllReduce on a non-blocking switch: 2(n-1)(alpha + 2L) + 2(n-1)/n * N/B (two links per path)
    n, size, bw, lat, alpha = 64, 2**30, 50e9, 1e-6, 3e-6
    result = run("collective", "--op", "allreduce", "--algo", "ring", "--ranks", str(n), "--size", "1GiB",
                 "--topology", "switch", "--bandwidth", "400Gbps", "--latency", "1us", "--alpha", "3us", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    expected = 2 * (n - 1) * (alpha + 2 * lat) + 2 * (n - 1) / n * size / bw
    assert out["time_s"] == pytest.approx(expected, rel=1e-12)
    assert out["steps"] == 2 * (n - 1)
    assert out["verified"] is True
    assert out["algbw_Bps"] == pytest.approx(size / expected)
    assert out["busbw_Bps"] == pytest.approx(size / expected * 2 * (n - 1) / n)


def test_collective_json_keys_are_stable():
    out = json.loads(run("collective", "--ranks", "8", "--json").output)
    assert {"time_s", "steps", "algbw_Bps", "busbw_Bps", "verified"} <= set(out)


@pytest.mark.parametrize("topology", ["switch", "ring", "torus2d", "torus3d", "fat-tree", "rails"])
def test_every_topology_runs(topology):
    result = run("collective", "--op", "allgather", "--algo", "bruck", "--ranks", "64", "--size", "64MiB",
                 "--topology", topology, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["time_s"] > 0 and out["steps"] == 6


def test_table_output_names_the_proof():
    result = run("collective", "--ranks", "16", "--topology", "rails")
    assert result.exit_code == 0
    assert "verified" in result.output and "yes" in result.output


def test_algorithms_lists_the_registry():
    out = json.loads(run("algorithms", "--json").output)
    listed = {(a["op"], a["algorithm"]) for a in out["algorithms"]}
    assert listed == {(str(a.kind), a.name) for a in algorithms()}
    assert ("allreduce", "ring") in listed and ("alltoall", "pairwise") in listed
    only = json.loads(run("algorithms", "--op", "reducescatter", "--json").output)
    assert {a["op"] for a in only["algorithms"]} == {"reducescatter"}


@pytest.mark.parametrize(("args", "flag"), [
    (["--algo", "nope"], "--algo"),
    (["--op", "scatter"], "--op"),
    (["--topology", "mesh"], "--topology"),
    (["--ranks", "1"], "--ranks"),
    (["--size", "100"], "--size"),
    (["--size", "400Gbps"], "--size"),
    (["--bandwidth", "50GB"], "--bandwidth"),
    (["--latency", "5"], "--latency"),
    (["--alpha", "3 parsecs"], "--alpha"),
    (["--topology", "torus2d", "--ranks", "64", "--shape", "4x4"], "--shape"),
    (["--topology", "torus3d", "--ranks", "64", "--shape", "4by4"], "--shape"),
    (["--topology", "rails", "--ranks", "12"], "--ranks"),
    (["--topology", "fat-tree", "--oversubscription", "0.5"], "--oversubscription"),
    (["--op", "broadcast", "--algo", "binomial-tree", "--root", "99", "--ranks", "8"], "--root"),
])
def test_bad_input_exits_2_naming_the_option(args, flag):
    result = run("collective", *args)
    assert result.exit_code == 2
    assert flag in result.output
    assert "Traceback" not in result.output


def test_sweep_writes_table_json_and_plot(tmp_path):
    out_dir = tmp_path / "sweep"
    result = run("collective-sweep", "--op", "allreduce", "--ranks", "16", "--topology", "switch",
                 "--sizes", "1KiB..1MiB", "--out", str(out_dir), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    names = {a.name for a in algorithms("allreduce")}
    assert {r["algorithm"] for r in data["rows"]} == names
    assert len(data["rows"]) == len(names) * 11  # 1KiB .. 1MiB in powers of two
    for best in data["best"]:
        times = [r["time_s"] for r in data["rows"] if r["size_bytes"] == best["size_bytes"]]
        assert best["time_s"] == min(times)
    assert json.loads((out_dir / "sweep.json").read_text()) == data
    assert (out_dir / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = (out_dir / "sweep.csv").read_text().splitlines()
    assert len(lines) == 1 + 11 and lines[0].startswith("size_bytes,")


def test_sweep_on_bad_input_writes_nothing(tmp_path):
    out_dir = tmp_path / "sweep"
    for args in (["--sizes", "4GiB..1KiB"], ["--sizes", "lots"], ["--topology", "mesh"], ["--algo", "nope"]):
        result = run("collective-sweep", "--ranks", "8", "--out", str(out_dir), *args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
    assert not out_dir.exists()


def test_sweep_restricted_to_chosen_algorithms(tmp_path):
    result = run("collective-sweep", "--op", "alltoall", "--ranks", "8", "--sizes", "1MiB,1GiB",
                 "--algo", "pairwise", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    assert [r["size_bytes"] for r in rows] == [2**20, 2**30]
    assert {r["algorithm"] for r in rows} == {"pairwise"}
