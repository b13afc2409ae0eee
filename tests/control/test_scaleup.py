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
    box_placements,
    first_fit_block,
    orientations,
    photonic_allocate,
    photonic_ports,
    placements,
    popcount,
    request_placements,
    request_shapes,
    ring_circuits,
    server_box_shapes,
    splice,
    stranded,
    torus_circuits,
)
from lightrail.errors import ScenarioError
from lightrail.fabric.scaleup import RackSpec, check_circuits, circuit_ports, servers_of

SPEC = RackSpec()
SMALL = [RackSpec(shape=(2, 2, 2), server_shape=(1, 1, 1), spare_servers=0),
         RackSpec(shape=(4, 2, 2), server_shape=(1, 1, 1), spare_servers=0),
         RackSpec(shape=(4, 2, 2), server_shape=(2, 1, 1), spare_servers=0),
         RackSpec(shape=(4, 4, 2), server_shape=(2, 2, 1), spare_servers=0)]


def cells_of(spec: RackSpec, mask: int) -> frozenset[int]:
    return frozenset(int(a) for a in spec.accelerators_of(mask))


def brute_boxes(spec: RackSpec, shape, *, aligned: bool = False) -> set[frozenset[int]]:
    """Every box of ``shape`` (any axis order) in the torus, cell by cell from every accelerator as origin, wrapping
    around; kept when it is a union of whole servers (and, if ``aligned``, when its origin is a multiple of its
    sides and its sides divide the torus). Independent of the allocator's server-grid bitmasks."""
    found = set()
    server_of = spec.server_of[: spec.accelerators]
    for perm in set(itertools.permutations(shape)):
        if any(p > s for p, s in zip(perm, spec.shape, strict=True)):
            continue
        for origin in itertools.product(*(range(s) for s in spec.shape)):
            if aligned and any(o % p or s % p for o, p, s in zip(origin, perm, spec.shape, strict=True)):
                continue
            cells = frozenset(int(spec.index(*(o + d for o, d in zip(origin, delta, strict=True))))
                              for delta in itertools.product(*(range(p) for p in perm)))
            servers = {int(server_of[c]) for c in cells}
            if len(cells) == len(servers) * spec.per_server:  # whole servers only
                found.add(cells)
    return found


def brute_count_boxes(spec: RackSpec, size: int) -> set[frozenset[int]]:
    """Boxes of the fewest whole servers >= ceil(size / per_server) that any box holds, by brute force."""
    k = -(-size // spec.per_server)
    for servers in range(k, spec.servers + 1):
        vol = servers * spec.per_server
        found = set()
        for a, b in itertools.product(range(1, max(spec.shape) + 1), repeat=2):
            if vol % (a * b) == 0:
                found |= brute_boxes(spec, (a, b, vol // (a * b)))
        if found:
            return found
    return set()


@pytest.mark.parametrize("spec", SMALL, ids=lambda s: f"{s.shape}/{s.server_shape}")
def test_every_placement_of_every_shape_matches_brute_force(spec):
    sides = [range(1, s + 1) for s in spec.shape]
    for shape in itertools.product(*sides):
        brute = brute_boxes(spec, shape)
        try:
            masks = request_placements(spec, int(np.prod(shape)), shape)
        except ScenarioError:
            assert not brute, shape  # refused only when no box of whole servers exists
            continue
        got = [cells_of(spec, int(m)) for m in masks]
        assert len(got) == len(set(got)), shape  # no placement twice
        assert set(got) == brute, shape
        aligned = {cells_of(spec, int(m)) for m in request_placements(spec, int(np.prod(shape)), shape,
                                                                      placement="aligned")}
        assert aligned == brute_boxes(spec, shape, aligned=True), shape
        assert set(got[: len(aligned)]) == aligned  # aligned ones are tried first


@pytest.mark.parametrize("spec", SMALL, ids=lambda s: f"{s.shape}/{s.server_shape}")
def test_count_requests_take_any_box_of_enough_servers(spec):
    for size in range(1, spec.accelerators + 1):
        got = {cells_of(spec, int(m)) for m in request_placements(spec, size)}
        assert got == brute_count_boxes(spec, size), size


@pytest.mark.parametrize("spec", SMALL[:2], ids=lambda s: f"{s.shape}")
def test_first_fit_places_iff_a_box_is_free_on_every_free_state(spec):
    # every free/busy state of every server (one accelerator per server), for every shape
    states = np.arange(1 << spec.servers, dtype=np.uint32)
    rng = np.random.default_rng(0)
    for shape in [(1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 2, 1), (3, 1, 1), (3, 2, 1), (2, 2, 2), (4, 1, 2)]:
        if any(p > s for p, s in zip(sorted(shape), sorted(spec.shape), strict=True)):
            continue
        brute = brute_boxes(spec, shape)
        brute_masks = np.array([sum(1 << int(spec.server_of[c]) for c in box) for box in brute], dtype=np.uint32)
        ok = ((states[:, None] & brute_masks[None, :]) == brute_masks[None, :]).any(axis=1)
        masks = request_placements(spec, int(np.prod(shape)), shape)
        assert (block_fits(states, masks).any(axis=1) == ok).all(), shape
        for free in rng.choice(states, 64):
            got = first_fit_block(np.array([free], dtype=np.uint32), masks)
            assert (got is not None) == ok[int(free)]
            if got is not None:
                assert cells_of(spec, got[1]) in brute and got[1] & ~int(free) == 0


def test_placement_counts_by_hand():
    # aligned TPU-style blocks: 2x2x1: 2*2*4 origins; 2x2x2: 2*2*2; 2x2x4 in three orientations of 4; 2x4x4 in three
    # of 2; 4x4x4: 1. Contiguous: any server origin, wrapping: 2x2x2 16 (z origin 0..3); 2x2x4 4 + 8 + 8 = 20
    assert [len(placements(SPEC, s)) for s in SIZES] == [16, 8, 12, 6, 1]
    assert [len(placements(SPEC, s, placement="contiguous")) for s in SIZES] == [16, 16, 20, 8, 1]
    assert orientations(16, SPEC) == [(2, 2, 4), (2, 4, 2), (4, 2, 2)]
    # a count of 16 may also take a 4x4x1 slab; a 2x2x3 column only wraps (3 does not divide 4): no aligned origin
    assert request_shapes(SPEC, 16) == ((2, 2, 4), (2, 4, 2), (4, 2, 2), (4, 4, 1))
    assert len(request_placements(SPEC, 12, (2, 2, 3), placement="aligned")) == 0
    assert len(request_placements(SPEC, 12, (2, 2, 3))) == 16
    # 5 servers make no box in a 2x2x4 server grid: a count of 20 rounds up to 6 servers (4x2x3 or 2x4x3)
    assert request_shapes(SPEC, 20) == ((2, 4, 3), (4, 2, 3)) and server_box_shapes(SPEC, 5) == []


@pytest.mark.parametrize("size", SIZES)
def test_every_aligned_placement_is_an_aligned_box_of_its_shape(size):
    for mask in placements(SPEC, size):
        acc = SPEC.accelerators_of(int(mask))
        c = SPEC.coords[acc]
        shape = block_shape(SPEC, size, int(mask))
        assert tuple(int(v) for v in c.max(0) - c.min(0) + 1) == shape
        assert len(acc) == size
        assert all(lo % q == 0 for lo, q in zip(c.min(0), shape, strict=True))


def test_first_fit_takes_the_first_rack_and_first_placement():
    full = SPEC.torus_mask
    free = np.array([0, full & ~0b1111, full], dtype=np.uint32)  # rack 1 lacks the first z column
    aligned16 = placements(SPEC, 16)
    assert first_fit_block(free, aligned16) == (1, int(aligned16[1]))
    assert first_fit_block(free, placements(SPEC, 64)) == (2, full)
    assert first_fit_block(np.zeros(3, dtype=np.uint32), placements(SPEC, 4)) is None
    fits = block_fits(free, placements(SPEC, 4))
    assert fits.shape == (3, 16) and fits[0].sum() == 0 and fits[1].sum() == 12 and fits[2].sum() == 16


def test_two_holes_leave_no_4x4x2_box_but_enough_servers():
    # holes at (0,0,0) and (2,2,2): every 4x4x2 box (8 of them, any orientation, wrapping) holds one of them
    free = SPEC.torus_mask & ~(1 << int(SPEC.server_of[0])) & ~(1 << int(SPEC.server_of[int(SPEC.index(2, 2, 2))]))
    masks = request_placements(SPEC, 32, (4, 4, 2))
    assert len(masks) == 8
    assert first_fit_block(np.array([free], dtype=np.uint32), masks) is None
    assert photonic_allocate(np.array([free], dtype=np.uint32), 32, SPEC) is not None


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


@pytest.mark.parametrize("shape", [(2, 2, 1), (2, 2, 3), (4, 4, 2), (2, 4, 3), (4, 4, 4), (3, 2, 2)])
def test_torus_circuits_build_the_requested_torus(shape):
    n = int(np.prod(shape))
    members = np.arange(n) * 3 + 1  # any accelerators: the interposer joins any ports
    c = torus_circuits(SPEC, members, shape)
    check_circuits(c, members, ports=SPEC.ports)
    assert list(circuit_ports(c, members)) == [6] * n  # no port idle
    links = {frozenset((int(r[0]), int(r[2]))) for r in c}
    for i, coord in enumerate(itertools.product(*(range(s) for s in shape))):
        for d, side in enumerate(shape):
            if side > 1:
                nb = list(coord)
                nb[d] = (nb[d] + 1) % side
                j = int(np.ravel_multi_index(nb, shape))
                assert frozenset((int(members[i]), int(members[j]))) in links, (coord, d)


@pytest.mark.parametrize(("size", "electrical", "photonic"), [(4, 2, 6), (8, 3, 6), (16, 4, 6), (32, 5, 6),
                                                              (64, 6, 6)])
def test_slice_bandwidth_by_hand(size, electrical, photonic):
    mask = int(placements(SPEC, size)[0])
    assert SPEC.electrical_ports(mask) * SPEC.link_bandwidth == electrical * 75e9
    assert photonic_ports(SPEC, mask)[0] * SPEC.link_bandwidth == photonic * 75e9
    assert photonic_ports(SPEC, mask, SHAPES[size])[0] == photonic


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


def test_bad_requests_are_refused():
    with pytest.raises(ScenarioError, match="size"):
        request_placements(SPEC, 65)
    with pytest.raises(ScenarioError, match="size"):
        photonic_allocate(np.zeros(1, dtype=np.uint32), 0, SPEC)
    with pytest.raises(ScenarioError, match="1x1x4") as e:
        request_shapes(SPEC, 4, (1, 1, 4))  # servers are 2x2x1: no side pair of 2s
    assert e.value.field == "shape"
    with pytest.raises(ScenarioError, match="placement"):
        box_placements(SPEC, [(2, 2, 1)], placement="diagonal")


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
