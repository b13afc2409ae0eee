"""``lightrail pipswitch`` end to end: the JSON contract, the table, and bad input exiting 2 naming the flag."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.control.pipswitch import is_one_factorization

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("ports", [2, 7, 32])
def test_json_contract(ports):
    result = run("pipswitch", "--ports", ports, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert {"rounds", "cell_changes", "realizable", "lower_bound_rounds"} <= set(out)
    assert out["realizable"] is True
    assert out["lower_bound_rounds"] == len(out["rounds"]) == (ports - 1 if ports % 2 == 0 else ports)
    assert is_one_factorization([[tuple(p) for p in r] for r in out["rounds"]], ports)
    assert out["cell_changes"] == sum(out["changes_per_round"]) <= out["naive_cell_changes"]
    assert out["ports"] == ports and out["mesh"] == "crossbar" and out["cells"] == ports * ports


def test_table_shows_rounds_cells_and_total():
    result = run("pipswitch", "--ports", "6")
    assert result.exit_code == 0, result.output
    assert "PipSwitch" in result.output and "cell changes" in result.output
    assert "lower bound 5" in result.output and "realizable: yes" in result.output
    assert "X" in result.output  # small meshes are drawn cell by cell


@pytest.mark.parametrize("args, flag", [(("--ports", "1"), "--ports"), (("--ports", "0", "--json"), "--ports"),
                                        (("--ports", "257"), "--ports"), (("--ports", "many"), "--ports"),
                                        (("--mesh", "hexagonal"), "--mesh")])
def test_bad_input_exits_2_naming_the_flag(args, flag):
    result = run("pipswitch", *args)
    assert result.exit_code == 2
    assert flag in result.output and "Traceback" not in result.output
