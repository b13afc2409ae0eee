"""Slice allocators for a scale-up rack (Morphlux / LUMION; PAPERS.md), pure and array-backed.

Two allocators over many racks at once; a rack's free servers are one bitmask (``fabric.scaleup``),
so ``free`` is a ``uint32`` array with one entry per rack. A request asks either for a **count** of
accelerators (``size``) or for a **torus shape** (``shape``, e.g. ``(4, 4, 2)``, as TPU slices are asked for).

- :func:`first_fit_block`, the **electrical** baseline: a slice is a *contiguous sub-torus*, a box of
  accelerators in the rack's torus. This is how the systems that use such racks define a slice: TPU v4
  slices are cuboids of chips in the 3D torus (Jouppi et al., ISCA 2023, "slice" shapes such as 2x2x1, 2x2x2,
  2x2x4, 2x4x4, 4x4x4), and Morphlux's electrical baseline gives a tenant a contiguous block of one of those
  shapes (PAPERS.md). Which boxes (:func:`request_shapes`): a shaped request takes its shape in any axis order
  that servers tile; a count request takes any box of ``ceil(size / per_server)`` servers (the most compact
  first), or, when no box holds exactly that many servers (5 servers in a 2x2x4 server grid), the smallest
  that holds more, as a scheduler that offers only box slices must round up. Where a box may sit
  (:func:`box_placements`): ``placement="contiguous"`` (default) puts its origin on any server of the rack,
  wrapping around the torus (a torus has no edge), aligned origins first; ``placement="aligned"`` only at
  origins that are multiples of the box's sides (TPU-style aligned blocks; a side that does not divide the
  torus side has no aligned origin). Contiguous has every aligned placement and more, so it is the stronger
  baseline; first fit takes the lowest-numbered rack with a free placement, then its first placement.
  The slice drives only the torus links between its own members.
- :func:`photonic_allocate`, the **photonic** allocator: any ``ceil(size / 4)`` free servers of one rack
  (first fit: the lowest-numbered rack with enough free servers, its lowest-numbered free servers),
  then circuits through the interposer: three port-disjoint rings for a count request
  (:func:`ring_circuits`), the requested torus for a shaped one (:func:`torus_circuits`).

Why a constructive heuristic and not an ILP. With the interposer modelled as a non-blocking
port-to-port switch (``fabric.scaleup``), a set of circuits is realizable iff no port carries two of
them. Both constructions use every port of every member once. That meets the upper bound (6 ports per
accelerator), so the heuristic is optimal for bandwidth and an ILP (HiGHS) could not do better; which free
servers are chosen does not change the bandwidth either, so the allocator accepts iff the rack has enough
free servers, which is also optimal for acceptance in that rack. (A mesh whose waveguide segments are shared
between circuits would need the ILP; that interposer is not modelled here.)

Definitions used by the study (``studies/scaleup.py``) and tested against hand counts:

- **slice bandwidth**: ports per accelerator the slice's collectives can drive x the link bandwidth,
  taking the fewest over the slice's accelerators (a ring or torus AllReduce moves at its slowest
  member's pace). Electrical: links whose both ends are members (a 2x2x1 slice: 2 ports; 2x2x2: 3;
  2x2x4: 4; 2x4x4: 5; 4x4x4: 6); photonic: ports used by the slice's circuits (6).
- **fragmentation**: a request refused although one rack holds ``ceil(size / 4)`` free torus servers
  (slices live in one rack), as a fraction of all requests.
- **stranded accelerators** for a request: the free accelerators of every rack that holds enough free
  servers but cannot place the request (:func:`stranded`).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.fabric.scaleup import RackSpec, check_circuits, circuit_ports

__all__ = ["SHAPES", "SIZES", "PLACEMENTS", "Shape", "orientations", "shape_orientations", "server_box_shapes",
           "request_shapes", "box_placements", "request_placements", "placements", "block_fits", "first_fit_block",
           "popcount", "servers_needed", "photonic_allocate", "ring_circuits", "torus_circuits", "photonic_ports",
           "stranded", "splice", "block_shape"]

Shape = tuple[int, int, int]
SHAPES: dict[int, Shape] = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}
"""The TPU-style slice shapes of a 4x4x4 rack (PAPERS.md), by size."""
SIZES = tuple(SHAPES)
PLACEMENTS = ("contiguous", "aligned")

_POP8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


def popcount(masks) -> np.ndarray:
    """Set bits of each ``uint32`` mask."""
    m = np.ascontiguousarray(np.asarray(masks, dtype=np.uint32))
    return _POP8[m.view(np.uint8)].reshape(*m.shape, 4).sum(axis=-1)


def servers_needed(spec: RackSpec, size: int) -> int:
    """Servers a request of ``size`` accelerators occupies (whole servers)."""
    if not 1 <= size <= spec.accelerators:
        raise ScenarioError(f"slice size {size}", field="size", fix=f"use 1..{spec.accelerators} accelerators")
    return -(-size // spec.per_server)


def shape_orientations(spec: RackSpec, shape: Shape) -> list[Shape]:
    """The distinct axis orders of ``shape`` that fit the torus and that servers tile (the given order first)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ScenarioError(f"shape {shape}", field="shape", fix="give three positive sides, e.g. 4x4x2")
    out = []
    for perm in itertools.permutations(shape):
        if perm in out:
            continue
        if all(p <= s and p % b == 0 for p, s, b in zip(perm, spec.shape, spec.server_shape, strict=True)):
            out.append(perm)
    return out


def orientations(size: int, spec: RackSpec) -> list[Shape]:
    """The orientations of the TPU-style shape of ``size`` (``SHAPES``) that fit the torus and servers tile."""
    if size not in SHAPES:
        raise ScenarioError(f"slice size {size}", field="size", fix=f"use one of {', '.join(map(str, SIZES))}")
    return shape_orientations(spec, SHAPES[size])


def server_box_shapes(spec: RackSpec, servers: int) -> list[Shape]:
    """Accelerator shapes of every box of exactly ``servers`` servers that fits the rack, most compact first
    (smallest surface, so the most internal links), ties in axis order."""
    g, b = spec.server_grid, spec.server_shape
    found = [(p * b[0], q * b[1], r * b[2]) for p in range(1, g[0] + 1) for q in range(1, g[1] + 1)
             for r in range(1, g[2] + 1) if p * q * r == servers]
    return sorted(found, key=lambda s: s[0] * s[1] + s[1] * s[2] + s[0] * s[2])


def request_shapes(spec: RackSpec, size: int, shape: Shape | None = None) -> tuple[Shape, ...]:
    """The oriented box shapes an electrical slice for a request may take, in preference order.

    A shaped request: its orientations (:func:`shape_orientations`). A count request: the boxes of
    ``ceil(size / per_server)`` servers, else of the fewest servers above that any box holds."""
    if shape is not None:
        found = shape_orientations(spec, shape)
        if not found:
            raise ScenarioError(f"shape {'x'.join(map(str, shape))} on a {'x'.join(map(str, spec.shape))} torus of "
                                f"{'x'.join(map(str, spec.server_shape))} servers", field="shape",
                                fix="use sides that fit the torus, two of them multiples of 2 (servers are 2x2x1)")
        return tuple(found)
    for k in range(servers_needed(spec, size), spec.servers + 1):
        found = server_box_shapes(spec, k)
        if found:
            return tuple(found)
    raise ScenarioError(f"slice size {size}", field="size", fix=f"use 1..{spec.accelerators} accelerators")


@lru_cache(maxsize=256)
def _box_placements(spec: RackSpec, shapes: tuple[Shape, ...], placement: str) -> tuple[np.ndarray, np.ndarray]:
    if placement not in PLACEMENTS:
        raise ScenarioError(f"placement {placement!r}", field="placement", fix=f"use one of {', '.join(PLACEMENTS)}")
    g, sb = spec.server_grid, spec.server_shape
    passes = (True,) if placement == "aligned" else (True, False)
    masks, shapes_of, seen = [], [], set()
    for aligned_pass in passes:  # aligned origins first, so first fit behaves as a TPU-style allocator while it can
        for shape in shapes:
            side = [s // b for s, b in zip(shape, sb, strict=True)]  # box sides in servers
            for origin in itertools.product(*(range(n) for n in g)):
                aligned = all(o % s == 0 and n % s == 0 for o, s, n in zip(origin, side, g, strict=True))
                if aligned != aligned_pass:
                    continue
                mask = 0
                for d in itertools.product(*(range(s) for s in side)):
                    sx, sy, sz = ((o + k) % n for o, k, n in zip(origin, d, g, strict=True))
                    mask |= 1 << int((sx * g[1] + sy) * g[2] + sz)
                if mask not in seen:  # a box as long as the torus side wraps onto itself
                    seen.add(mask)
                    masks.append(mask)
                    shapes_of.append(shape)
    m = np.array(masks, dtype=np.uint32)
    m.setflags(write=False)
    s = np.array(shapes_of, dtype=np.int64).reshape(-1, 3)
    s.setflags(write=False)
    return m, s


def box_placements(spec: RackSpec, shapes, *, placement: str = "contiguous") -> np.ndarray:
    """Server bitmasks of every placement of boxes of ``shapes`` (oriented, accelerators), in first-fit order."""
    return _box_placements(spec, tuple(tuple(int(v) for v in s) for s in shapes), placement)[0]


def request_placements(spec: RackSpec, size: int, shape: Shape | None = None, *,
                       placement: str = "contiguous") -> np.ndarray:
    """Every electrical placement of a request, in first-fit order (:func:`request_shapes`, :func:`box_placements`)."""
    return box_placements(spec, request_shapes(spec, size, shape), placement=placement)


def placements(spec: RackSpec, size: int, *, placement: str = "aligned") -> np.ndarray:
    """Placements of the TPU-style block of ``size`` (``SHAPES``, every orientation), aligned by default."""
    return box_placements(spec, orientations(size, spec), placement=placement)


def block_shape(spec: RackSpec, shapes, mask: int, *, placement: str = "contiguous") -> Shape:
    """The oriented shape of the box placed on ``mask`` (``shapes`` as given to :func:`box_placements`)."""
    if isinstance(shapes, int):  # a TPU-style size, aligned
        shapes, placement = orientations(shapes, spec), "aligned"
    m, s = _box_placements(spec, tuple(tuple(int(v) for v in x) for x in shapes), placement)
    return tuple(int(v) for v in s[int(np.flatnonzero(m == mask)[0])])


def block_fits(free: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """``(racks, placements)`` bool: which placements (server masks) are entirely free in each rack."""
    free = np.asarray(free, dtype=np.uint32)
    masks = np.asarray(masks, dtype=np.uint32)
    return (free[:, None] & masks[None, :]) == masks[None, :]


def first_fit_block(free: np.ndarray, masks: np.ndarray, *, fits: np.ndarray | None = None
                    ) -> tuple[int, int] | None:
    """``(rack, server mask)`` of the first free placement among ``masks``, or None (refused)."""
    fits = block_fits(free, masks) if fits is None else fits
    any_fit = fits.any(axis=1)
    if not any_fit.any():
        return None
    rack = int(np.argmax(any_fit))
    return rack, int(np.asarray(masks)[int(np.argmax(fits[rack]))])


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

    ``counts`` (free torus servers per rack) may be passed to skip the popcount. Spare servers are dedicated
    to failover and never allocated here."""
    k = servers_needed(spec, size)
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
    rows = [_ring(m, j) for j in range(spec.ports // 2)]
    c = np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 4), dtype=np.int64)
    check_circuits(c, m, ports=spec.ports)
    return c


def _ring(m: np.ndarray, j: int) -> np.ndarray:
    """One ring over ``m`` (in order) on port pair ``(2j, 2j+1)``; a pair is joined twice (one per direction)."""
    n = len(m)
    if n < 2:
        return np.zeros((0, 4), dtype=np.int64)
    return np.stack([m, np.full(n, 2 * j), np.roll(m, -1), np.full(n, 2 * j + 1)], axis=1)


def torus_circuits(spec: RackSpec, members, shape: Shape) -> np.ndarray:
    """The circuits of an ``a x b x c`` torus over ``members`` (member i at logical coordinate
    ``unravel(i, shape)``): in dimension d, port ``2d`` of each member to port ``2d+1`` of its +1 neighbour
    (wrapping). A dimension of side 1 has no neighbour; its two ports join a ring over all members instead,
    so no port sits idle."""
    m = np.asarray(members, dtype=np.int64)
    shape = tuple(int(s) for s in shape)
    if int(np.prod(shape)) != len(m) or len(shape) * 2 != spec.ports:
        raise InfeasibleError(f"a {shape} torus over {len(m)} accelerators", field="shape",
                              fix="give as many members as the shape holds")
    idx = np.arange(len(m)).reshape(shape)  # C order: the logical coordinate of member i
    rows = []
    for d, side in enumerate(shape):
        if side == 1:
            rows.append(_ring(m, d))
            continue
        nxt = np.roll(idx, -1, axis=d).reshape(-1)  # side 2: +1 and -1 are one neighbour, joined twice
        rows.append(np.stack([m, np.full(len(m), 2 * d), m[nxt], np.full(len(m), 2 * d + 1)], axis=1))
    c = np.concatenate(rows).astype(np.int64)
    check_circuits(c, m, ports=spec.ports)
    return c


def photonic_ports(spec: RackSpec, mask: int, shape: Shape | None = None) -> tuple[int, np.ndarray]:
    """Route the slice on ``mask`` (rings, or the requested torus when ``shape`` is given and fills the servers);
    return (the fewest ports any member uses, the circuits)."""
    members = spec.accelerators_of(mask)
    if shape is not None and int(np.prod(shape)) == len(members):
        c = torus_circuits(spec, members, shape)
    else:
        c = ring_circuits(spec, members)
    return (int(circuit_ports(c, members).min()) if len(members) else 0), c


def stranded(free_accelerators: np.ndarray, placeable: np.ndarray, need: int) -> int:
    """Free accelerators stranded for a request needing ``need`` free accelerators (whole servers): those of
    racks with at least ``need`` free where the request cannot be placed."""
    free_accelerators = np.asarray(free_accelerators)
    return int(free_accelerators[(free_accelerators >= need) & ~np.asarray(placeable, dtype=bool)].sum())


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
