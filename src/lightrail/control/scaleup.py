"""Slice allocators for a scale-up rack (Morphlux / LUMION; PAPERS.md), pure and array-backed.

Two allocators over many racks at once; a rack's free servers are one bitmask (``fabric.scaleup``),
so ``free`` is a ``uint32`` array with one entry per rack.

- :func:`first_fit_block`, the **electrical** baseline as the TPU-style scheduler defines it: a slice
  is an aligned, contiguous block of one of the shapes 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4 (its
  orientations that servers tile; origin a multiple of the block's side in every dimension), placed
  first fit: the lowest-numbered rack with a free placement, then its first placement in a fixed order.
  The slice drives only the torus links between its own members.
- :func:`photonic_allocate`, the **photonic** allocator: any ``ceil(size / 4)`` free servers of one rack
  (first fit: the lowest-numbered rack with enough free servers, its lowest-numbered free servers),
  then :func:`ring_circuits` routes three port-disjoint rings over the members through the interposer.

Why a constructive heuristic and not an ILP. With the interposer modelled as a non-blocking
port-to-port switch (``fabric.scaleup``), a set of circuits is realizable iff no port carries two of
them. Three rings over the same member order use ports ``(0,1)``, ``(2,3)`` and ``(4,5)`` of every
member: every port, once. That meets the upper bound (6 ports per accelerator), so the heuristic is
optimal for bandwidth and an ILP (HiGHS) could not do better; which free servers are chosen does not
change the bandwidth either, so the allocator accepts iff the rack has enough free servers, which is
also optimal for acceptance in that rack. (A mesh whose waveguide segments are shared between circuits
would need the ILP; that interposer is not modelled here.)

Definitions used by the study (``studies/scaleup.py``) and tested against hand counts:

- **slice bandwidth**: ports per accelerator the slice's collectives can drive x the link bandwidth,
  taking the fewest over the slice's accelerators (a ring or torus AllReduce moves at its slowest
  member's pace). Electrical: links whose both ends are members (a 2x2x1 slice: 2 ports; 2x2x2: 3;
  2x2x4: 4; 2x4x4: 5; 4x4x4: 6); photonic: ports used by the slice's circuits (idle neighbour ports are
  redirected into the slice's rings: 6).
- **fragmentation**: a request refused although one rack holds at least ``size`` free accelerators
  (slices live in one rack), as a fraction of all requests.
- **stranded accelerators** for a request of ``size``: the free accelerators of every rack that holds at
  least ``size`` free accelerators but cannot place the request (:func:`stranded`).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.fabric.scaleup import RackSpec, check_circuits, circuit_ports

__all__ = ["SHAPES", "SIZES", "orientations", "placements", "block_fits", "first_fit_block", "popcount",
           "photonic_allocate", "ring_circuits", "photonic_ports", "stranded", "splice", "block_shape"]

SHAPES: dict[int, tuple[int, int, int]] = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}
"""Slice size (accelerators) -> the TPU-style block shape the electrical baseline gives it (PAPERS.md)."""
SIZES = tuple(SHAPES)

_POP8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


def popcount(masks) -> np.ndarray:
    """Set bits of each ``uint32`` mask."""
    m = np.ascontiguousarray(np.asarray(masks, dtype=np.uint32))
    return _POP8[m.view(np.uint8)].reshape(*m.shape, 4).sum(axis=-1)


def _check_size(size: int, spec: RackSpec) -> None:
    if size not in SHAPES or size > spec.accelerators:
        raise ScenarioError(f"slice size {size}", field="size", fix=f"use one of {', '.join(map(str, SIZES))}")


def orientations(size: int, spec: RackSpec) -> list[tuple[int, int, int]]:
    """The orientations of ``size``'s block shape that fit the torus and that servers tile (listed shape first)."""
    _check_size(size, spec)
    base = SHAPES[size]
    out = []
    for perm in itertools.permutations(base):
        if perm in out:
            continue
        if all(p <= s and s % p == 0 and p % b == 0 for p, s, b in zip(perm, spec.shape, spec.server_shape,
                                                                          strict=True)):
            out.append(perm)
    return out


@lru_cache(maxsize=64)
def _placements(spec: RackSpec, size: int) -> tuple[np.ndarray, np.ndarray]:
    masks, shapes = [], []
    sb = np.array(spec.server_shape)
    g = spec.server_grid
    for shape in orientations(size, spec):
        for origin in itertools.product(*(range(0, s, p) for s, p in zip(spec.shape, shape, strict=True))):
            lo = np.array(origin) // sb
            hi = (np.array(origin) + np.array(shape)) // sb
            mask = 0
            for sx, sy, sz in itertools.product(*(range(a, b) for a, b in zip(lo, hi, strict=True))):
                mask |= 1 << int((sx * g[1] + sy) * g[2] + sz)
            masks.append(mask)
            shapes.append(shape)
    m = np.array(masks, dtype=np.uint32)
    m.setflags(write=False)
    s = np.array(shapes, dtype=np.int64)
    s.setflags(write=False)
    return m, s


def placements(spec: RackSpec, size: int) -> np.ndarray:
    """Server bitmasks of every aligned placement of a ``size`` block, in first-fit order."""
    return _placements(spec, size)[0]


def block_shape(spec: RackSpec, size: int, mask: int) -> tuple[int, int, int]:
    """The orientation of the placement ``mask``."""
    m, s = _placements(spec, size)
    return tuple(int(v) for v in s[int(np.flatnonzero(m == mask)[0])])


def block_fits(free: np.ndarray, size: int, spec: RackSpec) -> np.ndarray:
    """``(racks, placements)`` bool: which aligned placements are entirely free in each rack."""
    p = placements(spec, size)
    free = np.asarray(free, dtype=np.uint32)
    return (free[:, None] & p[None, :]) == p[None, :]


def first_fit_block(free: np.ndarray, size: int, spec: RackSpec, *, fits: np.ndarray | None = None
                    ) -> tuple[int, int] | None:
    """``(rack, server mask)`` of the first free aligned placement, or None (refused)."""
    fits = block_fits(free, size, spec) if fits is None else fits
    any_fit = fits.any(axis=1)
    if not any_fit.any():
        return None
    rack = int(np.argmax(any_fit))
    return rack, int(placements(spec, size)[int(np.argmax(fits[rack]))])


def _lowest(mask: int, k: int) -> int:
    out = 0
    while k and mask:
        low = mask & -mask
        out |= low
        mask ^= low
        k -= 1
    return out


def photonic_allocate(free: np.ndarray, size: int, spec: RackSpec, *, counts: np.ndarray | None = None
                      ) -> tuple[int, int] | None:
    """``(rack, server mask)``: the first rack's lowest ``ceil(size / per_server)`` free torus servers, or None.

    ``counts`` (free torus servers per rack) may be passed to skip the popcount."""
    if size < 1 or size > spec.accelerators:
        raise ScenarioError(f"slice size {size}", field="size", fix=f"use 1..{spec.accelerators}")
    k = -(-size // spec.per_server)
    free = np.asarray(free, dtype=np.uint32)
    counts = popcount(free & np.uint32(spec.torus_mask)) if counts is None else counts
    ok = counts >= k
    if not ok.any():
        return None
    rack = int(np.argmax(ok))
    return rack, _lowest(int(free[rack]) & spec.torus_mask, k)


def ring_circuits(spec: RackSpec, members) -> np.ndarray:
    """Three port-disjoint duplex rings over ``members`` (in order): ring j joins member i's port ``2j`` to
    member i+1's port ``2j+1``. Every port of every member is used once (``ports // 2`` rings)."""
    m = np.asarray(members, dtype=np.int64)
    n = len(m)
    if n < 2:
        return np.zeros((0, 4), dtype=np.int64)
    rows = []
    nxt = np.roll(m, -1)
    count = n if n > 2 else 1  # two members: one circuit per ring (a ring of two is one duplex link)
    for j in range(spec.ports // 2):
        rows.append(np.stack([m[:count], np.full(count, 2 * j), nxt[:count], np.full(count, 2 * j + 1)], axis=1))
        if n == 2:  # the other direction of the pair on the next port pair (still one port per circuit end)
            rows.append(np.array([[m[1], 2 * j, m[0], 2 * j + 1]]))
    c = np.concatenate(rows).astype(np.int64)
    check_circuits(c, m, ports=spec.ports)
    return c


def photonic_ports(spec: RackSpec, mask: int) -> tuple[int, np.ndarray]:
    """Route the rings of the slice on ``mask``; return (the fewest ports any member uses, the circuits)."""
    members = spec.accelerators_of(mask)
    c = ring_circuits(spec, members)
    return (int(circuit_ports(c, members).min()) if len(members) else 0), c


def stranded(free_accelerators: np.ndarray, placeable: np.ndarray, size: int) -> int:
    """Free accelerators stranded for a request of ``size``: those of racks with at least ``size`` free
    accelerators where the request cannot be placed."""
    free_accelerators = np.asarray(free_accelerators)
    return int(free_accelerators[(free_accelerators >= size) & ~np.asarray(placeable, dtype=bool)].sum())


def splice(spec: RackSpec, mask: int, failed_server: int, free: int) -> int | None:
    """The photonic slice's new server mask after ``failed_server`` fails: the failed server swapped for a
    free spare, else for any free torus server of the rack; None when the rack has neither."""
    spare = free & spec.spare_mask
    pick = spare & -spare if spare else 0
    if not pick:
        torus = free & spec.torus_mask
        pick = torus & -torus
    if not pick:
        return None
    return (mask & ~(1 << failed_server)) | pick
