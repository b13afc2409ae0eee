"""``sorted_unique`` is ``np.unique`` for integers, and the planners' circuit sets built with it are np.unique's
(issue 33: np.unique imports numpy.ma, ~20 ms of a small job's run)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from lightrail.control.plan import rail_circuits
from lightrail.fabric.builders import sorted_unique
from lightrail.workload.parallel import Layout


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(st.sampled_from([np.int64, np.int32, np.intp]), hnp.array_shapes(min_dims=1, max_dims=2,
                                                                                  min_side=0, max_side=40),
                  elements=st.integers(-50, 50)))
def test_sorted_unique_is_np_unique(values):
    got, want = sorted_unique(values), np.unique(values)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.sampled_from([1, 2, 4]), st.data())
def test_rail_circuits_are_the_np_unique_ones(servers, g, data):
    """The circuits of transfers, per destination rail or spread over given rails, as np.unique finds them."""
    layout = Layout.from_degrees(servers * g, gpus_per_server=g, tp=1, cp=1, ep=1, dp=-1, pp=1)
    n = servers * g
    src = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=30)), np.int64)
    dst = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=len(src), max_size=len(src))), np.int64)
    rails = data.draw(st.none() | st.lists(st.integers(0, g - 1), min_size=1, max_size=g, unique=True))
    got = rail_circuits(layout, src, dst, rails)
    s_srv, d_srv = src // g, dst // g
    cross = s_srv != d_srv
    if rails is None:
        want = np.unique(np.stack([dst[cross] % g, s_srv[cross], d_srv[cross]]), axis=1)
    else:
        pairs = np.unique(np.stack([s_srv[cross], d_srv[cross]]), axis=1)
        want = np.unique(np.stack([np.repeat(rails, pairs.shape[1]), np.tile(pairs[0], len(rails)),
                                   np.tile(pairs[1], len(rails))]), axis=1)
    assert [list(map(int, part)) for part in got] == want.tolist()


def test_planning_circuits_imports_no_numpy_ma():
    """Nor does NCCL's communicator (its np.unique asks for counts, which skips the np.ma check)."""
    code = ("import sys, numpy as np; from lightrail.control.plan import rail_circuits; "
            "from lightrail.fabric.builders import photonic_rails; from lightrail.workload.parallel import Layout; "
            "lay = Layout.from_degrees(16, gpus_per_server=4, tp=1, cp=1, ep=1, dp=-1, pp=1); "
            "c = rail_circuits(lay, np.arange(16), (np.arange(16) + 4) % 16); rail_circuits(lay, [0], [5], [0, 1]); "
            "photonic_rails(4, c, gpus_per_server=4); "
            "from lightrail.nccl_cost import communicator; from lightrail.fabric.params import RailFabric; "
            "communicator(range(16), 4, RailFabric()); print('numpy.ma' in sys.modules)")  # np.unique with counts
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split() == ["False"]
