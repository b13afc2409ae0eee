"""The scale-up rack: torus geometry, servers, spares, electrical ports and circuit realizability."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.fabric.scaleup import LINK_BANDWIDTH, RackSpec, check_circuits, circuit_ports, servers_of


def test_morphlux_rack_sizes():
    spec = RackSpec()
    assert (spec.accelerators, spec.servers, spec.per_server, spec.ports) == (64, 16, 4, 6)
    assert spec.total_servers == 18 and spec.spare_mask == 0b11 << 16
    assert LINK_BANDWIDTH == pytest.approx(75e9)  # 450 GB/s over 6 links


def test_torus_links_are_symmetric_and_distinct():
    spec = RackSpec()
    nb = spec.neighbours
    for a in range(spec.accelerators):
        assert len(set(nb[a])) == 6
        for d in range(3):
            assert nb[nb[a, 2 * d], 2 * d + 1] == a
            assert nb[nb[a, 2 * d + 1], 2 * d] == a


def test_servers_are_2x2x1_bricks():
    spec = RackSpec()
    for s in range(spec.servers):
        c = spec.coords[spec.server_accelerators[s]]
        assert sorted(set(c[:, 2])) == [c[0, 2]]
        assert len(set(c[:, 0])) == 2 and len(set(c[:, 1])) == 2
        assert c[:, 0].min() % 2 == 0 and c[:, 1].min() % 2 == 0
    # spares hold the accelerators after the torus and have no torus links
    assert list(spec.server_accelerators[16]) == [64, 65, 66, 67]
    assert list(spec.internal_ports([64, 65, 66, 67])) == [0, 0, 0, 0]


@pytest.mark.parametrize(("servers", "ports"), [([0], 2), ([0, 1], 3), ([0, 1, 2, 3], 4),
                                                ([0, 1, 2, 3, 4, 5, 6, 7], 5), (list(range(16)), 6),
                                                ([0, 2], 2), ([0, 5], 2)])
def test_electrical_ports_by_hand(servers, ports):
    # one server: its x and y neighbours are inside the brick (2); two stacked in z add one (3); a column of
    # four closes the z ring (4); 2x4x4 closes y too (5); the whole rack has all six. Servers 0 and 2 (z=0, 2)
    # and servers 0 and 5 (z=0 vs sy=1, z=1) share no link: each keeps its brick's 2.
    spec = RackSpec()
    mask = spec.servers_mask(servers)
    assert spec.electrical_ports(mask) == ports


def test_hole_in_the_rack_costs_its_neighbours_one_link():
    spec = RackSpec()
    mask = spec.torus_mask & ~1
    acc = spec.accelerators_of(mask)
    ports = spec.internal_ports(acc)
    assert ports.min() == 5
    hole = set(spec.server_accelerators[0])
    touching = {int(a) for a in acc if set(spec.neighbours[a]) & hole}
    assert {int(a) for a, p in zip(acc, ports, strict=True) if p == 5} == touching


def test_servers_of_and_mask_roundtrip():
    for servers in ([], [0], [3, 7, 17], list(range(18))):
        assert servers_of(RackSpec().servers_mask(servers)) == sorted(servers)


def test_check_circuits_accepts_disjoint_ports_and_counts_them():
    c = np.array([[0, 0, 1, 1], [1, 0, 2, 1], [2, 0, 0, 1]])
    check_circuits(c, [0, 1, 2], ports=6)
    assert list(circuit_ports(c, [0, 1, 2])) == [2, 2, 2]


@pytest.mark.parametrize(("circuits", "why"), [
    ([[0, 0, 1, 1], [0, 0, 2, 1]], "two circuits"),
    ([[0, 0, 9, 1]], "leaves the slice"),
    ([[0, 0, 0, 1]], "loops"),
    ([[0, 6, 1, 1]], "outside"),
])
def test_check_circuits_refuses(circuits, why):
    with pytest.raises(InfeasibleError, match=why):
        check_circuits(np.array(circuits), [0, 1, 2], ports=6)


def test_bad_geometry_is_refused():
    with pytest.raises(ScenarioError, match="tile"):
        RackSpec(shape=(4, 4, 3), server_shape=(2, 2, 2))
    with pytest.raises(ScenarioError):
        RackSpec(spare_servers=-1)


def test_coords_enumerate_the_torus():
    spec = RackSpec()
    assert [tuple(c) for c in spec.coords] == list(itertools.product(range(4), repeat=3))
    assert all(spec.index(*c) == a for a, c in enumerate(spec.coords))
