"""Scale-up allocators against brute force on small racks, and bandwidth against hand counts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightrail.control.scaleup import (
    SHAPES,
    SIZES,
    block_fits,
    block_shape,
    first_fit_block,
    orientations,
    photonic_allocate,
    photonic_ports,
    placements,
    popcount,
    ring_circuits,
    splice,
    stranded,
)
from lightrail.errors import ScenarioError
from lightrail.fabric.scaleup import RackSpec, check_circuits, circuit_ports, servers_of

SPEC = RackSpec()


def brute_force_blocks(spec: RackSpec, size: int, free_acc: np.ndarray) -> list[frozenset[int]]:
    """Every aligned block of ``size``'s shape (any axis order servers tile) whose accelerators are all free,
    enumerated coordinate by coordinate, independently of the allocator's bitmasks."""
    found = []
    shapes = {p for p in itertools.permutations(SHAPES[size])
              if all(s % q == 0 and q % b == 0 for q, s, b in zip(p, spec.shape, spec.server_shape, strict=True))}
    for shape in shapes:
        for origin in itertools.product(*(range(0, s, q) for s, q in zip(spec.shape, shape, strict=True))):
            cells = [int(spec.index(*(o + d for o, d in zip(origin, delta, strict=True))))
                     for delta in itertools.product(*(range(q) for q in shape))]
            if free_acc[cells].all():
                found.append(frozenset(cells))
    return found


def test_placement_counts_by_hand():
    # 2x2x1: 2*2*4 origins; 2x2x2: 2*2*2; 2x2x4 in three orientations of 4; 2x4x4 in three of 2; 4x4x4: 1
    assert [len(placements(SPEC, s)) for s in SIZES] == [16, 8, 12, 6, 1]
    assert orientations(16, SPEC) == [(2, 2, 4), (2, 4, 2), (4, 2, 2)]


@pytest.mark.parametrize("size", SIZES)
def test_every_placement_is_an_aligned_box_of_its_shape(size):
    for mask in placements(SPEC, size):
        acc = SPEC.accelerators_of(int(mask))
        c = SPEC.coords[acc]
        shape = block_shape(SPEC, size, int(mask))
        assert tuple(int(v) for v in c.max(0) - c.min(0) + 1) == shape
        assert len(acc) == size
        assert all(lo % q == 0 for lo, q in zip(c.min(0), shape, strict=True))


@pytest.mark.parametrize("size", SIZES)
def test_first_fit_finds_a_block_iff_brute_force_does(size):
    rng = np.random.default_rng(size)
    for trial in range(300):
        p_free = (0.3, 0.6, 0.85, 0.97)[trial % 4]
        free_servers = rng.random(SPEC.servers) < p_free
        mask = SPEC.servers_mask(np.flatnonzero(free_servers)) | SPEC.spare_mask
        free_acc = np.zeros(SPEC.accelerators, dtype=bool)
        free_acc[SPEC.accelerators_of(mask & SPEC.torus_mask)] = True
        brute = brute_force_blocks(SPEC, size, free_acc)
        got = first_fit_block(np.array([mask], dtype=np.uint32), size, SPEC)
        assert (got is not None) == bool(brute)
        if got is not None:
            rack, block = got
            assert rack == 0 and block & ~mask == 0
            assert frozenset(int(a) for a in SPEC.accelerators_of(block)) in brute


def test_first_fit_takes_the_first_rack_and_first_placement():
    full = SPEC.torus_mask
    free = np.array([0, full & ~0b1111, full], dtype=np.uint32)  # rack 1 lacks the first z column
    assert first_fit_block(free, 16, SPEC) == (1, int(placements(SPEC, 16)[1]))
    assert first_fit_block(free, 64, SPEC) == (2, full)
    assert first_fit_block(np.zeros(3, dtype=np.uint32), 4, SPEC) is None
    fits = block_fits(free, 4, SPEC)
    assert fits.shape == (3, 16) and fits[0].sum() == 0 and fits[1].sum() == 12 and fits[2].sum() == 16


@pytest.mark.parametrize("size", [4, 8, 12, 16, 32, 64])
def test_photonic_accepts_iff_enough_free_servers_and_routes_realizable_circuits(size):
    rng = np.random.default_rng(100 + size)
    k = -(-size // SPEC.per_server)
    for _ in range(200):
        free = (rng.integers(0, 1 << SPEC.servers, 3) | SPEC.spare_mask).astype(np.uint32)
        counts = [bin(int(f) & SPEC.torus_mask).count("1") for f in free]
        got = photonic_allocate(free, size, SPEC)
        assert (got is not None) == any(c >= k for c in counts)
        if got is None:
            continue
        rack, mask = got
        assert rack == next(r for r, c in enumerate(counts) if c >= k)
        assert mask & ~int(free[rack]) == 0 and mask & SPEC.spare_mask == 0
        assert len(servers_of(mask)) == k
        ports, circuits = photonic_ports(SPEC, mask)
        members = SPEC.accelerators_of(mask)
        check_circuits(circuits, members, ports=SPEC.ports)  # no port twice, ends in the slice
        assert list(circuit_ports(circuits, members)) == [SPEC.ports] * len(members)  # every idle port redirected
        assert ports == 6


def test_photonic_circuits_form_rings_over_the_members():
    members = SPEC.accelerators_of(0b101)  # two non-adjacent servers
    c = ring_circuits(SPEC, members)
    assert len(c) == 3 * len(members)
    for j in range(3):
        ring = c[(c[:, 1] == 2 * j)]
        nxt = dict(zip(ring[:, 0].tolist(), ring[:, 2].tolist(), strict=True))
        a, seen = int(members[0]), []
        for _ in members:
            seen.append(a)
            a = nxt[a]
        assert sorted(seen) == sorted(members.tolist()) and a == members[0]


@pytest.mark.parametrize(("size", "electrical", "photonic"), [(4, 2, 6), (8, 3, 6), (16, 4, 6), (32, 5, 6),
                                                              (64, 6, 6)])
def test_slice_bandwidth_by_hand(size, electrical, photonic):
    mask = int(placements(SPEC, size)[0])
    assert SPEC.electrical_ports(mask) * SPEC.link_bandwidth == electrical * 75e9
    assert photonic_ports(SPEC, mask)[0] * SPEC.link_bandwidth == photonic * 75e9


def test_stranded_by_hand():
    # racks with 16, 12 and 20 free accelerators; a 16 request fits only in the third
    assert stranded(np.array([16, 12, 20]), np.array([False, False, True]), 16) == 16
    assert stranded(np.array([16, 12, 20]), np.array([True, False, True]), 16) == 0


def test_splice_prefers_a_spare_then_any_free_server():
    mask = 0b11
    assert splice(SPEC, mask, 0, SPEC.spare_mask | 0b100) == 0b10 | (1 << 16)
    assert splice(SPEC, mask, 0, 0b100) == 0b110
    assert splice(SPEC, mask, 0, 0) is None


def test_popcount():
    assert list(popcount(np.array([0, 1, 0b1011, 0xFFFFFFFF], dtype=np.uint32))) == [0, 1, 3, 32]


def test_bad_size_is_refused():
    with pytest.raises(ScenarioError, match="size"):
        first_fit_block(np.zeros(1, dtype=np.uint32), 12, SPEC)
    with pytest.raises(ScenarioError, match="size"):
        photonic_allocate(np.zeros(1, dtype=np.uint32), 65, SPEC)


def test_circuits_of_every_slice_in_a_rack_are_realizable_together():
    rng = np.random.default_rng(5)
    free = np.array([SPEC.torus_mask | SPEC.spare_mask], dtype=np.uint32)
    circuits, members = [], []
    while True:
        got = photonic_allocate(free, int(rng.choice([4, 8, 12, 16])), SPEC)
        if got is None:
            break
        free[0] &= np.uint32(~got[1] & 0xFFFFFFFF)
        circuits.append(photonic_ports(SPEC, got[1])[1])
        members.extend(SPEC.accelerators_of(got[1]).tolist())
    assert len(set(members)) == len(members)
    check_circuits(np.concatenate(circuits), members, ports=SPEC.ports)  # no port shared between slices
