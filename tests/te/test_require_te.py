"""``require_te`` asks for what a TE run uses (issue 31): HiGHS always, Clarabel for a regularized run (the sparse QP
of te/qp.py), never cvxpy, which TE no longer imports; a missing one is one line naming it and the extra."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.cli.te import require_te
from lightrail.errors import LightrailError

pytest.importorskip("highspy")
pytest.importorskip("clarabel")


def test_a_regularized_te_run_needs_no_cvxpy(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cvxpy", None)  # hidden: importing it raises ImportError
    require_te(0.01)
    result = CliRunner().invoke(app, ["te", "run", "--topology", "abilene", "--matrices", "1", "--slicers",
                                      "contiguous", "--lambda", "0.01", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["lambda"] == 0.01
    assert "cvxpy" not in sys.modules or sys.modules["cvxpy"] is None  # nothing imported it


@pytest.mark.parametrize(("hidden", "lam", "missing"), [("clarabel", 0.01, "clarabel"), ("clarabel", 0.0, None),
                                                        ("highspy", 0.0, "highspy")])
def test_require_te_names_the_missing_solver(monkeypatch, hidden, lam, missing):
    monkeypatch.setitem(sys.modules, hidden, None)
    if missing is None:
        require_te(lam)  # an unregularized run solves LPs with HiGHS alone
        return
    with pytest.raises(LightrailError) as e:
        require_te(lam)
    assert e.value.field == "te" and missing in e.value.message and "lightrail[te]" in e.value.fix
