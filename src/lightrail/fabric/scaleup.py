"""A scale-up rack as arrays: accelerators in a torus, grouped into servers, plus spare servers.

The Morphlux rack (PAPERS.md "LUMION and Morphlux"): 64 accelerators in a 4x4x4 torus, servers of
4 (a 2x2x1 brick), 6 torus links per accelerator, and 2 spare servers per 64 accelerators. Two kinds
of rack share this geometry:

- **electrical**: the torus links are fixed wires; a slice can use only the links whose two ends
  both belong to it (a link to a free or foreign neighbour sits idle);
- **photonic**: each accelerator's 6 ports enter a programmable interposer (an MZI mesh, µs
  reconfiguration) that can steer any port into an end-to-end circuit to any other port in the rack.
  A circuit reserves its whole path: both ports and the interposer waveguides between them are the
  circuit's alone, so circuits never contend. The interposer is modelled as a non-blocking
  port-to-port switch inside the rack: a circuit's path is fully described by its two ports.

Numbering. Accelerator ``a`` of the torus sits at ``(x, y, z)`` with ``a = (x*Y + y)*Z + z``.
Servers tile the torus; server ``s`` has grid coordinates ``(sx, sy, sz)`` with
``s = (sx*SY + sy)*SZ + sz`` over the server grid ``(X/2, Y/2, Z/1)``. The spare servers come after
the torus servers (``s >= servers``) and hold accelerators ``a >= accelerators``; they have no torus
links and reach the rack only through the photonic interposer. A rack's free servers are one
integer bitmask (bit ``s`` set = server ``s`` free), so many racks are one ``uint32`` array.

Circuits are an ``(C, 4)`` int array of rows ``(acc_a, port_a, acc_b, port_b)`` (duplex).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.fabric.builders import NVLINK_BANDWIDTH

__all__ = ["RackSpec", "LINK_BANDWIDTH", "MZI_RECONFIG_DELAY", "check_circuits", "circuit_ports", "servers_of"]

LINK_BANDWIDTH = NVLINK_BANDWIDTH / 6
"""Bandwidth of one torus link (one accelerator port) per direction, B/s: an accelerator's scale-up
bandwidth, NVLink-class 450 GB/s per direction (DESIGN.md "Defaults"), spread over its 6 torus links
(Morphlux rack, PAPERS.md). 75 GB/s."""
MZI_RECONFIG_DELAY = 3.7e-6
"""Reconfiguration of a silicon-photonic MZI mesh, seconds (3.7 µs reported; DESIGN.md "Defaults")."""


@dataclass(frozen=True, kw_only=True)
class RackSpec:
    """One rack's geometry and link facts (Morphlux defaults; PAPERS.md).

    >>> spec = RackSpec()
    >>> spec.accelerators, spec.servers, spec.ports, spec.total_servers
    (64, 16, 6, 18)
    """

    shape: tuple[int, int, int] = (4, 4, 4)
    """Torus sides in accelerators (Morphlux: 4x4x4 = 64 accelerators per rack)."""
    server_shape: tuple[int, int, int] = (2, 2, 1)
    """The brick of accelerators one server holds (Morphlux: 4 accelerators, 2x2x1)."""
    spare_servers: int = 2
    """Spare servers per rack, outside the torus (Morphlux: 2 spare servers per 64 accelerators)."""
    link_bandwidth: float = LINK_BANDWIDTH
    """Per port (link) per direction, B/s."""

    def __post_init__(self):
        if len(self.shape) != 3 or len(self.server_shape) != 3:
            raise ScenarioError(f"shape={self.shape}, server_shape={self.server_shape}", field="shape",
                                fix="give three sides, e.g. (4, 4, 4) and (2, 2, 1)")
        if any(s < 1 or s % b for s, b in zip(self.shape, self.server_shape, strict=True)):
            raise ScenarioError(f"servers {self.server_shape} do not tile the torus {self.shape}", field="shape",
                                fix="make every torus side a multiple of the server side")
        if self.spare_servers < 0 or self.total_servers > 32:
            raise ScenarioError(f"{self.servers} servers + {self.spare_servers} spares", field="spare_servers",
                                fix="use 0 or more spares and at most 32 servers per rack")
        if self.link_bandwidth <= 0:
            raise ScenarioError(f"link_bandwidth={self.link_bandwidth}", field="link_bandwidth", fix="use > 0 B/s")

    # ---- sizes -------------------------------------------------------------------------------------------
    @property
    def accelerators(self) -> int:
        """Torus accelerators (spares not counted)."""
        return int(np.prod(self.shape))

    @property
    def per_server(self) -> int:
        return int(np.prod(self.server_shape))

    @property
    def servers(self) -> int:
        """Torus servers (spares not counted)."""
        return self.accelerators // self.per_server

    @property
    def total_servers(self) -> int:
        return self.servers + self.spare_servers

    @property
    def ports(self) -> int:
        """Torus links (ports) per accelerator: two per dimension."""
        return 2 * len(self.shape)

    @property
    def server_grid(self) -> tuple[int, int, int]:
        return tuple(s // b for s, b in zip(self.shape, self.server_shape, strict=True))

    @property
    def torus_mask(self) -> int:
        """Bitmask of the torus servers."""
        return (1 << self.servers) - 1

    @property
    def spare_mask(self) -> int:
        """Bitmask of the spare servers."""
        return ((1 << self.total_servers) - 1) & ~self.torus_mask

    # ---- geometry as arrays ------------------------------------------------------------------------------
    @cached_property
    def coords(self) -> np.ndarray:
        """``(accelerators, 3)`` torus coordinates of each accelerator."""
        return np.array(list(itertools.product(*(range(s) for s in self.shape))), dtype=np.int64)

    def index(self, x, y, z):
        X, Y, Z = self.shape
        return (np.asarray(x) % X * Y + np.asarray(y) % Y) * Z + np.asarray(z) % Z

    @cached_property
    def neighbours(self) -> np.ndarray:
        """``(accelerators, 6)``: the torus neighbour behind each port (port ``2d`` is +1 in dimension d,
        port ``2d+1`` is -1)."""
        c = self.coords
        cols = []
        for d in range(3):
            for step in (1, -1):
                shifted = c.copy()
                shifted[:, d] += step
                cols.append(self.index(shifted[:, 0], shifted[:, 1], shifted[:, 2]))
        return np.stack(cols, axis=1)

    @cached_property
    def server_of(self) -> np.ndarray:
        """Server of every accelerator, spares' accelerators included (``total_servers * per_server``)."""
        g = np.array(self.server_grid)
        sc = self.coords // np.array(self.server_shape)
        torus = (sc[:, 0] * g[1] + sc[:, 1]) * g[2] + sc[:, 2]
        spares = self.servers + np.arange(self.spare_servers * self.per_server) // self.per_server
        return np.concatenate([torus, spares]).astype(np.int64)

    @cached_property
    def server_accelerators(self) -> np.ndarray:
        """``(total_servers, per_server)``: each server's accelerators, ascending."""
        order = np.argsort(self.server_of, kind="stable")
        return order.reshape(self.total_servers, self.per_server)

    def accelerators_of(self, mask: int) -> np.ndarray:
        """The accelerators of the servers in ``mask``, server by server."""
        return self.server_accelerators[servers_of(mask)].reshape(-1)

    def servers_mask(self, servers) -> int:
        return sum(1 << int(s) for s in set(int(s) for s in servers))

    # ---- electrical bandwidth ----------------------------------------------------------------------------
    def internal_ports(self, accelerators) -> np.ndarray:
        """Per accelerator of a set, how many of its torus links lead to another member (a spare has none)."""
        acc = np.asarray(accelerators, dtype=np.int64)
        member = np.zeros(self.total_servers * self.per_server, dtype=bool)
        member[acc] = True
        out = np.zeros(len(acc), dtype=np.int64)
        torus = acc < self.accelerators
        out[torus] = member[self.neighbours[acc[torus]]].sum(axis=1)
        return out

    def electrical_ports(self, mask: int) -> int:
        """Ports per accelerator a slice on the electrical rack can drive: the fewest links any member has
        to other members (a collective moves at its slowest member's pace); 0 for an empty slice."""
        acc = self.accelerators_of(mask)
        return int(self.internal_ports(acc).min()) if len(acc) else 0


def servers_of(mask: int) -> list[int]:
    """The set bits of ``mask``, ascending."""
    out, s = [], 0
    while mask:
        if mask & 1:
            out.append(s)
        mask >>= 1
        s += 1
    return out


def check_circuits(circuits: np.ndarray, members, *, ports: int) -> None:
    """Raise :class:`InfeasibleError` unless ``circuits`` are realizable for a slice of ``members``.

    Realizable: every circuit joins two distinct members, each end a real port (``0 <= port < ports``),
    and no port carries two circuits. A circuit reserves its whole path (its two ports and the
    interposer waveguides between them), so port-disjoint circuits are contention-free.
    """
    c = np.asarray(circuits, dtype=np.int64).reshape(-1, 4)
    member = set(int(m) for m in members)
    for row in c:
        a, pa, b, pb = (int(v) for v in row)
        if a not in member or b not in member:
            raise InfeasibleError(f"circuit {tuple(row)} leaves the slice", field="circuits")
        if a == b:
            raise InfeasibleError(f"circuit {tuple(row)} loops on one accelerator", field="circuits")
        if not (0 <= pa < ports and 0 <= pb < ports):
            raise InfeasibleError(f"circuit {tuple(row)} uses a port outside 0..{ports - 1}", field="circuits")
    ends = np.concatenate([c[:, 0:2], c[:, 2:4]])
    _, counts = np.unique(ends, axis=0, return_counts=True)
    if len(counts) and counts.max() > 1:
        raise InfeasibleError("a port carries two circuits", field="circuits")


def circuit_ports(circuits: np.ndarray, members) -> np.ndarray:
    """Per member (in the given order), how many ports its circuits use."""
    c = np.asarray(circuits, dtype=np.int64).reshape(-1, 4)
    ends = np.concatenate([c[:, 0], c[:, 2]])
    members = np.asarray(members, dtype=np.int64)
    return (ends[None, :] == members[:, None]).sum(axis=1)
