"""``lightrail fl import-propius``: Propius's evaluation inputs (a real sample, tests/data/propius) become trace
files the study reads, with Propius's units and eligibility."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError
from lightrail.fl.model import eligibility
from lightrail.fl.population import parse_clients, parse_jobs
from lightrail.fl.propius import load_devices, parse_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "propius"
runner = CliRunner()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("propius") / "o"
    result = runner.invoke(app, ["fl", "import-propius", "--profiles", str(DATA / "profile_mobilenet_large"),
                                 "--trace", str(DATA / "job_trace_20.txt"), "--devices",
                                 str(DATA / "devices_sample.json"), "--clients", "300", "--always-online", "7d",
                                 "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output), out


def test_jobs_keep_the_trace_the_profiles_and_their_constraints(converted):
    summary, out = converted
    assert (summary["jobs"], summary["devices"], summary["over_selection"], summary["round_timeout_s"]) == \
        (20, 60, 1.3, 300.0)
    assert "--over-selection 1.3 --round-timeout 300s" in summary["command"]
    jobs = parse_jobs((out / "jobs.csv").read_text())
    trace = parse_trace((DATA / "job_trace_20.txt").read_text())
    # arrivals are the running sum of the trace's gaps: the first job (profile 19) at 0, the second at 1550
    assert jobs.arrival_s.tolist() == [t for t, _ in trace] and jobs.arrival_s[:2].tolist() == [0.0, 1550.0]
    assert int(jobs.demand[0]) == 300 and jobs.min_os_version[0, 0] == 4 and jobs.min_fp16_mem[0] == 400
    assert sorted(set(jobs.demand.tolist())) == [25, 50, 75, 100, 150, 200, 300, 400]
    assert (jobs.rounds == 150).all() and (jobs.work == 20 * 20).all()
    assert jobs.os_text(0, 0b1111) == "android>=4"


def test_clients_train_as_propius_clients_do(converted):
    _, out = converted
    clients, ids = parse_clients((out / "clients.csv").read_text())
    assert len(ids) == 300 and (out / "availability.csv").read_text().count("\n") == 301
    devices = load_devices((DATA / "devices_sample.json").read_bytes())
    # a round's 20 local steps of 3 x 20 x speed / 1000 s each (Client.execute): 1.2 x speed seconds
    seconds = 400.0 / clients.speed
    assert set(np.round(seconds, 6)) <= {round(1.2 * d["speed"], 6) for d in devices}
    assert (clients.os == 0).all() and set(clients.os_version) <= {d["android_os"] for d in devices}
    jobs = parse_jobs((out / "jobs.csv").read_text())
    elig = eligibility(clients, jobs)
    # the loosest tier (cpu_f 3, ram 2, fp16_mem 400, android 4) admits more clients than the strictest (7, 6, 900, 7)
    loose, strict = int(np.argmax(jobs.min_cpu_ghz == 3)), int(np.argmax(jobs.min_cpu_ghz == 7))
    assert elig[:, loose].sum() > elig[:, strict].sum() > 0
    expect = ((clients.cpu_ghz >= 7) & (clients.memory_gb >= 6) & (clients.fp16_mem >= 900)
              & (clients.os_version >= 7))
    assert (elig[:, strict] == expect).all()


def test_device_pickles_with_code_are_refused(tmp_path):
    data = pickle.dumps({0: {"cpu_f": 1.0, "ram": 1.0, "fp16_mem": 1.0, "android_os": 9.0, "speed": Path("x")}})
    with pytest.raises(ScenarioError, match="only plain data"):
        load_devices(data)
    assert len(load_devices(pickle.dumps({1: {"cpu_f": 1, "ram": 2, "fp16_mem": 3, "android_os": 9, "speed": 5}}))) == 1


def test_bad_inputs_exit_2(tmp_path):
    (tmp_path / "t.txt").write_text("soon 3\n")
    result = runner.invoke(app, ["fl", "import-propius", "--profiles", str(DATA / "profile_mobilenet_large"),
                                 "--trace", str(tmp_path / "t.txt"), "--devices", str(DATA / "devices_sample.json"),
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--trace" in result.output and "line 1" in result.output
    (tmp_path / "t.txt").write_text("0 42\n")
    result = runner.invoke(app, ["fl", "import-propius", "--profiles", str(DATA / "profile_mobilenet_large"),
                                 "--trace", str(tmp_path / "t.txt"), "--devices", str(DATA / "devices_sample.json"),
                                 "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--profiles" in result.output and "[42]" in result.output
    assert not (tmp_path / "o").exists()
