"""te/prepare.py: a TE setup is checked and made ready (the WAN, its paths, its traffic) inside the wing, the
same objects the study re-exports and the live service starts from."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.errors import ScenarioError
from lightrail.te.prepare import DEFAULT_LAMBDA, TeNetwork, TeSetup, prepare


def test_prepare_builds_paths_and_one_demand_vector_per_matrix():
    net = prepare(TeSetup(topology="abilene", slices=3, matrices=4, seed=0))
    assert isinstance(net, TeNetwork)
    assert net.demands.shape == (4, net.paths.demands)
    assert (net.demands >= 0).all() and net.demands.sum() > 0
    # each node's traffic is what it sends, so the nodes' traffic sums to the mean matrix's total
    assert net.node_traffic().shape == (net.wan.n,)
    assert net.node_traffic().sum() == pytest.approx(net.demands.mean(axis=0).sum())


def test_prepare_is_seeded():
    a, b, c = (prepare(TeSetup(topology="abilene", matrices=2, seed=s)) for s in (0, 0, 1))
    assert np.array_equal(a.demands, b.demands)
    assert not np.array_equal(a.demands, c.demands)


@pytest.mark.parametrize(("change", "field"), [({"lam": -1.0}, "--lambda"), ({"matrices": 0}, "--matrices"),
                                               ({"slices": 0}, None)])
def test_prepare_checks_the_setup_first(change, field):
    with pytest.raises(ScenarioError) as e:
        prepare(TeSetup(topology="abilene", **change))
    if field is not None:
        assert e.value.field == field


def test_the_study_reexports_the_wings_objects():
    from lightrail.studies import te as study

    assert (study.TeSetup, study.TeNetwork, study.prepare, study.DEFAULT_LAMBDA) == (
        TeSetup, TeNetwork, prepare, DEFAULT_LAMBDA)
    assert DEFAULT_LAMBDA == 0.001
