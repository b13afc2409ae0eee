"""Sweep files: parsing (grid x list, ranges, bad files naming their field), cells that fail are recorded,
the metrics are the simulator's, and the table is the same on one process and on Ray."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError
from lightrail.scenario import load_scenario
from lightrail.studies.rails import compare_rails
from lightrail.studies.sweep import METRICS, is_sweep_file, parse_sweep, run_cell, run_sweep

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = EXAMPLES / "debug-tiny.yaml"
runner = CliRunner()


def sweep_file(tmp_path: Path, **data) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"scenario": str(TINY), **data}))
    return path


def test_grid_is_every_combination_in_order_and_list_cells_multiply_it():
    sweep = parse_sweep({"scenario": str(TINY), "grid": {"ocs.reconfig_delay": [0, "1ms"], "job.micro_batches": "2..4"},
                         "list": [{"ocs.mode": "on-demand"}, {"ocs.mode": "provisioned", "ocs.partial": False}]})
    assert sweep.fields == ("ocs.reconfig_delay", "job.micro_batches", "ocs.mode", "ocs.partial")
    assert len(sweep.cells) == 2 * 3 * 2
    assert sweep.cells[0] == {"ocs.reconfig_delay": "0", "job.micro_batches": 2, "ocs.mode": "on-demand"}
    assert sweep.cells[1] == {"ocs.reconfig_delay": "0", "job.micro_batches": 2, "ocs.mode": "provisioned",
                              "ocs.partial": False}
    assert [c["job.micro_batches"] for c in sweep.cells[::2]] == [2, 3, 4, 2, 3, 4]  # last grid field fastest
    assert is_sweep_file({"grid": {}}) and not is_sweep_file(yaml.safe_load(TINY.read_text()))
    optional = parse_sweep({"scenario": str(TINY), "grid": {"cluster.rail_bandwidth": [0], "job.mfu": [1]}})
    assert optional.cells == ({"cluster.rail_bandwidth": "0", "job.mfu": 1},)  # text fields read numbers as text


def test_the_old_on_demand_spelling_is_read_and_written_the_one_way():
    sweep = parse_sweep({"scenario": str(TINY), "grid": {"ocs.mode": ["on_demand", "provisioned"]}})
    assert [c["ocs.mode"] for c in sweep.cells] == ["on-demand", "provisioned"]


@pytest.mark.parametrize("name, cells", [("debug", 18), ("debug-500", 500)])
def test_the_example_sweep_files_parse(name, cells):
    from lightrail.studies.sweep import load_sweep

    sweep = load_sweep(EXAMPLES / "sweeps" / f"{name}.yaml")
    assert len(sweep.cells) == cells and sweep.scenario["name"] == "debug-tiny"
    assert len({tuple(sorted(c.items())) for c in sweep.cells}) == cells  # no cell twice


@pytest.mark.parametrize("data, field", [
    ({"grid": {"ocs.reconfig_dely": [0]}}, "grid.ocs.reconfig_dely"),
    ({"grid": {"cluster.gpus.count": [8]}}, "grid.cluster.gpus.count"),
    ({"grid": {"job.micro_batches": 4}}, "grid.job.micro_batches"),
    ({"grid": {"job.micro_batches": []}}, "grid.job.micro_batches"),
    ({"grid": {"job.micro_batches": "9..3"}}, "grid.job.micro_batches"),
    ({"grid": {"job.micro_batches": [[1, 2]]}}, "grid.job.micro_batches"),
    ({"list": [{"ocs.mode": "on-demand"}, {"ocs.moed": "provisioned"}]}, "list[1].ocs.moed"),
    ({"grid": {"ocs.mode": ["on-demand"]}, "list": [{"ocs.mode": "provisioned"}]}, "grid.ocs.mode"),
    ({"grid": {"job.micro_batches": [4]}, "metrics": ["x"]}, "metrics"),
    ({}, "grid"),
])
def test_a_bad_sweep_file_names_its_field(data, field):
    with pytest.raises(ScenarioError) as e:
        parse_sweep({"scenario": str(TINY), **data})
    assert e.value.field == field


def test_bad_sweep_file_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    path = sweep_file(tmp_path, grid={"ocs.reconfig_dely": ["1ms"]})
    result = runner.invoke(app, ["sweep", str(path), "--local", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "grid.ocs.reconfig_dely" in result.output
    assert not (tmp_path / "out").exists()


def test_free_mappings_take_any_key_and_a_preset_name_becomes_a_model_section():
    sweep = parse_sweep({"scenario": str(TINY), "grid": {"model.overrides.layers": [4, 8]}})
    assert len(sweep.cells) == 2
    default = parse_sweep({"grid": {"model.overrides.seq_len": [2048]}})  # the default scenario's model is a name
    assert default.scenario["model"] == "llama3-70b"


def test_a_cell_is_the_simulator_on_that_scenario():
    """A cell's numbers are compare_rails' on the scenario with the cell's values written in."""
    scenario, base = load_scenario(TINY)
    metrics = run_cell(yaml.safe_load(TINY.read_text()), TINY.parent, {"ocs.reconfig_delay": "5ms"})
    data = scenario.model_dump()
    data["ocs"]["reconfig_delay"] = "5ms"
    reference = compare_rails(type(scenario).model_validate(data).build(base))
    assert metrics["iteration_time_s"] == reference.iteration_time_s
    assert metrics["baseline_iteration_time_s"] == reference.baseline_iteration_time_s
    assert metrics["overhead"] == pytest.approx(reference.overhead, rel=1e-12)
    parts = sum(metrics[k] for k in ("switching_delay_s", "drain_wait_s", "control_plane_s", "lost_overlap_s"))
    assert parts == pytest.approx(metrics["iteration_time_s"] - metrics["baseline_iteration_time_s"], rel=1e-9)


SMALL = {"grid": {"ocs.reconfig_delay": ["0", "1ms"]},
         "list": [{"cluster.gpus": 32}, {"cluster.gpus": 30}, {"cluster.gpus": 64, "parallel.dp": 4}]}
"""Six cells; the layout (TP4 x DP2 x PP4) does not fit 30 GPUs, so two cells fail."""


def _check_small(result):
    assert len(result.cells) == 6 and [c.cell for c in result.cells] == list(range(6))
    failed = result.failed
    assert [c.values["cluster.gpus"] for c in failed] == [30, 30]
    assert [c.cell for c in failed] == [1, 4]
    assert all(c.error.startswith("InfeasibleError: parallel:") and "GPUs(30)" in c.error for c in failed)
    assert all(c.ok and set(c.metrics) == set(METRICS) for c in result.cells if c.values["cluster.gpus"] != 30)
    rows = result.rows()
    assert all(math.isnan(r["overhead"]) for r in rows if r["status"] == "failed")


def test_a_failing_cell_is_recorded_and_the_rest_finish():
    result = run_sweep(parse_sweep({"scenario": str(TINY), **SMALL}), local=True)
    _check_small(result)
    a, b = (result.cells[i].metrics["iteration_time_s"] for i in (0, 3))
    assert b > a  # a 1 ms switch costs time over a 0 ms one


@pytest.fixture(scope="module")
def ray_cluster():
    """One small local Ray for the module (starting one costs seconds)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=128 * 2**20)
    yield ray
    ray.shutdown()


def test_ray_and_local_give_the_same_table_and_the_cli_writes_it(ray_cluster, tmp_path):
    sweep = parse_sweep({"scenario": str(TINY), **SMALL})
    local, distributed = run_sweep(sweep, local=True), run_sweep(sweep)
    assert distributed.runner.startswith("ray")
    _check_small(distributed)
    assert json.dumps(local.rows()) == json.dumps(distributed.rows())  # NaN-safe equality of the whole table

    # the verb, on the Ray this process runs: table (CSV and Parquet), JSON, figure, report
    path = sweep_file(tmp_path, **SMALL)
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(path), "--out", str(out), "--html", "--format", "svg",
                                 "--allow-failures"])  # two cells fail: exit 1 without it
    assert result.exit_code == 0, result.output
    with open(out / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["status"] for r in table] == ["ok", "failed", "ok", "ok", "failed", "ok"]
    assert float(table[3]["iteration_time_s"]) == distributed.rows()[3]["iteration_time_s"]
    assert table[1]["iteration_time_s"] == "" and "GPUs(30)" in table[1]["error"]
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [r["cell"] for r in parquet] == list(range(6))
    assert parquet[5]["overhead"] == distributed.rows()[5]["overhead"]
    assert (out / "overhead.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
    assert (out / "report.html").stat().st_size > 1_000_000  # plotly.js inline


def test_sweep_json_prints_and_writes_nothing_unless_out_is_given(tmp_path, monkeypatch):
    path = sweep_file(tmp_path, grid={"ocs.reconfig_delay": ["0", "1ms"]})
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = runner.invoke(app, ["sweep", str(path), "--local", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cells"] == 2 and data["failed"] == 0 and data["runner"] == "local"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    result = runner.invoke(app, ["sweep", str(path), "--local", "--json", "--out", "given"])
    assert result.exit_code == 0 and (tmp_path / "given" / "sweep.csv").is_file()


def test_every_cell_failing_is_an_error_naming_the_cause(tmp_path):
    path = sweep_file(tmp_path, grid={"cluster.gpus": [30, 31]})
    result = runner.invoke(app, ["sweep", str(path), "--local", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "every cell failed" in result.output


def test_ray_flags_need_a_sweep_file():
    result = runner.invoke(app, ["sweep", str(TINY), "--local"])
    assert result.exit_code == 2 and "--local" in result.output


def test_an_address_nobody_answers_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    path = sweep_file(tmp_path, grid={"ocs.reconfig_delay": ["0"]})
    result = runner.invoke(app, ["sweep", str(path), "--address", f"127.0.0.1:{port}"])
    assert result.exit_code == 2 and "--address" in result.output and result.output.strip().count("\n") == 0


def test_a_sweep_over_a_trace_scenario_is_refused_up_front():
    from lightrail.errors import ScenarioError
    from lightrail.studies.sweep import parse_sweep

    scenario = {"name": "t", "cluster": {"gpus": 2}, "workload": {"chakra": "/nonexistent-traces"}}
    with pytest.raises(ScenarioError) as e:
        parse_sweep({"scenario": scenario, "grid": {"ocs.reconfig_delay": ["1ms", "2ms"]}})
    assert e.value.field == "scenario"
