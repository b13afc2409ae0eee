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


def test_algorithms_mark_one_auto_per_kind_the_one_programs_resolve():
    from lightrail.collectives import resolve

    rows = json.loads(run("algorithms", "--json").output)["algorithms"]
    for op in {r["op"] for r in rows}:
        auto = [r["algorithm"] for r in rows if r["op"] == op and r["auto"]]
        assert auto == [resolve(op, "auto", 8).name], op
    assert "ring (auto)" in run("algorithms", "--op", "allreduce").output


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


# ---- renamed flags: --ocs-delay everywhere, the old spellings hidden but still read ---------------------------

STUDY = ["study", "collectives", "--ops", "allreduce", "--ranks", "8", "--sizes", "1KiB,1MiB", "--json"]
RECONFIGURABLE = ["collective", "--algo", "recursive-doubling", "--ranks", "16", "--size", "1MiB", "--reconfigurable",
                  "--json"]
RENAMED = {  # verb: (its arguments given an output folder, old flag, new flag, a value)
    "collective": (lambda out: RECONFIGURABLE, "--reconfig-delay", "--ocs-delay", "1us"),
    "study collectives": (lambda out: [*STUDY, "--out", str(out)], "--delays", "--ocs-delays", "0,10us"),
}


@pytest.mark.parametrize("verb", sorted(RENAMED))
def test_old_flag_spelling_still_works_and_says_so(verb, tmp_path):
    command, old, new, value = RENAMED[verb]
    before = runner.invoke(app, [*command(tmp_path / "old"), old, value])
    after = runner.invoke(app, [*command(tmp_path / "new"), new, value])
    assert before.exit_code == 0 and after.exit_code == 0, before.output + after.output
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert f"note: {old} is now {new}" in before.stderr and "note:" not in after.stderr
    help_text = run(*verb.split(), "--help").output
    assert new in help_text and old not in help_text


@pytest.mark.parametrize("verb", sorted(RENAMED))
def test_both_spellings_at_once_exit_2_and_write_nothing(verb, tmp_path):
    command, old, new, value = RENAMED[verb]
    result = runner.invoke(app, [*command(tmp_path / "out"), old, value, new, value])
    assert result.exit_code == 2 and f"error: {new}" in result.output and "given twice" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_the_collective_ocs_delay_defaults_to_10us():
    out = json.loads(run(*RECONFIGURABLE).stdout)
    assert out["reconfig_delay_s"] == pytest.approx(10e-6)


# ---- the shared parsers: bad input exits 2 naming the flag, and nothing is written ------------------------------

@pytest.mark.parametrize(("args", "flag"), [
    (["--ranks", "1"], "--ranks"),
    (["--ranks", "x"], "--ranks"),
    (["--ranks", "1..4"], "--ranks"),
    (["--ranks", "16..8"], "--ranks"),
    (["--ops", "scatter"], "--ops"),
    (["--ops", ","], "--ops"),
    (["--sizes", "lots"], "--sizes"),
    (["--ocs-delays", "soon"], "--ocs-delays"),
    (["--ocs-delays", ","], "--ocs-delays"),
    (["--delays", "soon"], "--ocs-delays"),  # the old spelling: its value is read as the new flag's
    (["--ports", "0"], "--ports"),
])
def test_study_bad_input_exits_2_naming_the_flag_and_writes_nothing(args, flag, tmp_path):
    result = run("study", "collectives", "--ranks", "8", "--sizes", "1KiB", *args, "--out", str(tmp_path / "x"))
    assert result.exit_code == 2, result.output
    assert f"error: {flag}" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_study_reads_a_range_of_rank_counts(tmp_path):
    result = run("study", "collectives", "--ops", "allgather", "--ranks", "8..9", "--sizes", "1KiB",
                 "--ocs-delays", "0", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["grid"]["ranks"] == [8, 9]


def test_list_and_range_parsers():
    from lightrail.cli.options import parse_gpu_counts, parse_rank_range, parse_sizes, parse_times
    from lightrail.errors import ScenarioError

    assert parse_sizes("1KiB..8KiB") == [1024.0, 2048.0, 4096.0, 8192.0]
    assert parse_sizes("1GiB, 1MiB") == [2.0**20, 2.0**30]
    assert parse_gpu_counts("256..2048") == [256, 512, 1024, 2048]
    assert parse_gpu_counts("256..1000") == [256, 512]
    assert parse_gpu_counts("1024,256") == [1024, 256]
    assert parse_rank_range("2..5") == [2, 3, 4, 5] and parse_rank_range("8") == [8]
    assert parse_times("0, 10ms,1s", "--ocs-delays") == [0.0, 0.01, 1.0]
    for parse, text, flag in ((parse_sizes, "8KiB..1KiB", "--sizes"), (parse_sizes, "", "--sizes"),
                              (parse_gpu_counts, "abc..1", "--gpus"), (parse_gpu_counts, "1", "--gpus"),
                              (parse_rank_range, "2..x", "--ranks"),
                              (lambda t: parse_times(t, "--ocs-delays"), "10", "--ocs-delays")):
        with pytest.raises(ScenarioError) as info:
            parse(text)
        assert info.value.field == flag, (text, info.value)
