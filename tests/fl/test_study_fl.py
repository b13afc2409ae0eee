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


def test_trace_files_with_the_contract_flags(tmp_path):
    pop = synthetic_population(150, 3, seed=2)
    (tmp_path / "c.csv").write_text(clients_csv(pop.clients))
    (tmp_path / "j.csv").write_text(jobs_csv(pop.jobs))
    (tmp_path / "a.csv").write_text("client_id,start_s,end_s\n" +
                                    "".join(f"c{i},0,{5 * 86400}\n" for i in range(150)))
    result = run("--clients-trace", str(tmp_path / "c.csv"), "--jobs-trace", str(tmp_path / "j.csv"),
                 "--availability-trace", str(tmp_path / "a.csv"), "--over-selection", "1.3", "--round-timeout",
                 "400s", "--horizon", "30d", "--json", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert (d["clients"], d["jobs"]) == (150, 3)
    assert (d["over_selection"], d["round_timeout_s"], d["horizon_s"]) == (1.3, 400.0, 30 * 86400.0)
    assert "c.csv" in d["source"] and "a.csv" in d["source"]
    for p in POLICIES:
        row = d["policies"][p]
        assert all(k in row for k in CONTRACT)
        assert row["double_bookings"] == 0
        assert row["jobs_completed"] + row["jobs_unfinished"] == 3
        assert sum(x is None for x in row["jct_s"]) == row["jobs_unfinished"]
    # rounds bind 1.3x their demand and end at demand results: some results come too late, somewhere
    assert sum(d["policies"][p]["late_results"] for p in POLICIES) > 0


def test_os_version_and_fp16_memory_in_traces(tmp_path):
    # android13 was refused as an unknown OS; now it is android, version 13, and a job asks android>=13
    (tmp_path / "c.csv").write_text("client_id,cpu_ghz,memory_gb,os,speed,fp16_mem\n"
                                    "new,2,4,android13,1,900\nold,2,4,android 9,1,900\nphone,2,4,ios17.2,1,900\n"
                                    "small,2,4,android14,1,300\n")
    (tmp_path / "j.csv").write_text("arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work,min_fp16_mem\n"
                                    "0,1,1,android>=13,2,1,10,800\n")
    result = run("--clients-trace", str(tmp_path / "c.csv"), "--jobs-trace", str(tmp_path / "j.csv"),
                 "--json", "--out", str(tmp_path / "o"))
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert all(d["policies"][p]["jobs_completed"] == 1 for p in POLICIES)
    from lightrail.fl.population import parse_clients, parse_jobs

    clients, ids = parse_clients((tmp_path / "c.csv").read_text())
    jobs = parse_jobs((tmp_path / "j.csv").read_text())
    from lightrail.fl.model import eligibility

    assert eligibility(clients, jobs)[:, 0].tolist() == [True, False, False, False]  # only 'new' qualifies
    assert clients.os_version.tolist() == [13, 9, 17.2, 14] and jobs.min_os_version[0, 0] == 13
    # an exact version in a job's os column is refused, with the fix
    (tmp_path / "bad.csv").write_text("arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work\n"
                                      "0,1,1,android13,2,1,10\n")
    bad = run("--clients-trace", str(tmp_path / "c.csv"), "--jobs-trace", str(tmp_path / "bad.csv"),
              "--out", str(tmp_path / "o2"))
    assert bad.exit_code == 2 and "--jobs-trace" in bad.output and "android>=13" in bad.output


@pytest.mark.parametrize("args, flag", [
    (("--clients", "0"), "--clients"),
    (("--jobs", "-2"), "--jobs"),
    (("--over-selection", "0.5"), "--over-selection"),
    (("--round-timeout", "-4s"), "--round-timeout"),
    (("--horizon", "soon"), "--horizon"),
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
