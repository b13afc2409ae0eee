"""``lightrail study fl``: the study's typed results, the JSON contract end to end, trace files, bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError
from lightrail.fl.population import clients_csv, jobs_csv, synthetic_population
from lightrail.studies.fl import CONTRACT, FlParams, fl_study

runner = CliRunner()
POLICIES = ("fifo", "random", "srsf", "irs", "static")


def run(*args: str):
    return runner.invoke(app, ["study", "fl", *args])


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fl") / "o"
    result = run("--clients", "300", "--jobs", "4", "--seed", "1", "--json", "--out", str(out))
    return result, out


def test_json_contract_and_files(cli_run):
    result, out = cli_run
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert (d["clients"], d["jobs"], d["seed"]) == (300, 4, 1)
    assert list(d["policies"]) == list(POLICIES)
    assert [r["policy"] for r in d["rows"]] == list(POLICIES)
    for p in POLICIES:
        for key in CONTRACT:
            assert key in d["policies"][p], (p, key)
        row = next(r for r in d["rows"] if r["policy"] == p)
        assert all(row[k] == d["policies"][p][k] for k in CONTRACT)
        assert d["policies"][p]["double_bookings"] == 0
        assert 0 <= d["policies"][p]["utilization"] <= 1
        assert len(d["policies"][p]["jct_s"]) == 4
    assert set(d["headline"]) == {"irs_vs_fifo", "irs_vs_static", "srsf_vs_fifo", "srsf_vs_static"}
    assert sorted(p.name for p in out.iterdir()) == ["study-fl.csv", "study-fl.json", "study-fl.png"]
    saved = json.loads((out / "study-fl.json").read_text())
    for dd in (saved, d):
        for p in POLICIES:
            for k in ("elapsed_s", "events_per_s"):
                dd["policies"][p].pop(k)
        for r in dd["rows"]:
            r.pop("elapsed_s"), r.pop("events_per_s")
    assert saved == d
    assert (out / "study-fl.csv").read_text().splitlines()[0].startswith("policy,utilization,bindings_per_s")


def test_table_fits_80_columns(tmp_path):
    result = run("--clients", "200", "--jobs", "3", "--out", str(tmp_path / "t"))
    assert result.exit_code == 0, result.output
    assert "IRS vs fifo" in result.output and "static" in result.output
    table = [ln for ln in result.output.splitlines() if not ln.startswith("wrote ")]
    assert max(map(len, table)) <= 80


def test_study_rows_and_determinism():
    params = FlParams(clients=200, jobs=3, seed=4)
    a = fl_study(params, ("fifo", "irs"))
    b = fl_study(params, ("fifo", "irs"))
    assert [r.policy for r in a.rows()] == ["fifo", "irs"]
    assert a.rows()[0].mean_jct_s == b.rows()[0].mean_jct_s
    assert a.rows()[1].jct_s == b.rows()[1].jct_s
    assert a.headline() == {"irs_vs_fifo": a.ratio("irs", "fifo")}
    assert a.to_dict()["policies"]["irs"]["jobs_completed"] == 3


def test_params_refuse_nonsense():
    with pytest.raises(ScenarioError, match="clients"):
        FlParams(clients=0)
    with pytest.raises(ScenarioError, match="checkin_interval_s"):
        FlParams(checkin_interval_s=-1)


def test_trace_files(tmp_path):
    pop = synthetic_population(150, 3, seed=2)
    (tmp_path / "c.csv").write_text(clients_csv(pop.clients))
    (tmp_path / "j.csv").write_text(jobs_csv(pop.jobs))
    (tmp_path / "a.csv").write_text("client_id,start_s,end_s\n" +
                                    "".join(f"c{i},0,{5 * 86400}\n" for i in range(150)))
    result = run("--clients-trace", str(tmp_path / "c.csv"), "--jobs-trace", str(tmp_path / "j.csv"),
                 "--availability-trace", str(tmp_path / "a.csv"), "--json", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert (d["clients"], d["jobs"]) == (150, 3)
    assert "c.csv" in d["source"] and "a.csv" in d["source"]
    assert all(d["policies"][p]["double_bookings"] == 0 for p in POLICIES)


@pytest.mark.parametrize("args, flag", [
    (("--clients", "0"), "--clients"),
    (("--jobs", "-2"), "--jobs"),
])
def test_bad_numbers_exit_2(tmp_path, args, flag):
    result = run(*args, "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert flag in result.output
    assert not (tmp_path / "o").exists()


def test_malformed_trace_exit_2_naming_flag_line_and_column(tmp_path):
    bad = tmp_path / "jobs.csv"
    bad.write_text("arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work\n0,2,4,android,five,10,100\n")
    result = run("--clients", "50", "--jobs-trace", str(bad), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "--jobs-trace" in result.output and "line 2, column rounds" in result.output
    missing = run("--clients-trace", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o"))
    assert missing.exit_code == 2 and "--clients-trace" in missing.output
    orphan = run("--availability-trace", str(bad), "--out", str(tmp_path / "o"))
    assert orphan.exit_code == 2 and "--availability-trace" in orphan.output
    assert not (tmp_path / "o").exists()
