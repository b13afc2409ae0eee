"""``lightrail study scaleup`` end to end: the JSON contract, files written, bad input exits 2 with nothing written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lightrail.cli import app

runner = CliRunner()
CONTRACT = ("acceptance", "fragmentation", "stranded_fraction", "mean_slice_bandwidth_Bps", "failure_recovery",
            "elapsed_s", "acceptance_by_size", "spare_coverage", "free_capacity_coverage")


def run(*args: str):
    return runner.invoke(app, ["study", "scaleup", *args])


def test_json_contract_and_files(tmp_path):
    out = tmp_path / "o"
    result = run("--racks", "4", "--requests", "300", "--seed", "2", "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert (d["racks"], d["requests"], d["seed"]) == (4, 300, 2)
    for fab in ("electrical", "photonic"):
        for key in CONTRACT:
            assert key in d[fab], (fab, key)
        assert 0 <= d[fab]["acceptance"] <= 1
    assert d["photonic"]["mean_slice_bandwidth_Bps"] == pytest.approx(450e9)
    assert sorted(p.name for p in out.iterdir()) == ["by-size.png", "scaleup.json", "summary.csv"]
    saved = json.loads((out / "scaleup.json").read_text())
    for fab in ("electrical", "photonic"):
        saved[fab].pop("elapsed_s"), d[fab].pop("elapsed_s")
    assert saved == d


def test_same_seed_same_json(tmp_path):
    def figures(k):
        r = run("--racks", "3", "--requests", "200", "--seed", "7", "--json", "--out", str(tmp_path / str(k)))
        d = json.loads(r.output)
        for fab in ("electrical", "photonic"):
            d[fab].pop("elapsed_s")
        return d

    assert figures(1) == figures(2)


def test_table_output(tmp_path):
    result = run("--racks", "2", "--requests", "100", "--out", str(tmp_path / "t"))
    assert result.exit_code == 0, result.output
    assert "fragmentation" in result.output and "photonic" in result.output


def test_trace_file(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,size,duration_s\n0,64,10\n1,4,10\n")
    result = run("--racks", "1", "--trace", str(trace), "--json", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert d["requests"] == 2 and d["trace"] == str(trace)
    assert d["electrical"]["acceptance"] == 0.5 and d["photonic"]["acceptance"] == 0.5


@pytest.mark.parametrize(("args", "flag"), [
    (["--racks", "0"], "--racks"),
    (["--requests", "0"], "--requests"),
    (["--load", "0"], "--load"),
    (["--mtbf-hours", "-1"], "--mtbf-hours"),
    (["--trace", "/nonexistent/trace.csv"], "--trace"),
])
def test_bad_input_exits_2_naming_the_flag_with_nothing_written(tmp_path, args, flag):
    out = tmp_path / "o"
    result = run(*args, "--out", str(out))
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_bad_trace_content_exits_2(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,size,duration_s\n0,65,10\n")
    out = tmp_path / "o"
    result = run("--trace", str(trace), "--out", str(out))
    assert result.exit_code == 2 and "--trace" in result.output and "line 2" in result.output
    assert not out.exists()


def test_spare_servers_flag(tmp_path):
    def recovery(spares):
        r = run("--racks", "2", "--requests", "400", "--load", "1.3", "--mtbf-hours", "300", "--spare-servers",
                str(spares), "--json", "--out", str(tmp_path / str(spares)))
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        assert d["spare_servers"] == spares
        return d["photonic"]["failure_recovery"]

    assert recovery(2)["hit"] > 0 and recovery(0)["hit"] > 0
    bad = run("--spare-servers", "-1", "--out", str(tmp_path / "bad"))
    assert bad.exit_code == 2 and "--spare-servers" in bad.output and not (tmp_path / "bad").exists()


def test_spare_sweep_adds_rows(tmp_path):
    r = run("--racks", "2", "--requests", "300", "--load", "1.3", "--mtbf-hours", "300", "--spare-servers", "0,1,2,4",
            "--json", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [row["spare_servers"] for row in d["rows"]] == [0, 1, 2, 4]
    for row in d["rows"]:
        assert {"spare_servers", "spare_coverage", "free_capacity_coverage"} <= set(row)
    assert d["rows"][0]["spare_coverage"] == 0.0 and d["rows"][-1]["spare_coverage"] > 0
    assert d["spare_servers"] == 0 and d["photonic"]["spare_coverage"] == 0.0
    assert all(isinstance(k, str) for k in d["electrical"]["acceptance_by_size"])
    assert "rows" not in json.loads(run("--racks", "2", "--requests", "50", "--json").output)


@pytest.mark.parametrize("value", ["1,1", "x", "17", "0,,-1"])
def test_bad_spare_list_exits_2(tmp_path, value):
    out = tmp_path / "o"
    r = run("--spare-servers", value, "--out", str(out))
    assert r.exit_code == 2 and "--spare-servers" in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_shaped_trace_file(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,size,duration_s,shape\n0,32,10,4x4x2\n1,12,10,2x2x3\n2,20,10,\n")
    r = run("--racks", "1", "--trace", str(trace), "--json", "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert set(d["electrical"]["acceptance_by_request"]) == {"4x4x2", "2x2x3", "20"}
    assert d["mix"] is None
