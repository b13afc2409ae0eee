"""What the simulator and the planners remember gives what working it out again gives: a layout's groups (read-only,
one array per layout and dimensions) and the simulation's per-op facts (an equal program simulated twice, and on
a fresh program, gives the same summary)."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.workload.parallel import Dim, Layout


@pytest.mark.parametrize("degrees", [dict(tp=2, dp=4, pp=2), dict(tp=4, cp=2, ep=2, dp=2, pp=4),
                                     dict(tp=8, dp=16, pp=1), dict(tp=1, dp=3, pp=5, gpus_per_server=1)])
def test_a_layouts_groups_remembered_equal_them_worked_out_again(degrees):
    layout = Layout(**{"cp": 1, "ep": 1, **degrees})
    for dims in [(Dim.TP,), (Dim.DP,), (Dim.PP,), (Dim.CP, Dim.EP, Dim.DP), (Dim.TP, Dim.PP), ("dp", "pp")]:
        first = layout.groups_over(dims)
        assert np.array_equal(first, layout._groups_over(tuple(Dim(d) for d in dims)))
        assert layout.groups_over(list(dims)) is first
        assert not first.flags.writeable  # a caller cannot change what the next one reads
    assert np.array_equal(layout.groups_over(["dp"]), layout.groups("dp"))
